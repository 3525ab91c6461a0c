"""mcad's benchmark suite: ``make bench`` or ``python -m test.perf.bench [--scale F] [--scenarios a,b]``.

Each scenario brings up its own local control plane (``hack/localcluster.py --name bench-<scenario>``, no nodes
at start, raised in-flight limits), installs the CRD, creates its fake nodes through the API, runs
``mcad-controller --log-level warning`` as a separate process (log in .dev/bench-logs/) and drives load from this
process; then it stops the controller and takes the cluster down (``--keep`` keeps it). Latencies come from
watches: a monotonic stamp when each create call returns, and the first watch event showing the AppWrapper
``Running`` (or its pod Running). Controller CPU seconds (utime+stime) and peak RSS (VmHWM) come from /proc.

Results go to bench-results.json (one object per scenario, written after each scenario) and a table at the end.
A scenario that fails is reported with what it measured so far, and the next one runs; the exit code is 1 if any
failed.

Scenarios: ceiling, throughput, throughput_webhooks, placement, deep_queue, churn, churn_pods, restart,
noisy_neighbour, memory, admission, admission_attack, pollers, starvation, starvation_spare, dashboard, scale; and,
only when named in --scenarios, churn_tas, deep_queue_racks and throughput_racks (see test/perf/scenarios.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from test.perf.harness import say
from test.perf.scenarios import OPT_IN, SCENARIOS, TENANT_SCENARIOS, Options, Result
from test.support import REPO

DEFAULT_OUTPUT = REPO / "bench-results.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m test.perf.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every count (AppWrappers, nodes, probes) by this (default %(default)s)")
    parser.add_argument("--scenarios", default=",".join(s for s in SCENARIOS if s not in OPT_IN),
                        help="comma-separated subset, in any order (default: all but "
                             f"{', '.join(OPT_IN)}, in the order %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep each scenario's cluster up afterwards")
    parser.add_argument("--churn-full", action="store_true",
                        help="churn at Kueue's full size (15,000 workloads) instead of 1/10")
    parser.add_argument("--churn-pods", action="store_true",
                        help="churn with real pods: every workload a Job whose pod runs its run time on the kwok "
                             "nodes (the churn_pods scenario, run in place of churn)")
    parser.add_argument("--churn-fraction", type=float, default=None,
                        help="churn size as a fraction of Kueue's 15,000 (default 0.1; 1.0 with --churn-full)")
    parser.add_argument("--churn-nodes", type=int, default=15, help="40-cpu nodes in churn (default 15 = 600 cpu)")
    parser.add_argument("--restart-nodename", action="store_true",
                        help="restart: bind the pods with spec.nodeName (round-robin) instead of via kube-scheduler")
    parser.add_argument("--size", action="append", default=[], metavar="SCENARIO=FACTOR",
                        help="multiply one scenario's counts on top of --scale (repeatable), e.g. restart=0.5")
    parser.add_argument("--controller-args", default="",
                        help="extra arguments for mcad-controller, space-separated (e.g. --strict-fifo)")
    parser.add_argument("--controller-nice", type=int, default=0, choices=range(0, 20), metavar="N",
                        help="run mcad-controller at nice N (0-19): it yields the CPU to the load and the control "
                             "plane, which share this machine with it; never flatters it (default %(default)s)")
    parser.add_argument("--webhook-creator", choices=("webhook", "policy"), default="webhook",
                        help="who records the creator where the webhooks are registered (chart value "
                             "webhook.creator): the controller's mutating webhook, or a MutatingAdmissionPolicy in "
                             "the API server (default %(default)s)")
    parser.add_argument("--webhook-server", choices=("mcad", "null", "null-http2"), default="mcad",
                        help="throughput_webhooks: who answers the webhooks in the on-phases: the controller, or a "
                             "do-nothing Go server (built with go) for the floor that the API server's own admission "
                             "sets, over HTTP/1.1 as an installation's API server calls a Service (null-http2: "
                             "HTTP/2 offered too); no target is judged then (default %(default)s)")
    parser.add_argument("--webhook-rounds", type=int, default=1, metavar="R",
                        help="throughput_webhooks: R off/on pairs, in alternating order, rates averaged (the spread "
                             "between two runs is wider than the webhooks' cost; default %(default)s)")
    parser.add_argument("--throughput-pace", type=float, default=0.0, metavar="R",
                        help="throughput and throughput_webhooks: create on time at R AppWrappers a second (pick R "
                             "above the dispatch rate, so that dispatch is still what is measured), so that every "
                             "phase gets the same load; 0: a closed loop, as fast as the creators can (default "
                             "%(default)s)")
    parser.add_argument("--profile", action="store_true",
                        help="sample each controller with py-spy (pip install py-spy) and report its CPU by phase "
                             "(test.perf.phases); the samples go to .dev/bench-logs/<scenario>-<label>.profile.txt")
    parser.add_argument("--timeline", action="store_true",
                        help="churn, churn_pods and churn_tas: write when each workload was created, first seen "
                             "Running and finished to .dev/bench-logs/<scenario>-timeline.jsonl; read it with "
                             "python -m test.perf.timeline FILE")
    parser.add_argument("--tenants", type=int, default=1, metavar="N",
                        help=f"spread the AppWrappers of {', '.join(TENANT_SCENARIOS)} round-robin over N namespaces "
                             "(bench, bench-t01, ...), so that --fair-sharing has tenants to order: throughput's by "
                             "index, deep_queue's backlog (its probes stay in bench), churn's 30 arrival streams "
                             "(default %(default)s: all in bench)")
    parser.add_argument("--threads", type=int, default=16, help="load thread pool size (default %(default)s)")
    parser.add_argument("--load-processes", type=int, default=4,
                        help="churn's creating processes, each with --threads threads (default %(default)s)")
    parser.add_argument("--max-requests-inflight", type=int, default=2000)
    parser.add_argument("--max-mutating-requests-inflight", type=int, default=1000)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="results file (default %(default)s)")
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if args.scale <= 0:
        parser.error("--scale must be > 0")
    if args.tenants < 1:
        parser.error("--tenants must be >= 1")
    if args.tenants > 1 and not set(names) & set(TENANT_SCENARIOS):
        parser.error(f"--tenants spreads only {', '.join(TENANT_SCENARIOS)}, and --scenarios names none of them")
    if args.webhook_rounds < 1:
        parser.error("--webhook-rounds must be >= 1")
    if args.churn_pods:
        if "churn" not in names and "churn_pods" not in names:
            parser.error("--churn-pods runs churn with Jobs, but --scenarios has no churn")
        names = list(dict.fromkeys("churn_pods" if s == "churn" else s for s in names))
    args.scenario_list = names
    args.size_map = {}
    for item in args.size:
        key, _, value = item.partition("=")
        if key not in SCENARIOS:
            parser.error(f"--size {item}: unknown scenario {key!r}")
        try:
            args.size_map[key] = float(value)
        except ValueError:
            parser.error(f"--size {item}: {value!r} is not a number")
    return args


def previous_ceiling(path: Path) -> tuple[float | None, str]:
    """pairs/s of the ceiling scenario in an earlier results file, if any (for the throughput target)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, ""
    for r in data.get("scenarios", []):
        if r.get("scenario") == "ceiling" and r.get("ok"):
            value = (r.get("throughput") or {}).get("pairs_per_s")
            source = f"{path.name} of {data.get('started')} (scale {data.get('scale')})"
            return (float(value), source) if value else (None, "")
    return None, ""


def git_commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "mcad"], cwd=REPO, capture_output=True, text=True,
                           check=False).stdout.strip()
    return proc.stdout.strip() + ("+dirty(mcad)" if dirty else "")


def write_results(path: Path, meta: dict[str, Any], results: list[Result]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "scenarios": results}, indent=2) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------- table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def _per_class(classes: dict[str, dict[str, Any]]) -> list[str]:
    """Churn's time to dispatch per class next to Kueue's mean for that class."""
    if not classes:
        return []
    out = [f"   {'time to dispatch (ms)':<24}{'n':>7}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}"
           f"{'Kueue mean':>12}{'mean/Kueue':>12}"]
    for cls, c in classes.items():
        out.append(f"   {cls:<24}{c.get('n') or 0:>7}" + "".join(
            f"{_fmt(c.get(k)):>10}" for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms"))
            + f"{_fmt(c.get('kueue_mean_ms')):>12}{_fmt(c.get('mean_over_kueue')):>12}")
    return out


def render(results: list[Result]) -> str:
    out: list[str] = []
    for r in results:
        params = ", ".join(f"{k}={v}" for k, v in (r.get("params") or {}).items() if k != "threads")
        status = "ok" if r.get("ok") else "FAILED"
        out.append(f"== {r['scenario']} [{status}] ({params})")
        ctl = r.get("controller") or {}
        head = [f"scenario {_fmt(r.get('duration_s'))} s (cluster up {_fmt(r.get('cluster_up_s'))} s, "
                f"nodes Ready {_fmt(r.get('nodes_ready_s'))} s, teardown {_fmt(r.get('teardown_s'))} s)"]
        if r.get("wall_s") is not None:
            head.append(f"measured wall {_fmt(r.get('wall_s'))} s")
        if ctl:
            head.append(f"controller cpu {_fmt(ctl.get('cpu_seconds'))} s"
                        + (f" ({_fmt(ctl.get('load_cpu_seconds'))} s under load)" if "load_cpu_seconds" in ctl else "")
                        + f", peak RSS {_fmt(ctl.get('peak_rss_mib'))} MiB")
        out.append("   " + "; ".join(head))
        extra = []
        for key in ("throughput", "restart", "backlog", "big", "requests_per_call", "admitted_with_creator",
                    "starvation", "page", "payload_bytes", "polls_over_target", "attack", "attack_counts",
                    "completion"):
            if r.get(key):
                extra.append((f"{key}: " if key in ("requests_per_call", "admitted_with_creator", "page",
                                                    "payload_bytes", "polls_over_target", "attack",
                                                    "attack_counts", "completion") else "")
                             + ", ".join(f"{k} {_fmt(v)}" for k, v in r[key].items()))
        for key in ("create_rate_per_s", "utilisation_pct", "controller_ready_s", "webhooks_admitting_s",
                    "ceiling_source", "server_time_source"):
            if r.get(key) is not None:
                extra.append(f"{key} {_fmt(r[key])}")
        if r.get("controller_before_restart"):
            c = r["controller_before_restart"]
            extra.append(f"first controller: cpu {_fmt(c.get('cpu_seconds'))} s, "
                         f"peak RSS {_fmt(c.get('peak_rss_mib'))} MiB")
        for line in extra:
            out.append("   " + line)
        out.extend(_per_class(r.get("per_class") or {}))
        if r.get("api_writes"):
            w = r["api_writes"]
            out.append(f"   api writes seen by the API server {w.get('controller')} ({_fmt(w.get('per_workload'))} per "
                       f"workload): " + ", ".join(f"{k} {v}" for k, v in (w.get("by_request") or {}).items()))
        if r.get("controller_counted_writes"):
            w = r["controller_counted_writes"]
            out.append(f"   writes the controller counted {w.get('total')} ({_fmt(w.get('per_workload'))} per "
                       f"workload): " + ", ".join(f"{k} {v}" for k, v in (w.get("by_request") or {}).items()))
        for label, prof in (r.get("profile") or {}).items():
            shares = prof.get("share_pct") or {}
            out.append(f"   controller {label}: CPU by phase ({prof.get('samples', 0)} samples): " + ", ".join(
                f"{phase} {share:g} %" for phase, share in sorted(shares.items(), key=lambda item: -item[1])))
        cycles = r.get("cycles") or {}
        if "racks_over_flat" in cycles:
            out.append("   dispatch cycles, mean: " + ", ".join(
                f"{t} {_fmt(cycles[t].get('mean_ms'))} ms ({cycles[t].get('count')} cycles)" for t in ("flat", "racks"))
                + f"; racks / flat {_fmt(cycles['racks_over_flat'])}")
        elif cycles.get("count") is not None:
            out.append(f"   dispatch cycles {cycles['count']}, mean {_fmt(cycles.get('mean_ms'))} ms")
        if r.get("fairness"):
            out.append("   per tenant: " + ", ".join(f"{k} {_fmt(v)}" for k, v in r["fairness"].items()
                                                     if not isinstance(v, dict)))
        if r.get("dispatch_cycles"):
            c = r["dispatch_cycles"]
            out.append(f"   dispatch cycles {c.get('count')}, {_fmt(c.get('seconds'))} s in all")
        for run in r.get("runs") or []:
            waited = (f"dispatched in {_fmt(run['time_to_dispatch_s'])} s, margin {_fmt(run['margin_s'])} s, "
                      f"all pods Running in {_fmt(run.get('pods_running_s'))} s"
                      if run.get("dispatched") else f"NOT dispatched within {_fmt(run.get('waited_s'))} s")
            out.append(f"   {run['gang']}: {waited}; longest blocking run time "
                       f"{_fmt(run['longest_blocking_runtime_s'])} s ({run['blocking_small']} small ones running); "
                       f"{run['small_dispatched_meanwhile']} small ones dispatched meanwhile")
        lat = dict(r.get("latency") or {})
        if r.get("create_lateness", {}).get("n"):
            lat["(create lateness vs schedule)"] = r["create_lateness"]
        if lat:
            out.append(f"   {'latency (ms)':<34}{'n':>7}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}{'mean':>10}")
            for name, s in lat.items():
                out.append(f"   {name:<34}{s.get('n', 0):>7}" + "".join(
                    f"{_fmt(s.get(k)):>10}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms")))
        for t in r.get("targets") or []:
            met = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
            out.append(f"   target {t['name']}: {_fmt(t['value'])} (want {t['target']}) -> {met}")
        for note in r.get("notes") or []:
            out.append(f"   note: {note}")
        if r.get("error"):
            out.append(f"   ERROR: {r['error']}")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- main


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    opts = Options(scale=args.scale, keep=args.keep, threads=args.threads, load_processes=args.load_processes,
                   churn_fraction=args.churn_fraction if args.churn_fraction is not None
                   else (1.0 if args.churn_full else 0.1),
                   churn_nodes=args.churn_nodes, restart_nodename=args.restart_nodename,
                   max_inflight=args.max_requests_inflight, max_mutating_inflight=args.max_mutating_requests_inflight,
                   size=args.size_map, controller_args=tuple(args.controller_args.split()),
                   controller_nice=args.controller_nice, profile=args.profile, timeline=args.timeline,
                   webhook_creator=args.webhook_creator,
                   webhook_server=args.webhook_server,
                   webhook_rounds=args.webhook_rounds, throughput_pace=max(0.0, args.throughput_pace),
                   tenants=args.tenants)
    if "ceiling" not in args.scenario_list:
        opts.ceiling_pairs_per_s, opts.ceiling_source = previous_ceiling(args.output)
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "scale": args.scale, "size": args.size_map,
        "churn_fraction": opts.churn_fraction,
        "commit": git_commit(), "python": platform.python_version(), "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(), "argv": sys.argv[1:],
    }
    results: list[Result] = []
    started = time.monotonic()
    interrupted = False
    for name in args.scenario_list:
        result: Result = {"scenario": name, "ok": False, "targets": []}
        results.append(result)
        t0 = time.monotonic()
        say(f"=== scenario {name} (scale {args.scale:g})")
        try:
            SCENARIOS[name](opts, result)
            result["ok"] = True
        except KeyboardInterrupt:
            result["error"] = "interrupted"
            interrupted = True
        except Exception as err:
            result["error"] = f"{type(err).__name__}: {err}"
            result["traceback"] = traceback.format_exc()
            say(f"scenario {name} FAILED: {result['error']}")
        result["duration_s"] = round(time.monotonic() - t0, 1)
        say(f"=== scenario {name} {'done' if result['ok'] else 'failed'} in {result['duration_s']} s")
        meta["total_s"] = round(time.monotonic() - started, 1)
        meta["bench_process_cpu_seconds"] = round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1)
        write_results(args.output, meta, results)
        if interrupted:
            break
    print()
    print(render(results))
    print(f"total {meta['total_s']} s; results in {os.path.relpath(args.output)}")
    if interrupted:
        return 130
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
