#!/usr/bin/env python3
"""The local control plane with one real node, and mcad installed on it from its image by the Helm chart.

Contract (``python3 hack/e2ecluster.py --help``; standard library only, like hack/localcluster.py; run as root):

  up      Check every prerequisite first (root, the Docker engine, containerd, runc, the CNI plugins, iptables, the
          image, a non-loopback address, no other real-node cluster here, a free API server port); then start the
          control plane of hack/localcluster.py on this machine's address (not loopback: pods must reach it) with
          NODES kwok nodes, and one real node: containerd with its own configuration, socket and directories, the
          CNI bridge plugin, a kubelet and kube-proxy (iptables) joined with node certificates of the cluster CA.
          The image and a pause image built here (hack/e2e/pause) are loaded into that containerd. Then the chart
          is installed as a user installs it (``helm install`` of charts/mcad with its defaults, but for
          hack/e2e/values.yaml, which puts the controller on the real node), and ``up`` waits until every replica
          is Ready and one holds the leader Lease. The kubeconfig is .dev/kubeconfig-<name>. Before it changes
          anything it records the host state it will change (hack/hoststate.py); on any failure it says in one
          line what failed and what to run, and takes down everything it started.
  down    Stop everything ``up`` started and put the machine back as it was: no process, mount, cgroup, network
          namespace, bridge, iptables chain or changed sysctl left (hack/hoststate.py); exit 1 naming whatever is.
  status  Say whether the cluster and each node component run; exit 1 if not.

The real node is labelled and tainted ``mcad.dev/e2e-real-node=true`` (NoSchedule): AppWrapper pods, which name
images nobody can pull here, land on the kwok nodes, and only the controller (which tolerates the taint) runs in a
container. Only one real-node cluster can run on a machine (its kube-proxy owns the host's KUBE-* chains); other
local clusters, whose nodes are all simulated, run beside it untouched.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HACK = Path(__file__).resolve().parent
REPO = HACK.parent
CHART = REPO / "charts" / "mcad"
VALUES = HACK / "e2e" / "values.yaml"
PAUSE_SOURCE = HACK / "e2e" / "pause"
DEFAULT_NAME = "e2e"
RELEASE = "mcad"
CHART_NAMESPACE = "mcad-system"
REAL_NODE_LABEL = "mcad.dev/e2e-real-node"
POD_CIDR = "10.250.0.0/24"
CNI_BIN = Path("/usr/lib/cni")
NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy")
# Why a controller container will not start, as the kubelet reports it: waiting for these is waiting forever.
STUCK_REASONS = {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                 "CreateContainerError", "CreateContainerConfigError", "RunContainerError"}


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HACK / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


lc = _load("localcluster")
hoststate = _load("hoststate")


def log(message: str) -> None:
    print(f"[e2e-cluster] {message}", file=sys.stderr, flush=True)


class E2EError(Exception):
    """``up`` cannot go on: the message is one line naming the cause and what to run."""


# ---------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Node:
    """Where one real node keeps what it owns. ``lib`` and ``run`` belong to it alone (hoststate.Scope)."""

    cluster: str

    @property
    def name(self) -> str:
        return f"mcad-{self.cluster}-node"

    @property
    def lib(self) -> Path:
        return Path("/var/lib") / f"mcad-{self.cluster}"

    @property
    def run(self) -> Path:
        # Sockets have a 108-byte path limit: a short directory of their own, not one under the repository.
        return Path("/run") / f"mcad-{self.cluster}"

    @property
    def state_file(self) -> Path:
        return self.lib / "node.json"

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def bridge(self) -> str:
        return f"mcad-{self.cluster}0"[:15]  # Linux interface names are at most 15 bytes

    @property
    def cgroup(self) -> str:
        return f"mcad-{self.cluster}"

    def scope(self) -> Any:
        return hoststate.Scope(paths=(str(self.lib), str(self.run)), cgroup=self.cgroup, bridge=self.bridge,
                               pod_cidr=POD_CIDR)


def read_node_state(node: Node) -> dict[str, Any] | None:
    try:
        return json.loads(node.state_file.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def other_real_nodes(node: Node) -> list[str]:
    """Real-node clusters of this machine other than ``node``'s (their state files under the same parent)."""
    return sorted(str(p.parent) for p in node.lib.parent.glob("mcad-*/node.json") if p.parent != node.lib)


# ---------------------------------------------------------------------------------------------- prerequisites


def run(argv: list[str], timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


def host_address() -> str:
    _load("hostip")
    return sys.modules["hostip"].host_ip()  # type: ignore[no-any-return]


def chart_image() -> str:
    """The image the chart's defaults name: image.repository and the chart's appVersion."""
    chart = (CHART / "Chart.yaml").read_text()
    values = (CHART / "values.yaml").read_text()
    app = next(line.split(":", 1)[1].strip().strip('"') for line in chart.splitlines()
               if line.startswith("appVersion:"))
    repo = next(line.split(":", 1)[1].strip() for line in values.splitlines()
                if line.strip().startswith("repository:"))
    return f"{repo}:{app}"


def check_prerequisites(opts: Options, node: Node) -> dict[str, Path]:
    """Everything ``up`` needs, checked before anything is started; returns the binaries."""
    if os.geteuid() != 0:
        raise E2EError("a real node needs root (containerd, the kubelet, iptables): run as root, e.g. sudo make e2e-up")
    missing = [tool for tool, package in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"),
                                          ("iptables", "iptables"), ("ip", "iproute2"), ("mount", "mount"))
               if shutil.which(tool) is None]
    missing += [f"{CNI_BIN}/{p}" for p in ("bridge", "host-local", "loopback") if not (CNI_BIN / p).exists()]
    if missing:
        raise E2EError(f"missing {', '.join(missing)}: apt-get install containerd runc iptables iproute2 "
                       "containernetworking-plugins")
    if shutil.which("docker") is None:
        raise E2EError("docker is not on PATH: apt-get install docker.io (the image is built and exported with it)")
    if run(["docker", "info"], timeout=60).returncode != 0:
        raise E2EError("the Docker engine does not answer ('docker info' failed): start it (as root: "
                       "dockerd >/var/log/dockerd.log 2>&1 &, or systemctl start docker)")
    if run(["docker", "image", "inspect", opts.image], timeout=60).returncode != 0:
        raise E2EError(f"the image {opts.image} is not in Docker: build it with 'make image'")
    if not opts.address:
        raise E2EError("this machine has no address but loopback, and pods cannot reach an API server on loopback")
    others = other_real_nodes(node)
    if others:
        raise E2EError(f"another real-node cluster runs here ({', '.join(others)}): its kube-proxy owns the host's "
                       "KUBE-* chains; take it down first (hack/e2ecluster.py --name NAME down)")
    if opts.api_port:
        with socket.socket() as s:
            try:
                s.bind((opts.address, opts.api_port))
            except OSError as err:
                raise E2EError(f"port {opts.api_port} on {opts.address} is taken ({err.strerror}; "
                               f"'ss -ltnp sport = :{opts.api_port}' shows by whom): choose another with "
                               "--api-port, or 0 for any free port") from None
    bin_dir = node_binaries()
    return {name: bin_dir / name for name in ("kubelet", "kube-proxy", "kubectl", "helm")}


def node_binaries() -> Path:
    """The bin directory of hack/build-tools.sh with the kubelet and kube-proxy (built when missing)."""
    proc = subprocess.run([str(HACK / "build-tools.sh"), "--node"], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise E2EError("building kubelet and kube-proxy failed (hack/build-tools.sh --node: messages above)")
    return Path(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- images


def dev_cache() -> Path:
    return Path(os.environ.get("MCAD_DEV_CACHE") or Path.home() / ".cache" / "mcad-dev")


def pause_image() -> str:
    """A pause image made here (FROM scratch, one static binary), tagged by its source's hash; built when Docker
    lacks it, its binary cached in the dev cache."""
    digest = hashlib.sha256()
    for path in sorted(PAUSE_SOURCE.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    key = digest.hexdigest()[:12]
    tag = f"mcad.local/pause:{key}"
    if run(["docker", "image", "inspect", tag]).returncode == 0:
        return tag
    binary = dev_cache() / f"pause-{key}" / "pause"
    if not binary.exists():
        if shutil.which("go") is None:
            raise E2EError("Go is needed once to build the pause binary (hack/e2e/pause) and is not on PATH")
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        proc = run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), "."], cwd=PAUSE_SOURCE,
                   env={**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"})
        if proc.returncode != 0:
            raise E2EError(f"building the pause binary failed: {proc.stderr.strip()}")
        tmp.replace(binary)
    tar = subprocess.Popen(["tar", "-C", str(binary.parent), "-c", "pause"], stdout=subprocess.PIPE)
    proc = run(["docker", "import", "--change", 'ENTRYPOINT ["/pause"]', "-", tag], stdin=tar.stdout)
    tar.wait()
    if proc.returncode != 0:
        raise E2EError(f"docker import of the pause image failed: {proc.stderr.strip()}")
    return tag


def load_images(node: Node, images: list[str]) -> None:
    """``docker save`` the images into the node's containerd (namespace k8s.io, where the kubelet's CRI looks)."""
    save = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = run(["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "images", "import", "-"],
               timeout=600, stdin=save.stdout)
    _, save_err = save.communicate()
    if save.returncode != 0 or proc.returncode != 0:
        raise E2EError(f"loading {', '.join(images)} into the node's containerd failed: "
                       f"{(save_err or b'').decode().strip() or proc.stderr.strip()}")


# ---------------------------------------------------------------------------------------------- configuration


def containerd_config(node: Node, pause: str) -> str:
    # TOML by hand: the standard library reads TOML but does not write it, and this is all strings.
    return f"""version = 2
root = "{node.lib / 'containerd'}"
state = "{node.run / 'containerd'}"
# The plugins a CRI node does not use; "opt" would create /opt/containerd.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{node.socket}"

[ttrpc]
  address = "{node.socket}.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # Some VMs refuse a negative oom_score_adj, and runc then fails "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{node.lib / 'cni' / 'net.d'}"
"""


def cni_config(node: Node) -> dict[str, Any]:
    # No ipMasq: pods talk only to this machine (the API server), so no NAT rule is needed on the host.
    return {"cniVersion": "0.4.0", "name": f"mcad-{node.cluster}", "plugins": [{
        "type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}],
                 "dataDir": str(node.lib / "cni" / "ipam")}}]}


def kubelet_config(node: Node, address: str, pki: Path, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": address, "port": ports["kubelet"], "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": ports["kubelet-healthz"],
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        # cgroup v1 is deprecated and refused by default since 1.35; this machine's kernel has only v1.
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{node.cgroup}",
        "failSwapOn": False,
        # The kubelet's own iptables chains (KUBE-FIREWALL drops traffic to 127/8 from elsewhere): nothing here
        # needs them, and they would reach other local clusters.
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(node.lib / "pod-logs"), "resolvConf": "/etc/resolv.conf",
        # The images are loaded, not pulled: never collect them, and no disk-pressure eviction on a full disk.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "maxPods": 30, "serializeImagePulls": False,
    }


def kube_proxy_config(node: Node, kubeconfig: Path, address: str, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)}, "mode": "iptables", "hostnameOverride": node.name,
        "healthzBindAddress": f"127.0.0.1:{ports['proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['proxy-metrics']}",
        "clusterCIDR": POD_CIDR, "nodePortAddresses": [f"{address}/32"],
        # Zeros leave the conntrack sysctls as they are; no localhost NodePorts, so route_localnet stays unset.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
    }


def client_kubeconfig(path: Path, server: str, pki: Path, leaf: str) -> Path:
    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                       "certificate-authority": str(pki / "ca.crt")}}],
              "users": [{"name": leaf, "user": {"client-certificate": str(pki / f"{leaf}.crt"),
                                                "client-key": str(pki / f"{leaf}.key")}}],
              "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": leaf}}],
              "current-context": "e2e"}
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------------------------------- up


@dataclass
class Options:
    name: str
    nodes: int
    node_cpu: str
    node_memory: str
    node_gpu: int
    image: str
    address: str
    api_port: int
    node_timeout: float
    chart_timeout: float
    chart: bool
    kubelet_args: tuple[str, ...]


def up(opts: Options) -> None:
    node = Node(opts.name)
    layout = lc.Layout(opts.name)
    if healthy(opts.name):
        log(f"cluster {opts.name!r} is already up")
        print_usage(layout)
        return
    if read_node_state(node) is not None or layout.state.exists():
        log(f"cluster {opts.name!r} has stale state; taking it down first")
        down(opts.name, quiet=True)
    binaries = check_prerequisites(opts, node)
    started = time.monotonic()
    # Recorded before anything changes, so that down can put everything back, whatever happens after this line.
    node.lib.mkdir(parents=True, exist_ok=True)
    node.run.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"name": opts.name, "node": node.name, "address": opts.address, "pids": {},
                             "before": hoststate.snapshot()}

    def save() -> None:
        node.state_file.write_text(json.dumps(state, indent=2))

    save()
    try:
        pki = layout.pki
        lc.up(lc.Options(opts.name, opts.nodes, opts.node_cpu, opts.node_memory, opts.node_gpu, 110, 400, 200, 180,
                         webhook_client_auth=False, address=opts.address, api_port=opts.api_port, announce=False,
                         apiserver_flags=(
                             f"--kubelet-client-certificate={pki / 'admin.crt'}",
                             f"--kubelet-client-key={pki / 'admin.key'}",
                             # `kubectl logs` and exec reach the kubelet at the node's own address, not its name.
                             "--kubelet-preferred-address-types=InternalIP")))
        cluster = lc.read_state(layout)
        assert cluster is not None
        server = cluster["server"]
        api = lc.Api(server, pki)
        pids: dict[str, int] = state["pids"]
        ports = dict(zip(("kubelet", "kubelet-healthz", "proxy-healthz", "proxy-metrics"), lc.free_ports(4),
                         strict=True))
        state["ports"] = ports

        log("starting containerd")
        pause = pause_image()
        config_dir = node.lib / "config"
        config_dir.mkdir(exist_ok=True)
        (config_dir / "containerd.toml").write_text(containerd_config(node, pause))
        net_d = node.lib / "cni" / "net.d"
        net_d.mkdir(parents=True, exist_ok=True)
        (net_d / "10-mcad.conflist").write_text(json.dumps(cni_config(node), indent=2))
        pids["containerd"] = lc.start("containerd", ["containerd", "--config", str(config_dir / "containerd.toml")],
                                      layout)
        save()
        lc.wait_for("containerd's socket", lambda: run(["ctr", "--address", str(node.socket), "version"],
                                                       timeout=10).returncode == 0, 60, layout, pids, "containerd")
        log(f"loading {opts.image} and {pause} into the node's containerd")
        load_images(node, [opts.image, pause])

        log(f"starting the kubelet of node {node.name} on {opts.address}")
        lc.sign_leaf(pki, "kubelet", f"/O=system:nodes/CN=system:node:{node.name}", "extendedKeyUsage=clientAuth\n")
        lc.sign_leaf(pki, "kube-proxy", "/CN=system:kube-proxy", "extendedKeyUsage=clientAuth\n")
        # The kubelet wants its cgroupRoot to exist in every hierarchy before it starts.
        for hierarchy in [hoststate.CGROUP_ROOT, *hoststate.CGROUP_ROOT.iterdir()]:
            if (hierarchy / "cgroup.procs").exists():
                (hierarchy / node.cgroup).mkdir(exist_ok=True)
        (config_dir / "kubelet.json").write_text(json.dumps(kubelet_config(node, opts.address, pki, ports), indent=2))
        pids["kubelet"] = lc.start("kubelet", [
            str(binaries["kubelet"]), f"--config={config_dir / 'kubelet.json'}",
            f"--kubeconfig={client_kubeconfig(config_dir / 'kubelet.kubeconfig', server, pki, 'kubelet')}",
            f"--root-dir={node.lib / 'kubelet'}", f"--hostname-override={node.name}", f"--node-ip={opts.address}",
            f"--node-labels={REAL_NODE_LABEL}=true", f"--register-with-taints={REAL_NODE_LABEL}=true:NoSchedule",
            *opts.kubelet_args], layout)
        save()
        try:
            lc.wait_for(f"node {node.name} to register and be Ready", lambda: node_ready(api, node.name),
                        opts.node_timeout, layout, pids, "kubelet")
        except lc.ClusterError as err:
            raise E2EError(f"the kubelet did not bring node {node.name} Ready within {opts.node_timeout:.0f} s "
                           f"(see kubelet.log): {first_line(err)}") from err

        log("starting kube-proxy (iptables)")
        proxy_config = config_dir / "kube-proxy.json"
        proxy_kubeconfig = client_kubeconfig(config_dir / "kube-proxy.kubeconfig", server, pki, "kube-proxy")
        proxy_config.write_text(json.dumps(kube_proxy_config(node, proxy_kubeconfig, opts.address, ports), indent=2))
        pids["kube-proxy"] = lc.start("kube-proxy", [str(binaries["kube-proxy"]), f"--config={proxy_config}"],
                                      layout)
        state["kube_proxy_cleanup"] = [str(binaries["kube-proxy"]), f"--config={proxy_config}", "--cleanup"]
        save()
        lc.wait_for("kube-proxy /healthz", lambda: lc.probe(f"http://127.0.0.1:{ports['proxy-healthz']}/healthz"),
                    60, layout, pids, "kube-proxy")
        if opts.chart:
            install_chart(opts, layout, api, binaries["helm"])
    except BaseException as err:
        kept = keep_logs(layout, node)
        log(f"{'interrupted' if isinstance(err, KeyboardInterrupt) else 'failed'}; taking down what was started "
            f"(logs kept in {kept})")
        left = down(opts.name, quiet=True)
        if isinstance(err, E2EError | lc.ClusterError):
            taken = "but some of it is left (see above): run make e2e-down" if left else "all of it was taken down"
            raise E2EError(f"{first_line(err)} (logs in {os.path.relpath(kept)}; {taken})") from err
        raise
    log(f"cluster {opts.name!r} with real node {node.name} is up in {time.monotonic() - started:.0f} s")
    print_usage(layout)


def keep_logs(layout: Any, node: Node) -> Path:
    """Copy the components' logs (and the containers' ones the kubelet keeps) where down does not remove them."""
    kept = layout.dev / "e2e-logs" / f"e2ecluster-{node.cluster}"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True, exist_ok=True)
    for source in (layout.logs, node.lib / "pod-logs"):
        if source.is_dir():
            shutil.copytree(source, kept / source.name, dirs_exist_ok=True, symlinks=False,
                            ignore_dangling_symlinks=True)
    return kept


def first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def node_ready(api: Any, name: str) -> bool:
    status, body = api.request("GET", f"/api/v1/nodes/{name}")
    return status == 200 and any(c.get("type") == "Ready" and c.get("status") == "True"
                                 for c in body.get("status", {}).get("conditions", []))


def install_chart(opts: Options, layout: Any, api: Any, helm: Path) -> None:
    """``helm install`` as a user does, then wait for every replica Ready and a leader; fail early and clearly when
    a container cannot start."""
    repository, _, tag = opts.image.rpartition(":")
    overrides = [] if opts.image == chart_image() else ["--set", f"image.repository={repository}",
                                                        "--set", f"image.tag={tag}"]
    log(f"helm install {RELEASE} charts/mcad (image {opts.image})")
    proc = run([str(helm), "upgrade", "--install", RELEASE, str(CHART), "--namespace", CHART_NAMESPACE,
                "--create-namespace", "--values", str(VALUES), *overrides, "--kubeconfig", str(layout.kubeconfig)],
               timeout=300)
    if proc.returncode != 0:
        raise E2EError(f"helm install failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr else ''}")
    deadline = time.monotonic() + opts.chart_timeout
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=controller"
    while True:
        status, body = api.request("GET", f"/api/v1/namespaces/{CHART_NAMESPACE}/pods?labelSelector={selector}")
        pods = body.get("items", []) if status == 200 else []
        stuck = [why for pod in pods if (why := container_stuck(api, pod))]
        if stuck:
            raise E2EError(f"the controller cannot start: {stuck[0]}")
        ready = [p["metadata"]["name"] for p in pods if pod_ready(p)]
        holder = lease_holder(api)
        if len(ready) >= 2 and holder and any(holder.startswith(name) for name in ready):
            log(f"{len(ready)} controller pods Ready; {holder.split('_')[0]} leads")
            return
        if time.monotonic() > deadline:
            phases = ", ".join(f"{p['metadata']['name']}: {describe_pod(p)}" for p in pods) or "no pods"
            raise E2EError(f"the controller was not Ready with a leader within {opts.chart_timeout:.0f} s ({phases})")
        time.sleep(1)


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def describe_pod(pod: dict[str, Any]) -> str:
    status = pod.get("status", {})
    for condition in status.get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"unschedulable: {condition.get('message', '')}"
    for container in status.get("containerStatuses", []):
        for state, detail in container.get("state", {}).items():
            if state != "running":
                return f"{state} {detail.get('reason', '')}".strip()
    return status.get("phase", "Unknown") + ("" if pod_ready(pod) else ", not Ready")


def container_stuck(api: Any, pod: dict[str, Any]) -> str | None:
    """Why a controller container will never start, with the last lines it logged; None while it may."""
    for container in pod.get("status", {}).get("containerStatuses", []):
        waiting = container.get("state", {}).get("waiting", {})
        if waiting.get("reason") in STUCK_REASONS:
            name = pod["metadata"]["name"]
            _, logs = api.request("GET", f"/api/v1/namespaces/{CHART_NAMESPACE}/pods/{name}/log"
                                  f"?container={container['name']}&previous=true&tailLines=3")
            tail = " | ".join(str(logs).strip().splitlines()) if isinstance(logs, str) and logs.strip() else ""
            last = container.get("lastState", {}).get("terminated", {})
            exit_code = f", exit code {last['exitCode']}" if "exitCode" in last else ""
            message = waiting.get("message", "")
            return (f"pod {name}: {waiting['reason']}{exit_code}" + (f": {message}" if message else "")
                    + (f"; its last log lines: {tail}" if tail else ""))
    return None


def lease_holder(api: Any) -> str | None:
    status, body = api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{CHART_NAMESPACE}/leases/"
                                      f"{RELEASE}-controller")
    return (body.get("spec", {}).get("holderIdentity") or None) if status == 200 else None


def print_usage(layout: Any) -> None:
    rel = os.path.relpath(layout.kubeconfig)
    print(f"""
Kubeconfig: {layout.kubeconfig}
  export KUBECONFIG={rel} PATH={os.path.relpath(layout.dev / 'bin')}:$PATH
  kubectl -n {CHART_NAMESPACE} get pods -o wide     # the chart's Deployment on the real node
Logs: {layout.logs}/   (kubelet.log, containerd.log, kube-proxy.log beside the control plane's)
Stop: make e2e-down""")


# ---------------------------------------------------------------------------------------------- down, status


def down(name: str, quiet: bool = False) -> list[str]:
    """Take everything down and put the host back; return what is left over (empty when the machine is clean)."""
    node = Node(name)
    state = read_node_state(node)
    layout = lc.Layout(name)
    if state is None and not layout.state.exists() and not node.lib.exists() and not node.run.exists():
        if not quiet:
            log(f"cluster {name!r} is not running")
        return []
    errors: list[str] = []
    if state:
        pids = {k: int(v) for k, v in state.get("pids", {}).items()}
        # The kubelet and kube-proxy first, while the API server still answers; containerd and the pods' processes
        # are stopped by hoststate.restore, which finds every one of them.
        for component in ("kube-proxy", "kubelet"):
            if component in pids:
                stop_group(pids[component])
        cleanup = state.get("kube_proxy_cleanup")
        if cleanup and Path(cleanup[0]).exists():
            proc = run(cleanup, timeout=60)
            if proc.returncode != 0:
                errors.append(f"kube-proxy --cleanup: {proc.stderr.strip().splitlines()[-1:] }")
    lc.down(name, quiet=True)
    before = (state or {}).get("before", {"sysctls": {}, "iptables": {}, "netns": []})
    errors += hoststate.restore(before, node.scope())
    left = hoststate.leftovers(before, node.scope())
    for error in errors:
        log(f"warning: {error}")
    if left:
        log("error: the machine is not as it was before up: " + "; ".join(left))
    elif not quiet:
        log(f"cluster {name!r} is down and the machine is as it was before up")
    return left


def stop_group(pid: int, timeout: float = 15) -> None:
    """SIGTERM the process group ``pid`` leads (lc.start gives each component one), SIGKILL after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while lc.pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not lc.pid_alive(pid):
            return


def healthy(name: str) -> bool:
    node = Node(name)
    state = read_node_state(node)
    if state is None or not lc.cluster_healthy(lc.Layout(name)):
        return False
    return all(lc.pid_alive(int(state.get("pids", {}).get(c, 0)) or -1) for c in NODE_COMPONENTS)


def status(name: str) -> int:
    node = Node(name)
    state = read_node_state(node)
    code = lc.status(name)
    if state is None:
        print(f"real node: not running ({node.state_file} missing)")
        return 1
    for component in NODE_COMPONENTS:
        pid = int(state.get("pids", {}).get(component, 0))
        print(f"  {component:<24} pid {pid:<8} {'running' if pid and lc.pid_alive(pid) else 'dead'}")
    return code if healthy(name) else 1


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/e2ecluster.py",
        description="The local control plane with one real node (containerd, kubelet, kube-proxy) beside kwok "
                    "nodes, and mcad installed on it by the Helm chart from its image. Needs root and Docker.",
        epilog="Environment: NODES, NODE_CPU, NODE_MEMORY, NODE_GPU for the kwok nodes (as hack/localcluster.py); "
               "E2E_IMAGE for --image; E2E_KUBELET_ARGS, extra kubelet flags split on whitespace; MCAD_DEV_CACHE "
               "(default ~/.cache/mcad-dev) for the binaries and the pause image's.")
    parser.add_argument("--name", default=os.environ.get("E2E_CLUSTER_NAME", DEFAULT_NAME),
                        help="cluster name (default %(default)s): state in .dev/clusters/<name>, /var/lib/mcad-<name>")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the cluster, its real node and the chart (harmless if already up)")
    lc.add_node_arguments(p_up)
    p_up.add_argument("--image", default=os.environ.get("E2E_IMAGE") or chart_image(),
                      help="the controller image, from Docker (default: the chart's, %(default)s; make image)")
    p_up.add_argument("--api-port", type=int, default=lc.env_int("E2E_API_PORT", 0),
                      help="the API server's port (default: any free one)")
    p_up.add_argument("--node-timeout", type=float, default=120,
                      help="seconds for the kubelet to register its node Ready (default %(default)s)")
    p_up.add_argument("--chart-timeout", type=float, default=240,
                      help="seconds for the controller pods to be Ready with a leader (default %(default)s)")
    p_up.add_argument("--no-chart", dest="chart", action="store_false", help="do not install the chart")
    sub.add_parser("down", help="stop everything and put the machine back; exit 1 if something is left")
    sub.add_parser("status", help="show whether the cluster and its node run; exit 1 if not")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            up(Options(args.name, args.nodes, args.node_cpu, args.node_memory, args.node_gpu, args.image,
                       host_address(), args.api_port, args.node_timeout, args.chart_timeout, args.chart,
                       tuple(os.environ.get("E2E_KUBELET_ARGS", "").split())))
        elif args.command == "down":
            return 1 if down(args.name) else 0
        else:
            return status(args.name)
    except (E2EError, lc.ClusterError) as err:
        log(f"error: {first_line(err)}")
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
