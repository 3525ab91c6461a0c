"""The dry run behind /debug/queue, explain and the dashboard (``mcad.model.assess``) looks only at what a cycle
would look at, yet tells every queued AppWrapper what a walk of the whole queue, member by member in dispatch order,
tells it. The reference below is that full walk (the simple dry run, one member at a time); the queues are random mixes
of a few demands, with and without reservations, per-node fit and strict FIFO, and one with a waiting preemptor."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

import pytest

from mcad.model import disclosure
from mcad.model.assess import Assessment
from mcad.model.fifo import BEHIND_IN_DOMAIN, BEHIND_STRICT_FIFO, StrictFifo
from mcad.model.fit import could_ever_fit, refused
from test.component.harness import gang_aw, node, pod
from test.fakes import wait_informed


def full_walk(h: Any) -> list[Assessment]:
    """Every member judged in dispatch order, one by one: the reference."""
    cycle = h.dispatcher.owners.cycle
    pending, appwrappers, preemptors = cycle._pending, cycle._appwrappers, cycle._preemptors
    reserving = cycle._reservations.start(cycle.snapshot(scratch_quota=True), cycle._clock.now(), dry_run=True)
    draining, blocked_by_reclaim = cycle._queued.draining, cycle._evictions.blocked_by_reclaim
    strict_fifo, targets = cycle._strict_fifo, cycle._targets
    blocked: dict[Hashable, str] = {}
    quota = reserving.snapshot.quota
    fifo = StrictFifo(quota.forest if quota is not None else None) if strict_fifo else None
    reserved_heads: set[Hashable] = set()
    held: Callable[[str], str] | None = None
    out = []
    for key in pending.ordered():
        aw = appwrappers.get(key)
        entry = pending.entry(key)
        if aw is None or entry is None:
            continue
        group = entry[1]
        if key in preemptors:
            victims = disclosure.listed(preemptors.victims_of(key), aw.namespace)
            out.append(Assessment(key, "Preempting", False,
                                  f"waiting for lower-priority AppWrappers it preempted to leave: {victims}"))
            held = held or partial(disclosure.held_behind_preemptor, key)
        elif draining(aw):
            out.append(Assessment(key, "Draining", False,
                                  "requeued; waiting for the pods of its previous dispatch to go"))
        elif held:
            out.append(Assessment(key, "Queued", False, held(aw.namespace)))
        elif fifo is not None and fifo.held(aw):
            out.append(Assessment(key, "Queued", False, BEHIND_IN_DOMAIN))
        elif group in blocked:
            if group in reserved_heads:
                need = reserving.snapshot.need(key, aw.demand)
                blocked[group] = reserving.explain(aw, need, reserving.fit(aw, need))[1]()
                reserved_heads.discard(group)
            out.append(Assessment(key, "Queued", False, blocked[group]))
        else:
            snapshot = reserving.snapshot
            need = snapshot.need(key, aw.demand)
            fit = reserving.fit(aw, need)
            reclaimed = blocked_by_reclaim(aw) if fit.fits else ""
            if reclaimed:
                out.append(Assessment(key, "Queued", False, reclaimed))
                if fifo is not None:
                    fifo.hold(aw, refused("reclaim", reclaimed))
            elif fit.fits:
                snapshot.take(need, fit.plan)
                if snapshot.quota is not None:
                    snapshot.quota.charge(key, aw.labels, aw.demand)
                out.append(Assessment(key, "Queued", True, "fits now: the next dispatch cycle dispatches it"))
            else:
                held_before = len(reserving.made)
                why = fit.why() if strict_fifo else reserving.wait(aw, need, fit)[1]()
                never = strict_fifo and not could_ever_fit(aw, need, snapshot, targets, fit)
                if never:
                    why += "; it cannot fit even the empty cluster, so it does not hold the queue (strict FIFO)"
                made = reserving.made[-1] if len(reserving.made) > held_before else None
                if made is None or reserving.full:
                    blocked[group] = why
                    if made is not None:
                        reserved_heads.add(group)
                out.append(Assessment(key, "Queued", False, why,
                                      reserving.describe(made) if made is not None else None))
                if fifo is not None and not never and fifo.hold(aw, fit):
                    held = lambda _reader: BEHIND_STRICT_FIFO  # noqa: E731 (as the walk had it)
    return out


def told(assessments: Any) -> list[tuple[str, str, bool, str, Any]]:
    return [(a.key, a.state, a.fits_now, a.why, a.reservation) for a in assessments]


def random_queue(seed: int) -> list[dict[str, Any]]:
    """A few demands (one that never fits), two priorities, names in random order: groups interleave."""
    rng = random.Random(seed)
    aws = []
    for i in range(rng.randint(20, 60)):
        cpu = rng.choice(["1", "2", "3", "6", "20"])
        raw = gang_aw(f"aw{rng.randrange(10**6):06d}-{i}", rng.choice([1, 1, 2]), {"cpu": cpu},
                      priority=rng.choice([0, 0, 1]))
        aws.append(raw)
    return aws


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("fit", "reservations", "strict_fifo"), [
    ("aggregate", 0, False), ("aggregate", 2, False), ("nodes", 1, False), ("nodes", 3, False),
    ("aggregate", 0, True), ("nodes", 2, True)])
def test_the_dry_run_tells_every_member_what_a_full_walk_tells_it(harness_factory: Any, seed: int, fit: str,
                                                                     reservations: int, strict_fifo: bool) -> None:
    # Two nodes of 4 cpu: the first cycle dispatches what fits; the rest queues, in blocked groups and reservations.
    h = harness_factory(nodes=[node("n0", "4"), node("n1", "4")], pods=[], aws=random_queue(seed), fit=fit,
                        reservations=reservations, strict_fifo=strict_fifo)
    h.drain()
    expected = told(full_walk(h))
    assessed = h.dispatcher.view.assess_queue()
    assert told(assessed) == expected
    assert len(assessed) == len(expected)
    assert [assessed.is_told(order) for order in assessed.orders] == [
        assessed.told(order) is not None for order in assessed.orders], "is_told answers as told, without making it"
    for position, (key, *_rest) in enumerate(expected, start=1):
        assert assessed.position(key) == position
        assert told([assessed.of(key)]) == [expected[position - 1]]
    if not strict_fifo:
        # Only what a cycle would look at was judged: each group's head, and the members a reservation made or
        # followed (one each, and one more per group whose head reserved).
        assert len(assessed.judged()) <= h.dispatcher.owners.queued.pending.group_count() + 2 * reservations


def test_a_large_blocked_group_costs_one_judgement_not_one_per_member(harness_factory: Any) -> None:
    aws = [gang_aw(f"big-{i:03d}", 1, {"cpu": "20"}) for i in range(200)] + [gang_aw("small", 1, {"cpu": "1"})]
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=aws, fit="nodes", reservations=0)
    h.drain()
    assessed = h.dispatcher.view.assess_queue()
    assert told(assessed) == told(full_walk(h))
    assert len(assessed) == 200
    assert len(assessed.judged()) == 1, "the head of the group is judged; its 199 followers are told by rule"


def test_behind_a_waiting_preemptor_every_member_is_told_it_is_held(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("low", 1, {"cpu": "3"})], preemption=True)
    h.drain()
    h.lw["pod"].add(pod("low-0", "3", appwrapper="low"))
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-0"), 5, "the pod")
    h.lw["aw"].add(gang_aw("high", 1, {"cpu": "4"}, priority=5))
    for i in range(30):  # behind the preemptor (lower priority): a group that fits the free cpu and one that never does
        h.lw["aw"].add(gang_aw(f"small-{i:02d}", 1, {"cpu": "1"}))
        h.lw["aw"].add(gang_aw(f"huge-{i:02d}", 1, {"cpu": "50"}))
    h.drain()
    assessed = h.dispatcher.view.assess_queue()
    expected = told(full_walk(h))
    assert told(assessed) == expected
    assert expected[0][:2] == ("ns/high", "Preempting")
    assert all(assessed.is_told(order) for order in assessed.orders), "held ones are told, without being judged"
    behind = [(key, why) for key, _, _, why, _ in expected if key.startswith(("ns/small-", "ns/huge-"))]
    assert len(behind) == 60
    assert all(why.startswith("held behind ns/high, which is preempting") for _, why in behind), behind
    assert assessed.fitting_ahead("ns/small-29") == 0


def test_explain_says_whom_the_next_cycle_preempts_and_that_cycle_does(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("low", 1, {"cpu": "3"})], preemption=True)
    h.drain()
    cycle = h.dispatcher.owners.cycle
    run = cycle.run
    cycle.run = lambda: None  # type: ignore[method-assign]  # hold the next cycle back to read the forecast first
    h.lw["aw"].add(gang_aw("high", 1, {"cpu": "4"}, priority=5))
    h.drain()
    forecast = h.dispatcher.view.assess_queue().of("ns/high")
    assert forecast is not None
    assert (forecast.state, forecast.fits_now, forecast.evicts) == ("Queued", False, ("ns/low",))
    assert forecast.why == "the next dispatch cycle preempts 1 lower-priority AppWrapper(s) to make room: ns/low"
    assert h.dispatcher.owners.preemptors.victims_of("ns/high") == frozenset(), "the forecast evicted nobody"
    cycle.run = run  # type: ignore[method-assign]
    run()
    assert h.dispatcher.owners.preemptors.victims_of("ns/high") == frozenset({"ns/low"})
    after = h.dispatcher.view.assess_queue().of("ns/high")
    # Its victim had no pods (no kubelet here): gone at once, so the next cycle dispatches the preemptor.
    assert after is not None and after.fits_now
