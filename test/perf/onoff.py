"""Pool benchmark runs made with and without a controller flag into one on / off figure per measure.

    python -m test.perf.onoff --flag=--fair-sharing off-1.json on-1.json on-2.json off-2.json

Each file is a results file of ``test.perf.bench``; a run is "on" when the ``--controller-args`` it was given
(its ``argv``) holds ``--flag``, else "off". Alternate the runs (off, on, on, off) so that a drift of the machine's
load falls on both sides alike. For every scenario found (throughput, deep_queue, churn) this prints, per measure
(``MEASURES``), the mean over the off runs, the mean over the on runs, and on / off; for latency percentiles the
mean of each run's figure (the runs' raw samples are not in the files). A failed scenario is left out, and said so
on stderr; no run on one side of a scenario leaves that scenario out.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

# A measure's path into a scenario's result, or two paths whose quotient it is (a mean from a count and a sum).
Path_ = tuple[str, ...]
# scenario -> (label, path), in the order printed.
MEASURES: dict[str, list[tuple[str, Path_ | tuple[Path_, Path_]]]] = {
    "throughput": [
        ("dispatched / s", ("throughput", "dispatched_per_s")),
        ("create -> Running mean ms", ("latency", "create_to_running", "mean_ms")),
        ("create -> Running p99 ms", ("latency", "create_to_running", "p99_ms")),
        ("dispatch cycles", ("cycles", "count")),
        ("cycle mean ms", ("cycles", "mean_ms")),
        ("controller cpu s until dispatched", ("cpu_seconds_until_dispatched", "controller")),
        ("controller cpu s under load", ("controller", "load_cpu_seconds")),
        ("controller writes / AppWrapper", ("controller_counted_writes", "per_workload")),
        ("create call p50 ms", ("latency", "create_call", "p50_ms")),
        ("decision -> seen Running p50 ms", ("latency", "(controller decision to seen)", "p50_ms")),
    ],
    "deep_queue": [
        ("backlog all Pending after last create s", ("backlog", "all_pending_after_last_create_s")),
        ("new AppWrapper p50 ms", ("latency", "new_cpu_appwrapper", "p50_ms")),
        ("new AppWrapper p99 ms", ("latency", "new_cpu_appwrapper", "p99_ms")),
        ("new AppWrapper mean ms", ("latency", "new_cpu_appwrapper", "mean_ms")),
        ("next after freed p99 ms", ("latency", "next_after_capacity_freed", "p99_ms")),
        ("cycle mean ms (probes)", ("cycles", "mean_ms")),
        ("controller cpu s, backlog", ("controller_after_backlog", "load_cpu_seconds")),
        ("controller cpu s, probes", ("controller", "probe_phase_cpu_seconds")),
    ],
    "churn": [
        ("wall s", ("wall_s",)),
        ("small mean wait ms", ("per_class", "small", "mean_ms")),
        ("medium mean wait ms", ("per_class", "medium", "mean_ms")),
        ("large mean wait ms", ("per_class", "large", "mean_ms")),
        ("controller cpu s under load", ("controller", "load_cpu_seconds")),
        ("dispatch cycles", ("dispatch_cycles", "count")),
        ("cycle mean ms", (("dispatch_cycles", "seconds"), ("dispatch_cycles", "count"))),
        ("create lateness p50 ms", ("create_lateness", "p50_ms")),
        ("create lateness p99 ms", ("create_lateness", "p99_ms")),
        ("utilisation %", ("utilisation_pct",)),
        ("tenants' mean wait, max / min", ("fairness", "mean_wait_max_over_min")),
        ("tenants' mean wait, Jain", ("fairness", "mean_wait_jain")),
        ("work by half time, Jain", ("fairness", "work_at_half_jain")),
    ],
}


def controller_args(results: dict[str, Any]) -> list[str]:
    """The ``--controller-args`` a run was given (from its recorded argv), split as the bench splits them."""
    argv = list(results.get("argv") or [])
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--controller-args" and i + 1 < len(argv):
            out += argv[i + 1].split()
        elif arg.startswith("--controller-args="):
            out += arg.split("=", 1)[1].split()
    return out


def is_on(results: dict[str, Any], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in controller_args(results))


def dig(result: dict[str, Any], path: Path_ | tuple[Path_, Path_]) -> float | None:
    """The number at ``path`` in ``result``; for a pair of paths, the first over the second in thousandths (seconds
    over a count: a mean in ms)."""
    if path and isinstance(path[0], tuple):
        num, den = dig(result, path[0]), dig(result, path[1])
        return 1000 * num / den if num is not None and den else None
    value: Any = result
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def pooled(runs: list[tuple[str, dict[str, Any]]], flag: str) -> dict[str, dict[str, Any]]:
    """Per scenario: the files of each side and, per measure, the off and on means and on / off."""
    sides: dict[str, dict[str, list[tuple[str, dict[str, Any]]]]] = {}
    for name, results in runs:
        side = "on" if is_on(results, flag) else "off"
        for result in results.get("scenarios") or []:
            scenario = result.get("scenario")
            if scenario not in MEASURES:
                continue
            if not result.get("ok"):
                print(f"{name}: {scenario} left out: it failed ({result.get('error')})", file=sys.stderr)
                continue
            sides.setdefault(scenario, {"off": [], "on": []})[side].append((name, result))
    out: dict[str, dict[str, Any]] = {}
    for scenario, found in sides.items():
        if not found["off"] or not found["on"]:
            print(f"{scenario} left out: no run {'on' if not found['on'] else 'off'}", file=sys.stderr)
            continue
        rows = []
        for label, path in MEASURES[scenario]:
            means = {}
            for side in ("off", "on"):
                values = [v for _, r in found[side] if (v := dig(r, path)) is not None]
                means[side] = statistics.fmean(values) if values else None
            off, on = means["off"], means["on"]
            rows.append({"measure": label, "off": off, "on": on,
                         "on_over_off": on / off if off and on is not None else None})
        out[scenario] = {"off": [n for n, _ in found["off"]], "on": [n for n, _ in found["on"]], "rows": rows}
    return out


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"


def report(table: dict[str, dict[str, Any]], flag: str, out: Any = None) -> None:
    out = out or sys.stdout
    for scenario, entry in table.items():
        print(f"== {scenario}: off {', '.join(entry['off'])}; on ({flag}) {', '.join(entry['on'])}", file=out)
        print(f"   {'measure':<42}{'off':>10}{'on':>10}{'on/off':>9}", file=out)
        for row in entry["rows"]:
            ratio = row["on_over_off"]
            print(f"   {row['measure']:<42}{_num(row['off']):>10}{_num(row['on']):>10}"
                  f"{'-' if ratio is None else f'{ratio:.3f}':>9}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m test.perf.onoff", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flag", required=True, help="the controller flag that makes a run 'on', e.g. --fair-sharing")
    parser.add_argument("files", nargs="+", type=Path, help="results files of test.perf.bench")
    args = parser.parse_args(argv)
    runs = []
    for path in args.files:
        try:
            runs.append((path.name, json.loads(path.read_text())))
        except (OSError, ValueError) as err:
            print(f"{path}: left out: {err}", file=sys.stderr)
    table = pooled(runs, args.flag)
    if not table:
        print(f"no scenario has runs both with and without {shlex.quote(args.flag)}", file=sys.stderr)
        return 1
    report(table, args.flag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
