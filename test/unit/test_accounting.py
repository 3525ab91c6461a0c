"""The resource accountant as a spec: plans held per node until their pods bind, what forgetting an AppWrapper
drops, which node events matter to fit decisions, the one pod-to-AppWrapper index, footprints, and snapshots that
never write back."""

from __future__ import annotations

from typing import Any

from mcad.api.appwrapper import APPWRAPPER_LABEL
from mcad.api.resources import ZERO
from mcad.api.views import node_view, pod_view
from mcad.model.accounting import Accountant
from mcad.model.quota import Forest, subtree_view
from test.unit.nodes_and_pods import GI, node, pod, raw_node, raw_pod, running, v

ONE = v(cpu=1000, memory=GI)  # the requests of test_ledger's default pod
TWO = v(cpu=2000, memory=GI)
KEY = "ns/a"


def accountant(*names: str, quota_trees: bool = False) -> Accountant:
    acc = Accountant(quota_trees=quota_trees)
    for name in names:
        acc.observe_node(node(name))  # 4 cpu, 16Gi each
    return acc


def one_tree(root_cpu: str = "4") -> Forest:
    """Tree "t": a root with ``root_cpu`` cpu."""
    return Forest.build([subtree_view({
        "apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
        "metadata": {"name": "root", "namespace": "q", "labels": {"tree": "t"}},
        "spec": {"children": [{"name": "root", "quotas": {"requests": {"cpu": root_cpu}}}]}})])


# -- plans ------------------------------------------------------------------------------------------------------------


def test_a_plan_holds_room_on_its_nodes_until_its_pods_bind() -> None:
    acc = accountant("n1", "n2")
    acc.assume(KEY, ONE.scale(3), {}, plan=(("n1", ONE, 2), ("n2", ONE, 1)))
    assert acc.plans.planned_by_node() == {"n1": ONE.scale(2), "n2": ONE}
    assert acc.room()["n1"].get("cpu") == 2000 and acc.room()["n2"].get("cpu") == 3000

    acc.observe_pod(pod("u1", aw="a"))  # created, not bound: still only planned
    assert acc.plans.planned_nodes(KEY) == [("n1", 2), ("n2", 1)]

    acc.observe_pod(running("u1", node_name="n2", aw="a"))  # bound on n2: the n2 entry goes, not n1's first one
    assert acc.plans.planned_nodes(KEY) == [("n1", 2)]
    assert acc.plans.planned_by_node() == {"n1": ONE.scale(2)}
    assert acc.room()["n2"].get("cpu") == 3000  # the pod now takes what the plan held: counted once

    acc.observe_pod(running("u1", node_name="n2", aw="a", phase="Running"))  # an update of a bound pod
    assert acc.plans.planned_nodes(KEY) == [("n1", 2)]


def test_a_bound_pod_takes_its_shape_off_the_plan_elsewhere_then_any_entry() -> None:
    acc = accountant("n1", "n2", "n3")
    acc.assume(KEY, ONE + TWO + ONE, {}, plan=(("n1", ONE, 2), ("n2", TWO, 1)))
    acc.observe_pod(running("big", node_name="n3", cpu="2", aw="a"))  # the scheduler put it elsewhere
    assert acc.plans.planned_nodes(KEY) == [("n1", 2)]
    acc.observe_pod(running("odd", node_name="n3", cpu="3", aw="a"))  # a shape the plan never had
    assert acc.plans.planned_nodes(KEY) == [("n1", 1)]
    assert acc.plans.planned_by_node() == {"n1": ONE}


def test_a_pod_that_ends_unbound_also_takes_one_off_the_plan_and_the_last_drops_it() -> None:
    acc = accountant("n1")
    acc.assume(KEY, ONE.scale(2), {}, plan=(("n1", ONE, 2),))
    acc.observe_pod(pod("u1", aw="a", phase="Failed"))
    assert acc.plans.planned_nodes(KEY) == [("n1", 1)]
    acc.observe_pod(running("u2", aw="a"))
    assert acc.plans.planned_nodes(KEY) == [] and acc.plans.planned_by_node() == {}
    # The plan is gone: its bound active pod is left, and the failed pod's share, reserved for its replacement.
    assert acc.footprint(KEY) == [("n1", ONE, 1), ("", ONE, 1)]


def test_pods_of_other_appwrappers_leave_a_plan_alone() -> None:
    acc = accountant("n1")
    acc.assume(KEY, ONE, {}, plan=(("n1", ONE, 1),))
    acc.observe_pod(running("x", aw="b"))
    acc.observe_pod(running("y"))
    assert acc.plans.planned_nodes(KEY) == [("n1", 1)]


# -- forget -----------------------------------------------------------------------------------------------------------


def test_forget_drops_reservation_plan_and_quota_charge_and_says_whether_it_held_any() -> None:
    acc = accountant("n1", quota_trees=True)
    assert acc.quota is not None
    acc.quota.set_forest(one_tree())
    acc.observe_pod(running("u1", aw="a"))
    acc.assume(KEY, ONE.scale(2), {"t": "root"}, plan=(("n1", ONE, 1),))
    assert acc.holds(KEY) and acc.quota.usage("t", "root") == ONE.scale(2) and acc.plans.planned_by_node()

    assert acc.forget(KEY) is True
    assert not acc.holds(KEY) and acc.ledger.reserved_keys() == []
    assert not acc.quota.is_charged(KEY) and acc.quota.usage("t", "root") == ZERO
    assert acc.plans.planned_by_node() == {} and acc.plans.planned_nodes(KEY) == []
    assert acc.ledger.free() == acc.ledger.capacity() - ONE  # its pod still counts while it exists
    assert acc.forget(KEY) is False
    assert acc.forget("ns/never") is False


# -- nodes ------------------------------------------------------------------------------------------------------------


def test_observe_node_tells_a_heartbeat_from_a_change_fit_decisions_read() -> None:
    acc = Accountant()
    raw = raw_node("n1", rv="1")
    assert acc.observe_node(node_view(raw)) is True  # new
    raw["metadata"]["resourceVersion"] = "2"
    raw["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:10Z"
    assert acc.observe_node(node_view(raw)) is False  # a heartbeat
    changes: list[Any] = [
        lambda r: r["status"]["allocatable"].update(cpu="8"),
        lambda r: r["spec"].update(taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]),
        lambda r: r["metadata"].update(labels={"zone": "a"}),
        lambda r: r["spec"].update(unschedulable=True),
    ]
    for change in changes:
        change(raw)
        assert acc.observe_node(node_view(raw)) is True
        assert acc.observe_node(node_view(raw)) is False
    acc.forget_node("n1")
    assert acc.observe_node(node_view(raw)) is True


def test_facts_of_the_nodes_outlive_a_pass_until_a_node_changes() -> None:
    """Snapshots of the same nodes share ``facts`` (topology domains, computed once per node set); a heartbeat
    keeps them, a relabel, a new node or a removed one starts afresh, so no pass reads stale domains."""
    acc = Accountant()
    raw = raw_node("n1", rv="1")
    acc.observe_node(node_view(raw))
    first = acc.snapshot(by_nodes=True)
    first.facts["derived"] = "kept"
    raw["metadata"]["resourceVersion"] = "2"  # a heartbeat
    acc.observe_node(node_view(raw))
    again = acc.snapshot(by_nodes=True)
    assert again.nodes is first.nodes and again.facts is first.facts and again.facts["derived"] == "kept"
    assert again.copy().facts is first.facts
    changes: list[Any] = [
        lambda: acc.observe_node(node_view({**raw, "metadata": {**raw["metadata"], "labels": {"rack": "r1"}}})),
        lambda: acc.observe_node(node("n2")),
        lambda: acc.forget_node("n2"),
    ]
    for change in changes:
        change()
        after = acc.snapshot(by_nodes=True)
        assert after.facts is not first.facts and "derived" not in after.facts
        assert [n.labels.get("rack") for n in after.nodes if n.name == "n1"] == ["r1"]
        first = after
        first.facts["derived"] = "kept"


# -- the pod index ----------------------------------------------------------------------------------------------------


def test_the_pod_index_follows_a_pods_appwrapper_label() -> None:
    acc = accountant("n1")
    raw = raw_pod("u1", node_name="n1", phase="Running", aw="a")
    acc.observe_pod(pod_view(raw))
    assert [p.uid for p in acc.pods(KEY)] == ["u1"] and acc.phases(KEY) == ["Running"] and acc.has_pods(KEY)

    raw["metadata"]["labels"][APPWRAPPER_LABEL] = "b"
    acc.observe_pod(pod_view(raw))
    assert not acc.has_pods(KEY) and acc.pods(KEY) == []
    assert [p.uid for p in acc.pods("ns/b")] == ["u1"]
    assert acc.ledger.consumed(KEY) == ZERO and acc.ledger.consumed("ns/b") == ONE

    del raw["metadata"]["labels"][APPWRAPPER_LABEL]
    acc.observe_pod(pod_view(raw))
    assert not acc.has_pods("ns/b")
    assert acc.forget_pod("u1") is None

    acc.observe_pod(pod_view(raw_pod("u2", node_name="n1", phase="Running", aw="a")))
    assert acc.forget_pod("u2") == KEY
    assert not acc.has_pods(KEY) and acc.ledger.pod("u2") is None


def test_detach_pods_makes_them_nobodys_but_still_in_use() -> None:
    acc = accountant("n1")
    acc.assume(KEY, ONE.scale(3), {}, plan=(("n1", ONE, 3),))
    acc.observe_pod(running("u1", aw="a"))
    acc.observe_pod(pod("u2", aw="a"))
    in_use = acc.ledger.in_use()

    acc.detach_pods(KEY)
    assert not acc.has_pods(KEY) and acc.live_pods(KEY) == []
    assert acc.ledger.consumed(KEY) == ZERO
    assert acc.plans.planned_by_node() == {}
    assert acc.ledger.in_use() == in_use == ONE
    assert acc.ledger.pod("u1") is not None and acc.ledger.pod("u1").appwrapper is None  # type: ignore[union-attr]
    assert acc.forget_pod("u1") is None


# -- footprints -------------------------------------------------------------------------------------------------------


def test_footprint_is_its_bound_active_pods_plus_the_unbound_rest_of_its_plan() -> None:
    acc = accountant("n1", "n2")
    acc.assume(KEY, ONE.scale(4), {}, plan=(("n1", ONE, 2), ("n2", ONE, 2)))
    acc.observe_pod(running("u1", node_name="n1", aw="a"))
    acc.observe_pod(running("u2", node_name="n2", aw="a", phase="Succeeded"))  # done: frees nothing
    assert sorted(acc.footprint(KEY)) == sorted([("n1", ONE, 1), ("n1", ONE, 1), ("n2", ONE, 1)])


def test_footprint_without_a_plan_is_the_outstanding_reservation_on_no_node() -> None:
    acc = accountant("n1")
    acc.assume(KEY, ONE.scale(3), {})
    acc.observe_pod(running("u1", aw="a"))
    assert acc.footprint(KEY) == [("n1", ONE, 1), ("", ONE.scale(2), 1)]
    assert acc.footprint("ns/nobody") == []


# -- snapshots --------------------------------------------------------------------------------------------------------


def test_an_aggregate_snapshot_has_no_room_per_node() -> None:
    acc = accountant("n1", "n2")
    snap = acc.snapshot(by_nodes=False)
    assert snap.room is None and list(snap.nodes) == []
    assert snap.free == snap.capacity == acc.ledger.capacity()
    by_nodes = acc.snapshot(by_nodes=True)
    assert by_nodes.room == acc.room() and sorted(n.name for n in by_nodes.nodes) == ["n1", "n2"]


def test_taking_from_a_snapshot_never_reaches_the_accountant() -> None:
    acc = accountant("n1", "n2")
    acc.assume("ns/held", ONE, {}, plan=(("n2", ONE, 1),))
    free, room = acc.ledger.free(), acc.room()
    snap = acc.snapshot(by_nodes=True)
    snap.take(TWO, [("n1", ONE, 2), ("gone", ONE, 1)])  # a node the snapshot does not know is skipped
    assert snap.free == free - TWO
    assert snap.room is not None and snap.room["n1"] == room["n1"] - ONE.scale(2) and snap.room["n2"] == room["n2"]
    assert "gone" not in snap.room
    assert acc.ledger.free() == free and acc.room() == room
    assert acc.snapshot(by_nodes=True).room == room


def test_need_is_the_demand_less_what_its_own_pods_use_already() -> None:
    acc = accountant("n1")
    acc.observe_pod(running("u1", aw="a"))
    snap = acc.snapshot(by_nodes=False)
    assert snap.need(KEY, TWO) == v(cpu=1000)
    assert snap.need(KEY, v(cpu=500)) == ZERO  # never negative
    assert snap.need("ns/other", TWO) == TWO


def test_a_scratch_quota_snapshot_charges_a_copy() -> None:
    acc = accountant("n1", quota_trees=True)
    assert acc.quota is not None
    acc.quota.set_forest(one_tree())
    acc.assume(KEY, ONE, {"t": "root"})
    scratch = acc.snapshot(by_nodes=False, scratch_quota=True)
    assert scratch.quota is not None and scratch.quota is not acc.quota
    scratch.quota.charge("ns/dry", {"t": "root"}, TWO)
    assert scratch.quota.usage("t", "root") == ONE + TWO
    assert not acc.quota.is_charged("ns/dry") and acc.quota.usage("t", "root") == ONE
    assert acc.snapshot(by_nodes=False).quota is acc.quota  # a dispatch cycle charges the real one via assume
    assert Accountant().snapshot(by_nodes=False, scratch_quota=True).quota is None
