"""AppWrappers stored before the CRD bounded them (or under an old legacy CRD): the schema no longer lets anyone
create them, so only the fake lister-watcher can feed them to the dispatcher. Time is the fake clock's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from test.component.harness import Harness, aw, node

DISPATCHED_AT = "2024-01-01T00:00:00.000000Z"  # the fake clock's start
WEEK = 7 * 24 * 3600


def old(name: str, scheduling: dict[str, Any], *, dispatched: bool) -> dict[str, Any]:
    raw = aw(name, "1")
    raw["spec"]["schedulingSpec"] = scheduling
    if dispatched:
        raw["status"] = {"state": "Running", "canrun": True, "controllerfirstdispatchtimestamp": DISPATCHED_AT,
                         "conditions": [{"type": "Dispatched", "status": "True",
                                         "lastTransitionMicroTime": DISPATCHED_AT}]}
    return raw


@pytest.fixture
def harness() -> Iterator[Any]:
    made: list[Harness] = []

    def make(*aws: dict[str, Any]) -> Harness:
        made.append(Harness(nodes=[node("n0", "8")], pods=[], aws=list(aws)))
        return made[-1]

    yield make
    for h in made:
        h.stop()


def drain(h: Harness, limit: int = 1000) -> None:
    """Process every key that is due, failing (not hanging) if the work never ends: a loop is what is tested."""
    for _ in range(limit):
        if h.dispatcher.process_next(timeout=0) is None:
            return
    raise AssertionError(f"still busy after {limit} keys: the dispatcher loops")


def requeues(h: Harness) -> list[dict[str, Any]]:
    """The status writes that requeued it (later writes carry the count on)."""
    out: list[dict[str, Any]] = []
    for _, status in h.writer.statuses:
        if status.get("numberOfRequeueings", 0) > (out[-1]["numberOfRequeueings"] if out else 0):
            out.append(status)
    return out


def test_a_queued_old_appwrapper_with_a_zero_requeue_time_fails_and_is_never_dispatched(harness: Any) -> None:
    h = harness(old("zero", {"minAvailable": 1, "requeuing": {"timeInSeconds": 0}}, dispatched=False))
    drain(h)
    assert h.writer.applied == []
    name, status = h.writer.statuses[-1]
    assert (name, status["state"], status["conditions"][-1]["reason"]) == ("zero", "Failed", "InvalidSpec")
    assert status["message"] == "spec.schedulingSpec.requeuing.timeInSeconds is 0; it must be between 1 and 604800"


def test_a_dispatched_old_appwrapper_with_a_zero_requeue_time_waits_a_second_before_its_requeue(
        harness: Any) -> None:
    """It used to dispatch and delete in a tight loop (557 requeues in 21 s on the local cluster): the wait is now
    clamped to 1 s and grows from there. (Once requeued it is queued, and its next status event fails it as
    InvalidSpec; the dispatcher's requeue path does not check that itself yet, so it is not asserted here.)"""
    h = harness(old("zero", {"minAvailable": 1, "requeuing": {"timeInSeconds": 0}}, dispatched=True))
    drain(h)
    h.clock.advance(0.999)
    drain(h)
    assert requeues(h) == [], "not before 1 s"
    h.clock.advance(0.001)
    drain(h)
    [requeued] = requeues(h)
    assert requeued["requeueingTimeInSeconds"] == 2, "the next wait grows (exponential) from 1 s"


def test_huge_times_of_a_dispatched_old_appwrapper_set_timers_of_at_most_a_week_and_a_year(harness: Any) -> None:
    """10^12 s used to raise OverflowError where the timers are computed, so neither was ever set."""
    h = harness(old("ages", {"minAvailable": 1, "requeuing": {"timeInSeconds": 10**12},
                             "dispatchDuration": {"limit": 10**12}}, dispatched=True))
    drain(h)
    assert h.dispatcher.queue.waiting_count() >= 2, "the minAvailable and deadline timers are set"
    h.clock.advance(WEEK - 1)
    drain(h)
    assert requeues(h) == []
    h.clock.advance(1)
    drain(h)
    assert len(requeues(h)) == 1, "the minAvailable check fell due after the 7-day maximum"
