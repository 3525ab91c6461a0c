"""Sick nodes on the local cluster (kube-scheduler, kwok nodes), with the controller's defaults (Autopilot's rules,
placement that binds): a GPU node labelled ``autopilot.ibm.com/gpuhealth=TESTING`` gets no GPU pods but does get
cpu-only ones, a WARN node takes GPU pods only once the healthy nodes are full, a gang that would need the TESTING
node waits with a message naming the node and its label, and runs as soon as the label goes.

Who sends the input: node labels are written by cluster admins and node agents (Autopilot), never by a tenant
holding AppWrapper rights (the chart grants mcad no write on nodes, and tenants none either). A tenant who asks for
a sick node by name (a required node affinity on its name) gets nothing more: the AppWrapper waits, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.model.nodehealth import AUTOPILOT_LABEL
from test.e2e.conftest import LOGS, AppWrappers, appwrapper, condition, running_controller
from test.e2e.test_placement import labelled_nodes, pinned_node
from test.support import wait_until

ROW = "mcad.test/gpu-row"
LOG = LOGS / "test_node_health.log"


@pytest.fixture
def gpu_row(core: k8s.CoreV1Api, crd: None) -> Iterator[tuple[list[str], str]]:
    """Three fake nodes of 4 GPUs each, selected by a row label of their own."""
    with labelled_nodes(core, 3, ROW, {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}) as row:
        yield row


def set_health(core: k8s.CoreV1Api, node: str, value: str | None) -> None:
    """What Autopilot does: label the node with its verdict (None: remove the label)."""
    core.patch_node(node, {"metadata": {"labels": {AUTOPILOT_LABEL: value}}})


def job(name: str, row: str, pods: int, requests: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A GenericItem of a Job of ``pods`` pods that run for an hour on the row's nodes."""
    return {"replicas": 1, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {ROW: row, **spec.pop("nodeSelector", {})},
                     "containers": [{"name": "main", "image": "trainer",
                                     "resources": {"requests": requests, "limits": requests}}], **spec}}}}}


GPU_POD = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
CPU_POD = {"cpu": "1", "memory": "1Gi"}


def nodes_of(aws: AppWrappers, name: str, count: int) -> list[str]:
    """The nodes of ``count`` Running pods of AppWrapper ``name``, each checked to be where mcad pinned it."""
    pods = aws.wait_pods(name, count)
    for pod in pods:
        assert pinned_node(pod) == pod.spec.node_name, f"{pod.metadata.name} is not on the node of its pin"
    return sorted(pod.spec.node_name for pod in pods)


def backoff_message(aws: AppWrappers, name: str, text: str) -> str:
    """Its status message (or its Backoff condition's) once it says ``text``; fails showing what it said."""
    said: list[str] = []

    def says() -> bool:
        status = aws.status(name)
        said[:] = [status.get("message") or "", (condition(status, "Backoff") or {}).get("message") or ""]
        return any(text in message for message in said)

    try:
        wait_until(says, 60, f"AppWrapper {name} to say {text!r}")
    except AssertionError as err:
        raise AssertionError(f"{err}; it says {said}") from None
    return " ".join(said)


def test_testing_nodes_get_no_gpu_pods_and_warn_nodes_only_when_the_others_are_full(
        gpu_row: tuple[list[str], str], controller_kubeconfig: str, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    (testing, warn, healthy), row = gpu_row  # sorted by name: first-fit would try "testing" first
    set_health(core, testing, "TESTING")
    set_health(core, warn, "WARN")
    with running_controller(controller_kubeconfig, LOG):
        aws.create(appwrapper("train", job("train", row, 4, GPU_POD)))
        aws.wait_state("train", "Running")
        assert nodes_of(aws, "train", 4) == [healthy] * 4, "neither the TESTING node nor, while others fit, WARN"

        aws.create(appwrapper("web", job("web", row, 2, CPU_POD)))  # cpu only: the labels say nothing of it
        aws.wait_state("web", "Running")
        assert nodes_of(aws, "web", 2) == [testing] * 2

        aws.create(appwrapper("more", job("more", row, 2, GPU_POD)))  # only the WARN node has GPUs left
        aws.wait_state("more", "Running")
        assert nodes_of(aws, "more", 2) == [warn] * 2

        # Four more GPUs exist only on the TESTING node (WARN has two left): it waits, and says which node's
        # label keeps it off.
        aws.create(appwrapper("over", job("over", row, 4, GPU_POD)))
        backoff_message(aws, "over", f"node {testing} is labelled {AUTOPILOT_LABEL}=TESTING (no nvidia.com/gpu pods)")
        assert aws.status("over").get("state") != "Running" and not aws.pods("over")

        # A tenant that names the sick node gets no further.
        named = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [testing]}]}
        by_name = job("chosen", row, 1, GPU_POD, affinity={"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [named]}}})
        aws.create(appwrapper("chosen", by_name))
        backoff_message(aws, "chosen", f"node {testing} is labelled {AUTOPILOT_LABEL}=TESTING")
        assert not aws.pods("chosen")
        aws.delete("chosen")

        # Autopilot clears the node: the label change is seen at once, and the waiting gang runs there.
        set_health(core, testing, None)
        aws.wait_state("over", "Running")
        assert nodes_of(aws, "over", 4) == [testing] * 4


def test_a_pin_to_a_node_that_turns_testing_before_its_pod_binds_moves(
        gpu_row: tuple[list[str], str], controller_kubeconfig: str, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """A pod of a Deployment pinned to a node that is labelled TESTING before the pod binds (here: held by a
    scheduling gate of the test's own, so the scheduler cannot bind it first) is deleted and re-created, then
    pinned to another node; the AppWrapper's Event says why."""
    (first, second, third), row = gpu_row
    set_health(core, third, "TESTING")  # so the plan has two candidates: first, then second
    hold = "test.mcad/hold"
    item = {"replicas": 1, "generictemplate": {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "serve"}}, "template": {
            "metadata": {"labels": {"app": "serve"}},
            "spec": {"nodeSelector": {ROW: row}, "schedulingGates": [{"name": hold}],
                     "containers": [{"name": "main", "image": "server",
                                     "resources": {"requests": GPU_POD, "limits": GPU_POD}}]}}}}}
    with running_controller(controller_kubeconfig, LOG):
        aws.create(appwrapper("serve", item))
        aws.wait_state("serve", "Running")
        pod = wait_until(lambda: next((p for p in aws.pods("serve") if pinned_node(p)), None), 60, "a pinned pod")
        assert pinned_node(pod) == first
        set_health(core, first, "TESTING")

        def moved() -> Any:
            return next((p for p in aws.pods("serve") if p.metadata.uid != pod.metadata.uid and pinned_node(p)
                         and not p.metadata.deletion_timestamp), None)

        again = wait_until(moved, 60, "the pod re-created and pinned elsewhere")
        assert pinned_node(again) == second
        events = core.list_namespaced_event(aws.namespace, field_selector="involvedObject.name=serve").items
        assert any(e.reason == "PlacementReplanned" and f"node {first} is labelled {AUTOPILOT_LABEL}=TESTING"
                   in (e.message or "") for e in events), [(e.reason, e.message) for e in events]


def test_with_advisory_placement_the_scheduler_keeps_gpu_pods_off_a_testing_node_too(
        gpu_row: tuple[list[str], str], controller_kubeconfig: str, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """The kube-scheduler places the pods (it spreads them: least allocated first), and only the required node
    affinity mcad gives GPU pods keeps them off the TESTING nodes."""
    (testing, other_testing, healthy), row = gpu_row
    set_health(core, testing, "TESTING")
    set_health(core, other_testing, "EVICT")
    with running_controller(controller_kubeconfig, LOG, "--placement=advisory"):
        aws.create(appwrapper("spread", job("spread", row, 3, GPU_POD)))
        aws.wait_state("spread", "Running")
        pods = aws.wait_pods("spread", 3)
        assert sorted(p.spec.node_name for p in pods) == [healthy] * 3
        terms = pods[0].spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert [(e.key, e.operator, e.values) for t in terms.node_selector_terms for e in t.match_expressions or []] \
            == [(AUTOPILOT_LABEL, "NotIn", ["TESTING", "EVICT"])]
        aws.create(appwrapper("web", job("web", row, 3, CPU_POD)))  # cpu only: spread over all three
        aws.wait_state("web", "Running")
        assert {testing, other_testing} & set(nodes_of_unpinned(aws, "web", 3))


def nodes_of_unpinned(aws: AppWrappers, name: str, count: int) -> list[str]:
    return sorted(pod.spec.node_name for pod in aws.wait_pods(name, count))
