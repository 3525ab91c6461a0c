"""Capacity that frees up is used at once: finished pods give back their share, and new nodes add capacity."""

from __future__ import annotations

import uuid

import kubernetes.client as k8s

from test.e2e.conftest import (
    AppWrappers,
    Controller,
    appwrapper,
    blocked_on,
    delete_fake_node,
    deployment_item,
    free_cpu_millis,
    job_item,
)
from test.support import wait_until


def test_finished_job_pods_free_their_share_without_deleting_the_appwrapper(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("batch", job_item("batch", 2, f"{free * 30 // 100}m", duration="3s")))
    aws.wait_pods("batch", 2)
    aws.create(appwrapper("next", deployment_item("next", 1, f"{free * 60 // 100}m")))
    assert blocked_on(aws.wait_state("next", "Pending")["message"], "cpu")
    assert not aws.exists("apps/v1", "Deployment", "next")

    aws.wait_state("next", "Running", timeout=60)
    assert len(aws.pods("batch", "Succeeded")) == 2, "capacity came from the finished pods"
    assert aws.status("batch")["state"] == "Running"


def test_a_new_node_lets_a_waiting_appwrapper_in(controller: Controller, aws: AppWrappers,
                                                 core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("wide", deployment_item("wide", 1, f"{free + 2000}m")))
    assert blocked_on(aws.wait_state("wide", "Pending")["message"], "cpu")

    name = f"mcad-test-node-{uuid.uuid4().hex[:6]}"
    resources = {"cpu": str(free // 1000 + 4), "memory": "8Gi", "pods": "110"}
    core.create_node({"metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                   "labels": {"mcad.test/owned": "true"}},
                      "status": {"capacity": resources, "allocatable": resources}})
    try:
        aws.wait_state("wide", "Running")
        aws.wait_pods("wide", 1)
    finally:
        aws.delete("wide")
        wait_until(lambda: not aws.pods("wide"), 60, "the wide pod to go")
        delete_fake_node(core, name)
