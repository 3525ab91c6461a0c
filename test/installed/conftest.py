"""Fixtures of the suite against an installation (`make e2e`): mcad as a platform admin installs it.

The cluster is hack/e2ecluster.py's: the local control plane with one real kubelet node, and the chart installed
on it by ``helm install`` from the image (`make image`), its Deployment's two replicas running in containers. The
session brings it up unless it already runs (`make e2e-up`), and then takes it down at the end, failing if the
machine is not as it was before (``down`` checks for processes, mounts, cgroups, chains, bridges and sysctls left);
MCAD_KEEP_CLUSTER=1 keeps it. This suite is collected only with ``--installed`` (test/conftest.py).

Tests that change the installation (upgrade, uninstall, certificates) put it back as they found it, and every test
starts by checking that both replicas are Ready and one leads (``installation``). Tests marked ``bringup`` start
clusters of their own to check how ``up`` fails; they run first, before the session's cluster is up (only one
real-node cluster can run on a machine).

A failed test leaves, in .dev/e2e-logs/installed/<test>/, the controller pods' logs (their previous containers'
too), ``kubectl describe`` of the release's pods and of the test's namespace, and the node components' logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcad.k8s import kube
from test.e2e.conftest import other_namespace  # noqa: F401  (a fixture, shared with test/e2e)
from test.support import REPO, load_hack_module, token_kubeconfig, wait_until

e2ecluster = load_hack_module("e2ecluster")
LOGS = REPO / ".dev" / "e2e-logs" / "installed"
NAMESPACE = e2ecluster.CHART_NAMESPACE
RELEASE = e2ecluster.RELEASE
CONTROLLER = f"{RELEASE}-controller"
SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=controller"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bringup: starts clusters of its own to check how hack/e2ecluster.py up fails; "
                                       "runs before the session's cluster is up")
    config.addinivalue_line("markers", "this_machine: checks hack/e2ecluster.py's real node on this machine, not an "
                                       "installation (hack/e2e-kind.sh deselects it with the bringup ones)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The bring-up checks first: they need the machine free of any real-node cluster, the session's included.
    items.sort(key=lambda item: item.get_closest_marker("bringup") is None)


def run(*argv: str, timeout: float = 300, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def e2ecluster_command(*args: str, timeout: float = 900, env: dict[str, str] | None = None
                       ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", str(REPO / "hack" / "e2ecluster.py"), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@dataclass
class Installation:
    """The session's cluster and the chart's release on it."""

    kubeconfig: str
    bin_dir: Path

    @property
    def conn(self) -> kube.Connection:
        return kube.connect(self.kubeconfig)

    def kubectl(self, *args: str, kubeconfig: str | None = None, input_text: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """kubectl as the admin, or as whoever ``kubeconfig`` is; ``input_text`` on its stdin."""
        return run(str(self.bin_dir / "kubectl"), "--kubeconfig", kubeconfig or self.kubeconfig, *args, check=check,
                   timeout=timeout, input=input_text)

    def helm(self, *args: str, timeout: float = 300) -> str:
        return run(str(self.bin_dir / "helm"), "--kubeconfig", self.kubeconfig, *args, timeout=timeout).stdout

    def get(self, path: str) -> dict[str, Any]:
        return kube.request_json(self.conn, "GET", path)  # type: ignore[no-any-return]

    def pods(self) -> list[dict[str, Any]]:
        """The controller's pods (not those terminating)."""
        items = self.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if e2ecluster.pod_ready(p)]

    def holder(self) -> str | None:
        """The pod named by the leader Lease's holder identity, or None."""
        try:
            lease = self.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{CONTROLLER}")
        except kube.ApiError as err:
            if err.status == 404:
                return None
            raise
        identity = lease["spec"].get("holderIdentity") or ""
        return identity.rsplit("_", 1)[0] or None

    def healthy(self) -> str | None:
        """The leader's pod name when two replicas are Ready and a Ready one holds the Lease, else None."""
        ready = {p["metadata"]["name"] for p in self.ready_pods()}
        holder = self.holder()
        return holder if len(ready) >= 2 and holder in ready else None

    def wait_healthy(self, timeout: float = 180) -> str:
        return wait_until(self.healthy, timeout, "two controller replicas Ready and one of them leading")

    def values(self) -> dict[str, Any]:
        """The release's user-supplied values."""
        return json.loads(self.helm("get", "values", RELEASE, "-n", NAMESPACE, "-o", "json")) or {}

    def upgrade(self, values: dict[str, Any], tmp: Path, *extra: str) -> None:
        path = tmp / "values.json"
        path.write_text(json.dumps(values))
        self.helm("upgrade", RELEASE, str(e2ecluster.CHART), "-n", NAMESPACE, "--values", str(path), *extra)

    def token(self, namespace: str, name: str, *, cluster_roles: tuple[str, ...] = (),
              roles: tuple[tuple[str, str], ...] = (), tmp: Path | None = None) -> str:
        """A token of ServiceAccount ``namespace/name`` bound as asked (test.e2e.conftest.service_account_token);
        with ``tmp``, the path of a kubeconfig carrying only it instead."""
        from test.e2e.conftest import service_account_token

        token = service_account_token(self.kubeconfig, namespace, name, cluster_roles=cluster_roles, roles=roles)
        if tmp is None:
            return token
        return token_kubeconfig(self.kubeconfig, token, tmp / f"{name}.kubeconfig", user=name)

    def real_node(self) -> str:
        """The node the controller runs on: the one labelled as the cluster's real node (KinD's too)."""
        nodes = self.get(f"/api/v1/nodes?labelSelector={e2ecluster.REAL_NODE_LABEL}=true")["items"]
        assert len(nodes) == 1, [n["metadata"]["name"] for n in nodes]
        return str(nodes[0]["metadata"]["name"])

    def service_url(self, service: str, port: str, scheme: str = "http") -> str:
        """The Service's ClusterIP URL: kube-proxy routes it from this machine, the real node (on KinD,
        hack/e2e-kind.sh routes the Service and pod ranges to the node's container)."""
        svc = self.get(f"/api/v1/namespaces/{NAMESPACE}/services/{service}")
        number = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == port)
        return f"{scheme}://{svc['spec']['clusterIP']}:{number}"


def http_get(url: str, token: str | None = None, timeout: float = 10,
             context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """GET ``url`` (a ClusterIP or pod IP: this machine is the node, so it routes them); (status, body)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout,
                                    context=context) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@pytest.fixture(scope="session")
def e2e_cluster() -> Iterator[Installation]:
    """The session's cluster, up with the chart installed (brought up here unless it already runs). With
    MCAD_TEST_KUBECONFIG, a cluster someone else installed the chart on (hack/e2e-kind.sh), used as it is."""
    bin_dir = Path(run(str(REPO / "hack" / "build-tools.sh"), "--print").stdout.strip())
    given = os.environ.get("MCAD_TEST_KUBECONFIG")
    if given:
        yield Installation(given, bin_dir)
        return
    started_here = e2ecluster_command("status").returncode != 0
    if started_here:
        proc = e2ecluster_command("up")
        if proc.returncode != 0:
            pytest.exit(f"hack/e2ecluster.py up failed:\n{proc.stderr[-4000:]}", returncode=3)
    layout = load_hack_module("localcluster").Layout(e2ecluster.DEFAULT_NAME)
    installation = Installation(str(layout.kubeconfig), bin_dir)
    try:
        yield installation
    finally:
        if started_here and os.environ.get("MCAD_KEEP_CLUSTER") != "1":
            proc = e2ecluster_command("down")
            assert proc.returncode == 0, f"hack/e2ecluster.py down left the machine changed:\n{proc.stderr}"


@pytest.fixture(scope="session")
def kubeconfig(e2e_cluster: Installation) -> str:
    """The session's cluster for the shared fixtures of test/conftest.py (api, core, namespace...)."""
    return e2e_cluster.kubeconfig


@pytest.fixture
def installation(e2e_cluster: Installation) -> Installation:
    """The installation, checked healthy (two replicas Ready, one leading) before the test."""
    e2e_cluster.wait_healthy()
    return e2e_cluster


@pytest.fixture
def no_real_node() -> None:
    """For the bring-up checks: no real-node cluster may run on the machine (theirs would be refused)."""
    if e2ecluster_command("status").returncode == 0:
        pytest.fail("the bring-up checks start real-node clusters of their own; take the e2e cluster down first "
                    "(make e2e-down)")


# What the tests measured (failover, bring-up, probes), for `make e2e`'s summary and .dev/e2e-logs/installed/.
FIGURES: dict[str, str] = {}


def record(name: str, value: str) -> None:
    FIGURES[name] = value


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("measured on the installation")
    for name, value in FIGURES.items():
        terminalreporter.write_line(f"{name}: {value}")
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / "figures.json").write_text(json.dumps(FIGURES, indent=2) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and report.when in ("setup", "call"):
        saved = save_artifacts(item, item.funcargs.get("namespace"))
        if saved:
            report.sections.append(("kept for the failure", str(saved)))
    return report


def save_artifacts(item: pytest.Item, namespace: str | None) -> Path | None:
    """The controller pods' logs, `kubectl describe` output and node component logs, in .dev/e2e-logs."""
    layout = load_hack_module("localcluster").Layout(e2ecluster.DEFAULT_NAME)
    if not layout.kubeconfig.exists():
        return None
    directory = LOGS / re.sub(r"[^\w.-]+", "_", item.nodeid)
    directory.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(run(str(REPO / "hack" / "build-tools.sh"), "--print", check=False).stdout.strip() or ".")
    kubectl = [str(bin_dir / "kubectl"), "--kubeconfig", str(layout.kubeconfig)]

    def keep(name: str, *args: str) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            proc = subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=60)
            (directory / name).write_text(proc.stdout + proc.stderr)

    keep("pods.txt", "get", "pods", "-A", "-o", "wide")
    keep("describe-controller.txt", "-n", NAMESPACE, "describe", "pods", "-l", SELECTOR)
    keep("events-controller.txt", "-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp")
    keep("lease.yaml", "-n", NAMESPACE, "get", "lease", CONTROLLER, "-o", "yaml")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        names = subprocess.run([*kubectl, "-n", NAMESPACE, "get", "pods", "-l", SELECTOR, "-o", "name"],
                               capture_output=True, text=True, timeout=60).stdout.split()
        for name in names:
            pod = name.split("/", 1)[1]
            keep(f"{pod}.log", "-n", NAMESPACE, "logs", pod)
            keep(f"{pod}.previous.log", "-n", NAMESPACE, "logs", pod, "--previous")
    if namespace:
        keep("describe-namespace.txt", "-n", namespace, "describe", "appwrappers,deployments,jobs,pods")
    for component in ("kubelet", "containerd", "kube-proxy", "kube-apiserver"):
        with contextlib.suppress(OSError):
            shutil.copy(layout.logs / f"{component}.log", directory / f"{component}.log")
    return directory

