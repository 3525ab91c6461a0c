"""The capacity ledger: free = capacity - in use - outstanding reservations (the views it is fed are tested in
test_views.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mcad.api.resources import ZERO, ResourceVector
from mcad.api.views import NodeView, PodView
from mcad.model.ledger import Ledger
from test.unit.nodes_and_pods import GI, node, pod, running, v

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
    # A failed pod's share stays reserved for the pod that replaces it (its controller's, or a reset's).
    ledger.upsert_pod(running("b", aw="aw", phase="Failed"))
    assert ledger.reservation("ns/aw") == v(cpu=1000, memory=GI)
    assert ledger.free() == ledger.capacity() - v(cpu=1000, memory=GI)


def test_a_failed_pod_consumes_nothing_its_share_stays_reserved() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.reserve("ns/aw", v(cpu=1000, memory=GI))
    ledger.upsert_pod(pod("a", aw="aw", phase="Failed"))  # e.g. rejected by the kubelet admission
    assert ledger.reservation("ns/aw") == v(cpu=1000, memory=GI)
    assert ledger.in_use() == ZERO
    ledger.upsert_pod(pod("b", aw="aw", phase="Succeeded"))  # a finished pod's share is done with
    assert ledger.reservation("ns/aw") == ZERO


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


def test_pods_by_node_counts_bound_non_terminal_pods_whatever_they_request() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(running("a", "n1", cpu="2"))
    ledger.upsert_pod(running("b", "n1", cpu="0", memory="0"))  # no requests: still a pod slot
    ledger.upsert_pod(running("c", "later"))  # its node not seen yet
    assert ledger.pods_by_node() == {"n1": 2, "later": 1}
    ledger.upsert_pod(running("a", "n1", cpu="2", phase="Succeeded"))
    ledger.upsert_pod(running("c", "n1"))
    assert ledger.pods_by_node() == {"n1": 2}
    ledger.delete_pod("b")
    ledger.delete_pod("c")
    assert ledger.pods_by_node() == {}


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
        if p.appwrapper is not None and (p.node_name or p.terminal) and p.phase != "Failed":
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
