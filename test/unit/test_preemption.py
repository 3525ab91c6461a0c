"""Victim choice and waiting as a spec: strictly lower priority, the least work lost then the fewest victims, none
unless evicting them makes it fit (capacity and quota), never for one the empty cluster could not take; reclaim and
who may not borrow while it waits; the bookkeeping of preemptors that wait for their victims, time out and give up,
and of the AppWrappers evicted before (cooldowns)."""

from __future__ import annotations

from datetime import UTC, datetime

from mcad.api.appwrapper import AppWrapperView
from mcad.model.accounting import Accountant
from mcad.model.preemption import (
    Candidate,
    Cooldowns,
    EvictionBudget,
    Preemptors,
    blocked_by_reclaim,
    describe_work,
    preemption_refusal,
    priority_victims,
    reclaim_victims,
    spared_phrase,
    total_work,
    victim_rank,
    work_lost,
)
from mcad.model.quota import Forest, subtree_view
from test.unit.nodes_and_pods import v
from test.unit.test_fit import CLUSTER, appwrapper, cluster, tree


def candidate(key: str, priority: int, dispatched_second: int = 0) -> Candidate:
    at = datetime(2026, 1, 1, 0, 0, dispatched_second, tzinfo=UTC)
    return Candidate(key, priority, victim_rank(priority, at, at, key))


def ran(key: str, cpu: float, seconds: float, priority: int = 0, gpus: int = 0) -> Candidate:
    """A candidate of ``cpu`` cores (and ``gpus``) that has run ``seconds``."""
    demand = v(cpu=int(cpu * 1000), **({"nvidia.com/gpu": gpus} if gpus else {}))
    return Candidate(key, priority, victim_rank(priority, None, None, key), work_lost(demand, seconds), seconds)


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


# -- the least work lost --------------------------------------------------------------------------------------------


def test_the_set_that_loses_the_least_work_goes_though_its_victim_was_dispatched_earlier() -> None:
    acc = cluster("8")
    acc.assume("ns/small-old", v(cpu=1000), {})  # 1 cpu for 30 minutes: 0.5 cpu-hours
    acc.assume("ns/big-young", v(cpu=7000), {})  # 7 cpu for 10 minutes: 1.17
    candidates = [ran("ns/small-old", 1, 1800), ran("ns/big-young", 7, 600)]
    assert victims(appwrapper("p", 1, "1", priority=10), acc, candidates) == ["ns/small-old"]


def test_the_lowest_priority_goes_first_however_long_it_ran() -> None:
    # mid, evicted for its younger run, would itself preempt low once requeued into the full cluster.
    acc = cluster("4")
    acc.assume("ns/low", v(cpu=2000), {})
    acc.assume("ns/mid", v(cpu=2000), {})
    candidates = [ran("ns/low", 2, 36000, priority=0), ran("ns/mid", 2, 60, priority=1)]
    assert victims(appwrapper("p", 1, "2", priority=10), acc, candidates) == ["ns/low"]
    assert victims(appwrapper("p", 1, "4", priority=10), acc, candidates) == ["ns/low", "ns/mid"]


def test_one_large_young_victim_rather_than_many_small_old_ones() -> None:
    # Ranked by work alone the four small ones go first (2 each, 8 in all); taken by run time the large one alone
    # (4): both orders are tried and the cheaper set wins.
    acc = cluster("8")
    acc.assume("ns/large", v(cpu=4000), {})
    candidates = [ran("ns/large", 4, 3600)]
    for i in range(4):
        acc.assume(f"ns/small-{i}", v(cpu=1000), {})
        candidates.append(ran(f"ns/small-{i}", 1, 7200))
    assert victims(appwrapper("p", 1, "4", priority=10), acc, candidates) == ["ns/large"]


def test_as_much_work_lost_either_way_the_fewest_victims_go() -> None:
    acc = cluster("4")
    acc.assume("ns/a-two", v(cpu=2000), {})
    acc.assume("ns/b-one", v(cpu=1000), {})
    acc.assume("ns/c-one", v(cpu=1000), {})
    candidates = [ran("ns/a-two", 2, 10), ran("ns/b-one", 1, 10), ran("ns/c-one", 1, 10)]
    assert victims(appwrapper("p", 1, "2", priority=10), acc, candidates) == ["ns/a-two"]


def test_gpu_work_outweighs_cpu_work() -> None:
    assert work_lost(v(cpu=4000, **{"nvidia.com/gpu": 2}), 3600) == (7200.0, 14400.0)
    assert total_work([(3600.0, 0.0), (7200.0, 60.0)]) == (10800.0, 60.0)
    assert (0.0, 10**9) < (1.0, 0.0), "any GPU-second weighs more than any cpu"
    assert describe_work((10800.0, 5.0)) == "3.0 GPU-hours"
    assert describe_work((0.0, 1800.0)) == "0.5 CPU-hours"
    assert describe_work((0.0, 20.0)) == "0.0056 CPU-hours"
    assert describe_work((0.0, 0.0)) == "0 CPU-hours"


def test_a_cpu_job_goes_before_a_gpu_job_that_ran_less() -> None:
    acc = cluster("8")
    acc.assume("ns/gpu", v(cpu=1000, **{"nvidia.com/gpu": 1}), {})
    acc.assume("ns/cpu", v(cpu=4000), {})
    candidates = [ran("ns/gpu", 1, 60, gpus=1), ran("ns/cpu", 4, 36000)]
    assert victims(appwrapper("p", 1, "4", priority=10), acc, candidates) == ["ns/cpu"]


def test_two_hundred_candidates_still_the_cheapest_set_that_fits() -> None:
    # One node per candidate, each candidate 1 cpu of its node's 1, by nodes: the preemptor's 3 x 1 cpu pods need
    # three of them gone; the three that ran least go (linear in the candidates: the timing is in the report, no
    # assertion here).
    acc = cluster(*["1"] * 200)
    candidates = []
    for i in range(200):
        key = f"ns/c{i:03d}"
        acc.assume(key, v(cpu=1000), {}, plan=((f"n{i + 1}", v(cpu=1000), 1),))
        candidates.append(ran(key, 1, 100 + (i * 37) % 200))
    chosen = victims(appwrapper("p", 3, "1", priority=10), acc, candidates, by_nodes=True)
    cheapest = sorted(candidates, key=lambda c: c.work)[:3]
    assert sorted(chosen) == sorted(c.key for c in cheapest)


# -- cooldowns and whom a preemptor spared ---------------------------------------------------------------------------


def test_a_cooldown_runs_from_the_dispatch_after_the_eviction_and_is_bounded() -> None:
    cooling = Cooldowns(600)
    assert cooling.until("ns/a", "uid-a", 100.0) == 0, "never evicted"
    cooling.evicted("ns/a", "uid-a", now=1000.0)
    assert cooling.until("ns/a", "uid-a", 1300.0) == 1900.0, "from its dispatch again"
    assert cooling.until("ns/a", "uid-a", 900.0) == 1600.0, "never from before the eviction (a stale status)"
    assert cooling.until("ns/a", "uid-other", 1300.0) == 0, "another object of that name"
    cooling.done("ns/a")
    assert cooling.until("ns/a", "uid-a", 1300.0) == 0 and len(cooling) == 0
    off = Cooldowns(0)
    off.evicted("ns/a", "uid-a", now=1000.0)
    assert len(off) == 0 and off.until("ns/a", "uid-a", 1000.0) == 0
    small = Cooldowns(600)
    small.MAX = 3
    for i in range(5):
        small.evicted(f"ns/{i}", "uid", now=float(i))
    assert len(small) == 3 and small.until("ns/0", "uid", 0.0) == 0 and small.until("ns/4", "uid", 4.0) == 604


def test_each_spared_appwrapper_is_counted_once_per_preemptor_until_it_runs() -> None:
    waits = Preemptors(victim_timeout=10)
    assert waits.newly_spared("ns/p", ["ns/a"]) == {"ns/a"}
    assert waits.newly_spared("ns/p", ["ns/a", "ns/b"]) == {"ns/b"}
    assert waits.copy().newly_spared("ns/p", ["ns/a", "ns/b"]) == frozenset()
    waits.dispatched("ns/p")
    assert waits.newly_spared("ns/p", ["ns/a"]) == {"ns/a"}
    assert spared_phrase(["min-runtime", "cooldown", "min-runtime"]) == (
        "spares 2 AppWrapper(s) that ran less than their minimum run time and 1 AppWrapper(s) preempted before "
        "and dispatched again less than the preemption cooldown ago")
    assert spared_phrase([]) == ""


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
