"""Churn's timeline: when each workload was created, first seen Running and finished, and what that adds up to.

``bench --scenarios churn --timeline`` writes one JSON line per workload to
``.dev/bench-logs/<scenario>-timeline.jsonl`` (``rows``): its name, class, cpu, and the seconds from the load's start
at which its create returned, the load first saw it Running and its delete returned (null when it never was).
``python -m test.perf.timeline FILE [--step S]`` reads such a file and prints, every S seconds, the cpu each class
held (seen Running, not yet finished) and how many of each class were created and not yet seen Running: where a
class's wait comes from, room held by others or room left idle. Nothing here is timed against a target: it is for a
person reading a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    name: str
    cls: str
    cpu: float
    created: float | None
    running: float | None
    finished: float | None


@dataclass(frozen=True)
class Sample:
    at: float
    held_cpu: dict[str, float]  # by class: seen Running and not yet finished
    waiting: dict[str, int]  # by class: created and not yet seen Running


def rows(spec: Mapping[str, tuple[str, float]], created: Mapping[str, float], running: Mapping[str, float],
         finished: Mapping[str, float], t0: float) -> list[Row]:
    """One row per workload of ``spec`` (name -> (class, cpu)), its times in seconds after ``t0``, by creation."""
    def since(times: Mapping[str, float], name: str) -> float | None:
        when = times.get(name)
        return None if when is None else round(when - t0, 4)

    out = [Row(name, cls, cpu, since(created, name), since(running, name), since(finished, name))
           for name, (cls, cpu) in spec.items()]
    return sorted(out, key=lambda row: (row.created is None, row.created or 0.0, row.name))


def write(path: Path, timeline: Iterable[Row]) -> None:
    with path.open("w") as out:
        for row in timeline:
            out.write(json.dumps({"name": row.name, "class": row.cls, "cpu": row.cpu, "created": row.created,
                                  "running": row.running, "finished": row.finished}) + "\n")


def read(path: Path) -> list[Row]:
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            raw = json.loads(line)
            found.append(Row(raw["name"], raw["class"], float(raw["cpu"]), raw["created"], raw["running"],
                             raw["finished"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{number}: not a timeline row ({err})") from err
    return found


def samples(timeline: Sequence[Row], step: float) -> list[Sample]:
    """Every ``step`` seconds from 0 to the last finish: the cpu each class held and how many of it waited."""
    if step <= 0:
        raise ValueError(f"the step must be positive, not {step}")
    classes = sorted({row.cls for row in timeline})
    end = max((row.finished for row in timeline if row.finished is not None), default=0.0)
    out = []
    for index in range(int(end / step) + 1):
        at = round(index * step, 6)
        held = dict.fromkeys(classes, 0.0)
        waiting = dict.fromkeys(classes, 0)
        for row in timeline:
            if row.running is not None and row.running <= at and (row.finished is None or at < row.finished):
                held[row.cls] += row.cpu
            if row.created is not None and row.created <= at and (row.running is None or at < row.running):
                waiting[row.cls] += 1
        out.append(Sample(at, held, waiting))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m test.perf.timeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="a <scenario>-timeline.jsonl the bench wrote")
    parser.add_argument("--step", type=float, default=1.0, help="seconds between two lines (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        timeline = read(args.file)
        found = samples(timeline, args.step)
    except (OSError, ValueError) as err:
        print(f"timeline: {err}", file=sys.stderr)
        return 2
    classes = sorted({row.cls for row in timeline})
    print(f"{'s':>7}  " + "  ".join(f"{c + ' cpu':>12}" for c in classes) + "  "
          + "  ".join(f"{c + ' waiting':>16}" for c in classes))
    for sample in found:
        print(f"{sample.at:7.1f}  " + "  ".join(f"{sample.held_cpu[c]:12g}" for c in classes) + "  "
              + "  ".join(f"{sample.waiting[c]:16d}" for c in classes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
