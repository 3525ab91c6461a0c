"""After dispatch: completion, failed Jobs, requeuing when too few pods run, and the dispatch deadline.

Upstream MCAD's e2e cases 3, 4, 21-25, 28 and 29 (mcad-upstream.md §4.2), re-calibrated to the local cluster:
kwok's per-pod annotations stand in for slow init containers (``pod-start.stage.kwok.x-k8s.io/delay``), job
durations (``pod-complete.stage.kwok.x-k8s.io/delay``) and failing containers (``pod-fail.stage.kwok.x-k8s.io``),
and the requeuing waits are seconds instead of minutes.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from datetime import datetime
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
    job_item,
    running_controller,
)
from test.support import wait_until


@pytest.fixture
def controller(controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    # One per test: the restart test stops and starts it.
    with running_controller(controller_kubeconfig, LOGS / "test_lifecycle.log") as ctl:
        yield ctl


def stamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def slow_job(name: str, pods: int, cpu: str, *, start: str, duration: str = "1s", fail: bool = False,
             **item: Any) -> dict[str, Any]:
    """A Job whose pods are Running only ``start`` after they are bound (a slow init container)."""
    job = job_item(name, pods, cpu, duration=duration, **item)
    annotations = job["generictemplate"]["spec"]["template"]["metadata"]["annotations"]
    annotations["pod-start.stage.kwok.x-k8s.io/delay"] = start
    if fail:
        annotations["pod-fail.stage.kwok.x-k8s.io"] = "true"
    return job


# ---------------------------------------------------------------------------------------------- completion


def test_case_22_job_completion(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: a 1-pod Job with completionstatus Complete makes the AppWrapper Completed; objects are kept."""
    aws.create(appwrapper("done", job_item("done", 1, "100m", completionstatus="Complete")))
    status = aws.wait_state("done", "Completed", timeout=60)
    assert condition(status, "Completed")["reason"] == "PodsCompleted"
    assert status["canrun"] is False
    assert aws.exists("batch/v1", "Job", "done"), "a completed AppWrapper keeps its objects"
    assert len(aws.pods("done", "Succeeded")) == 1


def test_case_23_multi_item_job_completion(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: two Jobs, both with completionstatus Complete: Completed once both are."""
    aws.create(appwrapper("multi", job_item("quick", 1, "100m", duration="1s", completionstatus="Complete"),
                          job_item("slow", 1, "100m", duration="4s", completionstatus="Complete")))
    aws.wait_pods("multi", 1, "Succeeded")
    assert aws.status("multi")["state"] == "Running", "one complete Job of two is not completion"
    aws.wait_state("multi", "Completed", timeout=60)


def test_case_28_deployment_running_hold_completion(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: a Deployment with completionstatus Progressing is complete as soon as it progresses, but its
    pods still run: RunningHoldCompletion, and the capacity stays taken."""
    aws.create(appwrapper("hold", deployment_item("hold", 1, "100m", completionstatus="Progressing"),
                          deployment_item("echo", 1, "100m"), scheduling={"minAvailable": 1}))
    aws.wait_pods("hold", 2)
    status = aws.wait_state("hold", "RunningHoldCompletion", timeout=60)
    assert condition(status, "RunningHoldCompletion")["reason"] == "SomeItemsCompleted"
    assert status["canrun"] is True


def test_case_29_service_without_conditions_stays_running(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: a Service with completionstatus Complete never completes (a Service has no such condition)."""
    service = {"replicas": 1, "completionstatus": "Complete", "generictemplate": {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "none"}}}}
    aws.create(appwrapper("svc", service, job_item("side", 1, "100m", duration="1s")))
    aws.wait_state("svc", "Running")
    aws.wait_pods("svc", 1, "Succeeded")
    # Evidence of a decision, not of a wait: a later AppWrapper completes while this one is still Running.
    aws.create(appwrapper("later", job_item("later", 1, "100m", completionstatus="Complete")))
    aws.wait_state("later", "Completed", timeout=60)
    assert aws.status("svc")["state"] == "Running"


def test_a_failed_job_fails_its_appwrapper_with_the_jobs_reason(controller: Controller, aws: AppWrappers,
                                                                core: k8s.CoreV1Api) -> None:
    before = free_cpu_millis(core)
    # retryLimit 0: no reset (by default a failed Job resets its AppWrapper, up to 3 times: test_fault_tolerance).
    broken = appwrapper("broken", slow_job("broken", 1, "500m", start="0s", fail=True))
    broken["metadata"]["annotations"] = {"workload.codeflare.dev.appwrapper/retryLimit": "0"}
    aws.create(broken)
    status = aws.wait_state("broken", "Failed", timeout=60)
    assert condition(status, "Failed")["reason"] == "BackoffLimitExceeded"
    assert status["message"].startswith("Job broken failed (BackoffLimitExceeded)")
    # Released: a job as big as all free cpu runs next.
    aws.create(appwrapper("after", job_item("after", 1, f"{before}m", completionstatus="Complete")))
    aws.wait_state("after", "Completed", timeout=60)


def test_a_job_completion_frees_capacity_for_the_next_within_a_second(controller: Controller, aws: AppWrappers,
                                                                       core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("first", job_item("first", 1, f"{free}m", duration="3s", completionstatus="Complete")))
    aws.wait_state("first", "Running")
    aws.create(appwrapper("second", job_item("second", 1, f"{free}m", completionstatus="Complete")))
    aws.wait_state("second", "Pending")
    second = aws.wait_state("second", "Running", timeout=60)
    pod = aws.pods("first", "Succeeded")[0]
    finished = pod.status.container_statuses[0].state.terminated.finished_at
    dispatched = stamp(condition(second, "Dispatched")["lastTransitionMicroTime"])
    # finishedAt has whole seconds (truncated): a pod that finished at 33.9 s shows 33 s, so a dispatch 0.1 s later
    # measures 1.1 s. What can be told from these stamps is under a second plus that truncation.
    assert 0 <= (dispatched - finished).total_seconds() < 2.0, (finished, dispatched)


def test_case_25_completed_job_pods_are_not_requeued(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: a 2-pod Job with minAvailable 2 and no completionstatus: its Succeeded pods count for
    minAvailable, so it is never requeued (they stay Succeeded)."""
    aws.create(appwrapper("twice", job_item("twice", 2, "100m", duration="1s"),
                          scheduling={"minAvailable": 2, "requeuing": {"timeInSeconds": 2}}))
    aws.wait_pods("twice", 2, "Succeeded")
    # Past the 2 s check: a later AppWrapper's whole life is the evidence that time passed.
    aws.create(appwrapper("clock", job_item("clock", 1, "100m", duration="3s", completionstatus="Complete")))
    aws.wait_state("clock", "Completed", timeout=60)
    status = aws.status("twice")
    assert status["state"] == "Running"
    assert status["numberOfRequeueings"] == 0
    assert condition(status, "PreemptCandidate") is None
    assert len(aws.pods("twice", "Succeeded")) == 2


# ---------------------------------------------------------------------------------------------- requeuing


def test_case_03_requeued_with_growing_waits_until_the_pods_start(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: pods need longer to start than the requeue wait; the wait doubles at each requeue until they
    make it. Here: they start 5 s after binding; the waits are 2 s, 4 s, 8 s: two requeues, then all 3 finish."""
    requeuing = {"timeInSeconds": 2, "growthType": "exponential"}
    aws.create(appwrapper("grow", slow_job("grow", 3, "100m", start="5s", completionstatus="Complete"),
                          scheduling={"minAvailable": 3, "requeuing": requeuing}))
    wait_until(lambda: aws.status("grow").get("numberOfRequeueings", 0) >= 1, 30, "the first requeue")
    first = aws.status("grow")
    candidate = condition(first, "PreemptCandidate")
    assert candidate["reason"] == "MinPodsNotRunning"
    assert "minimum=3, running=0, completed=0" in candidate["message"]
    assert condition(first, "Backoff")["reason"] == "PreemptionTriggered"
    status = aws.wait_state("grow", "Completed", timeout=90)
    assert status["numberOfRequeueings"] == 2, "the 2 s and 4 s waits fail, the 8 s wait lets the pods start"
    assert status["requeueingTimeInSeconds"] == 8
    assert len(aws.pods("grow", "Succeeded")) == 3


def test_case_04_max_requeuings_reached_fails_and_deletes(controller: Controller, aws: AppWrappers,
                                                          core: k8s.CoreV1Api) -> None:
    """Upstream (where the limit never fired): requeued maxNumRequeuings times, then Failed, objects deleted."""
    before = free_cpu_millis(core)
    aws.create(appwrapper("stuck", slow_job("stuck", 2, "500m", start="300s"),
                          scheduling={"minAvailable": 2, "requeuing": {
                              "timeInSeconds": 1, "growthType": "none", "maxNumRequeuings": 2}}))
    status = aws.wait_state("stuck", "Failed", timeout=60)
    assert status["numberOfRequeueings"] == 2
    failed = condition(status, "Failed")
    assert failed["reason"] == "MaxRequeuingsReached"
    assert "maxNumRequeuings is 2" in failed["message"]
    wait_until(lambda: not aws.exists("batch/v1", "Job", "stuck"), 30, "the Job to be deleted")
    wait_until(lambda: not aws.pods("stuck"), 30, "its pods to go")
    assert free_cpu_millis(core) == before


def test_unlimited_requeuing_at_one_second_slows_down_after_a_few_requeues(controller: Controller,
                                                                             aws: AppWrappers) -> None:
    """timeInSeconds 1, growthType none, maxNumRequeuings 0 (unlimited) and pods that never start would cycle
    once a second for ever. The first requeues wait what the spec asks; from the sixth on the wait doubles (up to
    300 s), and the requeue's message says why it waits longer than asked."""
    aws.create(appwrapper("loop", slow_job("loop", 1, "100m", start="600s"),
                          scheduling={"minAvailable": 1, "requeuing": {"timeInSeconds": 1, "growthType": "none"}}))
    fifth = wait_until(lambda: (s := aws.status("loop")).get("numberOfRequeueings", 0) == 5 and s, 90,
                       "the fifth requeue")
    assert fifth["requeueingTimeInSeconds"] == 1, "the first five requeues wait what the spec asks"
    sixth = wait_until(lambda: (s := aws.status("loop")).get("numberOfRequeueings", 0) >= 6 and s, 60,
                       "the sixth requeue")
    assert sixth["numberOfRequeueings"] == 6
    assert sixth["requeueingTimeInSeconds"] == 2
    message = condition(sixth, "PreemptCandidate")["message"]
    assert "waits 2 s instead of the 1 s its requeuing asks" in message and "up to 300 s" in message, message
    seventh = wait_until(lambda: (s := aws.status("loop")).get("numberOfRequeueings", 0) >= 7 and s, 60,
                         "the seventh requeue")
    assert seventh["requeueingTimeInSeconds"] == 4, "the floor doubles per requeue"


def wait_seconds_on_the_cluster(batch: k8s.BatchV1Api, namespace: str, duration: str) -> None:
    """Let ``duration`` pass, observed as an event: a plain Job whose pod kwok completes after that long."""
    name = f"clock-{uuid.uuid4().hex[:6]}"
    batch.create_namespaced_job(namespace, {"metadata": {"name": name}, "spec": {"template": {
        "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": duration}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "clock"}]}}}})
    wait_until(lambda: (batch.read_namespaced_job_status(name, namespace).status.succeeded or 0) >= 1, 60,
               f"the {duration} clock Job")
    batch.delete_namespaced_job(name, namespace, propagation_policy="Background")


def test_restart_in_a_requeue_wait_keeps_the_count_and_the_timer(controller: Controller, aws: AppWrappers,
                                                                 batch: k8s.BatchV1Api) -> None:
    aws.create(appwrapper("patient", slow_job("patient", 1, "100m", start="300s"),
                          scheduling={"minAvailable": 1, "requeuing": {"timeInSeconds": 2}}))
    first = wait_until(lambda: (s := aws.status("patient")).get("numberOfRequeueings", 0) == 1 and s, 30,
                       "the first requeue")
    first_requeue = stamp(condition(first, "PreemptCandidate")["lastTransitionMicroTime"])
    # Re-dispatched (once its old pod is gone) with a 4 s wait; the controller dies inside it for 2 s.
    wait_until(lambda: aws.status("patient").get("state") == "Running", 30, "the second dispatch")
    controller.stop(signal.SIGKILL)
    wait_seconds_on_the_cluster(batch, aws.namespace, "2s")
    controller.start()
    second = wait_until(lambda: (s := aws.status("patient")).get("numberOfRequeueings", 0) == 2 and s, 30,
                        "the second requeue")
    second_requeue = stamp(condition(second, "PreemptCandidate")["lastTransitionMicroTime"])
    between = (second_requeue - first_requeue).total_seconds()
    # The old pod's removal and the re-dispatch take a moment, then the 4 s wait. A timer restarted by the
    # restart would add the 2 s outage and the start-up to that.
    assert 4.0 <= between < 6.5, f"requeues {between:.2f} s apart across the restart"
    assert second["requeueingTimeInSeconds"] == 8


# ---------------------------------------------------------------------------------------------- deadline


def test_case_21_dispatch_deadline_fails_and_stops_the_appwrapper(controller: Controller, aws: AppWrappers,
                                                                  core: k8s.CoreV1Api) -> None:
    """Upstream: dispatchDuration.limit seconds after dispatch a still-running AppWrapper is Failed."""
    before = free_cpu_millis(core)
    aws.create(appwrapper("late", deployment_item("late", 1, "500m"),
                          scheduling={"minAvailable": 1, "dispatchDuration": {"limit": 3}}))
    aws.wait_pods("late", 1)
    status = aws.wait_state("late", "Failed", timeout=30)
    failed = condition(status, "Failed")
    assert failed["reason"] == condition(status, "PreemptCandidate")["reason"] == "DispatchDeadlineExceeded"
    ran = (stamp(failed["lastTransitionMicroTime"]) - stamp(status["controllerfirstdispatchtimestamp"]))
    assert 3.0 <= ran.total_seconds() < 6.0
    wait_until(lambda: not aws.pods("late"), 30, "its pods to go")
    assert free_cpu_millis(core) == before


def test_case_24_podgroup_in_another_namespace_is_refused_at_create(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: a lone PodGroup item whose template names namespace ``default``: no pods, ever. Here the create is
    refused at once, saying why, instead of leaving that to be inferred from a 90 s wait (test_bad_input checks
    the controller's own refusal of such an item, for AppWrappers the webhook never judged)."""
    podgroup = {"replicas": 1, "generictemplate": {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": "default"}, "spec": {"minMember": 1}}}
    with pytest.raises(k8s.exceptions.ApiException) as refused:
        aws.create(appwrapper("pg", podgroup, scheduling={"minAvailable": 1}))
    assert refused.value.status == 403
    assert "GenericItems[0] (PodGroup pg): metadata.namespace 'default' differs from the AppWrapper's namespace" \
        in str(refused.value.body)
    assert aws.pods("pg") == []
