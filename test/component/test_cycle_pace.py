"""Dispatch cycles are paced (``--cycle-interval``): one asked for within the interval of the last one's start is
folded into a single cycle at the interval's end; one asked for later runs at once. On the fake clock: time moves
only when a test advances it."""

from __future__ import annotations

from typing import Any

from test.component.harness import aw, node


def dispatched(h: Any) -> set[str]:
    return set(h.dispatcher.owners.active.views)


def test_asks_within_the_interval_fold_into_one_cycle_at_its_end(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("first", "1")], cycle_interval=0.5)
    h.drain()
    cycle = h.dispatcher.owners.cycle
    assert dispatched(h) == {"ns/first"}, "the first ask runs a cycle at once"
    cycles = cycle.count
    for i in range(5):  # five arrivals, each asking for a cycle, within the interval
        h.lw["aw"].add(aw(f"late-{i}", "1"))
        h.drain()
    assert cycle.count == cycles and dispatched(h) == {"ns/first"}, "no cycle inside the interval"
    assert cycle.deferred >= 1
    h.clock.advance(0.5)
    h.drain()
    assert cycle.count == cycles + 1, "one cycle for all five asks"
    assert dispatched(h) == {"ns/first"} | {f"ns/late-{i}" for i in range(5)}


def test_an_ask_after_the_interval_runs_at_once(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("first", "1")], cycle_interval=0.5)
    h.drain()
    h.clock.advance(0.6)
    h.lw["aw"].add(aw("second", "1"))
    h.drain()
    assert dispatched(h) == {"ns/first", "ns/second"}


def test_without_an_interval_every_ask_runs_a_cycle(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("first", "1")], cycle_interval=0)
    h.drain()
    h.lw["aw"].add(aw("second", "1"))
    h.drain()
    assert dispatched(h) == {"ns/first", "ns/second"}
    assert h.dispatcher.owners.cycle.deferred == 0
