"""Restarting the controller loses nothing: no AppWrapper dispatched twice, none lost, capacity never exceeded."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import (
    LOGS,
    AppWrappers,
    Controller,
    appwrapper,
    blocked_on,
    deployment_item,
    fake_node,
    pinned,
    running_controller,
)
from test.support import wait_until


@pytest.fixture
def controller(controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    with running_controller(controller_kubeconfig, LOGS / "test_restart.log") as ctl:
        yield ctl


@pytest.fixture
def three_cpu_node(core: k8s.CoreV1Api) -> Iterator[dict[str, str]]:
    """A fake node of exactly 3 cpu; pods pinned to it fit nowhere else, whatever else the cluster has."""
    with fake_node(core, cpu="3", memory="8Gi") as selector:
        yield selector


def test_kill_and_restart_mid_flow(controller: Controller, three_cpu_node: dict[str, str], aws: AppWrappers) -> None:
    # (three_cpu_node before aws: the namespace and its pods go first, then the node they ran on.)
    # Six one-cpu gangs for a three-cpu node: three run, three wait, on any cluster.
    names = [f"r-{i}" for i in range(6)]
    for name in names:
        aws.create(appwrapper(name, pinned(deployment_item(name, 1, "1"), three_cpu_node)))
    first = names[:3]
    for name in first:
        aws.wait_state(name, "Running")
    for name in names[3:]:
        aws.wait_state(name, "Pending")
    dispatch_stamps = {n: aws.status(n)["controllerfirstdispatchtimestamp"] for n in first}
    deployment_uids = {n: aws.custom.api_client.sanitize_for_serialization(
        k8s.AppsV1Api(aws.custom.api_client).read_namespaced_deployment(n, aws.namespace))["metadata"]["uid"]
        for n in first}

    controller.stop(signal.SIGKILL)
    aws.delete("r-0")  # capacity frees while nobody watches
    controller.start()

    aws.wait_state("r-3", "Running")
    for name in ("r-1", "r-2"):
        status = aws.status(name)
        assert status["state"] == "Running"
        assert status["controllerfirstdispatchtimestamp"] == dispatch_stamps[name], f"{name} dispatched twice"
        deployment = k8s.AppsV1Api(aws.custom.api_client).read_namespaced_deployment(name, aws.namespace)
        assert deployment.metadata.uid == deployment_uids[name]
    for name in ("r-4", "r-5"):
        assert blocked_on(aws.wait_state(name, "Pending")["message"], "cpu")
        assert not aws.exists("apps/v1", "Deployment", name)

    for name in ("r-1", "r-2", "r-3"):
        aws.delete(name)
    for name in ("r-4", "r-5"):
        aws.wait_state(name, "Running")
    wait_until(lambda: len(aws.pods("r-4", "Running")) == 1 and len(aws.pods("r-5", "Running")) == 1, 60,
               "the last two gangs' pods")
