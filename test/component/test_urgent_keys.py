"""Under a burst of arrivals, the dispatcher reads what ends a dispatch first: a dispatch's write outcome (its
Dispatched status is decided and sent only once the outcome is read) is handed out ahead of the arrivals' keys
(``mcad.model.keys.URGENT``). A cycle keeps its place behind the events queued before it (the hub's
``test_policy_picks_the_worker`` fails when it does not). Stepped key by key on the fake clock, writes inline."""

from __future__ import annotations

from typing import Any

from test.component.harness import aw, node
from test.fakes import settle

BURST = 50


def queue_a_burst(h: Any) -> None:
    """BURST new AppWrappers that cannot fit, seen by the informer, their keys queued and not yet read."""
    for i in range(BURST):
        h.lw["aw"].add(aw(f"burst-{i:02d}", "64"))
    settle(informer._lw for informer in h.informers)
    assert len(h.dispatcher.queue) >= BURST


def dispatched_statuses(h: Any, name: str) -> list[dict[str, Any]]:
    return [status for key, status in h.writer.statuses if key.endswith(name) and status.get("state") == "Running"]


def step_until(h: Any, done: Any, limit: int) -> int:
    """Keys read until ``done()`` holds (at most ``limit``)."""
    for taken in range(1, limit + 1):
        assert h.dispatcher.process_next(timeout=0) is not None
        if done():
            return taken
    raise AssertionError(f"not done after {limit} keys")


def test_a_dispatch_is_marked_dispatched_before_a_burst_of_arrivals_is_read(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=[])
    h.drain()
    h.lw["aw"].add(aw("first", "1"))
    settle(informer._lw for informer in h.informers)
    assert h.dispatcher.process_next(timeout=0) is not None  # its event: a cycle is asked for
    assert not dispatched_statuses(h, "first") and "ns/first" not in h.dispatcher.owners.dispatches.in_flight
    queue_a_burst(h)  # behind the cycle; the dispatch's outcome comes after them
    taken = step_until(h, lambda: bool(dispatched_statuses(h, "first")), limit=BURST + 5)
    assert taken == 2, f"the cycle, then the dispatch's outcome; it waited behind {taken - 2} keys"
    assert len(h.dispatcher.queue) >= BURST, "the burst is still to be read"
