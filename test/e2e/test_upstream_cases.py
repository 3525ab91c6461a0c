"""Upstream MCAD's Go e2e cases (test/e2e/queue.go; mcad-upstream.md §4.2), on a real cluster.

Upstream sized its cpu requests for about 1950m of free cpu (2 KinD nodes x 2 cpu, minus system pods and MCAD):
2x550m fills most of it, leaving 850m, so 2x425m fits exactly and 2x427m does not. Here every request is the
same fraction of the free cpu measured at the start of the test (``scaled``), and the "just fits / just does not"
pairs bracket the remainder left by the first AppWrapper exactly as 425m/427m bracket 850m (``split``).

"No pods" is never asserted by waiting for time to pass: the test waits for the controller's decision (state
Pending with upstream's Backoff condition, reason ``AppWrapperNotRunnable.``), and only then checks that nothing
of the AppWrapper exists.

The controller runs as upstream queued, best-effort FIFO (``--reservations=0``): a later AppWrapper that fits
dispatches even while an earlier one waits, which case 02 asserts. mcad's default instead gives the earlier one a
reservation that the later one may not take (test_reservations.py). Under that default case 02 passed only when
both AppWrappers were created within one second, so the names put 425m first; a CI run in which they were not
failed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import (
    GROUP,
    PLURAL,
    VERSION,
    AppWrappers,
    Controller,
    appwrapper,
    blocked_on,
    delete_fake_node,
    deployment_item,
    fake_node,
    free_cpu_millis,
    job_item,
    pinned,
)
from test.support import wait_until

CONTROLLER_ARGS = ("--reservations=0",)
UPSTREAM_FREE_MILLIS = 1950  # free cpu upstream's numbers were calibrated for (mcad-upstream.md §4.1)
APPWRAPPER_LABEL = "workload.codeflare.dev/appwrapper"
LEGACY_APPWRAPPER_LABEL = "appwrapper.mcad.ibm.com"


# ---------------------------------------------------------------------------------------------- sizing


def scaled(free: int, upstream_millis: int) -> int:
    """Upstream's request as the same fraction of ``free`` (millicores)."""
    return free * upstream_millis // UPSTREAM_FREE_MILLIS


def split(free: int, first: int) -> tuple[int, int]:
    """Per-pod cpu of 2 pods that just fit / just do not fit in what 2 pods of ``first`` leave (425m / 427m)."""
    rest = free - 2 * first
    return rest // 2, rest // 2 + 2


def timestamp(obj: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(obj["metadata"]["creationTimestamp"])


def millis(value: int) -> str:
    return f"{value}m"


# ---------------------------------------------------------------------------------------------- templates


def container(name: str, requests: dict[str, str] | None = None,
              limits: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "kicbase/echo-server:1.0", "ports": [{"containerPort": 80}]}
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    if resources:
        out["resources"] = resources
    return out


def pod_item(name: str, *, labels: dict[str, str] | None = None, requests: dict[str, str] | None = None,
             limits: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                                "spec": {"containers": [container(name, requests, limits)], **spec}}}


def statefulset_item(name: str, pods: int, *, cpu: str | None = None, **item: Any) -> dict[str, Any]:
    labels = {"app": name}
    requests = {"cpu": cpu} if cpu else None
    return {**item, "generictemplate": {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": pods, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [container(name, requests)]}}}}}


def custom_resources(replicas: int, cpu: str) -> list[dict[str, Any]]:
    return [{"replicas": replicas, "requests": {"cpu": cpu}}]


# ---------------------------------------------------------------------------------------------- assertions


def wait_queued(aws: AppWrappers, name: str, timeout: float = 60) -> dict[str, Any]:
    """The controller decided not to dispatch ``name``; by then nothing of it may exist. Returns its status."""
    def decided() -> dict[str, Any] | None:
        status = aws.status(name)
        backoff = [c for c in status.get("conditions") or [] if c.get("type") == "Backoff"]
        if status.get("state") == "Pending" and backoff and backoff[-1].get("reason") == "AppWrapperNotRunnable.":
            return status
        return None

    status = wait_until(decided, timeout, f"AppWrapper {name} Pending with a Backoff condition")
    assert status["canrun"] is False
    assert status["queuejobstate"] == "Backoff"
    assert aws.pods(name) == []
    return status


def assert_nothing_created(aws: AppWrappers, name: str, *objects: tuple[str, str, str]) -> None:
    for api_version, kind, object_name in objects:
        assert not aws.exists(api_version, kind, object_name), f"{kind} {object_name} of queued {name} exists"
    assert aws.pods(name) == [], f"queued AppWrapper {name} has pods"


def backoff_message(status: dict[str, Any]) -> str:
    return str([c for c in status["conditions"] if c["type"] == "Backoff"][-1]["message"])


def dispatch_first(aws: AppWrappers, free: int) -> int:
    """Upstream's createDeploymentAWwith550CPU: 2 pods that fill most of the free cpu; returns their cpu each."""
    first = scaled(free, 550)
    aws.create(appwrapper("aw-deployment-2-550cpu", deployment_item("aw-deployment-2-550cpu", 2, millis(first)),
                          scheduling={"minAvailable": 2}))
    aws.wait_state("aw-deployment-2-550cpu", "Running")
    aws.wait_pods("aw-deployment-2-550cpu", 2)
    return first


# ---------------------------------------------------------------------------------------------- cases


def test_case_01_cpu_accounting_both_appwrappers_run(controller: Controller, aws: AppWrappers,
                                                     core: k8s.CoreV1Api) -> None:
    """Upstream: 2x550m gets ready pods, then 2x350m (fits what is left) gets ready pods too."""
    free = free_cpu_millis(core)
    dispatch_first(aws, free)
    aws.create(appwrapper("aw-deployment-2-350cpu",
                          deployment_item("aw-deployment-2-350cpu", 2, millis(scaled(free, 350))),
                          scheduling={"minAvailable": 2}))
    aws.wait_state("aw-deployment-2-350cpu", "Running")
    aws.wait_pods("aw-deployment-2-350cpu", 2, timeout=120)
    assert len(aws.pods("aw-deployment-2-550cpu", "Running")) == 2


def test_case_02_cpu_preemption_later_fitting_appwrapper_runs_while_bigger_one_waits(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """Upstream: after 2x550m, 2x427m gets no pods (90 s) while a later 2x425m gets pods (2 min)."""
    free = free_cpu_millis(core)
    first = dispatch_first(aws, free)
    fits, too_big = split(free, first)

    aws.create(appwrapper("aw-deployment-2-426cpu", deployment_item("aw-deployment-2-426cpu", 2, millis(too_big)),
                          scheduling={"minAvailable": 2}))
    status = wait_queued(aws, "aw-deployment-2-426cpu")
    assert blocked_on(backoff_message(status), "cpu")
    assert_nothing_created(aws, "aw-deployment-2-426cpu", ("apps/v1", "Deployment", "aw-deployment-2-426cpu"))

    # Creation times have whole seconds, and equal ones are ordered by name, which puts 425m first: only one
    # created in a later second is behind the 426m one in dispatch order, the case upstream means.
    created = timestamp(aws.get("aw-deployment-2-426cpu"))
    wait_until(lambda: datetime.now(UTC) >= created + timedelta(seconds=1), 5, "the next second")
    aws.create(appwrapper("aw-deployment-2-425cpu", deployment_item("aw-deployment-2-425cpu", 2, millis(fits)),
                          scheduling={"minAvailable": 2}))
    assert timestamp(aws.get("aw-deployment-2-425cpu")) > created, "the 425m one is not behind the 426m one"
    aws.wait_state("aw-deployment-2-425cpu", "Running")
    aws.wait_pods("aw-deployment-2-425cpu", 2, timeout=120)
    # The cycle that dispatched the 425m one looked at the 426m one first (FIFO) and left it queued.
    assert aws.status("aw-deployment-2-426cpu")["state"] == "Pending"
    assert_nothing_created(aws, "aw-deployment-2-426cpu", ("apps/v1", "Deployment", "aw-deployment-2-426cpu"))


def test_case_05_statefulset_only_2_pods(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: an AppWrapper with a 2-replica StatefulSet (no requests), minAvailable 2, gets 2 ready pods."""
    aws.create(appwrapper("aw-statefulset-2", statefulset_item("aw-statefulset-2", 2, replicas=1),
                          scheduling={"minAvailable": 2}))
    aws.wait_state("aw-statefulset-2", "Running")
    pods = aws.wait_pods("aw-statefulset-2", 2)
    assert {p.metadata.name for p in pods} == {"aw-statefulset-2-0", "aw-statefulset-2-1"}
    assert all(p.metadata.labels[LEGACY_APPWRAPPER_LABEL] == "aw-statefulset-2" for p in pods)


def test_case_06_generic_statefulset_only_2_pods(controller: Controller, aws: AppWrappers,
                                                 core: k8s.CoreV1Api) -> None:
    """Upstream: the same StatefulSet as a generic item with item replicas 2 gets 2 ready pods."""
    # Each pod asks 30% of the free cpu: the demand (60%) fits only if the item's `replicas: 2` is ignored by the
    # resource math, as upstream ignores it (§1.2), rather than multiplying the StatefulSet's own 2 replicas.
    cpu = millis(free_cpu_millis(core) * 30 // 100)
    aws.create(appwrapper("aw-generic-statefulset-2",
                          statefulset_item("aw-generic-statefulset-2", 2, cpu=cpu, replicas=2),
                          scheduling={"minAvailable": 2}))
    aws.wait_state("aw-generic-statefulset-2", "Running")
    aws.wait_pods("aw-generic-statefulset-2", 2)


def test_case_07_deployment_only_3_pods(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: an AppWrapper with a 3-replica Deployment, minAvailable 3, gets 3 ready pods."""
    aws.create(appwrapper("aw-deployment-3", deployment_item("aw-deployment-3", 3, "10m"),
                          scheduling={"minAvailable": 3}))
    aws.wait_state("aw-deployment-3", "Running")
    aws.wait_pods("aw-deployment-3", 3)


def test_case_08_generic_deployment_with_completionstatus_3_pods(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: a 3-replica Deployment item with completionstatus Progressing gets 3 ready pods."""
    aws.create(appwrapper("aw-generic-deployment-3",
                          deployment_item("aw-generic-deployment-3", 3, "10m", completionstatus="Progressing"),
                          scheduling={"minAvailable": 3}))
    # Progressing is True as soon as the Deployment rolls out, while its pods run: RunningHoldCompletion.
    wait_until(lambda: aws.status("aw-generic-deployment-3").get("state") in ("Running", "RunningHoldCompletion"),
               60, "the AppWrapper to run")
    aws.wait_pods("aw-generic-deployment-3", 3)


def test_case_11_podtemplate_only_2_pods(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: two GenericItems, each a named Pod (one with the MCAD label preset), minAvailable 2: 2 ready pods."""
    aws.create(appwrapper("aw-podtemplate-2",
                          pod_item("aw-podtemplate-1", labels={LEGACY_APPWRAPPER_LABEL: "aw-podtemplate-2"}),
                          pod_item("aw-podtemplate-2"), scheduling={"minAvailable": 2}))
    aws.wait_state("aw-podtemplate-2", "Running")
    pods = aws.wait_pods("aw-podtemplate-2", 2)
    assert {p.metadata.name for p in pods} == {"aw-podtemplate-1", "aw-podtemplate-2"}
    for pod in pods:
        assert pod.metadata.labels[APPWRAPPER_LABEL] == "aw-podtemplate-2"
        assert pod.metadata.labels[LEGACY_APPWRAPPER_LABEL] == "aw-podtemplate-2"
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == ("AppWrapper", "aw-podtemplate-2", True)


def test_case_12_check_failed_pod_status_pendingpodconditions_empty(controller: Controller,
                                                                    aws: AppWrappers) -> None:
    """Upstream: a Pod with a toleration and the MCAD label preset gets ready; status.pendingpodconditions empty."""
    aws.create(appwrapper("aw-checkfailedstatus-1", pod_item(
        "aw-checkfailedstatus-1", labels={LEGACY_APPWRAPPER_LABEL: "aw-checkfailedstatus-1"},
        tolerations=[{"effect": "NoSchedule", "key": "key1", "value": "value1", "operator": "Equal"}]),
        scheduling={"minAvailable": 1}))
    aws.wait_state("aw-checkfailedstatus-1", "Running")
    aws.wait_pods("aw-checkfailedstatus-1", 1)
    # Once the controller has counted the Running pod, no pending-pod condition may be left behind.
    status = wait_until(lambda: (s := aws.status("aw-checkfailedstatus-1")).get("running") == 1 and s, 30,
                        "status.running == 1")
    assert not status.get("pendingpodconditions")


def test_case_13_generic_pod_only_1_pod(controller: Controller, aws: AppWrappers) -> None:
    """Upstream: a Pod asking 150Mi of memory, minAvailable 1, gets ready."""
    aws.create(appwrapper("aw-generic-pod-1", pod_item("aw-generic-pod-1", labels={"app": "aw-generic-pod-1"},
                                                       requests={"memory": "150Mi"}, limits={"memory": "150Mi"}),
                          scheduling={"minAvailable": 1}))
    aws.wait_state("aw-generic-pod-1", "Running")
    aws.wait_pods("aw-generic-pod-1", 1)


def test_case_14_generic_pod_too_big_stays_queued(controller: Controller, aws: AppWrappers,
                                                  core: k8s.CoreV1Api) -> None:
    """Upstream: a Pod asking 100 cpu (about 51x the free cpu) gets no pod (90 s): it stays queued."""
    cpu = millis(scaled(free_cpu_millis(core), 100_000))
    aws.create(appwrapper("aw-generic-big-pod-1", pod_item(
        "aw-generic-big-pod-1", labels={"app": "aw-generic-big-pod-1"},
        requests={"cpu": cpu, "memory": "150Mi"}, limits={"cpu": cpu, "memory": "150Mi"}),
        scheduling={"minAvailable": 1}))
    status = wait_queued(aws, "aw-generic-big-pod-1")
    assert blocked_on(backoff_message(status), "cpu")
    assert_nothing_created(aws, "aw-generic-big-pod-1", ("v1", "Pod", "aw-generic-big-pod-1"))


def test_case_17_custom_pod_resources_matching_the_deployment_run(controller: Controller, aws: AppWrappers,
                                                                  core: k8s.CoreV1Api) -> None:
    """Upstream: a 2x550m Deployment with custompodresources 2x550m (requeuing 60 s) gets pods, all ready."""
    cpu = millis(scaled(free_cpu_millis(core), 550))
    aws.create(appwrapper("aw-deployment-2-550-vs-550-cpu",
                          deployment_item("aw-deployment-2-550-vs-550-cpu", 2, cpu,
                                          custompodresources=custom_resources(2, cpu)),
                          scheduling={"minAvailable": 2, "requeuing": {"timeInSeconds": 60}}))
    aws.wait_state("aw-deployment-2-550-vs-550-cpu", "Running")
    aws.wait_pods("aw-deployment-2-550-vs-550-cpu", 2)


def test_case_19_custom_pod_resources_smaller_than_containers_are_not_trusted(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """Upstream: after 2x550m, custompodresources 2x425m on 2x426m containers: upstream trusted the declaration and
    created both pods, one of which could not be scheduled. mcad refuses it at create (a declaration
    below the templates would let a tenant start more than it is charged), naming both figures. The controller's
    own defence for one the webhook never saw (it charges the larger and waits) is
    test/component/test_tenancy.py's."""
    free = free_cpu_millis(core)
    first = dispatch_first(aws, free)
    custom_cpu, _ = split(free, first)  # the two declared pods fit exactly
    container_cpu = custom_cpu + 1  # the real ones do not
    name = "aw-deployment-2-425-vs-426-cpu"
    with pytest.raises(k8s.ApiException) as refused:
        aws.create(appwrapper(name, deployment_item(name, 2, millis(container_cpu),
                                                    custompodresources=custom_resources(2, millis(custom_cpu))),
                              scheduling={"minAvailable": 2, "requeuing": {"timeInSeconds": 60}}))
    assert refused.value.status == 403, refused.value
    body = str(refused.value.body)
    assert f"GenericItems[0] (Deployment {name}): custompodresources declare cpu " in body, body
    assert ", less than its templates ask, cpu " in body, body
    assert_nothing_created(aws, name, ("apps/v1", "Deployment", name))


def test_pendingpodconditions_name_the_pod_the_scheduler_cannot_place_until_it_can(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """Upstream writes status.pendingpodconditions for the Pending pods the scheduler rejects (case 12 checks it
    ends empty). A pod the scheduler rejects needs a constraint mcad does not model: the number of pods a node
    takes (its allocatable ``pods``). On a node that takes 2 pods, one of them the first AppWrapper's, the second
    AppWrapper's 2 pods fit by resources and only one is placed; once the first AppWrapper goes, the other runs
    and the entry goes too."""
    with fake_node(core, cpu="4", memory="16Gi", pods="2") as selector:
        aws.create(appwrapper("first", pinned(deployment_item("first", 1, "100m"), selector)))
        aws.wait_state("first", "Running")
        aws.wait_pods("first", 1)
        name = "second"
        aws.create(appwrapper(name, pinned(deployment_item(name, 2, "100m"), selector)))
        aws.wait_state(name, "Running")

        def named() -> dict[str, Any] | None:
            status = aws.status(name)
            return status if status.get("pendingpodconditions") else None

        status = wait_until(named, 60, f"status.pendingpodconditions of {name}")
        [entry] = status["pendingpodconditions"]
        [stuck] = [p for p in aws.pods(name) if p.status.phase == "Pending"]
        assert entry["podname"] == stuck.metadata.name
        [verdict] = entry["conditions"]
        assert (verdict["type"], verdict["status"], verdict["reason"]) == ("PodScheduled", "False", "Unschedulable")
        assert "Too many pods" in verdict["message"], verdict
        [scheduled] = [c for c in stuck.status.conditions if c.type == "PodScheduled"]
        assert verdict["message"] == scheduled.message
        assert status["pending"] == 1 and status["running"] == 1

        aws.delete("first")  # room for the stuck pod
        wait_until(lambda: (s := aws.status(name)).get("running") == 2 and "pendingpodconditions" not in s, 60,
                   f"both pods of {name} counted Running, and no pendingpodconditions left")
        # Its pods go while their node is still there to confirm it: once the fake node is deleted, pods bound to it
        # wait for the pod garbage collector, which may take longer than the namespace's teardown waits.
        aws.delete(name)
        wait_until(lambda: not aws.pods(name) or None, 60, f"the pods of {name} gone")


def test_case_20_custom_pod_resources_bigger_than_free_stay_queued(controller: Controller, aws: AppWrappers,
                                                                   core: k8s.CoreV1Api) -> None:
    """Upstream: after 2x550m, custompodresources 2x4270m on 2x425m containers: no pods (90 s), queued."""
    free = free_cpu_millis(core)
    first = dispatch_first(aws, free)
    container_cpu, _ = split(free, first)  # the real pods would fit
    name = "aw-deployment-2-4270-vs-425-cpu"
    aws.create(appwrapper(name, deployment_item(name, 2, millis(container_cpu),
                                                custompodresources=custom_resources(2, millis(10 * free))),
                          scheduling={"minAvailable": 2, "requeuing": {"timeInSeconds": 60}}))
    status = wait_queued(aws, name)
    assert blocked_on(backoff_message(status), "cpu")
    assert_nothing_created(aws, name, ("apps/v1", "Deployment", name))


@pytest.fixture
def gpu_node(core: k8s.CoreV1Api, controller: Controller) -> Iterator[str]:
    """A fake node with 8 GPUs, as upstream's KinD nodes had (§4.1); removed after the test."""
    name = f"mcad-test-gpu-{uuid.uuid4().hex[:6]}"
    resources = {"cpu": "4", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "8"}
    core.create_node({"metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                   "labels": {"mcad.test/owned": "true"}},
                      "status": {"capacity": resources, "allocatable": resources}})
    try:
        def ready() -> bool:
            node = core.read_node(name)
            return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []) \
                and not node.spec.taints

        wait_until(ready, 60, f"node {name} Ready and untainted")
        yield name
    finally:
        delete_fake_node(core, name)


def test_case_26_job_large_compute_requirement_stays_pending(controller: Controller, aws: AppWrappers,
                                                             core: k8s.CoreV1Api, gpu_node: str) -> None:
    """Upstream: a Job asking 100 GPUs (cluster has 8 per node; cpu limit 100) ends in state Pending (2 min)."""
    cpu = millis(free_cpu_millis(core) // 10)  # fits: the GPUs alone must keep it out
    item = job_item("aw-test-job-with-large-comp-1", 1, cpu)
    item["generictemplate"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": cpu, "memory": "256M", "nvidia.com/gpu": "100"},
        "limits": {"cpu": "100", "memory": "256M", "nvidia.com/gpu": "100"}}
    aws.create(appwrapper("aw-test-job-with-large-comp-1", item))

    # The GPU node may reach the controller after the AppWrapper; each new node triggers a new decision.
    def gpu_short() -> bool:
        conditions = aws.status("aw-test-job-with-large-comp-1").get("conditions") or []
        # --fit=aggregate: 92 GPUs short of the total; --fit=nodes: the GPU node has only 8.
        return any(c["type"] == "Backoff" and ("nvidia.com/gpu 92 " in c.get("message", "")
                                               or "at most 8 on one node" in c.get("message", ""))
                   for c in conditions)

    wait_until(gpu_short, 60, "a Backoff message saying the GPUs are missing")
    message = backoff_message(wait_queued(aws, "aw-test-job-with-large-comp-1"))
    assert blocked_on(message, "nvidia.com/gpu") and not blocked_on(message, "cpu"), message
    assert_nothing_created(aws, "aw-test-job-with-large-comp-1", ("batch/v1", "Job", "aw-test-job-with-large-comp-1"))


def test_case_27_cpu_accounting_queuing_second_never_runs(controller: Controller, aws: AppWrappers,
                                                          core: k8s.CoreV1Api) -> None:
    """Upstream: after 2x550m, 2x427m never gets ready pods (90 s)."""
    free = free_cpu_millis(core)
    first = dispatch_first(aws, free)
    _, too_big = split(free, first)
    aws.create(appwrapper("aw-deployment-2-427cpu", deployment_item("aw-deployment-2-427cpu", 2, millis(too_big)),
                          scheduling={"minAvailable": 2}))
    status = wait_queued(aws, "aw-deployment-2-427cpu")
    assert blocked_on(backoff_message(status), "cpu")
    assert_nothing_created(aws, "aw-deployment-2-427cpu", ("apps/v1", "Deployment", "aw-deployment-2-427cpu"))


def test_case_30_generic_50_deployments_2_pods_each(controller: Controller, aws: AppWrappers,
                                                    custom: k8s.CustomObjectsApi) -> None:
    """Upstream: 50 AppWrappers, each a Deployment of 2x5m: all 50 have 2 ready pods within 3 min."""
    names = [f"aw-generic-deployment-2-{i:03d}" for i in range(1, 51)]
    for name in names:
        aws.create(appwrapper(name, deployment_item(name, 2, "5m", "16Mi"), scheduling={"minAvailable": 2}))

    def all_running() -> bool:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, aws.namespace, PLURAL)["items"]
        states = {aw["metadata"]["name"]: (aw.get("status") or {}).get("state") for aw in listed}
        pods = aws.core.list_namespaced_pod(aws.namespace, label_selector=APPWRAPPER_LABEL).items
        running = Counter(p.metadata.labels[APPWRAPPER_LABEL] for p in pods if p.status.phase == "Running")
        return all(states.get(n) == "Running" and running[n] >= 2 for n in names)

    wait_until(all_running, 180, "all 50 AppWrappers Running with 2 Running pods each")
