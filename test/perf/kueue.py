"""Side by side with Kueue's own scheduler performance test, on the same machine.

Builds Kueue's ``test/performance/scheduler`` runner and ``minimalkueue`` from the Go module
``sigs.k8s.io/kueue@KUEUE_VERSION`` (fetched with ``go mod download``, built in a copy of the module so its own go.mod
applies), caches both binaries outside the repository (``~/.cache/mcad-dev/kueue-<version>/``, or under
``$MCAD_DEV_CACHE``), runs the test as Kueue's Makefile target ``run-performance-scheduler`` does (envtest: this
machine's cached kube-apiserver and etcd; Kueue's baseline generator config, scaled by ``--fraction``) and prints its
summary next to mcad's churn scenario in one table::

    python -m test.perf.kueue                                   # Kueue's full test only (15,000 workloads)
    python -m test.perf.kueue --with-churn                      # then churn at the same size, one table
    python -m test.perf.kueue --fraction 0.02 --with-churn      # a smoke run of both at 1/50
    python -m test.perf.kueue --churn-results bench-results.json   # churn's figures from an earlier bench run
    python -m test.perf.kueue --tas --fraction 0.1 --with-churn     # Kueue's TAS test next to mcad's churn_tas

``--tas`` runs Kueue's TAS configuration of the same test instead (``configs/tas/generator.yaml``, as the Makefile
target ``run-tas-performance-scheduler`` does: ``--enableTAS=true --timeout=20m``), into its own directory
(``kueue-<version>-tas``), and its mcad side is the ``churn_tas`` scenario.

The contract of what is compared and every difference between the two workloads is in test/perf/README.md
("Side by side with Kueue"). Kueue's figures come from its own outputs: ``summary.yaml`` (mean time to admission per
class), ``wlStates.csv`` (per workload, for the percentiles), ``minimalkueue.stats.yaml`` (its wall, CPU, max RSS)
and the runner's log (each workload set's start and end, from which the generator's lateness is derived). Nothing
here asserts a timing; the table is a figure for a person to read.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from test.perf.harness import dev_cache, percentile, say
from test.support import REPO, load_hack_module

KUEUE_MODULE = "sigs.k8s.io/kueue"
# The version the side-by-side is pinned to. The module proxy here also serves v0.19.2 (the first side-by-side
# figures came from it); --kueue-version picks another, cached apart. Bumping this needs a new recorded fixture
# (test/unit/fixtures/kueue/), which the unit test checks.
KUEUE_VERSION = "v0.17.0"
SCHEDULER_TEST = "test/performance/scheduler"
BASELINE_CONFIG = f"{SCHEDULER_TEST}/configs/baseline/generator.yaml"
TAS_CONFIG = f"{SCHEDULER_TEST}/configs/tas/generator.yaml"
# What the Makefile's run-tas-performance-scheduler passes the runner besides the baseline target's flags.
TAS_RUNNER_FLAGS = ("--enableTAS=true",)
TAS_TIMEOUT_S = 1200.0  # its --timeout=20m
CRDS = "config/components/crd/bases"
RUNNER = "performance-scheduler-runner"
MINIMALKUEUE = "minimalkueue"
# What envtest starts from KUBEBUILDER_ASSETS (kubectl is only looked up, never run, by the runner).
ENVTEST_ASSETS = ("kube-apiserver", "etcd", "kubectl")
CLASSES = ("small", "medium", "large")
# The runner's default --timeout is 10 min (the Makefile passes none); ours waits that plus start-up and write-out.
RUNNER_GRACE_S = 180.0


def cache_dir(version: str) -> Path:
    """One directory per Kueue version: its source copy, its two binaries and its envtest assets."""
    return dev_cache() / f"kueue-{version}"


class KueueError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------- build


def _go(args: list[str], cwd: Path) -> str:
    if shutil.which("go") is None:
        raise KueueError("Go is required to build Kueue's performance test ('go' is not on PATH)")
    proc = subprocess.run(["go", *args], cwd=cwd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise KueueError(f"go {' '.join(args)} failed in {cwd} (exit {proc.returncode}; see the output above)")
    return proc.stdout


def build(version: str) -> Path:
    """The cache directory of ``version`` with ``bin/RUNNER``, ``bin/MINIMALKUEUE`` and ``src/`` (built if absent)."""
    root = cache_dir(version)
    bins = [root / "bin" / RUNNER, root / "bin" / MINIMALKUEUE]
    if all(os.access(b, os.X_OK) for b in bins) and (root / "src" / "Makefile").is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    say(f"kueue: fetching {KUEUE_MODULE}@{version} with the go tool")
    started = time.monotonic()
    info = json.loads(_go(["mod", "download", "-json", f"{KUEUE_MODULE}@{version}"], cwd=root))
    if info.get("Error") or not info.get("Dir"):
        raise KueueError(f"go mod download {KUEUE_MODULE}@{version}: {info.get('Error') or 'no Dir'}")
    # The module cache is read-only and outside any build: copy it, so Kueue's go.mod (its replaces and versions)
    # governs the build and a make-style lookup of its Makefile (the runner's test utilities do one) finds it.
    src = root / "src"
    partial = root / "src.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(info["Dir"], partial)
    for path in [partial, *partial.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)
    shutil.rmtree(src, ignore_errors=True)
    partial.rename(src)
    fetched = time.monotonic()
    say(f"kueue: building {RUNNER} and {MINIMALKUEUE} (minutes when Go's caches are cold)")
    (root / "bin").mkdir(exist_ok=True)
    for name, pkg in ((RUNNER, "runner"), (MINIMALKUEUE, "minimalkueue")):
        _go(["build", "-o", str(root / "bin" / f"{name}.partial"), f"./{SCHEDULER_TEST}/{pkg}"], cwd=src)
        (root / "bin" / f"{name}.partial").rename(root / "bin" / name)
    (root / "build.json").write_text(json.dumps({
        "module": f"{KUEUE_MODULE}@{version}", "sum": info.get("Sum"), "go": _go(["version"], cwd=root).strip(),
        "fetch_s": round(fetched - started, 1), "build_s": round(time.monotonic() - fetched, 1),
        "built": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1) + "\n")
    say(f"kueue: built in {time.monotonic() - started:.0f} s into {root}")
    return root


def envtest_assets(root: Path) -> Path:
    """KUBEBUILDER_ASSETS for envtest: links to the control-plane binaries the local clusters use."""
    lc = load_hack_module("localcluster")
    bin_dir = Path(lc.tool_bin_dir())
    assets = root / "assets"
    assets.mkdir(exist_ok=True)
    for name in ENVTEST_ASSETS:
        target, link = bin_dir / name, assets / name
        if not os.access(target, os.X_OK):
            raise KueueError(f"{target} is missing (run hack/build-tools.sh)")
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return assets


# ---------------------------------------------------------------------------------------------- run


def scaled_config(baseline: dict[str, Any], fraction: float) -> dict[str, Any]:
    """Kueue's generator config with every workload set's count multiplied by ``fraction`` (at least 1); the
    cohorts, queues, quotas, intervals and run times stay, as churn's ``--churn-fraction`` keeps its 600 cpu."""
    config: dict[str, Any] = json.loads(json.dumps(baseline))
    for cohort in config["cohorts"]:
        for queues in cohort["queuesSets"]:
            for wl_set in queues["workloadsSets"]:
                wl_set["count"] = max(1, round(wl_set["count"] * fraction))
    return config


def run_kueue(root: Path, out: Path, fraction: float, timeout_s: float | None, *, tas: bool = False
              ) -> dict[str, Any]:
    """Run Kueue's test into ``out`` the way ``make run-performance-scheduler`` does (``tas``: as
    ``make run-tas-performance-scheduler`` does, on its TAS config); returns this run's facts."""
    src = root / "src"
    source = TAS_CONFIG if tas else BASELINE_CONFIG
    if tas and timeout_s is None:
        timeout_s = TAS_TIMEOUT_S
    baseline = yaml.safe_load((src / source).read_text())
    # A fresh directory: a file a failed run did not rewrite must not pass for this run's.
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config_path = out / "generator.yaml"
    if fraction == 1.0:
        shutil.copyfile(src / source, config_path)
    else:
        config_path.write_text(yaml.safe_dump(scaled_config(baseline, fraction), sort_keys=False))
    # The Makefile's defaults: minimalkueue's logs to files and its metrics scraped every 5 s.
    args = [str(root / "bin" / RUNNER), f"--o={out}", f"--crds={src / CRDS}", f"--generatorConfig={config_path}",
            f"--minimalKueue={root / 'bin' / MINIMALKUEUE}", "--withLogs=true", "--logToFile=true",
            "--metricsScrapeInterval=5s", *(TAS_RUNNER_FLAGS if tas else ())]
    if timeout_s is not None:
        args.append(f"--timeout={int(timeout_s)}s")
    env = {**os.environ, "KUBEBUILDER_ASSETS": str(envtest_assets(root))}
    limit = (timeout_s or 600.0) + RUNNER_GRACE_S
    say(f"kueue: running its scheduler test ({fraction:g} of the baseline) into {out}")
    started = time.monotonic()
    with open(out / "runner.log", "wb") as log:
        # cwd: the runner's test utilities look for Kueue's Makefile upwards from the working directory.
        proc = subprocess.Popen(args, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + limit
        next_line = time.monotonic() + 30
        status, usage = 0, None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > next_line:
                say(f"kueue: its test has run {time.monotonic() - started:.0f} s")
                next_line += 30
            if time.monotonic() > deadline:
                proc.terminate()
                proc.wait(30)
                raise KueueError(f"Kueue's runner ran past {limit:.0f} s; see {out / 'runner.log'}")
            time.sleep(0.5)
    wall = time.monotonic() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not (out / "summary.yaml").is_file():
        raise KueueError(f"Kueue's runner exited {code} without a summary; see {out / 'runner.log'}")
    facts = {"version": root.name.removeprefix("kueue-"), "fraction": fraction, "runner_wall_s": round(wall, 2),
             "config": source, "argv": args[1:]}
    if usage is not None:
        # The runner waits for minimalkueue and envtest's apiserver and etcd, so its rusage covers all of them.
        facts["all_processes_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    (out / "run.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


# ---------------------------------------------------------------------------------------------- parse


_LOG_LINE = re.compile(r"^(\S+)\tINFO\tgenerate workload group\t\S+\t(Start|End) generation\t(\{.*\})\s*$")


def _duration_ms(text: str) -> float:
    """A Go duration as the generator logs it ("100ms", "1.2s", "1m0s")."""
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(ms|us|µs|ns|h|m|s)", text):
        total += float(number) * {"h": 3.6e6, "m": 6e4, "s": 1e3, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6}[unit]
    return total


def _timestamp(text: str) -> float:
    # Go logs nanoseconds; Python's fromisoformat takes at most microseconds.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("Z", "+00:00"))
    return datetime.fromisoformat(text).timestamp()


@dataclass
class WorkloadSetTiming:
    """One workload set of one queue: when its generator loop started and returned, and what it was asked."""

    namespace: str
    delay_ms: float
    started: float = 0.0
    ended: float | None = None
    count: int = 0
    class_name: str = ""

    @property
    def lateness_ms(self) -> float | None:
        """How late the set's last create returned against ``count`` intervals from the set's start. The loop
        sleeps a full interval before each create, so the delay of every create adds up: the last is the latest."""
        if self.ended is None or not self.count:
            return None
        return (self.ended - self.started) * 1000 - self.count * self.delay_ms


def size_class(name: str) -> str:
    """The size a class name stands for: the baseline's classes are sizes; TAS's name one first
    ("large-required-rack" is large)."""
    return name.split("-")[0]


def set_timings(log_text: str, config: dict[str, Any]) -> list[WorkloadSetTiming]:
    """Each workload set's start and end from the runner's log, matched to its count and size class
    (``size_class``) in ``config`` by interval. The log names a set by its queue and interval only: sets of one
    queue with one interval but different size classes cannot be told apart and are left out; those of one size
    class (TAS's three sets of each size, started together) are paired by length, the set of fewest creates with
    the earliest end (and the earliest start), and a set that never ended has no lateness."""
    by_delay: dict[float, list[tuple[int, str]] | None] = {}
    for cohort in config["cohorts"]:
        for queues in cohort["queuesSets"]:
            per_queue: dict[float, list[tuple[int, str]]] = {}
            for wl_set in queues["workloadsSets"]:
                per_queue.setdefault(float(wl_set["creationIntervalMs"]), []).append(
                    (wl_set["count"] * len(wl_set["workloads"]), size_class(wl_set["workloads"][0]["className"])))
            for delay, found in per_queue.items():
                entries = sorted(found) if len({cls for _, cls in found}) == 1 else None
                by_delay[delay] = entries if by_delay.get(delay, entries) == entries else None
    starts: dict[tuple[str, float], list[float]] = {}
    ends: dict[tuple[str, float], list[float]] = {}
    for line in log_text.splitlines():
        match = _LOG_LINE.match(line)
        if not match:
            continue
        stamp, what, fields = match.groups()
        values = json.loads(fields)
        key = (values["namespace"], _duration_ms(values["delay"]))
        (starts if what == "Start" else ends).setdefault(key, []).append(_timestamp(stamp))
    sets: list[WorkloadSetTiming] = []
    for key, begun in starts.items():
        entries = by_delay.get(key[1])
        if entries is None or len(begun) != len(entries):
            continue
        finished = sorted(ends.get(key, []))
        for i, (started, (count, cls)) in enumerate(zip(sorted(begun), entries, strict=True)):
            ended = finished[i] if len(finished) == len(entries) else None
            sets.append(WorkloadSetTiming(key[0], key[1], started, ended, count, cls))
    return sets


def _stats_ms(values: list[float]) -> dict[str, Any]:
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {"n": len(v), "mean_ms": round(sum(v) / len(v), 1), "p50_ms": round(percentile(v, 50), 1),
            "p90_ms": round(percentile(v, 90), 1), "p99_ms": round(percentile(v, 99), 1), "max_ms": round(v[-1], 1)}


@dataclass
class KueueFigures:
    """What one run of Kueue's test says, read from its output directory."""

    version: str
    fraction: float
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    minimalkueue: dict[str, Any] = field(default_factory=dict)
    generator_lateness: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    evictions: int = 0
    dropped_events: int = 0


def parse_kueue(out: Path) -> KueueFigures:
    """Read a Kueue run's ``summary.yaml``, ``wlStates.csv``, ``minimalkueue.stats.yaml``, ``run.json`` and the
    generator lines of ``runner.log`` (with the ``generator.yaml`` it ran) from ``out``."""
    summary = yaml.safe_load((out / "summary.yaml").read_text())
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    figures = KueueFigures(version=run.get("version", "?"), fraction=run.get("fraction", 1.0), run=run,
                           dropped_events=int(summary.get("droppedWorkloadEvents", 0)))
    per_class: dict[str, list[float]] = {}
    with open(out / "wlStates.csv", newline="") as f:
        for row in csv.DictReader(f):
            per_class.setdefault(row["class name"], []).append(float(row["ms to admitted"]))
            figures.evictions += int(row["num evictions"])
    for name, cls in (summary.get("workloadClasses") or {}).items():
        figures.classes[name] = {**_stats_ms(per_class.get(name, [])), "count": cls["count"],
                                 "summary_mean_ms": cls["averageTimeToAdmissionMs"],
                                 "evictions": cls.get("totalEvictions", 0)}
    stats_path = out / f"{MINIMALKUEUE}.stats.yaml"
    if stats_path.is_file():
        stats = yaml.safe_load(stats_path.read_text())
        figures.minimalkueue = {"wall_s": stats["wallMs"] / 1000, "cpu_s": (stats["userMs"] + stats["sysMs"]) / 1000,
                                # Go's Maxrss is the kernel's ru_maxrss: KiB on Linux.
                                "peak_rss_mib": round(stats["maxrss"] / 1024, 1) if stats["maxrss"] >= 0 else None}
    if (out / "runner.log").is_file() and (out / "generator.yaml").is_file():
        timings = set_timings((out / "runner.log").read_text(errors="replace"),
                              yaml.safe_load((out / "generator.yaml").read_text()))
        ended = [t for t in timings if t.lateness_ms is not None]
        figures.generator_lateness = {"sets": len(ended), **_stats_ms([t.lateness_ms or 0.0 for t in ended]),
                                      # The classes' sets differ in length (35, 50 and 60 s) and so in lateness.
                                      "by_class": {c: _stats_ms([t.lateness_ms or 0.0 for t in ended
                                                                 if t.class_name == c]) for c in CLASSES}}
    return figures


def parse_churn(path: Path, scenario: str = "churn") -> dict[str, Any]:
    """The churn scenario's result (``scenario``: churn_tas's) in a bench results file (``python -m test.perf.bench
    --output``)."""
    data = json.loads(path.read_text())
    for result in data.get("scenarios", []):
        if result.get("scenario") == scenario:
            if not result.get("ok"):
                raise KueueError(f"{path}: {scenario} did not finish ok: {result.get('error')}")
            return {**result, "commit": data.get("commit"), "churn_fraction": data.get("churn_fraction")}
    raise KueueError(f"{path} has no {scenario} result")


# ---------------------------------------------------------------------------------------------- table


def _s(ms: Any) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}"


def _quad(figures: dict[str, Any]) -> str:
    """mean / p50 / p90 / p99 in seconds."""
    if not figures or not figures.get("n"):
        return "-"
    return " / ".join(_s(figures.get(k)) for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms"))


def table(kueue: KueueFigures | None, churn: dict[str, Any] | None) -> str:
    """One table: a row per figure, Kueue's column next to churn's; '-' where a side has no such figure."""
    rows: list[tuple[str, str, str]] = []
    k_classes = kueue.classes if kueue else {}
    latency = (churn or {}).get("latency", {})
    workloads_k = sum(c.get("count", 0) for c in k_classes.values()) if kueue else None
    rows.append(("workloads", str(workloads_k) if kueue else "-",
                 str(churn["params"]["workloads"]) if churn else "-"))
    # Kueue's classes (the baseline's are sizes; TAS's three per size), else churn's, grouped by size.
    names = list(dict.fromkeys([*k_classes, *((churn or {}).get("per_class") or {})]))
    for cls in CLASSES:
        members = [name for name in names if size_class(name) == cls] or [cls]
        for name in members:
            rows.append((f"{name}: wait mean / p50 / p90 / p99 s", _quad(k_classes.get(name, {})),
                         _quad(latency.get(f"time_to_dispatch_{name}", {}))))
        for name in members:
            rows.append((f"{name}: from scheduled arrival, mean / p50 / p90 / p99 s", "- (not recorded)",
                         _quad(latency.get(f"arrival_to_dispatch_{name}", {}))))
        late_k = (kueue.generator_lateness.get("by_class", {}) if kueue else {}).get(cls, {})
        rows.append((f"{cls}: create lateness, mean / max s",
                     f"each set's last create: {_s(late_k['mean_ms'])} / {_s(late_k['max_ms'])}"
                     if late_k.get("n") else "-", "- (all classes below)"))
    if kueue:
        late = kueue.generator_lateness
        k_late = (f"each set's last create: mean {_s(late.get('mean_ms'))} / p50 {_s(late.get('p50_ms'))} / "
                  f"max {_s(late.get('max_ms'))} ({late.get('sets')} sets)") if late.get("n") else "- (no log)"
    else:
        k_late = "-"
    c_late = (churn or {}).get("create_lateness", {})
    rows.append(("create lateness s", k_late,
                 f"every create: mean {_s(c_late.get('mean_ms'))} / p99 {_s(c_late.get('p99_ms'))} / "
                 f"max {_s(c_late.get('max_ms'))}" if c_late.get("n") else "-"))
    mk = kueue.minimalkueue if kueue else {}
    ctl = (churn or {}).get("controller", {})
    rows.append(("wall s", f"{mk['wall_s']:.1f} (minimalkueue's life)" if mk.get("wall_s") is not None else "-",
                 f"{churn['wall_s']:.1f} (first arrival to last finish)" if churn else "-"))
    rows.append(("controller CPU s", f"{mk['cpu_s']:.1f}" if mk.get("cpu_s") is not None else "-",
                 f"{ctl['cpu_seconds']:.1f}" if ctl.get("cpu_seconds") is not None else "-"))
    rows.append(("controller peak RSS MiB", f"{mk['peak_rss_mib']:.0f}" if mk.get("peak_rss_mib") else "-",
                 f"{ctl['peak_rss_mib']:.0f}" if ctl.get("peak_rss_mib") else "-"))
    if kueue:
        preempted = ((churn or {}).get("decisions") or {}).get("preempted")
        rows.append(("evictions (preemptions)", str(kueue.evictions),
                     f"{preempted} (evicted and requeued)" if preempted is not None else "- (no preemption)"))
        if kueue.run.get("all_processes_cpu_s") is not None:
            rows.append(("CPU of the whole test s", f"{kueue.run['all_processes_cpu_s']:.1f} (runner, envtest, "
                         "minimalkueue)", "-"))
    head = (f"Kueue {kueue.version} x{kueue.fraction:g}" if kueue else "Kueue (not run)",
            f"mcad {churn.get('scenario', 'churn')} x{churn.get('churn_fraction')} @{churn.get('commit')}" if churn
            else "churn (not run)")
    widths = [max(len(r[i]) for r in [("", *head), *rows]) for i in range(3)]
    lines = [f"{'':<{widths[0]}}  {head[0]:<{widths[1]}}  {head[1]}"]
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows]
    if kueue and kueue.dropped_events:
        lines.append(f"note: Kueue's recorder dropped {kueue.dropped_events} workload events (its figures are partial)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


def run_churn(fraction: float, out: Path, extra: list[str], scenario: str = "churn") -> Path:
    path = out / f"{scenario}.json"
    size = ["--churn-full"] if fraction == 1.0 else ["--churn-fraction", f"{fraction:g}"]
    cmd = [sys.executable, "-m", "test.perf.bench", "--scenarios", scenario, *size, "--output", str(path), *extra]
    say(f"kueue: running {scenario}: {' '.join(cmd[1:])}")
    proc = subprocess.run(cmd, cwd=REPO)
    if not path.is_file():
        raise KueueError(f"churn wrote no results (exit {proc.returncode})")
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m test.perf.kueue", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kueue-version", default=KUEUE_VERSION, help="module version (default %(default)s)")
    parser.add_argument("--fraction", type=float, default=1.0,
                        help="size of both runs as a fraction of Kueue's baseline 15,000 (default %(default)s)")
    parser.add_argument("--output", type=Path, default=REPO / ".dev" / "kueue",
                        help="directory for Kueue's artifacts and churn's results (default %(default)s)")
    parser.add_argument("--tas", action="store_true",
                        help="Kueue's TAS configuration (run-tas-performance-scheduler), next to mcad's churn_tas")
    parser.add_argument("--with-churn", action="store_true",
                        help="run churn (with --tas: churn_tas) at the same size after Kueue's test")
    parser.add_argument("--churn-args", default="", help="extra arguments for test.perf.bench's churn run")
    parser.add_argument("--churn-results", type=Path, help="take churn's figures from this bench results file")
    parser.add_argument("--skip-kueue", action="store_true", help="do not run Kueue's test; read --output's last run")
    parser.add_argument("--build-only", action="store_true", help="build (or find) the binaries and stop")
    parser.add_argument("--timeout", type=float, default=None,
                        help="the runner's --timeout in s (default: its own, 10 min; with --tas the Makefile's 20 min)")
    args = parser.parse_args(argv)
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    if args.with_churn and args.churn_results:
        parser.error("--with-churn and --churn-results are exclusive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.output / f"kueue-{args.kueue_version}{'-tas' if args.tas else ''}"
    scenario = "churn_tas" if args.tas else "churn"
    try:
        if not args.skip_kueue:
            root = build(args.kueue_version)
            if args.build_only:
                print(root)
                return 0
            run_kueue(root, out, args.fraction, args.timeout, tas=args.tas)
        kueue = parse_kueue(out)
    except (KueueError, OSError) as err:
        say(f"kueue: {err}")
        return 1
    churn, failed = None, False
    try:
        churn_path = run_churn(args.fraction, args.output, args.churn_args.split(), scenario) if args.with_churn \
            else args.churn_results
        churn = parse_churn(churn_path, scenario) if churn_path else None
    except (KueueError, OSError, ValueError) as err:
        # Kueue's figures took minutes: print them even when churn's side is missing.
        say(f"kueue: churn's side is missing: {err}")
        failed = True
    text = table(kueue, churn)
    print()
    print(text)
    (args.output / f"side-by-side{'-tas' if args.tas else ''}.txt").write_text(text + "\n")
    say(f"kueue: artifacts in {out}; this process's children used "
        f"{sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2]):.0f} s of CPU")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
