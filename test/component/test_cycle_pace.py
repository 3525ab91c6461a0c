"""Cycles for freed room are paced (``--cycle-interval``): room that frees within the interval of the last cycle's
start is judged by one cycle at the interval's end, however many times it freed; a newcomer is judged at once. On
the fake clock: time moves only when a test advances it."""

from __future__ import annotations

from typing import Any

from test.component.harness import aw, node


def dispatched(h: Any) -> set[str]:
    return set(h.dispatcher.owners.active.views)


def full_cluster(harness_factory: Any, interval: float) -> Any:
    """Two 1-cpu AppWrappers running on a 2-cpu node, three waiting behind them."""
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=[aw("run-0", "1"), aw("run-1", "1")],
                        cycle_interval=interval)
    h.drain()
    for i in range(3):
        h.lw["aw"].add(aw(f"wait-{i}", "1"))
    h.drain()
    assert dispatched(h) == {"ns/run-0", "ns/run-1"}
    return h


def test_room_freed_within_the_interval_is_judged_once_at_its_end(harness_factory: Any) -> None:
    h = full_cluster(harness_factory, 0.5)
    cycle = h.dispatcher.owners.cycle
    cycles = cycle.count
    for name in ("run-0", "run-1"):  # both finish within the interval: room frees twice
        h.lw["aw"].delete(f"ns/{name}")
        h.drain()
    assert cycle.count == cycles and dispatched(h) == set(), "no cycle inside the interval"
    assert cycle.deferred == 2
    h.clock.advance(0.5)
    h.drain()
    assert cycle.count == cycles + 1, "one cycle for both"
    assert dispatched(h) == {"ns/wait-0", "ns/wait-1"}


def test_a_newcomer_is_judged_at_once_within_the_interval(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("first", "1")], cycle_interval=0.5)
    h.drain()
    h.lw["aw"].add(aw("second", "1"))  # the clock has not moved: within the interval of the first cycle
    h.drain()
    assert dispatched(h) == {"ns/first", "ns/second"}
    assert h.dispatcher.owners.cycle.deferred == 0


def test_room_freed_after_the_interval_is_judged_at_once(harness_factory: Any) -> None:
    h = full_cluster(harness_factory, 0.5)
    h.clock.advance(0.6)
    h.lw["aw"].delete("ns/run-0")
    h.drain()
    assert dispatched(h) == {"ns/run-1", "ns/wait-0"}


def test_without_an_interval_freed_room_is_judged_at_once(harness_factory: Any) -> None:
    h = full_cluster(harness_factory, 0)
    h.lw["aw"].delete("ns/run-0")
    h.drain()
    assert dispatched(h) == {"ns/run-1", "ns/wait-0"}
    assert h.dispatcher.owners.cycle.deferred == 0
