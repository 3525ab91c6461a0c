"""The expected start that explain and /debug/queue give (``mcad.model.estimate``, from the dispatch cycle's dry
run): behind a running AppWrapper with a run-time limit, a queued one is expected when that limit runs out; behind one
without, it is unknown and says why."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mcad.model.estimate import UNKNOWN_BLOCKED, UNKNOWN_HELD
from mcad.serve.debug import Reports
from test.component.harness import gang_aw, node


def limited(raw: dict[str, Any], seconds: int) -> dict[str, Any]:
    raw["spec"]["schedulingSpec"] = {"dispatchDuration": {"limit": seconds}}
    return raw


def test_a_queued_one_is_expected_when_the_limit_of_what_holds_its_room_runs_out(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[limited(gang_aw("first", 1, {"cpu": "4"}), 600)],
                        fit="aggregate")
    h.drain()
    started = h.clock.now()
    h.clock.advance(60)
    h.lw["aw"].add(limited(gang_aw("second", 1, {"cpu": "4"}), 300))
    h.lw["aw"].add(gang_aw("third", 1, {"cpu": "2"}))
    h.drain()
    assessed = h.dispatcher.view.assess_queue()
    second, third = assessed.estimate("ns/second"), assessed.estimate("ns/third")
    assert second is not None and second.at is not None
    assert abs((second.at - (started + timedelta(seconds=600))).total_seconds()) <= 1
    assert third is not None and third.at is not None
    assert abs((third.at - (started + timedelta(seconds=900))).total_seconds()) <= 1, "after second's 300 s"
    explained = Reports(h.dispatcher.view, lambda: {}).explain("ns", "second")
    assert explained is not None
    assert any(line.startswith(f"expected start: {second.at.isoformat()}") for line in explained["details"])


def test_behind_one_without_a_limit_it_is_unknown_and_says_why(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("first", 1, {"cpu": "4"})], fit="aggregate")
    h.drain()
    h.lw["aw"].add(gang_aw("second", 1, {"cpu": "4"}))
    h.drain()
    estimate = h.dispatcher.view.assess_queue().estimate("ns/second")
    assert estimate is not None and estimate.at is None and estimate.why == UNKNOWN_HELD
    explained = Reports(h.dispatcher.view, lambda: {}).explain("ns", "second")
    assert explained is not None and f"expected start: unknown ({UNKNOWN_HELD})" in explained["details"]


def test_one_that_the_nodes_keep_out_is_not_expected_now_though_the_cluster_has_room(harness_factory: Any) -> None:
    # Two 4-cpu nodes; first holds 3 cpu of n0 for 600 s. second's 2 pods of 2.5 cpu fit on no set of nodes now (n1
    # takes one), though 5 cpu are free in all: expected when first's limit runs out, not now; without it, unknown.
    for limit in (600, 0):
        first = gang_aw("first", 1, {"cpu": "3"})
        h = harness_factory(nodes=[node("n0", "4"), node("n1", "4")], pods=[],
                            aws=[limited(first, limit) if limit else first])
        h.drain()
        started = h.clock.now()
        h.lw["aw"].add(gang_aw("second", 2, {"cpu": "2500m"}))
        h.drain()
        estimate = h.dispatcher.view.assess_queue().estimate("ns/second")
        assert estimate is not None
        if limit:
            assert estimate.at is not None
            assert abs((estimate.at - (started + timedelta(seconds=limit))).total_seconds()) <= 1
        else:
            assert estimate == type(estimate)(None, UNKNOWN_BLOCKED)
