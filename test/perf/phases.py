"""Where the controller's CPU goes, by phase of its work: a py-spy profile summed by what each sample was doing.

``make bench BENCH_ARGS="--scenarios churn --profile"`` samples each controller with py-spy (``--gil``: the thread
holding the interpreter lock, which is the thread on a CPU for this pure-Python process; 100 samples a second) into
``.dev/bench-logs/<scenario>-<label>.profile.txt`` (py-spy's raw, collapsed-stack format) and puts this summary in
the scenario's results. ``python -m test.perf.phases FILE`` prints it for a file of that format.

Phases, by the frames on a sample's stack (the first rule that matches):
- ``start-up``: importing modules;
- ``judging``: a dispatch cycle's pass over the queue (``mcad.model.walk``: fit checks, reservations, preemption);
- ``telling``: a cycle telling those that wait why (``Notices``: Backoff statuses decided, Events asked for);
- ``dispatching``: a cycle acting on a dispatch (reserving, starting its writes);
- ``cycle, other``: the rest of a cycle (snapshot, dropping the dispatched);
- ``appwrapper / pod / node events``: the loop's sync of one object after an informer event;
- ``write outcomes``: the loop taking back what a write returned;
- ``informers``: reading watch streams, decoding JSON, building views, handing events to the loop;
- ``loop, other``: the rest of the loop (timers, publishing, the work queue);
- ``writes: objects``, ``writes: status``, ``writes: events``, ``writes, other``: the write pool's requests;
- ``http server``: /metrics, /healthz, /debug, the webhooks;
- ``other``: anything else (interpreter shutdown, frames py-spy could not resolve).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# (phase, frames that must all be on the stack), first match wins; frames are "function (file:line)" strings.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("start-up", ("_find_and_load",)),
    ("dispatching", ("DispatchCycle.dispatch",)),
    ("judging", ("DispatchCycle._pass",)),
    ("telling", ("DispatchCycle._tell",)),
    ("cycle, other", ("DispatchCycle.run",)),
    ("appwrapper events", ("Dispatcher._sync_appwrapper",)),
    ("pod events", ("Dispatcher._sync_pod",)),
    ("node events", ("Dispatcher._sync_node",)),
    ("write outcomes", ("Dispatcher._collect",)),
    ("informers", ("mcad/k8s/informer.py",)),
    ("informers", ("mcad/k8s/wrapped.py",)),
    ("loop, other", ("mcad/loop/dispatcher.py",)),
    ("writes: objects", ("mcad/k8s/writes.py", "mcad/k8s/dispatchjob.py")),
    ("writes: status", ("mcad/k8s/writes.py", "mcad/loop/statussync.py")),
    ("writes: events", ("mcad/k8s/events.py",)),
    ("writes, other", ("mcad/k8s/writes.py",)),
    ("http server", ("mcad/serve/",)),
    ("http server", ("mcad/admission/",)),
)
PHASES = (*dict.fromkeys(phase for phase, _ in RULES), "other")


def phase_of(stack: str) -> str:
    for phase, needles in RULES:
        if all(needle in stack for needle in needles):
            return phase
    return "other"


def summarize(path: Path) -> dict[str, object]:
    """{"samples": N, "share_pct": {phase: percent of the samples}} of a py-spy raw file (empty if unreadable)."""
    counts: Counter[str] = Counter()
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[phase_of(stack)] += int(count)
    total = sum(counts.values())
    if not total:
        return {}
    return {"samples": total,
            "share_pct": {phase: round(100 * counts[phase] / total, 1) for phase in PHASES if counts[phase]}}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m test.perf.phases PROFILE.txt (py-spy's raw format)", file=sys.stderr)
        return 2
    summary = summarize(Path(argv[0]))
    if not summary:
        print(f"no samples in {argv[0]}", file=sys.stderr)
        return 1
    print(f"{summary['samples']} samples")
    shares = summary["share_pct"]
    assert isinstance(shares, dict)
    for phase, share in sorted(shares.items(), key=lambda item: -item[1]):
        print(f"{share:6.1f} %  {phase}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
