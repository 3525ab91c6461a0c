"""Reservations and backfill (mcad.model.reservations), stepped with a fake clock: a blocked gang keeps the room it
waits
for from the small AppWrappers behind it, a bounded one may use it only if it ends first, a reservation follows
its AppWrapper's place in the queue, and (seeded random runs) no gang is starved and no node is over-committed.

Dispatched AppWrappers here wrap ConfigMaps with custompodresources: nothing binds, so each holds its planned room
until it is deleted, which is how these tests end one."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from mcad.api.resources import ResourceVector
from test.component.harness import Harness, gang_aw, last_status, node, pod
from test.component.test_stalls import add, delete


def bounded(raw: dict[str, Any], seconds: int) -> dict[str, Any]:
    raw["spec"]["schedulingSpec"] = {"dispatchDuration": {"limit": seconds}}
    return raw


def said(h: Harness, name: str) -> str:
    """The last Backoff message written for it."""
    return next(status["message"] for n, status in reversed(h.writer.statuses) if n == name and "message" in status)


def dispatched(h: Harness) -> list[str]:
    return [name.removesuffix("-cm") for name in h.writer.applied]


def cluster(harness_factory: Any, nodes: int, cpu: str, **options: Any) -> Harness:
    return harness_factory(nodes=[node(f"n{i}", cpu) for i in range(nodes)], pods=[], aws=[], **options)


@pytest.mark.parametrize("reservations", [2, 0])
def test_small_ones_do_not_take_the_room_a_blocked_gang_waits_for(harness_factory: Any, reservations: int) -> None:
    # 4 nodes x 4 cpu full of 1-cpu AppWrappers, more of them queued; a gang of 4 x 4 cpu needs every node empty.
    h = cluster(harness_factory, 4, "4", reservations=reservations)
    for i in range(16):
        add(h, gang_aw(f"a{i:02d}", 1, {"cpu": "1"}))
    add(h, gang_aw("gang", 4, {"cpu": "4"}, priority=10))
    for i in range(8):
        add(h, gang_aw(f"b{i:02d}", 1, {"cpu": "1"}))
    assert len(dispatched(h)) == 16
    for i in range(16):  # the running ones end one by one
        if i == 15:
            told = said(h, "b00")
        delete(h, f"a{i:02d}")
        if i < 15:
            assert "gang" not in dispatched(h)
    if not reservations:
        # Best-effort FIFO: each freed cpu went to a waiting small one; the gang is still waiting.
        assert "gang" not in dispatched(h) and [n for n in dispatched(h) if n.startswith("b")] == [
            f"b{i:02d}" for i in range(8)]
        return
    assert dispatched(h)[16:] == ["gang"], "nothing took the room it held, so it went when the last one ended"
    assert "reservation" not in said(h, "gang"), "a holder's message says what it lacks (/debug shows the rest)"
    assert told.startswith("waiting behind the reservation of ns/gang on nodes n0, n1, n2, n3")


def test_a_gang_reserves_the_nodes_with_most_room_and_the_rest_stay_usable(harness_factory: Any) -> None:
    h = cluster(harness_factory, 4, "4")
    for name, cpu in (("a", "3"), ("b", "3"), ("c", "1"), ("d", "2")):  # first fit: a, c on n0; b on n1; d on n2
        add(h, gang_aw(name, 1, {"cpu": cpu}))
    room = h.dispatcher.owners.accountant.room()
    assert {n: room[n].get("cpu") for n in sorted(room)} == {"n0": 0, "n1": 1000, "n2": 2000, "n3": 4000}
    add(h, gang_aw("gang", 2, {"cpu": "4"}, priority=10))
    assert h.dispatcher.owners.reservations.held["ns/gang"].nodes == ("n2", "n3"), "the two with the most room"
    add(h, gang_aw("e", 1, {"cpu": "1"}))
    assert dispatched(h)[-1] == "e", "n1 is not reserved: a small one may still go there"
    add(h, gang_aw("f", 1, {"cpu": "1"}))
    assert "f" not in dispatched(h), "only reserved room is left"
    assert "waiting behind the reservation of ns/gang on nodes n2, n3" in said(h, "f")
    delete(h, "d")  # n2 empties: with n3, the gang fits
    assert dispatched(h)[-1] == "gang"
    assert "ns/gang" not in h.dispatcher.owners.reservations.held
    assert "f" not in dispatched(h)


def test_backfill_uses_reserved_room_only_when_sure_to_end_before_the_gang_could_start(
        harness_factory: Any) -> None:
    # Two nodes of 4 cpu, each 3 cpu taken by an AppWrapper that must be gone within 60 s.
    h = cluster(harness_factory, 2, "4")
    add(h, bounded(gang_aw("x", 1, {"cpu": "3"}), 60))
    add(h, bounded(gang_aw("y", 1, {"cpu": "3"}), 60))
    add(h, gang_aw("gang", 2, {"cpu": "4"}, priority=10))
    assert h.dispatcher.owners.reservations.held["ns/gang"].nodes == ("n0", "n1")
    h.clock.advance(5)
    add(h, gang_aw("unbounded", 1, {"cpu": "1"}))
    add(h, bounded(gang_aw("too-long", 1, {"cpu": "1"}), 120))
    add(h, bounded(gang_aw("short", 1, {"cpu": "1"}), 10))
    assert dispatched(h) == ["x", "y", "short"], "only the one sure to end (at 15 s) before x and y (at 60 s)"
    assert "waiting behind the reservation of ns/gang on nodes n0, n1" in said(h, "unbounded")
    assert "waiting behind the reservation of ns/gang on nodes n0, n1" in said(h, "too-long")
    h.clock.advance(10)  # short's deadline: failed, its objects deleted, its room back
    h.drain()
    assert last_status(h, "short")["state"] == "Failed"
    h.clock.advance(45)  # x and y run out too
    h.drain()
    assert dispatched(h)[3] == "gang", "backfill did not delay it: it went when x and y had to end"


def test_an_unknown_end_allows_no_backfill(harness_factory: Any) -> None:
    h = cluster(harness_factory, 1, "4")
    add(h, gang_aw("x", 1, {"cpu": "3"}))  # no dispatchDuration: when it ends is unknown
    add(h, gang_aw("gang", 1, {"cpu": "4"}, priority=10))
    add(h, bounded(gang_aw("short", 1, {"cpu": "1"}), 1))
    assert dispatched(h) == ["x"]
    assert "waiting behind the reservation of ns/gang on nodes n0" in said(h, "short")


def test_a_reservation_follows_its_appwrappers_place(harness_factory: Any) -> None:
    h = cluster(harness_factory, 2, "4", reservations=1)
    add(h, gang_aw("x", 1, {"cpu": "3"}))
    add(h, gang_aw("y", 1, {"cpu": "3"}))
    add(h, gang_aw("low", 1, {"cpu": "4"}, priority=1))
    assert list(h.dispatcher.owners.reservations.held) == ["ns/low"]
    add(h, gang_aw("high", 2, {"cpu": "4"}, priority=5))
    assert list(h.dispatcher.owners.reservations.held) == ["ns/high"], "overtaken: the one reservation is high's"
    assert "reservation" not in said(h, "low"), "4 cpu fit on no node even unreserved: it says what it lacks"
    delete(h, "high")
    assert list(h.dispatcher.owners.reservations.held) == ["ns/low"], "deleted: the next in line holds it"
    delete(h, "x")
    assert dispatched(h)[-1] == "low"
    assert h.dispatcher.owners.reservations.held == {}, "dispatched: nothing is held for it any more"


def test_reservations_are_made_in_aggregate_mode_as_an_amount(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[], fit="aggregate")
    add(h, gang_aw("x", 1, {"cpu": "6"}))
    add(h, gang_aw("gang", 1, {"cpu": "4"}, priority=10))
    add(h, gang_aw("small", 1, {"cpu": "2"}))
    assert dispatched(h) == ["x"]
    assert "waiting behind the reservation of ns/gang of cpu=4" in said(h, "small")
    delete(h, "x")
    assert dispatched(h)[1:] == ["gang", "small"]


def test_no_reservation_for_what_could_never_fit_or_is_held_by_pods_of_no_appwrapper(harness_factory: Any) -> None:
    # n0's 4 cpu are held by a pod no AppWrapper owns: nothing says it ends, so a 4-cpu gang cannot reserve there.
    h = harness_factory(nodes=[node("n0", "4"), node("n1", "4")], pods=[pod("other", "4", node_name="n0")], aws=[])
    add(h, gang_aw("x", 1, {"cpu": "3"}))
    add(h, gang_aw("huge", 1, {"cpu": "16"}, priority=10))
    add(h, gang_aw("gang", 2, {"cpu": "4"}, priority=5))
    add(h, gang_aw("small", 1, {"cpu": "1"}))
    assert h.dispatcher.owners.reservations.held == {}
    assert dispatched(h) == ["x", "small"], "neither the huge one nor the gang holds anything back"


def test_each_of_a_group_waiting_in_one_pass_is_told_of_its_own_pods(harness_factory: Any) -> None:
    # Within a pass, the fit of a group's members with the reservations given back is made once (they are judged
    # alike); the message each is told must still name its own pods, not the first one's.
    h = cluster(harness_factory, 4, "4", reservations=3)
    for i in range(4):
        add(h, gang_aw(f"x{i}", 1, {"cpu": "3"}))
    for i in range(4):
        add(h, gang_aw(f"g{i}", 1, {"cpu": "4"}, priority=10))
    assert sorted(h.dispatcher.owners.reservations.held) == ["ns/g0", "ns/g1", "ns/g2"]
    for name in ("g1", "g2", "g3"):
        assert said(h, name).startswith(f"1 pod of ConfigMap {name}-cm custompodresources[0] (cpu 4) fits on no node: "
                                         "4 nodes have too little cpu free (at most 1 on one node)")


# ---------------------------------------------------------------------------------------------- random runs


@pytest.mark.parametrize("seed", range(6))
def test_random_arrivals_endings_and_deletions_keep_the_gang_and_order_invariants(harness_factory: Any,
                                                                                  seed: int) -> None:
    """Seeded random arrivals (gangs of 1-4 pods of 1-4 cpu, priorities 0/5/10, some with a run-time bound),
    endings of dispatched ones, deletions of queued ones and time passing, on 4 nodes x 4 cpu. After every step:
    (1) no node holds more than it has; (2) no AppWrapper dispatched in the step without a run-time bound used
    room a reservation ahead of it held (the node's room left covers every reservation held there); (3) once every
    AppWrapper that was running when the head of the queue became the head has ended (and every one dispatched
    since ahead of it, or bounded), it has been dispatched, unless it was deleted or overtaken. (3) fails with
    --reservations 0."""
    rng = random.Random(seed)
    h = cluster(harness_factory, 4, "4", reservations=int(os.environ.get("MCAD_TEST_RESERVATIONS", "2")))
    d = h.dispatcher
    queued: list[str] = []
    watch: tuple[str, set[str]] | None = None  # (first holder, what was running when it took its reservation)
    for step in range(120):
        action = rng.random()
        before = set(dispatched(h))
        if action < 0.45 or not before:
            name = f"w{step:03d}"
            raw = gang_aw(name, rng.randint(1, 4), {"cpu": str(rng.randint(1, 4))}, priority=rng.choice([0, 5, 10]))
            if rng.random() < 0.3:
                raw = bounded(raw, rng.randint(5, 60))
            add(h, raw)
            queued.append(name)
        elif action < 0.8:
            running = sorted(n for n in before if d.appwrappers.get(f"ns/{n}") is not None)
            if running:
                delete(h, rng.choice(running))
        elif action < 0.9 and queued:
            name = queued.pop(rng.randrange(len(queued)))
            if d.appwrappers.get(f"ns/{name}") is not None and name not in before:
                delete(h, name)
        else:
            h.clock.advance(rng.randint(1, 20))
            h.drain()
        new = [n for n in dispatched(h) if n not in before]
        room = d.owners.accountant.room()
        assert all(amount >= 0 for vector in room.values() for _, amount in vector.items()), (seed, step, room)
        for name in new:
            aw = d.appwrappers.get(f"ns/{name}")
            if aw is None or aw.scheduling.dispatch_limit_seconds:
                continue  # a bounded one may use reserved room (backfill)
            ahead: dict[str, ResourceVector] = {}
            for reservation in d.owners.reservations.held.values():
                holder = d.appwrappers.get(reservation.key)
                if holder is not None and holder.order() < aw.order():
                    for node_name, requests, count in reservation.plan:
                        ahead[node_name] = ahead.get(node_name, ResourceVector()) + requests.scale(count)
            for node_name, _count in d.owners.accountant.plans.planned_nodes(f"ns/{name}"):
                if node_name in ahead:
                    assert ahead[node_name].fits_in(room[node_name]), (
                        f"seed {seed} step {step}: {name} took room on {node_name} reserved ahead of it",
                        room[node_name], ahead[node_name])
        # The head: the first that waits (every AppWrapper here fits the empty cluster). With reservations it holds
        # the first one; without, small ones can pass it for ever.
        first = next(iter(d.owners.queued.pending.ordered()), None)
        running_now = {n for n in dispatched(h) if d.appwrappers.get(f"ns/{n}") is not None}
        if watch is not None:
            holder, blockers = watch
            holder_view = d.appwrappers.get(holder)
            for name in new:  # ahead of it, or bounded (backfill): these may take its room, and it waits for them
                view = d.appwrappers.get(f"ns/{name}")
                if view is not None and (view.scheduling.dispatch_limit_seconds or holder_view is None
                                         or view.order() < holder_view.order()):
                    blockers.add(name)
            holder_name = holder.removeprefix("ns/")
            gone = d.appwrappers.get(holder) is None
            if gone or holder_name in running_now or first != holder:
                watch = None  # dispatched, deleted or overtaken
            elif not blockers & running_now:
                raise AssertionError(f"seed {seed} step {step}: every AppWrapper running when {holder} became the head "
                                     f"has ended, yet it waits: {last_status(h, holder_name)}")
        if watch is None and first is not None:
            watch = (first, running_now - {first.removeprefix("ns/")})
