"""The /debug snapshots: many readers share one build, builds are spaced by the interval, a reader never gets a
state older than its request, and a reader that waits too long is told to retry. The "dispatcher" here is a thread
that runs what it is given, as Dispatcher.call does.

Tests about time (spacing, freshness, a build's cost) hand the snapshots a ``FakeClock`` and step it: what they
assert holds however slowly the threads run. Real time bounds only a hang (generous deadlines)."""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from mcad.serve.snapshots import Busy, Snapshot, Snapshots
from test.fakes import FakeClock
from test.support import wait_until

DEADLINE = 10.0  # real seconds: only bounds a hang


def stepped(clock: FakeClock, snaps: Snapshots, done: Callable[[], bool], step: float = 0.05,
            limit: float = 3600.0) -> float:
    """Step ``clock`` by ``step`` and wake the snapshots until ``done()``; return the time stepped. The threads
    react at their own pace, so more steps than needed may pass: only lower bounds of time can be asserted.
    (The tests' threads are daemons: one a wrong answer leaves waiting on a clock that stands still must not keep
    pytest from exiting.)"""
    stepped_by = 0.0
    while not done():
        assert stepped_by < limit, "never done"
        clock.advance(step)
        stepped_by += step
        snaps.wake()
        threading.Event().wait(0.001)  # let the threads run: how long does not matter
    return stepped_by


class Loop:
    """A dispatcher thread: runs calls one at a time; ``hold`` keeps it busy (a long cycle)."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self.hold = threading.Event()
        self.hold.set()
        self.taken = 0  # calls it has begun to run (it may be held before running them)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            fn, future = self.calls.get()
            self.taken += 1
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
    clock = FakeClock()
    loop, reports = Loop(), FakeReports()
    snaps = Snapshots(loop.call, reports, lambda: {"team-a"}, interval=0.2, clock=clock)  # type: ignore[arg-type]
    start = clock.monotonic()
    served: list[Snapshot] = []
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            for _ in range(4):  # each read wants a state no older than its request: a new build
                served.append(snaps.read({"queue"}, 1e6))
        except BaseException as err:  # reported by the assertions below
            errors.append(err)

    pollers = [threading.Thread(target=poll, daemon=True) for _ in range(16)]
    for thread in pollers:
        thread.start()
    wait_until(lambda: snaps.builds >= 1, DEADLINE, "the first build, at once")  # before the clock moves
    elapsed = stepped(clock, snaps, lambda: not any(thread.is_alive() for thread in pollers))
    assert errors == [] and len(served) == 16 * 4
    # One build per 0.2 s of the clock at most (the first one starts at once), however many answers were served.
    assert 4 <= snaps.builds <= 1 + elapsed / 0.2 + 1e-9, (snaps.builds, elapsed)
    starts = sorted({s.built_at for s in served})
    assert starts[0] == start
    assert all(b - a >= 0.2 for a, b in itertools.pairwise(starts)), starts
    assert reports.assessments == snaps.builds  # the queue is assessed once per build


def test_builds_are_spaced_from_when_the_loop_began_the_last_one() -> None:
    # A build the loop runs late (a long cycle) must not let the next one follow it closely.
    clock = FakeClock()
    loop = Loop()
    snaps = Snapshots(loop.call, FakeReports(), set, interval=1.0, clock=clock)  # type: ignore[arg-type]
    loop.hold.clear()
    first: Future[Snapshot] = Future()
    threading.Thread(target=lambda: first.set_result(snaps.read({"queue"}, 1e6)), daemon=True).start()
    wait_until(lambda: loop.taken == 1, DEADLINE, "the first build to be asked for")
    clock.advance(0.9)  # the loop runs it 0.9 s after it was asked for
    loop.hold.set()
    built = first.result(DEADLINE)
    assert built.built_at == pytest.approx(1000.9)
    second: Future[Snapshot] = Future()
    threading.Thread(target=lambda: second.set_result(snaps.read({"queue"}, 1e6)), daemon=True).start()
    stepped(clock, snaps, second.done, step=0.1)
    assert second.result().built_at - built.built_at >= 1.0


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
    clock = FakeClock()

    class Slow(FakeReports):
        def queue(self) -> dict[str, Any]:
            clock.advance(0.05)  # a queue of many thousands: the build's own cost on the loop
            return super().queue()

    loop = Loop()
    snaps = Snapshots(loop.call, Slow(), lambda: set(), interval=0.01, clock=clock)  # type: ignore[arg-type]
    first = snaps.read({"queue"}, 1e6)
    assert first.build_seconds == pytest.approx(0.05)
    second: Future[Snapshot] = Future()
    threading.Thread(target=lambda: second.set_result(snaps.read({"queue"}, 1e6)), daemon=True).start()
    stepped(clock, snaps, second.done, step=0.01)
    assert second.result().built_at - first.built_at >= 10 * 0.05 - 1e-9


class Report:
    """A deferred queue document (as ``mcad.serve.queuereport.QueueReport``): formatting it costs 0.5 s of the clock."""

    def __init__(self, clock: FakeClock, state: int) -> None:
        self.clock = clock
        self.state = state
        self.formatted = 0

    def document(self) -> dict[str, Any]:
        self.formatted += 1
        self.clock.advance(0.5)
        return {"state": self.state}


def test_a_deferred_document_is_formatted_once_when_read_and_paced_by_that_cost() -> None:
    clock = FakeClock()
    made: list[Report] = []

    class Deferring(FakeReports):
        def queue_deferred(self) -> Any:
            made.append(Report(clock, self.state))
            return made[-1]

    loop = Loop()
    snaps = Snapshots(loop.call, Deferring(), lambda: set(), interval=0.01, clock=clock)  # type: ignore[arg-type]
    first = snaps.read({"queue"}, 1e6)
    assert made[0].formatted == 0, "nobody asked for the whole document yet"
    assert first.encoded("queue") == first.encoded("queue") == b'{"state":0}\n'
    assert made[0].formatted == 1, "formatted once, for every reader"
    assert first.later_seconds() == pytest.approx(0.5), "its formatting (its encoding took none of the fake clock)"
    second: Future[Snapshot] = Future()
    threading.Thread(target=lambda: second.set_result(snaps.read({"queue"}, 1e6)), daemon=True).start()
    stepped(clock, snaps, second.done, step=0.1)
    # The next build waits ten times what the last one cost, readers' formatting included.
    assert second.result().built_at - first.built_at >= 10 * 0.5 - 1e-9
    # A reader read the whole of the last one: the publisher formats this one before publishing it, and its cost
    # counts once, as the publisher's.
    assert made[1].formatted == 1 and second.result().later_seconds() == 0.0
    assert snaps.spacing == pytest.approx(5.0)
    assert second.result().encoded("queue") == b'{"state":0}\n' and made[1].formatted == 1
    # Nobody reads the whole of the next ones: the publisher stops formatting them once one went unread.
    third: Future[Snapshot] = Future()
    threading.Thread(target=lambda: third.set_result(snaps.read({"queue"}, 1e6)), daemon=True).start()
    stepped(clock, snaps, third.done, step=0.1)
    assert made[2].formatted == 1, "the last one was read whole (above): this one is made ready too"
    fourth: Future[Snapshot] = Future()
    threading.Thread(target=lambda: fourth.set_result(snaps.read({"queue"}, 1e6)), daemon=True).start()
    stepped(clock, snaps, fourth.done, step=0.1)
    assert made[3].formatted == 0, "the third went unread: the fourth is formatted only if a reader asks"


def test_a_reader_that_cannot_wait_out_the_spacing_its_readers_made_longer_takes_the_latest_at_once() -> None:
    # The spacing grows after a build is published, when its first reader formats the whole deferred document: a
    # one-shot reader must judge the latest snapshot by that spacing, not by the one known when it was built.
    clock = FakeClock()

    class Deferring(FakeReports):
        def queue_deferred(self) -> Any:
            return Report(clock, self.state)

    loop = Loop()
    snaps = Snapshots(loop.call, Deferring(), lambda: set(), interval=0.01, clock=clock)  # type: ignore[arg-type]
    first = snaps.read({"queue"}, 1e6)
    first.encoded("queue")  # the first reader of /debug/queue formats it: 0.5 s of the clock
    assert snaps.spacing == pytest.approx(5.0)
    clock.advance(2.0)
    later: Future[Snapshot] = Future()
    threading.Thread(target=lambda: later.set_result(snaps.read({"queue"}, 1.0)), daemon=True).start()
    assert later.result(DEADLINE) is first, "built 2 s ago, within the 5 s spacing: nothing fresher could be had"


def test_a_poller_takes_the_latest_snapshot_at_once_while_it_is_as_fresh_as_the_spacing_allows() -> None:
    clock = FakeClock()
    loop = Loop()
    reports = FakeReports()
    snaps = Snapshots(loop.call, reports, set, interval=0.2, clock=clock)  # type: ignore[arg-type]
    first = snaps.read({"queue"}, 1e6)
    reports.state = 1
    loop.hold.clear()  # the loop is in a long cycle: nothing new can be built
    try:
        # Within 0.3 s (+ the 0.2 s spacing) of that build: the same snapshot, at once, though the loop is busy
        # (a timeout of 0: anything but an answer at hand is Busy).
        clock.advance(0.5)
        assert snaps.read({"queue"}, 0, fresh_within=0.3) is first
        # A one-shot reader wants a state no older than its request: none is at hand.
        with pytest.raises(Busy):
            snaps.read({"queue"}, 0)
        # Older than that: the poller waits for a new build too.
        clock.advance(0.01)
        with pytest.raises(Busy):
            snaps.read({"queue"}, 0, fresh_within=0.3)
    finally:
        loop.hold.set()
    fresh = snaps.read({"queue"}, 1e6, fresh_within=0.3)
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
    clock = FakeClock()
    reports = SlowReports()
    reports.go.set()
    snaps = Snapshots(Loop().call, reports, set, interval=3.0, clock=clock)  # type: ignore[arg-type]
    snaps.read({"queue"}, 1e6)
    # The next build may start only 3 s after the first: once it has begun, a poller asks, with a 1 s timeout.
    reports.go.clear()
    reports.reading.clear()
    wait_until(lambda: snaps.spacing == 3.0, DEADLINE, "the publisher to space its builds")
    starter = threading.Thread(target=lambda: snaps.read({"queue"}, 1e6), daemon=True)
    starter.start()
    wait_until(lambda: snaps._wanted, DEADLINE, "the starter to ask")
    clock.advance(3.5)  # the first snapshot is now older than a poller takes at once (fresh_within 0 + 3 s)
    snaps.wake()
    assert reports.reading.wait(DEADLINE), "the second build did not begin"
    clock.advance(0.1)  # the poll below comes after the build began
    waiting: Future[Snapshot] = Future()

    def poll() -> None:
        try:
            waiting.set_result(snaps.read({"queue"}, 1.0, fresh_within=0.0))
        except Busy as err:
            waiting.set_exception(err)

    threading.Thread(target=poll, daemon=True).start()
    wait_until(lambda: snaps._wanted, DEADLINE, "the poller to ask")
    reports.go.set()
    # The build under way, though it began before the poll: the next is 3 s away (the clock stands still, so a
    # poller that waited for that one would wait here until the deadline).
    fresh = waiting.result(DEADLINE)
    assert fresh.documents["queue"]["state"] == 0
    starter.join(DEADLINE)


def test_a_reader_that_cannot_wait_out_the_spacing_takes_the_latest_snapshot_within_it() -> None:
    """At 100,000 queued a build costs seconds and the next is ten times that away; a one-shot reader
    (/debug/queue, a 10 s wait) that only took a new build would be answered Busy every time. It gets the freshest
    it could: the latest, if built within the spacing."""
    clock = FakeClock()

    class Slow(FakeReports):
        def queue(self) -> dict[str, Any]:
            clock.advance(2.0)  # the build's own cost on the loop: the next one is 20 s away
            return super().queue()

    reports = Slow()
    snaps = Snapshots(Loop().call, reports, set, interval=0.2, clock=clock)  # type: ignore[arg-type]
    first = snaps.read({"queue"}, 1e6)
    wait_until(lambda: snaps.spacing >= 20.0, DEADLINE, "the publisher to space its builds")
    reports.state = 1
    clock.advance(5.0)
    assert snaps.read({"queue"}, 10.0) is first  # 5 s old, the next build 15 s away: more than it may wait
    # One that may wait out the spacing still gets a state no older than its request.
    later: Future[Snapshot] = Future()
    threading.Thread(target=lambda: later.set_result(snaps.read({"queue"}, 1e6)), daemon=True).start()
    stepped(clock, snaps, later.done, step=1.0)
    assert later.result().documents["queue"]["state"] == 1


def test_a_document_with_long_lists_is_encoded_in_chunks_to_the_same_bytes() -> None:
    import json

    from mcad.serve import snapshots as snapshots_mod

    document = {"controller": {"fit": "nodes"}, "queued": [{"name": f"aw-{i}", "why": "short of \u00e9"}
                                                           for i in range(2500)],
                "dispatched": [{"name": "one"}], "empty": [], "reservations": [{"x": 1}] * 1001}
    expected = json.dumps(document, separators=(",", ":")).encode() + b"\n"
    calls: list[int] = []
    real_dumps = json.dumps

    def counting(value: Any, **kwargs: Any) -> str:
        calls.append(1)
        return real_dumps(value, **kwargs)

    snapshots_mod.json.dumps = counting  # type: ignore[assignment]
    try:
        assert snapshots_mod.encode(document) == expected
    finally:
        snapshots_mod.json.dumps = real_dumps  # type: ignore[assignment]
    assert len(calls) > 5, "the long lists went in several calls"
    assert snapshots_mod.encode({"a": [1, 2]}) == b'{"a":[1,2]}\n'
