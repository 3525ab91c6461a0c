"""Pre-1.34 MCAD YAML (``mcad.ibm.com/v1beta1``) served with ``--legacy-api``: the same queue, the same ledger and
the same behaviour as ``workload.codeflare.dev``, with status and owner references going back to the old group."""

from __future__ import annotations

import re
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
    deployment_item,
    free_cpu_millis,
    running_controller,
)
from test.support import wait_until

LEGACY = "mcad.ibm.com"


@pytest.fixture(scope="module")
def controller(legacy_crd: None, controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    with running_controller(controller_kubeconfig, LOGS / "test_legacy_api.log", "--legacy-api") as ctl:
        yield ctl


def legacy(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "apiVersion": f"{LEGACY}/v1beta1"}


class Legacy:
    def __init__(self, custom: k8s.CustomObjectsApi, namespace: str) -> None:
        self.custom, self.namespace = custom, namespace

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(LEGACY, "v1beta1", self.namespace, "mcadappwrappers", legacy(body))

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(LEGACY, "v1beta1", self.namespace, "mcadappwrappers", name)  # type: ignore[no-any-return]

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(LEGACY, "v1beta1", self.namespace, "mcadappwrappers", name)

    def wait_state(self, name: str, state: str, timeout: float = 60) -> dict[str, Any]:
        return wait_until(lambda: (s := self.get(name).get("status") or {}).get("state") == state and s, timeout,
                          f"legacy AppWrapper {name} state {state}")


@pytest.fixture
def olds(custom: k8s.CustomObjectsApi, aws: AppWrappers) -> Iterator[Legacy]:
    olds = Legacy(custom, aws.namespace)
    yield olds
    custom.delete_collection_namespaced_custom_object(LEGACY, "v1beta1", aws.namespace, "mcadappwrappers")


def test_old_yaml_is_dispatched_and_cleaned_up_as_before(controller: Controller, aws: AppWrappers, olds: Legacy,
                                                         apps: k8s.AppsV1Api) -> None:
    olds.create(appwrapper("old", deployment_item("old", 2, "100m")))
    status = olds.wait_state("old", "Running")
    assert status["canrun"] is True and condition(status, "Dispatched")
    aws.wait_pods("old", 2)
    deployment = apps.read_namespaced_deployment("old", aws.namespace)
    owner = deployment.metadata.owner_references[0]
    assert (owner.api_version, owner.kind, owner.name) == (f"{LEGACY}/v1beta1", "AppWrapper", "old")
    olds.delete("old")
    wait_until(lambda: not aws.exists("apps/v1", "Deployment", "old"), 30, "the wrapped Deployment to go")


def test_both_groups_share_one_queue_and_one_ledger(controller: Controller, aws: AppWrappers, olds: Legacy,
                                                    core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    big = f"{free - 500}m"
    aws.create(appwrapper("new-big", deployment_item("new-big", 1, big)))
    aws.wait_state("new-big", "Running")
    olds.create(appwrapper("old-waits", deployment_item("old-waits", 1, "1")))
    waiting = olds.wait_state("old-waits", "Pending")
    assert condition(waiting, "Backoff"), "the legacy one waits for capacity the current one holds"
    aws.delete("new-big")
    olds.wait_state("old-waits", "Running")


def test_a_name_taken_in_the_current_group_is_not_dispatched_twice(controller: Controller, aws: AppWrappers,
                                                                    olds: Legacy) -> None:
    aws.create(appwrapper("twin", deployment_item("twin-new", 1, "100m")))
    aws.wait_state("twin", "Running")
    olds.create(appwrapper("twin", deployment_item("twin-old", 1, "100m")))
    noticed = re.compile(rf"ignoring it\s+appwrapper={re.escape(aws.namespace)}/twin\b")
    wait_until(lambda: noticed.search(controller.log.read_text()), 30, "the controller to notice the legacy twin")
    aws.create(appwrapper("after", deployment_item("after", 1, "100m")))
    aws.wait_state("after", "Running")  # a later cycle has run
    assert not aws.exists("apps/v1", "Deployment", "twin-old")
    assert not olds.get("twin").get("status")
