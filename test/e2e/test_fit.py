"""Fragmentation-aware fit: ``--fit=nodes`` (the default) against ``--fit=aggregate`` on nodes with 1 GPU each.

Upstream MCAD, Kueue without topology-aware scheduling and Volcano's enqueue all admit one 8-GPU pod when 8 GPUs
are free as 8 x 1 (peers.md §4); the pod then stays Pending while it holds its reservation.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import (
    LOGS,
    AppWrappers,
    Controller,
    appwrapper,
    condition,
    conditions_of,
    delete_fake_node,
)
from test.support import wait_until

GPU_NODES = 8


@pytest.fixture
def gpu_nodes(core: k8s.CoreV1Api, crd: None) -> Iterator[list[str]]:
    """Eight fake nodes with 1 GPU each (and little cpu), removed after the test."""
    suffix = uuid.uuid4().hex[:6]
    names = [f"mcad-test-1gpu-{suffix}-{i}" for i in range(GPU_NODES)]
    resources = {"cpu": "1", "memory": "4Gi", "pods": "110", "nvidia.com/gpu": "1"}
    for name in names:
        core.create_node({"metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                       "labels": {"mcad.test/owned": "true"}},
                          "status": {"capacity": resources, "allocatable": resources}})
    try:
        def ready(name: str) -> bool:
            node = core.read_node(name)
            return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

        for name in names:
            wait_until(lambda name=name: ready(name), 60, f"node {name} Ready")
        yield names
    finally:
        for name in names:
            delete_fake_node(core, name)


def start(kubeconfig: str, *args: str) -> Controller:
    ctl = Controller(kubeconfig, LOGS / "test_fit.log", *args)
    ctl.start()
    return ctl


def gpu_pods(name: str, pods: int, gpus: int, **scheduling: Any) -> dict[str, Any]:
    item = {"replicas": 1, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "trainer", "resources": {
                "requests": {"cpu": "100m", "nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}}
    return appwrapper(name, item, scheduling=scheduling or None)


def test_one_eight_gpu_pod_waits_with_fit_nodes_and_is_dispatched_without(
        gpu_nodes: list[str], controller_kubeconfig: str, aws: AppWrappers) -> None:
    ctl = start(controller_kubeconfig)
    try:
        aws.create(gpu_pods("big", 1, GPU_NODES))
        status = aws.wait_state("big", "Pending")
        assert "on no node" in status["message"] and "nvidia.com/gpu" in status["message"], status["message"]
        assert not aws.exists("batch/v1", "Job", "big")
        # Evidence the decision was made with the same GPUs free: eight 1-GPU pods go ahead and run.
        aws.create(gpu_pods("spread", GPU_NODES, 1))
        aws.wait_pods("spread", GPU_NODES)
        assert aws.status("big")["state"] == "Pending"
        aws.delete("spread")
        wait_until(lambda: not aws.pods("spread"), 60, "the spread pods to go")
    finally:
        ctl.stop()
    ctl = start(controller_kubeconfig, "--fit=aggregate")
    try:
        aws.wait_state("big", "Running")
        wait_until(lambda: aws.pods("big"), 30, "the 8-GPU pod")
        assert not aws.pods("big", "Running"), "admitted on the total, its pod cannot be placed"
    finally:
        ctl.stop()


def test_case_18_scheduling_fail_fast(gpu_nodes: list[str], controller_kubeconfig: str, aws: AppWrappers) -> None:
    """Upstream case 18: an AppWrapper that fits the total but no node. Upstream dispatched it, its pod stayed
    Pending and the requeue check sent it back (PreemptionTriggered), a later one that fits ran, and then the
    first one still had a condition with reason PreemptionTriggered (its spec's last check), although it waits
    again for another reason. With --fit=aggregate that is what happens here; with --fit=nodes it is never
    dispatched at all."""
    requeue = {"minAvailable": 1, "requeuing": {"timeInSeconds": 2}}
    ctl = start(controller_kubeconfig, "--fit=aggregate")
    try:
        aws.create(gpu_pods("wide", 1, 2, **requeue))
        aws.wait_state("wide", "Running")
        wait_until(lambda: aws.pods("wide", "Pending"), 30, "its unplaceable pod")
        # Seven GPUs: they fit only once wide's reservation is gone, and leave too few for wide.
        aws.create(gpu_pods("rest", GPU_NODES - 1, 1))
        wait_until(lambda: aws.status("wide").get("numberOfRequeueings", 0) >= 1, 30, "the requeue")
        status = aws.status("wide")
        assert condition(status, "PreemptCandidate")["reason"] == "MinPodsNotRunning"
        aws.wait_pods("rest", GPU_NODES - 1)

        def waits_again() -> dict[str, Any] | None:
            status = aws.status("wide")
            return status if (condition(status, "Backoff") or {}).get("reason") == "AppWrapperNotRunnable." else None

        status = wait_until(waits_again, 30, "wide to wait for GPUs again")
        assert status["state"] == "Pending"
        assert any(c.get("reason") == "PreemptionTriggered" for c in status["conditions"]), status["conditions"]
        assert [c["reason"] for c in conditions_of(status, "Backoff")] == [
            "PreemptionTriggered", "AppWrapperNotRunnable."]
        for name in ("wide", "rest"):
            aws.delete(name)
            wait_until(lambda name=name: not aws.pods(name), 60, f"the pods of {name} to go")
    finally:
        ctl.stop()
    ctl = start(controller_kubeconfig)
    try:
        aws.create(gpu_pods("wide", 1, 2, **requeue))
        assert "on no node" in aws.wait_state("wide", "Pending")["message"]
        aws.create(gpu_pods("fits", 2, 1, **requeue))
        aws.wait_pods("fits", 2)
        status = aws.status("wide")
        assert status["state"] == "Pending" and status.get("numberOfRequeueings", 0) == 0
        assert not aws.exists("batch/v1", "Job", "wide")
    finally:
        ctl.stop()
