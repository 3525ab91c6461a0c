"""The local control plane is a real Kubernetes: workloads run on kwok nodes, and API semantics hold.

These are the properties the rest of the suite relies on; if one fails, every later result is suspect.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import kubernetes.client as k8s
import pytest

from test.support import wait_until

FAKE = {"kwok.x-k8s.io/node": "fake"}


def pod_template(labels: dict[str, str], annotations: dict[str, str] | None = None,
                 restart: str = "Always") -> dict[str, Any]:
    return {
        "metadata": {"labels": labels, "annotations": annotations or {}},
        "spec": {"restartPolicy": restart,
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
    }


def test_deployment_gets_running_pods_on_fake_nodes(namespace: str, apps: k8s.AppsV1Api,
                                                    core: k8s.CoreV1Api) -> None:
    labels = {"app": "smoke"}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "smoke"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": pod_template(labels)},
    })

    def running_pods() -> list[Any] | None:
        pods = core.list_namespaced_pod(namespace, label_selector="app=smoke").items
        running = [p for p in pods if p.status.phase == "Running"]
        return running if len(running) == 2 else None

    pods = wait_until(running_pods, 60, "2 Running pods of the Deployment")
    for pod in pods:
        node = core.read_node(pod.spec.node_name)
        assert node.metadata.annotations.get("kwok.x-k8s.io/node") == "fake"
        assert pod.status.pod_ip, "kwok assigns pod IPs"
    wait_until(lambda: apps.read_namespaced_deployment(
        "smoke", namespace).status.available_replicas == 2, 30, "Deployment available=2")


def test_job_pod_succeeds_and_job_completes(namespace: str, batch: k8s.BatchV1Api) -> None:
    batch.create_namespaced_job(namespace, {
        "metadata": {"name": "smoke"},
        "spec": {"backoffLimit": 0, "template": pod_template({"app": "smoke-job"}, restart="Never")},
    })

    def complete() -> bool:
        conditions = batch.read_namespaced_job("smoke", namespace).status.conditions or []
        return any(c.type == "Complete" and c.status == "True" for c in conditions)

    wait_until(complete, 60, "Job condition Complete=True")
    assert batch.read_namespaced_job("smoke", namespace).status.succeeded == 1


def test_job_pod_runtime_follows_the_delay_annotation(namespace: str, batch: k8s.BatchV1Api,
                                                      core: k8s.CoreV1Api) -> None:
    batch.create_namespaced_job(namespace, {
        "metadata": {"name": "slow"},
        "spec": {"backoffLimit": 0, "template": pod_template(
            {"app": "slow"}, {"pod-complete.stage.kwok.x-k8s.io/delay": "4s"}, restart="Never")},
    })

    def pod_in(phase: str) -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector="app=slow").items
        return next((p for p in pods if p.status.phase == phase), None)

    running = wait_until(lambda: pod_in("Running"), 60, "the Job's pod Running")
    done = wait_until(lambda: pod_in("Succeeded"), 60, "the Job's pod Succeeded")
    assert done.metadata.name == running.metadata.name
    started: datetime = running.status.start_time
    finished: datetime = done.status.container_statuses[0].state.terminated.finished_at
    # Timestamps have 1 s resolution; the default delay is 1 s, so >= 3 s proves the annotation was honoured.
    assert (finished - started).total_seconds() >= 3


def test_deleted_pod_goes_away(namespace: str, core: k8s.CoreV1Api) -> None:
    pod = pod_template({"app": "doomed"})
    pod["metadata"]["name"] = "doomed"
    core.create_namespaced_pod(namespace, pod)
    wait_until(lambda: core.read_namespaced_pod("doomed", namespace).status.phase == "Running", 60,
               "pod Running")
    core.delete_namespaced_pod("doomed", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("doomed", namespace)
            return False
        except k8s.exceptions.ApiException as err:
            return err.status == 404

    wait_until(gone, 30, "the pod to be removed (no kubelet: kwok must finish the deletion)")


def test_added_node_shows_its_capacity_and_becomes_ready(core: k8s.CoreV1Api) -> None:
    name = f"mcad-test-node-{uuid.uuid4().hex[:6]}"
    resources = {"cpu": "4", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "1"}
    core.create_node({
        "metadata": {"name": name, "annotations": FAKE, "labels": {"mcad.test/owned": "true"}},
        "status": {"capacity": resources, "allocatable": resources},
    })
    try:
        def ready_node() -> Any:
            node = core.read_node(name)
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            return node if ready and not node.spec.taints else None

        node = wait_until(ready_node, 60, f"node {name} Ready and untainted")
        assert node.status.allocatable["cpu"] == "4"
        assert node.status.allocatable["nvidia.com/gpu"] == "1"
        assert node.status.allocatable["memory"] == "16Gi"
    finally:
        core.delete_node(name)


def test_server_side_apply_reports_conflicts_between_field_managers(namespace: str, core: k8s.CoreV1Api) -> None:
    def apply(manager: str, value: str, force: bool = False) -> Any:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "namespace": namespace},
                "data": {"key": value}}
        return core.patch_namespaced_config_map("ssa", namespace, body, field_manager=manager, force=force,
                                                _content_type="application/apply-patch+yaml")

    apply("first", "a")
    with pytest.raises(k8s.exceptions.ApiException) as conflict:
        apply("second", "b")
    assert conflict.value.status == 409
    assert "conflict" in conflict.value.body.lower()
    assert apply("second", "b", force=True).data["key"] == "b"


def test_deleting_an_owner_deletes_its_dependents(namespace: str, core: k8s.CoreV1Api) -> None:
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "dependent", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]}})
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def dependent_gone() -> bool:
        names = {c.metadata.name for c in core.list_namespaced_config_map(namespace).items}
        return "dependent" not in names

    wait_until(dependent_gone, 60, "the garbage collector to delete the dependent")


# hack/kwok-stages.yaml's pod-exit stage: the test knob that fails a Running pod with a chosen exit code.
EXIT_CODE, FAIL_AFTER = "mcad.test/exit-code", "mcad.test/fail-after"


def terminated(pod: Any) -> Any:
    """The terminated state of the pod's only container, or None."""
    statuses = pod.status.container_statuses or []
    return statuses[0].state.terminated if statuses and statuses[0].state else None


def condition_status(pod: Any, type_: str) -> str | None:
    return next((c.status for c in pod.status.conditions or [] if c.type == type_), None)


def test_a_pod_with_an_exit_code_fails_with_it_after_its_delay(namespace: str, core: k8s.CoreV1Api) -> None:
    pod = pod_template({"app": "oom"}, {EXIT_CODE: "137", FAIL_AFTER: "4s"}, restart="Never")
    pod["metadata"]["name"] = "oom"
    core.create_namespaced_pod(namespace, pod)
    running = wait_until(lambda: (p := core.read_namespaced_pod("oom", namespace)).status.phase == "Running" and p,
                         60, "the pod Running")
    assert terminated(running) is None
    failed = wait_until(lambda: (p := core.read_namespaced_pod("oom", namespace)).status.phase == "Failed" and p,
                        60, "the pod Failed")
    state = terminated(failed)
    assert state is not None and state.exit_code == 137 and state.reason == "OOMKilled"
    assert condition_status(failed, "Ready") == condition_status(failed, "ContainersReady") == "False"
    # 1 s resolution; the default is 1 s, so >= 3 s proves the annotation was honoured.
    assert (state.finished_at - failed.status.start_time).total_seconds() >= 3
    assert failed.status.pod_ip == running.status.pod_ip, "the pod keeps what the running stage gave it"


def test_a_deployment_pod_with_an_exit_code_fails_and_is_replaced(namespace: str, apps: k8s.AppsV1Api,
                                                                  core: k8s.CoreV1Api) -> None:
    labels = {"app": "crashy"}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "crashy"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": pod_template(labels, {EXIT_CODE: "2", FAIL_AFTER: "1s"})}})

    def failed_pods() -> list[Any]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=crashy").items
        return [p for p in pods if p.status.phase == "Failed"]

    # Every replacement carries the annotation too: the ReplicaSet keeps replacing failed pods.
    pods = wait_until(lambda: len(found := failed_pods()) >= 2 and found, 60, "two failed pods of the Deployment")
    for pod in pods:
        state = terminated(pod)
        assert state is not None and state.exit_code == 2 and state.reason == "Error"


def test_job_pods_succeed_fail_or_exit_as_their_annotations_say(namespace: str, batch: k8s.BatchV1Api,
                                                                core: k8s.CoreV1Api) -> None:
    jobs: dict[str, dict[str, str]] = {
        "plain": {}, "pod-fail": {"pod-fail.stage.kwok.x-k8s.io": "true"},
        # Longer than job-pod-succeed's 1 s: a job stage that took such a pod would end it first.
        "exit-code": {EXIT_CODE: "3", FAIL_AFTER: "3s"}}
    # kwok picks at random among the stages that match a pod: with 4 pods a Job stage that still took pods with an
    # exit code would show in all but 1 run in 16 (their pods succeed or exit 1).
    pods = 4
    for name, marks in jobs.items():
        batch.create_namespaced_job(namespace, {"metadata": {"name": name}, "spec": {
            "parallelism": pods, "completions": pods, "backoffLimit": 2 * pods,
            "template": pod_template({"job": name}, marks, restart="Never")}})

    def finished(name: str) -> list[Any] | None:
        found = [p for p in core.list_namespaced_pod(namespace, label_selector=f"job={name}").items
                 if p.status.phase in ("Succeeded", "Failed")]
        return found if len(found) >= pods else None

    expected = {"plain": ("Succeeded", 0, "Completed"), "pod-fail": ("Failed", 1, "Error"),
                "exit-code": ("Failed", 3, "Error")}
    for name in jobs:
        for pod in wait_until(lambda name=name: finished(name), 60, f"{pods} pods of Job {name} to finish"):
            state = terminated(pod)
            assert (pod.status.phase, state.exit_code, state.reason) == expected[name], pod.metadata.name
