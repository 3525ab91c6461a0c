"""Fault tolerance of dispatched AppWrappers on the local cluster (docs/fault-tolerance.md's behaviour).

The periods are the AppWrapper's own annotations (upstream AppWrapper v1beta2's names), seconds instead of minutes;
pods fail through kwok's test knob (hack/kwok-stages.yaml, stage pod-exit): a Running pod annotated
``mcad.test/exit-code`` fails with that code ``mcad.test/fail-after`` after it started. Every gang that must keep
its room runs on fake nodes made for the test, with an extended resource (``mcad.test/slot``) or GPUs that no
other node has, so what else runs on the cluster does not matter. What each test checks is in its docstring; the
status vocabulary (``resettingCount``, ``resets``, conditions ``Unhealthy``/``Resetting``, Failed reasons
``RetryLimitReached``/``TerminalExitCode``) is upstream AppWrapper v1beta2's.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.api.faulttolerance import (
    DELETE_WHEN_FINISHED,
    DELETION_ON_FAILURE_GRACE,
    FAILURE_GRACE,
    RETRY_LIMIT,
    RETRY_PAUSE,
    RETRYABLE_EXIT_CODES,
    SUCCESS_TTL,
    TERMINAL_EXIT_CODES,
    WARMUP_GRACE,
)
from mcad.model.nodehealth import AUTOPILOT_LABEL, GPU
from test.e2e.conftest import (
    AppWrappers,
    Controller,
    appwrapper,
    condition,
    conditions_of,
    fake_node,
    job_item,
)
from test.e2e.test_lifecycle import slow_job, stamp, wait_seconds_on_the_cluster
from test.e2e.test_placement import labelled_nodes
from test.support import wait_until

# The periods here are seconds, below the default floors (10s): the floors are lifted for this module, and the
# per-namespace bound on resets too, so each test sees only its own AppWrapper's pace.
CONTROLLER_ARGS = ("--retry-pause-floor", "0s", "--grace-period-floor", "0s",
                   "--max-resets-per-namespace-per-minute", "0")
EXIT_CODE, FAIL_AFTER = "mcad.test/exit-code", "mcad.test/fail-after"
SLOT = "mcad.test/slot"
GPU_GROUP = "mcad.test/gpu-group"


def annotated(aw: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    """``aw`` with ``annotations`` on its metadata."""
    aw["metadata"].setdefault("annotations", {}).update(annotations)
    return aw


def pod_item(name: str, requests: dict[str, str], *, exit_code: str | None = None,
             fail_after: str = "1s") -> dict[str, Any]:
    """A bare Pod (no controller recovers it) that runs for ever, or fails with ``exit_code`` ``fail_after`` after
    it started."""
    annotations = {EXIT_CODE: exit_code, FAIL_AFTER: fail_after} if exit_code else {}
    return {"replicas": 1, "generictemplate": {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "trainer", "resources": {"requests": requests, "limits": requests}}]}}}


def deployment_of(name: str, replicas: int, requests: dict[str, str],
                  node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "trainer",
                                            "resources": {"requests": requests, "limits": requests}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"replicas": 1, "generictemplate": {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}}}}


def configmap_item(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                               "data": data}}


def service_item(name: str) -> dict[str, Any]:
    return {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                                               "spec": {"ports": [{"port": 80}], "selector": {"app": name}}}}


def resetting_count(status: dict[str, Any]) -> int:
    return int(status.get("resettingCount") or 0)


def resets(status: dict[str, Any]) -> list[dict[str, Any]]:
    return list(status.get("resets") or [])


def is_true(status: dict[str, Any], type_: str) -> bool:
    found = condition(status, type_)
    return bool(found) and found["status"] == "True"  # type: ignore[index]


def in_pause(status: dict[str, Any], count: int) -> bool:
    """In the retry pause after reset number ``count``: Pending, Resetting True."""
    return status.get("state") == "Pending" and resetting_count(status) == count and is_true(status, "Resetting")


def reset_events(core: k8s.CoreV1Api, namespace: str, name: str) -> list[Any]:
    return [e for e in core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
            if e.reason == "Reset"]


@contextlib.contextmanager
def slot_node(core: k8s.CoreV1Api, slots: int) -> Iterator[dict[str, str]]:
    with fake_node(core, cpu="8", memory="16Gi", **{SLOT: str(slots)}) as selector:
        yield selector


# ---------------------------------------------------------------------------------------------- (a) retries


def test_a_failed_worker_resets_the_gang_which_keeps_its_room_until_the_retry_limit(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """A bare worker pod of a 3-pod gang exits 137 (retryable: no exit-code lists) 3 s after each start. After the
    2 s failure grace the gang is reset (Pending, Resetting, resettingCount 1, a Reset event), and during its 8 s
    pause a 1-slot AppWrapper, which fits only in the gang's room, stays queued; the gang dispatches again. After
    retryLimit (2) resets the next failure fails it: RetryLimitReached, naming the pod and its exit code. Then,
    and only then, the small one runs."""
    slot = {"cpu": "10m", "memory": "16Mi", SLOT: "1"}
    with slot_node(core, 3):
        aws.create(annotated(appwrapper("gang", pod_item("w-0", slot), pod_item("w-1", slot, exit_code="137",
                                                                                  fail_after="3s"),
                                        pod_item("w-2", slot)),
                             {FAILURE_GRACE: "2s", RETRY_PAUSE: "8s", RETRY_LIMIT: "2"}))
        aws.wait_state("gang", "Running")
        first = wait_until(lambda: (s := aws.status("gang")) and in_pause(s, 1) and s, 45, "the first reset's pause")
        unhealthy = condition(first, "Unhealthy")
        assert unhealthy and unhealthy["reason"] == "FailedPods", first.get("conditions")
        assert "w-1" in first["message"] and "137" in first["message"], first["message"]
        assert "Resetting" in first["message"], first["message"]
        last = resets(first)[-1]
        assert last["reason"] == "FailedPods" and last["counted"] is True, resets(first)
        wait_until(lambda: reset_events(core, aws.namespace, "gang"), 30, "a Reset event")
        assert all(e.type == "Warning" for e in reset_events(core, aws.namespace, "gang"))

        aws.create(appwrapper("small", pod_item("small-0", slot)))
        aws.wait_state("small", "Pending", timeout=30)
        # The small one must have been judged while the gang paused, or this test proves nothing.
        assert in_pause(aws.status("gang"), 1), "the pause ended before the small one was queued"
        assert condition(aws.status("small"), "Dispatched") is None

        # The gang dispatches again into the room it kept (the small one in it would leave it 1 slot short).
        wait_until(lambda: (s := aws.status("gang")).get("state") == "Running" and resetting_count(s) == 1, 45,
                   "the gang Running again after its first reset")
        assert condition(aws.status("small"), "Dispatched") is None, "the small one took the gang's room"
        assert not aws.pods("small")

        failed = aws.wait_state("gang", "Failed", timeout=60)
        assert resetting_count(failed) == 2
        reason = condition(failed, "Failed")
        assert reason and reason["reason"] == "RetryLimitReached", failed.get("conditions")
        assert "w-1" in reason["message"] and "137" in reason["message"], reason["message"]
        assert len(resets(failed)) == 2 and all(r["counted"] for r in resets(failed))
        # Its room goes with it: the small one runs.
        aws.wait_state("small", "Running", timeout=60)


# ---------------------------------------------------------------------------------------------- (b) exit codes


@pytest.mark.parametrize(("exit_code", "annotations"), [
    ("42", {TERMINAL_EXIT_CODES: "42"}),
    ("1", {RETRYABLE_EXIT_CODES: "137"}),
], ids=["terminal-code", "not-retryable"])
def test_a_terminal_exit_code_fails_at_once(controller: Controller, aws: AppWrappers, exit_code: str,
                                           annotations: dict[str, str]) -> None:
    """A code in terminalExitCodes, or any code outside retryableExitCodes when that is set, fails the AppWrapper
    without the failure grace (60 s here: a reset could not come within the 30 s waited) and without a reset."""
    name = f"t-{exit_code}"
    aws.create(annotated(appwrapper(name, pod_item(f"{name}-0", {"cpu": "10m"}, exit_code=exit_code)),
                         {FAILURE_GRACE: "60s", RETRY_PAUSE: "1s", RETRY_LIMIT: "3", **annotations}))
    aws.wait_state(name, "Running")
    failed = aws.wait_state(name, "Failed", timeout=30)
    reason = condition(failed, "Failed")
    assert reason and reason["reason"] == "TerminalExitCode", failed.get("conditions")
    assert f"{name}-0" in reason["message"] and exit_code in reason["message"], reason["message"]
    assert resetting_count(failed) == 0 and not resets(failed)
    assert not conditions_of(failed, "Resetting")


# ---------------------------------------------------------------------------------------------- (c) missing


def test_a_wrapped_configmap_deleted_by_hand_resets_and_comes_back(controller: Controller, aws: AppWrappers,
                                                                   core: k8s.CoreV1Api) -> None:
    data = {"config.yaml": "lr: 0.1\n"}
    aws.create(annotated(appwrapper("cfg", configmap_item("cfg-settings", data),
                                    deployment_of("cfg", 1, {"cpu": "10m"})),
                         {RETRY_PAUSE: "2s", FAILURE_GRACE: "2s"}))
    aws.wait_state("cfg", "Running")
    aws.wait_pods("cfg", 1)
    first = core.read_namespaced_config_map("cfg-settings", aws.namespace).metadata.uid
    core.delete_namespaced_config_map("cfg-settings", aws.namespace)
    reset = wait_until(lambda: (s := aws.status("cfg")) and resets(s) and s, 45, "a reset")
    assert resets(reset)[-1]["reason"] == "MissingComponent", resets(reset)
    assert "cfg-settings" in resets(reset)[-1]["message"], resets(reset)
    wait_until(lambda: (s := aws.status("cfg")).get("state") == "Running" and not is_true(s, "Resetting"), 45,
               "cfg Running again")
    again = wait_until(lambda: aws.exists("v1", "ConfigMap", "cfg-settings")
                       and core.read_namespaced_config_map("cfg-settings", aws.namespace), 30, "the ConfigMap again")
    assert again.metadata.uid != first and again.data == data
    aws.wait_pods("cfg", 1)


# ---------------------------------------------------------------------------------------------- (d) restart


def test_restarting_the_controller_mid_run_is_no_failure(controller: Controller, aws: AppWrappers,
                                                         batch: k8s.BatchV1Api) -> None:
    """A running AppWrapper with a ConfigMap, a Service and a Deployment, and grace periods shorter than the
    controller's outage: after a restart nothing is missing, unhealthy or reset (the state it reads after a restart
    is not taken for a missing component or for pods that never started)."""
    aws.create(annotated(appwrapper("steady", configmap_item("steady-cfg", {"k": "v"}), service_item("steady"),
                                    deployment_of("steady", 2, {"cpu": "10m"})),
                         {FAILURE_GRACE: "1s", WARMUP_GRACE: "2s", RETRY_PAUSE: "1s"}))
    aws.wait_state("steady", "Running")
    aws.wait_pods("steady", 2)
    deployment = k8s.AppsV1Api(aws.custom.api_client).read_namespaced_deployment("steady", aws.namespace)
    controller.stop(signal.SIGKILL)
    wait_seconds_on_the_cluster(batch, aws.namespace, "3s")  # longer than every grace period it has
    controller.start()
    # Evidence that the restarted controller has looked, and that its grace periods passed since: a later
    # AppWrapper's whole life, then another 3 s.
    aws.create(appwrapper("clock", job_item("clock", 1, "10m", completionstatus="Complete")))
    aws.wait_state("clock", "Completed", timeout=60)
    wait_seconds_on_the_cluster(batch, aws.namespace, "3s")
    status = aws.status("steady")
    assert status["state"] == "Running"
    assert resetting_count(status) == 0 and not resets(status), resets(status)
    assert not is_true(status, "Unhealthy"), condition(status, "Unhealthy")
    again = k8s.AppsV1Api(aws.custom.api_client).read_namespaced_deployment("steady", aws.namespace)
    assert again.metadata.uid == deployment.metadata.uid, "the Deployment was made again"


# ---------------------------------------------------------------------------------------------- (e) cleanup


def last_seen_then_gone(aws: AppWrappers, api_version: str, kind: str, name: str, since: float,
                        timeout: float) -> float:
    """Poll until the object is gone; return the (wall clock) time it was last seen, ``since`` if never (deleted
    before the first look)."""
    seen = since

    def gone() -> bool:
        nonlocal seen
        if aws.exists(api_version, kind, name):
            seen = time.time()
            return False
        return True

    wait_until(gone, timeout, f"{kind} {name} to be deleted")
    return seen


@pytest.mark.parametrize("delete_itself", [False, True], ids=["objects", "and-itself"])
def test_success_ttl_deletes_a_completed_appwrappers_objects_on_time(controller: Controller, aws: AppWrappers,
                                                                    delete_itself: bool) -> None:
    """successTTLDuration 4 s: the Job stays at least 2 s (whole-second stamps) after Completed and is gone well
    before a minute; with delete-when-finished the AppWrapper goes too, otherwise it stays Completed."""
    annotations = {SUCCESS_TTL: "4s", **({DELETE_WHEN_FINISHED: "true"} if delete_itself else {})}
    aws.create(annotated(appwrapper("ttl", job_item("ttl", 1, "10m", completionstatus="Complete")), annotations))
    completed = aws.wait_state("ttl", "Completed", timeout=60)
    at = stamp(condition(completed, "Completed")["lastTransitionMicroTime"]).timestamp()  # type: ignore[index]
    seen = last_seen_then_gone(aws, "batch/v1", "Job", "ttl", at, 40)
    assert seen - at >= 2.0, f"the Job went {seen - at:.1f} s after completion, before its 4 s TTL"
    wait_until(lambda: not aws.pods("ttl"), 30, "its pods to go")
    if delete_itself:
        wait_until(lambda: aws.absent("ttl"), 30, "the AppWrapper itself to go")
    else:
        assert aws.status("ttl")["state"] == "Completed"


def test_deletion_on_failure_grace_keeps_a_failed_ones_objects_for_the_period(controller: Controller,
                                                                              aws: AppWrappers) -> None:
    """deletionOnFailureGracePeriodDuration 5 s: a Failed AppWrapper's Job (kept to debug) stays at least 3 s, then
    goes; the AppWrapper stays Failed."""
    aws.create(annotated(appwrapper("broken", slow_job("broken", 1, "10m", start="0s", fail=True)),
                         {DELETION_ON_FAILURE_GRACE: "5s", RETRY_LIMIT: "0"}))
    failed = aws.wait_state("broken", "Failed", timeout=60)
    at = stamp(condition(failed, "Failed")["lastTransitionMicroTime"]).timestamp()  # type: ignore[index]
    seen = last_seen_then_gone(aws, "batch/v1", "Job", "broken", at, 40)
    assert seen - at >= 3.0, f"the Job went {seen - at:.1f} s after the failure, before its 5 s grace"
    assert aws.status("broken")["state"] == "Failed"


# ---------------------------------------------------------------------------------------------- (f) node health


def test_a_gpu_gang_on_a_node_labelled_evict_is_reset_onto_other_nodes_without_counting(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """Three 4-GPU nodes, a gang of two 4-GPU pods. Autopilot labels one of its nodes EVICT: the gang is reset
    (NodeUnhealthy, not counted: resettingCount stays 0) and runs again on the two other nodes."""
    with labelled_nodes(core, 3, GPU_GROUP, {"cpu": "8", GPU: "4"}) as (nodes, tag):
        aws.create(annotated(appwrapper("gpus", deployment_of("gpus", 2, {"cpu": "10m", GPU: "4"}, {GPU_GROUP: tag})),
                             {RETRY_PAUSE: "2s", RETRY_LIMIT: "1"}))
        aws.wait_state("gpus", "Running")
        before = aws.wait_pods("gpus", 2)
        sick = before[0].spec.node_name
        assert sick in nodes
        core.patch_node(sick, {"metadata": {"labels": {AUTOPILOT_LABEL: "EVICT"}}})
        reset = wait_until(lambda: (s := aws.status("gpus")) and resets(s) and s, 45, "a reset")
        last = resets(reset)[-1]
        assert last["reason"] == "NodeUnhealthy" and last["counted"] is False, last
        assert sick in last["message"], last
        old = {p.metadata.uid for p in before}

        def moved() -> list[Any] | None:
            pods = [p for p in aws.pods("gpus", "Running") if p.metadata.uid not in old]
            return pods if len(pods) == 2 else None

        after = wait_until(moved, 60, "two new Running pods of the gang")
        assert all(p.spec.node_name != sick for p in after), [p.spec.node_name for p in after]
        status = aws.status("gpus")
        assert status["state"] == "Running" and resetting_count(status) == 0
