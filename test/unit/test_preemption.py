"""Victim choice and waiting as a spec: strictly lower priority, fewest victims, none unless evicting them makes it
fit (capacity and quota), never for one the empty cluster could not take; reclaim and who may not borrow while it
waits; and the bookkeeping of preemptors that wait for their victims, time out and give up."""

from __future__ import annotations

from datetime import UTC, datetime

from mcad.api.appwrapper import AppWrapperView
from mcad.model.accounting import Accountant
from mcad.model.preemption import (
    Candidate,
    EvictionBudget,
    Preemptors,
    blocked_by_reclaim,
    preemption_refusal,
    priority_victims,
    reclaim_victims,
    victim_rank,
)
from mcad.model.quota import Forest, subtree_view
from test.unit.nodes_and_pods import v
from test.unit.test_fit import CLUSTER, appwrapper, cluster, tree


def candidate(key: str, priority: int, dispatched_second: int = 0) -> Candidate:
    at = datetime(2026, 1, 1, 0, 0, dispatched_second, tzinfo=UTC)
    return Candidate(key, priority, victim_rank(priority, at, at, key))


def victims(aw: AppWrapperView, acc: Accountant, candidates: list[Candidate], by_nodes: bool = False) -> list[str]:
    snap = acc.snapshot(by_nodes=by_nodes)
    return priority_victims(aw, snap.need(aw.key, aw.demand), snap, CLUSTER, candidates, acc.footprint)


def eight_cpus_two_dispatched() -> tuple[Accountant, list[Candidate]]:
    """One 8-cpu node; ns/low (priority 0) holds 2 cpu, ns/mid (priority 1) holds 4: 2 free."""
    acc = cluster("8")
    acc.assume("ns/low", v(cpu=2000), {})
    acc.assume("ns/mid", v(cpu=4000), {})
    return acc, [candidate("ns/mid", 1), candidate("ns/low", 0)]


def test_victim_rank_is_lowest_priority_then_most_recently_dispatched() -> None:
    ranked = sorted([candidate("ns/old-low", 0, 1), candidate("ns/high", 5, 9), candidate("ns/new-low", 0, 7)],
                    key=lambda c: c.rank)
    assert [c.key for c in ranked] == ["ns/new-low", "ns/old-low", "ns/high"]


def test_only_strictly_lower_priorities_are_victims() -> None:
    acc, candidates = eight_cpus_two_dispatched()
    assert victims(appwrapper("p", 1, "3", priority=10), acc, candidates) == ["ns/low"]
    # At priority 1, ns/mid is its equal: evicting ns/low alone leaves 4 free, short of 5.
    assert victims(appwrapper("p", 1, "5", priority=1), acc, candidates) == []
    assert victims(appwrapper("p", 1, "3", priority=0), acc, candidates) == []


def test_the_fewest_victims_an_earlier_unnecessary_one_is_dropped() -> None:
    acc, candidates = eight_cpus_two_dispatched()
    # ns/low goes first (lowest) but is not enough; with ns/mid gone it fits, and ns/low is no longer needed.
    assert victims(appwrapper("p", 1, "5", priority=10), acc, candidates) == ["ns/mid"]
    assert victims(appwrapper("p", 1, "7", priority=10), acc, candidates) == ["ns/low", "ns/mid"]


def test_no_victims_when_no_choice_makes_it_fit() -> None:
    acc, candidates = eight_cpus_two_dispatched()
    acc.assume("ns/top", v(cpu=1000), {})  # not a candidate: 7 at most can be freed
    assert victims(appwrapper("p", 2, "4", priority=10), acc, candidates) == []
    assert victims(appwrapper("p", 1, "7", priority=10), acc, candidates) == ["ns/low", "ns/mid"]


def test_one_that_could_not_fit_the_empty_cluster_never_preempts() -> None:
    acc, candidates = eight_cpus_two_dispatched()
    assert victims(appwrapper("p", 3, "3", priority=10), acc, candidates) == []  # 9 cpu of 8
    held = appwrapper("p", 1, "3", priority=10, held="its priorityClassName names no PriorityClass")
    assert victims(held, acc, candidates) == []  # held: no room is enough, so nobody is evicted for it
    # --fit=nodes: 8 cpu in total, but no node takes a 5-cpu pod.
    split = cluster("4", "4")
    split.assume("ns/low", v(cpu=8000), {}, plan=(("n1", v(cpu=4000), 1), ("n2", v(cpu=4000), 1)))
    assert victims(appwrapper("p", 1, "5", priority=10), split, [candidate("ns/low", 0)], by_nodes=True) == []
    assert victims(appwrapper("p", 1, "4", priority=10), split, [candidate("ns/low", 0)],
                   by_nodes=True) == ["ns/low"]


def test_a_victims_quota_charge_goes_back_too() -> None:
    acc = cluster("64", quota=tree("4", gold="4", silver="4"))
    acc.assume("ns/low", v(cpu=3000), {"t": "silver"})
    p = appwrapper("p", 1, "2", priority=10, labels={"t": "gold"})  # room in the cluster, none in the root quota
    assert victims(p, acc, [candidate("ns/low", 0)]) == ["ns/low"]
    # A victim charged elsewhere (another tree's node) gives back nothing here: not worth evicting.
    other = cluster("64", quota=tree("4", gold="4", silver="4"))
    other.assume("ns/full", v(cpu=3000), {"t": "silver"})
    other.assume("ns/low", v(cpu=1000), {"t": "default-missing"})
    assert victims(p, other, [candidate("ns/low", 0)]) == []


# -- reclaim ----------------------------------------------------------------------------------------------------------


def test_reclaim_takes_back_from_borrowers_only() -> None:
    acc = cluster("64", quota=tree("4", gold="2", silver="2"))
    acc.assume("ns/borrower", v(cpu=3000), {"t": "silver"})  # 1 over silver's 2
    acc.assume("ns/modest", v(cpu=1000), {"t": "gold"})
    p = appwrapper("p", 1, "1", labels={"t": "gold"})  # within gold's 2, yet the root is full
    snap = acc.snapshot(by_nodes=False)
    ranks = {"ns/borrower": (0,), "ns/modest": (0,)}
    assert reclaim_victims(p, p.demand, snap, CLUSTER, ranks, acc.footprint, exclude=()) == ["ns/borrower"]
    assert reclaim_victims(p, p.demand, snap, CLUSTER, ranks, acc.footprint, exclude=["ns/borrower"]) == []
    greedy = appwrapper("g", 1, "2", labels={"t": "gold"})  # would borrow at gold itself: no reclaim
    assert reclaim_victims(greedy, greedy.demand, snap, CLUSTER, ranks, acc.footprint, exclude=()) == []


def test_nobody_borrows_in_a_tree_where_a_reclaim_waits_for_its_victims() -> None:
    acc = cluster("64", quota=tree("4", gold="2", silver="2"))
    assert acc.quota is not None
    reclaiming = {"ns/r": acc.quota.forest.charges({"t": "gold"})[0]}
    borrower = appwrapper("b", 1, "3", labels={"t": "silver"})
    assert "ns/r" in blocked_by_reclaim(borrower, acc.quota, reclaiming)
    assert blocked_by_reclaim(appwrapper("b", 1, "2", labels={"t": "silver"}), acc.quota, reclaiming) == ""
    assert blocked_by_reclaim(appwrapper("r", 1, "3", labels={"t": "gold"}), acc.quota, reclaiming) == ""
    assert blocked_by_reclaim(borrower, acc.quota, {}) == ""
    assert blocked_by_reclaim(borrower, None, reclaiming) == ""


# -- Preemptors -------------------------------------------------------------------------------------------------------


def test_a_preemptor_holds_the_queue_until_its_victims_are_gone() -> None:
    waits = Preemptors(victim_timeout=10)
    there = {"ns/v1", "ns/v2"}
    assert waits.start("ns/p", there, now=100) == frozenset(there)
    assert "ns/p" in waits and waits.victims_of("ns/p") == frozenset(there) and waits.evicted == 2
    assert waits.check("ns/p", there.__contains__, now=105) == (True, frozenset())
    there.discard("ns/v1")
    assert waits.check("ns/p", there.__contains__, now=109) == (True, frozenset())
    there.clear()
    assert waits.check("ns/p", there.__contains__, now=109.5) == (False, frozenset())
    assert "ns/p" not in waits and len(waits) == 0
    assert waits.check("ns/p", there.__contains__, now=200) == (False, frozenset())


def test_at_the_timeout_a_preemptor_stops_holding_and_names_the_victims_left() -> None:
    waits = Preemptors(victim_timeout=10)
    waits.start("ns/p", ["ns/v1", "ns/v2"], now=100, reclaim=(("t", "gold"),))
    assert waits.reclaiming == {"ns/p": (("t", "gold"),)}
    there = {"ns/v2"}
    assert waits.check("ns/p", there.__contains__, now=110) == (False, frozenset({"ns/v2"}))
    assert "ns/p" not in waits and waits.reclaiming == {} and waits.victims_taken() == set()


def test_one_that_gave_up_is_stuck_until_the_very_pods_are_gone() -> None:
    waits = Preemptors(victim_timeout=10)
    pods = {"uid-1", "uid-2"}
    waits.gave_up("ns/p", frozenset({"ns/v"}), frozenset(pods))
    assert waits.abandoned("ns/p") == {"ns/v"}
    assert waits.stuck("ns/p", pods.__contains__)
    pods.discard("uid-1")
    assert waits.stuck("ns/p", pods.__contains__)
    pods.clear()
    assert not waits.stuck("ns/p", pods.__contains__)
    assert waits.abandoned("ns/p") == frozenset()
    # The victim dispatched again has new pods: they do not make it stuck again.
    assert not waits.stuck("ns/p", lambda uid: True)
    assert not waits.stuck("ns/q", lambda uid: True)


def test_victims_taken_are_those_some_preemptor_waits_for() -> None:
    waits = Preemptors(victim_timeout=10)
    waits.start("ns/p1", ["ns/a", "ns/b"], now=0)
    waits.start("ns/p2", ["ns/c"], now=0)
    assert waits.victims_taken() == {"ns/a", "ns/b", "ns/c"}
    assert waits.waiters() == {"ns/p1": frozenset({"ns/a", "ns/b"}), "ns/p2": frozenset({"ns/c"})}
    waits.done("ns/p1")
    assert waits.victims_taken() == {"ns/c"}
    waits.gave_up("ns/p2", frozenset({"ns/c"}), frozenset({"uid"}))
    waits.forget("ns/p2")
    assert waits.victims_taken() == set() and not waits.stuck("ns/p2", lambda uid: True)


# -- refusal: an error in the preemptor's own quota is never read as "charged nowhere" ---------------------------------


def test_a_preemptor_naming_an_unknown_quota_node_evicts_nobody() -> None:
    acc = cluster("4", quota=tree("8", gold="8"))
    acc.assume("ns/low", v(cpu=4000), {})
    lost = appwrapper("p", 1, "2", priority=10, labels={"t": "platinum"})  # no such node in tree t
    snap = acc.snapshot(by_nodes=False)
    assert preemption_refusal(lost, lost.demand, snap, CLUSTER) == \
        "its quota labels name a quota node that does not exist"
    assert victims(lost, acc, [candidate("ns/low", 0)]) == []
    found = appwrapper("p", 1, "2", priority=10, labels={"t": "gold"})
    assert victims(found, acc, [candidate("ns/low", 0)]) == ["ns/low"], "the same with a real node preempts"


def test_a_preemptor_over_a_hard_limit_or_the_empty_cluster_evicts_nobody() -> None:
    forest = Forest.build([subtree_view({
        "apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
        "metadata": {"name": "root", "namespace": "q", "labels": {"tree": "t"}},
        "spec": {"children": [{"name": "root", "quotas": {"requests": {"cpu": "8"}}}]}}), subtree_view({
            "apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
            "metadata": {"name": "kids", "namespace": "q", "labels": {"tree": "t"}},
            "spec": {"parent": "root", "children": [{"name": "gold", "quotas": {"hardLimit": True,
                                                                               "requests": {"cpu": "2"}}}]}})])
    acc = cluster("4", quota=forest)
    acc.assume("ns/low", v(cpu=4000), {})
    too_much_quota = appwrapper("p", 1, "3", priority=10, labels={"t": "gold"})
    snap = acc.snapshot(by_nodes=False)
    assert preemption_refusal(too_much_quota, too_much_quota.demand, snap, CLUSTER).startswith(
        "it asks more than quota node gold of tree t allows at all: cpu needs 3, 2 of 2 left")
    assert victims(too_much_quota, acc, [candidate("ns/low", 0)]) == []
    too_big = appwrapper("p", 1, "5", priority=10, labels={"t": "root"})
    assert preemption_refusal(too_big, too_big.demand, snap, CLUSTER) == "it would not fit even the empty cluster"
    assert victims(too_big, acc, [candidate("ns/low", 0)]) == []
    held = appwrapper("p", 1, "1", priority=10, labels={"t": "root"}, held="no such PriorityClass")
    assert preemption_refusal(held, held.demand, snap, CLUSTER) == "it is held (see above)"


# -- bounds: a preemptor's backoff, and evictions per minute ----------------------------------------------------------


def test_a_preemptor_whose_victims_went_and_that_did_not_run_backs_off_doubling() -> None:
    waits = Preemptors(victim_timeout=30, backoff=60, backoff_cap=150)
    assert waits.backing_off("ns/p", now=0) == 0
    waits.start("ns/p", ["ns/v"], now=0)
    assert waits.backing_off("ns/p", now=1) == 0, "no backoff while it waits for its victims"
    assert waits.check("ns/p", lambda _: False, now=5) == (False, frozenset())  # gone; it did not dispatch
    assert waits.backing_off("ns/p", now=5) == 60 and waits.backing_off("ns/p", now=64) == 1
    assert waits.backing_off("ns/p", now=65) == 0
    waits.start("ns/p", ["ns/v"], now=70)
    waits.check("ns/p", lambda _: True, now=100)  # gave up at the victim timeout: a round too
    assert waits.backing_off("ns/p", now=100) == 120 and waits.rounds("ns/p") == 2
    waits.start("ns/p", ["ns/v"], now=300)
    waits.check("ns/p", lambda _: False, now=301)
    assert waits.backing_off("ns/p", now=301) == 150, "capped"
    waits.dispatched("ns/p")
    assert waits.backing_off("ns/p", now=302) == 0 and waits.rounds("ns/p") == 0, "running resets it"


def test_no_backoff_when_it_is_off_or_for_one_that_dispatched() -> None:
    waits = Preemptors(victim_timeout=30)
    waits.start("ns/p", ["ns/v"], now=0)
    waits.check("ns/p", lambda _: False, now=1)
    assert waits.backing_off("ns/p", now=1) == 0
    bounded = Preemptors(victim_timeout=30, backoff=60)
    bounded.start("ns/p", ["ns/v"], now=0)
    bounded.dispatched("ns/p")  # its victims went and it ran
    assert bounded.backing_off("ns/p", now=1) == 0 and "ns/p" not in bounded


def test_the_eviction_budget_bounds_victims_in_any_minute() -> None:
    budget = EvictionBudget(per_minute=3)
    assert budget.allows(2, now=0)
    budget.spend(2, now=0)
    assert budget.allows(1, now=10) and not budget.allows(2, now=10)
    assert budget.free_at(2, now=10) == 60, "one of the two at 0 must age out"
    budget.spend(1, now=10)
    assert not budget.allows(1, now=59.9) and budget.free_at(1, now=59.9) == 60
    assert budget.allows(2, now=60) and not budget.allows(3, now=60) and budget.free_at(3, now=60) == 70
    assert budget.allows(3, now=70)


def test_a_round_larger_than_the_bound_waits_for_an_empty_minute() -> None:
    budget = EvictionBudget(per_minute=2)
    assert budget.allows(5, now=0), "nothing evicted in the last minute: it may, or it never could"
    budget.spend(5, now=0)
    assert not budget.allows(1, now=59) and budget.free_at(1, now=59) == 60
    assert not budget.allows(5, now=30) and budget.free_at(5, now=30) == 60
    budget.spend(1, now=60)
    assert not budget.allows(5, now=61) and budget.free_at(5, now=61) == 120
    unbounded = EvictionBudget(per_minute=0)
    unbounded.spend(1000, now=0)
    assert unbounded.allows(1000, now=0)
