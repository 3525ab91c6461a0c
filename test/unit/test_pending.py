"""The pending queue: dispatch order across groups, group blocking, and work bounded by what can fit."""

from __future__ import annotations

import random

import pytest

from mcad.api.resources import ResourceVector
from mcad.model.pending import Alike, PendingQueue, TenantGroup, alike

CPU1 = ResourceVector({"cpu": 1000})
CPU2 = ResourceVector({"cpu": 2000})
GPU = ResourceVector({"nvidia.com/gpu": 1})


def order(name: str, priority: int = 0, created: str = "2026-01-01T00:00:00Z") -> tuple[int, str, str]:
    return (-priority, created, name)


def run_cycle(queue: PendingQueue, free: ResourceVector, *, strict: bool = False) -> tuple[list[str], int]:
    """Dispatch greedily like the dispatcher does; returns (dispatched keys in order, candidates visited)."""
    cursor = queue.cycle()
    dispatched = []
    while (candidate := cursor.next()) is not None:
        key, demand = candidate
        if demand.fits_in(free):
            free = free - demand
            dispatched.append(key)
            cursor.passed()
        elif strict:
            cursor.stop()
        else:
            cursor.blocked()
    for key in dispatched:
        queue.remove(key)
    return dispatched, cursor.visited


def test_tenants_groups_of_one_base_share_one_alike_and_a_foreign_one_is_refused() -> None:
    queue = PendingQueue()
    for i, tenant in enumerate(("a", "b", "c")):
        # Each caller builds its own group key, as demand_group does for every AppWrapper.
        queue.upsert(f"{tenant}/x", order(f"{tenant}/x", created=f"2026-01-0{i + 1}T00:00:00Z"), GPU,
                     group=TenantGroup(("gpu", 1), tenant), tenant=tenant)
    groups = [entry[1] for key in ("a/x", "b/x", "c/x") if (entry := queue.entry(key)) is not None]
    assert len({id(alike(group)) for group in groups}) == 1  # a pass's lookups find the very object
    assert len(set(groups)) == 3
    with pytest.raises(ValueError, match="is not what"):
        TenantGroup(("gpu", 1), "a").share_alike(Alike(("gpu", 2)))


def test_order_is_global_across_groups() -> None:
    q = PendingQueue()
    q.upsert("c", order("c", created="2026-01-01T00:00:03Z"), CPU1)
    q.upsert("a", order("a", created="2026-01-01T00:00:01Z"), GPU)
    q.upsert("b", order("b", created="2026-01-01T00:00:02Z"), CPU2)
    q.upsert("urgent", order("urgent", priority=9, created="2026-01-01T00:00:09Z"), CPU1)
    assert list(q.ordered()) == ["urgent", "a", "b", "c"]
    dispatched, _ = run_cycle(q, ResourceVector({"cpu": 100_000, "nvidia.com/gpu": 1}))
    assert dispatched == ["urgent", "a", "b", "c"]
    assert len(q) == 0


def test_a_blocked_group_is_skipped_but_smaller_later_work_goes_ahead() -> None:
    q = PendingQueue()
    for i in range(3):
        q.upsert(f"big{i}", order(f"big{i}", created=f"2026-01-01T00:00:0{i}Z"), CPU2)
    q.upsert("small", order("small", created="2026-01-01T00:00:09Z"), CPU1)
    dispatched, visited = run_cycle(q, ResourceVector({"cpu": 1500}))
    assert dispatched == ["small"]
    assert visited == 2, "one look at the big group, one at small"
    assert list(q.ordered()) == ["big0", "big1", "big2"]


def test_strict_fifo_stops_at_the_first_that_does_not_fit() -> None:
    q = PendingQueue()
    q.upsert("big", order("big", created="2026-01-01T00:00:01Z"), CPU2)
    q.upsert("small", order("small", created="2026-01-01T00:00:02Z"), CPU1)
    assert run_cycle(q, ResourceVector({"cpu": 1500}), strict=True) == ([], 1)


def test_ten_thousand_identical_inadmissible_cost_one_check_per_cycle() -> None:
    q = PendingQueue()
    for i in range(10_000):
        q.upsert(f"gpu{i:05d}", order(f"gpu{i:05d}"), GPU)
    q.upsert("zz-cpu", order("zz-cpu", created="2026-01-02T00:00:00Z"), CPU1)
    dispatched, visited = run_cycle(q, ResourceVector({"cpu": 8000}))
    assert dispatched == ["zz-cpu"]
    assert visited == 2
    assert q.group_count() == 1


def test_upsert_moves_an_entry_and_remove_is_idempotent() -> None:
    q = PendingQueue()
    q.upsert("a", order("a"), CPU1)
    q.upsert("b", order("b"), CPU1)
    q.upsert("b", order("b", priority=5), CPU1)
    assert list(q.ordered()) == ["b", "a"]
    q.upsert("a", order("a"), GPU)
    assert q.group_count() == 2
    q.remove("a")
    q.remove("a")
    assert list(q.ordered()) == ["b"] and q.group_count() == 1
    assert q.frozen().per_namespace == {"b": 1}  # a key without "/" is its own namespace


def test_the_counts_by_namespace_follow_adds_moves_and_removes() -> None:
    q = PendingQueue()
    for key in ("t1/a", "t1/b", "t2/c"):
        q.upsert(key, order(key), CPU1)
    q.upsert("t1/a", order("t1/a", priority=3), GPU)  # a move counts once
    assert q.frozen().per_namespace == {"t1": 2, "t2": 1}
    q.remove("t2/c")
    q.remove("t1/b")
    frozen = q.frozen()
    assert frozen.per_namespace == {"t1": 1} and [o[2] for o in frozen.orders] == ["t1/a"]


def test_an_order_that_does_not_end_with_its_key_is_refused() -> None:
    with pytest.raises(ValueError, match="last element must be the key"):
        PendingQueue().upsert("a", order("b"), CPU1)


def test_answering_twice_or_not_at_all_is_an_error() -> None:
    q = PendingQueue()
    q.upsert("a", order("a"), CPU1)
    cursor = q.cycle()
    assert cursor.next() == ("a", CPU1)
    with pytest.raises(RuntimeError):
        cursor.next()
    cursor.passed()
    with pytest.raises(RuntimeError):
        cursor.blocked()


@pytest.mark.parametrize("seed", range(5))
def test_greedy_result_equals_a_naive_walk_of_the_whole_queue(seed: int) -> None:
    rng = random.Random(seed)
    shapes = [ResourceVector({"cpu": c, "nvidia.com/gpu": g}) for c in (500, 1000, 3000) for g in (0, 1)]
    q = PendingQueue()
    model: dict[str, tuple[tuple[int, str, str], ResourceVector]] = {}
    for step in range(300):
        key = f"aw{rng.randrange(60)}"
        if rng.random() < 0.2:
            q.remove(key)
            model.pop(key, None)
        else:
            entry = (order(key, rng.randrange(3), f"2026-01-01T00:{step // 60:02d}:{step % 60:02d}Z"),
                     rng.choice(shapes))
            q.upsert(key, *entry)
            model[key] = entry
        if step % 25 == 24:
            free = ResourceVector({"cpu": rng.randrange(0, 8000), "nvidia.com/gpu": rng.randrange(0, 3)})
            expected, left = [], free
            for k, (_, demand) in sorted(model.items(), key=lambda kv: kv[1][0]):
                if demand.fits_in(left):
                    left = left - demand
                    expected.append(k)
            dispatched, _ = run_cycle(q, free)
            assert dispatched == expected
            for k in dispatched:
                del model[k]
            assert list(q.ordered()) == [k for k, _ in sorted(model.items(), key=lambda kv: kv[1][0])]
