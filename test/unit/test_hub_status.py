"""Hub mode, the pure pieces around a dispatch into a worker: the status it records and the manifests it sends.

Status: ``dispatched(cluster=...)`` records ``targetClusterName`` and starts without a stale ClusterAvailable;
``requeued`` forgets the worker; ``cluster_available`` is one condition type (a past outage stays as history),
equal output for equal input (so the dispatcher, which writes only changed statuses, writes nothing). Manifests:
in a worker nothing can point at the AppWrapper, so ``remote=True`` drops the ownerReference and carries the
AppWrapper's uid as a label instead, while pods still find their AppWrapper by the usual labels; ``remote=False``
is single-cluster mode, unchanged.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from mcad.api.appwrapper import APPWRAPPER_LABEL, APPWRAPPER_UID_LABEL, LEGACY_APPWRAPPER_LABEL, appwrapper_view
from mcad.k8s.apply import manifest
from mcad.model import status

T0 = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(seconds=5)
T2 = T0 + timedelta(seconds=10)


def conditions_of(s: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [c for c in s["conditions"] if c["type"] == type_]


def running_in(cluster: str) -> dict[str, Any]:
    return status.dispatched(status.queued({}, T0, priority=0, why="short of cpu"), T0, priority=0, cluster=cluster)


def test_dispatched_into_a_worker_records_it_as_target_cluster_name() -> None:
    s = running_in("w2")
    assert s["targetClusterName"] == "w2"
    assert s["state"] == "Running"


def test_dispatched_without_a_cluster_adds_no_target_cluster_name() -> None:
    s = status.dispatched({}, T0, priority=0)
    assert "targetClusterName" not in s


def test_a_new_dispatch_drops_the_previous_workers_cluster_available_condition() -> None:
    down = status.cluster_available(running_in("w1"), T1, available=False, reason="Unreachable",
                                    message="worker cluster w1 is unreachable: connection refused")
    assert conditions_of(down, status.CLUSTER_AVAILABLE)
    requeued = status.requeued(down, T1, priority=0, reason=status.CLUSTER_UNREACHABLE_TIMEOUT, message="gone",
                               requeuings=0, requeue_wait=0)
    again = status.dispatched(requeued, T2, priority=0, cluster="w2")
    assert again["targetClusterName"] == "w2"
    assert conditions_of(again, status.CLUSTER_AVAILABLE) == [], "w1's health says nothing about w2"


def test_requeued_forgets_the_worker() -> None:
    s = status.requeued(running_in("w2"), T1, priority=0, reason=status.CLUSTER_UNREACHABLE_TIMEOUT,
                        message="worker cluster w2 has been unreachable for 300 s", requeuings=0, requeue_wait=0)
    assert "targetClusterName" not in s
    assert s["state"] == "Pending"
    assert s["message"] == "worker cluster w2 has been unreachable for 300 s"


def test_cluster_available_false_then_true_with_reason_and_message() -> None:
    down = status.cluster_available(running_in("w2"), T1, available=False, reason="Unauthorized",
                                    message="worker cluster w2 is unauthorized: token rejected")
    [condition] = conditions_of(down, status.CLUSTER_AVAILABLE)
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False", "Unauthorized", "worker cluster w2 is unauthorized: token rejected")
    assert down["state"] == "Running", "a worker that is away may come back: its AppWrapper keeps running"
    assert down["targetClusterName"] == "w2"

    up = status.cluster_available(down, T2, available=True, reason="Healthy")
    was, condition = conditions_of(up, status.CLUSTER_AVAILABLE)
    assert status.latest(up["conditions"], status.CLUSTER_AVAILABLE) is condition
    assert (condition["status"], condition["reason"]) == ("True", "Healthy")
    assert "message" not in condition
    assert condition["lastTransitionMicroTime"] == status.micro_time(T2)
    assert was["reason"] == "Unauthorized", "the outage stays in the log as history"


def test_cluster_available_with_the_same_input_later_changes_nothing() -> None:
    down = status.cluster_available(running_in("w2"), T1, available=False, reason="Unreachable", message="x")
    assert status.cluster_available(down, T2, available=False, reason="Unreachable", message="x") == down
    changed = status.cluster_available(down, T2, available=False, reason="Unreachable", message="y")
    assert changed != down, "a new message is a new condition"


def test_cluster_available_does_not_mutate_its_input() -> None:
    before = running_in("w2")
    snapshot = {**before, "conditions": [dict(c) for c in before["conditions"]]}
    status.cluster_available(before, T1, available=False, reason="Unreachable", message="x")
    assert before == snapshot


# -- manifests for a worker ----------------------------------------------------------------------------------------


def job_template() -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job", "labels": {"team": "a"}},
            "spec": {"template": {"spec": {"containers": [{"name": "c"}], "restartPolicy": "Never"}}}}


def pytorchjob_template() -> dict[str, Any]:
    replica = {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch"}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
            "spec": {"pytorchReplicaSpecs": {"Master": dict(replica), "Worker": {**replica, "replicas": 2}}}}


def manifest_of(templates: list[dict[str, Any]], index: int, *, remote: bool = False) -> dict[str, Any]:
    """The manifest of item ``index`` of an AppWrapper wrapping ``templates`` (the items as a dispatch reads them)."""
    items = [{"generictemplate": t} for t in templates]
    aw = appwrapper_view({"metadata": {"name": "aw", "namespace": "team", "uid": "u-1"},
                          "spec": {"resources": {"GenericItems": items}}})
    return manifest(aw, index, items[index], remote=remote)


POD_LABELS = {APPWRAPPER_LABEL: "aw", LEGACY_APPWRAPPER_LABEL: "aw"}


def test_remote_manifest_has_no_owner_reference_but_the_uid_label() -> None:
    obj = manifest_of([job_template()], 0, remote=True)
    meta = obj["metadata"]
    assert "ownerReferences" not in meta
    assert meta["labels"] == {"team": "a", **POD_LABELS, APPWRAPPER_UID_LABEL: "u-1"}
    assert meta["namespace"] == "team"


def test_remote_manifest_labels_every_pod_template_with_the_appwrapper_labels() -> None:
    obj = manifest_of([job_template(), pytorchjob_template()], 1, remote=True)
    specs = obj["spec"]["pytorchReplicaSpecs"]
    for role in ("Master", "Worker"):
        assert specs[role]["template"]["metadata"]["labels"] == POD_LABELS, role
    job = manifest_of([job_template()], 0, remote=True)
    assert job["spec"]["template"]["metadata"]["labels"] == POD_LABELS


def test_local_manifest_is_unchanged_owner_reference_and_no_uid_label() -> None:
    obj = manifest_of([job_template()], 0)
    meta = obj["metadata"]
    assert APPWRAPPER_UID_LABEL not in meta["labels"]
    assert meta["labels"] == {"team": "a", **POD_LABELS}
    assert meta["ownerReferences"] == [{
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper", "name": "aw", "uid": "u-1",
        "controller": True, "blockOwnerDeletion": True}]
    assert obj["spec"]["template"]["metadata"]["labels"] == POD_LABELS


def test_remote_manifest_does_not_mutate_the_appwrappers_template() -> None:
    template = job_template()
    manifest_of([template], 0, remote=True)
    assert template == job_template()


def test_remote_manifest_drops_the_templates_own_owner_references() -> None:
    """They name hub objects: in a worker they dangle, and the garbage collector deletes a dangling dependent."""
    template = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "hub-uid"}]}}
    assert "ownerReferences" not in manifest_of([template], 0, remote=True)["metadata"]
