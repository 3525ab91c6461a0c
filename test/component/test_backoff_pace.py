"""The pace of Backoff status writes (``--backoff-status-rate``, ``mcad.loop.statussync``): a burst, then the rate,
in arrival order; an AppWrapper dispatched before its turn costs no Backoff write; what is not paced (a dispatch)
is written at once whatever the pace owes. On the fake clock: time moves only when a test advances it."""

from __future__ import annotations

from typing import Any

from mcad.metrics import PUBLISH_INTERVAL_SECONDS
from mcad.model.status import BACKOFF, latest
from mcad.serve import server
from mcad.wiring import BACKOFF_STATUS_BURST
from test.component.harness import aw, node
from test.fakes import wait_informed


def gpu_aw(name: str) -> dict[str, Any]:
    raw = aw(name, "1")
    raw["spec"]["resources"]["GenericItems"][0]["custompodresources"][0]["requests"]["nvidia.com/gpu"] = "1"
    return raw


def dispatched(h: Any) -> list[str]:
    return [name.removesuffix("-cm") for name in h.writer.applied]


def backoffs(h: Any) -> list[str]:
    """Who each Backoff write told, in order: a write whose Backoff condition is new for its AppWrapper (an expected
    start written later carries the same condition, and is not a Backoff told again)."""
    told: list[str] = []
    last: dict[str, Any] = {}
    for name, status in h.writer.statuses:
        backoff = latest(status.get("conditions"), BACKOFF) if status.get("queuejobstate") == BACKOFF else None
        if backoff is not None and last.get(name) != backoff:
            told.append(name)
            last[name] = backoff
    return told


def test_backoff_statuses_go_out_at_the_rate_after_a_burst_each_once(harness_factory: Any) -> None:
    names = [f"gpu{i:04d}" for i in range(BACKOFF_STATUS_BURST + 50)]
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[gpu_aw(n) for n in names], backoff_status_rate=10)
    h.drain()
    first = backoffs(h)
    assert len(first) == BACKOFF_STATUS_BURST, "the burst"
    assert h.dispatcher.owners.decisions.sync.paced_count() == 50

    h.clock.advance(2.05)
    h.drain()
    assert backoffs(h)[:BACKOFF_STATUS_BURST] == first
    assert len(backoffs(h)) == BACKOFF_STATUS_BURST + 20, "then 10 a second"

    h.clock.advance(10)
    h.drain()
    assert sorted(backoffs(h)) == names, "every one told once, none twice"
    # The expected starts of the first 100 (mcad.loop.notices) share the pace: they are out a few seconds later.
    h.clock.advance(5)
    h.drain()
    assert h.dispatcher.owners.decisions.sync.paced_count() == 0


def test_an_appwrapper_dispatched_before_its_turn_costs_no_backoff_write(harness_factory: Any) -> None:
    names = [f"w{i:03d}" for i in range(BACKOFF_STATUS_BURST + 40)]
    # 1 cpu each on 8 cpu: 8 dispatch at once, the burst tells the next 100, 32 wait for their turn.
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw(n, "1") for n in names], backoff_status_rate=10)
    h.drain()
    told = set(backoffs(h))
    assert len(told) == BACKOFF_STATUS_BURST
    untold = [n for n in names if n not in told and n not in dispatched(h)]
    assert len(untold) == 32
    # Room for everyone: each is dispatched, the untold ones before their Backoff's turn came.
    h.lw["node"].add(node("n1", "1000"))
    wait_informed(lambda: h.dispatcher.nodes.get("n1"), 5, "the node informer to see n1")
    h.drain()
    assert sorted(dispatched(h)) == sorted(names)
    h.clock.advance(60)
    h.drain()
    assert set(backoffs(h)) == told, "no Backoff written after the dispatch (or instead of it)"
    for name in untold:
        assert [s["state"] for n, s in h.writer.statuses if n == name] == ["Running"], name
    assert h.dispatcher.owners.decisions.sync.paced_count() == 0


def test_a_dispatch_is_written_at_once_while_backoffs_wait_for_tokens(harness_factory: Any) -> None:
    names = [f"gpu{i:04d}" for i in range(BACKOFF_STATUS_BURST + 50)]
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[gpu_aw(n) for n in names], backoff_status_rate=10)
    h.drain()
    written = len(h.writer.statuses)
    h.lw["aw"].add(aw("fits", "1"))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/fits"), 5, "the new AppWrapper")
    h.drain()
    assert h.writer.statuses[written:] == [("fits", h.writer.statuses[-1][1])]
    assert h.writer.statuses[-1][1]["state"] == "Running", "not behind the 50 Backoffs still owed"


def test_rate_zero_writes_every_backoff_at_once(harness_factory: Any) -> None:
    names = [f"gpu{i:04d}" for i in range(BACKOFF_STATUS_BURST + 50)]
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[gpu_aw(n) for n in names], backoff_status_rate=0)
    h.drain()
    assert sorted(backoffs(h)) == names


def test_the_backoff_statuses_still_waiting_are_a_gauge(harness_factory: Any) -> None:
    names = [f"gpu{i:04d}" for i in range(BACKOFF_STATUS_BURST + 50)]
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[gpu_aw(n) for n in names], backoff_status_rate=10)
    server.observe(h.dispatcher, h.informers, api_errors=dict, leading=lambda: True)
    h.drain()
    h.clock.advance(PUBLISH_INTERVAL_SECONDS)  # 10 more tokens, and the loop publishes for scrapes
    h.drain()
    assert h.dispatcher.metrics.value("mcad_backoff_statuses_waiting") == 40
