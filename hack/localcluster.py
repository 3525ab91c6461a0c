#!/usr/bin/env python3
"""A real Kubernetes control plane with simulated nodes, on one machine, with no Docker.

Contract (``python3 hack/localcluster.py --help``; standard library only, so it runs before any venv exists):

  up      Build the pinned binaries if the cache lacks them (hack/build-tools.sh), then start etcd,
          kube-apiserver, kube-controller-manager, kube-scheduler and kwok as background process groups,
          create NODES fake nodes, wait until every node is Ready and untainted, and write the kubeconfig
          (.dev/kubeconfig for the default cluster). Running ``up`` on a healthy cluster changes nothing;
          on a dead one it cleans up and starts afresh.
  down    Kill every process of the cluster and delete its state (certificates, etcd data, logs, kubeconfig).
  status  Say whether each component is alive and where the kubeconfig is; exit 1 if the cluster is not up.
  stop [--kill] COMPONENT   Stop one component of a running cluster, remembering its command line; the others
          keep running. SIGTERM to its process group (SIGKILL after 15 s: kube-apiserver stops listening at once
          but may linger that long), or SIGKILL at once with --kill, as a crash. For fault tests: a stopped
          kube-apiserver refuses connections on its port.
  start COMPONENT  Start a component that ``stop`` stopped, with the same command line (same flags, port and
          certificates), and wait until it is healthy (kube-apiserver: /readyz; etcd: /health). Prints the
          time (seconds since the epoch) of its first healthy answer, polled every 0.1 s.

Nodes: kwok manages every Node annotated ``kwok.x-k8s.io/node: fake``, so a test adds capacity by creating
such a Node (status.capacity/allocatable set at creation are kept). Pods bound to those nodes become Running;
pods owned by a Job succeed after 1 s or the pod annotation ``pod-complete.stage.kwok.x-k8s.io/delay``; a
pod annotated ``mcad.test/exit-code`` fails with that exit code after ``mcad.test/fail-after`` (default 1 s);
deleted pods go away (hack/kwok-stages.yaml). The controller-manager runs every default controller, the
garbage collector included, so ownerReference cascades work.

Webhook client credentials (``up --webhook-client-auth``, the default; ``--no-webhook-client-auth`` turns it off):
kube-apiserver starts with ``--admission-control-config-file`` naming a WebhookAdmissionConfiguration kubeconfig
with one user entry, for the host ``127.0.0.1:<port>`` (a port reserved at ``up``, below the ephemeral range): a
client certificate (CN ``kube-apiserver-webhook-client``, signed by the cluster CA) and a bearer token. The API
server sends them to a webhook registered at ``https://127.0.0.1:<port>`` and to no other: the kubeconfig has no
``*`` entry and no current context, so every other webhook is called without credentials, as before.
``state.json``'s ``webhook_client`` says where: host, port, ca (file), name (the CN), cert, key, token_file.

Several clusters can run side by side (``--name``); each has its own ports, state directory
(.dev/clusters/<name>) and kubeconfig (.dev/kubeconfig-<name>; the default cluster uses .dev/kubeconfig).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HACK = Path(__file__).resolve().parent
REPO = HACK.parent
DEFAULT_NAME = "mcad"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.1/16"  # kwok hands out pod IPs from here; /16 leaves room for ~65k pods
# Start order; stop order is the reverse, so nothing loses its API server while it still runs.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def log(message: str) -> None:
    print(f"[local-cluster] {message}", file=sys.stderr, flush=True)


class ClusterError(Exception):
    """The cluster could not be brought up; the message says which component and where its log is."""


# ---------------------------------------------------------------------------------------------- layout


@dataclass
class Layout:
    name: str
    dev: Path = field(init=False)
    state: Path = field(init=False)
    kubeconfig: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dev = Path(os.environ.get("MCAD_DEV_DIR", REPO / ".dev"))
        self.state = self.dev / "clusters" / self.name
        suffix = "" if self.name == DEFAULT_NAME else f"-{self.name}"
        self.kubeconfig = self.dev / f"kubeconfig{suffix}"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def state_file(self) -> Path:
        return self.state / "state.json"


def read_state(layout: Layout) -> dict[str, Any] | None:
    try:
        return json.loads(layout.state_file.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------- binaries


def tool_bin_dir() -> Path:
    """Directory holding every binary; builds them first when the cache lacks any (minutes when cold)."""
    override = os.environ.get("MCAD_DEV_BIN")
    if override:
        return Path(override)
    proc = subprocess.run([str(HACK / "build-tools.sh")], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise ClusterError("building the Kubernetes binaries failed (see the messages above)")
    return Path(proc.stdout.strip().splitlines()[-1])


def require_binaries(bin_dir: Path) -> dict[str, Path]:
    paths = {c: bin_dir / c for c in (*COMPONENTS, "kubectl")}
    missing = [str(p) for p in paths.values() if not os.access(p, os.X_OK)]
    if missing:
        raise ClusterError(f"missing executables: {', '.join(missing)} (run hack/build-tools.sh)")
    if shutil.which("openssl") is None:
        raise ClusterError("openssl is required to make the cluster's certificates (Debian: apt-get install openssl)")
    return paths


# ---------------------------------------------------------------------------------------------- pki


def openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


# Every key is ECDSA P-256: generating a 2048-bit RSA key takes 0.1-0.5 s, and a cluster's five of them were most of
# the ~2 s its certificates took, paid by every cluster a test or a benchmark scenario brings up.
NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


def make_pki(pki: Path, address: str = "127.0.0.1") -> None:
    """One CA signs the apiserver's serving cert and the admin client cert; one ECDSA key signs SA tokens.
    ``address``: where the API server listens, named in its certificate besides loopback and the Service IP."""
    pki.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", *NEW_KEY, "-nodes", "-days", "3650", "-subj", "/CN=mcad-dev-ca",
            "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"))
    ips = dict.fromkeys(["127.0.0.1", SERVICE_IP, address])
    sans = ",".join(["DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                     "DNS:kubernetes.default.svc.cluster.local", *(f"IP:{ip}" for ip in ips)])
    sign_leaf(pki, "apiserver", "/CN=kube-apiserver", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    # system:masters bypasses RBAC: the harness and the components act as cluster admin.
    sign_leaf(pki, "admin", "/O=system:masters/CN=mcad-dev-admin", "extendedKeyUsage=clientAuth\n")
    # SEC1 ("EC PRIVATE KEY"): --service-account-key-file finds no public key in an EC key written as PKCS#8.
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(pki / "sa.key"))


def sign_leaf(pki: Path, leaf: str, subject: str, extensions: str) -> None:
    """A key and a certificate for ``subject`` signed by the cluster CA: pki/<leaf>.key, pki/<leaf>.crt."""
    ext_file = pki / f"{leaf}.ext"
    ext_file.write_text(extensions)
    openssl("req", *NEW_KEY, "-nodes", "-subj", subject,
            "-keyout", str(pki / f"{leaf}.key"), "-out", str(pki / f"{leaf}.csr"))
    openssl("x509", "-req", "-days", "3650", "-in", str(pki / f"{leaf}.csr"), "-CA", str(pki / "ca.crt"),
            "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-extfile", str(ext_file),
            "-out", str(pki / f"{leaf}.crt"))


def write_kubeconfig(path: Path, server: str, pki: Path, name: str) -> None:
    def b64(p: Path) -> str:
        return b64encode(p.read_bytes()).decode()

    # JSON is valid YAML, and every kubeconfig reader accepts it.
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(pki / "ca.crt")}}],
        "users": [{"name": f"{name}-admin", "user": {"client-certificate-data": b64(pki / "admin.crt"),
                                                     "client-key-data": b64(pki / "admin.key")}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin"}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------- http


class Api:
    """Just enough of an API client for the harness: JSON over HTTPS with the admin client cert."""

    def __init__(self, server: str, pki: Path) -> None:
        self.server = server
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                timeout: float = 10) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")


def probe(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def insecure_context() -> ssl.SSLContext:
    # KCM and the scheduler serve health on self-signed certs they make themselves; only liveness is asked.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# ---------------------------------------------------------------------------------------------- processes


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (all sockets held open until every port is chosen)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port the kernel gives to bind(port 0) and to outgoing connections (32768 on Linux by default)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_HANDED_OUT: set[tuple[str, int]] = set()
# Below the ephemeral range, two ranges that never meet: ports a cluster names for good at ``up`` (the webhook
# client's), and ports tests and benches name for the servers they start (test.support.free_port), so that a test's
# server never takes the port a cluster's API server will call its webhook at.
CLUSTER_PORTS = (20000, 25999)
TEST_PORTS_LOW = 26000


def reserved_port(host: str = "127.0.0.1", low: int = TEST_PORTS_LOW, high: int | None = None) -> int:
    """A port nothing listens on at ``host`` now, chosen at random between ``low`` and ``high`` (default: the port
    below the kernel's ephemeral range) and never handed out twice by this process. A port probed with bind(0) is
    free only until the next bind(0) or outgoing connection takes it, which on a busy machine happens between the
    probe and the server's own bind (a cluster's components and every client connection draw from that range); a
    port below it is taken only by a process that names it."""
    if high is None:
        high = ephemeral_low() - 1
    if high - low < 1000:  # a kernel whose ephemeral range starts low: nowhere safe to pick from
        low, high = 1024, 65535
    for _ in range(200):
        port = random.randint(low, high)
        if (host, port) in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add((host, port))
        return port
    raise ClusterError(f"no free port on {host} between {low} and {high}")


WEBHOOK_CLIENT_NAME = "kube-apiserver-webhook-client"


def webhook_client_config(layout: Layout, port: int) -> dict[str, Any]:
    """Credentials the API server presents to the webhook at https://127.0.0.1:<port> (see the module docstring);
    returns what state.json records of them. Writes the AdmissionConfiguration the API server is started with."""
    pki = layout.pki
    ext = pki / "webhook-client.ext"
    ext.write_text("extendedKeyUsage=clientAuth\n")
    openssl("req", *NEW_KEY, "-nodes", "-subj", f"/CN={WEBHOOK_CLIENT_NAME}",
            "-keyout", str(pki / "webhook-client.key"), "-out", str(pki / "webhook-client.csr"))
    openssl("x509", "-req", "-days", "3650", "-in", str(pki / "webhook-client.csr"), "-CA", str(pki / "ca.crt"),
            "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-extfile", str(ext),
            "-out", str(pki / "webhook-client.crt"))
    token_file = pki / "webhook-client.token"
    token = secrets.token_urlsafe(32)
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    host = f"127.0.0.1:{port}"
    # The user entry is found by the webhook URL's host with its port; no "*" entry and no current context, or
    # every other webhook would get these credentials too.
    kubeconfig = layout.state / "admission-kubeconfig.json"
    kubeconfig.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "users": [{"name": host, "user": {
        "client-certificate": str(pki / "webhook-client.crt"), "client-key": str(pki / "webhook-client.key"),
        "token": token}}]}, indent=2))
    kubeconfig.chmod(0o600)
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(kubeconfig)}
    (layout.state / "admission-config.json").write_text(json.dumps({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": plugin}
                    for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")]}, indent=2))
    return {"host": "127.0.0.1", "port": port, "ca": str(pki / "ca.crt"), "name": WEBHOOK_CLIENT_NAME,
            "cert": str(pki / "webhook-client.crt"), "key": str(pki / "webhook-client.key"),
            "token_file": str(token_file)}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0); /proc says whether it is one.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def start(component: str, argv: list[str], layout: Layout) -> int:
    layout.logs.mkdir(parents=True, exist_ok=True)
    with open(layout.logs / f"{component}.log", "ab") as out:
        # A session of its own: the process outlives this script, and `down` can signal its whole group.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=layout.state)
    return proc.pid


def log_tail(layout: Layout, component: str, lines: int = 25) -> str:
    try:
        text = (layout.logs / f"{component}.log").read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


def wait_for(what: str, check: Any, timeout: float, layout: Layout, pids: dict[str, int],
             component: str | None = None) -> None:
    """Poll ``check`` until it is true; fail early, with the log, if a component process died. A poll is one local
    request, so the interval stays short: at a cap of a second the API server's ~4 s start was seen up to 1 s late."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        if check():
            return
        for name, pid in pids.items():
            if not pid_alive(pid):
                raise ClusterError(f"{name} exited while waiting for {what}; last lines of "
                                   f"{layout.logs / (name + '.log')}:\n{log_tail(layout, name)}")
        if time.monotonic() > deadline:
            detail = f"; last lines of its log:\n{log_tail(layout, component)}" if component else ""
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def stop_all(pids: dict[str, int], timeout: float = 15, sig: int = signal.SIGTERM) -> None:
    for component in reversed(COMPONENTS):
        pid = pids.get(component)
        if pid is not None and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids.values():
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- nodes


def fake_node(name: str, cpu: str, memory: str, gpu: int, pods: int) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if gpu:
        resources["nvidia.com/gpu"] = str(gpu)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64"},
        },
        # Status at creation is kept, as when a kubelet registers its node; kwok preserves capacity.
        "status": {"capacity": resources, "allocatable": resources},
    }


def fake_node_names(count: int) -> list[str]:
    return [f"kwok-node-{i}" for i in range(count)]


def fake_nodes(count: int, cpu: str, memory: str, gpu: int, pods: int) -> list[dict[str, Any]]:
    """The Nodes ``up`` creates; hack/kind/fake_nodes.py gives the KinD e2e cluster the same ones."""
    return [fake_node(name, cpu, memory, gpu, pods) for name in fake_node_names(count)]


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """--nodes, --node-cpu, --node-memory, --node-gpu, --node-pods, defaulting to NODES, NODE_CPU, ... ."""
    parser.add_argument("--nodes", type=int, default=env_int("NODES", 1),
                        help="fake nodes to create (default %(default)s)")
    parser.add_argument("--node-cpu", default=os.environ.get("NODE_CPU", "8"),
                        help="cpu per node (default %(default)s)")
    parser.add_argument("--node-memory", default=os.environ.get("NODE_MEMORY", "8Gi"),
                        help="memory per node (default %(default)s)")
    parser.add_argument("--node-gpu", type=int, default=env_int("NODE_GPU", 0),
                        help="nvidia.com/gpu per node (default %(default)s)")
    parser.add_argument("--node-pods", type=int, default=env_int("NODE_PODS", 110),
                        help="pod slots per node (default %(default)s)")


def node_ready_and_untainted(node: dict[str, Any]) -> bool:
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in node.get("status", {}).get("conditions", []))
    return ready and not node.get("spec", {}).get("taints")


# ---------------------------------------------------------------------------------------------- commands


DEFAULT_NODE_LEASE_SECONDS = 40


@dataclass
class Options:
    name: str
    nodes: int
    node_cpu: str
    node_memory: str
    node_gpu: int
    node_pods: int
    max_requests_inflight: int
    max_mutating_requests_inflight: int
    timeout: float
    webhook_client_auth: bool = True
    # kwok renews each node's Lease every quarter of this: at 5,000 nodes and 40 s, ~500 writes/s on their own.
    node_lease_seconds: int = DEFAULT_NODE_LEASE_SECONDS
    # Where the API server listens and what it advertises. Loopback (the default) for clusters of simulated nodes
    # only; a real node's pods reach the API server through the "kubernetes" Service, whose endpoint must then be
    # an address they can route to (hack/e2ecluster.py passes this machine's).
    address: str = "127.0.0.1"
    # More kube-apiserver flags (a real node's kubelet client credentials, say).
    apiserver_flags: tuple[str, ...] = ()
    # The API server's port; 0: any free one.
    api_port: int = 0
    # Print the kubeconfig and how to stop the cluster at the end (a caller with more to start says it later).
    announce: bool = True


def cluster_healthy(layout: Layout) -> bool:
    state = read_state(layout)
    if not state or not layout.kubeconfig.exists():
        return False
    if not all(pid_alive(p) for p in state["pids"].values()):
        return False
    return probe(state["server"] + "/readyz", Api(state["server"], layout.pki).ctx)


def up(opts: Options) -> None:
    layout = Layout(opts.name)
    if cluster_healthy(layout):
        log(f"cluster {opts.name!r} is already running")
        print_usage(layout)
        return
    if layout.state.exists():
        log(f"cluster {opts.name!r} has stale state; cleaning it up first")
        down(opts.name, quiet=True)

    started = time.monotonic()
    binaries = require_binaries(tool_bin_dir())
    layout.state.mkdir(parents=True, exist_ok=True)
    (layout.dev / "bin").unlink(missing_ok=True)
    (layout.dev / "bin").symlink_to(binaries["kubectl"].parent)

    log("generating certificates")
    make_pki(layout.pki, opts.address)
    etcd_port, etcd_peer, api_port, kcm_port, sched_port, kwok_port = free_ports(6)
    api_port = opts.api_port or api_port
    server = f"https://{opts.address}:{api_port}"
    admin_kubeconfig = layout.state / "admin.kubeconfig"
    write_kubeconfig(admin_kubeconfig, server, layout.pki, f"mcad-dev-{opts.name}")
    pids: dict[str, int] = {}
    state = {"name": opts.name, "server": server, "pids": pids, "ports": {
        "etcd": etcd_port, "kube-apiserver": api_port, "kube-controller-manager": kcm_port,
        "kube-scheduler": sched_port, "kwok": kwok_port}}

    admission_flags: list[str] = []
    if opts.webhook_client_auth:
        low, high = CLUSTER_PORTS
        state["webhook_client"] = webhook_client_config(layout, reserved_port(low=low, high=high))
        admission_flags = [f"--admission-control-config-file={layout.state / 'admission-config.json'}"]

    def save_state() -> None:
        layout.state_file.write_text(json.dumps(state, indent=2))

    try:
        log(f"starting etcd on 127.0.0.1:{etcd_port}")
        pids["etcd"] = start("etcd", [
            str(binaries["etcd"]), "--name=default", f"--data-dir={layout.state / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            # Throwaway data: durability buys nothing here and fsync dominates write latency.
            "--unsafe-no-fsync=true", "--quota-backend-bytes=8589934592", "--log-level=warn",
        ], layout)
        save_state()
        wait_for("etcd", lambda: probe(f"http://127.0.0.1:{etcd_port}/health"), 60, layout, pids, "etcd")

        log(f"starting kube-apiserver on {server}")
        pki = layout.pki
        pids["kube-apiserver"] = start("kube-apiserver", [
            str(binaries["kube-apiserver"]), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={opts.address}", f"--advertise-address={opts.address}", f"--secure-port={api_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.key'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            f"--max-requests-inflight={opts.max_requests_inflight}",
            f"--max-mutating-requests-inflight={opts.max_mutating_requests_inflight}",
            f"--cert-dir={pki}",
            # On loopback, which the "kubernetes" Endpoints may not name, the reconciler would log a validation
            # error every 10 s, and no fake pod dials the apiserver anyway. Elsewhere real pods do, through it.
            *(["--endpoint-reconciler-type=none"] if opts.address.startswith("127.") else []),
            # MutatingAdmissionPolicy (beta and off by default in 1.34-1.35, GA and on in 1.36): the chart's
            # webhook.creator=policy records the creator with one (templates/creator-policy.yaml), tested here.
            "--feature-gates=MutatingAdmissionPolicy=true",
            "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
            *admission_flags, *opts.apiserver_flags,
        ], layout)
        save_state()
        api = Api(server, pki)
        wait_for("kube-apiserver /readyz", lambda: probe(server + "/readyz", api.ctx), 120, layout, pids,
                 "kube-apiserver")

        log("starting kube-controller-manager, kube-scheduler and kwok")
        pids["kube-controller-manager"] = start("kube-controller-manager", [
            str(binaries["kube-controller-manager"]), f"--kubeconfig={admin_kubeconfig}",
            "--leader-elect=false", "--controllers=*", "--use-service-account-credentials=false",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            # A node whose Lease is older than this goes NotReady: longer Leases need a longer grace period.
            *([f"--node-monitor-grace-period={opts.node_lease_seconds + 20}s"]
              if opts.node_lease_seconds != DEFAULT_NODE_LEASE_SECONDS else []),
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--bind-address=127.0.0.1", f"--secure-port={kcm_port}", f"--cert-dir={layout.state / 'kcm-certs'}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            # Client-side rate limits sized for thousands of Jobs and pods in the benchmarks.
            "--kube-api-qps=1000", "--kube-api-burst=2000",
        ], layout)
        sched_config = layout.state / "scheduler-config.yaml"
        sched_config.write_text(json.dumps({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(admin_kubeconfig), "qps": 1000, "burst": 2000},
            "leaderElection": {"leaderElect": False},
        }))
        pids["kube-scheduler"] = start("kube-scheduler", [
            str(binaries["kube-scheduler"]), f"--config={sched_config}", "--bind-address=127.0.0.1",
            f"--secure-port={sched_port}", f"--cert-dir={layout.state / 'scheduler-certs'}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        ], layout)
        pids["kwok"] = start("kwok", [
            str(binaries["kwok"]), f"--kubeconfig={admin_kubeconfig}", f"--config={HACK / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            # Leases keep fake nodes alive for the node lifecycle controller (off, they would go NotReady).
            f"--node-lease-duration-seconds={opts.node_lease_seconds}", f"--cidr={POD_CIDR}", "--node-ip=10.0.0.1",
            f"--server-address=127.0.0.1:{kwok_port}",
        ], layout)
        save_state()
        insecure = insecure_context()
        wait_for("kube-controller-manager /healthz",
                 lambda: probe(f"https://127.0.0.1:{kcm_port}/healthz", insecure), 60, layout, pids,
                 "kube-controller-manager")
        wait_for("kube-scheduler /healthz",
                 lambda: probe(f"https://127.0.0.1:{sched_port}/healthz", insecure), 60, layout, pids,
                 "kube-scheduler")
        wait_for("kwok /healthz", lambda: probe(f"http://127.0.0.1:{kwok_port}/healthz"), 60, layout, pids, "kwok")
        # Pods cannot be created in a namespace before its default ServiceAccount exists.
        wait_for("the default ServiceAccount",
                 lambda: api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
                 60, layout, pids, "kube-controller-manager")

        log(f"creating {opts.nodes} fake node(s): {opts.node_cpu} cpu, {opts.node_memory} memory, "
            f"{opts.node_gpu} nvidia.com/gpu each")
        names = fake_node_names(opts.nodes)
        for node in fake_nodes(opts.nodes, opts.node_cpu, opts.node_memory, opts.node_gpu, opts.node_pods):
            status, body = api.request("POST", "/api/v1/nodes", node)
            if status not in (201, 409):
                raise ClusterError(f"creating node {node['metadata']['name']} failed: HTTP {status}: {body}")

        def nodes_ready() -> bool:
            status, body = api.request("GET", "/api/v1/nodes")
            ready = {n["metadata"]["name"] for n in (body or {}).get("items", []) if node_ready_and_untainted(n)}
            return status == 200 and ready.issuperset(names)

        # Ready comes from kwok; the not-ready taint is lifted by the node lifecycle controller afterwards.
        wait_for("nodes Ready and untainted", nodes_ready, opts.timeout, layout, pids, "kwok")
        write_kubeconfig(layout.kubeconfig, server, layout.pki, f"mcad-dev-{opts.name}")
    except BaseException:
        stop_all(pids)
        raise
    log(f"cluster {opts.name!r} is up in {time.monotonic() - started:.1f} s")
    if opts.announce:
        print_usage(layout)


def print_usage(layout: Layout) -> None:
    rel = os.path.relpath(layout.kubeconfig)
    print(f"""
Kubeconfig: {layout.kubeconfig}
  export KUBECONFIG={rel} PATH={os.path.relpath(layout.dev / 'bin')}:$PATH
  kubectl get nodes
Logs: {layout.logs}/
Stop: make cluster-down""")


def down(name: str, quiet: bool = False) -> None:
    layout = Layout(name)
    state = read_state(layout)
    if state is None and not layout.state.exists():
        if not quiet:
            log(f"cluster {name!r} is not running")
        return
    if state:
        # SIGKILL: the state is deleted next, so a graceful stop saves nothing, and kube-apiserver's took 10-20 s
        # (it drains its watches).
        stop_all({k: int(v) for k, v in state["pids"].items()}, sig=signal.SIGKILL)
    shutil.rmtree(layout.state, ignore_errors=True)
    layout.kubeconfig.unlink(missing_ok=True)
    if not quiet:
        log(f"cluster {name!r} stopped and its state removed")


def status(name: str) -> int:
    layout = Layout(name)
    state = read_state(layout)
    if state is None:
        print(f"cluster {name!r}: not running")
        return 1
    healthy = cluster_healthy(layout)
    print(f"cluster {name!r}: {'up' if healthy else 'DOWN'}  server {state['server']}  kubeconfig {layout.kubeconfig}")
    for component, pid in state["pids"].items():
        print(f"  {component:<24} pid {pid:<8} {'running' if pid_alive(pid) else 'dead'}")
    return 0 if healthy else 1


def stop_component(name: str, component: str, kill: bool = False) -> None:
    layout = Layout(name)
    state = read_state(layout)
    if state is None or component not in state["pids"]:
        raise ClusterError(f"cluster {name!r} has no {component} (is it up?)")
    pid = int(state["pids"][component])
    if not pid_alive(pid):
        raise ClusterError(f"{component} of cluster {name!r} is not running")
    # Its own command line, whichever version of this script started it: ``start`` needs nothing else.
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    state.setdefault("stopped", {})[component] = argv
    layout.state_file.write_text(json.dumps(state, indent=2))
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        stop_all({component: pid})
    if pid_alive(pid):
        raise ClusterError(f"{component} (pid {pid}) did not stop")
    log(f"{component} of cluster {name!r} stopped")


def start_component(name: str, component: str, timeout: float = 120) -> float:
    """Start what ``stop_component`` stopped; return the time (time.time()) it first answered healthy."""
    layout = Layout(name)
    state = read_state(layout)
    argv = (state or {}).get("stopped", {}).get(component)
    if state is None or not argv:
        raise ClusterError(f"{component} of cluster {name!r} was not stopped by `stop`")
    ports = state["ports"]
    healthy = {
        "kube-apiserver": lambda: probe(state["server"] + "/readyz", Api(state["server"], layout.pki).ctx),
        "etcd": lambda: probe(f"http://127.0.0.1:{ports['etcd']}/health"),
    }.get(component, lambda: True)
    started = time.monotonic()
    pid = start(component, argv, layout)
    state["pids"][component] = pid
    del state["stopped"][component]
    layout.state_file.write_text(json.dumps(state, indent=2))
    # A short fixed poll (not wait_for's growing one): callers time the outage by this answer.
    deadline = started + timeout
    while not healthy():
        if not pid_alive(pid):
            raise ClusterError(f"{component} exited while starting; last lines of its log:\n"
                               f"{log_tail(layout, component)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {component} to be healthy")
        time.sleep(0.1)
    healthy_at = time.time()
    log(f"{component} of cluster {name!r} started (pid {pid}), healthy after {time.monotonic() - started:.1f} s")
    return healthy_at


def env_int(var: str, default: int) -> int:
    raw = os.environ.get(var)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"[local-cluster] error: {var}={raw!r} is not an integer") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/local-cluster.sh",
        description="Run a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, "
                    "kube-scheduler) with kwok-simulated nodes on this machine, without Docker.",
        epilog="Environment: NODES, NODE_CPU, NODE_MEMORY, NODE_GPU, NODE_PODS give the node defaults; "
               "MCAD_DEV_CACHE moves the binary cache (default ~/.cache/mcad-dev); MCAD_DEV_BIN uses "
               "prebuilt binaries from a directory; MCAD_DEV_DIR moves the state (default .dev/).")
    parser.add_argument("--name", default=os.environ.get("CLUSTER_NAME", DEFAULT_NAME),
                        help="cluster name, for running several side by side (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the cluster (harmless if it already runs)")
    add_node_arguments(p_up)
    p_up.add_argument("--max-requests-inflight", type=int, default=env_int("MAX_REQUESTS_INFLIGHT", 400))
    p_up.add_argument("--max-mutating-requests-inflight", type=int,
                      default=env_int("MAX_MUTATING_REQUESTS_INFLIGHT", 200))
    p_up.add_argument("--timeout", type=float, default=180, help="seconds to wait for nodes (default %(default)s)")
    p_up.add_argument("--node-lease-seconds", type=int, default=DEFAULT_NODE_LEASE_SECONDS,
                      help="the fake nodes' Lease duration; kwok renews each Lease every quarter of it, and "
                           "kube-controller-manager's node grace period follows (default %(default)s)")
    p_up.add_argument("--webhook-client-auth", action=argparse.BooleanOptionalAction, default=True,
                      help="give kube-apiserver a client certificate and a token for the webhook at "
                           "https://127.0.0.1:<port> (state.json webhook_client; default: on)")
    sub.add_parser("down", help="stop the cluster and delete its state")
    sub.add_parser("status", help="show whether the cluster runs; exit 1 if not")
    p_stop = sub.add_parser("stop", help="stop one component of a running cluster (the others keep running)")
    p_stop.add_argument("--kill", action="store_true", help="SIGKILL at once, as a crash (default: SIGTERM)")
    p_stop.add_argument("component", choices=COMPONENTS)
    p_start = sub.add_parser("start", help="start a component that `stop` stopped, with the same flags")
    p_start.add_argument("component", choices=COMPONENTS)
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            if args.nodes < 0 or args.node_gpu < 0:
                parser.error("--nodes and --node-gpu must be >= 0")
            up(Options(args.name, args.nodes, args.node_cpu, args.node_memory, args.node_gpu, args.node_pods,
                       args.max_requests_inflight, args.max_mutating_requests_inflight, args.timeout,
                       args.webhook_client_auth, args.node_lease_seconds))
        elif args.command == "down":
            down(args.name)
        elif args.command == "stop":
            stop_component(args.name, args.component, kill=args.kill)
        elif args.command == "start":
            print(f"{start_component(args.name, args.component):.3f}")
        else:
            return status(args.name)
    except ClusterError as err:
        log(f"error: {err}")
        return 1
    except KeyboardInterrupt:
        log("interrupted; stopping what was started")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
