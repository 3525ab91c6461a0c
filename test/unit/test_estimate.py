"""Estimated starts (``mcad.model.estimate``): conservative backfilling over the cluster's free room, in dispatch
order, from what running AppWrappers' run-time limits say of when their room frees."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mcad.api.resources import ResourceVector
from mcad.model.estimate import (
    UNKNOWN_BLOCKED,
    UNKNOWN_HELD,
    UNKNOWN_TOO_BIG,
    Estimate,
    Holder,
    Waiter,
    estimate_starts,
)

NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
CAPACITY = ResourceVector({"cpu": 8000})


def cpu(n: int) -> ResourceVector:
    return ResourceVector({"cpu": n * 1000})


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def test_one_behind_jobs_with_limits_starts_when_enough_of_them_end() -> None:
    running = [Holder(cpu(4), at(10)), Holder(cpu(4), at(30))]
    queued = [Waiter("a", cpu(6), 600), Waiter("b", cpu(2), 300), Waiter("c", cpu(4), 0)]
    found = estimate_starts(queued, running, cpu(0), CAPACITY, NOW)
    assert found["a"] == Estimate(at(30)), "6 cpu free once both have ended"
    assert found["b"] == Estimate(at(10)), "backfills the 4 cpu free from 10 minutes to 30: it ends by then"
    assert found["c"] == Estimate(at(40)), "after a, which holds 6 of 8 cpu for its 10 minutes"


def test_fits_now_and_unknowns() -> None:
    running = [Holder(cpu(4), None)]  # no limit: its room is never known to free
    queued = [Waiter("now", cpu(4), 60), Waiter("held", cpu(6), 60), Waiter("huge", cpu(9), 60)]
    found = estimate_starts(queued, running, cpu(4), CAPACITY, NOW)
    assert found["now"] == Estimate(NOW)
    assert found["held"] == Estimate(None, UNKNOWN_HELD)
    assert found["huge"] == Estimate(None, UNKNOWN_TOO_BIG)


def test_only_the_first_ones_are_estimated_and_an_end_in_the_past_counts_as_now() -> None:
    queued = [Waiter(f"q{i}", cpu(1), 60) for i in range(5)]
    found = estimate_starts(queued, [Holder(cpu(8), at(-5))], cpu(0), CAPACITY, NOW, limit=3)
    assert set(found) == {"q0", "q1", "q2"} and found["q0"] == Estimate(NOW)


def test_one_the_cycle_judged_blocked_is_never_told_now() -> None:
    # 4 cpu free in all, but the cycle judged it out (a nodeSelector, quota, a reservation ahead: one amount of room
    # cannot see them): it starts no sooner than room next frees, and without such a time it is unknown.
    found = estimate_starts([Waiter("picky", cpu(2), 60, blocked=True), Waiter("easy", cpu(2), 60)],
                            [Holder(cpu(4), at(5))], cpu(4), CAPACITY, NOW)
    assert found["picky"] == Estimate(at(5)) and found["easy"] == Estimate(NOW)
    found = estimate_starts([Waiter("picky", cpu(2), 60, blocked=True)], [Holder(cpu(4), None)], cpu(4), CAPACITY,
                            NOW)
    assert found["picky"] == Estimate(None, UNKNOWN_BLOCKED)
