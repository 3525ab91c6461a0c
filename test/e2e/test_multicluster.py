"""Hub mode against three real control planes: the test cluster is the hub, c8w1 and c8w2 are workers.

Workers (hack/localcluster.py, brought up for this module unless they run already, taken down afterwards unless
MCAD_KEEP_CLUSTER=1): c8w1 has one node of 4 cpu, labels size=small; c8w2 two nodes of 8 cpu, size=large. c8w1
is configured by kubeconfig file holding the token of config/rbac/worker.yaml's ServiceAccount (so everything here
also proves that least privilege is enough in a worker), c8w2 by a Secret in the hub, and a third entry,
c8w1-rejected, points at c8w1 with a token the API server does not know.

A worker's API server is stopped with SIGSTOP and resumed with SIGCONT: it keeps its state, ports and
certificates, and to the hub it is exactly an API server that stopped answering.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test import chart
from test.e2e import quota
from test.e2e.conftest import (
    LOGS,
    AppWrappers,
    Controller,
    appwrapper,
    condition,
    deployment_item,
    job_item,
    pinned,
    running_controller,
)
from test.e2e.quota import labelled
from test.support import REPO, frozen_process, wait_until
from test.worker_identity import token_kubeconfig

WORKERS = {"c8w1": ("1", "4"), "c8w2": ("2", "8")}  # name: (nodes, cpu per node)
# Fresh per run: the previous run's may still be terminating.
SECRET_NAMESPACE = f"mcad-hub-test-{uuid.uuid4().hex[:6]}"
# AppWrappers of this module's namespaces go through the hub release's webhooks, served by its controllers.
WEBHOOK_RELEASE = "mcad-hub"
HUB_WEBHOOK_ARGS: list[str] = []  # set with the port by hub_kubeconfig


def _local_cluster(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "hack" / "localcluster.py"), "--name", name, *args],
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)


def _kubeconfig(name: str) -> Path:
    return REPO / ".dev" / f"kubeconfig-{name}"


def kubectl(kubeconfig: Path, *args: str) -> None:
    binary = shutil.which("kubectl") or str(REPO / ".dev" / "bin" / "kubectl")
    proc = subprocess.run([binary, "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"


def service_account_kubeconfig(worker: str, account: str, path: Path) -> Path:
    """A kubeconfig of ``worker`` for a ServiceAccount bound to worker.yaml's ClusterRole (applied first)."""
    admin_path = _kubeconfig(worker)
    kubectl(admin_path, "apply", "-f", str(REPO / "config" / "rbac" / "worker.yaml"))
    admin = kube.connect(str(admin_path))
    if account != "mcad-worker":
        kube.request_json(admin, "POST", "/api/v1/namespaces/mcad-system/serviceaccounts",
                          body={"metadata": {"name": account}})
        kube.request_json(admin, "POST", "/api/v1/namespaces/mcad-system/secrets", body={
            "metadata": {"name": f"{account}-token", "annotations": {"kubernetes.io/service-account.name": account}},
            "type": "kubernetes.io/service-account-token"})
        kube.request_json(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body={
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "mcad-worker"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "mcad-system"}]})
    return token_kubeconfig(str(admin_path), admin, path, secret=f"{account}-token")


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, kube.Client]]:
    started = []
    try:
        for name, (nodes, cpu) in WORKERS.items():
            if _local_cluster(name, "status").returncode != 0:
                started.append(name)
                proc = _local_cluster(name, "up", "--nodes", nodes, "--node-cpu", cpu, "--node-memory", "16Gi")
                assert proc.returncode == 0, f"worker cluster {name} did not come up:\n{proc.stdout[-2000:]}"
        yield {name: kube.Client(kube.connect(str(_kubeconfig(name)))) for name in WORKERS}
    finally:
        if os.environ.get("MCAD_KEEP_CLUSTER") != "1":
            for name in started:
                _local_cluster(name, "down")


def _api_server_pid(name: str) -> int:
    state = json.loads((REPO / ".dev" / "clusters" / name / "state.json").read_text())
    return int(state["pids"]["kube-apiserver"])


@contextlib.contextmanager
def stopped_api_server(name: str) -> Iterator[None]:
    """The worker's API server frozen for the block, resumed whatever happens."""
    with frozen_process(_api_server_pid(name)):
        yield


@pytest.fixture(scope="module")
def clusters_file(workers: dict[str, kube.Client], core: k8s.CoreV1Api,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=SECRET_NAMESPACE)))
    good = _kubeconfig("c8w2").read_text()
    rejected = json.loads(_kubeconfig("c8w1").read_text())
    for user in rejected["users"]:
        user["user"] = {"token": "a-token-no-server-knows"}
    secrets = {"c8w2-kubeconfig": good, "c8w1-rejected": json.dumps(rejected)}
    for secret, text in secrets.items():
        core.create_namespaced_secret(SECRET_NAMESPACE, k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name=secret), data={"kubeconfig": base64.b64encode(text.encode()).decode()}))
    directory = tmp_path_factory.mktemp("hub")
    least_privilege = service_account_kubeconfig("c8w1", "mcad-worker", directory / "c8w1.kubeconfig")
    path = directory / "clusters.yaml"
    path.write_text(f"""
workers:
  - name: c8w1
    kubeconfig: {least_privilege}
    labels: {{size: small}}
  - name: c8w2
    secret: {{namespace: {SECRET_NAMESPACE}, name: c8w2-kubeconfig}}
    labels: {{size: large}}
  - name: c8w1-rejected
    secret: {{namespace: {SECRET_NAMESPACE}, name: c8w1-rejected}}
    labels: {{size: none}}
""")
    yield path
    core.delete_namespace(SECRET_NAMESPACE)


@pytest.fixture
def aw_namespace(custom: k8s.CustomObjectsApi, namespace: str, workers: dict[str, kube.Client],
                 controller: Controller) -> Iterator[str]:
    """As the suite's, but the capacity to free is in the workers: each test starts with empty workers."""
    yield namespace
    custom.delete_collection_namespaced_custom_object("workload.codeflare.dev", "v1beta1", namespace, "appwrappers")
    wait_until(lambda: not custom.list_namespaced_custom_object("workload.codeflare.dev", "v1beta1", namespace,
                                                                "appwrappers")["items"], 60,
               "the AppWrappers gone (their finalizer goes once their worker objects are deleted)")
    wait_until(lambda: not any(pods(worker, namespace) for worker in workers.values()), 60,
               f"pods in {namespace} gone from the workers")
    # The workers' API servers say so first; placement (best fit compares what is free) goes by the controller's
    # ledger, which learns of the deletions from its watches a moment later.
    wait_until(lambda: all(c["free"] == c["capacity"] for c in clusters(controller) if c["usable"]), 30,
               "the controller to see every usable worker empty")


MODULE_WORKERS = {"c8w1": "Healthy", "c8w2": "Healthy", "c8w1-rejected": "Unauthorized"}


@contextlib.contextmanager
def hub_controller(kubeconfig: str, clusters_file: Path, log_name: str, *args: str,
                   states: dict[str, str] = MODULE_WORKERS) -> Iterator[Controller]:
    with running_controller(kubeconfig, LOGS / log_name, "--clusters-config", str(clusters_file),
                            "--cluster-probe-period", "0.5", *HUB_WEBHOOK_ARGS, *args) as ctl:
        # Placement waits for the workers: the healthy ones usable (and a rejected one found out) before tests.
        wait_until(lambda: {c["name"]: c["state"] for c in clusters(ctl)} == states and
                   all(c["usable"] for c in clusters(ctl) if c["state"] == "Healthy"), 60, "the workers to be checked")
        yield ctl


@pytest.fixture(scope="module")
def hub_kubeconfig(kubeconfig: str, crd: None, clusters_file: Path,
                   tmp_path_factory: pytest.TempPathFactory, webhook_port: int) -> Iterator[str]:
    """The chart installed with hub.enabled as its own release, in the namespace of the workers' Secrets; a
    kubeconfig acting as its ServiceAccount. Every hub controller here runs with it: the chart's hub-mode RBAC
    (Secrets by name, the finalizer) is enough."""
    release = "mcad-hub"
    values = {"replicaCount": 0, "hub": {"enabled": True, "config": {"workers": [
        {"name": "c8w2", "secret": {"name": "c8w2-kubeconfig"}},
        {"name": "c8w1-rejected", "secret": {"name": "c8w1-rejected"}}]}},
              # Its own webhooks, for this module's namespaces (WEBHOOK_RELEASE), served by the hub controllers.
              **chart.webhook_values(webhook_port, release)}
    path = chart.install(kubeconfig, tmp_path_factory.mktemp("hub-chart"), release=release,
                         namespace=SECRET_NAMESPACE, values=values)
    assert chart.who_am_i(path) == f"system:serviceaccount:{SECRET_NAMESPACE}:{release}"
    HUB_WEBHOOK_ARGS[:] = [*chart.webhook_args(webhook_port, release), "--webhook-cert-namespace", SECRET_NAMESPACE]
    yield path
    chart.helm("uninstall", release, "--namespace", SECRET_NAMESPACE, kubeconfig=kubeconfig)


@pytest.fixture(scope="module")
def controller(hub_kubeconfig: str, clusters_file: Path) -> Iterator[Controller]:
    with hub_controller(hub_kubeconfig, clusters_file, "test_multicluster.log") as ctl:
        yield ctl


def clusters(ctl: Controller) -> list[dict[str, Any]]:
    code, body = ctl.get("/debug/clusters")
    assert code == 200, body
    return json.loads(body)["clusters"]  # type: ignore[no-any-return]


def cluster(ctl: Controller, name: str) -> dict[str, Any]:
    return next(c for c in clusters(ctl) if c["name"] == name)


def metrics(ctl: Controller) -> str:
    code, body = ctl.get("/metrics")
    assert code == 200, body
    return body


def deployments(worker: kube.Client, namespace: str) -> list[dict[str, Any]]:
    try:
        found = kube.request_json(worker.conn, "GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")
    except kube.ApiError as err:
        if err.status == 404:
            return []
        raise
    return list(found.get("items") or [])


def deployment_names(workers: dict[str, kube.Client], namespace: str) -> dict[str, list[str]]:
    return {name: sorted(d["metadata"]["name"] for d in deployments(client, namespace))
            for name, client in workers.items()}


def pods(worker: kube.Client, namespace: str, aw: str = "") -> list[dict[str, Any]]:
    query = [("labelSelector", f"workload.codeflare.dev/appwrapper={aw}")] if aw else []
    found = kube.request_json(worker.conn, "GET", f"/api/v1/namespaces/{namespace}/pods", query=query)
    return list(found.get("items") or [])


def running_pods(worker: kube.Client, namespace: str, aw: str) -> int:
    return sum(1 for p in pods(worker, namespace, aw) if (p.get("status") or {}).get("phase") == "Running")


def test_an_appwrapper_that_fits_only_in_the_second_worker_lands_there(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    aws.create(appwrapper("six-cpus", deployment_item("six-cpus", 1, "6")))
    status = aws.wait_state("six-cpus", "Running")
    assert status["targetClusterName"] == "c8w2"
    wait_until(lambda: aws.status("six-cpus").get("running") == 1, 30, "the pod counted from the worker")
    assert deployment_names(workers, aws.namespace) == {"c8w1": [], "c8w2": ["six-cpus"]}
    assert not aws.exists("apps/v1", "Deployment", "six-cpus"), "nothing of it is created in the hub"
    made = deployments(workers["c8w2"], aws.namespace)[0]["metadata"]
    assert made["labels"]["workload.codeflare.dev/appwrapper-uid"] == aws.get("six-cpus")["metadata"]["uid"]
    assert "ownerReferences" not in made, "an ownerReference to an object of another cluster would be collected"
    assert "workload.codeflare.dev/worker-cleanup" in aws.get("six-cpus")["metadata"]["finalizers"]
    assert cluster(controller, "c8w2")["appwrappers"] == [f"{aws.namespace}/six-cpus"]


def test_the_pods_in_the_worker_are_pinned_to_the_nodes_of_the_plan(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    """Placement binds in a worker too: two 3-cpu pods of a Deployment and a bare 1-cpu Pod, which only c8w2 (two
    8-cpu nodes) holds. First fit packs all three onto its first node; the worker's scheduler alone would spread
    them. Each pod is pinned by the worker's own node name, and a bare Pod (no ownerReference in a worker: the
    AppWrapper's uid label says whose it is) is pinned like the others."""
    bare = {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "solo"},
                                               "spec": {"containers": [{"name": "main", "image": "busybox",
                                                        "resources": {"requests": {"cpu": "1"}}}]}}}
    aws.create(appwrapper("packed", deployment_item("packed", 2, "3"), bare))
    assert aws.wait_state("packed", "Running")["targetClusterName"] == "c8w2"
    wait_until(lambda: running_pods(workers["c8w2"], aws.namespace, "packed") == 3, 60, "three pods Running")
    placed = pods(workers["c8w2"], aws.namespace, "packed")
    nodes = {p["spec"]["nodeName"] for p in placed}
    assert len(nodes) == 1, f"packed onto one node as planned, not spread: {nodes}"
    for pod in placed:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                           "values": [pod["spec"]["nodeName"]]}]}], terms
        assert not pod["spec"].get("schedulingGates")
    aws.delete("packed")
    wait_until(lambda: not pods(workers["c8w2"], aws.namespace, "packed"), 60, "its pods gone from the worker")


def test_best_fit_takes_the_tightest_worker_and_pinning_overrides_it(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    aws.create(appwrapper("small", deployment_item("small", 1, "1")))
    aws.create(appwrapper("pinned", deployment_item("pinned", 1, "1"),
                          scheduling={"clusterScheduling": {"clusterSelector": {"matchLabels": {"size": "large"}}}}))
    aws.create(appwrapper("by-name", deployment_item("by-name", 1, "1"),
                          scheduling={"clusterScheduling": {"clusters": [{"name": "c8w2"}]}}))
    aws.create(appwrapper("nowhere", deployment_item("nowhere", 1, "1"),
                          scheduling={"clusterScheduling": {"clusters": [{"name": "elsewhere"}]}}))
    assert aws.wait_state("small", "Running")["targetClusterName"] == "c8w1"  # 1 of 4 cpu is tighter than 1 of 16
    assert aws.wait_state("pinned", "Running")["targetClusterName"] == "c8w2"
    assert aws.wait_state("by-name", "Running")["targetClusterName"] == "c8w2"
    message = wait_until(lambda: aws.status("nowhere").get("message"), 30, "the unplaceable one to say why")
    assert "no worker cluster matches its clusterScheduling (clusters elsewhere)" in message
    assert aws.status("nowhere")["state"] == "Pending"


def test_a_gang_larger_than_any_single_worker_stays_queued(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    # 3 x 5 cpu: 15 of the 20 the workers have together, but no worker can hold all three pods.
    aws.create(appwrapper("gang", deployment_item("gang", 3, "5")))
    message = wait_until(lambda: aws.status("gang").get("message"), 30, "the gang's Backoff message")
    assert message.startswith("does not fit in any worker cluster: c8w1: 3 of 3 pods")
    assert "c8w2: 1 of 3 pods" in message and "c8w1-rejected: unauthorized" in message
    assert aws.status("gang")["state"] == "Pending"
    assert deployment_names(workers, aws.namespace) == {"c8w1": [], "c8w2": []}


RACK, ROW = "mcad.test/rack", "mcad.test/topology-row"


@contextlib.contextmanager
def racked_worker_nodes(workers: dict[str, kube.Client],
                        layout: dict[str, dict[str, str]]) -> Iterator[tuple[str, dict[str, str]]]:
    """Fake 4-cpu nodes in the workers, ``layout`` being worker -> {short name: rack}, labelled with a row of their
    own; yields the row and short name -> node name. Deleted on the way out, with the pods still bound to them."""
    tag = uuid.uuid4().hex[:6]
    made: list[tuple[kube.Client, str]] = []
    names: dict[str, str] = {}
    capacity = {"cpu": "4", "memory": "16Gi", "pods": "110"}
    try:
        for worker, nodes in layout.items():
            for short, rack in nodes.items():
                name = names[short] = f"mcad-test-{tag}-{short}"
                kube.request_json(workers[worker].conn, "POST", "/api/v1/nodes", body={
                    "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                 "labels": {"mcad.test/owned": "true", ROW: tag, RACK: rack}},
                    "status": {"capacity": capacity, "allocatable": capacity}})
                made.append((workers[worker], name))
        for client, name in made:
            wait_until(lambda client=client, name=name: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in kube.request_json(client.conn, "GET", f"/api/v1/nodes/{name}")["status"].get("conditions")
                or []), 60, f"node {name} Ready")
        yield tag, names
    finally:
        for client, name in made:
            with contextlib.suppress(kube.ApiError):
                kube.request_json(client.conn, "DELETE", f"/api/v1/nodes/{name}")
            bound = kube.request_json(client.conn, "GET", "/api/v1/pods",
                                      query=[("fieldSelector", f"spec.nodeName={name}")])
            for pod in bound.get("items") or []:
                with contextlib.suppress(kube.ApiError):
                    kube.request_json(client.conn, "DELETE", f"/api/v1/namespaces/{pod['metadata']['namespace']}"
                                      f"/pods/{pod['metadata']['name']}", query=[("gracePeriodSeconds", "0")])


def test_a_gang_that_requires_a_rack_goes_to_the_worker_with_a_rack_that_holds_it(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    """c8w1 gets two racks of one 4-cpu node each (x0: rack-a, x1: rack-b), c8w2 one rack of two (y0, y1: rack-a
    too: a domain never spans two workers). A 2 x 3-cpu gang that requires a rack fits c8w1 as a whole (one pod on
    each of its racks), and best fit would choose it there (half of c8w1 left, three quarters of c8w2), but no rack
    of c8w1 holds it: it goes to c8w2, both pods in its rack-a. A 3 x 3-cpu gang, which the workers' free cpu would
    hold, fits no rack of either worker: it waits, and its message names the level and each worker's racks."""
    layout = {"c8w1": {"x0": "rack-a", "x1": "rack-b"}, "c8w2": {"y0": "rack-a", "y1": "rack-a"}}
    with racked_worker_nodes(workers, layout) as (row, names):
        # Placement must know every new node before the gang comes, or it could go to c8w2 for want of c8w1's.
        wait_until(lambda: {c["name"]: c["capacity"].get("cpu") for c in clusters(controller) if c["usable"]} ==
                   {"c8w1": "12", "c8w2": "24"}, 30, "the controller to see the new nodes")

        def racked(name: str, pods: int) -> dict[str, Any]:
            body = appwrapper(name, pinned(deployment_item(name, pods, "3"), {ROW: row}))
            body["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-required": RACK}
            return body

        aws.create(racked("ringed", 2))
        assert aws.wait_state("ringed", "Running")["targetClusterName"] == "c8w2"
        wait_until(lambda: running_pods(workers["c8w2"], aws.namespace, "ringed") == 2, 30, "its pods Running")
        assert sorted(p["spec"]["nodeName"] for p in pods(workers["c8w2"], aws.namespace, "ringed")) == \
            [names["y0"], names["y1"]]
        assert deployment_names(workers, aws.namespace) == {"c8w1": [], "c8w2": ["ringed"]}
        aws.delete("ringed")
        wait_until(lambda: not pods(workers["c8w2"], aws.namespace, "ringed"), 60, "its pods gone from c8w2")

        aws.create(racked("wide", 3))
        said = f"needs 3 pod(s) of cpu 3, memory 64Mi in one {RACK}"
        message = wait_until(lambda: (m := aws.status("wide").get("message") or "") and
                             f"c8w2: {said}: rack-a has room for 2" in m and m, 30,
                             "the wide gang's message to name the rack level")
        assert message.startswith(f"does not fit in any worker cluster: c8w1: {said}: rack-a has room for 1, "
                                  f"rack-b for 1; "), message
        assert aws.status("wide")["state"] == "Pending"
        assert deployment_names(workers, aws.namespace) == {"c8w1": [], "c8w2": []}


def test_deleting_it_in_the_hub_removes_its_objects_in_the_worker(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    aws.create(appwrapper("doomed", deployment_item("doomed", 2, "2")))
    target = aws.wait_state("doomed", "Running")["targetClusterName"]
    wait_until(lambda: running_pods(workers[target], aws.namespace, "doomed") == 2, 30, "its pods running")
    aws.delete("doomed")
    wait_until(lambda: not deployments(workers[target], aws.namespace), 30, "its Deployment gone from the worker")
    wait_until(lambda: not aws.custom.list_namespaced_custom_object(
        "workload.codeflare.dev", "v1beta1", aws.namespace, "appwrappers")["items"], 30,
        "the AppWrapper gone once its finalizer is removed")
    wait_until(lambda: running_pods(workers[target], aws.namespace, "doomed") == 0, 30, "its pods gone too")


def test_rejected_credentials_are_a_state_and_a_metric_not_a_crash(controller: Controller) -> None:
    rejected = cluster(controller, "c8w1-rejected")
    assert rejected["state"] == "Unauthorized" and not rejected["usable"]
    assert "unauthorized" in rejected["message"]
    text = metrics(controller)
    assert 'mcad_cluster_state{cluster="c8w1-rejected",state="Unauthorized"} 1.0' in text
    assert 'mcad_cluster_healthy{cluster="c8w1-rejected"} 0.0' in text
    assert 'mcad_cluster_healthy{cluster="c8w2"} 1.0' in text
    assert controller.proc is not None and controller.proc.poll() is None
    mcadctl = subprocess.run([str(Path(sys.executable).parent / "mcadctl"), "--url",
                              f"http://127.0.0.1:{controller.port}", "--token", str(controller.token), "clusters",
                              "-o", "wide"],
                             capture_output=True, text=True, timeout=30, check=False)
    assert mcadctl.returncode == 0, mcadctl.stderr
    rows = {line.split()[0]: line.split()[1] for line in mcadctl.stdout.splitlines()[2:] if line.strip()}
    assert rows == {"NAME": "STATE", "c8w1": "Healthy", "c8w2": "Healthy", "c8w1-rejected": "Unauthorized"}


def test_a_stopped_worker_leaves_placement_and_comes_back_without_duplicates(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    aws.create(appwrapper("stays", deployment_item("stays", 1, "6")))
    assert aws.wait_state("stays", "Running")["targetClusterName"] == "c8w2"
    with stopped_api_server("c8w2"):
        wait_until(lambda: cluster(controller, "c8w2")["state"] == "Unreachable", 30, "c8w2 found unreachable")
        # Its AppWrapper keeps its state (the timeout is 300 s) and says why it cannot be followed.
        wait_until(lambda: (condition(aws.status("stays"), "ClusterAvailable") or {}).get("status") == "False",
                   30, "the ClusterAvailable condition")
        assert aws.status("stays")["state"] == "Running"
        # New work goes to the other worker; what fits only in the stopped one waits, saying so.
        aws.create(appwrapper("meanwhile", deployment_item("meanwhile", 1, "3")))
        aws.create(appwrapper("later", deployment_item("later", 1, "7")))
        assert aws.wait_state("meanwhile", "Running")["targetClusterName"] == "c8w1"
        message = wait_until(lambda: aws.status("later").get("message"), 30, "the waiting one's message")
        assert "c8w2: unreachable" in message
        assert cluster(controller, "c8w2")["capacity"] == {} or not cluster(controller, "c8w2")["usable"]
    wait_until(lambda: cluster(controller, "c8w2")["usable"], 30, "c8w2 back in placement")
    assert aws.wait_state("later", "Running")["targetClusterName"] == "c8w2"
    wait_until(lambda: (condition(aws.status("stays"), "ClusterAvailable") or {}).get("status") == "True",
               30, "the ClusterAvailable condition back to True")
    assert aws.status("stays")["state"] == "Running"
    assert deployment_names(workers, aws.namespace) == {"c8w1": ["meanwhile"], "c8w2": ["later", "stays"]}
    wait_until(lambda: running_pods(workers["c8w2"], aws.namespace, "stays") == 1, 30, "one pod of stays")


def test_after_the_unreachable_timeout_it_is_requeued_elsewhere_and_the_leftovers_are_deleted(
        hub_kubeconfig: str, clusters_file: Path, aws: AppWrappers, workers: dict[str, kube.Client],
        controller: Controller) -> None:
    # Its own controller, with a short timeout and spread placement: stop the module's one meanwhile.
    controller.stop()
    timeout_file = clusters_file.with_name("clusters-timeout.yaml")
    timeout_file.write_text(clusters_file.read_text() + "unreachableTimeoutSeconds: 4\n")
    try:
        with hub_controller(hub_kubeconfig, timeout_file, "test_multicluster_timeout.log",
                            "--cluster-policy", "spread") as ctl:
            aws.create(appwrapper("moves", deployment_item("moves", 1, "3")))
            assert aws.wait_state("moves", "Running")["targetClusterName"] == "c8w2"  # spread: the most room
            first_uid = deployments(workers["c8w2"], aws.namespace)[0]["metadata"]["uid"]
            with stopped_api_server("c8w2"):
                # Requeued after 4 s out, then dispatched to the worker that answers.
                status = wait_until(lambda: (s := aws.status("moves")).get("targetClusterName") == "c8w1" and s,
                                    60, "moves to be dispatched to c8w1")
                assert status["state"] == "Running"
                assert condition(status, "PreemptCandidate")["reason"] == "ClusterUnreachableTimeout"  # type: ignore[index]
                assert int(status.get("numberOfRequeueings") or 0) == 0, "not the workload's fault: not counted"
            # Back: what was left in c8w2 is deleted; only the copy in c8w1 remains.
            wait_until(lambda: deployment_names(workers, aws.namespace) == {"c8w1": ["moves"], "c8w2": []}, 60,
                       "the leftover in c8w2 deleted")
            assert deployments(workers["c8w1"], aws.namespace)[0]["metadata"]["uid"] != first_uid
            assert cluster(ctl, "c8w1")["appwrappers"] == [f"{aws.namespace}/moves"]
            aws.delete("moves")
            wait_until(lambda: deployment_names(workers, aws.namespace) == {"c8w1": [], "c8w2": []}, 30,
                       "deleted everywhere")
    finally:
        controller.start()


def test_without_hub_mode_a_leftover_cleanup_finalizer_does_not_block_deletion(
        hub_kubeconfig: str, aws: AppWrappers, controller: Controller) -> None:
    """An AppWrapper a hub dispatched, deleted after hub mode was turned off: nothing can reach its worker, so
    the controller says so in its log and lets it go instead of leaving it stuck in deletion."""
    controller.stop()
    try:
        with running_controller(hub_kubeconfig, LOGS / "test_multicluster_single.log", *HUB_WEBHOOK_ARGS) as single:
            body = appwrapper("was-hub", deployment_item("was-hub", 1, "1"))
            body["metadata"]["finalizers"] = ["workload.codeflare.dev/worker-cleanup"]
            aws.create(body)
            aws.wait_state("was-hub", "Running")
            aws.delete("was-hub")
            wait_until(lambda: not aws.custom.list_namespaced_custom_object(
                "workload.codeflare.dev", "v1beta1", aws.namespace, "appwrappers")["items"], 30,
                "the AppWrapper gone")
            assert "hub mode is off" in single.log.read_text()
    finally:
        controller.start()


def test_completion_is_read_from_the_workers_job_and_frees_its_room(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    # 2 x 3 cpu: only c8w2 can hold it (c8w1 has 4 cpu); its pods finish 2 s after they start.
    aws.create(appwrapper("batch", job_item("batch", 2, "3", duration="2s", completionstatus="Complete")))
    assert aws.wait_state("batch", "Running")["targetClusterName"] == "c8w2"
    status = aws.wait_state("batch", "Completed", timeout=60)
    assert status["targetClusterName"] == "c8w2"
    free = wait_until(lambda: (c := cluster(controller, "c8w2"))["free"].get("cpu") == "16" and c, 30,
                      "c8w2's room back once the Job's pods finished")
    assert free["appwrappers"] == [f"{aws.namespace}/batch"], "its objects are still there, until it is deleted"


def test_requeuing_follows_the_workers_pods_and_failing_deletes_there(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    """minAvailable judged on the worker's pods: they never start (kwok holds them 300 s), so it is requeued,
    dispatched again, and once maxNumRequeuings is reached it fails and its Job is deleted in the worker."""
    job = job_item("stuck", 2, "3")
    job["generictemplate"]["spec"]["template"]["metadata"]["annotations"]["pod-start.stage.kwok.x-k8s.io/delay"] = \
        "300s"
    aws.create(appwrapper("stuck", job, scheduling={"minAvailable": 2, "requeuing": {
        "timeInSeconds": 2, "growthType": "none", "maxNumRequeuings": 1}}))
    assert aws.wait_state("stuck", "Running")["targetClusterName"] == "c8w2"
    status = aws.wait_state("stuck", "Failed", timeout=60)
    assert status["numberOfRequeueings"] == 1
    assert condition(status, "Failed")["reason"] == "MaxRequeuingsReached"  # type: ignore[index]
    assert "minimum=2, running=0" in condition(status, "Failed")["message"]  # type: ignore[index]
    wait_until(lambda: not pods(workers["c8w2"], aws.namespace, "stuck"), 30, "its Job and pods gone from c8w2")


def events_by_reason(core: k8s.CoreV1Api, namespace: str, name: str) -> dict[str, k8s.CoreV1Event]:
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return {e.reason: e for e in found if e.involved_object.kind == "AppWrapper"}


def test_credentials_that_stop_working_are_a_condition_and_new_ones_are_followed(
        hub_kubeconfig: str, aws: AppWrappers, workers: dict[str, kube.Client], controller: Controller,
        core: k8s.CoreV1Api, tmp_path: Path) -> None:
    """c8w1 through a ServiceAccount of its own, whose token is revoked while an AppWrapper runs there: the worker
    turns Unauthorized, the AppWrapper keeps running with ClusterAvailable=False saying so, nothing crashes. A new
    token in the kubeconfig file brings the worker back without a restart."""
    admin = workers["c8w1"].conn
    revocable = service_account_kubeconfig("c8w1", "mcad-revocable", tmp_path / "revocable.kubeconfig")
    config = tmp_path / "clusters.yaml"
    config.write_text(f"workers:\n  - name: c8w1\n    kubeconfig: {revocable}\n")
    controller.stop()
    try:
        with hub_controller(hub_kubeconfig, config, "test_multicluster_revoked.log", states={"c8w1": "Healthy"}) as ctl:
            aws.create(appwrapper("revoked", deployment_item("revoked", 1, "1")))
            assert aws.wait_state("revoked", "Running")["targetClusterName"] == "c8w1"
            kube.request_json(admin, "DELETE", "/api/v1/namespaces/mcad-system/secrets/mcad-revocable-token")
            wait_until(lambda: cluster(ctl, "c8w1")["state"] == "Unauthorized", 30, "c8w1 Unauthorized")
            told = wait_until(lambda: condition(aws.status("revoked"), "ClusterAvailable"), 30, "the condition")
            assert told["status"] == "False" and told["reason"] == "Unauthorized"
            assert "credentials rejected (401" in told["message"]
            assert aws.status("revoked")["state"] == "Running"
            assert 'mcad_cluster_state{cluster="c8w1",state="Unauthorized"} 1.0' in metrics(ctl)
            assert ctl.proc is not None and ctl.proc.poll() is None
            unavailable = wait_until(lambda: events_by_reason(core, aws.namespace, "revoked").get(
                "ClusterUnavailable"), 30, "a ClusterUnavailable event")
            assert unavailable.type == "Warning" and unavailable.message == told["message"]

            # A new token for the account, written over the same kubeconfig file: followed without a restart.
            kube.request_json(admin, "POST", "/api/v1/namespaces/mcad-system/secrets", body={
                "metadata": {"name": "mcad-revocable-token-2",
                             "annotations": {"kubernetes.io/service-account.name": "mcad-revocable"}},
                "type": "kubernetes.io/service-account-token"})
            token_kubeconfig(str(_kubeconfig("c8w1")), admin, revocable, secret="mcad-revocable-token-2")
            wait_until(lambda: cluster(ctl, "c8w1")["state"] == "Healthy", 30, "c8w1 Healthy with the new token")
            wait_until(lambda: (condition(aws.status("revoked"), "ClusterAvailable") or {}).get("status") == "True",
                       30, "ClusterAvailable=True again")
            available = wait_until(lambda: events_by_reason(core, aws.namespace, "revoked").get(
                "ClusterAvailable"), 30, "a ClusterAvailable event")
            assert available.type == "Normal" and available.message == "worker cluster c8w1 is healthy again"
            aws.create(appwrapper("rotated", deployment_item("rotated", 1, "1")))
            assert aws.wait_state("rotated", "Running")["targetClusterName"] == "c8w1"
            wait_until(lambda: running_pods(workers["c8w1"], aws.namespace, "rotated") == 1, 30,
                       "its pod created in c8w1 with the new token")
    finally:
        for path in ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/mcad-revocable",
                     "/api/v1/namespaces/mcad-system/secrets/mcad-revocable-token-2",
                     "/api/v1/namespaces/mcad-system/serviceaccounts/mcad-revocable"):
            with contextlib.suppress(kube.ApiError):
                kube.request_json(admin, "DELETE", path)
        controller.start()  # with the module's own identity in c8w1: it deletes what "revoked" left there


def test_priority_preemption_evicts_only_in_the_worker_the_preemptor_needs(
        hub_kubeconfig: str, clusters_file: Path, aws: AppWrappers, workers: dict[str, kube.Client],
        controller: Controller) -> None:
    """With --preemption: a 6-cpu high-priority gang fits only c8w2 (c8w1 has 4 cpu), which a low-priority one
    fills; the low one is evicted there (its objects deleted in c8w2), not the low-priority bystander in c8w1,
    which could not make room for it."""
    controller.stop()
    try:
        with hub_controller(hub_kubeconfig, clusters_file, "test_multicluster_preemption.log", "--preemption"):
            aws.create(appwrapper("bystander", deployment_item("bystander", 1, "1"), priority=1))
            aws.create(appwrapper("low", deployment_item("low", 2, "7"), priority=1))
            assert aws.wait_state("bystander", "Running")["targetClusterName"] == "c8w1"
            assert aws.wait_state("low", "Running")["targetClusterName"] == "c8w2"
            wait_until(lambda: running_pods(workers["c8w2"], aws.namespace, "low") == 2, 30, "low's pods running")

            aws.create(appwrapper("high", deployment_item("high", 1, "6"), priority=10))

            assert aws.wait_state("high", "Running", timeout=60)["targetClusterName"] == "c8w2"
            low = aws.wait_state("low", "Pending")
            preempted = condition(low, "PreemptCandidate")
            assert preempted is not None and preempted["reason"] == "PreemptedByHigherPriority"
            assert preempted["message"].startswith(f"Preempted by AppWrapper {aws.namespace}/high (priority 10); "
                                                   f"chosen for the least work lost: 1 AppWrapper(s), ")
            assert "targetClusterName" not in low
            wait_until(lambda: running_pods(workers["c8w2"], aws.namespace, "high") == 1, 30, "high's pod running")
            wait_until(lambda: deployment_names(workers, aws.namespace) == {
                "c8w1": ["bystander"], "c8w2": ["high"]}, 30, "low's Deployment deleted in c8w2 only")
            bystander = aws.status("bystander")
            assert bystander["state"] == "Running" and condition(bystander, "PreemptCandidate") is None
    finally:
        controller.start()


def test_one_quota_tree_charges_appwrappers_wherever_they_run(
        hub_kubeconfig: str, clusters_file: Path, aws: AppWrappers, custom: k8s.CustomObjectsApi,
        controller: Controller, quota_crd: None) -> None:
    """Quota trees live in the hub and hold across the workers: with 3 cpu for the team, 2 in c8w1 and 1 in c8w2
    use it all, and a third AppWrapper waits on quota though both workers have room; it runs once one goes."""
    def team_aw(name: str, cpu: str, where: str | None = None) -> dict[str, Any]:
        scheduling = {"clusterScheduling": {"clusters": [{"name": where}]}} if where else None
        return labelled(appwrapper(name, deployment_item(name, 1, cpu), scheduling=scheduling), {tree: "team"})

    tree = f"team_{quota.suffix()}"
    controller.stop()
    try:
        with hub_controller(hub_kubeconfig, clusters_file, "test_multicluster_quota.log") as ctl, \
                quota.trees_in(custom, aws) as trees:
            trees.create(quota.subtree("root", tree, quota.node("root", hard=True, cpu="3", memory="16Gi")),
                         quota.subtree("children", tree, quota.node("team", hard=True, cpu="3", memory="16Gi"),
                                       parent="root"))
            quota.wait_tree(ctl, tree, 2)
            aws.create(team_aw("in-c8w1", "2", "c8w1"))
            aws.create(team_aw("in-c8w2", "1", "c8w2"))
            assert aws.wait_state("in-c8w1", "Running")["targetClusterName"] == "c8w1"
            assert aws.wait_state("in-c8w2", "Running")["targetClusterName"] == "c8w2"

            aws.create(team_aw("third", "1"))
            message = wait_until(lambda: (m := aws.status("third").get("message") or "") and tree in m and m, 30,
                                 "the third one's message to name the quota tree")
            assert "team" in message and aws.status("third")["state"] == "Pending", message
            team = quota.node_doc(ctl, tree, "team")
            assert team is not None and sorted(a["name"] for a in team["appwrappers"]) == ["in-c8w1", "in-c8w2"]

            aws.delete("in-c8w1")
            assert aws.wait_state("third", "Running", timeout=60)["targetClusterName"] in ("c8w1", "c8w2")
    finally:
        controller.start()


def test_an_object_in_the_worker_that_is_not_the_appwrappers_is_not_taken_over(
        controller: Controller, aws: AppWrappers, workers: dict[str, kube.Client]) -> None:
    """Objects it does not own are left alone in hub mode too: in a worker, whose an object is goes by the AppWrapper's
    uid label. An admin's ConfigMap there is left as it is, the AppWrapper fails naming it, and what it created there is
    taken back."""
    worker = workers["c8w2"]
    try:
        kube.request_json(worker.conn, "POST", "/api/v1/namespaces",
                          body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": aws.namespace}})
    except kube.ApiError as err:
        if err.status != 409:
            raise
    path = f"/api/v1/namespaces/{aws.namespace}/configmaps/admins"
    worker.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "admins", "namespace": aws.namespace},
                   "data": {"owner": "admin"}}, field_manager="admin")
    before = kube.request_json(worker.conn, "GET", path)
    grab = {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap",
                                               "metadata": {"name": "admins"}, "data": {"owner": "tenant"}}}
    aws.create(appwrapper("grab", deployment_item("grab", 1, "6"), grab))  # 6 cpu: only c8w2 has room
    status = aws.wait_state("grab", "Failed", timeout=60)
    assert "GenericItems[1] (ConfigMap admins) exists and is not controlled by this AppWrapper" in status["message"]
    wait_until(lambda: not deployments(worker, aws.namespace), 30, "its Deployment taken back from the worker")
    after = kube.request_json(worker.conn, "GET", path)
    assert (after["metadata"]["resourceVersion"], after["data"]) == (before["metadata"]["resourceVersion"],
                                                                       {"owner": "admin"})
    aws.delete("grab")
    wait_until(lambda: not aws.custom.list_namespaced_custom_object(
        "workload.codeflare.dev", "v1beta1", aws.namespace, "appwrappers")["items"], 30, "the AppWrapper gone")
    assert kube.request_json(worker.conn, "GET", path)["metadata"]["uid"] == before["metadata"]["uid"]
    kube.request_json(worker.conn, "DELETE", path)
