"""What every scenario needs: a fresh local cluster, the CRD, fake nodes, the controller as its own process,
a tracker of AppWrapper and pod states fed by watches, statistics and progress lines.

Nothing here is specific to a scenario. Every process this module starts is stopped by the object that started
it (``Cluster.down``, ``Controller.stop``), and the scenarios call those from ``finally`` blocks.
"""

from __future__ import annotations

import compileall
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from test.perf.client import Api, ApiError, Obj, Watch
from test.support import REPO, load_hack_module

GROUP, VERSION, PLURAL = "workload.codeflare.dev", "v1beta1", "appwrappers"
API_VERSION = f"{GROUP}/{VERSION}"
CRD = REPO / "config" / "crd" / "workload.codeflare.dev_appwrappers.yaml"
QUOTA_CRD = REPO / "config" / "crd" / "quota.codeflare.dev_quotasubtrees.yaml"
LOGS = REPO / ".dev" / "bench-logs"
AW_LABEL = "workload.codeflare.dev/appwrapper"
PROBE_LABEL = "mcad-bench/probe"
NAMESPACE = "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def dev_cache() -> Path:
    """Where slow builds are cached outside the repository, keyed by version (as hack/build-tools.sh does)."""
    return Path(os.environ.get("MCAD_DEV_CACHE") or Path.home() / ".cache" / "mcad-dev")


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A scenario could not complete; the message says what was waited for."""


# ---------------------------------------------------------------------------------------------- statistics


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an already sorted list."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summary(values: Iterable[float]) -> dict[str, Any]:
    """n, p50, p90, p99, max, mean, min of latencies in seconds, reported in milliseconds."""
    v = sorted(values)
    if not v:
        return {"n": 0}
    ms = 1000.0
    return {"n": len(v), "p50_ms": round(percentile(v, 50) * ms, 1), "p90_ms": round(percentile(v, 90) * ms, 1),
            "p99_ms": round(percentile(v, 99) * ms, 1), "max_ms": round(v[-1] * ms, 1),
            "mean_ms": round(sum(v) / len(v) * ms, 1), "min_ms": round(v[0] * ms, 1)}


# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom; past 30 the last one (a little wider than
# the true quantile, never narrower).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_interval(values: Iterable[float]) -> tuple[float, float, float] | None:
    """The mean of ``values`` and the 95 % confidence interval of it (Student's t: the values taken as independent
    draws from one normal distribution), or None for fewer than two values. A run-to-run spread of several points
    makes a single pair's ratio say little; this says how far the mean of the pairs can be trusted."""
    v = list(values)
    if len(v) < 2:
        return None
    mean = statistics.fmean(v)
    half = _T95[min(len(v) - 1, len(_T95)) - 1] * statistics.stdev(v, mean) / math.sqrt(len(v))
    return mean, mean - half, mean + half


def scaled(count: float, scale: float, minimum: int = 1) -> int:
    return max(minimum, round(count * scale))


# ---------------------------------------------------------------------------------------------- cluster


class Cluster:
    """``hack/localcluster.py --name NAME``: a fresh control plane with no nodes and raised in-flight limits."""

    def __init__(self, name: str, *, max_inflight: int = 2000, max_mutating_inflight: int = 1000,
                 node_lease_seconds: int | None = None) -> None:
        self.name = name
        self.node_lease_seconds = node_lease_seconds  # None: localcluster's default
        self.max_inflight = max_inflight
        self.max_mutating_inflight = max_mutating_inflight
        self.kubeconfig = str(REPO / ".dev" / f"kubeconfig-{name}")
        self.started = False

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "NODES": "0"}
        env.pop("CLUSTER_NAME", None)
        return subprocess.run([sys.executable, str(REPO / "hack" / "localcluster.py"), "--name", self.name, *args],
                              env=env, text=True, capture_output=True, timeout=timeout, check=False)

    def up(self) -> None:
        # Always fresh: a cluster left by an interrupted run would carry its objects into this one.
        self._run("down", timeout=120)
        self.started = True
        proc = self._run("up", "--nodes", "0", "--max-requests-inflight", str(self.max_inflight),
                         "--max-mutating-requests-inflight", str(self.max_mutating_inflight),
                         *(("--node-lease-seconds", str(self.node_lease_seconds)) if self.node_lease_seconds else ()),
                         timeout=900)
        if proc.returncode != 0:
            raise BenchError(f"cluster {self.name} did not come up:\n{proc.stderr[-3000:]}")

    def down(self) -> None:
        if self.started:
            proc = self._run("down", timeout=120)
            if proc.returncode != 0:
                say(f"warning: taking cluster {self.name} down failed: {proc.stderr[-500:]}")
            self.started = False

    @property
    def logs(self) -> Path:
        return REPO / ".dev" / "clusters" / self.name / "logs"

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (utime+stime) so far of each control-plane process (etcd, kube-apiserver, ...): where the
        machine's time goes, next to the controller's."""
        try:
            state = json.loads((REPO / ".dev" / "clusters" / self.name / "state.json").read_text())
            pids = {str(k): int(v) for k, v in state["pids"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}
        out = {}
        for component, pid in pids.items():
            figures = proc_stats(pid)
            if "cpu_seconds" in figures:
                out[component] = figures["cpu_seconds"]
        return out


def install_crd(api: Api, path: Path = CRD) -> None:
    """Install the CRD at ``path`` (the AppWrapper's unless told) and wait until it is established and served."""
    body = yaml.safe_load(path.read_text())
    name = body["metadata"]["name"]
    api.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", body, "mcad-bench")

    def established() -> bool:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in (crd.get("status") or {}).get("conditions") or [])

    spec = body["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("served"))
    wait_for(established, 60, f"the CRD {name} to be established")
    # Established can precede the discovery of the new group by a moment.
    wait_for(lambda: _served(api, f"{spec['group']}/{version}", spec["names"]["plural"]), 60,
             f"the API of {name} to be served")


def _served(api: Api, group_version: str = API_VERSION, plural: str = PLURAL) -> bool:
    try:
        api.get(f"/apis/{group_version}/namespaces/default/{plural}", {"limit": "1"})
    except ApiError:
        return False
    return True


def create_namespace(api: Api, name: str = NAMESPACE) -> None:
    try:
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiError as err:
        if err.status != 409:
            raise

    def has_sa() -> bool:
        try:
            api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
        except ApiError:
            return False
        return True

    # Pods cannot be created in a namespace before its default ServiceAccount exists.
    wait_for(has_sa, 60, f"the default ServiceAccount of namespace {name}")


def create_nodes(api: Api, count: int, *, cpu: str = "8", memory: str = "32Gi", gpu: int = 0, pods: int = 110,
                 threads: int = 16, timeout: float = 600, names: list[str] | None = None,
                 labels: Callable[[int], dict[str, str]] | None = None) -> float:
    """Create ``count`` kwok nodes in parallel and wait until all are Ready and untainted; returns seconds taken.
    ``names`` replaces the default names (``kwok-node-<i>``); ``labels(i)`` adds labels to node i (over the fake
    node's own, ``kubernetes.io/hostname`` among them)."""
    lc = load_hack_module("localcluster")
    started = time.monotonic()
    names = names if names is not None else [f"kwok-node-{i}" for i in range(count)]
    if len(names) != count:
        raise BenchError(f"{len(names)} node names for {count} nodes")
    extra = {name: labels(i) for i, name in enumerate(names)} if labels else {}

    def create(name: str) -> None:
        body = lc.fake_node(name, cpu, memory, gpu, pods)
        body["metadata"]["labels"].update(extra.get(name, {}))
        try:
            api.create("/api/v1/nodes", body)
        except ApiError as err:
            if err.status != 409:
                raise

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, names))
    say(f"created {count} nodes in {time.monotonic() - started:.1f} s; waiting for Ready")
    wanted = set(names)
    ready_count = [0]

    def ready() -> bool:
        items, _ = api.list_all("/api/v1/nodes", page=1000)
        ok = {n["metadata"]["name"] for n in items if lc.node_ready_and_untainted(n)}
        ready_count[0] = len(ok & wanted)
        return ok >= wanted

    # Each poll lists every node: at a few nodes (Ready within ~0.2 s) poll often, at thousands (5 pages a list)
    # once a second.
    interval = min(1.0, 0.1 + count / 1000)
    with Progress("nodes", lambda: f"{ready_count[0]}/{count} Ready and untainted"):
        wait_for(ready, timeout, f"{count} nodes to be Ready and untainted", interval=interval)
    return time.monotonic() - started


def wait_for(check: Callable[[], Any], timeout: float, what: str, *, interval: float = 0.2,
             alive: Callable[[], None] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------- controller


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds (utime + stime) and peak RSS (VmHWM) of a live process; {} once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = stat.rsplit(")", 1)[1].split()
    # Fields 14 and 15 of /proc/<pid>/stat (1-based); after the ")" the 3rd field is index 0.
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    out = {"cpu_seconds": round(cpu, 2)}
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            out["peak_rss_mib"] = round(int(line.split()[1]) / 1024, 1)
        elif line.startswith("VmRSS:"):
            out["rss_mib"] = round(int(line.split()[1]) / 1024, 1)
    return out


def machine_cpu() -> dict[str, float]:
    """The machine's CPU seconds so far, every core summed (/proc/stat): ``busy`` (user, nice, system, irq,
    softirq, steal) and ``idle`` (idle, iowait), so that a window's difference says whether the cores were saturated
    ({} where /proc/stat cannot be read)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return {}
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return {"busy": (user + nice + system + irq + softirq + steal) / CLK_TCK, "idle": (idle + iowait) / CLK_TCK}


def cpu_window(before: dict[str, float], after: dict[str, float]) -> tuple[float, float] | None:
    """The machine's busy and idle CPU seconds between two ``machine_cpu()`` readings (None if either failed)."""
    if not before or not after:
        return None
    return round(after["busy"] - before["busy"], 2), round(after["idle"] - before["idle"], 2)


@functools.cache
def byte_compiled() -> bool:
    """Write the byte code of every module of the ``mcad`` package the controller will import, once per process.

    The image compiles it at build time, so an installed controller starts from byte code. A checkout does not
    have to: with ``PYTHONDONTWRITEBYTECODE`` set (as on the development machines), every controller the bench
    starts would compile mcad from its source again, about 0.1 s of CPU charged to the controller per start,
    which the installed product never pays. ``compileall`` writes the files whatever that variable says, and
    skips those whose byte code is current, so a second call costs a few stats. True when every file compiled; when
    one did not (a read-only checkout), the bench says so once and goes on, its controllers compiling as before."""
    import mcad

    package = Path(mcad.__file__).parent
    if compileall.compile_dir(package, quiet=1):
        return True
    say(f"could not write the byte code of every module under {package}: each controller started compiles them "
        f"again, about 0.1 s of CPU it would not spend installed")
    return False


class Controller:
    """mcad-controller as a separate process; its output goes to .dev/bench-logs/<name>.log."""

    def __init__(self, kubeconfig: str, name: str, *, log_level: str = "warning", args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.log = LOGS / f"{name}.log"
        self.log_level = log_level
        self.args = args
        self.env = env or {}  # set in the controller's environment on top of this process's
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_mono = 0.0
        self.started_wall = 0.0
        self.final: dict[str, float] = {}

    def start(self) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        byte_compiled()
        exe = Path(sys.executable).parent / "mcad-controller"
        argv = [str(exe), "--kubeconfig", self.kubeconfig, "--log-level", self.log_level, "--log-format", "json",
                "--http-bind-address", "127.0.0.1:0",
                # No webhooks unless the scenario asks (its args come last and win): nothing registers them here,
                # and the default :9443 of every interface would collide with other controllers on the host.
                "--no-webhook",
                *self.args]
        # setpriv execs the controller in place (same pid) with SIGTERM as its parent-death signal, so the
        # controller stops even if this process is killed before its cleanup runs.
        setpriv = shutil.which("setpriv")
        if setpriv:
            argv = [setpriv, "--pdeathsig", "TERM", "--", *argv]
        with open(self.log, "wb") as out:
            self.started_wall = time.time()
            self.started_mono = time.monotonic()
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env={**os.environ, **self.env})

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"mcad-controller exited with {self.proc.returncode}; last lines of {self.log}:\n"
                             f"{self.tail()}")

    def stats(self) -> dict[str, float]:
        return proc_stats(self.pid) if self.proc is not None and self.proc.poll() is None else dict(self.final)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> dict[str, float]:
        """Stop the process (SIGKILL if it ignores ``sig``); returns its last CPU and RSS figures."""
        if self.proc is None:
            return self.final
        if self.proc.poll() is None:
            self.final = proc_stats(self.proc.pid) or self.final
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                say(f"mcad-controller (pid {self.proc.pid}) ignored signal {sig}; killing it")
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.final

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def errors(self) -> list[str]:
        """Lines the controller logged at error level (or tracebacks)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [line[:300] for line in text.splitlines() if '"level": "error"' in line or "Traceback" in line]


# ---------------------------------------------------------------------------------------------- objects


def aw_path(name: str = "", namespace: str | None = NAMESPACE) -> str:
    """An AppWrapper's path, or its namespace's collection; ``namespace`` None: the collection of every namespace
    (for a list or a watch of all tenants)."""
    if namespace is None:
        return f"/apis/{API_VERSION}/{PLURAL}"
    base = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{base}/{name}" if name else base


def aw_collection_of(body: Obj) -> str:
    """Where ``body`` is created: its own ``metadata.namespace``, else the bench namespace (a load's path for
    AppWrappers spread over tenants)."""
    return aw_path(namespace=body["metadata"].get("namespace") or NAMESPACE)


def tenant_namespace(index: int, tenants: int) -> str:
    """The namespace of tenant ``index % tenants``: the bench namespace for tenant 0 (so one tenant is the bench's
    usual namespace, and the warm-up and probes need nothing else), ``bench-tNN`` for the others."""
    k = index % max(1, tenants)
    return NAMESPACE if k == 0 else f"{NAMESPACE}-t{k:02d}"


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when every value is equal, 1/n when one has everything;
    None for no values or all zero."""
    v = list(values)
    squares = sum(x * x for x in v)
    return round(sum(v) ** 2 / (len(v) * squares), 4) if v and squares else None


def appwrapper(name: str, items: list[Obj], *, priority: int | None = None,
               labels: dict[str, str] | None = None, namespace: str | None = None) -> Obj:
    spec: Obj = {"resources": {"GenericItems": items}}
    if priority is not None:
        spec["priority"] = priority
    meta: Obj = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = labels
    return {"apiVersion": API_VERSION, "kind": "AppWrapper", "metadata": meta, "spec": spec}


def configmap_item(name: str, requests: dict[str, str]) -> Obj:
    """A cheap wrapped object (a ConfigMap: no pods) whose demand is declared by custompodresources."""
    return {"replicas": 1, "custompodresources": [{"replicas": 1, "requests": requests, "limits": requests}],
            "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                "data": {"bench": "1"}}}


def job_item(name: str, cpu: str, *, delay: str = "1h", pods: int = 1, completionstatus: str | None = None) -> Obj:
    """A batch/v1 Job of ``pods`` pods at once (parallelism = completions); kwok completes each after ``delay``.
    ``completionstatus`` (e.g. ``"Complete"``) makes the AppWrapper Completed once its Job has that condition."""
    completion: Obj = {"completionstatus": completionstatus} if completionstatus else {}
    return {"replicas": 1, **completion, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": delay}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
                                                               "resources": {"requests": {"cpu": cpu}}}]}}}}}


def pod_item(name: str, cpu: str, node: str | None = None) -> Obj:
    """A bare Pod (it runs until deleted); ``node`` binds it directly, bypassing the scheduler."""
    spec: Obj = {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                               "spec": spec}}


# ---------------------------------------------------------------------------------------------- tracking


@dataclass
class Tracker:
    """First-seen times from watches: AppWrapper states and the first Running pod of each AppWrapper.

    Times are ``time.monotonic()``; ``created`` is filled in by the load threads right after each create call
    returns. ``on_running`` (if set) is called on the watch thread when an AppWrapper is first seen Running, and
    ``on_completed`` when it is first seen Completed.
    """

    created: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    completed: dict[str, float] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    pods_running: dict[str, float] = field(default_factory=dict)
    # status.controllerfirstdispatchtimestamp (the controller's wall clock) of each AppWrapper first seen Running
    dispatch_stamp: dict[str, str] = field(default_factory=dict)
    on_running: Callable[[str, float], None] | None = None
    on_completed: Callable[[str, float], None] | None = None
    events: int = 0
    last_event: float = 0.0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def pods_progress(self, total: int) -> str:
        """A progress line for scenarios whose AppWrappers each run a pod."""
        return (f"created {len(self.created)}/{total}, dispatched {len(self.running)}, "
                f"pods running {len(self.pods_running)}")

    def mark_created(self, name: str, when: float) -> None:
        with self.cond:
            self.created[name] = when

    def on_aw(self, etype: str, obj: Obj, seen: float) -> None:
        name = obj["metadata"]["name"]
        state = str((obj.get("status") or {}).get("state") or "")
        first_running = first_completed = False
        with self.cond:
            self.events += 1
            self.last_event = seen
            if etype == "DELETED":
                self.deleted.setdefault(name, seen)
                self.state.pop(name, None)
            else:
                self.state[name] = state
                if state == "Running" and name not in self.running:
                    self.running[name] = seen
                    self.dispatch_stamp[name] = str(obj["status"].get("controllerfirstdispatchtimestamp") or "")
                    first_running = True
                elif state == "Pending" and name not in self.pending:
                    self.pending[name] = seen
                elif state == "Failed" and name not in self.failed:
                    self.failed[name] = str((obj.get("status") or {}).get("message") or "")
                elif state == "Completed" and name not in self.completed:
                    self.completed[name] = seen
                    first_completed = True
            self.cond.notify_all()
        if first_running and self.on_running is not None:
            self.on_running(name, seen)
        if first_completed and self.on_completed is not None:
            self.on_completed(name, seen)

    def on_pod(self, etype: str, obj: Obj, seen: float) -> None:
        owner = ((obj.get("metadata") or {}).get("labels") or {}).get(AW_LABEL)
        if not owner or etype == "DELETED":
            return
        if (obj.get("status") or {}).get("phase") == "Running":
            with self.cond:
                if owner not in self.pods_running:
                    self.pods_running[owner] = seen
                    self.cond.notify_all()

    def wait(self, check: Callable[[], bool], timeout: float, what: str,
             alive: Callable[[], None] | None = None) -> None:
        """Wait (on watch events) until ``check()`` holds, with the lock held while it is evaluated."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not check():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
                self.cond.wait(min(left, 0.5))
                if alive is not None:
                    alive()

    def decision_to_seen(self, names: Iterable[str] | None = None) -> list[float]:
        """Per AppWrapper (of ``names``, else all): first seen Running minus the controller's dispatch timestamp (its
        wall clock when it decided): the status write, the watch delivery and this process's own delay, as a check
        on the method."""
        offset = time.time() - time.monotonic()
        out = []
        with self.cond:
            stamps = self.dispatch_stamp if names is None else {
                n: self.dispatch_stamp[n] for n in names if n in self.dispatch_stamp}
            for name, stamp in stamps.items():
                try:
                    decided = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
                out.append(self.running[name] + offset - decided)
        return out

    def latencies(self, names: Iterable[str], end: dict[str, float], start: dict[str, float] | None = None
                  ) -> list[float]:
        start = self.created if start is None else start
        with self.cond:
            return [end[n] - start[n] for n in names if n in end and n in start]


def watch_appwrappers(api: Api, tracker: Tracker, label_selector: str = "", *, all_namespaces: bool = False) -> Watch:
    """The bench namespace's AppWrappers (``all_namespaces``: every tenant's; names are unique across them)."""
    return Watch(api, aw_path(namespace=None if all_namespaces else NAMESPACE), tracker.on_aw, label_selector,
                 name="watch-appwrappers").start()


def watch_pods(api: Api, tracker: Tracker, *, all_namespaces: bool = False) -> Watch:
    path = "/api/v1/pods" if all_namespaces else f"/api/v1/namespaces/{NAMESPACE}/pods"
    return Watch(api, path, tracker.on_pod, AW_LABEL, name="watch-pods").start()


class Progress:
    """A progress line every ``every`` seconds from ``line()`` until stopped (use as a context manager)."""

    def __init__(self, label: str, line: Callable[[], str], every: float = 5.0) -> None:
        self.label = label
        self.line = line
        self.every = every
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"progress-{label}")

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                say(f"{self.label} +{time.monotonic() - self.started:.0f}s: {self.line()}")
            except Exception as err:
                say(f"{self.label}: progress failed: {err}")

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def run_parallel(fn: Callable[[Any], None], items: Iterable[Any], threads: int = 16) -> None:
    """Call ``fn`` on every item with a thread pool; on the first exception the rest is cancelled and it is raised."""
    pool = ThreadPoolExecutor(threads)
    try:
        for future in [pool.submit(fn, item) for item in items]:
            future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
