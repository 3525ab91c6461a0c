"""mcadctl against a real controller process and a real API server, by every route it can take.

One controller (leader election on, identity ``leader-0_...``) runs for the module with its HTTP endpoint on every
interface. The API server refuses to proxy to loopback, but this machine also has 192.0.2.2, so each route is
built the way a cluster would have it: a Pod that is never scheduled (``schedulerName: none``) whose status.podIP is
set to 192.0.2.2 stands for the controller's pod, a selector-less Service ``mcad-controller`` with Endpoints that
point at that Pod stands for the chart's Service, and a Lease names the holder. AppWrappers bigger than the
cluster queue forever (in a known order: priority, then creation, then name) and a small one runs.

The controller checks who asks: mcadctl presents a reader ServiceAccount's token (MCAD_TOKEN), bound to the chart's
debug-viewer and metrics-reader ClusterRoles (rendered from the chart and applied under names of this module's).
The admin kubeconfig authenticates with a client certificate, which mcadctl cannot pass on.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from click.testing import CliRunner, Result

from mcad.cli import mcadctl, offline, reach
from mcad.k8s import kube
from test import chart
from test.e2e.conftest import (
    DEBUG_VIEWER,
    GROUP,
    LOGS,
    METRICS_READER,
    PLURAL,
    VERSION,
    appwrapper,
    blocked_on,
    deployment_item,
    service_account_token,
)
from test.e2e.dashboard import mcadctl_dashboard
from test.support import free_port, token_kubeconfig, wait_until

BIN = Path(sys.executable).parent
HOST_IP = "192.0.2.2"  # an address of this machine that the API server is willing to proxy to
QUEUED = ["huge-high", "huge-low-a", "huge-low-b"]  # the dispatch order: priority, then creation, then name
# The controller's topology levels: labels the local cluster's nodes carry (hack/localcluster.py): every kwok node
# has type=kwok, and each its own hostname. Nodes other tests make may carry neither.
LEVELS = ("type", "kubernetes.io/hostname")


@contextlib.contextmanager
def controller_process(kubeconfig: str, pod_name: str, port: int, election_namespace: str,
                       log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """mcad-controller as pod ``pod_name`` (its leader-election identity), serving HTTP on every interface at
    ``port``, competing for the Lease ``election`` in ``election_namespace``; yielded once /readyz says ready
    (it leads, or it knows who does)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "mcad-controller"), "--kubeconfig", kubeconfig, "--log-format", "console",
             "--http-bind-address", f"0.0.0.0:{port}", "--leader-elect", "--leader-elect-namespace",
             election_namespace, "--leader-elect-lease-name", "election",
             # mcadctl reads /debug; admission is not what this tests (nothing registers the webhooks here).
             "--no-webhook", *(arg for level in LEVELS for arg in ("--topology-level", level))],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "POD_NAME": pod_name})

    def ready() -> bool:
        assert proc.poll() is None, f"the controller exited:\n{log.read_text(errors='replace')[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_until(ready, 60, f"controller {pod_name} to be ready")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def create_namespace(core: k8s.CoreV1Api) -> str:
    name = f"mcadctl-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mcad.test/owned": "true"}}})
    return name


def controller_pod(core: k8s.CoreV1Api, namespace: str, name: str) -> None:
    """A Pod named like a controller replica, never scheduled, whose IP is this machine's: the API server's pod
    proxy then reaches whatever listens here."""
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": name},
        "spec": {"schedulerName": "none", "containers": [{"name": "controller", "image": "mcad"}]}})
    core.patch_namespaced_pod_status(name, namespace, {"status": {"podIP": HOST_IP, "podIPs": [{"ip": HOST_IP}]}})


def controller_service(core: k8s.CoreV1Api, namespace: str, pod: str, port: int,
                       name: str = "mcad-controller") -> None:
    """The Service ``name`` (port name http) with Endpoints to ``pod`` at ``port``. Selector-less, so the
    Endpoints are ours to write; the service proxy accepts only addresses that name a Pod with that IP. (The
    chart's ``mcad-controller-leader`` selects the pod the leader labels: test/e2e/test_leader_election.py.)"""
    core.create_namespaced_service(namespace, {
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": port}]}})
    core.create_namespaced_endpoints(namespace, {
        "metadata": {"name": name},
        "subsets": [{"addresses": [{"ip": HOST_IP, "targetRef": {"kind": "Pod", "name": pod,
                                                                  "namespace": namespace}}],
                     "ports": [{"name": "http", "port": port}]}]})


def lease(coordination: k8s.CoordinationV1Api, namespace: str, holder: str) -> None:
    coordination.create_namespaced_lease(namespace, {
        "metadata": {"name": "mcad-controller"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 3600}})


@dataclass
class Cluster:
    kubeconfig: str
    core: k8s.CoreV1Api
    namespace: str  # where the AppWrappers are
    election_namespace: str  # where the controller's own Lease is
    port: int  # the controller's HTTP port
    created: list[str]  # namespaces to delete at the end

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def new_namespace(self) -> str:
        name = create_namespace(self.core)
        self.created.append(name)
        return name


# The reader's token, set by the ``cluster`` fixture; every mcadctl call of this module presents it.
TOKEN: dict[str, str] = {}


def mcadctl_(*args: str, token: str | None = "") -> Result:
    """mcadctl in this process, with the reader's token (``token``: another one; None: none at all)."""
    token = TOKEN.get("reader") if token == "" else token
    return CliRunner(env={"COLUMNS": "200", "MCAD_TOKEN": token}).invoke(mcadctl.main, list(args))


def reader_roles(kubeconfig: str) -> tuple[str, ...]:
    """The chart's endpoint reader ClusterRoles, applied under this module's names (a release of the chart may be
    installed in the same cluster, and its objects are Helm's)."""
    client = kube.Client(kube.connect(kubeconfig))
    names = []
    for role in chart.render():
        if role["kind"] == "ClusterRole" and role["metadata"]["name"] in (METRICS_READER, DEBUG_VIEWER):
            name = f"mcadctl-test-{role['metadata']['name']}"
            client.apply({**role, "metadata": {"name": name}}, field_manager="mcad-test", force=True)
            names.append(name)
    assert len(names) == 2, names
    return tuple(names)


def queued_names(doc: dict[str, Any], namespace: str) -> list[str]:
    return [aw["name"] for aw in doc["queued"] if aw["namespace"] == namespace]


@pytest.fixture(scope="module")
def cluster(kubeconfig: str, crd: None, quota_crd: None, api: k8s.ApiClient) -> Iterator[Cluster]:
    core = k8s.CoreV1Api(api)
    custom = k8s.CustomObjectsApi(api)
    env = Cluster(kubeconfig, core, create_namespace(core), create_namespace(core), free_port(), [])
    env.created += [env.namespace, env.election_namespace]
    TOKEN["reader"] = service_account_token(kubeconfig, env.election_namespace, "reader",
                                            cluster_roles=reader_roles(kubeconfig))
    try:
        with controller_process(kubeconfig, "leader-0", env.port, env.election_namespace,
                                LOGS / "mcadctl-leader.log"):
            # A thousand cpus fit no test cluster: these stay queued whatever the nodes are. Created in this
            # order, huge-low-a is older than huge-low-b or as old (and first by name); huge-high goes first
            # by priority although it is the newest.
            for name, priority in [("huge-low-a", 0), ("huge-low-b", 0), ("huge-high", 10)]:
                custom.create_namespaced_custom_object(GROUP, VERSION, env.namespace, PLURAL, appwrapper(
                    name, deployment_item(name, 2, "500"), priority=priority))
            custom.create_namespaced_custom_object(GROUP, VERSION, env.namespace, PLURAL, appwrapper(
                "runs", deployment_item("runs", 1, "100m")))

            def settled() -> bool:
                states = {aw["metadata"]["name"]: (aw.get("status") or {}).get("state") for aw in
                          custom.list_namespaced_custom_object(GROUP, VERSION, env.namespace, PLURAL)["items"]}
                return states == {**dict.fromkeys(QUEUED, "Pending"), "runs": "Running"}

            wait_until(settled, 60, "three AppWrappers queued and one running")
            yield env
    finally:
        for name in env.created:
            core.delete_namespace(name, propagation_policy="Background")


# -- straight to the controller (--url) ------------------------------------------------------------------------------


def test_queue_shows_the_queue_in_order_with_the_why(cluster: Cluster) -> None:
    result = mcadctl_("--url", cluster.url, "queue", "-n", cluster.namespace, "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["controller"]["leader"] is True
    assert doc["controller"]["identity"].startswith("leader-0_")
    assert queued_names(doc, cluster.namespace) == QUEUED
    positions = [aw["position"] for aw in doc["queued"]]
    assert positions == sorted(positions)
    for aw in doc["queued"]:
        assert aw["fitsNow"] is False
        assert blocked_on(aw["why"], "cpu"), aw
        assert aw["demand"]["cpu"] == "1000"
    assert [(aw["name"], aw["state"]) for aw in doc["dispatched"]] == [("runs", "Running")]

    table = mcadctl_("--url", cluster.url, "queue", "-n", cluster.namespace, "--dispatched")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[2].split()[:8] == ["POSITION", "NAMESPACE", "NAME", "PRIORITY", "AGE", "STATE", "DEMAND", "WHY"]
    assert [line.split()[2] for line in lines[3:6]] == QUEUED
    assert lines[3].split()[3] == "10"  # PRIORITY
    assert any(line.split()[:2] == [cluster.namespace, "runs"] for line in lines[6:])


def test_queue_pages_are_cut_by_the_controller(cluster: Cluster) -> None:
    result = mcadctl_("--url", cluster.url, "queue", "-n", cluster.namespace, "--limit", "1", "--offset", "1",
                      "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert queued_names(doc, cluster.namespace) == QUEUED[1:2]
    assert doc["page"] == {"offset": 1, "limit": 1, "queuedTotal": len(QUEUED)}
    assert [aw["name"] for aw in doc["dispatched"]] == ["runs"], "the dispatched ones are not paged"
    table = mcadctl_("--url", cluster.url, "queue", "-n", cluster.namespace, "--limit", "2")
    lines = table.stdout.splitlines()
    hint = f"(queued rows 1-2 of {len(QUEUED)}; --offset 2 for the next 2; --limit 0 for all)"
    assert hint in lines, lines
    # Right under the rows, before where the reader stands (the controller here says fair sharing is off).
    assert lines.index(hint) < next(i for i, line in enumerate(lines) if line.startswith("Fair sharing")), lines


def test_ledger_shows_capacity_use_and_every_node(cluster: Cluster) -> None:
    def ledger() -> dict[str, Any]:
        result = mcadctl_("--url", cluster.url, "ledger", "--nodes", "-o", "json")
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.stdout))

    def cpu_of(doc: dict[str, Any]) -> dict[str, str]:
        return dict(next(r for r in doc["resources"] if r["name"] == "cpu"))

    # "runs" is Running once its Deployment exists; its pod is counted as used only after the Deployment
    # controller has made it and the scheduler has bound it, which may come a little later.
    wait_until(lambda: cpu_of(ledger())["used"] != "0", 30, "the bound pod of 'runs' to be counted as used")
    doc = ledger()
    cpu = cpu_of(doc)
    nodes = {n.metadata.name for n in cluster.core.list_node().items}
    assert {n["name"] for n in doc["nodes"]} == nodes
    assert all(cpu[k] for k in ("capacity", "used", "reserved", "free"))

    table = mcadctl_("--url", cluster.url, "ledger", "--nodes")
    assert table.exit_code == 0, table.output
    assert any(line.split()[:1] == ["RESOURCE"] for line in table.stdout.splitlines())
    for node in nodes:
        assert any(line.split()[:3] == [node, "Ready", "cpu"] for line in table.stdout.splitlines()), table.stdout


def test_ledger_topology_adds_up_each_domain_of_the_controllers_levels(cluster: Cluster) -> None:
    result = mcadctl_("--url", cluster.url, "ledger", "--topology", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [level["level"] for level in doc["levels"]] == list(LEVELS)
    labels = {n.metadata.name: n.metadata.labels or {} for n in cluster.core.list_node().items}
    for level in doc["levels"]:
        values = [node.get(level["level"]) for node in labels.values()]
        expected = {value: values.count(value) for value in values if value is not None}
        assert {d["value"]: d["nodes"] for d in level["domains"]} == expected, level
        assert [d["value"] for d in level["domains"]] == sorted(expected), "domains by value"
        assert level["none"]["nodes"] == values.count(None)
    kwok = doc["levels"][0]["domains"][0]
    assert kwok["value"] == "kwok" and kwok["schedulable"] >= 1 and kwok["free"]["cpu"] != "0", kwok

    table = mcadctl_("--url", cluster.url, "ledger", "--topology", "--level", "type")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert any(line.startswith("LEVEL type: ") for line in lines) and "LEVEL kubernetes.io/hostname" not in table.stdout
    assert any(line.split()[:3] == ["kwok", f"{kwok['schedulable']}/{kwok['nodes']}", "cpu"] for line in lines)

    # The controller reports its levels' labels only: any other is refused, and named as what it cannot show.
    other = mcadctl_("--url", cluster.url, "ledger", "--topology", "--level", "kubernetes.io/os")
    assert other.exit_code == 1 and "not of kubernetes.io/os" in other.stderr, other.output
    # Offline, the levels given stand for the controller's, and any node label will do.
    offline_doc = mcadctl_("--kubeconfig", cluster.kubeconfig, "--offline", "ledger", "--topology", "--level",
                           "kubernetes.io/os", "-o", "json")
    assert offline_doc.exit_code == 0, offline_doc.output
    [os_level] = json.loads(offline_doc.stdout)["levels"]
    os_values = [node.get("kubernetes.io/os") for node in labels.values()]
    assert {d["value"]: d["nodes"] for d in os_level["domains"]} == {
        value: os_values.count(value) for value in os_values if value is not None}


def test_explain_says_why_in_plain_words(cluster: Cluster) -> None:
    queued = mcadctl_("--url", cluster.url, "explain", f"{cluster.namespace}/huge-low-a")
    assert queued.exit_code == 0, queued.output
    first, *details = queued.stdout.splitlines()
    assert first.startswith(f"{cluster.namespace}/huge-low-a [Pending]: It is queued and cannot be dispatched yet")
    # Positions are places in the whole queue, which other namespaces may share.
    doc = json.loads(mcadctl_("--url", cluster.url, "queue", "-o", "json").stdout)
    position = next(aw["position"] for aw in doc["queued"]
                    if (aw["namespace"], aw["name"]) == (cluster.namespace, "huge-low-a"))
    assert f"  - position {position} of {len(doc['queued'])} in the queue" in details

    running = mcadctl_("--url", cluster.url, "explain", f"{cluster.namespace}/runs")
    assert running.exit_code == 0, running.output
    assert "It is dispatched (Running)" in running.stdout

    missing = mcadctl_("--url", cluster.url, "explain", f"{cluster.namespace}/nope")
    assert missing.exit_code == 1
    assert missing.stderr.startswith(f"error: AppWrapper {cluster.namespace}/nope not found (the controller does "
                                     "not know it)")


def test_offline_computes_the_same_queue_order(cluster: Cluster) -> None:
    # A process of its own: stdout must hold nothing but the document (the controller code it runs logs).
    proc = subprocess.run([str(BIN / "mcadctl"), "--kubeconfig", cluster.kubeconfig, "--offline", "queue", "-n",
                           cluster.namespace, "-o", "json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["controller"]["offline"] is True
    assert queued_names(doc, cluster.namespace) == QUEUED
    # The same reasons, in the controller's words (the amounts may differ by a pod that came or went meanwhile).
    assert all(blocked_on(aw["why"], "cpu") for aw in doc["queued"]), doc["queued"]
    assert [aw["name"] for aw in doc["dispatched"]] == ["runs"]

    explained = mcadctl_("--kubeconfig", cluster.kubeconfig, "--offline", "explain", f"{cluster.namespace}/huge-high")
    assert explained.exit_code == 0, explained.output
    assert "It is queued and cannot be dispatched yet" in explained.stdout
    missing = mcadctl_("--kubeconfig", cluster.kubeconfig, "--offline", "explain", f"{cluster.namespace}/nope")
    assert missing.exit_code == 1
    assert "not found (no AppWrapper of that name in the cluster)" in missing.stderr


def test_offline_reports_start_no_thread_and_refuse_to_write(cluster: Cluster) -> None:
    before = set(threading.enumerate())
    dispatcher = offline.rebuilt(kube.connect(cluster.kubeconfig))
    assert queued_names(offline.reports_over(dispatcher).queue(), cluster.namespace) == QUEUED
    assert {t for t in threading.enumerate() if t.is_alive()} - before == set(), "no informer, no write pool"
    with pytest.raises(RuntimeError, match="not started"):
        dispatcher.owners.writes.submit("probe", lambda: None, tenant=cluster.namespace)


@pytest.fixture(scope="module")
def quota_tree(cluster: Cluster, api: k8s.ApiClient) -> tuple[str, str]:
    """A quota tree of its own (root 2 cpu; team, soft, 500m) in a namespace of its own, where an AppWrapper of
    700m is charged to team (it borrows 200m). No ``default`` node: the other AppWrappers are not charged.
    Returns (namespace, tree)."""
    custom = k8s.CustomObjectsApi(api)
    namespace, tree = cluster.new_namespace(), f"mcadctl_{uuid.uuid4().hex[:6]}"
    for name, parent, node, cpu in (("root", None, "root", "2"), ("teams", "root", "team", "500m")):
        spec: dict[str, Any] = {"children": [{"name": node, "quotas": {"requests": {"cpu": cpu}}}]}
        if parent:
            spec["parent"] = parent
        custom.create_namespaced_custom_object("quota.codeflare.dev", "v1alpha1", namespace, "quotasubtrees", {
            "apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
            "metadata": {"name": name, "labels": {"tree": tree}}, "spec": spec})
    body = appwrapper("charged", deployment_item("charged", 1, "700m"))
    body["metadata"]["labels"] = {tree: "team"}

    def team_used() -> str | None:
        doc = json.loads(mcadctl_("--url", cluster.url, "quota", "-o", "json").stdout)
        found = next((t for t in doc["trees"] if t["name"] == tree), None)
        team = next((n for n in found["nodes"] if n["name"] == "team"), None) if found else None
        return team["used"].get("cpu") if team else None

    # Created once the controller knows the tree, so it is charged (not dispatched on capacity alone).
    wait_until(lambda: team_used() == "0", 30, f"the controller to know tree {tree}")
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    wait_until(lambda: team_used() == "700m", 60, "charged to be dispatched and charged to team")
    return namespace, tree


def test_quota_prints_the_tree_with_limits_use_borrowing_and_appwrappers(cluster: Cluster,
                                                                          quota_tree: tuple[str, str]) -> None:
    namespace, tree = quota_tree
    result = mcadctl_("--url", cluster.url, "quota", "--tree", tree)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("controller leader-0_") and lines[0].endswith(": 1 quota tree(s)")
    assert lines[2:] == [
        f"TREE {tree} (resources: cpu)",
        "NODE     HARD   LIMIT      USED       BORROWED   APPWRAPPERS",
        "root     root   cpu=2      cpu=700m   -          -",
        f"  team   no     cpu=500m   cpu=700m   cpu=200m   {namespace}/charged",
    ]
    wide = mcadctl_("--url", cluster.url, "quota", "--tree", tree, "-o", "wide")
    assert f"{namespace}/teams" in wide.stdout and f"{namespace}/charged(cpu=700m,memory=64Mi)" in wide.stdout

    doc = json.loads(mcadctl_("--url", cluster.url, "quota", "--tree", tree, "-o", "json").stdout)
    assert [t["name"] for t in doc["trees"]] == [tree]
    missing = mcadctl_("--url", cluster.url, "quota", "--tree", f"{tree}-nope")
    assert missing.exit_code == 1 and f"no quota tree named {tree}-nope" in missing.stderr


def test_quota_offline_computes_the_same_tree(cluster: Cluster, quota_tree: tuple[str, str]) -> None:
    _, tree = quota_tree
    online = json.loads(mcadctl_("--url", cluster.url, "quota", "--tree", tree, "-o", "json").stdout)
    proc = subprocess.run([str(BIN / "mcadctl"), "--kubeconfig", cluster.kubeconfig, "--offline", "quota", "--tree",
                           tree, "-o", "json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    offline = json.loads(proc.stdout)
    assert offline["controller"]["offline"] is True
    assert offline["trees"] == online["trees"]


def test_quota_through_the_service_proxy(cluster: Cluster, quota_tree: tuple[str, str]) -> None:
    _, tree = quota_tree
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-5d9c8-k7l2p")
    controller_service(cluster.core, ns, "mcad-controller-5d9c8-k7l2p", cluster.port)
    result = mcadctl_("--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns, "quota", "--tree", tree)
    assert result.exit_code == 0, result.output
    assert f"TREE {tree} (resources: cpu)" in result.stdout


# -- through the API server: only a kubeconfig -----------------------------------------------------------------------


def test_default_route_is_the_service_proxy_when_there_is_no_lease(cluster: Cluster) -> None:
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-7d4b9-q2xkz")
    controller_service(cluster.core, ns, "mcad-controller-7d4b9-q2xkz", cluster.port)
    base = ["--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns]

    result = mcadctl_(*base, "queue", "-n", cluster.namespace, "-o", "json")
    assert result.exit_code == 0, result.output
    assert queued_names(json.loads(result.stdout), cluster.namespace) == QUEUED
    # The query string of explain survives the proxy.
    explained = mcadctl_(*base, "explain", f"{cluster.namespace}/runs")
    assert explained.exit_code == 0, explained.output
    assert "It is dispatched" in explained.stdout
    # An AppWrapper the controller does not know: its 404 is told apart from the API server's.
    missing = mcadctl_(*base, "explain", f"{cluster.namespace}/nope")
    assert (missing.exit_code, "the controller does not know it" in missing.stderr) == (1, True), missing.output


def test_lease_holder_is_reached_through_the_pod_proxy(cluster: Cluster) -> None:
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-0")
    lease(k8s.CoordinationV1Api(cluster.core.api_client), ns, "mcad-controller-0_5c1e")
    # No Service at all: only the Lease -> pod route can answer.
    result = mcadctl_("--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns, "--port", str(cluster.port),
                      "ledger", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["controller"]["identity"].startswith("leader-0_")


def test_a_stale_lease_holder_falls_back_to_the_service(cluster: Cluster) -> None:
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-1")
    controller_service(cluster.core, ns, "mcad-controller-1", cluster.port)
    lease(k8s.CoordinationV1Api(cluster.core.api_client), ns, "mcad-controller-gone_1")  # no such pod
    result = mcadctl_("--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns, "queue", "-o", "json")
    assert result.exit_code == 0, result.output
    assert queued_names(json.loads(result.stdout), cluster.namespace) == QUEUED


def test_a_standby_behind_the_service_is_followed_to_the_leader(cluster: Cluster) -> None:
    ns = cluster.new_namespace()
    # The leader's pod, reached on --port; and a real standby replica competing for the same election Lease,
    # behind the Service on a port of its own.
    controller_pod(cluster.core, ns, "leader-0")
    controller_pod(cluster.core, ns, "standby-0")
    standby_port = free_port()
    controller_service(cluster.core, ns, "standby-0", standby_port)
    with controller_process(cluster.kubeconfig, "standby-0", standby_port, cluster.election_namespace,
                            LOGS / "mcadctl-standby.log"):
        request = urllib.request.Request(f"http://127.0.0.1:{standby_port}/metrics",
                                         headers={"Authorization": f"Bearer {TOKEN['reader']}"})
        with urllib.request.urlopen(request, timeout=5):
            pass  # it serves; /debug on it answers 503 naming the leader (checked through mcadctl below)
        direct = mcadctl_("--url", f"http://127.0.0.1:{standby_port}", "queue")
        assert direct.exit_code == 1
        assert "is a standby replica, not the leader (the leader is leader-0_" in direct.stderr

        result = mcadctl_("--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns, "--port",
                          str(cluster.port), "queue", "-n", cluster.namespace, "-o", "json")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["controller"]["identity"].startswith("leader-0_")
        assert queued_names(doc, cluster.namespace) == QUEUED

        # mcadctl dashboard: the standby serves the page (it holds no data); its data routes answer 503 naming the
        # leader, whose pod the proxy then asks, and keeps asking.
        with mcadctl_dashboard(cluster.kubeconfig, ns, global_args=("--port", str(cluster.port), "--token",
                                                                    TOKEN["reader"])) as dashboard:
            assert dashboard.get().status == 200
            for _ in range(2):
                answer = dashboard.get(f"api/queue?namespace={cluster.namespace}")
                assert answer.status == 200, answer.text
                page = json.loads(answer.body)
                assert page["controller"]["identity"].startswith("leader-0_")
                assert [row["name"] for row in page["rows"] if row["position"] is not None] == QUEUED
            assert f"now forwarding to the leader's pod {ns}/leader-0 (named by a standby)" in dashboard.output()


def debug_client(cluster: Cluster, namespace: str) -> str:
    """A kubeconfig of a user bound, in ``namespace``, to the rules of the chart's Role ``mcad-debug-client`` (a
    ClusterRole of this module's with the same rules, bound there) and to the endpoint reader ClusterRoles: what
    docs/mcadctl.md tells admins to grant. Its token is what mcadctl shows the controller."""
    role, = [o for o in chart.render() if o["kind"] == "Role" and o["metadata"]["name"] == "mcad-debug-client"]
    name = "mcadctl-test-debug-client"
    kube.Client(kube.connect(cluster.kubeconfig)).apply(
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": role["rules"]}, field_manager="mcad-test", force=True)
    token = service_account_token(cluster.kubeconfig, namespace, "debug-client",
                                  cluster_roles=reader_roles(cluster.kubeconfig), roles=((name, namespace),))
    return token_kubeconfig(cluster.kubeconfig, token, LOGS / f"{namespace}-debug-client.kubeconfig",
                            user="debug-client")


def test_the_chart_debug_client_reaches_the_leader_through_the_service_and_no_pod(cluster: Cluster) -> None:
    """The debug-client Role grants no pods/proxy (that would reach every port of every pod of the namespace), so
    mcadctl goes from the Lease's pod (refused) to the Service; the user reaches no pod, and no other port of the
    Service."""
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-5")
    controller_service(cluster.core, ns, "mcad-controller-5", cluster.port)
    lease(k8s.CoordinationV1Api(cluster.core.api_client), ns, "mcad-controller-5_9f2a")
    controller_pod(cluster.core, ns, "bystander")  # any other pod of the release namespace
    user = debug_client(cluster, ns)

    result = mcadctl_("--kubeconfig", user, "--controller-namespace", ns, "--port", str(cluster.port), "queue",
                      "-n", cluster.namespace, "-o", "json", token=None)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["controller"]["identity"].startswith("leader-0_")
    assert queued_names(doc, cluster.namespace) == QUEUED

    conn = kube.connect(user)
    for path in (f"/api/v1/namespaces/{ns}/pods/mcad-controller-5:{cluster.port}/proxy/healthz",
                 f"/api/v1/namespaces/{ns}/pods/bystander:{cluster.port}/proxy/healthz",
                 f"/api/v1/namespaces/{ns}/pods/bystander/proxy/",
                 f"/api/v1/namespaces/{ns}/services/mcad-controller:webhook/proxy/",
                 f"/api/v1/namespaces/{ns}/services/mcad-controller/proxy/healthz",
                 f"/api/v1/namespaces/{ns}/services/https:mcad-controller:8080/proxy/healthz"):
        with pytest.raises(kube.ApiError) as refused:
            kube.request_json(conn, "GET", path)
        assert refused.value.status == 403, (path, refused.value)
    # What the Role is for still answers: the Service's http port.
    health = kube.request_json(conn, "GET", f"/api/v1/namespaces/{ns}/services/mcad-controller:http/proxy/debug/"
                               "queue", headers={reach.PROXY_HEADER: f"Bearer {kube.bearer_token(conn)}"})
    assert health["controller"]["identity"].startswith("leader-0_")


def test_the_chart_debug_client_reaches_the_leader_through_the_leaders_service(cluster: Cluster) -> None:
    """The chart's Service mcad-controller-leader selects the leader's pod alone: the first route, and all a
    user bound to the debug-client Role needs (here with no Lease and no Service of every replica)."""
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-6")
    controller_service(cluster.core, ns, "mcad-controller-6", cluster.port, name="mcad-controller-leader")
    user = debug_client(cluster, ns)
    result = mcadctl_("--kubeconfig", user, "--controller-namespace", ns, "ledger", "-o", "json", token=None)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["controller"]["identity"].startswith("leader-0_")
    conn = kube.connect(user)
    for path in (f"/api/v1/namespaces/{ns}/pods/mcad-controller-6:{cluster.port}/proxy/healthz",
                 f"/api/v1/namespaces/{ns}/services/mcad-controller-leader/proxy/healthz"):
        with pytest.raises(kube.ApiError) as refused:
            kube.request_json(conn, "GET", path)
        assert refused.value.status == 403, (path, refused.value)


def test_without_pods_proxy_a_standby_behind_the_service_is_asked_again_then_named(cluster: Cluster) -> None:
    """Only a standby behind the Service and no pods/proxy: mcadctl asks the Service SERVICE_TRIES times (each
    request may land on another replica), then says who leads and what to do."""
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "standby-1")
    standby_port = free_port()
    controller_service(cluster.core, ns, "standby-1", standby_port)
    lease(k8s.CoordinationV1Api(cluster.core.api_client), ns, "leader-0_1")  # a pod that is not there
    user = debug_client(cluster, ns)
    with controller_process(cluster.kubeconfig, "standby-1", standby_port, cluster.election_namespace,
                            LOGS / "mcadctl-standby-1.log"):
        result = mcadctl_("--kubeconfig", user, "--controller-namespace", ns, "queue", token=None)
    assert result.exit_code == 1, result.output
    assert (f"the Service {ns}/mcad-controller answered from a standby replica {reach.SERVICE_TRIES} times (it names "
            "leader-0_") in result.stderr, result.stderr
    assert "the API server refused to proxy to the leader's pod" in result.stderr, result.stderr


# -- when there is nothing to reach ----------------------------------------------------------------------------------


def test_controller_not_installed_is_a_helpful_error(cluster: Cluster) -> None:
    ns = cluster.new_namespace()
    proc = subprocess.run([str(BIN / "mcadctl"), "--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns,
                           "queue"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MCAD_TOKEN": TOKEN["reader"]})
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        f"error: no Lease or Service mcad-controller in {ns}: is mcad installed? (--controller-namespace and "
        "--controller-name say where to look) try --url or --offline")


def test_service_without_a_running_controller_names_the_proxy_failure(cluster: Cluster) -> None:
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-2")
    controller_service(cluster.core, ns, "mcad-controller-2", free_port())  # nothing listens there
    result = mcadctl_("--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns, "ledger")
    assert result.exit_code == 1
    message = result.stderr
    assert message.startswith("error: the controller could not be reached through the API server"), message
    assert f"no Lease {ns}/mcad-controller" in message
    assert f"the API server could not reach the Service {ns}/mcad-controller (503" in message
    assert "connection refused" in message
    assert message.rstrip().endswith("or use --offline to compute the same from cluster state")


# -- who asks --------------------------------------------------------------------------------------------------------


def test_through_the_proxy_the_token_goes_in_its_own_header_and_the_tenant_sees_its_own(
        cluster: Cluster, api: k8s.ApiClient) -> None:
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-3")
    controller_service(cluster.core, ns, "mcad-controller-3", cluster.port)
    other = cluster.new_namespace()
    k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, other, PLURAL, appwrapper(
        "elsewhere", deployment_item("elsewhere", 2, "500")))
    client = kube.Client(kube.connect(cluster.kubeconfig))
    client.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                  "metadata": {"name": "mcadctl-test-appwrapper-lister"},
                  "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["list"]}]},
                 field_manager="mcad-test", force=True)
    tenant = service_account_token(cluster.kubeconfig, cluster.namespace, "tenant",
                                   roles=(("mcadctl-test-appwrapper-lister", cluster.namespace),))
    base = ["--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns]

    def names(token: str | None = "") -> set[tuple[str, str]]:
        result = mcadctl_(*base, "queue", "-o", "json", token=token)
        assert result.exit_code == 0, result.output
        return {(aw["namespace"], aw["name"]) for aw in json.loads(result.stdout)["queued"]}

    wait_until(lambda: (other, "elsewhere") in names(), 30, "the reader to see the other namespace's AppWrapper")
    mine = names(tenant)
    assert {n for n, _ in mine} == {cluster.namespace} and {name for _, name in mine} == set(QUEUED), mine
    hidden = mcadctl_(*base, "explain", f"{other}/elsewhere", token=tenant)
    assert hidden.exit_code == 1 and "not found (the controller does not know it)" in hidden.stderr, hidden.output
    ledger = mcadctl_(*base, "ledger", token=tenant)
    assert ledger.exit_code == 1 and "answered 403" in ledger.stderr and "may not get /debug/ledger" in ledger.stderr
    domains = mcadctl_(*base, "ledger", "--topology", token=tenant)
    assert domains.exit_code == 1 and "may not get /debug/ledger" in domains.stderr, domains.output


def test_a_client_certificate_kubeconfig_is_told_how_to_get_a_token(cluster: Cluster) -> None:
    ns = cluster.new_namespace()
    controller_pod(cluster.core, ns, "mcad-controller-4")
    controller_service(cluster.core, ns, "mcad-controller-4", cluster.port)
    result = mcadctl_("--kubeconfig", cluster.kubeconfig, "--controller-namespace", ns, "queue", token=None)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: kubeconfig {cluster.kubeconfig} authenticates with a client "
                                    "certificate"), result.stderr
    assert "--token" in result.stderr and "kubectl create token" in result.stderr
    # Straight to the controller with no token: its 401, and the same advice.
    direct = mcadctl_("--url", cluster.url, "queue", token=None)
    assert direct.exit_code == 1 and "wants a bearer token" in direct.stderr and "--token" in direct.stderr
    forged = mcadctl_("--url", cluster.url, "queue", token="forged")
    assert forged.exit_code == 1 and "answered 401: the bearer token was not accepted" in forged.stderr
