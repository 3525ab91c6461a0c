"""Placement that binds (--placement=binding, the default) against the kube-scheduler's own choices (advisory).

A gang whose only packing is tight: two nodes, a Job of two pods and a bare Pod that together fill both nodes only
when the Job's pods share one node. mcad's plan (first-fit decreasing) finds that packing; the scheduler, left to
itself, spreads the Job's pods over both nodes and the last pod has nowhere to go. The bare Pod carries a
scheduling gate of the test's own (``test.mcad/hold``) that the test removes once the Job's pods are bound, so the
scheduler meets the pods in the same order in both modes: the Job's first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import LOGS, AppWrappers, appwrapper, delete_fake_node, running_controller
from test.support import wait_until

HOLD = "test.mcad/hold"
PAIR_LABEL = "mcad.test/pair"


@pytest.fixture
def node_pair(request: pytest.FixtureRequest, core: k8s.CoreV1Api, crd: None) -> Iterator[tuple[list[str], str]]:
    """Two fake nodes with the resources the test names (``request.param``), labelled as a pair; yields their names
    (sorted) and the pair's label value."""
    resources: dict[str, str] = request.param
    tag = uuid.uuid4().hex[:6]
    names = [f"mcad-test-pair-{tag}-{i}" for i in ("a", "b")]
    capacity = {"pods": "110", "memory": "64Gi", **resources}
    for name in names:
        core.create_node({"metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                       "labels": {"mcad.test/owned": "true", PAIR_LABEL: tag}},
                          "status": {"capacity": capacity, "allocatable": capacity}})
    try:
        for name in names:
            wait_until(lambda name=name: any(c.type == "Ready" and c.status == "True"
                                             for c in core.read_node(name).status.conditions or []),
                       60, f"node {name} Ready")
        yield names, tag
    finally:
        for name in names:
            delete_fake_node(core, name)


def _spec(tag: str, requests: dict[str, str], *, hold: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {PAIR_LABEL: tag}, "containers": [{
        "name": "main", "image": "trainer", "resources": {"requests": requests, "limits": requests}}]}
    if hold:
        spec["schedulingGates"] = [{"name": HOLD}]
    return spec


def tight_gang(name: str, tag: str, small: dict[str, str], big: dict[str, str]) -> dict[str, Any]:
    """A Job of 2 pods of ``small`` and a bare Pod of ``big`` (held by the test's own gate)."""
    job = {"replicas": 1, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-job"},
        "spec": {"parallelism": 2, "completions": 2, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}},
            "spec": {"restartPolicy": "Never", **_spec(tag, small)}}}}}
    pod = {"replicas": 1, "generictemplate": {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-big"}, "spec": _spec(tag, big, hold=True)}}
    return appwrapper(name, job, pod)


def release_hold(core: k8s.CoreV1Api, namespace: str, name: str) -> None:
    """Remove the test's own gate from a pod (mcad's, if still there, stays)."""
    pod = core.read_namespaced_pod(name, namespace)
    gates = [{"name": g.name} for g in pod.spec.scheduling_gates or [] if g.name != HOLD]
    core.patch_namespaced_pod(name, namespace, [{"op": "replace", "path": "/spec/schedulingGates", "value": gates}])


def pinned_node(pod: Any) -> str | None:
    """The node a pod's required node affinity names by metadata.name, if any."""
    affinity = pod.spec.affinity
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution \
        if affinity and affinity.node_affinity else None
    for term in (required.node_selector_terms if required else []) or []:
        for field in term.match_fields or []:
            if field.key == "metadata.name" and field.operator == "In" and len(field.values) == 1:
                return str(field.values[0])
    return None


CPU = ({"cpu": "4"}, {"cpu": "2"}, {"cpu": "3"})
GPU = ({"cpu": "16", "nvidia.com/gpu": "8"}, {"cpu": "100m", "nvidia.com/gpu": "4"},
       {"cpu": "100m", "nvidia.com/gpu": "6"})


@pytest.mark.parametrize(("node_pair", "small", "big"), [CPU, GPU], ids=["cpu", "gpu"], indirect=["node_pair"])
def test_a_tight_gang_runs_whole_on_the_nodes_of_its_plan(
        node_pair: tuple[list[str], str], small: dict[str, str], big: dict[str, str], controller_kubeconfig: str,
        aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    (first, second), tag = node_pair
    with running_controller(controller_kubeconfig, LOGS / "test_placement.log"):
        aws.create(tight_gang("tight", tag, small, big))
        aws.wait_state("tight", "Running")
        job_pods = wait_until(lambda: [p for p in aws.pods("tight") if p.spec.node_name
                                       and p.metadata.name != "tight-big"] if len(
            [p for p in aws.pods("tight") if p.spec.node_name and p.metadata.name != "tight-big"]) == 2 else None,
            60, "the Job's two pods bound")
        # First-fit decreasing: the big pod on the first node, both Job pods on the second.
        assert sorted(p.spec.node_name for p in job_pods) == [second, second]
        assert all(pinned_node(p) == second for p in job_pods)
        big_pod = core.read_namespaced_pod("tight-big", aws.namespace)
        assert [g.name for g in big_pod.spec.scheduling_gates or []] == [HOLD], "mcad's gate is gone, the test's stays"
        assert pinned_node(big_pod) == first
        release_hold(core, aws.namespace, "tight-big")
        running = aws.wait_pods("tight", 3)
        assert {p.metadata.name: p.spec.node_name for p in running}["tight-big"] == first
        aws.delete("tight")
        wait_until(lambda: not aws.pods("tight"), 60, "the gang's pods to go")


@pytest.mark.parametrize(("node_pair", "small", "big"), [CPU], ids=["cpu"], indirect=["node_pair"])
def test_with_advisory_placement_the_scheduler_spreads_the_gang_and_a_pod_stays_pending(
        node_pair: tuple[list[str], str], small: dict[str, str], big: dict[str, str], controller_kubeconfig: str,
        aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    (first, second), tag = node_pair
    with running_controller(controller_kubeconfig, LOGS / "test_placement.log", "--placement=advisory"):
        aws.create(tight_gang("loose", tag, small, big))
        aws.wait_state("loose", "Running")
        job_pods = wait_until(lambda: (bound := [p for p in aws.pods("loose") if p.spec.node_name]) and len(
            bound) == 2 and bound, 60, "the Job's two pods bound")
        assert sorted(p.spec.node_name for p in job_pods) == [first, second], "the scheduler spreads them"
        assert all(pinned_node(p) is None for p in job_pods)
        release_hold(core, aws.namespace, "loose-big")

        def refused() -> str | None:
            pod = core.read_namespaced_pod("loose-big", aws.namespace)
            return next((c.message for c in pod.status.conditions or []
                         if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

        assert "Insufficient" in wait_until(refused, 60, "the big pod to be unschedulable")
        aws.delete("loose")
        wait_until(lambda: not aws.pods("loose"), 60, "the gang's pods to go")
