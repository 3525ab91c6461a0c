#!/usr/bin/env python3
"""The KubeRay operator, built from its Go module, running beside the local control plane (out of cluster).

Contract (``python3 hack/kuberay.py --help``; standard library only, like hack/localcluster.py):

  up      Install the RayCluster, RayJob and RayService CRDs of the pinned release (KUBERAY_VERSION in
          hack/versions.env, read from the Go module cache: ray-operator/config/crd/bases) with a server-side
          apply, wait until they are Established, then start ``kuberay-operator`` in the background (its own
          session; leader election off; metrics and health probe on free loopback ports) and wait for its
          /readyz. The RayCluster CRD serves ray.io/v1 (storage) and ray.io/v1alpha1, so the upstream MCAD
          example ``aw-raycluster.yaml`` (a v1alpha1 RayCluster) works verbatim. Running ``up`` while the
          operator is healthy changes nothing; CRDs already applied from the pinned release (annotation
          mcad.dev/kuberay-version) are not applied again.
  down    Stop the operator. The CRDs (and any Ray objects) stay.
  status  Say whether the operator runs; exit 1 if not.
  run     The foreground process ``up`` starts: runs the operator and stops it when the local cluster it
          serves is taken down or restarted (hack/localcluster.py removes .dev/clusters/<name>), so no
          operator outlives its API server.

State: .dev/clusters/<name>/kuberay.json (pid of the background process group, ports, version) and the log
.dev/clusters/<name>/logs/kuberay-operator.log. The binary comes from hack/build-tools.sh (built if missing).

With kwok nodes, RayCluster head and worker pods are created, scheduled and marked Running; anything that
needs the Ray dashboard (RayJob submission, RayService, the autoscaler) cannot reach the fake pod IPs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

HACK = Path(__file__).resolve().parent
MODULE = "github.com/ray-project/kuberay/ray-operator"
CRDS = ("rayclusters", "rayjobs", "rayservices")  # the operator starts a controller for each; all must exist
BINARY = "kuberay-operator"
COMPONENT = "kuberay-operator"  # log file name, beside the control plane's logs


def _load_localcluster() -> ModuleType:
    if "localcluster" in sys.modules:
        return sys.modules["localcluster"]
    spec = importlib.util.spec_from_file_location("localcluster", HACK / "localcluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["localcluster"] = module
    spec.loader.exec_module(module)
    return module


lc = _load_localcluster()


def log(message: str) -> None:
    print(f"[kuberay] {message}", file=sys.stderr, flush=True)


class KubeRayError(Exception):
    """The operator could not be brought up; the message says why and where the log is."""


# ---------------------------------------------------------------------------------------------- inputs


def pinned_version() -> str:
    for line in (HACK / "versions.env").read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == "KUBERAY_VERSION":
            return value.strip().strip('"')
    raise KubeRayError("hack/versions.env has no KUBERAY_VERSION")


def module_dir(version: str) -> Path:
    """The ray-operator module source of ``version`` in the Go module cache; downloaded if it is not there."""
    cache = os.environ.get("GOMODCACHE")
    if not cache:
        with contextlib.suppress(OSError):
            cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
    if cache and (Path(cache) / f"{MODULE}@{version}").is_dir():
        return Path(cache) / f"{MODULE}@{version}"
    log(f"downloading {MODULE}@{version} into the Go module cache (for its CRDs)")
    try:
        proc = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{version}"],
                              capture_output=True, text=True, cwd=HACK / "tools" / "kuberay")
    except OSError as err:
        raise KubeRayError(f"Go is needed to fetch the KubeRay CRDs ({MODULE}@{version}): {err}") from None
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    if proc.returncode != 0 or not info.get("Dir"):
        raise KubeRayError(f"go mod download {MODULE}@{version} failed: {info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"])


def crd_files(version: str) -> list[Path]:
    bases = module_dir(version) / "config" / "crd" / "bases"
    files = [bases / f"ray.io_{plural}.yaml" for plural in CRDS]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise KubeRayError(f"CRD files missing from the module: {', '.join(missing)}")
    return files


# ---------------------------------------------------------------------------------------------- state


def state_file(layout: Any) -> Path:
    return Path(layout.state) / "kuberay.json"


def read_state(layout: Any) -> dict[str, Any] | None:
    try:
        return json.loads(state_file(layout).read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def ours(pid: int) -> bool:
    """Is ``pid`` alive and still the `kuberay.py run` process we started (not a recycled pid)?"""
    if not lc.pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"kuberay.py") for arg in cmdline) and b"run" in cmdline


def healthy(state: dict[str, Any]) -> bool:
    return ours(int(state["pid"])) and lc.probe(f"http://127.0.0.1:{state['ports']['probe']}/readyz")


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


# ---------------------------------------------------------------------------------------------- commands


def kubectl(bin_dir: Path, kubeconfig: Path, *args: str, timeout: float = 120) -> str:
    proc = subprocess.run([str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise KubeRayError(f"kubectl {args[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


VERSION_ANNOTATION = "mcad.dev/kuberay-version"  # set on the CRDs after an apply of that release's files


def install_crds(bin_dir: Path, kubeconfig: Path, version: str) -> None:
    files = crd_files(version)
    log(f"installing the KubeRay {version} CRDs ({', '.join(CRDS)}) with a server-side apply")
    # Server-side: the RayCluster CRD (~0.9 MB) is far over the 256 KiB last-applied annotation of a client-side
    # apply. --force-conflicts: a newer pinned version takes the fields over from an older apply.
    args = ["apply", "--server-side", "--force-conflicts", "--field-manager=mcad-kuberay"]
    for f in files:
        args += ["-f", str(f)]
    kubectl(bin_dir, kubeconfig, *args)
    names = [f"crd/{plural}.ray.io" for plural in CRDS]
    wait_established(bin_dir, kubeconfig, names, timeout=60)
    kubectl(bin_dir, kubeconfig, "annotate", "--overwrite", *names, f"{VERSION_ANNOTATION}={version}")


def wait_established(bin_dir: Path, kubeconfig: Path, names: list[str], timeout: float) -> None:
    """Poll until every CRD in ``names`` has Established=True, or raise after ``timeout`` seconds.

    Not `kubectl wait --for=condition=Established`: right after a create the API server may store the CRD with
    ``status.conditions: null``, and kubectl wait then fails at once ("<nil> is of the type <nil>, expected
    []interface{}") instead of waiting (it failed CI that way).
    """
    template = ("jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Established\")].status}"
                "{\" \"}{end}")
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run([str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", "get", *names, "-o", template],
                              capture_output=True, text=True, timeout=60)
        seen = proc.stdout.strip() if proc.returncode == 0 else proc.stderr.strip()
        if proc.returncode == 0 and all(field.endswith("=True") for field in proc.stdout.split()) \
                and len(proc.stdout.split()) == len(names):
            return
        if time.monotonic() >= deadline:
            raise KubeRayError(f"the KubeRay CRDs were not Established within {timeout:.0f} s (last seen: {seen})")
        time.sleep(0.5)


def crds_current(bin_dir: Path, kubeconfig: Path, version: str) -> bool:
    """Are all the CRDs Established and applied from ``version``? Then `up` skips the apply (seconds)."""
    key = VERSION_ANNOTATION.replace(".", "\\.")
    template = ("jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Established\")].status}/"
                f"{{.metadata.annotations.{key}}}{{\" \"}}{{end}}")
    proc = subprocess.run([str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", "get",
                           *(f"crd/{plural}.ray.io" for plural in CRDS), "-o", template],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode == 0 and proc.stdout.split() == [f"True/{version}"] * len(CRDS)


def up(name: str, kubeconfig: Path, timeout: float) -> None:
    layout = lc.Layout(name)
    if not kubeconfig.is_file():
        raise KubeRayError(f"no kubeconfig at {kubeconfig}; start the cluster first: hack/local-cluster.sh "
                           f"--name {name} up")
    version = pinned_version()
    bin_dir = lc.tool_bin_dir()
    binary = bin_dir / BINARY
    if not os.access(binary, os.X_OK):
        raise KubeRayError(f"missing executable {binary} (run hack/build-tools.sh)")

    state = read_state(layout)
    running = bool(state and healthy(state))
    current = running and state is not None and state.get("version") == version \
        and state.get("kubeconfig") == str(kubeconfig)
    # The apply takes seconds (3 MB of schema): skip it when this release's CRDs are there already.
    if crds_current(bin_dir, kubeconfig, version):
        log(f"the KubeRay {version} CRDs are installed")
    else:
        install_crds(bin_dir, kubeconfig, version)
    if current and state is not None:
        log(f"the KubeRay operator {version} already runs for cluster {name!r} (pid {state['pid']})")
        return
    if state:
        if running:
            log(f"the running operator is {state.get('version')} for {state.get('kubeconfig')}; restarting it")
        stop(state)

    metrics_port, probe_port = lc.free_ports(2)
    layout.logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--name", name, "--kubeconfig", str(kubeconfig), "run",
            "--binary", str(binary), "--metrics-port", str(metrics_port), "--probe-port", str(probe_port)]
    started = time.monotonic()
    with open(layout.logs / f"{COMPONENT}.log", "ab") as out:
        # A session of its own: it outlives this script, and `down` signals the whole group (wrapper + operator).
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=layout.state)
    state = {"pid": proc.pid, "version": version, "kubeconfig": str(kubeconfig), "binary": str(binary),
             "ports": {"metrics": metrics_port, "probe": probe_port},
             "log": str(layout.logs / f"{COMPONENT}.log")}
    state_file(layout).write_text(json.dumps(state, indent=2))
    log(f"starting the KubeRay operator {version} (health on 127.0.0.1:{probe_port}, "
        f"log {layout.logs / (COMPONENT + '.log')})")
    try:
        lc.wait_for("the KubeRay operator /readyz", lambda: lc.probe(f"http://127.0.0.1:{probe_port}/readyz"),
                    timeout, layout, {COMPONENT: proc.pid}, COMPONENT)
    except BaseException:
        stop(state)
        state_file(layout).unlink(missing_ok=True)
        raise
    state["operator_pid"] = next(iter(children(proc.pid)), None)
    state_file(layout).write_text(json.dumps(state, indent=2))
    log(f"the KubeRay operator is ready in {time.monotonic() - started:.1f} s (pid {proc.pid})")


def stop(state: dict[str, Any], timeout: float = 15) -> None:
    pid = int(state["pid"])
    if not ours(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while lc.pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # whatever is left of the group (normally nothing)


def down(name: str) -> None:
    layout = lc.Layout(name)
    state = read_state(layout)
    if state is None:
        log(f"the KubeRay operator is not running for cluster {name!r}")
        return
    stop(state)
    state_file(layout).unlink(missing_ok=True)
    log(f"the KubeRay operator for cluster {name!r} stopped (its CRDs stay installed)")


def status(name: str) -> int:
    layout = lc.Layout(name)
    state = read_state(layout)
    if state is None:
        print(f"kuberay for cluster {name!r}: not running")
        return 1
    ok = healthy(state)
    print(f"kuberay for cluster {name!r}: {'up' if ok else 'DOWN'}  {state['version']}  pid {state['pid']}  "
          f"health 127.0.0.1:{state['ports']['probe']}  log {state['log']}")
    return 0 if ok else 1


def run(name: str, kubeconfig: Path, binary: Path, metrics_port: int, probe_port: int) -> int:
    """Run the operator in the foreground; stop it on SIGTERM/SIGINT or when the local cluster goes away."""
    layout = lc.Layout(name)
    cluster = lc.read_state(layout)
    # Watch the local cluster only when the kubeconfig is one of its own (not some other cluster's).
    local = {layout.kubeconfig.resolve(), (layout.state / "admin.kubeconfig").resolve()}
    apiserver = cluster["pids"].get("kube-apiserver") if cluster and kubeconfig.resolve() in local else None
    argv = [str(binary), f"--kubeconfig={kubeconfig}", "--enable-leader-election=false",
            f"--metrics-addr=127.0.0.1:{metrics_port}", f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            "--log-stdout-encoder=console"]
    print(f"[kuberay] {time.strftime('%Y-%m-%dT%H:%M:%S')} exec {' '.join(argv)}", flush=True)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def cluster_gone() -> bool:
        # Only watched when this runs for a hack/localcluster.py cluster: its state vanishes on `down`, and a
        # restarted cluster has a new apiserver pid (and new certificates, which the operator would not have).
        if apiserver is None:
            return False
        now = lc.read_state(layout)
        return now is None or now["pids"].get("kube-apiserver") != apiserver or not lc.pid_alive(apiserver)

    while proc.poll() is None and not stopping:
        if cluster_gone():
            print(f"[kuberay] cluster {name!r} is gone; stopping the operator", flush=True)
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    print(f"[kuberay] operator exited with {proc.returncode}", flush=True)
    return 0 if stopping else (proc.returncode or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/kuberay.sh",
        description="Run the KubeRay operator (built from its Go module, pinned in hack/versions.env) out of "
                    "cluster against the local control plane, with its CRDs installed.")
    parser.add_argument("--name", default=os.environ.get("CLUSTER_NAME", lc.DEFAULT_NAME),
                        help="local cluster name; state goes to .dev/clusters/NAME (default: %(default)s)")
    parser.add_argument("--kubeconfig", type=Path,
                        help="kubeconfig of the cluster (default: the local cluster's, .dev/kubeconfig for 'mcad')")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="install the CRDs and start the operator (harmless if it already runs)")
    p_up.add_argument("--timeout", type=float, default=90,
                      help="seconds to wait for the operator (default %(default)s)")
    sub.add_parser("down", help="stop the operator (the CRDs stay)")
    sub.add_parser("status", help="show whether the operator runs; exit 1 if not")
    p_run = sub.add_parser("run", help="run the operator in the foreground (what `up` starts in the background)")
    p_run.add_argument("--binary", type=Path, required=True)
    p_run.add_argument("--metrics-port", type=int, required=True)
    p_run.add_argument("--probe-port", type=int, required=True)
    args = parser.parse_args(argv)
    kubeconfig = (args.kubeconfig or lc.Layout(args.name).kubeconfig).resolve()

    try:
        if args.command == "up":
            up(args.name, kubeconfig, args.timeout)
        elif args.command == "down":
            down(args.name)
        elif args.command == "status":
            return status(args.name)
        else:
            return run(args.name, kubeconfig, args.binary, args.metrics_port, args.probe_port)
    except (KubeRayError, lc.ClusterError) as err:
        log(f"error: {err}")
        return 1
    except subprocess.TimeoutExpired as err:
        log(f"error: {err}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
