"""When an estimated start is written to status (``mcad.model.estimatetold``): the first at once, then only when it
moved by more than 10 % of the time left (and 30 s) or turned known/unknown, and never within 60 s of the last
write. Time is handed in: ``now`` (wall) and ``mono`` (monotonic) move together here as a clock would move them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mcad.model.estimate import UNKNOWN_HELD, UNKNOWN_TOO_BIG, Estimate
from mcad.model.estimatetold import (
    FLOOR_SECONDS,
    FRACTION,
    MIN_SECONDS_BETWEEN,
    EstimatesTold,
    Told,
    held_by_pace,
    worth_telling,
)

START = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


class Clock:
    """A fake clock: wall time and monotonic seconds, stepped by the test."""

    def __init__(self) -> None:
        self.mono = 1000.0

    @property
    def now(self) -> datetime:
        return START + timedelta(seconds=self.mono - 1000.0)

    def advance(self, seconds: float) -> None:
        self.mono += seconds


def known(clock: Clock, seconds_from_start: float) -> Estimate:
    return Estimate(START + timedelta(seconds=seconds_from_start))


def test_the_first_estimate_is_written_at_once_known_or_not() -> None:
    clock = Clock()
    assert worth_telling(None, known(clock, 600), clock.now, clock.mono)
    assert worth_telling(None, Estimate(None, UNKNOWN_HELD), clock.now, clock.mono)


def test_never_twice_within_a_minute_whatever_changes() -> None:
    clock = Clock()
    told = Told(known(clock, 3600), clock.mono)
    clock.advance(MIN_SECONDS_BETWEEN - 0.5)
    for new in (known(clock, 36000), Estimate(None, UNKNOWN_HELD), known(clock, 0)):
        assert not worth_telling(told, new, clock.now, clock.mono), new
    clock.advance(0.5)
    assert worth_telling(told, known(clock, 36000), clock.now, clock.mono)


def test_a_known_estimate_is_rewritten_when_it_moves_by_more_than_the_fraction_of_the_time_left() -> None:
    clock = Clock()
    told = Told(known(clock, 3600), clock.mono)
    clock.advance(600)  # 3000 s left until the written estimate: 10 % is 300 s
    left = 3000.0
    bound = FRACTION * left
    assert not worth_telling(told, known(clock, 3600 + bound), clock.now, clock.mono), "exactly the bound: kept"
    assert worth_telling(told, known(clock, 3600 + bound + 1), clock.now, clock.mono), "later by more"
    assert worth_telling(told, known(clock, 3600 - bound - 1), clock.now, clock.mono), "earlier by more"
    assert not worth_telling(told, known(clock, 3600 - bound + 1), clock.now, clock.mono)


def test_near_or_past_the_written_time_the_floor_holds() -> None:
    clock = Clock()
    told = Told(known(clock, 100), clock.mono)
    clock.advance(70)  # 30 s left: 10 % is 3 s, the floor 30 s
    assert not worth_telling(told, known(clock, 100 + FLOOR_SECONDS), clock.now, clock.mono)
    assert worth_telling(told, known(clock, 100 + FLOOR_SECONDS + 1), clock.now, clock.mono)
    clock.advance(600)  # past the written time: nothing left, the floor alone
    assert not worth_telling(told, known(clock, 100 + 20), clock.now, clock.mono)
    assert worth_telling(told, known(clock, 100 + 600), clock.now, clock.mono)


def test_known_and_unknown_turn_into_each_other_and_an_unknown_reason_change_is_told() -> None:
    clock = Clock()
    told = Told(known(clock, 3600), clock.mono)
    clock.advance(MIN_SECONDS_BETWEEN)
    assert worth_telling(told, Estimate(None, UNKNOWN_HELD), clock.now, clock.mono)
    unknown = Told(Estimate(None, UNKNOWN_HELD), clock.mono)
    clock.advance(MIN_SECONDS_BETWEEN)
    assert not worth_telling(unknown, Estimate(None, UNKNOWN_HELD), clock.now, clock.mono)
    assert worth_telling(unknown, Estimate(None, UNKNOWN_TOO_BIG), clock.now, clock.mono)
    assert worth_telling(unknown, known(clock, 7200), clock.now, clock.mono)


def test_the_record_paces_each_appwrapper_on_its_own_and_forgets_those_that_left() -> None:
    clock = Clock()
    told = EstimatesTold()
    steady, moving = known(clock, 3600), known(clock, 3600)
    for key in ("a", "b"):
        assert told.due(key, steady, clock.now, clock.mono)
        told.told(key, steady, clock.mono)
    writes = {"a": 1, "b": 1}
    # "a"'s estimate swings by an hour every 5 s for 10 minutes; "b"'s stays: a refresh every 5 s decides.
    for step in range(120):
        clock.advance(5)
        moving = known(clock, 3600 + (3600 if step % 2 else 0))
        for key, new in (("a", moving), ("b", steady)):
            if told.due(key, new, clock.now, clock.mono):
                told.told(key, new, clock.mono)
                writes[key] += 1
    assert writes["b"] == 1, "a steady estimate is written once"
    assert 2 <= writes["a"] <= 1 + 600 / MIN_SECONDS_BETWEEN, writes
    assert len(told) == 2
    told.forget("a")
    told.forget("gone")
    assert list(told) == ["b"]
    assert told.due("a", moving, clock.now, clock.mono), "back in the queue: told afresh"


def test_held_by_pace_is_a_move_worth_writing_within_the_minute_only() -> None:
    clock = Clock()
    told = Told(Estimate(clock.now + timedelta(seconds=600)), clock.mono)
    moved = Estimate(clock.now + timedelta(seconds=900))
    clock.mono += 10
    assert not worth_telling(told, moved, clock.now, clock.mono)
    assert held_by_pace(told, moved, clock.now, clock.mono), "worth it, but within the minute"
    assert not held_by_pace(told, told.estimate, clock.now, clock.mono), "unchanged: nothing to wait for"
    assert not held_by_pace(None, moved, clock.now, clock.mono), "never written: written at once, not held"
    clock.mono = told.when + MIN_SECONDS_BETWEEN
    assert worth_telling(told, moved, clock.now, clock.mono) and not held_by_pace(told, moved, clock.now, clock.mono)
