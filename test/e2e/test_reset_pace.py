"""How fast a tenant's failing AppWrappers can be reset, when admission is bypassed (the namespaces here are not
reviewed by the webhooks: ``WEBHOOK_RELEASE = None``, as with the webhook off or a namespace outside its selector).

Without floors, ``retryPausePeriodDuration: 1ns`` and ``0s`` grace periods made one AppWrapper reset 222 times in
30 s. The controller runs with floors of 5s (``--retry-pause-floor``, ``--grace-period-floor``: half the defaults, so
that the pace is measured in half the time) and ``--max-resets-per-namespace-per-minute=2``:
- one AppWrapper asking for ``1ns``/``0s`` is reset at the floors' pace: at most 2 resets in 15 s, each message
  saying the 5s pause;
- three failing AppWrappers of one namespace, created by a tenant holding only AppWrapper rights: 2 resets in the
  first minute, the third deferred with its status saying why; meanwhile another namespace's AppWrapper
  dispatches.
A preemptor whose pods name ``schedulerName: nobody`` fails at dispatch, creating nothing; with
``delete-when-finished`` such a failed AppWrapper is deleted.
Pods fail through kwok's test knob (``test.e2e.test_fault_tolerance.pod_item``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.api import faulttolerance as ft
from mcad.k8s import kube
from test import escalations
from test.e2e.conftest import AppWrappers, Controller, appwrapper
from test.e2e.test_admission import account, kubectl, token_kubeconfig
from test.e2e.test_fault_tolerance import annotated, pod_item, resetting_count
from test.support import wait_until

WEBHOOK_RELEASE = None
FLOOR = "5s"
CONTROLLER_ARGS = ("--max-resets-per-namespace-per-minute", "2", "--retry-pause-floor", FLOOR,
                   "--grace-period-floor", FLOOR)
CHURN = {ft.RETRY_PAUSE: "1ns", ft.FAILURE_GRACE: "0s", ft.ADMISSION_GRACE: "0s", ft.WARMUP_GRACE: "0s",
         ft.RETRY_LIMIT: "1000"}
AT_THE_FLOORS = {ft.RETRY_PAUSE: FLOOR, ft.FAILURE_GRACE: FLOOR, ft.RETRY_LIMIT: "1000"}


def failing(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return annotated(appwrapper(name, pod_item(f"{name}-0", {"cpu": "10m"}, exit_code="1", fail_after="1s")),
                     dict(annotations))


def test_periods_below_the_floors_are_raised_to_them(controller: Controller, aws: AppWrappers) -> None:
    aws.create(failing("churn", CHURN))
    first = wait_until(lambda: resetting_count(s := aws.status("churn")) >= 1 and s, 60, "the first reset")
    assert f"after a {FLOOR} pause" in first["message"], first["message"]
    started = time.monotonic()
    time.sleep(15)  # the measurement itself: how many resets fit in 15 s
    count = resetting_count(aws.status("churn")) - resetting_count(first)
    print(f"resets in {time.monotonic() - started:.0f} s at the floors: {count}")
    # Each cycle is at least the 5s pause plus the 5s grace (and the pod's start and failure).
    assert count <= 2, count


@pytest.fixture
def tenant(kubeconfig: str, aws: AppWrappers, tmp_path: Path) -> str:
    admin = kube.connect(kubeconfig)
    account(admin, aws.namespace, "alice", [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
                                             "verbs": escalations.APPWRAPPER_RIGHTS[0]["verbs"]}])
    made = token_kubeconfig(kubeconfig, admin, aws.namespace, "alice", tmp_path / "alice")
    wait_until(lambda: kubectl(made, "auth", None, "can-i", "create", "appwrappers").stdout.strip() == "yes", 30,
               "alice's Role to count")
    return made


@pytest.fixture
def other_namespace(core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, aws: AppWrappers) -> Iterator[AppWrappers]:
    name = f"{aws.namespace}-other"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield AppWrappers(custom, core, name, aws.connection)
    finally:
        core.delete_namespace(name)


def test_a_namespace_past_its_resets_per_minute_waits_and_others_still_dispatch(
        controller: Controller, aws: AppWrappers, tenant: str, other_namespace: AppWrappers) -> None:
    names = ("f-0", "f-1", "f-2")
    for name in names:
        body = failing(name, AT_THE_FLOORS)
        body["metadata"]["namespace"] = aws.namespace
        proc = kubectl(tenant, "create", body)
        assert proc.returncode == 0, proc.stderr

    def deferred() -> dict[str, Any] | None:
        for name in names:
            status = aws.status(name)
            if "Its reset is deferred" in str(status.get("message", "")):
                return status
        return None

    waiting = wait_until(deferred, 60, "a reset deferred for the namespace's bound")
    assert "namespace " + aws.namespace + " has had 2 resets in the last minute" in waiting["message"], \
        waiting["message"]
    assert waiting["state"] == "Running" and resetting_count(waiting) == 0
    unhealthy = [c for c in waiting["conditions"] if c["type"] == "Unhealthy"][-1]
    assert unhealthy["status"] == "True" and "--max-resets-per-namespace-per-minute" in unhealthy["message"]
    assert sum(resetting_count(aws.status(name)) for name in names) == 2

    other_namespace.create(appwrapper("other", pod_item("other-0", {"cpu": "10m"})))
    other_namespace.wait_state("other", "Running", timeout=30)
    # The namespace's resets stay within the bound for the rest of the minute.
    assert sum(resetting_count(aws.status(name)) for name in names) <= 2


def test_work_naming_another_scheduler_fails_at_dispatch_when_admission_is_bypassed(
        controller: Controller, aws: AppWrappers) -> None:
    """No webhook judged it: the controller fails it (InvalidSpec) before creating or preempting anything."""
    body = appwrapper("nobody", pod_item("nobody-0", {"cpu": "10m"}), priority=100)
    body["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["schedulerName"] = "nobody"
    aws.create(body)
    failed = aws.wait_state("nobody", "Failed", timeout=30)
    assert "schedulerName 'nobody' is not a scheduler the cluster admin allows" in failed["message"], failed
    assert not aws.pods("nobody")
    aws.create(appwrapper("fine", pod_item("fine-0", {"cpu": "10m"})))
    aws.wait_state("fine", "Running", timeout=30)


def test_delete_when_finished_deletes_an_appwrapper_that_failed_at_dispatch(
        controller: Controller, aws: AppWrappers) -> None:
    """Failed before anything was created (InvalidSpec): with ``delete-when-finished`` it goes after the
    deletion-on-failure grace (2 s); without it, it stays to be looked at."""
    for name, asked in (("gone", {ft.DELETE_WHEN_FINISHED: "true", ft.DELETION_ON_FAILURE_GRACE: "2s"}),
                              ("kept", {})):
        body = annotated(appwrapper(name, pod_item(f"{name}-0", {"cpu": "10m"})), asked)
        body["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["schedulerName"] = "nobody"
        aws.create(body)
    aws.wait_state("kept", "Failed", timeout=30)

    def gone() -> bool:
        try:
            aws.get("gone")
        except k8s.ApiException as err:
            return err.status == 404
        return False

    wait_until(gone, 30, "the failed AppWrapper with delete-when-finished to be deleted")
    assert aws.status("kept")["state"] == "Failed"
