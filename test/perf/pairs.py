"""Pool the webhooks off/on pairs of several ``throughput_webhooks`` runs into one figure.

    python -m test.perf.pairs bench-a.json bench-b.json ...   # results files of test.perf.bench
    python -m test.perf.pairs --creator policy *.json          # only the runs with that creator

One pair's ratio moves by several points from run to run on a shared machine, and one invocation of the bench
takes a few pairs at most, so a figure worth quoting pools several runs. This prints every pair (file, phase,
off and on AppWrappers dispatched/s, on / off, and on / off end to end), then the pooled figures: the ratio of the
mean rates (what the bench reports for one run), the mean of the pairs' ratios with its 95 % interval
(``harness.mean_interval``), and whether the target (``scenarios.WEBHOOKS_RATIO_TARGET_PCT``) is met, missed, or
within the interval (not shown either way); for the dispatch rate (the target's figure) and, where every pair of
a creator has it, for the end-to-end rate (AppWrappers whose pod runs per second: ``throughput_webhooks``).

Pairs are read from each run's ``phases``: ``off`` with ``on``, ``off-2`` with ``on-2``, and so on. A run whose
scenario failed, or a file with no ``throughput_webhooks`` result, is named on stderr and left out; no pairs at
all is exit code 1. Runs of different creators (``params.creator``) are kept apart unless ``--creator`` picks one:
their costs differ, and pooling them would describe neither. So are runs of different webhook servers
(``params.webhook_server``): a null webhook's pairs (``--webhook-server null``) are the floor the API server's own
admission sets, pooled and printed as such, with no verdict on the target.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from test.perf.harness import mean_interval
from test.perf.scenarios import WEBHOOKS_RATIO_TARGET_PCT


@dataclass(frozen=True)
class Pair:
    source: str  # file and phase suffix, e.g. "r4.json on-2"
    creator: str
    off: float  # AppWrappers dispatched per second
    on: float
    # End to end, AppWrappers whose pod runs per second (runs from before it was recorded have none).
    off_pods: float | None = None
    on_pods: float | None = None
    server: str = "mcad"  # who answered the webhooks: mcad, or the null webhook (the floor)

    @property
    def group(self) -> str:
        return f"creator {self.creator}" + ("" if self.server == "mcad" else f", server {self.server}")

    @property
    def ratio_pct(self) -> float:
        return 100 * self.on / self.off

    @property
    def pods_ratio_pct(self) -> float | None:
        return None if self.off_pods is None or self.on_pods is None else 100 * self.on_pods / self.off_pods


def pairs_of(result: dict[str, Any], source: str) -> list[Pair]:
    """The off/on pairs of one results file's ``throughput_webhooks`` scenario (none if it is absent or failed)."""
    pairs: list[Pair] = []
    for scenario in result.get("scenarios") or []:
        if scenario.get("scenario") != "throughput_webhooks" or not scenario.get("ok"):
            continue
        phases = scenario.get("phases") or {}
        creator = (scenario.get("params") or {}).get("creator", "webhook")
        server = (scenario.get("params") or {}).get("webhook_server", "mcad")
        for name, phase in phases.items():
            if not name.startswith("off"):
                continue
            suffix = name[len("off"):]
            partner = phases.get("on" + suffix)
            if partner is None:
                continue
            off, on = phase["throughput"]["dispatched_per_s"], partner["throughput"]["dispatched_per_s"]
            off_pods, on_pods = (phase["throughput"].get("pods_running_per_s"),
                                 partner["throughput"].get("pods_running_per_s"))
            if off > 0:
                pairs.append(Pair(f"{source} {'on' + suffix}", creator, off, on,
                                  off_pods if off_pods else None, on_pods, server))
    return pairs


def verdict(low: float, high: float, target: float = WEBHOOKS_RATIO_TARGET_PCT) -> str:
    if low >= target:
        return "met"
    if high < target:
        return "missed"
    return "not shown either way (the target is within the interval)"


def pooled(label: str, offs: list[float], ons: list[float], judged: bool = True) -> str:
    """One line: the ratio of the mean rates, and the mean of the pairs' ratios with its interval and (``judged``)
    the verdict on the target."""
    mean_off, mean_on = sum(offs) / len(offs), sum(ons) / len(ons)
    line = (f"{label}: {len(offs)} pairs, off {mean_off:.1f}/s, on {mean_on:.1f}/s, "
            f"ratio of means {100 * mean_on / mean_off:.1f} %")
    interval = mean_interval(100 * on / off for off, on in zip(offs, ons, strict=True))
    if interval is not None:
        mean, low, high = interval
        line += f"; mean of ratios {mean:.1f} % (95 % interval {low:.1f}-{high:.1f})"
        line += (f"; target >= {WEBHOOKS_RATIO_TARGET_PCT:g} %: {verdict(low, high)}" if judged
                 else "; the floor (no target judged)")
    return line


def report(pairs: list[Pair], out: Any = None) -> None:
    """Every pair, then per creator and webhook server the dispatch rate pooled (the target's figure) and, where
    every pair has it, the end-to-end rate (AppWrappers whose pod runs per second)."""
    out = out or sys.stdout
    print(f"{'pair':<40} {'creator':<8} {'server':<10} {'off/s':>7} {'on/s':>7} {'on/off %':>9} "
          f"{'pods on/off %':>14}", file=out)
    for pair in pairs:
        pods = f"{pair.pods_ratio_pct:.1f}" if pair.pods_ratio_pct is not None else "-"
        print(f"{pair.source:<40} {pair.creator:<8} {pair.server:<10} {pair.off:>7.1f} {pair.on:>7.1f} "
              f"{pair.ratio_pct:>9.1f} {pods:>14}", file=out)
    for label in sorted({pair.group for pair in pairs}):
        group = [pair for pair in pairs if pair.group == label]
        judged = group[0].server == "mcad"
        print(pooled(f"{label}, dispatched", [p.off for p in group], [p.on for p in group], judged), file=out)
        ends = [(p.off_pods, p.on_pods) for p in group if p.off_pods is not None and p.on_pods is not None]
        if len(ends) == len(group):
            print(pooled(f"{label}, pods running", [off for off, _ in ends], [on for _, on in ends], judged),
                  file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m test.perf.pairs", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="results files of test.perf.bench")
    parser.add_argument("--creator", choices=["webhook", "policy"], help="only the runs with this creator")
    args = parser.parse_args(argv)
    pairs: list[Pair] = []
    for path in args.files:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            print(f"{path}: left out: {err}", file=sys.stderr)
            continue
        found = [pair for pair in pairs_of(result, path.name) if args.creator in (None, pair.creator)]
        if not found:
            print(f"{path}: left out: no completed throughput_webhooks pair"
                  + (f" with creator {args.creator}" if args.creator else ""), file=sys.stderr)
        pairs.extend(found)
    if not pairs:
        print("no pairs", file=sys.stderr)
        return 1
    report(pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
