"""The node and pod views the ledger, placement and status are fed: what they keep of a raw object, how they read
odd shapes, and the scheduler's verdict on a pod it could not place."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from mcad.api.resources import ZERO, ResourceVector
from mcad.api.views import (
    MAX_SCHEDULER_MESSAGE,
    NodeView,
    PodView,
    Taint,
    Unschedulable,
    node_view,
    pod_view,
)
from test.unit.nodes_and_pods import GI, node, pod, raw_node, raw_pod, v


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
