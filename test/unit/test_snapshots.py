"""The /debug snapshots: many readers share one build, builds are spaced by the interval, a reader never gets a
state older than its request, and a reader that waits too long is told to retry. The "dispatcher" here is a thread
that runs what it is given, as Dispatcher.call does."""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from mcad.serve.snapshots import Busy, Snapshot, Snapshots
from test.support import wait_until


class Loop:
    """A dispatcher thread: runs calls one at a time; ``hold`` keeps it busy (a long cycle)."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self.hold = threading.Event()
        self.hold.set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            fn, future = self.calls.get()
            self.hold.wait()
            future.set_result(fn())

    def call(self, fn: Callable[[], Snapshot], timeout: float) -> Snapshot:
        future: Future[Snapshot] = Future()
        self.calls.put((fn, future))
        return future.result(timeout)


class FakeReports:
    def __init__(self) -> None:
        self.state = 0  # what the "dispatcher" knows; each document says which state it saw
        self.assessments = 0
        self.sharing = False

    @contextlib.contextmanager
    def shared_assessments(self) -> Iterator[None]:
        self.assessments += 1
        yield

    def queue(self) -> dict[str, Any]:
        return {"state": self.state, "queued": [], "dispatched": []}

    def queue_deferred(self) -> Callable[[], dict[str, Any]]:
        document = self.queue()  # what the loop reads now; formatted later (here: nothing to format)
        return lambda: document

    def ledger(self) -> dict[str, Any]:
        return {"state": self.state}

    quota = clusters = ledger

    def explain(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"name": name, "state": self.state} if name != "absent" else None


def snapshots(interval: float = 0.2) -> tuple[Snapshots, FakeReports, Loop]:
    loop, reports = Loop(), FakeReports()
    return Snapshots(loop.call, reports, lambda: {"team-a"}, interval=interval), reports, loop  # type: ignore[arg-type]


def test_a_reader_sees_no_state_older_than_its_request() -> None:
    snaps, reports, _ = snapshots(interval=0.05)
    first = snaps.read({"queue"}, 5)
    assert first.documents["queue"]["state"] == 0 and first.namespaces == {"team-a"}
    reports.state = 1
    assert snaps.read({"queue"}, 5).documents["queue"]["state"] == 1
    both = snaps.read({"ledger", ("explain", "team-a", "x"), ("explain", "team-a", "absent")}, 5)
    assert both.documents["ledger"] == {"state": 1}
    assert both.documents[("explain", "team-a", "x")] == {"name": "x", "state": 1}
    assert both.documents[("explain", "team-a", "absent")] is None


def test_many_pollers_share_builds_spaced_by_the_interval() -> None:
    snaps, reports, _ = snapshots(interval=0.2)
    stop = time.monotonic() + 1.5
    served = []

    def poll() -> None:
        while time.monotonic() < stop:
            served.append(snaps.read({"queue"}, 5))

    pollers = [threading.Thread(target=poll) for _ in range(16)]
    for thread in pollers:
        thread.start()
    for thread in pollers:
        thread.join(10)
    # 1.5 s at one build per 0.2 s: at most 8 (the first one starts at once), however many answers were served.
    assert 2 <= snaps.builds <= 9, snaps.builds
    assert len(served) >= 16 * 2
    starts = sorted({s.built_at for s in served})
    assert all(b - a >= 0.2 - 0.01 for a, b in itertools.pairwise(starts)), starts
    assert reports.assessments == snaps.builds  # the queue is assessed once per build


def test_a_busy_loop_makes_readers_retry_and_the_build_comes_later() -> None:
    snaps, _, loop = snapshots(interval=0.01)
    loop.hold.clear()
    with pytest.raises(Busy):
        snaps.read({"queue"}, 0.3)
    loop.hold.set()
    assert snaps.read({"queue"}, 5).documents["queue"]["state"] == 0


def test_too_many_names_to_explain_at_once_is_busy() -> None:
    snaps, _, loop = snapshots(interval=0.01)
    snaps.max_explains = 2
    loop.hold.clear()
    # One build under way (held by a long cycle); two names wait for the next one.
    readers = [threading.Thread(target=_busy_ok, args=(snaps, {"queue"}))]
    readers[0].start()
    wait_until(lambda: loop.calls.qsize() == 1 or not snaps._wanted, 5, "the first build to start")
    readers.append(threading.Thread(target=_busy_ok, args=(snaps, {("explain", "a", "1"), ("explain", "a", "2")})))
    readers[1].start()
    wait_until(lambda: len(snaps._wanted) == 2, 5, "two names wanted")
    with pytest.raises(Busy, match="more than 2"):
        snaps.read({("explain", "a", "3")}, 1)
    loop.hold.set()
    for reader in readers:
        reader.join(5)


def _busy_ok(snaps: Snapshots, parts: set[Any]) -> None:
    with contextlib.suppress(Busy):
        snaps.read(parts, 2)


def test_slow_builds_are_spaced_out_to_a_tenth_of_the_loop() -> None:
    class Slow(FakeReports):
        def queue(self) -> dict[str, Any]:
            time.sleep(0.05)  # a queue of many thousands: the build's own cost on the loop
            return super().queue()

    loop = Loop()
    snaps = Snapshots(loop.call, Slow(), lambda: set(), interval=0.01)  # type: ignore[arg-type]
    first = snaps.read({"queue"}, 5)
    second = snaps.read({"queue"}, 5)
    assert first.build_seconds >= 0.05
    assert second.built_at - first.built_at >= 10 * first.build_seconds - 0.01


def test_a_poller_takes_the_latest_snapshot_at_once_while_it_is_as_fresh_as_the_spacing_allows() -> None:
    loop = Loop()
    reports = FakeReports()
    snaps = Snapshots(loop.call, reports, set, interval=0.2)  # type: ignore[arg-type]
    first = snaps.read({"queue"}, 5.0)
    reports.state = 1
    loop.hold.clear()  # the loop is in a long cycle: nothing new can be built
    try:
        # Within 0.3 s (+ the 0.2 s spacing) of that build: the same snapshot, at once, though the loop is busy.
        assert snaps.read({"queue"}, 0.1, fresh_within=0.3) is first
        # A one-shot reader wants a state no older than its request, and waits for it.
        with pytest.raises(Busy):
            snaps.read({"queue"}, 0.1)
        # Older than that: the poller waits for a new build too.
        wait_until(lambda: time.monotonic() - first.built_at > 0.6, 5, "the snapshot to age")
        with pytest.raises(Busy):
            snaps.read({"queue"}, 0.1, fresh_within=0.3)
    finally:
        loop.hold.set()
    fresh = snaps.read({"queue"}, 5.0, fresh_within=0.3)
    assert fresh is not first and fresh.documents["queue"]["state"] == 1


class SlowReports(FakeReports):
    """A queue document whose reading (on the loop) waits for ``go``: a build that began before a reader asked."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.reading = threading.Event()

    def queue_deferred(self) -> Callable[[], dict[str, Any]]:
        self.reading.set()
        self.go.wait(5)
        return super().queue_deferred()


def test_a_poller_takes_the_build_under_way_not_one_that_starts_after_its_request() -> None:
    reports = SlowReports()
    reports.go.set()
    snaps = Snapshots(Loop().call, reports, set, interval=3.0)  # type: ignore[arg-type]
    snaps.read({"queue"}, 5.0)
    # The next build may start only 3 s after the first: once it has begun, a poller asks, with a 1 s timeout.
    reports.go.clear()
    reports.reading.clear()
    wait_until(lambda: snaps.spacing == 3.0, 5, "the publisher to space its builds")
    starter = threading.Thread(target=lambda: snaps.read({"queue"}, 10.0))
    starter.start()
    assert reports.reading.wait(10), "the second build did not begin"
    waiting: Future[Snapshot] = Future()

    def poll() -> None:
        try:
            waiting.set_result(snaps.read({"queue"}, 1.0, fresh_within=0.0))
        except Busy as err:
            waiting.set_exception(err)

    threading.Thread(target=poll).start()
    reports.go.set()
    fresh = waiting.result(5.0)  # the build under way, though it began before the poll: the next is 3 s away
    assert fresh.documents["queue"]["state"] == 0
    starter.join(10)
