"""The capacity ledger (and the node/pod views it is fed): free = capacity - in use - outstanding reservations."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from mcad.api.resources import ZERO, ResourceVector
from mcad.api.views import (
    APPWRAPPER_LABEL,
    MAX_SCHEDULER_MESSAGE,
    NodeView,
    PodView,
    Taint,
    Unschedulable,
    node_view,
    pod_view,
)
from mcad.ledger import Ledger

GI = 2**30


def v(**amounts: int) -> ResourceVector:
    return ResourceVector({("nvidia.com/gpu" if k == "gpu" else k): a for k, a in amounts.items()})


def raw_node(name: str, cpu: str = "4", memory: str = "16Gi", gpu: int = 0, *, ready: bool = True,
             unschedulable: bool | None = None, taints: list[dict[str, str]] | None = None,
             rv: str = "1") -> dict[str, Any]:
    allocatable: dict[str, Any] = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpu:
        allocatable["nvidia.com/gpu"] = str(gpu)
    spec: dict[str, Any] = {}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if taints is not None:
        spec["taints"] = taints
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": rv},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [{"type": "MemoryPressure", "status": "False"},
                           {"type": "Ready", "status": "True" if ready else "Unknown"}],
        },
    }


def node(name: str, cpu: str = "4", memory: str = "16Gi", gpu: int = 0, **kw: Any) -> NodeView:
    return node_view(raw_node(name, cpu, memory, gpu, **kw))


def raw_pod(uid: str, *, cpu: str = "1", memory: str = "1Gi", node_name: str | None = None,
            phase: str = "Pending", aw: str | None = None, namespace: str = "ns",
            deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"pod-{uid}", "namespace": namespace, "uid": uid, "resourceVersion": "7"}
    if aw is not None:
        meta["labels"] = {APPWRAPPER_LABEL: aw, "app": "x"}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def pod(uid: str, **kw: Any) -> PodView:
    return pod_view(raw_pod(uid, **kw))


def running(uid: str, node_name: str = "n1", phase: str = "Running", **kw: Any) -> PodView:
    """A pod bound to ``node_name`` (by default still running)."""
    return pod(uid, node_name=node_name, phase=phase, **kw)


# -- views ----------------------------------------------------------------------------------------------------------


def test_node_view() -> None:
    view = node("n1", "3500m", "8Gi", gpu=2, rv="42")
    assert view == NodeView("n1", ResourceVector({"cpu": 3500, "memory": 8 * GI, "pods": 110, "nvidia.com/gpu": 2}),
                            True, "42")


@pytest.mark.parametrize(
    ("kw", "schedulable"),
    [
        ({}, True),
        ({"ready": False}, False),
        ({"unschedulable": True}, False),
        ({"unschedulable": False}, True),
        ({"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]}, False),
        ({"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}, False),
        ({"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]}, True),
        ({"taints": []}, True),
    ],
)
def test_node_view_schedulable(kw: dict[str, Any], schedulable: bool) -> None:
    assert node("n1", **kw).schedulable is schedulable


def test_node_view_keeps_what_placement_matches() -> None:
    raw = raw_node("n1", unschedulable=True, taints=[
        {"key": "gpu", "value": "true", "effect": "NoSchedule"},
        {"key": "spot", "effect": "PreferNoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
    ])
    raw["metadata"]["labels"] = {"zone": "a", "gpu": "a100"}
    view = node_view(raw)
    assert view.labels == {"zone": "a", "gpu": "a100"}
    assert view.taints == (Taint("gpu", "true", "NoSchedule"), Taint("node.kubernetes.io/unreachable", "", "NoExecute"))
    assert [str(t) for t in view.taints] == ["gpu=true:NoSchedule", "node.kubernetes.io/unreachable:NoExecute"]
    assert view.unschedulable and view.ready and not view.schedulable
    assert not node("n2", ready=False).ready


def test_node_view_labels_are_read_only() -> None:
    raw = raw_node("n1")
    raw["metadata"]["labels"] = {"zone": "a"}
    view = node_view(raw)
    with pytest.raises(TypeError):
        view.labels["zone"] = "b"  # type: ignore[index]
    raw["metadata"]["labels"]["zone"] = "b"  # the informer's raw object changing does not reach the view
    assert view.labels == {"zone": "a"}


def test_node_view_defaults_describe_a_plain_ready_node() -> None:
    view = NodeView("n", v(cpu=1000), True, "1")
    assert (dict(view.labels), view.taints, view.unschedulable, view.ready) == ({}, (), False, True)


@pytest.mark.parametrize("seed", range(20))
def test_node_view_schedulable_is_its_parts(seed: int) -> None:
    rng = random.Random(seed)
    taints = [{"key": "k", "effect": rng.choice(["NoSchedule", "NoExecute", "PreferNoSchedule"])}
              for _ in range(rng.randint(0, 2))]
    view = node("n", ready=rng.random() < 0.7, unschedulable=rng.choice([None, True, False]), taints=taints)
    assert view.schedulable == (view.ready and not view.unschedulable and not view.taints)


def test_node_view_tolerates_odd_shapes() -> None:
    view = node_view({"metadata": {"name": "n", "labels": {"ok": "1", "n": 2, 3: "x"}},
                      "status": {"allocatable": {"cpu": "x", "memory": "1Gi"}, "conditions": "?"},
                      "spec": {"unschedulable": "yes", "taints": [None, {"key": 1, "effect": "NoSchedule"},
                                                                  {"key": "k", "effect": 5},
                                                                  {"key": "k", "effect": ["NoSchedule"]}]}})
    assert view == NodeView("n", v(memory=GI), False, "", labels={"ok": "1"}, taints=(Taint("", "", "NoSchedule"),),
                            unschedulable=False, ready=False)
    assert node_view({}) == NodeView("", ZERO, False, "", ready=False)
    assert node_view({"metadata": {"labels": []}, "spec": {"taints": {}}}).labels == {}


def test_pod_view() -> None:
    view = pod("u1", cpu="500m", node_name="n1", phase="Running", aw="job-a", namespace="team")
    assert view == PodView(uid="u1", namespace="team", name="pod-u1", node_name="n1", phase="Running",
                           requests=v(cpu=500, memory=GI), appwrapper="team/job-a", terminal=False,
                           resource_version="7", deleting=False)


@pytest.mark.parametrize(("phase", "terminal"),
                         [("Pending", False), ("Running", False), ("Unknown", False), ("", False),
                          ("Succeeded", True), ("Failed", True)])
def test_pod_view_terminal(phase: str, terminal: bool) -> None:
    assert pod("u", phase=phase).terminal is terminal


def test_pod_view_unlabelled_unbound_deleting() -> None:
    view = pod("u", deleting=True)
    assert (view.appwrapper, view.node_name, view.deleting) == (None, "", True)
    raw = raw_pod("u", aw="")
    assert pod_view(raw).appwrapper is None


def unschedulable_pod(uid: str, message: str, *, phase: str = "Pending", reason: str = "Unschedulable",
                      status: str = "False") -> dict[str, Any]:
    raw = raw_pod(uid, phase=phase, aw="job-a")
    raw["status"]["conditions"] = [
        {"type": "Initialized", "status": "True"},
        {"type": "PodScheduled", "status": status, "reason": reason, "message": message,
         "lastTransitionTime": "2026-11-21T12:00:03Z", "lastProbeTime": None}]
    return raw


NO_ROOM = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No victims."


def test_pod_view_keeps_the_schedulers_verdict_on_a_pod_it_could_not_place() -> None:
    view = pod_view(unschedulable_pod("u", NO_ROOM))
    assert view.unschedulable == Unschedulable(NO_ROOM, "2026-11-21T12:00:03Z")


@pytest.mark.parametrize("raw", [
    raw_pod("u", phase="Pending"),  # not looked at by the scheduler yet
    unschedulable_pod("u", NO_ROOM, phase="Running"),  # an old condition on a pod that runs
    unschedulable_pod("u", "", status="True", reason=""),  # scheduled, its node still pulling images
    unschedulable_pod("u", "waiting for ephemeral volume", reason="SchedulerError"),
    # The coscheduling plugin holds a pod until its pod group gathers: it waits for its siblings, not for room.
    unschedulable_pod("u", "0/3 nodes are available: 3 optimistic rejection in PostFilter."),
    unschedulable_pod("u", "pod group job-a: cannot find enough sibling pods, current pods number: 1"),
    unschedulable_pod("u", "pod with pgName: ns/job-a last failed in 3s, deny"),
])
def test_pod_view_has_no_verdict_for_other_pods(raw: dict[str, Any]) -> None:
    assert pod_view(raw).unschedulable is None


def test_pod_view_cuts_a_long_scheduler_message_and_shares_equal_ones() -> None:
    long = "0/5000 nodes are available: " + "; ".join(f"{i} node(s) had taint t{i}" for i in range(500))
    view = pod_view(unschedulable_pod("u", long))
    assert view.unschedulable is not None
    assert len(view.unschedulable.message) == MAX_SCHEDULER_MESSAGE
    assert view.unschedulable.message.startswith("0/5000 nodes are available: 0 node(s)")
    assert view.unschedulable.message.endswith("…")
    # Each pod of a gang arrives as its own JSON, with its own copy of the same message: the views share one.
    a, b = (pod_view(json.loads(json.dumps(unschedulable_pod(u, NO_ROOM)))) for u in ("a", "b"))
    assert a.unschedulable is not None and b.unschedulable is not None
    assert a.unschedulable.message is b.unschedulable.message


def test_pod_view_tolerates_odd_shapes_and_bad_quantities() -> None:
    raw = raw_pod("u", cpu="bogus")
    assert pod_view(raw).requests == v(memory=GI)
    assert pod_view({}) == PodView("", "", "", "", "", ZERO, None, False, "", False)
    odd = raw_pod("u")
    odd["status"]["conditions"] = "PodScheduled"
    assert pod_view(odd).unschedulable is None
    odd["status"]["conditions"] = [1, {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                       "message": 5, "lastTransitionTime": {}}]
    assert pod_view(odd).unschedulable == Unschedulable("", "")


# -- ledger scenarios -----------------------------------------------------------------------------------------------


def test_empty_ledger() -> None:
    ledger = Ledger()
    assert ledger.capacity() == ledger.in_use() == ledger.reserved() == ledger.free() == ZERO
    assert schedulable_room(ledger) == {}
    assert ledger.reservation("ns/a") == ZERO
    assert not ledger.is_reserved("ns/a")


def test_nodes_add_update_remove() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "4", "16Gi"))
    ledger.upsert_node(node("n2", "2", "8Gi", gpu=1))
    assert ledger.capacity() == v(cpu=6000, memory=24 * GI, gpu=1, pods=220)
    ledger.upsert_node(node("n2", "2", "8Gi", gpu=1, rv="2"))  # heartbeat: nothing changes
    assert ledger.capacity() == v(cpu=6000, memory=24 * GI, gpu=1, pods=220)
    ledger.upsert_node(node("n2", "3", "8Gi"))  # allocatable changed
    assert ledger.capacity() == v(cpu=7000, memory=24 * GI, pods=220)
    ledger.delete_node("n1")
    assert ledger.capacity() == v(cpu=3000, memory=8 * GI, pods=110)
    ledger.delete_node("n1")  # deleting twice is harmless
    ledger.delete_node("never-seen")
    assert ledger.free() == v(cpu=3000, memory=8 * GI, pods=110)
    assert ledger.node("n2") is not None and ledger.node("n1") is None


def test_unschedulable_nodes_add_no_capacity() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_node(node("cp", taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]))
    ledger.upsert_node(node("cordoned", unschedulable=True))
    ledger.upsert_node(node("sick", ready=False))
    assert ledger.capacity() == node("n1").allocatable
    assert set(schedulable_room(ledger)) == {"n1"}


def test_non_appwrapper_pod_uses_capacity() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "4", "16Gi"))
    ledger.upsert_pod(pod("p1", cpu="1500m", memory="2Gi"))  # pending, unbound: not using anything yet
    assert ledger.in_use() == ZERO
    ledger.upsert_pod(pod("p1", cpu="1500m", memory="2Gi", node_name="n1"))  # bound by the scheduler
    assert ledger.in_use() == v(cpu=1500, memory=2 * GI)
    assert ledger.free() == v(cpu=2500, memory=14 * GI, pods=110)
    assert schedulable_room(ledger) == {"n1": v(cpu=2500, memory=14 * GI, pods=110)}
    assert ledger.reserved() == ZERO


def test_reservation_shrinks_as_own_pods_bind_never_double_counted() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "8", "32Gi"))
    ledger.reserve("ns/aw", v(cpu=4000, memory=4 * GI))
    assert ledger.is_reserved("ns/aw")
    assert ledger.reserved() == ledger.reservation("ns/aw") == v(cpu=4000, memory=4 * GI)
    assert ledger.free() == v(cpu=4000, memory=28 * GI, pods=110)
    free_before = ledger.free()

    ledger.upsert_pod(pod("a", aw="aw"))  # created, not yet bound: still covered by the reservation
    assert ledger.reservation("ns/aw") == v(cpu=4000, memory=4 * GI)
    assert ledger.free() == free_before

    for uid in "abcd":
        ledger.upsert_pod(pod(uid, aw="aw", node_name="n1"))
        assert ledger.free() == free_before  # each bound pod moves from the reservation to in_use
    assert ledger.reservation("ns/aw") == ZERO
    assert ledger.in_use() == v(cpu=4000, memory=4 * GI)
    assert ledger.consumed("ns/aw") == v(cpu=4000, memory=4 * GI)

    ledger.upsert_pod(pod("e", aw="aw", node_name="n1"))  # more than it asked for: the extra is in use, no credit
    assert ledger.reservation("ns/aw") == ZERO
    assert ledger.free() == v(cpu=3000, memory=27 * GI, pods=110)


def test_pod_bigger_than_its_share_does_not_make_reservation_negative() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "8", "32Gi"))
    ledger.reserve("ns/aw", v(cpu=2000, memory=GI, gpu=1))
    ledger.upsert_pod(running("a", aw="aw", cpu="3", memory="1Gi"))
    assert ledger.reservation("ns/aw") == v(gpu=1)  # cpu clamps at 0 per resource; the gpu stays reserved


def test_pods_of_another_namespace_do_not_count_for_the_appwrapper() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.reserve("ns/aw", v(cpu=1000, memory=GI))
    ledger.upsert_pod(running("a", aw="aw", namespace="other"))
    assert ledger.reservation("ns/aw") == v(cpu=1000, memory=GI)
    assert ledger.consumed("other/aw") == v(cpu=1000, memory=GI)


def test_finished_pod_frees_its_share() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "4", "16Gi"))
    ledger.reserve("ns/aw", v(cpu=2000, memory=2 * GI))
    ledger.upsert_pod(running("a", aw="aw"))
    ledger.upsert_pod(running("b", aw="aw"))
    assert ledger.free() == v(cpu=2000, memory=14 * GI, pods=110)
    ledger.upsert_pod(running("a", aw="aw", phase="Succeeded"))
    assert ledger.in_use() == v(cpu=1000, memory=GI)
    assert ledger.reservation("ns/aw") == ZERO  # the finished pod is consumed, not reserved again
    assert ledger.free() == v(cpu=3000, memory=15 * GI, pods=110)
    ledger.upsert_pod(running("b", aw="aw", phase="Failed"))
    assert ledger.free() == ledger.capacity()


def test_finished_pod_that_never_bound_still_counts_as_consumed() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.reserve("ns/aw", v(cpu=1000, memory=GI))
    ledger.upsert_pod(pod("a", aw="aw", phase="Failed"))  # e.g. rejected by the kubelet admission
    assert ledger.reservation("ns/aw") == ZERO
    assert ledger.in_use() == ZERO


def test_node_not_ready_takes_capacity_and_usage_away_and_back() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "4", "16Gi"))
    ledger.upsert_node(node("n2", "4", "16Gi"))
    ledger.upsert_pod(running("a", "n1"))
    ledger.upsert_pod(running("b", "n2", cpu="2"))
    assert ledger.in_use() == v(cpu=3000, memory=2 * GI)
    ledger.upsert_node(node("n2", "4", "16Gi", ready=False))
    assert ledger.capacity() == v(cpu=4000, memory=16 * GI, pods=110)
    assert ledger.in_use() == v(cpu=1000, memory=GI)
    assert set(schedulable_room(ledger)) == {"n1"}
    ledger.upsert_pod(running("c", "n2"))  # a pod bound to the unschedulable node stays out of in_use
    assert ledger.in_use() == v(cpu=1000, memory=GI)
    ledger.upsert_node(node("n2", "4", "16Gi"))  # Ready again: its pods' usage comes back with it
    assert ledger.capacity() == v(cpu=8000, memory=32 * GI, pods=220)
    assert ledger.in_use() == v(cpu=4000, memory=3 * GI)
    assert schedulable_room(ledger)["n2"] == v(cpu=1000, memory=14 * GI, pods=110)


def test_node_deleted_and_recreated() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(running("a", "n1"))
    ledger.delete_node("n1")
    assert ledger.capacity() == ledger.in_use() == ledger.free() == ZERO
    ledger.upsert_node(node("n1"))
    assert ledger.in_use() == v(cpu=1000, memory=GI)


def test_pod_seen_before_its_node() -> None:
    ledger = Ledger()
    ledger.upsert_pod(running("a", "late"))
    assert ledger.in_use() == ZERO
    ledger.upsert_node(node("late"))
    assert ledger.in_use() == v(cpu=1000, memory=GI)


def test_own_pod_on_unschedulable_node_still_shrinks_the_reservation() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", unschedulable=True))
    ledger.reserve("ns/aw", v(cpu=1000, memory=GI))
    ledger.upsert_pod(running("a", "n1", aw="aw"))
    assert ledger.reservation("ns/aw") == ZERO  # bound is bound; the node's capacity is gone anyway
    assert ledger.in_use() == ZERO


def test_pod_deleted() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.reserve("ns/aw", v(cpu=2000, memory=2 * GI))
    ledger.upsert_pod(running("a", aw="aw"))
    ledger.upsert_pod(running("x"))
    assert ledger.reservation("ns/aw") == v(cpu=1000, memory=GI)
    ledger.delete_pod("x")
    assert ledger.in_use() == v(cpu=1000, memory=GI)
    ledger.delete_pod("a")  # the AppWrapper's pod is gone (e.g. to be recreated): its share is reserved again
    assert ledger.in_use() == ZERO
    assert ledger.reservation("ns/aw") == v(cpu=2000, memory=2 * GI)
    ledger.delete_pod("a")
    ledger.delete_pod("never-seen")
    assert ledger.pod("a") is None
    assert ledger.free() == node("n1").allocatable - v(cpu=2000, memory=2 * GI)


def test_deleting_pod_still_holds_its_resources() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(running("a", deleting=True))
    assert ledger.in_use() == v(cpu=1000, memory=GI)


def test_pod_moves_between_nodes_and_phases() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "4", "16Gi"))
    ledger.upsert_node(node("n2", "4", "16Gi"))
    ledger.upsert_node(node("down", ready=False))
    ledger.upsert_pod(running("a", "n1", cpu="2"))
    assert schedulable_room(ledger)["n1"] == v(cpu=2000, memory=15 * GI, pods=110)
    ledger.upsert_pod(running("a", "n2", cpu="2"))  # not something the API allows, but the diff handles it
    assert schedulable_room(ledger)["n1"] == v(cpu=4000, memory=16 * GI, pods=110)
    assert schedulable_room(ledger)["n2"] == v(cpu=2000, memory=15 * GI, pods=110)
    ledger.upsert_pod(running("a", "down", cpu="2"))
    assert ledger.in_use() == ZERO
    ledger.upsert_pod(running("a", "n1", cpu="3"))  # requests changed (in-place resize)
    assert ledger.in_use() == v(cpu=3000, memory=GI)
    ledger.upsert_pod(running("a", "n1", cpu="3", phase="Succeeded"))
    assert ledger.in_use() == ZERO


def test_pod_gains_an_appwrapper_label() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.reserve("ns/aw", v(cpu=1000, memory=GI))
    ledger.upsert_pod(running("a"))
    assert ledger.reservation("ns/aw") == v(cpu=1000, memory=GI)
    ledger.upsert_pod(running("a", aw="aw"))
    assert ledger.reservation("ns/aw") == ZERO
    ledger.upsert_pod(running("a", aw="other"))
    assert ledger.reservation("ns/aw") == v(cpu=1000, memory=GI)


def test_reserve_replaces_the_previous_reservation() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "8", "32Gi"))
    ledger.upsert_pod(running("a", aw="aw"))
    ledger.reserve("ns/aw", v(cpu=4000, memory=4 * GI))
    assert ledger.reservation("ns/aw") == v(cpu=3000, memory=3 * GI)
    ledger.reserve("ns/aw", v(cpu=2000, gpu=1))
    assert ledger.reservation("ns/aw") == v(cpu=1000, gpu=1)
    assert ledger.reserved() == v(cpu=1000, gpu=1)
    ledger.reserve("ns/other", v(cpu=500))
    assert ledger.reserved() == v(cpu=1500, gpu=1)


def test_release() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.reserve("ns/a", v(cpu=1000))
    ledger.reserve("ns/b", v(cpu=2000))
    ledger.upsert_pod(running("p", aw="a", cpu="500m", memory="0"))
    ledger.release("ns/a")
    assert not ledger.is_reserved("ns/a")
    assert ledger.reservation("ns/a") == ZERO
    assert ledger.reserved() == v(cpu=2000)
    assert ledger.in_use() == v(cpu=500)  # its running pods still count as in use
    ledger.release("ns/a")  # releasing twice is harmless
    ledger.release("ns/b")
    assert ledger.reserved() == ZERO
    assert ledger.free() == node("n1").allocatable - v(cpu=500)


def test_reserve_after_pods_exist_counts_them_at_once() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(running("a", aw="aw"))
    ledger.upsert_pod(running("b", aw="aw", phase="Succeeded"))
    ledger.upsert_pod(pod("c", aw="aw"))  # unbound
    ledger.reserve("ns/aw", v(cpu=3000, memory=3 * GI))
    assert ledger.reservation("ns/aw") == v(cpu=1000, memory=GI)


def test_free_may_go_negative() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1", "1", "1Gi"))
    ledger.reserve("ns/aw", v(cpu=2000))
    assert ledger.free()["cpu"] == -1000
    assert not v(cpu=1).fits_in(ledger.free())


def test_zero_request_pods_are_tracked_without_effect() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(running("a", cpu="0", memory="0", aw="aw"))
    assert ledger.in_use() == ZERO
    assert ledger.pod("a") is not None
    ledger.delete_pod("a")
    assert ledger.pod("a") is None


# -- property test: incremental == from scratch ---------------------------------------------------------------------

NODES = ["n1", "n2", "n3", "n4"]
UIDS = [f"u{i}" for i in range(12)]
APPWRAPPERS = ["a", "b", "c"]


def naive(nodes: dict[str, NodeView], pods: dict[str, PodView],
          demands: dict[str, ResourceVector]) -> dict[str, Any]:
    """Everything the ledger answers, recomputed from scratch with plain dicts."""

    def add(acc: dict[str, int], vec: ResourceVector, sign: int = 1) -> None:
        for name, amount in vec.items():
            acc[name] = acc.get(name, 0) + sign * amount

    capacity: dict[str, int] = {}
    for n in nodes.values():
        if n.schedulable:
            add(capacity, n.allocatable)
    in_use: dict[str, int] = {}
    per_node: dict[str, dict[str, int]] = {name: {} for name, n in nodes.items() if n.schedulable}
    consumed: dict[str, dict[str, int]] = {}
    for p in pods.values():
        if p.node_name in per_node and not p.terminal:
            add(in_use, p.requests)
            add(per_node[p.node_name], p.requests)
        if p.appwrapper is not None and (p.node_name or p.terminal):
            add(consumed.setdefault(p.appwrapper, {}), p.requests)
    outstanding: dict[str, ResourceVector] = {}
    reserved: dict[str, int] = {}
    for key, demand in demands.items():
        mine = consumed.get(key, {})
        out = {name: amount - mine.get(name, 0) for name, amount in demand.items()}
        outstanding[key] = ResourceVector({name: a for name, a in out.items() if a > 0})
        add(reserved, outstanding[key])
    free = dict(capacity)
    for name, amount in in_use.items():
        free[name] = free.get(name, 0) - amount
    for name, amount in reserved.items():
        free[name] = free.get(name, 0) - amount
    node_free = {}
    for name, used in per_node.items():
        left = nodes[name].allocatable.as_dict()
        for r, amount in used.items():
            left[r] = left.get(r, 0) - amount
        node_free[name] = ResourceVector(left)
    return {"capacity": ResourceVector(capacity), "in_use": ResourceVector(in_use),
            "reserved": ResourceVector(reserved), "free": ResourceVector(free),
            "outstanding": outstanding, "node_free": node_free}


def random_vector(rng: random.Random) -> ResourceVector:
    return ResourceVector({name: rng.choice([0, 0, 1, 2, 3, 5]) * unit
                           for name, unit in (("cpu", 250), ("memory", GI), ("nvidia.com/gpu", 1))})


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_incremental_ledger_matches_recomputation(seed: int) -> None:
    rng = random.Random(seed)
    ledger = Ledger()
    nodes: dict[str, NodeView] = {}
    pods: dict[str, PodView] = {}
    demands: dict[str, ResourceVector] = {}
    for step in range(400):
        op = rng.choice(["node", "node", "delete_node", "pod", "pod", "pod", "pod", "delete_pod",
                         "reserve", "release"])
        if op == "node":
            n = NodeView(rng.choice(NODES), random_vector(rng).scale(rng.choice([1, 4])),
                         rng.random() < 0.75, str(step))
            nodes[n.name] = n
            ledger.upsert_node(n)
        elif op == "delete_node":
            name = rng.choice(NODES)
            nodes.pop(name, None)
            ledger.delete_node(name)
        elif op == "pod":
            aw = rng.choice([*APPWRAPPERS, None])
            phase = rng.choice(["Pending", "Running", "Running", "Succeeded", "Failed"])
            p = PodView(uid=rng.choice(UIDS), namespace="ns", name="p",
                        node_name=rng.choice([*NODES, "", "", "ghost"]), phase=phase,
                        requests=random_vector(rng), appwrapper=None if aw is None else f"ns/{aw}",
                        terminal=phase in ("Succeeded", "Failed"), resource_version=str(step),
                        deleting=rng.random() < 0.1)
            pods[p.uid] = p
            ledger.upsert_pod(p)
        elif op == "delete_pod":
            uid = rng.choice(UIDS)
            pods.pop(uid, None)
            ledger.delete_pod(uid)
        elif op == "reserve":
            key = f"ns/{rng.choice(APPWRAPPERS)}"
            demands[key] = random_vector(rng).scale(rng.choice([1, 2, 3]))
            ledger.reserve(key, demands[key])
        else:
            key = f"ns/{rng.choice(APPWRAPPERS)}"
            demands.pop(key, None)
            ledger.release(key)

        expected = naive(nodes, pods, demands)
        assert ledger.capacity() == expected["capacity"], step
        assert ledger.in_use() == expected["in_use"], step
        assert ledger.reserved() == expected["reserved"], step
        assert ledger.free() == expected["free"], step
        assert schedulable_room(ledger) == expected["node_free"], step
        for aw in APPWRAPPERS:
            key = f"ns/{aw}"
            assert ledger.is_reserved(key) is (key in demands), step
            assert ledger.reservation(key) == expected["outstanding"].get(key, ZERO), step


def schedulable_room(ledger: Ledger) -> dict[str, ResourceVector]:
    """Per schedulable node: allocatable - requests of its non-terminal pods (reservations not included)."""
    return {name: room for name, room in ledger.room_by_node().items()
            if (node := ledger.node(name)) is not None and node.schedulable}
