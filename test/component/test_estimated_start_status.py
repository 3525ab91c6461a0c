"""A queued AppWrapper's expected start in its status (``status.estimatedStart``, ``mcad.loop.notices`` with
``mcad.model.estimatetold``'s rule): written within an estimate interval of its wait being told, rewritten when it
moves by more than the rule's fraction but never twice within a minute, ``estimateWhy`` when unknown, dropped at
dispatch; a deep queue costs at most the estimated hundred writes, however many refreshes pass."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from mcad.loop.cycle import ESTIMATE_INTERVAL_SECONDS
from mcad.model.estimate import ESTIMATED, NOT_ESTIMATED, UNKNOWN_HELD
from mcad.model.estimatetold import MIN_SECONDS_BETWEEN
from test.component.harness import Harness, gang_aw, last_status, node


def limited(raw: dict[str, Any], seconds: int) -> dict[str, Any]:
    raw["spec"]["schedulingSpec"] = {"dispatchDuration": {"limit": seconds}}
    return raw


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def writes_of(h: Harness, name: str) -> list[dict[str, Any]]:
    return [status for n, status in h.writer.statuses if n == name]


def refresh(h: Harness, seconds: float = ESTIMATE_INTERVAL_SECONDS) -> None:
    """Time passes by ``seconds``; every key due meanwhile handled."""
    h.clock.advance(seconds)
    h.drain()


def test_the_estimate_appears_is_rewritten_at_the_bound_and_goes_at_dispatch(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[limited(gang_aw("first", 1, {"cpu": "4"}), 600)],
                        fit="aggregate")
    h.drain()
    started = h.clock.now()
    h.lw["aw"].add(gang_aw("second", 1, {"cpu": "4"}))
    h.drain()
    assert last_status(h, "second")["state"] == "Pending"
    assert "estimatedStart" not in last_status(h, "second"), "judged at the next refresh, not at every cycle"
    refresh(h)
    written = last_status(h, "second")
    assert written["estimatedStart"] == stamp(started + timedelta(seconds=600)), "when first's limit runs out"
    assert "estimateWhy" not in written
    count = len(writes_of(h, "second"))
    refresh(h)
    refresh(h)
    assert len(writes_of(h, "second")) == count, "an unchanged estimate is not written again"

    # A higher-priority one with a 300 s limit goes ahead of it: second's start moves 300 s later, more than 10 % of
    # the ~590 s left. Within a minute of the last write it is not written; at the minute, it is.
    h.lw["aw"].add(limited(gang_aw("urgent", 1, {"cpu": "4"}, priority=10), 300))
    h.drain()
    told_at = h.clock.monotonic() - 2 * ESTIMATE_INTERVAL_SECONDS
    while h.clock.monotonic() - told_at < MIN_SECONDS_BETWEEN - ESTIMATE_INTERVAL_SECONDS:
        refresh(h)
        assert last_status(h, "second").get("estimatedStart") == written["estimatedStart"]
    refresh(h)
    refresh(h)
    assert last_status(h, "second")["estimatedStart"] == stamp(started + timedelta(seconds=900))
    assert len(writes_of(h, "second")) == count + 1

    # first's limit runs out: it fails, urgent is dispatched and the estimate goes from urgent's status; second
    # waits on.
    h.clock.advance(600 - (h.clock.now() - started).total_seconds())
    h.drain()
    urgent = last_status(h, "urgent")
    assert urgent["state"] == "Running"
    assert "estimatedStart" not in urgent and "estimateWhy" not in urgent


def test_unknown_says_why_and_one_pushed_beyond_the_estimated_is_told_so(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("first", 1, {"cpu": "4"})], fit="aggregate")
    h.drain()
    h.lw["aw"].add(gang_aw("second", 1, {"cpu": "4"}))
    h.drain()
    refresh(h)
    written = last_status(h, "second")
    assert "estimatedStart" not in written and written["estimateWhy"] == UNKNOWN_HELD
    for i in range(ESTIMATED):  # a hundred of its group (same demand) and of higher priority go ahead of it
        h.lw["aw"].add(gang_aw(f"ahead-{i:03d}", 1, {"cpu": "4"}, priority=5))
    h.drain()
    refresh(h, MIN_SECONDS_BETWEEN)
    assert last_status(h, "second")["estimateWhy"] == NOT_ESTIMATED


def test_a_deep_queue_costs_at_most_the_estimated_hundred_writes(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[limited(gang_aw("first", 1, {"cpu": "4"}), 3600)],
                        fit="aggregate")
    h.drain()
    for i in range(300):
        h.lw["aw"].add(limited(gang_aw(f"q-{i:03d}", 1, {"cpu": "1"}), 60 + i))
    h.drain()
    before = len(h.writer.statuses)
    for _ in range(24):  # two minutes of refreshes
        refresh(h)
    with_estimate = {name for name, status in h.writer.statuses[before:] if "estimatedStart" in status}
    assert len(with_estimate) == ESTIMATED
    assert with_estimate == {f"q-{i:03d}" for i in range(ESTIMATED)}, "the first hundred in dispatch order"
    assert len(h.writer.statuses) - before == ESTIMATED, "once each: their estimates did not move"
