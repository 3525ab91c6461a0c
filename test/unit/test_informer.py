"""Informer semantics (client-go reflector + store) over a FakeListerWatcher.

The informer runs in its own thread, as in production; tests synchronise on queues, the fake's conditions and
"fence" objects (an event pushed last proves everything before it was delivered), never on fixed sleeps.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mcad.k8s.informer import EventType, Informer, Reconnects, object_key
from mcad.k8s.kube import ApiError
from test.fakes import FakeClock, FakeListerWatcher, configmap
from test.support import wait_until

Event = tuple[EventType, Any, Any]
TIMEOUT = 5.0


class Recorder:
    """A handler that queues (type, old, new)."""

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()

    def __call__(self, etype: EventType, old: Any, new: Any) -> None:
        self.events.put((etype, old, new))

    def next(self) -> Event:
        try:
            return self.events.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError("no informer event within the deadline") from None

    def take(self, count: int) -> list[Event]:
        return [self.next() for _ in range(count)]

    def until_fence(self, fence: str) -> list[Event]:
        """Every event up to and including the ADDED of the object named ``fence``."""
        seen = []
        while True:
            event = self.next()
            seen.append(event)
            if event[0] == "ADDED" and event[2]["metadata"]["name"] == fence:
                return seen


class RecordingWake(threading.Event):
    """A wake event whose timed waits return at once and are recorded: backoff without sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.waited = threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            return super().wait()
        with self.waited:
            self.waits.append(timeout)
            self.waited.notify_all()
        return self.is_set()

    def wait_for_waits(self, count: int) -> list[float]:
        with self.waited:
            assert self.waited.wait_for(lambda: len(self.waits) >= count, TIMEOUT), f"waits: {self.waits}"
            return list(self.waits)


@pytest.fixture
def fake() -> FakeListerWatcher:
    return FakeListerWatcher()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def make_informer(fake: FakeListerWatcher, recorder: Recorder) -> Iterator[Callable[..., Informer[Any]]]:
    """Build an informer on ``fake`` with ``recorder`` as handler; every informer started is stopped at the end."""
    made: list[tuple[Informer[Any], threading.Thread | None]] = []

    def make(*, start: bool = True, wake: threading.Event | None = None, **kwargs: Any) -> Informer[Any]:
        kwargs.setdefault("rng", random.Random(7))
        kwargs.setdefault("watch_timeout", (5, 10))
        informer: Informer[Any] = Informer("test", fake, **kwargs)
        informer.add_handler(recorder)
        thread = None
        if wake is not None:
            thread = threading.Thread(target=informer.run, args=(threading.Event(), wake), daemon=True)
            thread.start()
        elif start:
            thread = informer.start()
        made.append((informer, thread))
        return informer

    yield make
    for informer, thread in made:
        informer.stop()
        if thread is not None:
            thread.join(TIMEOUT)
            assert not thread.is_alive(), "the informer thread did not stop"


def test_initial_list_emits_added_for_each_object_then_synced(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    fake.add(configmap("a", x="1"))
    fake.add(configmap("b", x="2"))
    fake.add(configmap("node-1", namespace=None))
    informer = make_informer(start=False)
    assert not informer.has_synced()

    informer.start()

    assert informer.wait_synced(TIMEOUT)
    events = recorder.take(3)
    assert sorted((etype, new["metadata"]["name"]) for etype, _, new in events) == [
        ("ADDED", "a"), ("ADDED", "b"), ("ADDED", "node-1")]
    assert all(old is None for _, old, _ in events)
    assert sorted(informer.keys()) == ["default/a", "default/b", "node-1"]
    assert len(informer) == 3
    assert informer.get("default/b")["data"] == {"x": "2"}
    assert informer.get("default/missing") is None
    assert sorted(obj["metadata"]["name"] for obj in informer.list()) == ["a", "b", "node-1"]
    # The watch starts from the list's resourceVersion, with a timeout drawn from watch_timeout.
    stream = fake.wait_for_watches(1)
    assert stream.resource_version == "103"
    assert 5 <= stream.timeout_seconds <= 10
    assert fake.lists == 1 and informer.relists == 0


def test_watch_events_update_the_store_before_handlers_run(fake: FakeListerWatcher) -> None:
    seen_in_store: queue.Queue[tuple[EventType, Any, Any]] = queue.Queue()
    informer: Informer[Any] = Informer("test", fake, rng=random.Random(1))

    def handler(etype: EventType, old: Any, new: Any) -> None:
        key = object_key(new if new is not None else old)
        seen_in_store.put((etype, informer.get(key), new))

    informer.add_handler(handler)
    informer.start()
    try:
        assert informer.wait_synced(TIMEOUT)
        fake.wait_for_watches(1)
        fake.add(configmap("a", v="1"))
        fake.modify(configmap("a", v="2"))
        fake.delete("default/a")

        etype, stored, new = seen_in_store.get(timeout=TIMEOUT)
        assert etype == "ADDED" and stored == new and stored["data"] == {"v": "1"}
        etype, stored, new = seen_in_store.get(timeout=TIMEOUT)
        assert etype == "MODIFIED" and stored == new and stored["data"] == {"v": "2"}
        etype, stored, new = seen_in_store.get(timeout=TIMEOUT)
        assert etype == "DELETED" and stored is None and new is None
        assert informer.resource_version == fake.resource_version
    finally:
        informer.stop()


def test_modified_and_deleted_carry_the_old_object(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    informer = make_informer()
    assert informer.wait_synced(TIMEOUT)
    fake.wait_for_watches(1)
    fake.add(configmap("a", v="1"))
    fake.modify(configmap("a", v="2"))
    fake.delete("default/a")

    (added, modified, deleted) = recorder.take(3)
    assert added[0] == "ADDED" and added[1] is None
    assert modified[0] == "MODIFIED"
    assert modified[1]["data"] == {"v": "1"} and modified[2]["data"] == {"v": "2"}
    assert deleted[0] == "DELETED" and deleted[2] is None
    assert deleted[1]["data"] == {"v": "2"}  # the final state of the object
    assert len(informer) == 0


def test_bookmark_moves_the_resource_version_and_never_reaches_handlers(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    informer = make_informer()
    assert informer.wait_synced(TIMEOUT)
    fake.wait_for_watches(1)
    bookmark_rv = fake.bookmark()
    fake.drop_watch()

    second = fake.wait_for_watches(2)

    assert second.resource_version == bookmark_rv
    assert recorder.events.empty()
    fake.add(configmap("fence"))
    assert [e[0] for e in recorder.until_fence("fence")] == ["ADDED"]  # no bookmark among the events
    assert fake.lists == 1


def test_dropped_stream_rewatches_from_the_last_version_without_relisting(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    informer = make_informer()
    assert informer.wait_synced(TIMEOUT)
    fake.wait_for_watches(1)
    last = fake.add(configmap("a"))
    assert recorder.next()[0] == "ADDED"

    fake.drop_watch()
    between = fake.add(configmap("b"))  # lands after the old stream ended: the next watch must replay it
    second = fake.wait_for_watches(2)

    assert second.resource_version == last["metadata"]["resourceVersion"]
    etype, _, new = recorder.next()
    assert (etype, new["metadata"]["resourceVersion"]) == ("ADDED", between["metadata"]["resourceVersion"])
    fake.add(configmap("fence"))
    assert [e[2]["metadata"]["name"] for e in recorder.until_fence("fence")] == ["fence"]  # "b" came once
    assert fake.lists == 1 and informer.relists == 0
    assert sorted(informer.keys()) == ["default/a", "default/b", "default/fence"]


def _prepare_relist(fake: FakeListerWatcher, recorder: Recorder,
                    make_informer: Callable[..., Informer[Any]]) -> Informer[Any]:
    fake.add(configmap("keep", v="1"))
    fake.add(configmap("change", v="1"))
    fake.add(configmap("vanish", v="1"))
    informer = make_informer()
    assert informer.wait_synced(TIMEOUT)
    recorder.take(3)
    fake.wait_for_watches(1)
    # Changes the informer never hears about: only a relist can reveal them.
    fake.modify_silently(configmap("change", v="2"))
    fake.delete_silently("default/vanish")
    fake.add_silently(configmap("new", v="1"))
    return informer


def _assert_relist_events(informer: Informer[Any], fake: FakeListerWatcher, recorder: Recorder) -> None:
    fake.wait_for_lists(2)
    events = {new["metadata"]["name"] if new else old["metadata"]["name"]: (etype, old, new)
              for etype, old, new in recorder.take(3)}
    assert set(events) == {"change", "vanish", "new"}
    etype, old, new = events["change"]
    assert etype == "MODIFIED" and old["data"] == {"v": "1"} and new["data"] == {"v": "2"}
    etype, old, new = events["vanish"]
    assert etype == "DELETED" and new is None and old["data"] == {"v": "1"}  # the tombstone
    assert events["new"][0] == "ADDED"
    # "keep" did not change: nothing emitted for it. The watch resumes from the new list's version.
    assert fake.wait_for_watches(2).resource_version == fake.resource_version
    assert sorted(informer.keys()) == ["default/change", "default/keep", "default/new"]
    assert informer.relists == 1 and fake.lists == 2
    fake.add(configmap("fence"))
    assert [e[2]["metadata"]["name"] for e in recorder.until_fence("fence")] == ["fence"]


def test_gone_on_connect_relists_with_tombstones_and_modifications(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    informer = _prepare_relist(fake, recorder, make_informer)
    fake.expire_next_watch()
    fake.bookmark()  # an event, so the stream that now ends is not a "short" one
    fake.drop_watch()

    _assert_relist_events(informer, fake, recorder)


def test_in_stream_gone_relists(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    informer = _prepare_relist(fake, recorder, make_informer)
    fake.send_error(410)

    _assert_relist_events(informer, fake, recorder)


def test_errors_back_off_with_growing_jittered_delays_then_recover(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    clock = FakeClock()
    wake = RecordingWake()
    fake.add(configmap("a"))
    fake.fail_next_list()
    fake.fail_next_list(ApiError(0, "ConnectionRefused", "no route"))
    fake.fail_next_watch()
    informer = make_informer(wake=wake, clock=clock, backoff=(0.8, 30.0))

    assert informer.wait_synced(TIMEOUT)
    assert recorder.next()[0] == "ADDED"
    fake.wait_for_watches(1)
    waits = wake.wait_for_waits(3)
    # Equal jitter: the n-th wait lies in [d/2, d] with d = 0.8 * 2**n.
    for n, wait in enumerate(waits):
        assert 0.8 * 2**n / 2 <= wait <= 0.8 * 2**n, waits
    # The list failed twice, then succeeded; the failed watch was retried without a relist. Failed attempts
    # before the first successful list are not relists.
    assert fake.lists == 3
    assert informer.relists == 0

    # An in-stream error that is not 410: back off, then re-watch from the same version (no relist).
    last = fake.add(configmap("b"))
    recorder.next()
    fake.send_error(500, reason="InternalError", message="etcd trouble")
    second = fake.wait_for_watches(2)  # failed connects open no stream
    assert second.resource_version == last["metadata"]["resourceVersion"]
    assert 0.8 * 8 / 2 <= wake.wait_for_waits(4)[3] <= 0.8 * 8
    assert fake.lists == 3

    # After two healthy minutes the backoff starts again from its first step.
    clock.advance(121)
    fake.fail_next_watch()
    fake.bookmark()
    fake.drop_watch()
    fake.wait_for_watches(3)
    assert 0.4 <= wake.wait_for_waits(5)[4] <= 0.8

    # Everything still flows.
    fake.add(configmap("fence"))
    assert [e[2]["metadata"]["name"] for e in recorder.until_fence("fence")] == ["fence"]


def test_backoff_is_capped(fake: FakeListerWatcher, make_informer: Callable[..., Informer[Any]]) -> None:
    wake = RecordingWake()
    for _ in range(8):
        fake.fail_next_list()
    informer = make_informer(wake=wake, clock=FakeClock(), backoff=(1.0, 4.0))
    assert informer.wait_synced(TIMEOUT)
    waits = wake.wait_for_waits(8)
    assert all(w <= 4.0 for w in waits)
    assert all(w >= 2.0 for w in waits[2:])


def test_a_watch_that_ends_at_once_without_events_backs_off(
    fake: FakeListerWatcher, make_informer: Callable[..., Informer[Any]]
) -> None:
    wake = RecordingWake()
    informer = make_informer(wake=wake, clock=FakeClock())  # time stands still: every stream is "short"
    assert informer.wait_synced(TIMEOUT)
    fake.wait_for_watches(1)
    fake.drop_watch()
    fake.wait_for_watches(2)
    assert len(wake.wait_for_waits(1)) == 1
    assert fake.lists == 1


def test_a_failing_handler_does_not_stop_later_events_or_other_handlers(
    fake: FakeListerWatcher, recorder: Recorder
) -> None:
    calls: list[str] = []

    def explode(etype: EventType, old: Any, new: Any) -> None:
        calls.append(new["metadata"]["name"] if new else "deleted")
        raise RuntimeError("handler bug")

    informer: Informer[Any] = Informer("test", fake, rng=random.Random(1))
    informer.add_handler(explode)
    informer.add_handler(recorder)
    informer.start()
    try:
        assert informer.wait_synced(TIMEOUT)
        fake.wait_for_watches(1)
        fake.add(configmap("a"))
        fake.add(configmap("b"))
        assert [e[2]["metadata"]["name"] for e in recorder.take(2)] == ["a", "b"]
        assert calls == ["a", "b"]
        assert sorted(informer.keys()) == ["default/a", "default/b"]
        assert len(fake.watches) == 1 and fake.lists == 1  # no reconnect either
    finally:
        informer.stop()


def test_stop_closes_the_watch_and_the_thread_exits_promptly(
    fake: FakeListerWatcher, make_informer: Callable[..., Informer[Any]]
) -> None:
    informer = make_informer(start=False)
    thread = informer.start()
    assert informer.wait_synced(TIMEOUT)
    stream = fake.wait_for_watches(1)

    informer.stop()
    # The fake stream blocks for ever unless closed: a thread that ends at all ended because stop() closed it.
    thread.join(TIMEOUT)

    assert not thread.is_alive()
    assert stream.closed


def test_stop_during_backoff_is_prompt(fake: FakeListerWatcher, make_informer: Callable[..., Informer[Any]]) -> None:
    fake.fail_next_list()
    informer = make_informer(start=False, backoff=(60.0, 60.0))
    thread = informer.start()
    fake.wait_for_lists(1)

    informer.stop()
    thread.join(TIMEOUT)  # far less than the 60 s backoff: the thread ends only if stop() cut the wait short

    assert not thread.is_alive()
    assert not informer.has_synced()


def test_retry_now_ends_a_backoff_wait(fake: FakeListerWatcher, make_informer: Callable[..., Informer[Any]]) -> None:
    fake.fail_next_list(ApiError(401, "Unauthorized", "token revoked"))
    informer = make_informer(start=False, backoff=(60.0, 60.0))
    informer.start()
    fake.wait_for_lists(1)
    assert not informer.has_synced()  # waiting 30-60 s before listing again

    informer.retry_now()  # e.g. the credentials were replaced

    assert informer.wait_synced(TIMEOUT)
    assert fake.lists == 2


def test_start_twice_and_late_handlers_are_refused(make_informer: Callable[..., Informer[Any]]) -> None:
    informer = make_informer()
    with pytest.raises(RuntimeError):
        informer.start()
    with pytest.raises(RuntimeError):
        informer.add_handler(lambda etype, old, new: None)


def test_transform_is_applied_to_the_store_and_handlers_and_skipped_for_unchanged_objects(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    transformed: list[str] = []

    def slim(raw: dict[str, Any]) -> tuple[str, str]:
        transformed.append(raw["metadata"]["name"])
        return raw["metadata"]["name"], raw["data"].get("v", "")

    fake.add(configmap("a", v="1", big="x" * 1000))
    fake.add(configmap("b", v="1"))
    informer = make_informer(transform=slim)
    assert informer.wait_synced(TIMEOUT)

    assert sorted(recorder.take(2)) == [("ADDED", None, ("a", "1")), ("ADDED", None, ("b", "1"))]
    assert informer.get("default/a") == ("a", "1")
    before = informer.get("default/b")

    fake.modify_silently(configmap("a", v="2"))
    fake.send_error(410)
    assert recorder.next() == ("MODIFIED", ("a", "1"), ("a", "2"))
    fake.wait_for_watches(2)
    assert informer.get("default/b") is before  # unchanged on relist: the same object, not transformed again
    assert sorted(transformed) == ["a", "a", "b"]


def test_an_object_the_transform_rejects_counts_as_absent(
    fake: FakeListerWatcher, recorder: Recorder, make_informer: Callable[..., Informer[Any]]
) -> None:
    def strict(raw: dict[str, Any]) -> str:
        if raw["data"].get("bad"):
            raise ValueError("malformed")
        return str(raw["metadata"]["name"])

    fake.add(configmap("bad", bad="yes"))
    fake.add(configmap("good"))
    informer = make_informer(transform=strict)
    assert informer.wait_synced(TIMEOUT)
    assert recorder.next() == ("ADDED", None, "good")
    assert informer.keys() == ["default/good"]

    fake.modify(configmap("good", bad="now"))  # turns bad: gone from the store, handlers see a delete
    assert recorder.next() == ("DELETED", "good", None)
    fake.add(configmap("fence"))
    assert recorder.next() == ("ADDED", None, "fence")
    assert sorted(informer.keys()) == ["default/fence"]


def test_informers_of_one_server_reconnect_together() -> None:
    """After an outage the first informer to get an answer wakes the others, which would each wait up to their own
    backoff otherwise, and tells the group's listeners."""
    peers = Reconnects()
    told = threading.Event()
    peers.on_recovered(told.set)
    fakes = [FakeListerWatcher(), FakeListerWatcher()]
    for fake in fakes:
        fake.fail_next_list(ApiError(0, "ConnectionRefused", "the API server is down"))
    first, second = (Informer(f"peer{i}", fake, rng=random.Random(7), watch_timeout=(5, 10), backoff=(60.0, 60.0),
                              peers=peers) for i, fake in enumerate(fakes))
    first.start()
    second.start()
    try:
        for fake in fakes:
            fake.wait_for_lists(1)
        # Both wait out a backoff of 30-60 s. (Waited for: a failed list returns before its informer is in the
        # wait, and the first's recovery wakes only peers that are; on a loaded machine the second may not be yet.)
        wait_until(lambda: first.backing_off and second.backing_off, TIMEOUT, "both informers to back off")
        assert not first.has_synced() and not second.has_synced()
        assert not told.is_set()

        first.retry_now()  # its own backoff ends first: the server answers it

        assert second.wait_synced(TIMEOUT), "woken by the first, not left to its own backoff"
        assert first.wait_synced(TIMEOUT)
        assert told.wait(TIMEOUT)
        assert fakes[1].lists == 2
    finally:
        first.stop()
        second.stop()


class _Peer:
    """What Reconnects reads of a member: its name, whether its last request failed, and its wake-up."""

    def __init__(self, name: str, failing: bool) -> None:
        self.name, self.failing, self.woken = name, failing, 0

    def retry_now(self) -> None:
        self.woken += 1


def test_recovery_wakes_every_failing_peer_even_one_not_yet_in_its_backoff_wait() -> None:
    """A peer whose list has just failed but that has not reached its wait yet is woken too (retry_now makes that
    wait return at once); before, only peers already waiting were, and such a peer sat out its whole backoff.
    Healthy peers and the one that recovered are left alone."""
    peers = Reconnects()
    origin, failing, healthy = _Peer("origin", True), _Peer("failing", True), _Peer("healthy", False)
    for member in (origin, failing, healthy):
        peers.join(member)  # type: ignore[arg-type]
    peers.recovered(origin)  # type: ignore[arg-type]
    assert (origin.woken, failing.woken, healthy.woken) == (0, 1, 0)


def test_reuse_builds_from_the_stored_value_or_falls_back_to_the_transform(
    fake: FakeListerWatcher, make_informer: Callable[..., Informer[Any]]
) -> None:
    """An event whose costly part did not change (only a status) may be built from what is stored."""
    transformed: list[str] = []

    def transform(raw: dict[str, Any]) -> tuple[str, str]:
        transformed.append(raw["data"]["v"])
        return raw["data"]["spec"], raw["data"]["v"]

    def reuse(stored: tuple[str, str], raw: dict[str, Any]) -> tuple[str, str] | None:
        return (stored[0], raw["data"]["v"]) if raw["data"]["spec"] == stored[0] else None

    fake.add(configmap("a", spec="s1", v="1"))
    informer = make_informer(transform=transform, reuse=reuse)
    assert informer.wait_synced(TIMEOUT)
    fake.modify(configmap("a", spec="s1", v="2"))  # the same spec: reused
    fake.modify(configmap("a", spec="s2", v="3"))  # another spec: transformed
    wait_until(lambda: informer.get("default/a") == ("s2", "3"), TIMEOUT, "the second change in the store")
    assert transformed == ["1", "3"]
