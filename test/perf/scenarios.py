"""The benchmark scenarios (test/perf/README.md lists them). Each fills in a result dict as it goes, so
a failure keeps what was measured before it, and each runs in its own fresh cluster (``Env``), taken down
afterwards unless ``--keep``.

Counts are multiplied by ``Options.scale`` (see ``scaled``); the per-scenario docstrings say what is measured.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3

from test.e2e import attack as load
from test.perf import phases
from test.perf import timeline as timeline_mod
from test.perf import webhooks as webhooks_mod
from test.perf.client import Api, ApiError, Obj, Watch
from test.perf.harness import (
    AW_LABEL,
    LOGS,
    NAMESPACE,
    PROBE_LABEL,
    QUOTA_CRD,
    BenchError,
    Cluster,
    Controller,
    Progress,
    Tracker,
    appwrapper,
    aw_collection_of,
    aw_path,
    configmap_item,
    cpu_window,
    create_namespace,
    create_nodes,
    install_crd,
    jain_index,
    job_item,
    machine_cpu,
    mean_interval,
    pod_item,
    run_parallel,
    say,
    scaled,
    summary,
    tenant_namespace,
    wait_for,
    watch_appwrappers,
    watch_pods,
)
from test.perf.load import OnTimeLoad
from test.perf.nullwebhook import NullWebhook
from test.support import REPO

Result = dict[str, Any]


@dataclass
class Options:
    scale: float = 1.0
    keep: bool = False
    threads: int = 16
    load_processes: int = 4  # churn's creating processes (test.perf.load), each with ``threads`` threads
    # Concurrent writers in the ceiling scenario: the same as mcad-controller's default --write-workers, so the
    # reference and the controller ask the API server with the same concurrency.
    ceiling_threads: int = 32
    churn_fraction: float = 0.1  # --churn-full sets 1.0
    churn_nodes: int = 15  # x CHURN_NODE_CPU = Kueue's 600 cpu of nominal quota
    restart_nodename: bool = False  # True: restart's pods are bound with nodeName instead of by kube-scheduler
    max_inflight: int = 2000
    max_mutating_inflight: int = 1000
    ceiling_pairs_per_s: float | None = None  # from the ceiling scenario (this run or the last results file)
    ceiling_source: str = ""
    size: dict[str, float] = field(default_factory=dict)  # per-scenario factor on top of scale (--size name=F)
    controller_args: tuple[str, ...] = ()
    controller_nice: int = 0  # the controller's nice value (--controller-nice): 0 as the others, higher yields CPU
    webhook_creator: str = "webhook"  # chart value webhook.creator where webhooks are registered (--webhook-creator)
    webhook_rounds: int = 1  # throughput_webhooks' off/on pairs, in alternating order (--webhook-rounds)
    # Who answers the webhooks in throughput_webhooks' on-phases (--webhook-server): "mcad" (the controller),
    # "null" or "null-http2" (test.perf.nullwebhook, the floor figure).
    webhook_server: str = "mcad"
    throughput_pace: float = 0.0  # creates a second in the throughput scenarios, on time; 0: closed loop
    profile: bool = False  # --profile: each controller sampled by py-spy, its CPU by phase in the results
    timeline: bool = False  # --timeline: churn writes each workload's times (test.perf.timeline)
    # --tenants: the AppWrappers of TENANT_SCENARIOS spread round-robin over this many namespaces (tenant_namespace),
    # so that fair sharing has tenants to order; 1 = all in the bench namespace.
    tenants: int = 1

    def factor(self, scenario: str) -> float:
        return self.scale * self.size.get(scenario, 1.0)

    def tenants_for(self, scenario: str) -> int:
        return self.tenants if scenario in TENANT_SCENARIOS else 1


# The scenarios whose AppWrappers --tenants spreads over namespaces: throughput's (round-robin by index),
# deep_queue's backlog (its probes stay in the bench namespace, tenant 0) and churn's arrival streams (stream q in
# tenant q mod N: 30 tenants = one per Kueue queue).
TENANT_SCENARIOS = ("throughput", "deep_queue", "churn")


# Scenarios that queue a backlog and wait until all of it shows Pending: every Backoff written at once, since the
# default pace (10 a second) would make the set-up of 10,000 take 1,000 s; a later --controller-args wins.
UNPACED = ("--backoff-status-rate=0",)


def add_target(result: Result, name: str, value: float | None, op: str, bound: float, unit: str) -> None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        met = None
    elif op == ">=":
        met = value >= bound
    elif op == "<=":
        met = value <= bound
    else:
        met = value < bound
    result["targets"].append({"name": name, "target": f"{op} {bound:g} {unit}".strip(),
                              "value": None if value is None else round(value, 3), "met": met})


class Env:
    """One scenario's world: a fresh cluster with the CRD and the ``bench`` namespace, controllers and watches,
    all stopped (and the cluster taken down unless ``keep``) on exit, whatever happened."""

    def __init__(self, scenario: str, opts: Options, result: Result, *, node_lease_seconds: int | None = None
                 ) -> None:
        self.scenario = scenario
        self.opts = opts
        self.result = result
        self.cluster = Cluster(f"bench-{scenario.replace('_', '-')}", max_inflight=opts.max_inflight,
                               max_mutating_inflight=opts.max_mutating_inflight,
                               node_lease_seconds=node_lease_seconds)
        self.controllers: list[Controller] = []
        self.profilers: list[tuple[str, Controller, subprocess.Popen[bytes]]] = []
        self.watches: list[Watch] = []
        self._api: Api | None = None
        self.tenants = opts.tenants_for(scenario)

    @property
    def api(self) -> Api:
        assert self._api is not None
        return self._api

    def __enter__(self) -> Env:
        started = time.monotonic()
        say(f"{self.scenario}: bringing up cluster {self.cluster.name}")
        try:
            self.cluster.up()
            self._api = Api(self.cluster.kubeconfig, pool_size=max(32, self.opts.threads * 2))
            install_crd(self.api)
            create_namespace(self.api)
            if self.tenants > 1:
                run_parallel(lambda k: create_namespace(self.api, tenant_namespace(k, self.tenants)),
                             range(1, self.tenants), self.opts.threads)
                self.result.setdefault("params", {})["tenants"] = self.tenants
        except BaseException:
            self.__exit__()
            raise
        self.result["cluster_up_s"] = round(time.monotonic() - started, 1)
        return self

    def nodes(self, count: int, **kw: Any) -> None:
        say(f"{self.scenario}: creating {count} fake nodes")
        self.result["nodes_ready_s"] = round(create_nodes(self.api, count, threads=self.opts.threads, **kw), 1)

    def controller(self, label: str, **kw: Any) -> Controller:
        kw.setdefault("args", self.opts.controller_args)
        kw["args"] = self._reservations(tuple(kw["args"]))
        ctl = Controller(self.cluster.kubeconfig, f"{self.scenario}-{label}", **kw)
        self.controllers.append(ctl)
        ctl.start()
        if self.opts.profile:
            self.profilers.append((label, ctl, start_profiler(ctl)))
        if self.opts.controller_nice:
            # Below the load and the control plane for the CPU: never flatters the controller, and keeps the load
            # on time on a machine it shares with them (clients of a real cluster run elsewhere).
            os.setpriority(os.PRIO_PROCESS, ctl.pid, self.opts.controller_nice)
            self.result.setdefault("params", {})["controller_nice"] = self.opts.controller_nice
        return ctl

    def _reservations(self, args: tuple[str, ...]) -> tuple[str, ...]:
        """``args`` without ``--reservations`` if this controller does not know the flag (one older than reservations),
        so that a run asking for reservations off works on both; ``params.reservations`` says what the run had."""
        params = self.result.setdefault("params", {})
        if not controller_knows(RESERVATIONS_FLAG):
            kept = drop_flag(args, RESERVATIONS_FLAG)
            params["reservations"] = "absent (controller has no --reservations)"
            if kept != args:
                self.result.setdefault("notes", []).append(
                    f"{RESERVATIONS_FLAG} dropped from the controller's arguments: this controller does not know it")
            return kept
        values = [a.split("=", 1)[1] for a in args if a.startswith(RESERVATIONS_FLAG + "=")]
        values += [args[i + 1] for i, a in enumerate(args[:-1]) if a == RESERVATIONS_FLAG]
        params["reservations"] = values[-1] if values else "default"
        return args

    def watch(self, w: Watch) -> Watch:
        self.watches.append(w)
        return w

    def __exit__(self, *exc: object) -> None:
        started = time.monotonic()
        for w in self.watches:
            w.stop()
        for ctl in self.controllers:
            ctl.stop()
        for label, ctl, profiler in self.profilers:
            # py-spy writes its file once the process it samples has exited.
            with contextlib.suppress(subprocess.TimeoutExpired):
                profiler.wait(timeout=60)
            self.result.setdefault("profile", {})[label] = {"file": str(profile_path(ctl)),
                                                           **phases.summarize(profile_path(ctl))}
        for ctl in self.controllers:
            errors = ctl.errors()
            if errors:
                self.result.setdefault("notes", []).append(
                    f"{ctl.log.name}: {len(errors)} error line(s), first: {errors[0]}")
        if self.opts.keep and self.cluster.started:
            say(f"{self.scenario}: keeping cluster {self.cluster.name} (kubeconfig {self.cluster.kubeconfig}); "
                f"stop it with: python3 hack/localcluster.py --name {self.cluster.name} down")
        else:
            self.cluster.down()
        self.result["teardown_s"] = round(time.monotonic() - started, 1)


RESERVATIONS_FLAG = "--reservations"


def profile_path(ctl: Controller) -> Path:
    return ctl.log.with_suffix(".profile.txt")


def start_profiler(ctl: Controller) -> subprocess.Popen[bytes]:
    """py-spy sampling ``ctl`` until it exits (``test.perf.phases``: the thread holding the GIL, 100 times a
    second, in py-spy's raw format)."""
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        raise BenchError("--profile needs py-spy in the venv: .venv/bin/pip install py-spy")
    log = open(ctl.log.with_suffix(".py-spy.log"), "wb")  # noqa: SIM115 (the profiler's, for as long as it runs)
    return subprocess.Popen([str(exe), "record", "--pid", str(ctl.pid), "--rate", "100", "--gil", "--nonblocking",
                             "--format", "raw", "--output", str(profile_path(ctl))],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


@functools.cache
def controller_knows(flag: str) -> bool:
    """Whether ``mcad-controller --help`` lists ``flag`` (asked once per process)."""
    exe = Path(sys.executable).parent / "mcad-controller"
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120, check=False)
    return re.search(re.escape(flag) + r"(?![\w-])", proc.stdout) is not None


def drop_flag(args: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """``args`` without ``flag=value`` or ``flag value``."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return tuple(out)


# The API server's request counter: mutating verbs (APPLY is server-side apply, counted apart from PATCH).
MUTATING_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def api_writes(api: Api) -> Counter[str]:
    """Mutating requests the API server has answered so far (``apiserver_request_total`` on its /metrics), by
    ``"VERB resource[.group][/subresource]"``. The metric has no client label: callers subtract what they know
    is not the controller's."""
    counts: Counter[str] = Counter()
    for line in api.text("/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line.rpartition("}")
        labels = dict(_LABEL.findall(labels_text))
        if labels.get("verb") not in MUTATING_VERBS:
            continue
        resource = labels.get("resource", "") + (f".{labels['group']}" if labels.get("group") else "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        counts[f"{labels['verb']} {resource}"] += int(float(value.split()[0]))
    return counts


def settled_api_writes(api: Api, timeout: float = 10.0) -> Counter[str]:
    """``api_writes`` once two readings a second apart agree, apart from heartbeats (at most ``timeout``): the
    controller's last status writes for what just finished are counted."""
    deadline = time.monotonic() + timeout
    last = api_writes(api)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = api_writes(api)
        if _without_heartbeats(now - last) == Counter():
            return now
        last = now
    return last


# Writes of kwok's nodes and of the control plane's components (node status, leases) go on whatever the load.
HEARTBEATS = re.compile(r"^\S+ (leases\.coordination\.k8s\.io|nodes)(/|$)")


def _without_heartbeats(counts: Counter[str]) -> Counter[str]:
    return Counter({k: v for k, v in counts.items() if v > 0 and not HEARTBEATS.match(k)})


def controller_writes(before: Counter[str], after: Counter[str], own: Counter[str],
                      garbage_collected: tuple[str, ...]) -> dict[str, Any]:
    """What the controller wrote between two ``api_writes`` readings: every mutating request, minus heartbeats,
    minus ``own`` (the load process's requests, which it counts itself), minus the deletions in
    ``garbage_collected`` (e.g. ``"DELETE configmaps"``: the garbage collector removing what an AppWrapper the
    load process deleted had created). Returns the total, the breakdown and what was left out."""
    delta = after - before
    heartbeats = sum(v for k, v in delta.items() if HEARTBEATS.match(k))
    left = _without_heartbeats(delta)
    left.subtract(own)
    gc = {k: left.pop(k) for k in garbage_collected if k in left}
    left = Counter({k: v for k, v in left.items() if v})
    return {"controller": sum(left.values()), "by_request": dict(sorted(left.items())),
            "load_process": dict(own), "heartbeats": heartbeats, "garbage_collector": gc}


class Finisher:
    """Deletes each AppWrapper at the time it is due (as Kueue's runner finishes a workload): a heap served by
    one thread, deletes on a small pool. ``finished`` holds when each delete returned; ``errors`` any failures."""

    def __init__(self, api: Api, tracker: Tracker, workers: int = 8,
                 namespace_of: Callable[[str], str] | None = None) -> None:
        self.api = api
        self.tracker = tracker
        self.namespace_of = namespace_of  # an AppWrapper's namespace by its name (None: all in the bench namespace)
        self.finished: dict[str, float] = {}
        self.errors: list[BaseException] = []
        self._due: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="finish")
        self._thread = threading.Thread(target=self._run, daemon=True, name="finisher")

    def start(self) -> Finisher:
        self._thread.start()
        return self

    def at(self, when: float, name: str) -> None:
        with self._cond:
            heapq.heappush(self._due, (when, name))
            self._cond.notify()

    def _finish(self, name: str) -> None:
        try:
            self.api.delete(aw_path(name, self.namespace_of(name) if self.namespace_of else NAMESPACE))
        except BaseException as err:
            self.errors.append(err)
        with self.tracker.cond:
            self.finished[name] = time.monotonic()
            self.tracker.cond.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if not self._due:
                    self._cond.wait(0.2)
                    continue
                when, name = self._due[0]
                left = when - time.monotonic()
                if left > 0:
                    self._cond.wait(min(left, 0.2))
                    continue
                heapq.heappop(self._due)
            self._pool.submit(self._finish, name)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)


def has(seen: dict[str, Any], name: str, *more: dict[str, Any]) -> Callable[[], bool]:
    """A check for ``Tracker.wait``: ``name`` is in ``seen`` (or in any of ``more``)."""
    return lambda: name in seen or any(name in m for m in more)


def warmup(env: Env, ctl: Controller, timeout: float = 120) -> float:
    """Wait until the controller dispatches a tiny AppWrapper (it has synced and works), then delete it."""
    # A name of this controller's own: a second controller in the scenario reusing the first one's would find that
    # warm-up's ConfigMap still there (the garbage collector removes it only later: ~30 s here) and retry until it
    # is gone, and its ready time would measure the garbage collector.
    name = f"bench-warmup-{ctl.pid}"
    started = time.monotonic()
    env.api.create(aw_path(), appwrapper(name, [configmap_item(name, {"cpu": "10m"})]))

    def running() -> bool:
        return (env.api.get(aw_path(name)).get("status") or {}).get("state") == "Running"

    wait_for(running, timeout, "the controller to dispatch the warm-up AppWrapper", interval=0.1,
             alive=ctl.check_alive)
    ready = time.monotonic() - started
    env.api.delete(aw_path(name))

    def gone() -> bool:
        try:
            env.api.get(aw_path(name))
        except ApiError as err:
            return err.status == 404
        return False

    wait_for(gone, 60, "the warm-up AppWrapper to go away", interval=0.1)
    return ready


def controller_figures(ctl: Controller, baseline: dict[str, float] | None = None) -> dict[str, Any]:
    """CPU seconds and peak RSS now (call before stopping it); ``load_cpu_seconds`` is the part after baseline."""
    now = ctl.stats()
    out: dict[str, Any] = {"cpu_seconds": now.get("cpu_seconds"), "peak_rss_mib": now.get("peak_rss_mib"),
                           "rss_mib": now.get("rss_mib")}
    if baseline and now.get("cpu_seconds") is not None:
        out["load_cpu_seconds"] = round(now["cpu_seconds"] - baseline.get("cpu_seconds", 0.0), 2)
    return out


def create_all(env: Env, tracker: Tracker, bodies: list[Obj], calls: list[float] | None = None) -> float:
    """Create every AppWrapper (in its ``metadata.namespace``, else the bench namespace) with the thread pool,
    stamping each when its create call returns; returns seconds. ``calls``, if given, gets how long each create
    call took."""
    api = env.api

    def create(body: Obj) -> None:
        sent = time.monotonic()
        api.create(aw_collection_of(body), body)
        returned = time.monotonic()
        tracker.mark_created(body["metadata"]["name"], returned)
        if calls is not None:
            calls.append(returned - sent)  # list.append is atomic

    started = time.monotonic()
    run_parallel(create, bodies, env.opts.threads)
    return time.monotonic() - started


# ---------------------------------------------------------------------------------------------- ceiling


def ceiling(opts: Options, result: Result) -> None:
    """No controller: the load process itself does what a dispatch does, for N pre-created AppWrappers: a GET of
    the AppWrapper (its templates; from the watch cache), SSA of a one-pod Job owned by the AppWrapper, then the
    AppWrapper's status (the controller's dispatched status, as a JSON patch conditioned on its uid). writes/s and
    pairs/s are the API server's write rate for this work: the reference for the throughput target.
    """
    from mcad.api.appwrapper import appwrapper_view
    from mcad.k8s.apply import generic_items, manifest
    from mcad.model.status import dispatched

    f = opts.factor("ceiling")
    n = scaled(2000, f)
    n_nodes = scaled(100, f)
    result["params"] = {"appwrappers": n, "nodes": n_nodes, "threads": opts.ceiling_threads}
    with Env("ceiling", opts, result) as env:
        env.nodes(n_nodes, cpu="8", memory="32Gi", pods=110)
        api = env.api
        created: dict[str, Obj] = {}
        lock = threading.Lock()

        def create(name: str) -> None:
            obj = api.create(aw_path(), appwrapper(name, [job_item(name, "100m", delay="1h")]))
            with lock:
                created[name] = obj

        names = [f"ceil-{i:05d}" for i in range(n)]
        say(f"ceiling: pre-creating {n} AppWrappers (no controller)")
        started = time.monotonic()
        with Progress("ceiling", lambda: f"created {len(created)}/{n}"):
            run_parallel(create, names, opts.threads)
        create_s = time.monotonic() - started
        result["create_rate_per_s"] = round(n / create_s, 1)

        job_lat: list[float] = []
        status_lat: list[float] = []
        done = [0]
        # The watch sees the status each pair writes: seen - write returned calibrates the latency method.
        written: dict[str, float] = {}
        tracker = Tracker()
        env.watch(watch_appwrappers(api, tracker))

        def dispatch(name: str) -> None:
            aw = appwrapper_view(created[name])
            t0 = time.monotonic()
            # As the controller does: read the AppWrapper's templates (it keeps none), no older than it knows.
            raw = api.get(aw_path(name), query={"resourceVersion": aw.resource_version})
            obj = manifest(aw, 0, generic_items(raw)[0])
            api.apply(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{obj['metadata']['name']}", obj,
                      "mcad-bench-ceiling")
            t1 = time.monotonic()
            status = dispatched({}, datetime.now(UTC), priority=aw.priority)
            # As the controller writes status: a JSON patch conditioned on the uid.
            api.request("PATCH", aw_path(name) + "/status", [
                {"op": "test", "path": "/metadata/uid", "value": aw.uid},
                {"op": "add", "path": "/status", "value": status}], query={"fieldManager": "mcad-bench-ceiling"},
                content_type="application/json-patch+json")
            t2 = time.monotonic()
            with lock:
                job_lat.append(t1 - t0)
                status_lat.append(t2 - t1)
                written[name] = t2
                done[0] += 1

        say(f"ceiling: {n} dispatch-equivalents (SSA Job + SSA status) with {opts.ceiling_threads} threads")
        started = time.monotonic()
        with Progress("ceiling", lambda: f"dispatch-equivalents {done[0]}/{n}"):
            run_parallel(dispatch, names, opts.ceiling_threads)
        wall = time.monotonic() - started
        result["wall_s"] = round(wall, 2)
        pairs = n / wall
        result["throughput"] = {"writes_per_s": round(2 * n / wall, 1), "pairs_per_s": round(pairs, 1)}
        tracker.wait(lambda: len(tracker.running) >= n, 60, f"the watch to see {n} statuses")
        result["latency"] = {"ssa_job": summary(job_lat), "ssa_status": summary(status_lat),
                             "(status write returned to seen)": summary(tracker.latencies(names, tracker.running,
                                                                                          written))}
        opts.ceiling_pairs_per_s = pairs
        opts.ceiling_source = "this run"


# ---------------------------------------------------------------------------------------------- throughput


def throughput(opts: Options, result: Result) -> None:
    """N single-pod AppWrappers (one Job each, 100m, pods stay Running) that all fit, created as fast as the
    thread pool can; creation -> Running (dispatched) and creation -> first pod Running, and the dispatch rate
    AppWrappers dispatched / (last dispatch - first create)."""
    rate = _throughput_run("throughput", opts, result, opts.factor("throughput"), webhooks=False, metrics=True)
    # The controller's dispatch cycles over the load (what fair sharing's ordering adds to is each cycle's
    # judging); the rest of the /metrics pages is not kept.
    before, after = result.pop("controller_metrics_at_start"), result.pop("controller_metrics")
    result["cycles"] = cycle_figures(before, after)
    # Its writes over the load, as it counts them (mcad_api_writes_total): the dispatches' and any others'.
    counted = counted_writes(after)
    counted.subtract(counted_writes(before))
    n = result["params"]["appwrappers"]
    total = sum(counted.values())
    result["controller_counted_writes"] = {"total": total, "per_workload": round(total / n, 2),
                                           "by_request": {k: v for k, v in sorted(counted.items()) if v}}
    add_target(result, "dispatch rate", rate, ">=", 100, "AW/s")
    if opts.ceiling_pairs_per_s:
        result["ceiling_source"] = opts.ceiling_source
        add_target(result, f"share of ceiling ({opts.ceiling_pairs_per_s:.0f} pairs/s)",
                   100 * rate / opts.ceiling_pairs_per_s, ">=", 50, "%")
    else:
        result.setdefault("notes", []).append("no ceiling figure (run the ceiling scenario) for the 50% target")


def throughput_body(name: str) -> Obj:
    """One throughput AppWrapper: a one-pod Job of 100m whose pod runs for an hour (built in a load process)."""
    return appwrapper(name, [job_item(name, "100m", delay="1h")])


def throughput_tenant_body(args: tuple[str, str]) -> Obj:
    """``throughput_body`` in a tenant's namespace (``--tenants``)."""
    name, namespace = args
    body = throughput_body(name)
    body["metadata"]["namespace"] = namespace
    return body


def throughput_rack_body(name: str) -> Obj:
    """``throughput_body`` requiring one rack (``throughput_racks``)."""
    return asking(throughput_body(name), racks_ask("racks"))


def _throughput_run(scenario: str, opts: Options, result: Result, f: float, *, webhooks: bool,
                    controller_args: tuple[str, ...] = (), metrics: bool = False, topology: str = "") -> float:
    """One throughput run in a fresh cluster (see ``throughput``), with the controller's admission webhooks
    registered and every AppWrapper reviewed by them when ``webhooks``; fills ``result``, returns the dispatch
    rate. ``result["admitted_with_creator"]`` counts the AppWrappers that carry the creator annotation the
    mutating webhook sets (all of them with webhooks, none without). ``controller_args`` are added to the
    controller's; with ``metrics`` its /metrics (served without a token) is read just before the load starts and at
    the end, into ``result["controller_metrics_at_start"]`` and ``result["controller_metrics"]``. With webhooks and
    ``opts.webhook_server`` "null" or "null-http2", the null webhook (``test.perf.nullwebhook``) answers them
    instead of the controller, which serves none; ``result["null_webhook"]`` has its requests, connections and
    CPU during the load, and its CPU until the last dispatch is in ``cpu_seconds_until_dispatched``.
    ``topology`` ("flat" or "racks": ``throughput_racks``): ``RACKS_NODES`` nodes in racks, as in
    ``deep_queue``; with "racks" each AppWrapper requires a rack and the controller is given the level."""
    n = scaled(2000, f)
    metrics_port = webhooks_mod.free_port() if metrics else 0
    extra = (*controller_args, *(("--insecure-debug-endpoints", "--http-bind-address",
                                  f"127.0.0.1:{metrics_port}") if metrics else ()))
    n_nodes = scaled(RACKS_NODES if topology else 100, f)
    racks = rack_count(f) if topology else 0
    controller_args = (*controller_args, *racks_levels(topology))
    extra = (*extra, *racks_levels(topology))
    result["params"] = {"appwrappers": n, "nodes": n_nodes, "node_cpu": 8, "pod_cpu": "100m", "threads": opts.threads,
                        "load_processes": opts.load_processes, "webhooks": webhooks}
    if topology:
        result["params"].update({"topology": topology, "racks": racks})
    null: NullWebhook | None = None
    lease = SCALE_NODE_LEASE_S if topology else None  # thousands of nodes: kwok's renewals as in scale
    with Env(scenario, opts, result, node_lease_seconds=lease) as env, contextlib.ExitStack() as stack:
        env.nodes(n_nodes, cpu="8", memory="32Gi", pods=110, **rack_nodes(n_nodes, racks))
        if webhooks and opts.webhook_server != "mcad":
            result["params"]["webhook_server"] = opts.webhook_server
            null = stack.enter_context(NullWebhook(http2=opts.webhook_server == "null-http2"))
            webhooks_mod.register(env.api, null.port, creator=opts.webhook_creator, ca_bundle=null.ca_bundle)
            ctl = env.controller("controller", args=(*opts.controller_args, *extra))
            started = time.monotonic()
            webhooks_mod.wait_reviewed(env.api, lambda: null.stats()["requests"])
            result["webhooks_admitting_s"] = round(time.monotonic() - started, 2)
        elif webhooks:
            http_port = metrics_port or webhooks_mod.free_port()
            args = (*opts.controller_args, *controller_args,
                    *webhooks_mod.register(env.api, webhooks_mod.free_port(), creator=opts.webhook_creator),
                    *(("--insecure-debug-endpoints",) if metrics else ()),
                    "--http-bind-address", f"127.0.0.1:{http_port}")
            ctl = env.controller("controller", args=args)
            started = time.monotonic()
            webhooks_mod.wait_admitting(env.api, f"http://127.0.0.1:{http_port}/readyz", ctl.check_alive)
            result["webhooks_admitting_s"] = round(time.monotonic() - started, 2)
        else:
            ctl = env.controller("controller", args=(*opts.controller_args, *extra))
        result["controller_ready_s"] = round(warmup(env, ctl), 2)
        baseline = ctl.stats()
        cluster_before = env.cluster.cpu_seconds()
        tracker = Tracker()
        spread = env.tenants > 1
        env.watch(watch_appwrappers(env.api, tracker, all_namespaces=spread))
        env.watch(watch_pods(env.api, tracker, all_namespaces=spread))
        names = [f"tp-{i:05d}" for i in range(n)]

        # As fast as P processes x T threads can (test.perf.load): one process's 16 threads measured 16 / the create
        # call's duration, so the webhooks' latency looked like a loss of throughput.
        # On time at a fixed rate (--throughput-pace), the same load whatever the phase: the webhooks' latency then
        # costs what it costs the dispatch, not also fewer arrivals from a closed loop that waits for each create.
        pace = opts.throughput_pace
        if spread:  # round-robin over the tenants' namespaces
            creators = OnTimeLoad(env.cluster.kubeconfig, aw_collection_of,
                                  [(i / pace if pace else 0.0, (name, tenant_namespace(i, env.tenants)))
                                   for i, name in enumerate(names)],
                                  throughput_tenant_body, processes=opts.load_processes, threads=opts.threads)
        else:
            creators = OnTimeLoad(env.cluster.kubeconfig, aw_path(),
                                  [(i / pace if pace else 0.0, name) for i, name in enumerate(names)],
                                  throughput_rack_body if topology == "racks" else throughput_body,
                                  processes=opts.load_processes, threads=opts.threads)
        result["params"]["pace_per_s"] = pace or "closed loop"
        say(f"{scenario}: creating {n} AppWrappers" + (" through the admission webhooks" if webhooks else "")
            + (f" at {pace:g}/s" if pace else "") + f" from {creators.processes} processes x {creators.threads} "
            "threads")
        started = time.monotonic()
        timeout = 120 + n / 10
        if metrics:
            result["controller_metrics_at_start"] = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        webhook_timing_before = webhook_timing(env.api) if webhooks else {}
        null_before = (null.stats(), null.cpu_seconds()) if null else None
        with Progress(scenario, lambda: f"created {creators.created_count()}/{n}, dispatched {len(tracker.running)}, "
                                       f"pods running {len(tracker.pods_running)}"):
            t0 = creators.start()
            machine_before = machine_cpu()  # the load processes' start-up (imports, bodies) not counted
            creators.join(timeout)
            if creators.errors or len(creators.created) < n:
                raise BenchError(f"{scenario}: the load failed: {(creators.errors or ['creates missing'])[0]}")
            for name, when in creators.created.items():
                tracker.mark_created(name, when)
            calls = creators.calls
            create_s = max(creators.created.values()) - t0
            result["create_rate_per_s"] = round(n / create_s, 1)
            if pace:
                result["create_lateness"] = summary(creators.lateness)
            tracker.wait(lambda: len(tracker.running) + len(tracker.failed) >= n, timeout,
                         f"{n} AppWrappers Running", ctl.check_alive)
            # What each process spent from the load's start until the last dispatch (what the rate measures; the
            # figures below run on until every pod is Running).
            machine_dispatched, cluster_dispatched = machine_cpu(), env.cluster.cpu_seconds()
            controller_dispatched = ctl.stats().get("cpu_seconds")
            null_dispatched = null.cpu_seconds() if null else None
            tracker.wait(lambda: len(tracker.pods_running) >= n - len(tracker.failed), timeout,
                         f"the pods of {n} AppWrappers Running", ctl.check_alive)
        result["wall_s"] = round(time.monotonic() - started, 2)
        until_dispatched = {component: round(cpu - cluster_before[component], 2)
                            for component, cpu in cluster_dispatched.items() if component in cluster_before}
        if controller_dispatched is not None and baseline.get("cpu_seconds") is not None:
            until_dispatched["controller"] = round(controller_dispatched - baseline["cpu_seconds"], 2)
        if null and null_before and null_before[1] is not None and null_dispatched is not None:
            until_dispatched["null webhook"] = round(null_dispatched - null_before[1], 2)
        if (window := cpu_window(machine_before, machine_dispatched)) is not None:
            until_dispatched["machine busy"], until_dispatched["machine idle"] = window
        result["cpu_seconds_until_dispatched"] = until_dispatched
        machine_after = machine_cpu()
        result["controller"] = controller_figures(ctl, baseline)
        cluster_after = env.cluster.cpu_seconds()
        result["control_plane_load_cpu_seconds"] = {
            component: round(cpu - cluster_before[component], 2) for component, cpu in cluster_after.items()
            if component in cluster_before}
        result["control_plane_load_cpu_seconds"]["load processes"] = round(creators.cpu_seconds, 2)
        if webhooks:
            # The API server's own view of its webhook calls (from sending the request to the answer parsed).
            timing = webhook_timing(env.api)
            webhook_calls = timing.get("count", 0.0) - webhook_timing_before.get("count", 0.0)
            if webhook_calls:
                result["webhook_call_seen_by_api_server"] = {
                    "calls": int(webhook_calls),
                    "mean_ms": round(1000 * (timing["sum"] - webhook_timing_before.get("sum", 0.0)) / webhook_calls,
                                     1)}
        if (window := cpu_window(machine_before, machine_after)) is not None:
            # Where every core's time went from the load's start until every pod ran: were the cores saturated, and
            # what did one AppWrapper cost the whole machine?
            busy, idle = window
            result["machine_cpu"] = {"busy_s": round(busy, 2), "idle_s": round(idle, 2),
                                     "busy_pct": round(100 * busy / max(busy + idle, 1e-9), 1),
                                     "busy_ms_per_appwrapper": round(1000 * busy / n, 2)}
        result["failed"] = len(tracker.failed)
        first_create = min(tracker.created.values())
        last_dispatch = max(tracker.running.values())
        rate = len(tracker.running) / (last_dispatch - first_create)
        # End to end: until every pod runs, so work a phase defers past its last dispatch (the Job controller's
        # pods, the scheduler's binds, kwok's status) is counted where it is done.
        last_pod = max(tracker.pods_running.values())
        result["throughput"] = {"dispatched_per_s": round(rate, 1), "dispatched": len(tracker.running),
                                "span_s": round(last_dispatch - first_create, 2),
                                "pods_running_per_s": round(len(tracker.pods_running) / (last_pod - first_create), 1),
                                "pods_running_span_s": round(last_pod - first_create, 2)}
        result["latency"] = {"create_to_running": summary(tracker.latencies(names, tracker.running)),
                             "create_to_pod_running": summary(tracker.latencies(names, tracker.pods_running)),
                             "(controller decision to seen)": summary(tracker.decision_to_seen()),
                             "create_call": summary(calls)}
        if metrics:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            # With binding placement each pod's ungate is observed once its pin is written, which may come after
            # the bench saw the pod run (the write returns before the controller's thread records it): read until
            # every running pod's is in, or 30 s have passed (a loaded machine: the smoke runs two benches at once).
            pinned = len(tracker.pods_running) if "--placement=binding" in controller_args else 0
            deadline = time.monotonic() + 30
            samples = scrape(url)
            while samples.get("mcad_pod_ungate_seconds_count", 0.0) < pinned and time.monotonic() < deadline:
                time.sleep(0.2)
                samples = scrape(url)
            result["controller_metrics"] = samples
        if null and null_before:
            stats, cpu = null.stats(), null.cpu_seconds()
            (stats_before, cpu_before) = null_before
            result["null_webhook"] = {
                "requests": stats["requests"] - stats_before["requests"],
                # Less the connection of this reading of /stats itself.
                "connections": stats["connections"] - stats_before["connections"] - 1,
                "cpu_seconds": round(cpu - cpu_before, 2) if cpu is not None and cpu_before is not None else None}
        items, _ = env.api.list_all(aw_path(namespace=None if spread else NAMESPACE))
        result["admitted_with_creator"] = sum(
            1 for aw in items if webhooks_mod.CREATOR_ANNOTATION in (aw["metadata"].get("annotations") or {}))
    return rate


# ---------------------------------------------------------------------------------------------- throughput, webhooks

WEBHOOKS_RATIO_TARGET_PCT = 90.0


def throughput_webhooks(opts: Options, result: Result) -> None:
    """The throughput scenario twice, back to back, each in a fresh cluster: first with the controller's admission
    webhooks off (as ``throughput``), then on: the chart's Validating and Mutating WebhookConfigurations registered
    against the scenario's API server by URL (``test.perf.webhooks``), so every AppWrapper create is reviewed by
    the controller: a mutating call, then a validating call that asks a SubjectAccessReview per item (the bench
    creates as the cluster admin: every review allows; the answer is cached for a while per user, resource and
    namespace, as a running controller's is). With ``opts.webhook_creator`` "policy" the chart's
    MutatingAdmissionPolicy records the creator instead and only the validating call is made. Reports both dispatch
    rates, their shares of the ceiling and on / off (target >= 90 %, docs/performance.md), and the webhook calls the
    controller served per AppWrapper during each on-phase's load (its /metrics, read before and after it). Each phase's
    full figures are under ``phases``.

    ``opts.webhook_rounds`` R > 1: R pairs, the order alternating (off-on, on-off, ...) so that neither mode always
    runs on the machine the other has just warmed; phases beyond the first pair are ``off-2``, ``on-2``...; the
    rates are the means over the rounds, on / off the ratio of those means, and ``rounds`` lists each pair's; the
    pairs' own ratios are averaged too, with the 95 % interval of that mean (``harness.mean_interval``).

    The target is on the dispatch rate (AppWrappers Running over first create to last dispatch). The end-to-end
    rate is reported next to it, the same way (``pods_running_*``): AppWrappers whose pod runs, over first create
    to last pod Running. It counts where it is done the work a phase can defer past its last dispatch (the Job
    controller's pods, the scheduler's binds, kwok's status writes), which the dispatch window leaves out more in
    the phase that dispatches faster.

    ``opts.webhook_server`` "null" or "null-http2": the same configurations, but answered by the null webhook
    (``test.perf.nullwebhook``: Go, allows everything; HTTP/1.1 as an installation's API server speaks to a
    Service, or HTTP/2 offered too) while the controller serves none.
    The ratio is then the floor that the API server's own admission sets for any webhook, the figure mcad's is read
    against; it is reported with a note, and no target is judged."""
    f = opts.factor("throughput_webhooks")
    phases: dict[str, Result] = {}
    result["phases"] = phases
    rates: dict[str, list[float]] = {"off": [], "on": []}
    end_to_end: dict[str, list[float]] = {"off": [], "on": []}
    rounds = max(1, opts.webhook_rounds)
    for index in range(rounds):
        suffix = "" if index == 0 else f"-{index + 1}"
        for mode in ("off", "on") if index % 2 == 0 else ("on", "off"):
            phase: Result = {"targets": []}
            phases[mode + suffix] = phase
            say(f"throughput_webhooks: webhooks {mode}" + (f" (round {index + 1} of {rounds})" if rounds > 1 else ""))
            rates[mode].append(_throughput_run(f"throughput_wh_{mode}", opts, phase, f, webhooks=mode == "on",
                                               metrics=True))
            end_to_end[mode].append(phase["throughput"]["pods_running_per_s"])
            before, after = phase.pop("controller_metrics_at_start"), phase.pop("controller_metrics")
            # The controller's writes during the load, per AppWrapper, by verb and resource: does the slower arrival
            # of the on-phase's creates change what it writes?
            written = counted_writes(after)
            written.subtract(counted_writes(before))
            phase["controller_writes_per_appwrapper"] = {
                request: round(count / phase["params"]["appwrappers"], 2)
                for request, count in sorted(written.items()) if count > 0}
            if mode == "on" and "null_webhook" in phase:
                served = phase["null_webhook"]
                phase["webhook_requests"] = {
                    "total": served["requests"],
                    "per_appwrapper": round(served["requests"] / phase["params"]["appwrappers"], 2),
                    "connections_opened": served["connections"]}
            elif mode == "on":
                # The calls the API server made during the load, per AppWrapper (the policy mode should make one).
                key = 'mcad_http_requests_total{server="webhook"}'
                calls = after.get(key, 0.0) - before.get(key, 0.0)
                # Each connection the API server opened is a TLS handshake (it keeps 25 idle ones per host).
                key = 'mcad_http_connections_accepted_total{server="webhook"}'
                opened = after.get(key, 0.0) - before.get(key, 0.0)
                phase["webhook_requests"] = {"total": int(calls),
                                             "per_appwrapper": round(calls / phase["params"]["appwrappers"], 2),
                                             "connections_opened": int(opened)}
            for note in phase.get("notes") or []:
                result.setdefault("notes", []).append(f"webhooks {mode}{suffix}: {note}")
    if rounds > 1:
        result["rounds"] = [{"dispatched_per_s_off": round(off_rate, 1), "dispatched_per_s_on": round(on_rate, 1),
                             "on_over_off_pct": round(100 * on_rate / off_rate, 1),
                             "pods_running_on_over_off_pct": round(100 * on_pods / off_pods, 1)}
                            for off_rate, on_rate, off_pods, on_pods in zip(
                                rates["off"], rates["on"], end_to_end["off"], end_to_end["on"], strict=True)]
    off, on = phases["off"], phases["on"]
    result["params"] = {**off["params"], "webhooks": "off, then on", "creator": opts.webhook_creator,
                        "webhook_server": opts.webhook_server, "rounds": rounds}
    mean_off, mean_on = statistics.fmean(rates["off"]), statistics.fmean(rates["on"])
    for key in ("cluster_up_s", "nodes_ready_s", "teardown_s", "wall_s", "controller_ready_s",
                "webhooks_admitting_s"):
        if key in on:
            result[key] = on[key]
    result["controller"] = on["controller"]
    result["controller_webhooks_off"] = off["controller"]
    result["control_plane_load_cpu_seconds"] = {mode: phases[mode]["control_plane_load_cpu_seconds"]
                                                 for mode in phases}
    result["admitted_with_creator"] = {mode: phases[mode]["admitted_with_creator"] for mode in phases}
    result["webhook_requests_per_appwrapper"] = {mode: phases[mode]["webhook_requests"]["per_appwrapper"]
                                                 for mode in phases if "webhook_requests" in phases[mode]}
    figures: dict[str, Any] = {"dispatched_per_s_off": round(mean_off, 1),
                               "dispatched_per_s_on": round(mean_on, 1),
                               "create_rate_per_s_off": off["create_rate_per_s"],
                               "create_rate_per_s_on": on["create_rate_per_s"]}
    ratio = 100 * mean_on / mean_off
    if opts.ceiling_pairs_per_s:
        result["ceiling_source"] = opts.ceiling_source
        figures["share_of_ceiling_off_pct"] = round(100 * mean_off / opts.ceiling_pairs_per_s, 1)
        figures["share_of_ceiling_on_pct"] = round(100 * mean_on / opts.ceiling_pairs_per_s, 1)
    else:
        result.setdefault("notes", []).append("no ceiling figure (run the ceiling scenario): shares not reported")
    figures["on_over_off_pct"] = round(ratio, 1)
    pods_off, pods_on = statistics.fmean(end_to_end["off"]), statistics.fmean(end_to_end["on"])
    figures["pods_running_per_s_off"] = round(pods_off, 1)
    figures["pods_running_per_s_on"] = round(pods_on, 1)
    figures["pods_running_on_over_off_pct"] = round(100 * pods_on / pods_off, 1)
    for prefix, series in (("on_over_off", rates), ("pods_running_on_over_off", end_to_end)):
        interval = mean_interval(100 * on_rate / off_rate
                                 for off_rate, on_rate in zip(series["off"], series["on"], strict=True))
        if interval is None:
            continue
        # Each pair's ratio moves by several points from run to run on a shared machine: say how far their mean can
        # be trusted, and when the target lies within that, that the run shows neither that it is met nor missed.
        mean, low, high = interval
        figures[f"{prefix}_pairs_mean_pct"] = round(mean, 1)
        figures[f"{prefix}_95pct_interval"] = [round(low, 1), round(high, 1)]
        if low < WEBHOOKS_RATIO_TARGET_PCT <= high and opts.webhook_server == "mcad":
            result.setdefault("notes", []).append(
                f"{prefix}: the target ({WEBHOOKS_RATIO_TARGET_PCT:g} %) lies within the 95 % interval of the "
                f"{rounds} pairs' ratios ({low:.1f}-{high:.1f} %): more pairs are needed to tell")
    result["throughput"] = figures
    result["latency"] = {f"{name} ({mode})": phases[mode]["latency"][name]
                         for name in ("create_call", "create_to_running", "create_to_pod_running")
                         for mode in ("off", "on")}
    if opts.webhook_server != "mcad":
        # Not mcad's figure: the floor that the API server's own admission sets with a webhook that does nothing.
        result.setdefault("notes", []).append(
            f"webhook server {opts.webhook_server}: a do-nothing Go server answered the webhooks, not mcad; on / off "
            "is the floor the API server's own admission sets, and no target is judged")
        return
    add_target(result, "dispatch rate (share of ceiling), webhooks on / off", ratio, ">=",
               WEBHOOKS_RATIO_TARGET_PCT, "%")


# ---------------------------------------------------------------------------------------------- placement

PLACEMENT_RATIO_TARGET_PCT = 85.0
UNGATE_P99_TARGET_MS = 200.0


def scrape(url: str) -> dict[str, float]:
    """A Prometheus text page as {sample with labels: value}."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return samples(response.read().decode())


def webhook_timing(api: Api) -> dict[str, float]:
    """The API server's admission webhook calls so far, every webhook summed: ``count`` and ``sum`` (seconds) of
    ``apiserver_admission_webhook_admission_duration_seconds``."""
    out = {"count": 0.0, "sum": 0.0}
    for key, value in samples(api.text("/metrics")).items():
        for part in ("count", "sum"):
            if key.startswith(f"apiserver_admission_webhook_admission_duration_seconds_{part}{{"):
                out[part] += value
    return out


def samples(text: str) -> dict[str, float]:
    """Prometheus text as {sample with labels: value}."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                samples[name] = float(value)
            except ValueError:
                continue
    return samples


def histogram_quantile(samples: dict[str, float], name: str, q: float) -> float | None:
    """The upper bound of the first bucket holding the q-quantile (what a Prometheus histogram can say without
    interpolating), None without observations; +Inf when it lies past the last bound."""
    buckets = sorted((float(key.split('le="')[1].split('"')[0]), count) for key, count in samples.items()
                     if key.startswith(f"{name}_bucket{{"))
    total = samples.get(f"{name}_count", 0.0)
    if not total:
        return None
    return next(bound for bound, count in buckets if count >= q * total)


def placement(opts: Options, result: Result) -> None:
    """Placement that binds (--placement=binding) against the scheduler's own, back to back, each in a fresh cluster:
    the throughput run (one 1-pod Job per AppWrapper) with ``--placement=binding``, then ``--placement=advisory``. The
    ungate patch is one more write per pod; both dispatch rates (AppWrappers/s) and pod rates (pods Running per second,
    first create to last pod Running) are reported with binding / advisory, and the time from the controller's informer
    receiving a gated pod to its pin written (``mcad_pod_ungate_seconds``, bucket bounds) under that load."""
    f = opts.factor("placement")
    phases: dict[str, Result] = {}
    result["phases"] = phases
    for mode in ("binding", "advisory"):
        phase: Result = {"targets": []}
        phases[mode] = phase
        say(f"placement: --placement={mode}")
        _throughput_run(f"placement_{mode}", opts, phase, f, webhooks=False,
                        controller_args=(f"--placement={mode}",), metrics=True)
        phase["pods_per_s"] = round(phase["throughput"]["dispatched"] / phase["wall_s"], 1)
        phase.pop("controller_metrics_at_start")
    binding, advisory = phases["binding"], phases["advisory"]
    result["params"] = {**binding["params"], "placement": "binding, then advisory"}
    for key in ("cluster_up_s", "nodes_ready_s", "teardown_s", "wall_s", "controller_ready_s"):
        if key in binding and key in advisory:
            result[key] = round(binding[key] + advisory[key], 2)  # both runs
    samples = binding.get("controller_metrics") or {}
    name = "mcad_pod_ungate_seconds"
    ungate = {f"p{int(q * 100)}_le_ms": (None if (v := histogram_quantile(samples, name, q)) is None
                                         else round(v * 1000, 1)) for q in (0.5, 0.99)}
    ungate["pods"] = samples.get(f"{name}_count", 0.0)
    ungate["mean_ms"] = round(1000 * samples.get(f"{name}_sum", 0.0) / ungate["pods"], 1) if ungate["pods"] else None
    result["ungate"] = ungate
    result["pins"] = {key.split('"')[1]: value for key, value in samples.items()
                      if key.startswith("mcad_pod_pins_total{")}
    rate = {mode: phases[mode]["throughput"]["dispatched_per_s"] for mode in phases}
    pods = {mode: phases[mode]["pods_per_s"] for mode in phases}
    result["throughput"] = {"dispatched_per_s_binding": rate["binding"], "dispatched_per_s_advisory": rate["advisory"],
                            "pods_per_s_binding": pods["binding"], "pods_per_s_advisory": pods["advisory"]}
    result["latency"] = {f"{latency} ({mode})": phases[mode]["latency"][latency]
                         for latency in ("create_to_running", "create_to_pod_running") for mode in phases}
    result["controller"] = binding["controller"]
    result["controller_advisory"] = advisory["controller"]
    add_target(result, "dispatch rate, binding / advisory", 100 * rate["binding"] / rate["advisory"], ">=",
               PLACEMENT_RATIO_TARGET_PCT, "%")
    add_target(result, "pod rate, binding / advisory", 100 * pods["binding"] / pods["advisory"], ">=",
               PLACEMENT_RATIO_TARGET_PCT, "%")
    p99 = ungate["p99_le_ms"]
    # A bucket bound: the p99 is at most this; the target (< 200 ms) is met when it is at most the 200 ms bucket's.
    add_target(result, "first seen gated -> pinned, p99 (bucket bound)", p99 if p99 is not None else float("inf"),
               "<=", UNGATE_P99_TARGET_MS, "ms")


# ---------------------------------------------------------------------------------------------- deep queue


def deep_queue(opts: Options, result: Result, *, topology: str = "", scenario: str = "deep_queue") -> None:
    """N AppWrappers that can never fit (1 nvidia.com/gpu each, no GPUs in the cluster) queued first; then
    (a) a new small CPU AppWrapper: creation -> Running, one at a time; (b) capacity freed: a filler takes all
    cpu, a 1-cpu waiter queues behind it (seen Pending), the filler is deleted: delete returned -> waiter Running.

    ``topology`` (``deep_queue_racks``' phases): on ``RACKS_NODES`` nodes in ``RACKS`` racks (``rack_nodes``), the
    probe of (a) a gang of ``RACKS_GANG`` pods; "racks": the controller given the rack level, and the backlog, the
    gangs of (a) and the waiters of (b) each requiring one rack (the filler asks nothing, so that it can take every
    rack's cpu); "flat": the same nodes, labels and AppWrappers with no asks and no levels. Both read the
    controller's dispatch cycles (``mcad_dispatch_cycle_duration_seconds``) over the probes into ``cycles``.
    """
    f = opts.factor(scenario)
    n = scaled(10000, f)
    n_nodes = scaled(RACKS_NODES, f) if topology else scaled(10, f)
    racks = rack_count(f) if topology else 0
    gang = RACKS_GANG if topology else 1
    ask = racks_ask(topology)
    n_a = scaled(50, f, minimum=10)
    n_b = scaled(30, f, minimum=10)
    total_cpu = n_nodes * 8
    result["params"] = {"gpu_appwrappers": n, "nodes": n_nodes, "node_cpu": 8, "probes_new": n_a,
                        "probes_freed": n_b, "threads": opts.threads}
    if topology:
        result["params"].update({"topology": topology, "racks": racks, "probe_new_pods": gang})
    with Env(scenario, opts, result, node_lease_seconds=SCALE_NODE_LEASE_S if topology else None) as env:
        env.nodes(n_nodes, cpu="8", memory="32Gi", pods=110, **rack_nodes(n_nodes, racks))
        metrics_url = f"http://127.0.0.1:{webhooks_mod.free_port()}"
        metrics = ("--insecure-debug-endpoints", "--http-bind-address", metrics_url.removeprefix("http://"))
        ctl = env.controller("controller", args=(*UNPACED, *opts.controller_args, *racks_levels(topology),
                                                 *metrics))
        result["controller_ready_s"] = round(warmup(env, ctl), 2)
        baseline = ctl.stats()
        backlog = Tracker()
        counting = threading.Event()
        backlog_events = [0]

        def on_backlog(etype: str, obj: Obj, seen: float) -> None:
            if counting.is_set() and PROBE_LABEL not in ((obj.get("metadata") or {}).get("labels") or {}):
                backlog_events[0] += 1
            backlog.on_aw(etype, obj, seen)

        spread = env.tenants > 1  # the backlog round-robin over the tenants; the probes in tenant 0 (bench)
        env.watch(Watch(env.api, aw_path(namespace=None if spread else NAMESPACE), on_backlog,
                        name="watch-backlog").start())
        names = [f"gpu-{i:05d}" for i in range(n)]
        bodies = [asking(appwrapper(name, [configmap_item(name, {"nvidia.com/gpu": "1"})],
                                    namespace=tenant_namespace(i, env.tenants) if spread else None), ask)
                  for i, name in enumerate(names)]

        def line() -> str:
            return f"created {len(backlog.created)}/{n}, seen Pending {len(backlog.pending)}"

        say(f"deep_queue: creating {n} GPU AppWrappers that cannot fit")
        started = time.monotonic()
        with Progress("deep_queue", line):
            create_s = create_all(env, backlog, bodies)
            result["create_rate_per_s"] = round(n / create_s, 1)
            created_at = time.monotonic()
            backlog.wait(lambda: len(backlog.pending) >= n, 120 + n / 10, f"{n} GPU AppWrappers Pending",
                         ctl.check_alive)
        result["backlog"] = {"create_s": round(create_s, 1),
                             "all_pending_after_last_create_s": round(time.monotonic() - created_at, 2),
                             "dispatched": len(backlog.running)}
        result["controller_after_backlog"] = controller_figures(ctl, baseline)
        mid = ctl.stats()
        cycles_before = scrape(metrics_url + "/metrics")
        counting.set()

        probe = Tracker()
        env.watch(watch_appwrappers(env.api, probe, f"{PROBE_LABEL}=true"))
        labels = {PROBE_LABEL: "true"}
        api = env.api

        def create(name: str, cpu: str, pods: int = 1, ask: dict[str, str] | None = None) -> float:
            item = configmap_item(name, {"cpu": cpu})
            item["custompodresources"][0]["replicas"] = pods
            api.create(aw_path(), asking(appwrapper(name, [item], labels=labels), ask))
            t = time.monotonic()
            probe.mark_created(name, t)
            return t

        def delete(*names_: str) -> None:
            for name in names_:
                api.delete(aw_path(name))
            probe.wait(lambda: all(x in probe.deleted for x in names_), 60, f"{names_} deleted", ctl.check_alive)

        new_lat: list[float] = []
        freed_lat: list[float] = []
        result["latency"] = {}
        say(f"deep_queue: (a) {n_a} new small CPU AppWrappers, one at a time")
        for i in range(n_a):
            name = f"probe-new-{i:03d}"
            t = create(name, "100m", gang, ask)
            probe.wait(has(probe.running, name), 60, f"{name} Running", ctl.check_alive)
            new_lat.append(probe.running[name] - t)
            delete(name)
        result["latency"]["new_cpu_appwrapper"] = summary(new_lat)
        say(f"deep_queue: (b) {n_b} times: filler ({total_cpu} cpu), waiter (1 cpu) Pending, delete filler")
        for i in range(n_b):
            filler, waiter = f"probe-filler-{i:03d}", f"probe-waiter-{i:03d}"
            create(filler, "8", pods=n_nodes)  # one 8-cpu pod per node: all cpu, placeable
            probe.wait(has(probe.running, filler), 60, f"{filler} Running", ctl.check_alive)
            create(waiter, "1", ask=ask)
            probe.wait(has(probe.pending, waiter, probe.running), 60, f"{waiter} Pending",
                       ctl.check_alive)
            if waiter in probe.running:
                raise BenchError(f"{waiter} was dispatched although the filler took all cpu")
            api.delete(aw_path(filler))
            t = time.monotonic()
            probe.wait(has(probe.running, waiter), 60, f"{waiter} Running after the filler went",
                       ctl.check_alive)
            freed_lat.append(probe.running[waiter] - t)
            delete(filler, waiter)
        result["latency"]["next_after_capacity_freed"] = summary(freed_lat)
        result["wall_s"] = round(time.monotonic() - started, 2)
        end = ctl.stats()
        result["controller"] = controller_figures(ctl, baseline)
        result["controller"]["probe_phase_cpu_seconds"] = round(end["cpu_seconds"] - mid["cpu_seconds"], 2)
        # The dispatch cycles over the probes: each judges the whole backlog.
        result["cycles"] = cycle_figures(cycles_before, scrape(metrics_url + "/metrics"))
        result["backlog"]["events_during_probes"] = backlog_events[0]
        wrongly = [x for x in backlog.running if x.startswith("gpu-")]
        if wrongly:
            raise BenchError(f"{len(wrongly)} GPU AppWrappers were dispatched on a cluster with no GPUs")
        add_target(result, "p99 new CPU AppWrapper", summary(new_lat).get("p99_ms"), "<", 200, "ms")
        add_target(result, "p99 next after capacity freed", summary(freed_lat).get("p99_ms"), "<", 200, "ms")


# ---------------------------------------------------------------------------------------------- topology's cost

# The cost of a required level: the same nodes, labelled by rack, with every AppWrapper requiring a rack and the
# controller given the level ("racks"), against no asks and no levels ("flat").
RACKS_NODES = 5000
RACKS = 50
RACK_LABEL = "topology.example.com/rack"
RACKS_GANG = 4  # deep_queue_racks' new probe: a gang of this many 100m pods (one pod in deep_queue)
RACKS_CYCLE_RATIO = 2.0  # target: racks' mean dispatch cycle at most this many times flat's


def rack_count(f: float) -> int:
    """Racks at size ``f``: at least 2, so that a rack is a choice."""
    return max(2, scaled(RACKS, f))


def rack_nodes(n_nodes: int, racks: int) -> dict[str, Any]:
    """``create_nodes`` arguments labelling ``n_nodes`` nodes by rack, in ``racks`` runs of consecutive nodes
    (none without ``racks``)."""
    if not racks:
        return {}
    per_rack = math.ceil(n_nodes / racks)
    return {"labels": lambda i: {RACK_LABEL: f"rack-{i // per_rack:02d}"}}


def racks_ask(topology: str) -> dict[str, str] | None:
    return {"mcad.codeflare.dev/topology-required": RACK_LABEL} if topology == "racks" else None


def racks_levels(topology: str) -> tuple[str, ...]:
    return ("--topology-level", RACK_LABEL) if topology == "racks" else ()


def asking(body: Obj, ask: dict[str, str] | None) -> Obj:
    """``body`` with the annotations ``ask`` (none: unchanged)."""
    if ask:
        body["metadata"].setdefault("annotations", {}).update(ask)
    return body


def cycle_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The dispatch cycles between two readings of the controller's /metrics: count, summed and mean duration."""
    key = "mcad_dispatch_cycle_duration_seconds"
    count = after.get(f"{key}_count", 0.0) - before.get(f"{key}_count", 0.0)
    seconds = after.get(f"{key}_sum", 0.0) - before.get(f"{key}_sum", 0.0)
    return {"count": int(count), "seconds": round(seconds, 3),
            "mean_ms": round(1000 * seconds / count, 3) if count else None}


def _racks_phases(opts: Options, result: Result, scenario: str,
                  run: Callable[[Options, Result, str], None]) -> dict[str, Result]:
    """``run`` twice, each in a fresh cluster: "flat" then "racks"; each phase's result under ``phases``, the
    racks phase's latencies and controller figures at the top (prefixed by phase), and the ratio of the mean
    dispatch cycles with its target."""
    phases_: dict[str, Result] = {}
    result["phases"] = phases_
    for topology in ("flat", "racks"):
        phase: Result = {"targets": []}
        phases_[topology] = phase
        say(f"{scenario}: phase {topology}")
        run(opts, phase, topology)
    flat, racks = phases_["flat"], phases_["racks"]
    result["params"] = {**racks["params"], "topology": "flat, then racks"}
    result["wall_s"] = round(flat["wall_s"] + racks["wall_s"], 2)
    for key in ("cluster_up_s", "nodes_ready_s", "teardown_s"):
        result[key] = round(sum(phase.get(key) or 0.0 for phase in phases_.values()), 1)
    result["controller"] = racks["controller"]
    result["latency"] = {f"{topology}_{name}": figures for topology, phase in phases_.items()
                         for name, figures in phase["latency"].items()}
    for topology, phase in phases_.items():
        for label, profile in (phase.get("profile") or {}).items():
            result.setdefault("profile", {})[f"{topology}-{label}"] = profile
        for note in phase.get("notes") or []:
            result.setdefault("notes", []).append(f"{topology}: {note}")
        for target in phase["targets"]:
            result["targets"].append({**target, "name": f"{topology}: {target['name']}"})
    flat_ms, racks_ms = flat["cycles"].get("mean_ms"), racks["cycles"].get("mean_ms")
    ratio = racks_ms / flat_ms if flat_ms and racks_ms is not None else None
    result["cycles"] = {"flat": flat["cycles"], "racks": racks["cycles"],
                        "racks_over_flat": round(ratio, 2) if ratio is not None else None}
    add_target(result, "mean dispatch cycle, racks / flat", ratio, "<=", RACKS_CYCLE_RATIO, "x")
    return phases_


def deep_queue_racks(opts: Options, result: Result) -> None:
    """deep_queue on RACKS_NODES nodes in RACKS racks, flat then racks (``deep_queue``'s ``topology``): the
    dispatch of a new admissible gang behind the backlog with and without a required rack, and the cycles'
    cost."""
    _racks_phases(opts, result, "deep_queue_racks",
                  lambda o, r, t: deep_queue(o, r, topology=t, scenario="deep_queue_racks"))


def throughput_racks(opts: Options, result: Result) -> None:
    """throughput on RACKS_NODES nodes in RACKS racks, flat then racks: each one-pod AppWrapper requiring a rack
    (its Job's pod pinned to a node of the rack chosen), the dispatch rate and the cycles' cost."""
    def run(o: Options, r: Result, topology: str) -> None:
        _throughput_run("throughput_racks", o, r, o.factor("throughput_racks"), webhooks=False, metrics=True,
                        topology=topology)
        metrics = r.get("controller_metrics") or {}
        r["cycles"] = cycle_figures(r.get("controller_metrics_at_start") or {}, metrics)
        # The full /metrics pages are long; the results keep the cycles only.
        r.pop("controller_metrics", None)
        r.pop("controller_metrics_at_start", None)

    _racks_phases(opts, result, "throughput_racks", run)
    flat, racks = result["phases"]["flat"], result["phases"]["racks"]
    result["throughput"] = {f"{t}_dispatched_per_s": p["throughput"]["dispatched_per_s"]
                            for t, p in (("flat", flat), ("racks", racks))}
    result["throughput"]["racks_over_flat_pct"] = round(
        100 * racks["throughput"]["dispatched_per_s"] / flat["throughput"]["dispatched_per_s"], 1)


# ---------------------------------------------------------------------------------------------- churn

# Kueue's baseline generator (test/performance/scheduler/configs/baseline/generator.yaml): 5 cohorts x 6 cluster
# queues, each queue running three workload sets concurrently, one workload per interval.
KUEUE_QUEUES = 5 * 6
# class, workloads per queue, creation interval s, runtime s, priority, cpu
KUEUE_CLASSES = (("small", 350, 0.1, 0.2, 50, 1), ("medium", 100, 0.5, 0.5, 100, 5), ("large", 50, 1.2, 1.0, 200, 20))
KUEUE_WALL_S = 351.0
# Kueue's mean time to dispatch per class in that run (ms), mcad's targets for churn at full scale.
KUEUE_MEAN_MS = {"small": 215_468.0, "medium": 76_768.0, "large": 16_501.0}
AW_RESOURCE = "appwrappers.workload.codeflare.dev"


# Nodes big enough for Kueue's large class (20 cpu in one pod): mcad checks that each pod fits on a node
# (--fit=nodes), where Kueue's baseline checks quota only.
CHURN_NODE_CPU = 40


# A full churn run whose creates were later than this (p99) behind their schedule measured a thinner load than
# Kueue's: the scenario fails, so no figure is taken on it.
MAX_CREATE_LATENESS_MS = 1000.0


@dataclass(frozen=True)
class ChurnWorkload:
    """What each churn workload wraps, and so how it ends. ``item(name, cpu, runtime_s)`` builds its one GenericItem.
    Unless ``completes``, it never ends by itself: the load process deletes it ``runtime`` after it is first seen
    Running. If it ``completes``, the workload runs for its run time on the nodes and mcad marks it Completed; the
    load process deletes it as soon as it sees that (the cluster stays the size of what is running, as in churn).
    ``pods``: it creates pods, whose scheduler binds and kwok status writes keep the controller's API writes from
    being counted apart."""

    wraps: str
    item: Callable[[str, int, float], Obj]
    completes: bool = False
    pods: bool = False


def go_duration(seconds: float) -> str:
    """A Go duration (what kwok's stage delays read) of ``seconds``, to the millisecond."""
    return f"{round(seconds * 1000)}ms"


CHURN_CONFIGMAP = ChurnWorkload("a ConfigMap + custompodresources",
                                lambda name, cpu, _runtime: configmap_item(name, {"cpu": str(cpu)}))
# churn_pods: a one-pod Job that kwok completes its run time after the pod runs (mcad's ledger frees the
# pod's cpu once it sees it Succeeded); mcad watches the Job's Complete condition (completionstatus) and marks the
# AppWrapper Completed.
CHURN_JOB = ChurnWorkload("a Job of one pod (its cpu) that kwok completes after the run time",
                          lambda name, cpu, runtime: job_item(name, str(cpu), delay=go_duration(runtime),
                                                              completionstatus="Complete"),
                          completes=True, pods=True)


CHURN_WORKLOADS = {"configmap": CHURN_CONFIGMAP, "job": CHURN_JOB}


def churn_body(args: tuple[str, int, int, float, str, str]) -> Obj:
    """One churn workload's AppWrapper in its namespace, built in a load process (test.perf.load): a module-level
    function, and the workload named by its key in ``CHURN_WORKLOADS``, so that a spawned process can import both."""
    name, priority, cpu, runtime, workload, namespace = args
    return appwrapper(name, [CHURN_WORKLOADS[workload].item(name, cpu, runtime)], priority=priority,
                      namespace=namespace)


def churn_stream(name: str) -> int:
    """The arrival stream (Kueue's queue) of a churn workload, from its name ``<class>-<queue>-<index>``."""
    return int(name.split("-")[-2])


def tenant_fairness(plan: list[tuple[float, str, str, float, int, float]], tracker: Tracker,
                    tenant_of: Callable[[str], str]) -> dict[str, Any]:
    """How evenly churn's tenants were served: each tenant's mean time to dispatch (create -> Running) over its
    workloads, their spread (min, max, max / min) and Jain's index; and the cpu-seconds (cpu x run time) each had
    dispatched by the moment half of all the work had been, when every tenant still has work queued (by the end
    every tenant has had all of its work, equal by construction), with Jain's index over those."""
    waits: dict[str, list[float]] = {}
    dispatched: list[tuple[float, str, float]] = []
    for _offset, name, _cls, runtime, _priority, cpu in plan:
        if name in tracker.running and name in tracker.created:
            waits.setdefault(tenant_of(name), []).append(tracker.running[name] - tracker.created[name])
            dispatched.append((tracker.running[name], tenant_of(name), cpu * runtime))
    if not waits:
        return {}
    means = {tenant: 1000 * statistics.fmean(v) for tenant, v in waits.items()}
    dispatched.sort()
    half, total = sum(work for *_, work in dispatched) / 2, 0.0
    early: dict[str, float] = dict.fromkeys(waits, 0.0)
    for _when, tenant, work in dispatched:
        if total >= half:
            break
        early[tenant] += work
        total += work
    low, high = min(means.values()), max(means.values())
    return {"tenants": len(means), "mean_wait_min_ms": round(low, 1), "mean_wait_max_ms": round(high, 1),
            "mean_wait_max_over_min": round(high / low, 2) if low else None,
            "mean_wait_jain": jain_index(means.values()),
            "work_at_half_min_cpu_s": round(min(early.values()), 1),
            "work_at_half_max_cpu_s": round(max(early.values()), 1),
            "work_at_half_jain": jain_index(early.values()),
            "mean_wait_ms": {tenant: round(v, 1) for tenant, v in sorted(means.items())}}


# ---------------------------------------------------------------------------------------------- churn, TAS

# Kueue's TAS generator (test/performance/scheduler/configs/tas/generator.yaml at v0.17.0): the baseline's 30
# queues, intervals, run times, priorities and cpu per workload, each class split into three workload sets by its
# topology ask (Kueue's tasConstraint) over racks, the cpu spread over 2, 4 or 8 pods.
TAS_BLOCK_LABEL = "cloud.provider.com/topology-block"
TAS_RACK_LABEL = "cloud.provider.com/topology-rack"
TAS_HOST_LABEL = "kubernetes.io/hostname"
# (level name, domains per domain of the level above, node label), largest first, as Kueue's config lists them.
TAS_LEVELS = (("block", 1, TAS_BLOCK_LABEL), ("rack", 10, TAS_RACK_LABEL), ("node", 64, TAS_HOST_LABEL))
TAS_NODE_CPU = 96
TAS_NODE_MEMORY = "256Gi"
TAS_NODE_GROUP = {"tas-node-group": "tas"}  # the label Kueue's ResourceFlavor selects its nodes by
# Kueue's quota, which bounds its test (the 640 nodes have 61,440 cpu): 5 cohorts of 6 ClusterQueues, each 20 cpu
# nominal with a borrowing limit of 100, so a queue may use its whole cohort's 120. mcad's quota tree of the same
# shape: a hard node of 120 cpu per cohort, a soft node of 20 per queue under it.
TAS_TREE = "bench-tas"
TAS_COHORTS = 5
TAS_QUEUES_PER_COHORT = 6
TAS_QUEUE_CPU = 20
TAS_QUOTA_CPU = TAS_COHORTS * TAS_QUEUES_PER_COHORT * TAS_QUEUE_CPU


@dataclass(frozen=True)
class TasClass:
    """One of Kueue's TAS workload sets per queue: ``pods`` pods of ``pod_milli`` cpu each, asking ``ask`` of a
    rack (Kueue's tasConstraint)."""

    name: str
    per_queue: int
    interval: float
    runtime: float
    priority: int
    pods: int
    pod_milli: int
    ask: str

    @property
    def size(self) -> str:
        return self.name.split("-")[0]

    @property
    def cpu(self) -> float:
        return self.pods * self.pod_milli / 1000


TAS_CLASSES = tuple(
    TasClass(f"{size}-{ask}-rack", count, interval, runtime, priority, pods, milli, ask)
    for size, counts, interval, runtime, priority, pods, milli in (
        ("small", (120, 120, 110), 0.1, 0.2, 50, 2, 500),
        ("medium", (34, 33, 33), 0.5, 0.5, 100, 4, 1250),
        ("large", (17, 17, 16), 1.2, 1.0, 200, 8, 2500))
    for ask, count in zip(("required", "preferred", "balanced"), counts, strict=True))
# Kueue's means over its 10 reference runs (configs/tas/rangespec.yaml's comments, ms): mcad's targets for
# churn_tas at full scale, as KUEUE_MEAN_MS are churn's.
KUEUE_TAS_MEAN_MS = {
    "small-required-rack": 246_755.0, "small-preferred-rack": 246_090.0, "small-balanced-rack": 237_846.0,
    "medium-required-rack": 107_071.0, "medium-preferred-rack": 106_324.0, "medium-balanced-rack": 106_303.0,
    "large-required-rack": 39_625.0, "large-preferred-rack": 39_573.0, "large-balanced-rack": 37_862.0}
KUEUE_TAS_WALL_S = 401.5
# What mcad asks for each of Kueue's constraints. "balanced" is Kueue's slice-only request (each slice of
# sliceSize pods, half the pod set, in one rack; the pod set as a whole unconstrained): mcad has no slices, and
# its preferred rack (one rack if the gang fits in one, else as few as it can) is the nearest ask.
TAS_ANNOTATION = {"required": "mcad.codeflare.dev/topology-required",
                  "preferred": "mcad.codeflare.dev/topology-preferred",
                  "balanced": "mcad.codeflare.dev/topology-preferred"}


def tas_nodes(f: float = 1.0) -> tuple[list[str], list[dict[str, str]]]:
    """Kueue's TAS nodes (its generator's ``generateNodesRecursive``): one per leaf of the levels, named
    node-b<block>-r<rack>-n<node>, labelled with each level's value (block-0, rack-3, node-17) and the flavor's
    node group. Kueue's host label values repeat across racks (node-17 is in every rack), as its generator sets
    them. ``f`` (the scenario's --scale) multiplies the hosts per rack, at least 1: the smoke test's few nodes."""
    names: list[str] = []
    labels: list[dict[str, str]] = []

    def walk(level: int, values: list[str]) -> None:
        if level == len(TAS_LEVELS):
            names.append("node" + "".join(f"-{v[0]}{v.split('-')[1]}" for v in values))
            labels.append({**TAS_NODE_GROUP, **{TAS_LEVELS[i][2]: v for i, v in enumerate(values)}})
            return
        name, count, _label = TAS_LEVELS[level]
        for i in range(count if level < len(TAS_LEVELS) - 1 else scaled(count, f)):
            walk(level + 1, [*values, f"{name}-{i}"])

    walk(0, [])
    return names, labels


def tas_queue(q: int) -> str:
    """The quota tree node of Kueue's queue ``q`` (0..29): cq-<cohort>-<queue in its cohort>."""
    return f"cq-{q // TAS_QUEUES_PER_COHORT}-{q % TAS_QUEUES_PER_COHORT}"


def tas_quota(api: Api) -> None:
    """The quota tree of Kueue's cohorts and queues (see TAS_TREE), in the bench namespace."""
    install_crd(api, QUOTA_CRD)
    path = f"/apis/quota.codeflare.dev/v1alpha1/namespaces/{NAMESPACE}/quotasubtrees"

    def subtree(name: str, parent: str | None, children: list[str], cpu: int, hard: bool) -> Obj:
        spec: Obj = {"children": [{"name": child, "quotas": {"hardLimit": hard, "requests": {"cpu": str(cpu)}}}
                                  for child in children]}
        if parent:
            spec["parent"] = parent
        return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
                "metadata": {"name": name, "labels": {"tree": TAS_TREE}}, "spec": spec}

    cohorts = [f"cohort-{c}" for c in range(TAS_COHORTS)]
    api.create(path, subtree("cohorts", None, cohorts, TAS_QUEUES_PER_COHORT * TAS_QUEUE_CPU, True))
    for c, cohort in enumerate(cohorts):
        api.create(path, subtree(cohort, cohort, [tas_queue(c * TAS_QUEUES_PER_COHORT + j)
                                                  for j in range(TAS_QUEUES_PER_COHORT)], TAS_QUEUE_CPU, False))


def churn_tas_body(args: tuple[str, int, int, int, str, str]) -> Obj:
    """One churn_tas workload's AppWrapper (built in a load process): ``pods`` x ``milli`` cpu declared on a
    ConfigMap, the topology ask of its Kueue class on the rack level, charged to its queue's node of the quota
    tree."""
    name, priority, pods, milli, ask, queue = args
    item = configmap_item(name, {"cpu": f"{milli}m"})
    item["custompodresources"][0]["replicas"] = pods
    body = appwrapper(name, [item], priority=priority, labels={TAS_TREE: queue})
    body["metadata"]["annotations"] = {TAS_ANNOTATION[ask]: TAS_RACK_LABEL}
    return body


def churn(opts: Options, result: Result, *, workload: ChurnWorkload = CHURN_CONFIGMAP, scenario: str = "churn",
          tas: bool = False) -> None:
    """Kueue's baseline shape on 600 cpu: 30 arrival streams x 3 classes at Kueue's intervals; each workload is an
    AppWrapper (a ConfigMap + custompodresources cpu) that the load process deletes ``runtime`` after it is first
    seen Running, as Kueue's runner finishes workloads. Time-to-dispatch per class next to Kueue's means, wall time,
    utilisation, and the API writes per workload: the API server's mutating requests during the load (its
    ``apiserver_request_total``) minus the load process's own creates and deletes, heartbeats, and the garbage
    collector's deletes of the ConfigMaps. Creates are timed against the schedule: their lateness (p50/p99/max) is
    reported, a full run whose p99 exceeds ``MAX_CREATE_LATENESS_MS`` fails, and time to dispatch is also given
    from each workload's scheduled arrival (``arrival_to_dispatch_<class>``), which a late create cannot shorten.

    ``workload`` (``churn_pods``: ``CHURN_JOB``): each workload is a one-pod Job of its cpu instead, whose
    pod is created by the Job controller, (with the default placement binding) gated and pinned to the node of its
    plan by mcad, bound, run by kwok for the run time, and succeeds; the Job completes, mcad marks the AppWrapper
    Completed, and the load process then deletes it (``ChurnWorkload``). A workload is finished when that delete
    returned, in both: wall = last finish - t0. Also reported then: create -> first pod Running per class,
    dispatch -> pod Running, and how much later than its run time each workload was seen Completed (pod seen
    Running -> seen Completed - run time: kwok, the Job controller and mcad's completion watch). Run it
    with ``--controller-args=--placement=advisory`` for the comparison. The API writes are not counted then: the
    scheduler's binds, the Job controller's and the kubelets' (kwok's) writes would be among them.

    ``tas`` (``churn_tas``): Kueue's TAS configuration of the same test instead (``TAS_CLASSES``): its 640 nodes
    of 96 cpu labelled by block, rack and host as its generator labels them, the controller given those three
    levels (``--topology-level``), each class's workloads asking a rack as Kueue's do (``TAS_ANNOTATION``), each
    queue's workloads charged to its node of a quota tree shaped as Kueue's cohorts (``tas_quota``): the quota,
    600 cpu, is what bounds both (test/perf/README.md lists every difference)."""
    fraction = opts.churn_fraction * opts.factor(scenario)
    n_nodes = len(tas_nodes(opts.factor(scenario))[0]) if tas else opts.churn_nodes
    capacity = TAS_QUOTA_CPU if tas else n_nodes * CHURN_NODE_CPU
    # (offset s, name, class, runtime, priority, cpu)
    plan: list[tuple[float, str, str, float, int, float]] = []
    per_queue = {}
    classes = ([(c.name, c.per_queue, c.interval, c.runtime, c.priority, c.cpu) for c in TAS_CLASSES] if tas
               else KUEUE_CLASSES)
    for cls, count, interval, runtime, priority, cpu in classes:
        k = scaled(count, fraction)
        per_queue[cls] = k
        for q in range(KUEUE_QUEUES):
            for i in range(k):
                plan.append(((i + 1) * interval, f"{cls}-{q:02d}-{i:03d}", cls, runtime, priority, cpu))
    plan.sort()
    n = len(plan)
    spec = {name: (cls, runtime, cpu) for _, name, cls, runtime, _, cpu in plan}
    kueue_mean_ms = KUEUE_TAS_MEAN_MS if tas else KUEUE_MEAN_MS
    kueue_wall_s = KUEUE_TAS_WALL_S if tas else KUEUE_WALL_S
    extra_args: tuple[str, ...] = ()
    if tas:
        extra_args = tuple(arg for _, _, label in TAS_LEVELS for arg in ("--topology-level", label))
    result["params"] = {"workloads": n, "fraction_of_kueue": round(fraction, 4), "queues": KUEUE_QUEUES,
                        "per_queue": per_queue, "nodes": n_nodes, "capacity_cpu": capacity, "threads": opts.threads,
                        "load_processes": opts.load_processes,
                        "wraps": workload.wraps,
                        "controller_args": " ".join((*opts.controller_args, *extra_args)) or "(defaults)"}
    if tas:
        result["params"].update({"node_cpu": TAS_NODE_CPU, "quota": f"{TAS_COHORTS} cohorts x "
                                 f"{TAS_QUEUES_PER_COHORT} queues x {TAS_QUEUE_CPU} cpu, each cohort's "
                                 f"{TAS_QUEUES_PER_COHORT * TAS_QUEUE_CPU} shared (tree {TAS_TREE})"})
    with Env(scenario, opts, result) as env:
        if tas:
            names, labels = tas_nodes(opts.factor(scenario))
            env.nodes(n_nodes, cpu=str(TAS_NODE_CPU), memory=TAS_NODE_MEMORY, pods=110, names=names,
                      labels=labels.__getitem__)
            tas_quota(env.api)
        else:
            env.nodes(n_nodes, cpu=str(CHURN_NODE_CPU), memory="160Gi", pods=110)
        # /metrics on a known port, read without a token: the controller's own count of its writes.
        metrics_url = f"http://127.0.0.1:{webhooks_mod.free_port()}"
        ctl = env.controller("controller", args=(*opts.controller_args, *extra_args, "--insecure-debug-endpoints",
                                                 "--http-bind-address", metrics_url.removeprefix("http://")))
        result["controller_ready_s"] = round(warmup(env, ctl), 2)
        baseline = ctl.stats()
        counted_before = controller_counted_writes(metrics_url + "/metrics")
        api = env.api
        finisher: Finisher | None = None

        def on_running(name: str, seen: float) -> None:
            if finisher is not None and name in spec and not workload.completes:
                finisher.at(seen + spec[name][1], name)

        def on_completed(name: str, seen: float) -> None:
            if finisher is not None and name in spec and workload.completes:
                finisher.at(seen, name)

        def namespace_of(name: str) -> str:  # stream q's tenant (--tenants): q mod N
            return tenant_namespace(churn_stream(name), env.tenants)

        tracker = Tracker(on_running=on_running, on_completed=on_completed)
        finisher = Finisher(api, tracker, namespace_of=namespace_of)
        finished = finisher.finished
        spread = env.tenants > 1
        env.watch(watch_appwrappers(api, tracker, all_namespaces=spread))
        if workload.pods:
            env.watch(watch_pods(api, tracker, all_namespaces=spread))
        kind = next(key for key, known in CHURN_WORKLOADS.items() if known is workload)
        if tas:
            by_name = {c.name: c for c in TAS_CLASSES}
            creators = OnTimeLoad(env.cluster.kubeconfig, aw_path(),
                                  [(offset, (name, priority, by_name[cls].pods, by_name[cls].pod_milli,
                                             by_name[cls].ask, tas_queue(churn_stream(name))))
                                   for offset, name, cls, _runtime, priority, _cpu in plan],
                                  churn_tas_body, processes=opts.load_processes, threads=opts.threads)
        else:
            creators = OnTimeLoad(env.cluster.kubeconfig, aw_collection_of,
                                  [(offset, (name, priority, cpu, runtime, kind, namespace_of(name)))
                                   for offset, name, _cls, runtime, priority, cpu in plan],
                                  churn_body, processes=opts.load_processes, threads=opts.threads)

        def line() -> str:
            return (f"created {creators.created_count()}/{n}, dispatched {len(tracker.running)}, "
                    f"finished {len(finished)}, running now {len(tracker.running) - len(finished)}")

        def failed() -> bool:  # polled by the wait below at least every 0.5 s
            died = not creators.alive() and creators.created_count() < n
            return bool(creators.failed() or finisher.errors or died)

        writes_before = settled_api_writes(api)
        finisher.start()
        say(f"churn: {n} workloads over {plan[-1][0]:.1f} s of arrivals on {capacity} cpu, created by "
            f"{creators.processes} processes x {creators.threads} threads")
        try:
            t0 = creators.start()
            with Progress(scenario, line):
                tracker.wait(lambda: len(finished) >= n or failed(), 300 + n / 5, f"{n} workloads finished",
                             functools.partial(none_failed, tracker, ctl))
            creators.join(timeout=60)
            if creators.errors or finisher.errors or len(creators.created) < n:
                first = (creators.errors or finisher.errors or [f"{n - len(creators.created)} creates missing"])[0]
                raise BenchError(f"churn: the load failed: {first}")
        finally:
            finisher.stop()
            creators.kill()
        for name, when in creators.created.items():
            tracker.mark_created(name, when)
        lateness = creators.lateness
        wall = max(finished.values()) - t0
        if opts.timeline:
            path = LOGS / f"{scenario}-timeline.jsonl"
            timeline_mod.write(path, timeline_mod.rows({name: (cls, cpu) for name, (cls, _, cpu) in spec.items()},
                                                       tracker.created, tracker.running, finished, t0))
            result["timeline"] = str(path)
            say(f"{scenario}: each workload's times in {path} (python -m test.perf.timeline {path})")
        result["wall_s"] = round(wall, 2)
        result["controller"] = controller_figures(ctl, baseline)
        page = scrape(metrics_url + "/metrics")
        counted = counted_writes(page)
        counted.subtract(counted_before)
        counted = Counter({k: v for k, v in counted.items() if v})
        # How often the controller judged the queue, and how long that took it (the whole run: the first cycles
        # judge nothing).
        result["dispatch_cycles"] = {"count": int(page.get("mcad_dispatch_cycle_duration_seconds_count", 0)),
                                     "seconds": round(page.get("mcad_dispatch_cycle_duration_seconds_sum", 0.0), 2)}
        # What the controller decided, by kind (preempted: evicted and requeued, e.g. by a quota reclaim).
        result["decisions"] = {found[1]: int(value) for sample, value in page.items()
                               if (found := re.fullmatch(r'mcad_dispatch_decisions_total\{decision="([^"]*)"\}',
                                                         sample))}
        # Where the controller's writes went, as it counts them itself (mcad_api_writes_total): with pods too.
        result["controller_counted_writes"] = {"total": sum(counted.values()),
                                               "per_workload": round(sum(counted.values()) / n, 2),
                                               "by_request": dict(sorted(counted.items()))}
        if not workload.pods:
            writes = controller_writes(writes_before, settled_api_writes(api),
                                       Counter({f"POST {AW_RESOURCE}": len(tracker.created),
                                                f"DELETE {AW_RESOURCE}": len(finished)}),
                                       garbage_collected=("DELETE configmaps",))
            writes["per_workload"] = round(writes["controller"] / n, 2)
            result["api_writes"] = writes
        work = sum(runtime * cpu for _, _, _, runtime, _, cpu in plan)
        result["utilisation_pct"] = round(100 * work / (capacity * wall), 1)
        result["throughput"] = {"workloads_per_s": round(n / wall, 1)}
        result["create_lateness"] = summary(lateness)
        result["latency"] = {}
        result["per_class"] = {}
        full = fraction >= 1.0
        scheduled = {name: t0 + offset for offset, name, *_ in plan}
        for cls, *_ in classes:
            members = [name for _, name, c, *_ in plan if c == cls]
            figures = summary(tracker.latencies(members, tracker.running))
            result["latency"][f"time_to_dispatch_{cls}"] = figures
            # From the arrival the schedule says, not from the create: a late create cannot hide a wait.
            result["latency"][f"arrival_to_dispatch_{cls}"] = summary(
                tracker.latencies(members, tracker.running, start=scheduled))
            # How much of that wait came after the controller decided: its status write and this bench's watch.
            result["latency"][f"(controller decision to seen)_{cls}"] = summary(tracker.decision_to_seen(members))
            kueue = kueue_mean_ms[cls]
            result["per_class"][cls] = {
                **{k: figures.get(k) for k in ("n", "mean_ms", "p50_ms", "p90_ms", "p99_ms")},
                "kueue_mean_ms": kueue,
                "mean_over_kueue": round(figures["mean_ms"] / kueue, 3) if figures.get("mean_ms") else None}
            if full:
                add_target(result, f"{cls} mean time to dispatch at full scale (Kueue {kueue / 1000:g} s)",
                           figures.get("mean_ms"), "<=", kueue, "ms")
        result["latency"]["time_to_dispatch_all"] = summary(tracker.latencies(spec, tracker.running))
        if spread:
            result["fairness"] = tenant_fairness(plan, tracker, namespace_of)
        if workload.pods:
            pod_figures(result, tracker, {name: (cls, runtime) for name, (cls, runtime, _) in spec.items()})
        if full:
            add_target(result, f"wall time at full scale (Kueue {kueue_wall_s:g} s)", wall, "<", kueue_wall_s, "s")
            late = result["create_lateness"].get("p99_ms")
            add_target(result, "create lateness p99 (an on-time load)", late, "<=", MAX_CREATE_LATENESS_MS, "ms")
            if late is None or late > MAX_CREATE_LATENESS_MS:
                raise BenchError(f"{scenario}: the load was late (create lateness p99 {late} ms, more than "
                                 f"{MAX_CREATE_LATENESS_MS:g} ms): no figure of this run counts")
        else:
            result.setdefault("notes", []).append(
                f"per-class and wall-time targets (Kueue's means, {kueue_wall_s:.0f} s), and the bound on create "
                f"lateness (p99 <= {MAX_CREATE_LATENESS_MS:g} ms), apply at full scale only (--churn-full, --scale 1)")


def controller_counted_writes(url: str) -> Counter[str]:
    """The controller's own count of the writes it sent (``mcad_api_writes_total``), keyed "VERB resource" as
    ``api_writes`` keys the API server's (the verbs upper-cased as HTTP methods)."""
    return counted_writes(scrape(url))


def counted_writes(scraped: dict[str, float]) -> Counter[str]:
    """``controller_counted_writes`` of a /metrics page already scraped."""
    methods = {"create": "POST", "update": "PUT", "patch": "PATCH", "delete": "DELETE"}
    out: Counter[str] = Counter()
    for sample, value in scraped.items():
        found = re.fullmatch(r'mcad_api_writes_total\{resource="([^"]*)",verb="([^"]*)"\}', sample)
        if found:
            out[f"{methods.get(found[2], found[2])} {found[1]}"] += int(value)
    return out


def none_failed(tracker: Tracker, ctl: Controller) -> None:
    """For ``Tracker.wait`` (lock held): the controller is alive and no workload Failed (a Failed one would never
    finish: fail now, naming it, rather than at the timeout)."""
    ctl.check_alive()
    if tracker.failed:
        name, message = next(iter(tracker.failed.items()))
        raise BenchError(f"{len(tracker.failed)} workload(s) Failed, first {name}: {message}")


def pod_figures(result: Result, tracker: Tracker, spec: dict[str, tuple[str, float]]) -> None:
    """Churn with pods (``spec``: name -> (class, run time s)): create -> first pod Running per class, dispatch ->
    pod Running (mcad's SSA of the Job, the Job controller's pod, its pin, the bind, kwok), and for workloads that
    complete, how much later than its run time each was seen Completed after its pod was seen Running (kwok's
    stage, the Job controller's batched status writes, mcad's completion watch and status write). mcad holds a
    workload's cpu from dispatch until its pod is seen Succeeded (a finished pod frees its share): the start is what
    a pod adds to the time capacity is held, which churn's ConfigMaps do not pay; the finish delays only the
    Completed state (and the load's delete). ``completion`` counts the workloads seen Completed."""
    latency = result["latency"]
    for cls in dict.fromkeys(c for c, _ in spec.values()):
        members = [name for name, (c, _) in spec.items() if c == cls]
        latency[f"time_to_pod_running_{cls}"] = summary(tracker.latencies(members, tracker.pods_running))
    latency["dispatch_to_pod_running"] = summary(tracker.latencies(spec, tracker.pods_running, start=tracker.running))
    with tracker.cond:
        completed = {name: seen for name, seen in tracker.completed.items() if name in spec}
        overrun = [seen - tracker.pods_running[name] - spec[name][1] for name, seen in completed.items()
                   if name in tracker.pods_running]
    if overrun:
        latency["pod_run_time_to_completed"] = summary(overrun)
    result["completion"] = {"completed": len(completed), "workloads": len(spec)}


# ---------------------------------------------------------------------------------------------- restart


def restart(opts: Options, result: Result) -> None:
    """N AppWrappers dispatched, each with a bare Pod Running (placed by kube-scheduler; ``--restart-nodename``
    binds them round-robin with nodeName instead, should the scheduler bound the set-up); then the controller is
    stopped (SIGTERM) and a new one started: process start -> "dispatcher started" in its log, and -> a new small
    AppWrapper (created right after the start) Running; the new process's peak RSS; nothing dispatched twice, no
    pod replaced."""
    f = opts.factor("restart")
    n = scaled(10000, f)
    n_nodes = scaled(1000, f)
    result["params"] = {"appwrappers": n, "pods": n, "nodes": n_nodes, "node_cpu": 8, "pod_cpu": "100m",
                        "pods_bound_by": "nodeName" if opts.restart_nodename else "kube-scheduler",
                        "threads": opts.threads}
    with Env("restart", opts, result) as env:
        env.nodes(n_nodes, cpu="8", memory="32Gi", pods=110)
        api = env.api
        first = env.controller("controller-1")
        result["controller_ready_s"] = round(warmup(env, first), 2)
        tracker = Tracker()
        after_restart = threading.Event()
        events_after = [0]

        def on_aw(etype: str, obj: Obj, seen: float) -> None:
            if after_restart.is_set() and PROBE_LABEL not in ((obj.get("metadata") or {}).get("labels") or {}):
                events_after[0] += 1
            tracker.on_aw(etype, obj, seen)

        env.watch(Watch(api, aw_path(), on_aw, name="watch-appwrappers").start())
        pod_watch = env.watch(watch_pods(api, tracker))
        names = [f"rs-{i:05d}" for i in range(n)]
        bodies = [appwrapper(name, [pod_item(name, "100m", f"kwok-node-{i % n_nodes}" if opts.restart_nodename
                                             else None)]) for i, name in enumerate(names)]

        say(f"restart: setting up {n} AppWrappers with {n} pods on {n_nodes} nodes")
        started = time.monotonic()
        timeout = 300 + n / 10
        with Progress("restart", lambda: tracker.pods_progress(n)):
            create_all(env, tracker, bodies)
            tracker.wait(lambda: len(tracker.running) + len(tracker.failed) >= n, timeout,
                         f"{n} AppWrappers Running", first.check_alive)
            tracker.wait(lambda: len(tracker.pods_running) >= n - len(tracker.failed), timeout,
                         f"{n} pods Running", first.check_alive)
            # Let the first controller finish its pod-count status writes: quiet for 3 s (at most 120 s).
            deadline = time.monotonic() + 120
            while time.monotonic() - tracker.last_event < 3 and time.monotonic() < deadline:
                time.sleep(0.5)
        result["setup_s"] = round(time.monotonic() - started, 1)
        if tracker.failed:
            raise BenchError(f"{len(tracker.failed)} AppWrappers failed during set-up, e.g. "
                             f"{next(iter(tracker.failed.items()))}")
        result["controller_before_restart"] = controller_figures(first)
        first.stop()
        pod_watch.stop()

        before_aws, _ = api.list_all(aw_path())
        stamps = {o["metadata"]["name"]: (o.get("status") or {}).get("controllerfirstdispatchtimestamp")
                  for o in before_aws}
        before_pods, _ = api.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods")
        pod_uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in before_pods}
        del before_aws, before_pods
        after_restart.set()

        probe = Tracker()
        env.watch(watch_appwrappers(api, probe, f"{PROBE_LABEL}=true"))
        # "dispatcher started" is an info line: the restarted controller logs at info (one line per dispatch).
        second = Controller(env.cluster.kubeconfig, "restart-controller-2", log_level="info",
                            args=opts.controller_args)
        env.controllers.append(second)
        log_seen: dict[str, float] = {}
        log_line: list[str] = []
        follow_stop = threading.Event()

        def follow_log() -> None:
            while not follow_stop.is_set() and "started" not in log_seen:
                try:
                    for raw in second.log.read_bytes().splitlines():
                        if b'"dispatcher started"' in raw:
                            log_line.append(raw.decode(errors="replace"))
                            log_seen["started"] = time.monotonic()
                            break
                except OSError:
                    pass
                time.sleep(0.01)

        say("restart: SIGTERM sent; starting a new controller and creating one small AppWrapper")
        second.start()
        follower = threading.Thread(target=follow_log, daemon=True, name="follow-log")
        follower.start()
        name = "restart-probe"
        api.create(aw_path(), appwrapper(name, [configmap_item(name, {"cpu": "100m"})],
                                         labels={PROBE_LABEL: "true"}))
        probe.mark_created(name, time.monotonic())
        try:
            probe.wait(lambda: name in probe.running, 300, "the new controller to dispatch a new AppWrapper",
                       second.check_alive)
            first_dispatch = probe.running[name] - second.started_mono
            wait_for(lambda: "started" in log_seen, 30, '"dispatcher started" in the new controller\'s log',
                     interval=0.05)
        finally:
            follow_stop.set()
        synced = log_seen["started"] - second.started_mono
        try:  # the logged timestamp is more precise than the file poll
            stamp = json.loads(log_line[0])["timestamp"]
            synced = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - second.started_wall
        except (IndexError, KeyError, ValueError):
            pass
        result["restart"] = {"start_to_synced_s": round(synced, 3),
                             "start_to_first_dispatch_s": round(first_dispatch, 3),
                             "create_to_first_dispatch_s": round(probe.running[name] - probe.created[name], 3)}

        # Correctness: nothing re-dispatched, no pod replaced, all still Running. Give the new controller a few
        # seconds to do anything wrong first.
        time.sleep(3)
        after_aws, _ = api.list_all(aw_path())
        after_pods, _ = api.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods")
        redispatched = sum(1 for o in after_aws if o["metadata"]["name"] in stamps
                           and (o.get("status") or {}).get("controllerfirstdispatchtimestamp")
                           != stamps[o["metadata"]["name"]])
        not_running = sum(1 for o in after_aws if (o.get("status") or {}).get("state") != "Running")
        replaced = sum(1 for p in after_pods if pod_uids.get(p["metadata"]["name"]) != p["metadata"]["uid"])
        result["restart"].update({"redispatched": redispatched, "not_running": not_running,
                                  "pods_replaced_or_new": replaced, "pods": len(after_pods),
                                  "appwrapper_writes_seen_after_restart": events_after[0]})
        result["controller"] = controller_figures(second)
        result["wall_s"] = round(time.monotonic() - started, 2)
        result["latency"] = {}
        if redispatched or not_running or replaced or len(after_pods) != len(pod_uids):
            raise BenchError(f"restart was not clean: {redispatched} re-dispatched, {not_running} not Running, "
                             f"{replaced} pods replaced, {len(after_pods)} pods (had {len(pod_uids)})")
        add_target(result, "restart to first dispatch", first_dispatch, "<", 20, "s")
        add_target(result, "peak RSS of the restarted controller", result["controller"].get("peak_rss_mib"),
                   "<=", 300, "MiB")


# ---------------------------------------------------------------------------------------------- noisy neighbour

NOISY_NAMESPACE = NAMESPACE  # the tenant with the big AppWrappers
QUIET_NAMESPACE = "bench-quiet"  # the tenant with one small AppWrapper
NOISY_DELAY_S = 2.0


def noisy_neighbour(opts: Options, result: Result) -> None:
    """One tenant's big AppWrappers against another's small one (one namespace must not monopolise the write pool): N
    AppWrappers of M ConfigMaps each (no pods, zero demand: all dispatch at once) created in one namespace, then, 2 s
    after the last create returned, a one-pod AppWrapper in another namespace. Its creation -> Running (dispatched) and
    -> pod Running, while the big ones are being written; and the first big create -> the last big one Running."""
    f = opts.factor("noisy_neighbour")
    n = scaled(40, f)
    items = scaled(500, f, minimum=10)
    result["params"] = {"big_appwrappers": n, "configmaps_each": items, "nodes": 1, "delay_s": NOISY_DELAY_S,
                        "threads": opts.threads}
    with Env("noisy_neighbour", opts, result) as env:
        env.nodes(1, cpu="8", memory="32Gi", pods=110)
        create_namespace(env.api, QUIET_NAMESPACE)
        ctl = env.controller("controller")
        result["controller_ready_s"] = round(warmup(env, ctl), 2)
        baseline = ctl.stats()
        api = env.api
        tracker = Tracker()
        env.watch(watch_appwrappers(api, tracker))
        env.watch(Watch(api, aw_path(namespace=QUIET_NAMESPACE), tracker.on_aw, name="watch-quiet").start())
        env.watch(Watch(api, f"/api/v1/namespaces/{QUIET_NAMESPACE}/pods", tracker.on_pod, AW_LABEL,
                        name="watch-quiet-pods").start())
        names = [f"big-{i:03d}" for i in range(n)]
        bodies = [appwrapper(name, [{"replicas": 1, "generictemplate": {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-{j:03d}"}, "data": {"bench": "1"}}}
            for j in range(items)]) for name in names]
        probe = "quiet-probe"

        def line() -> str:
            return (f"created {len(tracker.created)}/{n + 1}, big Running {len(set(names) & set(tracker.running))}"
                    f"/{n}, probe {tracker.state.get(probe) or '-'}")

        say(f"noisy_neighbour: {n} AppWrappers of {items} ConfigMaps in {NOISY_NAMESPACE}, then one pod in "
            f"{QUIET_NAMESPACE} {NOISY_DELAY_S:g} s later")
        started = time.monotonic()
        timeout = 120 + n * items / 100
        with Progress("noisy_neighbour", line):
            create_s = create_all(env, tracker, bodies)
            time.sleep(NOISY_DELAY_S)  # the schedule of the scenario, not a wait for a condition
            big_running_before = len(set(names) & set(tracker.running))
            api.create(aw_path(namespace=QUIET_NAMESPACE), appwrapper(probe, [pod_item(probe, "100m")]))
            tracker.mark_created(probe, time.monotonic())
            tracker.wait(has(tracker.running, probe), timeout, f"{probe} Running", ctl.check_alive)
            tracker.wait(has(tracker.pods_running, probe), 120, f"the pod of {probe} Running", ctl.check_alive)
            tracker.wait(lambda: all(x in tracker.running or x in tracker.failed for x in names), timeout,
                         f"{n} big AppWrappers Running", ctl.check_alive)
        result["wall_s"] = round(time.monotonic() - started, 2)
        result["controller"] = controller_figures(ctl, baseline)
        if tracker.failed:
            raise BenchError(f"{len(tracker.failed)} AppWrappers failed, e.g. {next(iter(tracker.failed.items()))}")
        first_create = min(tracker.created[x] for x in names)
        big_wall = max(tracker.running[x] for x in names) - first_create
        probe_s = tracker.running[probe] - tracker.created[probe]
        result["big"] = {"create_s": round(create_s, 2), "first_create_to_last_running_s": round(big_wall, 2),
                         "running_when_probe_created": big_running_before,
                         "running_before_probe": sum(1 for x in names if tracker.running[x] < tracker.running[probe])}
        result["throughput"] = {"configmaps_per_s": round(n * items / big_wall, 1)}
        # Split at the controller's decision (its dispatch timestamp: its wall clock, in microseconds): before it,
        # the dispatcher loop; after it, the write pool, the API server and the watch.
        offset = time.time() - time.monotonic()
        try:
            decided = datetime.fromisoformat(tracker.dispatch_stamp[probe].replace("Z", "+00:00")).timestamp() - offset
        except (KeyError, ValueError):
            decided = None
        result["latency"] = {"probe_create_to_running": summary([probe_s]),
                             "(probe decision to seen Running)": summary(
                                 [] if decided is None else [tracker.running[probe] - decided]),
                             "probe_create_to_pod_running": summary(tracker.latencies([probe], tracker.pods_running)),
                             "big_create_to_running": summary(tracker.latencies(names, tracker.running))}
        add_target(result, "other tenant's one-pod AppWrapper create -> Running", probe_s, "<", 0.5, "s")


# What one queued AppWrapper may cost the controller (its memory target): this much, plus this share of its own size.
MEMORY_PER_APPWRAPPER_BYTES = 2048
MEMORY_SHARE_OF_SIZE = 0.10
MEMORY_PEAK_MIB = 300.0
BIG_VALUES, BIG_VALUE_BYTES = 16, 64 * 1024  # 1 MiB of ConfigMap data in each big AppWrapper


def settled_rss(ctl: Controller, timeout: float = 30.0) -> float:
    """The controller's RSS (MiB) once it stops moving (three reads 0.5 s apart within 1 MiB), or at the deadline."""
    reads: list[float] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reads.append(ctl.stats().get("rss_mib", 0.0))
        if len(reads) >= 3 and max(reads[-3:]) - min(reads[-3:]) <= 1.0:
            break
        time.sleep(0.5)  # sampling a process's memory: there is no event to wait for
    return reads[-1]


def memory(opts: Options, result: Result) -> None:
    """Controller memory per queued AppWrapper (bounded memory). (a) N small AppWrappers that can never
    fit (1 nvidia.com/gpu each, no GPUs) are queued: settled RSS growth over the warm controller, per AppWrapper,
    against 2 KiB plus 10 % of one AppWrapper's size as stored (its JSON with status). (b) M AppWrappers of 1 MiB
    each (a ConfigMap of 16 values of 64 KiB), queued the same way: the controller's peak RSS while they arrive.
    (c) The controller restarts and lists them all: the new process's peak RSS. (b) and (c) against 300 MiB."""
    f = opts.factor("memory")
    n_small = scaled(10000, f)
    n_big = scaled(1000, f)
    result["params"] = {"small_appwrappers": n_small, "big_appwrappers": n_big,
                        "big_bytes": BIG_VALUES * BIG_VALUE_BYTES, "nodes": 2, "threads": opts.threads}
    with Env("memory", opts, result) as env:
        started = time.monotonic()
        env.nodes(2, cpu="8", memory="32Gi", pods=110)
        ctl = env.controller("controller", args=(*UNPACED, *opts.controller_args))
        result["controller_ready_s"] = round(warmup(env, ctl), 2)
        api = env.api
        tracker = Tracker()
        env.watch(watch_appwrappers(api, tracker))
        base_rss = settled_rss(ctl)

        small = [f"small-{i:05d}" for i in range(n_small)]
        say(f"memory: queueing {n_small} small AppWrappers")
        with Progress("memory", lambda: f"created {len(tracker.created)}/{n_small}, Pending {len(tracker.pending)}"):
            create_all(env, tracker, [appwrapper(n, [configmap_item(n, {"nvidia.com/gpu": "1"})]) for n in small])
            tracker.wait(lambda: len(tracker.pending) >= n_small, 120 + n_small / 10,
                         f"{n_small} small AppWrappers Pending", ctl.check_alive)
        small_rss = settled_rss(ctl)
        size = len(json.dumps(api.get(aw_path(small[-1])), separators=(",", ":")))
        per_aw = (small_rss - base_rss) * 1024 * 1024 / n_small
        budget = MEMORY_PER_APPWRAPPER_BYTES + MEMORY_SHARE_OF_SIZE * size
        result["small"] = {"appwrapper_bytes": size, "rss_before_mib": base_rss, "rss_after_mib": small_rss,
                           "bytes_per_appwrapper": round(per_aw), "budget_bytes": round(budget)}
        add_target(result, f"RSS per queued AppWrapper of {size} B (2 KiB + 10 % of its size)", per_aw, "<=",
                   budget, "B")

        big = [f"big-{i:04d}" for i in range(n_big)]
        data = {f"v{j:02d}": "x" * BIG_VALUE_BYTES for j in range(BIG_VALUES)}

        def big_body(name: str) -> Obj:
            item = configmap_item(name, {"nvidia.com/gpu": "1"})
            item["generictemplate"]["data"] = data
            return appwrapper(name, [item])

        say(f"memory: queueing {n_big} AppWrappers of 1 MiB")
        with Progress("memory", lambda: f"big created {len(set(big) & set(tracker.created))}/{n_big}, "
                                        f"Pending {len(set(big) & set(tracker.pending))}"):
            run_parallel(lambda name: (api.create(aw_path(), big_body(name)),
                                       tracker.mark_created(name, time.monotonic())), big, min(opts.threads, 8))
            tracker.wait(lambda: all(n in tracker.pending for n in big), 300 + n_big, f"{n_big} big ones Pending",
                         ctl.check_alive)
        figures = controller_figures(ctl)
        result["big"] = {"peak_rss_mib": figures["peak_rss_mib"], "rss_after_mib": settled_rss(ctl)}
        add_target(result, f"peak RSS while {n_big} AppWrappers of 1 MiB arrive", figures["peak_rss_mib"], "<=",
                   MEMORY_PEAK_MIB, "MiB")

        say("memory: restarting the controller, which lists them all")
        ctl.stop()
        again = env.controller("controller-restarted", args=(*UNPACED, *opts.controller_args))
        result["restart"] = {"ready_s": round(warmup(env, again, timeout=300 + n_big / 10), 2)}
        restarted = controller_figures(again)
        result["restart"].update(peak_rss_mib=restarted["peak_rss_mib"], rss_mib=settled_rss(again))
        result["wall_s"] = round(time.monotonic() - started, 2)
        result["controller"] = restarted
        result["latency"] = {"small_create_to_pending": summary(tracker.latencies(small, tracker.pending)),
                             "big_create_to_pending": summary(tracker.latencies(big, tracker.pending))}
        add_target(result, f"peak RSS of a restart listing {n_small + n_big} queued AppWrappers",
                   restarted["peak_rss_mib"], "<=", MEMORY_PEAK_MIB, "MiB")


# ---------------------------------------------------------------------------------------------- admission

ADMISSION_GROUP = "bench-tenants"


def tenant_role(api: Api, appwrappers: bool = False) -> None:
    """A Role in ``bench`` bound to ``ADMISSION_GROUP``: create Deployments, Services and ConfigMaps (the items of
    ``tenant_appwrapper``), and AppWrappers too if ``appwrappers``."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}"
    rules: list[Obj] = [{"apiGroups": [""], "resources": ["services", "configmaps"], "verbs": ["create"]},
                        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}]
    if appwrappers:
        rules.append({"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"], "verbs": ["create"]})
    api.create(f"{rbac}/roles", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                                 "metadata": {"name": "bench-tenant"}, "rules": rules})
    api.create(f"{rbac}/rolebindings", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                                        "metadata": {"name": "bench-tenant"},
                                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                    "name": "bench-tenant"},
                                        "subjects": [{"kind": "Group", "name": ADMISSION_GROUP,
                                                      "apiGroup": "rbac.authorization.k8s.io"}]})


def tenant_appwrapper(name: str) -> Obj:
    """A 3-item AppWrapper (Deployment of 2 x 100m, Service, ConfigMap): one SubjectAccessReview per item."""
    return appwrapper(name, [
        {"generictemplate": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
                "metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                    {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}}}}},
        {"generictemplate": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                             "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}},
        {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"},
                             "data": {"k": "v"}}}])


def admission(opts: Options, result: Result) -> None:
    """No controller: the validating reviewer (``mcad.admission.review``) with the kube-backed Facts, called from
    this process, one request at a time, against the scenario's API server, for a 3-item AppWrapper (Deployment,
    Service, ConfigMap) whose creator may create all three through a Role bound to its group: one
    SubjectAccessReview per item.

    - cold: a fresh ``KubeFacts`` per call (discovery of v1 and apps/v1, then three reviews): a replica just started;
    - cold_sar: discovery cached, the reviews not (another user each call): what a running controller pays for a
      user it has not seen within the review cache's life;
    - cached: the same user again within that life (no request at all).
    """
    from mcad.admission.kubefacts import KubeFacts
    from mcad.admission.request import AdmissionRequest, UserInfo
    from mcad.admission.review import AdmissionConfig, build
    from mcad.k8s import kube

    f = opts.factor("admission")
    n = scaled(200, f, minimum=20)
    result["params"] = {"calls_per_case": n, "items": 3}
    with Env("admission", opts, result) as env:
        api = env.api
        tenant_role(api)
        conn = kube.connect(env.cluster.kubeconfig)
        config = AdmissionConfig()
        obj = tenant_appwrapper("bench-admission")

        def user(i: int) -> UserInfo:
            return UserInfo(f"bench-user-{i}", uid=f"uid-{i}", groups=(ADMISSION_GROUP, "system:authenticated"))

        def call(facts: KubeFacts, who: UserInfo) -> float:
            _, validate = build(facts, config)
            request = AdmissionRequest(uid="bench", operation="CREATE", group="workload.codeflare.dev",
                                       namespace=NAMESPACE, name="bench-admission", user=who, obj=obj, old=None)
            t0 = time.perf_counter()
            outcome = validate(request)
            elapsed = time.perf_counter() - t0
            if not outcome.allowed:
                raise BenchError(f"admission refused the bench AppWrapper: {outcome.message}")
            return elapsed

        # The Role counts once RBAC's informer has it.
        wait_for(lambda: KubeFacts(conn).may(user(-1), "create", _must(KubeFacts(conn).resource_for(
            "apps/v1", "Deployment")), NAMESPACE).allowed, 30, "the bench Role to count")
        say(f"admission: {n} validations per case (cold, cold_sar, cached)")
        started = time.monotonic()
        cold = [call(KubeFacts(conn), user(i)) for i in range(n)]
        shared = KubeFacts(conn)
        call(shared, user(-2))  # discovery into the cache
        before = shared.requests
        cold_sar = [call(shared, user(n + i)) for i in range(n)]
        requests_per_cold_sar = (shared.requests - before) / n
        before = shared.requests
        cached = [call(shared, user(n)) for _ in range(n)]
        result["wall_s"] = round(time.monotonic() - started, 2)
        result["requests_per_call"] = {"cold_sar": round(requests_per_cold_sar, 2),
                                       "cached": round((shared.requests - before) / n, 2)}
        result["latency"] = {"validate, cold (discovery+3 SAR)": summary(cold),
                             "validate, cold SAR (3 SAR)": summary(cold_sar),
                             "validate, cached": summary(cached)}


def _must(value: Any) -> Any:
    if value is None:
        raise BenchError("discovery does not know apps/v1 Deployment")
    return value


# ---------------------------------------------------------------------------------------------- admission, attack

ATTACK_SECONDS = 60.0  # at --scale 1; never less than ATTACK_MIN_SECONDS
ATTACK_MIN_SECONDS = 15.0
# The attack mix of test_serving_attack (test.e2e.attack's flags): idle TLS connections to the webhook port, slow-byte
# connections to each port, concurrent oversized forged AdmissionReviews and their size.
ATTACK_MIX = {"idle": 500, "slow": 64, "big": 16, "big-bytes": 5_000_000}
ATTACK_PACE_S = 0.5  # one tenant create, and one /healthz probe, every this (as test_serving_attack)
ATTACK_HEALTH_TARGET_MS = 1000.0
ATTACK_RSS_TARGET_MIB = 300.0
ATTACK_RSS_SLACK_MIB = 60.0  # "back near its baseline" after the attack (as test_serving_attack)
CHART_ENV = {"PYTHONMALLOC": "malloc"}  # what the chart's Deployment sets besides the flags
ATTACK_TENANT = "bench-tenant"


def probe_health(url: str) -> tuple[float, bool]:
    """Seconds for one GET ``url``, and whether it answered 200 (a probe gives up after 5 s)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            response.read()
            ok = response.status == 200
    except OSError:
        ok = False
    return time.monotonic() - started, ok


def admission_attack(opts: Options, result: Result) -> None:
    """Admission under an unauthenticated client's load. The controller runs with its webhooks
    registered as in ``throughput_webhooks`` and the chart's environment (PYTHONMALLOC=malloc); a tenant (the
    admin impersonating a user of ``ADMISSION_GROUP``, whose Role is ``admission``'s plus AppWrappers) creates
    ``admission``'s 3-item AppWrapper one at a time, one every 0.5 s: every create is a mutating and a validating
    review with a SubjectAccessReview per item (cached per user for a while). No nodes: they stay queued.

    First quiet, then while ``test.e2e.attack`` holds 500 idle TLS connections to the webhook port, 64 slow-byte
    connections to each port and 16 concurrent ~5 MB forged reviews, for 60 s times the scale (at least 15 s).
    Reports the create call's p50/p99 in both phases, creates ok/failed under attack, /healthz (probed every 0.5 s
    on the HTTP port) and the controller's RSS: settled before the attack, sampled peak and VmHWM, and after (once
    back within 60 MiB of the baseline, or 60 s)."""
    f = opts.factor("admission_attack")
    seconds = max(ATTACK_MIN_SECONDS, round(ATTACK_SECONDS * f, 1))
    n_quiet = scaled(60, f, minimum=20)
    result["params"] = {"quiet_creates": n_quiet, "attack_seconds": seconds, "create_every_s": ATTACK_PACE_S,
                        "items": 3, "nodes": 0, **{k.replace("-", "_"): v for k, v in ATTACK_MIX.items()},
                        "controller_env": CHART_ENV}
    host = webhooks_mod.HOST
    with Env("admission_attack", opts, result) as env:
        tenant_role(env.api, appwrappers=True)
        webhook_port, http_port = webhooks_mod.free_port(), webhooks_mod.free_port()
        args = (*opts.controller_args, *webhooks_mod.register(env.api, webhook_port, creator=opts.webhook_creator),
                "--http-bind-address", f"{host}:{http_port}")
        ctl = env.controller("controller", args=args, env=CHART_ENV)
        started = time.monotonic()
        webhooks_mod.wait_admitting(env.api, f"http://{host}:{http_port}/readyz", ctl.check_alive)
        result["webhooks_admitting_s"] = round(time.monotonic() - started, 2)
        tenant = Api(env.cluster.kubeconfig, pool_size=2, impersonate=(ATTACK_TENANT, ADMISSION_GROUP))
        last = [""]

        def warm() -> bool:  # the Role counts once RBAC's informer has it
            try:
                tenant.create(aw_path(), tenant_appwrapper("warm-up"))
            except ApiError as err:
                last[0] = str(err)
                return err.status == 409
            return True

        try:
            wait_for(warm, 60, "the tenant's first create", interval=0.5, alive=ctl.check_alive)
        except BenchError as err:
            raise BenchError(f"{err}; last: {last[0]}") from None

        def paced(prefix: str, done: Callable[[int], bool], ok: list[float], failed: list[str]) -> None:
            i = 0
            while not done(i):
                sent = time.monotonic()
                try:
                    tenant.create(aw_path(), tenant_appwrapper(f"{prefix}-{i:04d}"))
                    ok.append(time.monotonic() - sent)
                except (ApiError, urllib3.exceptions.HTTPError) as err:
                    failed.append(f"{prefix}-{i:04d}: {err}")
                i += 1
                time.sleep(max(0.0, sent + ATTACK_PACE_S - time.monotonic()))

        say(f"admission_attack: {n_quiet} creates, quiet")
        measured = time.monotonic()
        quiet: list[float] = []
        quiet_failed: list[str] = []
        paced("quiet", lambda i: i >= n_quiet, quiet, quiet_failed)
        baseline = settled_rss(ctl)

        say(f"admission_attack: opening the attack's connections, then {seconds:g} s of creates under it")
        args = ["--webhook", f"{host}:{webhook_port}", "--http", f"{host}:{http_port}", "--seconds", f"{seconds:g}",
                *(a for k, v in ATTACK_MIX.items() for a in (f"--{k}", str(v)))]
        attack_log = LOGS / "admission_attack-attack.log"
        latencies: list[float] = []
        failures: list[str] = []
        health: list[tuple[float, bool]] = []
        rss: list[float] = []
        with open(attack_log, "wb") as log, load.launched(args, cwd=REPO, stderr=log) as attack:
            if not load.ready(attack):
                raise BenchError(f"the attack did not open its connections; see {attack_log}")
            end = time.monotonic() + seconds
            stop = threading.Event()

            def probe() -> None:
                while not stop.is_set():
                    health.append(probe_health(f"http://{host}:{http_port}/healthz"))
                    rss.append(ctl.stats().get("rss_mib", 0.0))
                    stop.wait(ATTACK_PACE_S)

            prober = threading.Thread(target=probe, daemon=True, name="healthz-probe")
            prober.start()
            try:
                with Progress("admission_attack", lambda: f"creates {len(latencies)} ok, {len(failures)} failed; "
                                                          f"/healthz max {max((h for h, _ in health), default=0):.2f} s"
                                                          f"; RSS {rss[-1] if rss else 0:.0f} MiB"):
                    paced("attack", lambda _: time.monotonic() >= end, latencies, failures)
            finally:
                stop.set()
                prober.join(10)
            counts = load.counts(attack)
        result["wall_s"] = round(time.monotonic() - measured, 2)
        peak = controller_figures(ctl)["peak_rss_mib"]

        def near_baseline() -> float | None:
            now = float(ctl.stats().get("rss_mib", 0.0))
            return now if now < baseline + ATTACK_RSS_SLACK_MIB else None

        try:
            after = wait_for(near_baseline, 60, "the controller's RSS back near its baseline", interval=0.5)
        except BenchError:
            after = ctl.stats().get("rss_mib")
            result.setdefault("notes", []).append(
                f"RSS still {after} MiB 60 s after the attack (baseline {baseline} MiB)")
        result["controller"] = controller_figures(ctl)
        quiet_s, attack_s = summary(quiet), summary(latencies)
        health_max = max((h for h, _ in health), default=None)
        health_failed = sum(1 for _, ok in health if not ok)
        result["attack"] = {
            "quiet_p50_ms": quiet_s.get("p50_ms"), "quiet_p99_ms": quiet_s.get("p99_ms"),
            "attack_p50_ms": attack_s.get("p50_ms"), "attack_p99_ms": attack_s.get("p99_ms"),
            "creates_ok": len(latencies), "creates_failed": len(failures), "quiet_failed": len(quiet_failed),
            "health_probes": len(health), "health_failed": health_failed,
            "health_max_ms": None if health_max is None else round(1000 * health_max, 1),
            "rss_baseline_mib": baseline, "rss_peak_sampled_mib": max(rss, default=None), "rss_peak_mib": peak,
            "rss_after_mib": after}
        result["create_failures"] = (quiet_failed + failures)[:5]
        result["attack_counts"] = counts
        result["latency"] = {"create_call, quiet": quiet_s, "create_call, under attack": attack_s,
                             "/healthz, under attack": summary(h for h, _ in health)}
        add_target(result, "tenant creates failed under attack", len(failures), "<=", 0, "")
        add_target(result, "/healthz max under attack", result["attack"]["health_max_ms"], "<",
                   ATTACK_HEALTH_TARGET_MS, "ms")
        if health_failed:
            result["targets"][-1]["met"] = False
        add_target(result, "controller peak RSS (VmHWM) through the attack", peak, "<", ATTACK_RSS_TARGET_MIB,
                   "MiB")


# ---------------------------------------------------------------------------------------------- pollers

POLLERS = 16
POLLERS_DELAY_TARGET_MS = 50.0


def reader_token(api: Api, name: str = "bench-reader", urls: tuple[str, ...] = ("/debug/*", "/metrics")) -> str:
    """A TokenRequest token of a ServiceAccount that may get ``urls`` (by default every /debug document, as the
    chart's debug viewer ClusterRole grants) and list AppWrappers everywhere."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    api.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": name}})
    api.create(f"{rbac}/clusterroles", {"metadata": {"name": name}, "rules": [
        {"nonResourceURLs": list(urls), "verbs": ["get"]},
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"], "verbs": ["list"]}]})
    api.create(f"{rbac}/clusterrolebindings", {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]})
    answer = api.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}})
    return str(answer["status"]["token"])


def pollers(opts: Options, result: Result) -> None:
    """16 clients poll /debug/queue as fast as it answers (were each read run on the dispatcher thread, they
    would hold a dispatch for 36 s): a backlog of N AppWrappers that never fit is queued (so each /debug/queue lists
    N), then one-pod AppWrappers are created one at a time, creation -> Running, first with no pollers, then with
    16. The delay is the difference of the two medians (and of the p99s); also polls answered per second and how
    long one took."""
    import urllib.error
    import urllib.request

    f = opts.factor("pollers")
    n = scaled(1000, f)
    n_probes = scaled(40, f, minimum=10)
    result["params"] = {"backlog_appwrappers": n, "probes_each": n_probes, "pollers": POLLERS, "nodes": 2}
    with Env("pollers", opts, result) as env:
        env.nodes(2, cpu="8", memory="32Gi", pods=110)
        port = webhooks_mod.free_port()
        # The last --http-bind-address wins: a port known here, since the controller logs at warning level.
        ctl = env.controller("controller", args=(*UNPACED, *opts.controller_args,
                                                  "--http-bind-address", f"127.0.0.1:{port}"))
        result["controller_ready_s"] = round(warmup(env, ctl), 2)
        baseline = ctl.stats()
        token = reader_token(env.api)
        backlog = Tracker()
        env.watch(watch_appwrappers(env.api, backlog))
        say(f"pollers: queueing {n} AppWrappers that cannot fit")
        create_all(env, backlog, [appwrapper(f"gpu-{i:05d}", [configmap_item(f"gpu-{i:05d}", {"nvidia.com/gpu": "1"})])
                                  for i in range(n)])
        backlog.wait(lambda: len(backlog.pending) >= n, 120 + n / 10, f"{n} AppWrappers Pending", ctl.check_alive)
        url = f"http://127.0.0.1:{port}/debug/queue"

        def poll_once() -> tuple[int, float, int]:
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    body = response.read()
                    code = response.status
            except urllib.error.HTTPError as err:
                body, code = err.read(), err.code
            return code, time.monotonic() - started, len(body)

        code, _, size = poll_once()
        if code != 200:
            raise BenchError(f"/debug/queue answered {code} to the reader")
        result["queue_document_bytes"] = size
        probe = Tracker()
        env.watch(watch_appwrappers(env.api, probe, f"{PROBE_LABEL}=true"))

        def probes(label: str) -> list[float]:
            latencies = []
            for i in range(n_probes):
                name = f"probe-{label}-{i:03d}"
                body = appwrapper(name, [pod_item(name, "100m")], labels={PROBE_LABEL: "true"})
                env.api.create(aw_path(), body)
                t = time.monotonic()
                probe.mark_created(name, t)
                probe.wait(has(probe.running, name), 60, f"{name} Running", ctl.check_alive)
                latencies.append(probe.running[name] - t)
                env.api.delete(aw_path(name))
                probe.wait(has(probe.deleted, name), 60, f"{name} deleted", ctl.check_alive)
            return latencies

        say(f"pollers: {n_probes} one-pod AppWrappers, one at a time, nobody polling")
        quiet = probes("quiet")
        say(f"pollers: the same with {POLLERS} clients polling /debug/queue")
        stop = threading.Event()
        polls: list[tuple[int, float, int]] = []
        lock = threading.Lock()

        def poller() -> None:
            while not stop.is_set():
                answer = poll_once()
                with lock:
                    polls.append(answer)

        threads = [threading.Thread(target=poller, name=f"poller-{i}", daemon=True) for i in range(POLLERS)]
        polling_started = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            polled = probes("polled")
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        polling_s = time.monotonic() - polling_started
        result["wall_s"] = round(time.monotonic() - polling_started, 2)
        result["controller"] = controller_figures(ctl, baseline)
        codes: dict[str, int] = {}
        for code, _, _ in polls:
            codes[str(code)] = codes.get(str(code), 0) + 1
        quiet_s, polled_s = summary(quiet), summary(polled)
        result["latency"] = {"create_to_running_no_pollers": quiet_s, "create_to_running_16_pollers": polled_s,
                             "poll": summary(t for code, t, _ in polls if code == 200)}
        result["polls"] = {"answers": codes, "per_s": round(len(polls) / polling_s, 1)}
        result["throughput"] = {"polls_answered_per_s": round(codes.get("200", 0) / polling_s, 1)}
        delay_p50 = polled_s["p50_ms"] - quiet_s["p50_ms"]
        result["delay_ms"] = {"p50": round(delay_p50, 1), "p99": round(polled_s["p99_ms"] - quiet_s["p99_ms"], 1)}
        if codes.get("200", 0) == 0:
            raise BenchError(f"no poll was answered: {codes}")
        add_target(result, f"dispatch delay (p50) with {POLLERS} /debug/queue pollers", delay_p50, "<=",
                   POLLERS_DELAY_TARGET_MS, "ms")


# ---------------------------------------------------------------------------------------------- dashboard

DASHBOARD_QUEUE_PATH = "/ui/api/queue"
DASHBOARD_SERVER_MS_TARGET = 50.0
DASHBOARD_PAGE_BYTES_TARGET = 200_000  # 200 KB, counted in thousands (the stricter reading)
SERVER_TIMING = re.compile(r"dur=([0-9.]+)")


@dataclass(frozen=True)
class Answer:
    code: int
    round_trip_s: float  # request sent -> whole body read, on loopback
    server_s: float | None  # the first dur= of a Server-Timing header, when the controller sends one
    body: bytes


def http_get(url: str, token: str) -> Answer:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"X-Mcad-Authorization": f"Bearer {token}",
                                                   "Accept": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
            code, timing = response.status, response.headers.get("Server-Timing")
    except urllib.error.HTTPError as err:
        body, code, timing = err.read(), err.code, err.headers.get("Server-Timing")
    elapsed = time.monotonic() - started
    match = SERVER_TIMING.search(timing or "")
    return Answer(code, elapsed, float(match.group(1)) / 1000 if match else None, body)


def dashboard(opts: Options, result: Result) -> None:
    """The dashboard's queue view with a deep backlog: N AppWrappers that can never fit (1
    nvidia.com/gpu each, no GPUs; queued as in deep_queue), then GET /ui/api/queue (first page, default limit)
    as the page polls it, once a second, and then back to back; also the last page, back to back. Reports the
    time per answer and the payload size. The time is the server's own (Server-Timing) when the controller sends
    that header, else the client's round trip on loopback (which includes the server's time plus the connection
    and transfer: an upper bound); ``server_time_source`` says which."""
    f = opts.factor("dashboard")
    n = scaled(10000, f)
    n_nodes = scaled(10, f)
    n_polls = scaled(50, f, minimum=10)
    result["params"] = {"queued_appwrappers": n, "nodes": n_nodes, "polls_each": n_polls, "poll_interval_s": 1.0}
    with Env("dashboard", opts, result) as env:
        env.nodes(n_nodes, cpu="8", memory="32Gi", pods=110)
        port = webhooks_mod.free_port()
        # The last --http-bind-address wins.
        ctl = env.controller("controller", args=(*UNPACED, *opts.controller_args,
                                                  "--http-bind-address", f"127.0.0.1:{port}"))
        result["controller_ready_s"] = round(warmup(env, ctl), 2)
        baseline = ctl.stats()
        token = reader_token(env.api, urls=("/debug/*", "/metrics", "/ui/*"))
        backlog = Tracker()
        env.watch(watch_appwrappers(env.api, backlog))
        say(f"dashboard: queueing {n} AppWrappers that cannot fit")
        started = time.monotonic()
        with Progress("dashboard", lambda: f"created {len(backlog.created)}/{n}, seen Pending {len(backlog.pending)}"):
            create_s = create_all(env, backlog, [
                appwrapper(f"gpu-{i:05d}", [configmap_item(f"gpu-{i:05d}", {"nvidia.com/gpu": "1"})])
                for i in range(n)])
            backlog.wait(lambda: len(backlog.pending) >= n, 120 + n / 10, f"{n} AppWrappers Pending",
                         ctl.check_alive)
        result["backlog"] = {"create_s": round(create_s, 1), "queued_s": round(time.monotonic() - started, 1)}
        first = f"http://127.0.0.1:{port}{DASHBOARD_QUEUE_PATH}"

        def check(answer: Answer, what: str) -> dict[str, Any]:
            if answer.code != 200:
                raise BenchError(f"{what} answered {answer.code}: {answer.body[:300]!r}")
            document: dict[str, Any] = json.loads(answer.body)
            return document

        # The controller's queue may lag the watch by a publish interval: wait until it lists the whole backlog.
        def whole_backlog() -> dict[str, Any] | None:
            document = check(http_get(first, token), DASHBOARD_QUEUE_PATH)
            return document if int(document.get("total") or 0) >= n else None

        page = wait_for(whole_backlog, 60, f"{DASHBOARD_QUEUE_PATH} listing {n} AppWrappers", interval=1.0,
                        alive=ctl.check_alive)
        rows = page.get("rows") or []
        if not rows or any(row.get("position") is None for row in rows):
            raise BenchError(f"the first page should hold queued rows only: {rows[:3]}")
        result["page"] = {"total": page.get("total"), "limit": page.get("limit"), "rows": len(rows)}
        last = f"{first}?offset={max(0, int(page['total']) - int(page.get('limit') or len(rows)))}"

        def polls(url: str, count: int, every: float) -> list[Answer]:
            answers = []
            begun = time.monotonic()
            for i in range(count):
                pause = begun + i * every - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                answers.append(http_get(url, token))
                ctl.check_alive()
            for answer in answers:
                check(answer, url)
            return answers

        say(f"dashboard: {n_polls} polls of the first page, one a second")
        polled_at = time.monotonic()
        before = ctl.stats()
        spaced = polls(first, n_polls, 1.0)
        spaced_cpu = ctl.stats()["cpu_seconds"] - before["cpu_seconds"]
        say(f"dashboard: {n_polls} polls of the first page back to back, then of the last page")
        back_to_back = polls(first, n_polls, 0.0)
        last_page = polls(last, n_polls, 0.0)
        result["wall_s"] = round(time.monotonic() - polled_at, 2)
        result["controller"] = controller_figures(ctl, baseline)
        result["controller"]["cpu_seconds_per_spaced_poll"] = round(spaced_cpu / n_polls, 4)
        every = spaced + back_to_back + last_page
        server = all(a.server_s is not None for a in every)
        result["server_time_source"] = ("the controller's Server-Timing header" if server else
                                        "client round trip on loopback (no Server-Timing header): an upper bound")

        def took(answer: Answer) -> float:
            return answer.server_s if server and answer.server_s is not None else answer.round_trip_s

        def times(answers: list[Answer]) -> dict[str, Any]:
            return summary(took(a) for a in answers)

        result["latency"] = {"first_page_polled_1_per_s": times(spaced), "first_page_back_to_back": times(back_to_back),
                             "last_page_back_to_back": times(last_page),
                             "first_page_round_trip_polled_1_per_s": summary(a.round_trip_s for a in spaced)}
        result["polls_over_target"] = {
            name: sum(1 for a in answers if took(a) * 1000 >= DASHBOARD_SERVER_MS_TARGET)
            for name, answers in (("first_page_polled_1_per_s", spaced), ("first_page_back_to_back", back_to_back),
                                  ("last_page_back_to_back", last_page))}
        sizes = [len(a.body) for a in spaced]
        result["payload_bytes"] = {"first_page_max": max(sizes), "first_page_min": min(sizes),
                                   "last_page_max": max(len(a.body) for a in last_page)}
        result["throughput"] = {"first_page_answers_per_s_back_to_back": round(
            len(back_to_back) / sum(a.round_trip_s for a in back_to_back), 1)}
        what = "server time" if server else "round trip"
        add_target(result, f"first page {what} p99, polled once a second", times(spaced).get("p99_ms"), "<",
                   DASHBOARD_SERVER_MS_TARGET, "ms")
        add_target(result, "first page payload", float(max(sizes)) / 1000, "<", DASHBOARD_PAGE_BYTES_TARGET / 1000,
                   "KB")


# ---------------------------------------------------------------------------------------------- starvation

STARVATION_NODES = 4
STARVATION_NODE_CPU = 4  # the gang is one pod of all of a node's cpu on every node: it needs the cluster empty
STARVATION_RUNS = 3
# Small ones' run times, uniform, at every scale: the gang is created once every cpu is taken at once, and with
# shorter ones the gap between a small one's end and the next one's dispatch leaves some cpu free too often for that
# to happen (at a quarter of these, 24 cpus took 40 s to be seen all taken on an idle machine, over 120 s on a busy
# one).
STARVATION_RUNTIME_S = (2.0, 8.0)
STARVATION_BACKLOG = 8  # small ones kept queued at all times, ready to take any cpu that frees
STARVATION_WAIT_S = 30.0  # a gang not dispatched by then is recorded as starved
STARVATION_MARGIN_S = 2.0  # the target: gang time to dispatch <= longest blocking run time + this
STARVATION_SEED = 17
STARVATION_GANG_PRIORITY = 10


def wait_until(tracker: Tracker, check: Callable[[], bool], deadline: float, alive: Callable[[], None]) -> bool:
    """Wait on watch events until ``check()`` (evaluated with the tracker's lock held) or ``deadline``; whether
    it held. Unlike ``Tracker.wait``, running out of time is an outcome here, not an error."""
    with tracker.cond:
        while not check():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            tracker.cond.wait(min(left, 0.5))
            alive()
    return True


def starvation(opts: Options, result: Result, *, spare: int = 0, scenario: str = "starvation") -> None:
    """A gang behind a stream of small ones (what reservations are for). 4 nodes x 4 cpu; a feeder keeps
    STARVATION_BACKLOG small AppWrappers (priority 0, one bare 1-cpu Pod each) queued at all times, and each small one
    is deleted its run time (uniform 2-8 s, seeded) after it is first seen Running, so the cluster stays full and every
    cpu that frees has takers. Once it has been full for the longest run time, one gang is created: priority 10, a Job
    of 4 pods x 4 cpu, which fits only on an empty cluster. Its time to dispatch (create returned -> seen Running) is
    compared with the longest remaining run time of the small ones running when it was created (it must wait for them
    all; later small ones need not delay it): margin = time to dispatch - that run time, target <= 2 s. A gang not
    dispatched within STARVATION_WAIT_S is recorded as starved (target missed). The gang is deleted and the cluster
    refilled before the next run.

    Small ones are bare Pods, not ConfigMaps with custompodresources: a gang must wait for pods to leave concrete
    nodes (what --fit=nodes and node reservations decide on), and kube-scheduler places them as it would.

    ``spare`` more nodes (``starvation_spare``: 2) give the small ones room the gang's reservation does not hold: mcad
    dispatches them there while the gang waits, and only placement that binds (--placement=binding) keeps their pods off
    the reserved nodes, which the scheduler, left to itself, prefers as they empty. The blocking run time is then still
    the longest of every small one running at the gang's creation (the nodes each runs on are not told apart), which can
    only make the margin look smaller than it is."""
    f = opts.factor(scenario)
    low, high = STARVATION_RUNTIME_S
    runs = scaled(STARVATION_RUNS, f)
    wait_s = STARVATION_WAIT_S
    slots = (STARVATION_NODES + spare) * STARVATION_NODE_CPU
    rng = random.Random(STARVATION_SEED)
    result["params"] = {"nodes": STARVATION_NODES + spare, "spare_nodes": spare, "node_cpu": STARVATION_NODE_CPU,
                        "gangs": runs,
                        "gang": f"{STARVATION_NODES} pods x {STARVATION_NODE_CPU} cpu, priority "
                                f"{STARVATION_GANG_PRIORITY}",
                        "small_runtime_s": f"{low:g}-{high:g}", "backlog": STARVATION_BACKLOG,
                        "gang_wait_s": wait_s, "seed": STARVATION_SEED}
    with Env(scenario, opts, result) as env:
        env.nodes(STARVATION_NODES + spare, cpu=str(STARVATION_NODE_CPU), memory="16Gi", pods=110)
        ctl = env.controller("controller")
        result["controller_ready_s"] = round(warmup(env, ctl), 2)
        baseline = ctl.stats()
        api = env.api
        runtime: dict[str, float] = {}  # small ones, from when they are created
        ends: dict[str, float] = {}  # small ones: first seen Running + run time (the scheduled finish)
        errors: list[BaseException] = []
        finisher: Finisher | None = None

        def on_running(name: str, seen: float) -> None:
            if name in runtime and finisher is not None:
                with tracker.cond:
                    ends[name] = seen + runtime[name]
                finisher.at(ends[name], name)

        tracker = Tracker(on_running=on_running)
        finisher = Finisher(api, tracker).start()
        finished = finisher.finished
        env.watch(watch_appwrappers(api, tracker))
        # Each gang's pods first seen Running: a dispatched gang whose pods cannot all be placed was let through
        # onto room a small one took.
        gang_pods: dict[str, dict[str, float]] = {}

        def on_pod(etype: str, obj: Obj, seen: float) -> None:
            meta = obj.get("metadata") or {}
            owner = (meta.get("labels") or {}).get(AW_LABEL, "")
            if owner.startswith("gang-") and etype != "DELETED" and (obj.get("status") or {}).get("phase") == "Running":
                with tracker.cond:
                    gang_pods.setdefault(owner, {}).setdefault(meta["name"], seen)
                    tracker.cond.notify_all()

        def pods_running(gang: str) -> Callable[[], bool]:
            return lambda: len(gang_pods.get(gang, {})) >= STARVATION_NODES

        env.watch(Watch(api, f"/api/v1/namespaces/{NAMESPACE}/pods", on_pod, AW_LABEL, name="watch-pods").start())
        stop = threading.Event()

        def running_now() -> list[str]:  # with tracker.cond held
            return [name for name in ends if name not in finished]

        def feed() -> None:
            i = 0
            while not stop.is_set():
                with tracker.cond:
                    if len(runtime) - len(ends) >= STARVATION_BACKLOG:
                        tracker.cond.wait(0.2)
                        continue
                    name = f"small-{i:05d}"
                    runtime[name] = rng.uniform(low, high)
                i += 1
                try:
                    api.create(aw_path(), appwrapper(name, [pod_item(name, "1")], priority=0))
                except BaseException as err:
                    errors.append(err)
                    return
                tracker.mark_created(name, time.monotonic())

        def alive() -> None:
            ctl.check_alive()
            if errors or finisher.errors:
                raise BenchError(f"starvation: a request failed: {(errors or finisher.errors)[0]}")

        def fill() -> None:
            def full() -> None:
                tracker.wait(lambda: len(running_now()) >= slots, 120, f"{slots} small AppWrappers running at once",
                             alive)

            full()
            # Full for a while, so that the running set has the spread of remaining run times of a steady stream;
            # then the gang comes at a moment when every cpu is taken.
            time.sleep(high)
            full()

        def line() -> str:
            with tracker.cond:
                return (f"small created {len(runtime)}, dispatched {len(ends)}, finished {len(finished)}, "
                        f"running now {len(running_now())}; gangs done {len(report)}/{runs}")

        report: list[dict[str, Any]] = []
        result["runs"] = report
        feeder = threading.Thread(target=feed, daemon=True, name="feeder")
        started = time.monotonic()
        feeder.start()
        try:
            with Progress(scenario, line):
                for r in range(runs):
                    say(f"starvation: run {r + 1}/{runs}: filling the cluster with small AppWrappers")
                    fill()
                    gang = f"gang-{r}"
                    api.create(aw_path(), appwrapper(gang, [job_item(gang, str(STARVATION_NODE_CPU),
                                                                     pods=STARVATION_NODES)],
                                                     priority=STARVATION_GANG_PRIORITY))
                    created = time.monotonic()
                    tracker.mark_created(gang, created)
                    with tracker.cond:
                        blocking = {name: max(0.0, ends[name] - created) for name in running_now()}
                    longest = max(blocking.values(), default=0.0)
                    say(f"starvation: {gang} created behind {len(blocking)} small ones, the longest ends in "
                        f"{longest:.1f} s; waiting up to {wait_s:g} s")
                    dispatched = wait_until(tracker, has(tracker.running, gang, tracker.failed), created + wait_s,
                                            alive) and gang in tracker.running
                    until = tracker.running[gang] if dispatched else time.monotonic()
                    placed = dispatched and wait_until(tracker, pods_running(gang), until + wait_s, alive)
                    with tracker.cond:
                        overtook = sum(1 for name, seen in tracker.running.items()
                                       if name in runtime and created < seen <= until)
                    entry: dict[str, Any] = {
                        "gang": gang, "dispatched": dispatched,
                        "time_to_dispatch_s": round(until - created, 2) if dispatched else None,
                        "waited_s": round(until - created, 2),
                        "longest_blocking_runtime_s": round(longest, 2), "blocking_small": len(blocking),
                        "margin_s": round(until - created - longest, 2) if dispatched else None,
                        "small_dispatched_meanwhile": overtook,
                        "blocking_remaining_s": sorted(round(t, 2) for t in blocking.values()),
                        "pods_running_s": round(max(gang_pods[gang].values()) - created, 2) if placed else None}
                    if dispatched and not placed:
                        result.setdefault("notes", []).append(
                            f"{gang}: dispatched, but only {len(gang_pods.get(gang, {}))} of its {STARVATION_NODES} "
                            f"pods Running within {wait_s:g} s after")
                    if gang in tracker.failed:
                        entry["failed"] = tracker.failed[gang]
                    report.append(entry)
                    say(f"starvation: {gang} " + (f"dispatched after {entry['time_to_dispatch_s']} s (margin "
                                                  f"{entry['margin_s']} s)" if dispatched else
                                                  f"NOT dispatched within {wait_s:g} s")
                        + f"; {overtook} small ones dispatched meanwhile")
                    api.delete(aw_path(gang))
                    tracker.wait(has(tracker.deleted, gang), 60, f"{gang} deleted", alive)
        finally:
            stop.set()
            feeder.join(timeout=10)
            finisher.stop()
        result["wall_s"] = round(time.monotonic() - started, 2)
        result["controller"] = controller_figures(ctl, baseline)
        smalls = list(ends)
        result["latency"] = {"small_time_to_dispatch": summary(tracker.latencies(smalls, tracker.running))}
        done = [e for e in report if e["dispatched"]]
        if done:
            result["latency"]["gang_time_to_dispatch"] = summary(e["time_to_dispatch_s"] for e in done)
        starved = len(report) - len(done)
        margins = [e["margin_s"] for e in done]
        if starved:
            # A lower bound of the worst margin: the gang waited this long and was still not dispatched.
            worst = max(e["waited_s"] - e["longest_blocking_runtime_s"] for e in report if not e["dispatched"])
        else:
            worst = max(margins)
        result["starvation"] = {"gangs": len(report), "dispatched": len(done), "starved": starved,
                                "worst_margin_s": round(worst, 2), "worst_margin_is_lower_bound": bool(starved)}
        add_target(result, f"worst gang margin over its longest blocking run time ({len(done)}/{len(report)} "
                           f"dispatched within {wait_s:g} s)", worst, "<=", STARVATION_MARGIN_S, "s")
        if starved:
            result["targets"][-1]["met"] = False


# ---------------------------------------------------------------------------------------------- scale

SCALE_CREATE_THREADS = 48  # creates of the backlog, before any controller runs: the API server is the bound
SCALE_KEPT_PROBES = 3  # probes left Running across the restart, to check the new controller does not redo them
SCALE_RSS_TARGET_MIB = 1024.0
SCALE_PROBE_P99_TARGET_MS = 200.0
SCALE_RESTART_TARGET_S = 30.0
SCALE_WATCHED_EVERY_S = 0.5  # probes with the dashboard open: one this often
# kwok renews a node's Lease every quarter of its duration: with localcluster's 40 s, 500 nodes cost the API server
# ~68 writes/s (measured), 5,000 nodes ~680/s, more than the creates of the backlog get. 400 s brings 5,000 nodes
# to ~50/s; kube-controller-manager's node grace period follows (hack/localcluster.py --node-lease-seconds).
SCALE_NODE_LEASE_S = 400
AW_WRITE = re.compile(r"^\S+ appwrappers\.workload\.codeflare\.dev(/|$)")


def _appwrapper_writes(counts: Counter[str]) -> dict[str, int]:
    """The AppWrapper writes (any subresource) in an ``api_writes`` difference."""
    return {k: v for k, v in sorted(counts.items()) if v > 0 and AW_WRITE.match(k)}


def scale(opts: Options, result: Result) -> None:
    """Scale: N AppWrappers that can never fit (1 nvidia.com/gpu each, no GPUs) on M kwok nodes,
    created before the controller starts (so its first start is a cold sync of the whole backlog); then the
    controller's RSS with all of them queued, a new admissible AppWrapper's create -> Running one at a time,
    the dashboard's first page and /debug/queue answer times and sizes, and a restart: SIGTERM, a new controller,
    process start -> a new AppWrapper Running, its RSS, and the AppWrapper writes it makes at startup (the
    backlog's watch events after the restart: should be none). Nothing of the backlog may be dispatched and no
    probe kept Running across the restart may be dispatched again."""
    f = opts.factor("scale")
    n = scaled(100_000, f)
    n_nodes = scaled(5000, f)
    n_probes = scaled(50, f, minimum=10)
    n_polls = scaled(30, f, minimum=5)
    result["params"] = {"queued_appwrappers": n, "nodes": n_nodes, "node_cpu": 1, "probes": n_probes,
                        "polls_each": n_polls, "create_threads": SCALE_CREATE_THREADS}
    result["params"]["node_lease_seconds"] = SCALE_NODE_LEASE_S
    with Env("scale", opts, result, node_lease_seconds=SCALE_NODE_LEASE_S) as env:
        api = env.api
        env.nodes(n_nodes, cpu="1", memory="4Gi", pods=110)
        # kwok renews every node's Lease (and now and then its status): what the nodes cost the API server, over
        # the creation of the backlog and the cold start.
        beats_from, beats_at = api_writes(api), time.monotonic()
        backlog = Tracker()
        after_restart = threading.Event()
        events_after = [0]
        kept: list[str] = []  # probes left Running across the restart
        kept_events: Counter[str] = Counter()  # their watch events after the restart, by name

        def on_backlog(etype: str, obj: Obj, seen: float) -> None:
            if after_restart.is_set():
                name = obj["metadata"]["name"]
                if PROBE_LABEL not in ((obj.get("metadata") or {}).get("labels") or {}):
                    events_after[0] += 1
                elif name in kept:
                    kept_events[name] += 1
            backlog.on_aw(etype, obj, seen)

        env.watch(Watch(api, aw_path(), on_backlog, name="watch-backlog").start())
        names = [f"gpu-{i:06d}" for i in range(n)]
        say(f"scale: creating {n} AppWrappers that cannot fit, before the controller starts")
        started = time.monotonic()
        with Progress("scale", lambda: f"created {len(backlog.created)}/{n}"):
            run_parallel(lambda name: (api.create(aw_path(), appwrapper(name, [configmap_item(
                name, {"nvidia.com/gpu": "1"})])), backlog.mark_created(name, time.monotonic())),
                names, SCALE_CREATE_THREADS)
        create_s = time.monotonic() - started
        result["backlog"] = {"create_s": round(create_s, 1), "create_rate_per_s": round(n / create_s, 1)}

        port = webhooks_mod.free_port()
        # Unpaced (every Backoff written at once, in the low lane): the default pace would take n / 10 s to write
        # the backlog's statuses, and the restart below must find them all written; it is also the harder cold
        # start for a new AppWrapper, whose dispatch then competes with n status writes.
        # At info: its log names the loop's slow keys and the slow garbage collections (``stalls`` below).
        ctl = env.controller("controller", args=(*UNPACED, *opts.controller_args,
                                                 "--http-bind-address", f"127.0.0.1:{port}"), log_level="info")
        say(f"scale: controller started over {n} AppWrappers; waiting for its first dispatch and the backlog Pending")
        with Progress("scale", lambda: f"seen Pending {len(backlog.pending)}/{n}"):
            result["cold_start"] = {"start_to_first_dispatch_s": round(warmup(env, ctl, timeout=300 + n / 100), 2)}
            backlog.wait(lambda: len(backlog.pending) >= n, 300 + n / 20, f"{n} AppWrappers Pending",
                         ctl.check_alive)
        result["cold_start"]["start_to_backlog_pending_s"] = round(time.monotonic() - ctl.started_mono, 1)
        beats = api_writes(api) - beats_from
        result["heartbeat_writes_per_s"] = round(
            sum(v for k, v in beats.items() if HEARTBEATS.match(k)) / (time.monotonic() - beats_at), 1)
        result["controller_queued"] = {"rss_mib": settled_rss(ctl), **controller_figures(ctl)}

        probe = Tracker()
        env.watch(watch_appwrappers(api, probe, f"{PROBE_LABEL}=true"))

        def create_probe(name: str) -> float:
            api.create(aw_path(), appwrapper(name, [configmap_item(name, {"cpu": "100m"})],
                                             labels={PROBE_LABEL: "true"}))
            t = time.monotonic()
            probe.mark_created(name, t)
            return t

        say(f"scale: {n_probes} new admissible AppWrappers, one at a time")
        probe_lat: list[float] = []
        for i in range(n_probes):
            name = f"probe-{i:03d}"
            t = create_probe(name)
            probe.wait(has(probe.running, name), 60, f"{name} Running", ctl.check_alive)
            probe_lat.append(probe.running[name] - t)
            if i < n_probes - SCALE_KEPT_PROBES:
                api.delete(aw_path(name))
                probe.wait(has(probe.deleted, name), 60, f"{name} deleted", ctl.check_alive)
        kept.extend(f"probe-{i:03d}" for i in range(max(0, n_probes - SCALE_KEPT_PROBES), n_probes))
        result["latency"] = {"new_appwrapper_create_to_running": summary(probe_lat)}

        token = _scale_reads(env, ctl, port, n, n_polls, result)

        # The same probes with the dashboard open: its first page polled once a second, so the controller builds a
        # snapshot of the whole queue (on its loop, then formatted off it) as often as its spacing allows.
        say(f"scale: {n_probes} more, one at a time, while the dashboard's first page is polled once a second")
        stop_polling = threading.Event()
        polled: Counter[str] = Counter()

        def poll_page() -> None:
            while not stop_polling.is_set():
                try:
                    polled[str(http_get(f"http://127.0.0.1:{port}{DASHBOARD_QUEUE_PATH}", token).code)] += 1
                except OSError as err:  # counted: the probes are what is measured here
                    polled[type(err).__name__] += 1
                stop_polling.wait(1.0)

        poller = threading.Thread(target=poll_page, name="dashboard-poller", daemon=True)
        poller.start()
        watched_lat: list[float] = []
        begun = time.monotonic()
        try:
            for i in range(n_probes):
                # One every SCALE_WATCHED_EVERY_S, not back to back: spread over the builds' spacing, so that some
                # arrive while the loop builds a snapshot, as they would.
                pause = begun + i * SCALE_WATCHED_EVERY_S - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                name = f"watched-{i:03d}"
                t = create_probe(name)
                probe.wait(has(probe.running, name), 60, f"{name} Running", ctl.check_alive)
                watched_lat.append(probe.running[name] - t)
                api.delete(aw_path(name))
                probe.wait(has(probe.deleted, name), 60, f"{name} deleted", ctl.check_alive)
        finally:
            stop_polling.set()
            poller.join(35)
        result["latency"]["new_appwrapper_create_to_running_dashboard_open"] = summary(watched_lat)
        result["reads"]["dashboard_polls_during_probes"] = dict(polled)

        # The restart.
        stamps = {name: (api.get(aw_path(name)).get("status") or {}).get("controllerfirstdispatchtimestamp")
                  for name in kept}
        result["controller"] = controller_figures(ctl)
        result["stalls"] = stalls(ctl)
        ctl.stop()
        writes_before = settled_api_writes(api)
        after_restart.set()
        say("scale: SIGTERM sent; starting a new controller and creating one new AppWrapper")
        # At info: its log says when each informer listed and when the dispatcher started (a few lines).
        second = env.controller("controller-2", args=(*UNPACED, *opts.controller_args), log_level="info")
        name = "restart-probe"
        create_probe(name)
        probe.wait(has(probe.running, name), 300, "the restarted controller to dispatch a new AppWrapper",
                   second.check_alive)
        first_dispatch = probe.running[name] - second.started_mono
        writes = settled_api_writes(api, timeout=30) - writes_before
        redispatched = [k for k in kept if (api.get(aw_path(k)).get("status") or {}).get(
            "controllerfirstdispatchtimestamp") != stamps[k]]
        dispatched_backlog = sum(1 for x in backlog.running if x.startswith("gpu-"))
        result["restart"] = {
            "start_to_first_dispatch_s": round(first_dispatch, 3),
            "create_to_first_dispatch_s": round(probe.running[name] - probe.created[name], 3),
            "backlog_events_after_restart": events_after[0],
            "appwrapper_writes_after_restart": _appwrapper_writes(writes),
            "kept_probes_redispatched": len(redispatched),
            "kept_probe_events_after_restart": dict(kept_events),
            "backlog_dispatched": dispatched_backlog,
            "phases_s": restart_phases(second),
            "rss_mib": settled_rss(second), **controller_figures(second)}
        result["wall_s"] = round(time.monotonic() - started, 2)
        if dispatched_backlog or redispatched:
            raise BenchError(f"dispatched twice or wrongly: {dispatched_backlog} of the backlog Running, "
                             f"kept probes re-dispatched: {redispatched}")
        add_target(result, "peak RSS (VmHWM) with the backlog queued", result["controller_queued"]["peak_rss_mib"],
                   "<", SCALE_RSS_TARGET_MIB, "MiB")
        add_target(result, "p99 new AppWrapper create -> Running", summary(probe_lat).get("p99_ms"), "<",
                   SCALE_PROBE_P99_TARGET_MS, "ms")
        add_target(result, "p99 new AppWrapper create -> Running, dashboard open",
                   summary(watched_lat).get("p99_ms"), "<", SCALE_PROBE_P99_TARGET_MS, "ms")
        add_target(result, "restart: start -> first dispatch", first_dispatch, "<", SCALE_RESTART_TARGET_S, "s")


def stalls(ctl: Controller) -> dict[str, Any]:
    """What held the controller's loop or the whole process 100 ms or more, from its info log: work-queue keys
    (by kind: how many, the longest) and garbage collections."""
    keys: dict[str, list[float]] = {}
    collections: list[float] = []
    for raw in ctl.log.read_text(errors="replace").splitlines():
        if "slow" not in raw:
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if line.get("event") == "slow work-queue key":
            keys.setdefault(str(line.get("key")), []).append(float(line.get("ms") or 0))
        elif line.get("event") == "slow garbage collection":
            collections.append(float(line.get("seconds") or 0))
    return {"keys": {kind: {"n": len(ms), "max_ms": max(ms)} for kind, ms in sorted(keys.items())},
            "collections": {"n": len(collections), "max_s": max(collections, default=0.0)}}


def restart_phases(ctl: Controller) -> dict[str, float]:
    """Seconds from the process's start to each step of its start-up, read from its info log: each informer listed,
    the start-up's objects frozen, the dispatcher started."""
    phases: dict[str, float] = {}
    for raw in ctl.log.read_text(errors="replace").splitlines():
        try:
            line = json.loads(raw)
            stamp = datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        event = line.get("event")
        name = {"informer listed": f"listed {line.get('informer')}", "dispatcher started": "dispatcher started",
                "objects of the start-up frozen; garbage collector on": "heap frozen"}.get(str(event))
        if name is not None and name not in phases:
            phases[name] = round(stamp - ctl.started_wall, 3)
    return phases


MCADCTL_QUEUE_LIMIT = 1000  # the page `mcadctl queue` asks for unless told (mcad.cli.mcadctl.DEFAULT_QUEUE_LIMIT)


def _scale_reads(env: Env, ctl: Controller, port: int, n: int, n_polls: int, result: Result) -> str:
    """The dashboard's first page, polled once a second, then /debug/queue back to back, first a page of what
    ``mcadctl queue`` asks (``MCADCTL_QUEUE_LIMIT`` rows), then the whole document: answer times (the
    server's own, from Server-Timing, when sent) and payload sizes, over a queue of ``n``. Returns the reader's
    token."""
    token = reader_token(env.api, urls=("/debug/*", "/metrics", "/ui/*"))
    first = f"http://127.0.0.1:{port}{DASHBOARD_QUEUE_PATH}"
    debug = f"http://127.0.0.1:{port}/debug/queue"

    def ok(answer: Answer, what: str) -> Answer:
        if answer.code != 200:
            raise BenchError(f"{what} answered {answer.code}: {answer.body[:300]!r}")
        return answer

    def whole_backlog() -> bool:
        document = json.loads(ok(http_get(first, token), DASHBOARD_QUEUE_PATH).body)
        return int(document.get("total") or 0) >= n

    wait_for(whole_backlog, 120, f"{DASHBOARD_QUEUE_PATH} listing {n} AppWrappers", interval=1.0,
             alive=ctl.check_alive)
    say(f"scale: {n_polls} polls of the dashboard's first page (1/s), then {n_polls} reads of /debug/queue")
    page: list[Answer] = []
    begun = time.monotonic()
    for i in range(n_polls):
        pause = begun + i - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # the page's own poll interval
        page.append(ok(http_get(first, token), DASHBOARD_QUEUE_PATH))
        ctl.check_alive()
    # Not checked: a reader that gets no snapshot within the controller's wait is answered 503 "busy, retry" (at
    # 100,000 queued, builds are spaced by ten times their cost); those are counted, not failed on.
    before = ctl.stats()
    pages = [http_get(f"{debug}?limit={MCADCTL_QUEUE_LIMIT}", token) for _ in range(n_polls)]  # mcadctl queue's
    page_cpu = ctl.stats()["cpu_seconds"] - before["cpu_seconds"]
    before = ctl.stats()
    answers = [http_get(debug, token) for _ in range(n_polls)]
    debug_cpu = ctl.stats()["cpu_seconds"] - before["cpu_seconds"]
    queue = [a for a in answers if a.code == 200]
    codes = Counter(str(a.code) for a in answers)
    paged = [a for a in pages if a.code == 200]

    def took(a: Answer) -> float:
        return a.server_s if a.server_s is not None else a.round_trip_s

    result["latency"].update({
        "dashboard_first_page_polled_1_per_s": summary(took(a) for a in page),
        "dashboard_first_page_round_trip": summary(a.round_trip_s for a in page),
        "debug_queue_round_trip_back_to_back": summary(a.round_trip_s for a in queue),
        "debug_queue_round_trip_any_answer": summary(a.round_trip_s for a in answers),
        "debug_queue_page_round_trip_back_to_back": summary(a.round_trip_s for a in paged)})
    result["reads"] = {"dashboard_first_page_bytes": max(len(a.body) for a in page),
                       "dashboard_server_timing": all(a.server_s is not None for a in page),
                       "debug_queue_answers": dict(codes),
                       "debug_queue_bytes": max((len(a.body) for a in queue), default=0),
                       "debug_queue_controller_cpu_s_per_read": round(debug_cpu / n_polls, 3),
                       "debug_queue_page_rows": MCADCTL_QUEUE_LIMIT,
                       "debug_queue_page_answers": dict(Counter(str(a.code) for a in pages)),
                       "debug_queue_page_bytes": max((len(a.body) for a in paged), default=0),
                       "debug_queue_page_controller_cpu_s_per_read": round(page_cpu / n_polls, 3)}
    return token


# Run only when named (--scenarios): Kueue's TAS shape and the cost of racks, each with hundreds to thousands of
# nodes, are comparisons of their own rather than part of every `make bench`.
OPT_IN = ("churn_tas", "deep_queue_racks", "throughput_racks")

SCENARIOS: dict[str, Callable[[Options, Result], None]] = {
    "ceiling": ceiling,
    "throughput": throughput,
    "throughput_webhooks": throughput_webhooks,
    "placement": placement,
    "deep_queue": deep_queue,
    "churn": churn,
    "churn_pods": functools.partial(churn, workload=CHURN_JOB, scenario="churn_pods"),
    "churn_tas": functools.partial(churn, scenario="churn_tas", tas=True),
    "deep_queue_racks": deep_queue_racks,
    "throughput_racks": throughput_racks,
    "restart": restart,
    "noisy_neighbour": noisy_neighbour,
    "memory": memory,
    "admission": admission,
    "admission_attack": admission_attack,
    "pollers": pollers,
    "starvation": starvation,
    "starvation_spare": functools.partial(starvation, spare=2, scenario="starvation_spare"),
    "dashboard": dashboard,
    "scale": scale,
}
