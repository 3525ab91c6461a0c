"""mcad.hub.clusters against two real API servers side by side: the hub (the test cluster) and a second worker.

The second cluster is $MCAD_TEST_WORKER_KUBECONFIG if set, else hack/localcluster.py's ``c8b``, brought up for
this module when it does not run yet (and taken down afterwards, unless MCAD_KEEP_CLUSTER=1). The hub is
also a worker "by file", as a hub that runs workloads itself would be configured. Stopping the worker's API
server is done with SIGSTOP/SIGCONT on its process, which freezes it without losing its state, ports or
certificates (a restart through ``up`` would mint new ones and invalidate the Secret under test).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
import yaml

from mcad.hub.clusters import (
    HealthState,
    HubConfig,
    WorkerConnectError,
    WorkerConnector,
    WorkerHealth,
    check,
    load_config,
    probe,
)
from mcad.hub.connections import Hub
from mcad.k8s import kube
from test.support import REPO, frozen_process, wait_until

WORKER_KUBECONFIG = Path(os.environ.get("MCAD_TEST_WORKER_KUBECONFIG", REPO / ".dev" / "kubeconfig-c8b"))
WORKER_STATE = REPO / ".dev" / "clusters" / "c8b" / "state.json"



def _local_cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "hack" / "localcluster.py"), "--name", "c8b", *args],
                          text=True, stdout=subprocess.PIPE, check=False)


@pytest.fixture(scope="module", autouse=True)
def worker_cluster() -> Iterator[None]:
    """The worker cluster: given, running already, or started here for the module."""
    if os.environ.get("MCAD_TEST_WORKER_KUBECONFIG"):
        yield
        return
    started_here = _local_cluster("status").returncode != 0
    if started_here:
        proc = _local_cluster("up", "--nodes", "1")
        assert proc.returncode == 0, f"the worker cluster c8b did not come up (exit {proc.returncode})"
    try:
        yield
    finally:
        if started_here and os.environ.get("MCAD_KEEP_CLUSTER") != "1":
            _local_cluster("down")


def worker_kubeconfig() -> dict[str, Any]:
    return json.loads(WORKER_KUBECONFIG.read_text())  # type: ignore[no-any-return]


def secret_with(name: str, kubeconfig: dict[str, Any]) -> k8s.V1Secret:
    text = json.dumps(kubeconfig)
    return k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name),
                        data={"kubeconfig": base64.b64encode(text.encode()).decode()})


def put_secret(core: k8s.CoreV1Api, namespace: str, name: str, kubeconfig: dict[str, Any]) -> None:
    core.create_namespaced_secret(namespace, secret_with(name, kubeconfig))


def state_of(health: WorkerHealth) -> HealthState:
    """Read afresh: mypy would otherwise keep the narrowed state of an earlier assert across checks."""
    return health.state


def node_names(conn: kube.Connection) -> list[str]:
    nodes = kube.request_json(conn, "GET", "/api/v1/nodes")
    return sorted(item["metadata"]["name"] for item in nodes["items"])


@pytest.fixture
def config_file(tmp_path: Path, kubeconfig: str, namespace: str, core: k8s.CoreV1Api) -> Path:
    put_secret(core, namespace, "c8b-kubeconfig", worker_kubeconfig())
    rejected = worker_kubeconfig()
    for user in rejected["users"]:
        user["user"] = {"token": "not-a-token-this-server-knows"}
    put_secret(core, namespace, "c8b-rejected", rejected)
    path = tmp_path / "clusters.yaml"
    path.write_text(f"""
workers:
  - name: hub
    kubeconfig: {kubeconfig}
    labels: {{role: hub}}
  - name: c8b
    secret: {{namespace: {namespace}, name: c8b-kubeconfig}}
  - name: c8b-rejected
    secret: {{name: c8b-rejected}}
""")
    return path


@pytest.fixture
def connector(kubeconfig: str, namespace: str) -> WorkerConnector:
    # Secrets without a namespace are read from the controller's namespace: here the test's.
    return WorkerConnector(kube.connect(kubeconfig), namespace=namespace)


def test_connectors_reach_both_clusters_by_file_and_by_secret(config_file: Path, connector: WorkerConnector,
                                                               kubeconfig: str) -> None:
    config = load_config(config_file)
    hub = connector.connect(config.worker("hub"))
    worker = connector.connect(config.worker("c8b"))
    assert hub.server != worker.server
    assert worker.source.startswith("Secret ") and "c8b-kubeconfig" in worker.source
    assert node_names(hub) == node_names(kube.connect(kubeconfig))
    assert node_names(worker) == node_names(kube.connect(str(WORKER_KUBECONFIG)))
    assert node_names(worker)  # c8b has its own fake node(s)
    assert kube.server_version(worker).startswith("v1.")
    assert not list(Path(tempfile.gettempdir()).glob("mcad-worker-c8b-*"))  # no kubeconfig left behind


def test_rejected_credentials_make_the_worker_unauthorized(config_file: Path, connector: WorkerConnector) -> None:
    conn = connector.connect(load_config(config_file).worker("c8b-rejected"))
    health = WorkerHealth("c8b-rejected")
    assert check(health, conn)
    assert health.state is HealthState.UNAUTHORIZED
    assert health.status.message.startswith("credentials rejected (401 ")


def test_missing_secret_names_worker_and_status(config_file: Path, connector: WorkerConnector,
                                                core: k8s.CoreV1Api, namespace: str) -> None:
    core.delete_namespaced_secret("c8b-kubeconfig", namespace)
    with pytest.raises(WorkerConnectError) as err:
        connector.connect(load_config(config_file).worker("c8b"))
    assert "worker cluster c8b: cannot read Secret" in str(err.value)
    assert err.value.status == 404


@pytest.fixture
def worker_api_server_pid() -> int:
    """The worker's kube-apiserver pid."""
    if not WORKER_STATE.exists():
        pytest.skip(f"{WORKER_STATE} missing: the worker is not a hack/localcluster.py cluster named c8b")
    return int(json.loads(WORKER_STATE.read_text())["pids"]["kube-apiserver"])


def test_stopped_api_server_makes_the_worker_unreachable_and_resumed_healthy_again(
        config_file: Path, connector: WorkerConnector, worker_api_server_pid: int) -> None:
    conn = connector.connect(load_config(config_file).worker("c8b"))
    health = WorkerHealth("c8b", failure_threshold=2)
    assert check(health, conn) and health.state is HealthState.HEALTHY

    with frozen_process(worker_api_server_pid):
        assert not check(health, conn, timeout_seconds=1.0)  # one failure is within the threshold
        assert check(health, conn, timeout_seconds=1.0)
        assert state_of(health) is HealthState.UNREACHABLE and health.status.consecutive_failures == 2
        assert "no answer" in health.status.message
        assert health.down_for() > 0

    wait_until(lambda: check(health, conn, timeout_seconds=2.0) or health.usable(), timeout=30,
               what="the resumed worker to be Healthy again")
    assert state_of(health) is HealthState.HEALTHY and health.status.down_since is None
    assert node_names(conn)


def test_closed_port_is_unreachable_at_once_for_a_never_reached_worker(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on once the socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = worker_kubeconfig()
    for cluster in dead["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = tmp_path / "dead.kubeconfig"
    path.write_text(json.dumps(dead))
    config_path = tmp_path / "clusters.yaml"
    config_path.write_text("workers: [{name: gone, kubeconfig: dead.kubeconfig}]\n")
    conn = WorkerConnector(None).connect(load_config(config_path).worker("gone"))
    health = WorkerHealth("gone")
    assert check(health, conn, timeout_seconds=2.0)
    assert health.state is HealthState.UNREACHABLE
    with pytest.raises(kube.ApiError) as err:
        probe(conn, 2.0)
    assert err.value.status == 0


def test_a_rotated_secret_is_adopted_in_place_and_a_moved_server_is_refused(
        config_file: Path, connector: WorkerConnector, core: k8s.CoreV1Api, namespace: str,
        kubeconfig: str) -> None:
    """The worker's thread notices the Secret changed while the worker is Unauthorized and moves the worker's one
    connection onto the new credentials (a token replaced by a client certificate: a new TLS pool)."""
    spec = load_config(config_file).worker("c8b-rejected")
    hub = Hub(HubConfig(workers=(spec,)), connector, probe_period=0.2)
    hub.start()
    try:
        wait_until(lambda: hub.health(spec.name).state is HealthState.UNAUTHORIZED, 30, "c8b-rejected Unauthorized")
        worker = hub.worker(spec.name)
        assert worker is not None and worker.conn is not None
        conn = worker.conn

        core.replace_namespaced_secret("c8b-rejected", namespace, secret_with("c8b-rejected", worker_kubeconfig()))

        wait_until(lambda: hub.usable(spec.name), 30, "c8b-rejected usable with the rotated credentials")
        assert worker.conn is conn  # the same connection, so every informer and writer on it follows
        assert {n.name.partition("/")[0] for n in hub.nodes.list()} == {spec.name}
        assert sorted(n.name.partition("/")[2] for n in hub.nodes.list()) == node_names(
            kube.connect(str(WORKER_KUBECONFIG)))
    finally:
        hub.stop()

    # Credentials for another API server (here: the hub's own) would mix two clusters in one cache.
    hub_own = yaml.safe_load(Path(kubeconfig).read_text())
    core.replace_namespaced_secret("c8b-rejected", namespace, secret_with("c8b-rejected", hub_own))
    assert not hub.recheck_credentials(worker)
    assert worker.conn.server == conn.server and node_names(worker.conn)
    assert not hub.recheck_credentials(worker)  # the refused text is not tried again until it changes


def test_a_hanging_worker_delays_only_its_own_probes(config_file: Path, connector: WorkerConnector,
                                                     worker_api_server_pid: int) -> None:
    config = load_config(config_file)
    hub = Hub(HubConfig(workers=(config.worker("c8b"), config.worker("hub"))), connector, probe_period=0.05)
    assert [t.name for t in hub.start()] == ["hub-c8b", "hub-hub"]
    try:
        wait_until(lambda: hub.usable("c8b") and hub.usable("hub"), 30, "both workers usable")
        hanging, answering = hub.worker("c8b"), hub.worker("hub")
        assert hanging is not None and answering is not None
        with frozen_process(worker_api_server_pid):
            before = (hanging.probes, answering.probes)
            # Each probe of the frozen c8b waits out its 2 s timeout; probed in turn, "hub" would get one per c8b's.
            wait_until(lambda: answering.probes >= before[1] + 5, 30, "five probes of the answering worker")
            assert hanging.probes <= before[0] + 1
            assert hub.usable("hub")
    finally:
        hub.stop()
