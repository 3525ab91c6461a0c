"""No stalls on the real control plane: a preemptor whose victims' pods do not go away stops holding the queue
after --preemption-victim-timeout, force-deleting those past their grace period; and while it holds the queue,
what it holds says so. Victim pods "ignore SIGTERM" through the kwok stage annotation mcad.test/ignore-deletion
(hack/kwok-stages.yaml): nothing but a force deletion removes them."""

from __future__ import annotations

from typing import Any

import kubernetes.client as k8s

from test.e2e.conftest import AppWrappers, Controller, appwrapper, deployment_item, free_cpu_millis
from test.support import wait_until

VICTIM_TIMEOUT = 6
CONTROLLER_ARGS = ("--preemption", "--preemption-victim-timeout", str(VICTIM_TIMEOUT))
STUCK = "mcad.test/ignore-deletion"
HOLD = "mcad.test/hold"


def stubborn(item: dict[str, Any], *, grace: int, finalizer: bool = False) -> dict[str, Any]:
    """Its pods stay terminating once deleted (kwok plays a process that ignores SIGTERM), for ``grace`` seconds
    of grace period; with ``finalizer`` even a force deletion leaves them."""
    template = item["generictemplate"]["spec"]["template"]
    template["metadata"].setdefault("annotations", {})[STUCK] = "true"
    if finalizer:
        template["metadata"]["finalizers"] = [HOLD]
    template["spec"]["terminationGracePeriodSeconds"] = grace
    return item


def events_of(core: k8s.CoreV1Api, namespace: str, name: str) -> list[str]:
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [e.message or "" for e in found]


def test_a_victim_past_its_grace_period_is_force_deleted_and_the_preemptor_runs(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("low", stubborn(deployment_item("low", 1, f"{free * 6 // 10}m"), grace=1)))
    aws.wait_pods("low", 1)
    aws.create(appwrapper("high", deployment_item("high", 1, f"{free * 6 // 10}m"), priority=10))
    wait_until(lambda: aws.pods("low") and aws.pods("low")[0].metadata.deletion_timestamp, 30,
               "the victim's pod to be terminating")
    aws.create(appwrapper("small", deployment_item("small", 1, f"{free * 3 // 10}m")))
    held = aws.wait_state("small", "Pending")
    assert "held behind" in held["message"] and "high" in held["message"], held["message"]

    # Past the timeout: the victim's pod (grace 1 s, long over) is force-deleted, and the preemptor runs.
    aws.wait_state("high", "Running", timeout=VICTIM_TIMEOUT + 30)
    # small fits beside high; a preemptor whose victims did not go in time holds no reservation, so the cycle that
    # gave up on them let small go.
    aws.wait_state("small", "Running", timeout=30)
    assert not aws.pods("low"), "the stuck pod was force-deleted"
    wait_until(lambda: any(f"did not finish terminating within {VICTIM_TIMEOUT} s" in m
                           for m in events_of(core, aws.namespace, "high")), 30, "the preemptor's Event")


def test_a_victim_that_even_force_deletion_cannot_remove_stops_holding_the_queue(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("low", stubborn(deployment_item("low", 1, f"{free * 6 // 10}m"), grace=1,
                                          finalizer=True)))
    aws.wait_pods("low", 1)
    try:
        aws.create(appwrapper("high", deployment_item("high", 1, f"{free * 6 // 10}m"), priority=10))
        wait_until(lambda: aws.pods("low") and aws.pods("low")[0].metadata.deletion_timestamp, 30,
                   "the victim's pod to be terminating")
        aws.create(appwrapper("small", deployment_item("small", 1, f"{free * 3 // 10}m")))
        assert "held behind" in aws.wait_state("small", "Pending")["message"]

        # The finalizer keeps the pod (and its cpu) for ever: after the timeout the queue goes on without it.
        aws.wait_state("small", "Running", timeout=VICTIM_TIMEOUT + 30)
        assert aws.pods("low"), "a finalizer keeps the pod, force deletion or not"
        high = aws.status("high")
        assert high["state"] == "Pending"
        assert f"did not finish terminating within {VICTIM_TIMEOUT} s" in high["message"], high["message"]
    finally:
        for pod in aws.pods("low"):
            core.patch_namespaced_pod(pod.metadata.name, aws.namespace, {"metadata": {"finalizers": None}})
    # The pod gone at last, the preemptor gets its room.
    aws.wait_state("high", "Running", timeout=60)
    # The victim, queued again, goes before the teardown frees the room: dispatched then, its new pod would carry the
    # finalizer again and never go.
    aws.delete("low")
    wait_until(lambda: aws.absent("low"), 30, "the victim's AppWrapper to go")
