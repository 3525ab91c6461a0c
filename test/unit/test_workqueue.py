"""The work queue keeps client-go's guarantees: FIFO, deduplication, no key processed twice at once, delays that only
move earlier, exponential retries, and a shutdown that wakes and drains. Time is a fake clock unless a test says
otherwise; tests with threads wait on events with a deadline, never on a sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mcad.k8s.workqueue import ExponentialRateLimiter, WorkQueue

DEADLINE = 5.0  # seconds a thread-based test waits for something that should happen at once


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self._monotonic = start
        self._wall = datetime(2024, 1, 1, tzinfo=UTC)

    def monotonic(self) -> float:
        return self._monotonic

    def now(self) -> datetime:
        return self._wall

    def step(self, seconds: float) -> None:
        self._monotonic += seconds
        self._wall += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def queue(clock: FakeClock) -> WorkQueue[str]:
    return WorkQueue(clock=clock, name="test")


def drain(queue: WorkQueue[Any]) -> list[Any]:
    """Take every ready key without blocking, marking each done."""
    taken: list[Any] = []
    while True:
        key, _ = queue.get(timeout=0)
        if key is None:
            return taken
        taken.append(key)
        queue.done(key)


def in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


# -- ready keys ---------------------------------------------------------------------------------------------------


def test_keys_come_out_in_the_order_they_were_added(queue: WorkQueue[str]) -> None:
    for key in ("a", "b", "c"):
        queue.add(key)
    assert [queue.get(timeout=0) for _ in range(3)] == [("a", False), ("b", False), ("c", False)]
    for key in ("a", "b", "c"):
        queue.done(key)
    assert queue.get(timeout=0) == (None, False)


def test_repeated_adds_of_a_queued_key_collapse_into_one(queue: WorkQueue[str]) -> None:
    queue.add("a")
    queue.add("b")
    queue.add("a")
    queue.add("a")
    assert len(queue) == 2
    assert drain(queue) == ["a", "b"]


def test_a_key_added_while_processing_is_queued_again_exactly_once_after_done(queue: WorkQueue[str]) -> None:
    queue.add("a")
    key, _ = queue.get(timeout=0)
    assert key == "a"
    queue.add("a")
    queue.add("a")
    assert queue.get(timeout=0) == (None, False), "the key must not be handed out while it is processing"
    queue.done("a")
    assert drain(queue) == ["a"]


class Urgent(str):
    """A key type the queue below hands out ahead of the rest."""


def urgent_queue(clock: FakeClock) -> WorkQueue[str]:
    return WorkQueue(clock=clock, name="test", urgent=frozenset({Urgent}))


def test_urgent_keys_come_out_before_older_ones_in_their_own_order(clock: FakeClock) -> None:
    queue = urgent_queue(clock)
    for key in ("a", Urgent("x"), "b", Urgent("y"), "c"):
        queue.add(key)
    assert len(queue) == 5
    assert drain(queue) == ["x", "y", "a", "b", "c"]


def test_an_urgent_key_keeps_the_guarantees_of_any_key(clock: FakeClock) -> None:
    queue = urgent_queue(clock)
    queue.add("a")
    queue.add(Urgent("x"))
    queue.add(Urgent("x"))  # collapses
    key, _ = queue.get(timeout=0)
    assert key == "x" and type(key) is Urgent
    queue.add(Urgent("x"))  # while processing: queued again once, after done
    assert queue.get(timeout=0) == ("a", False), "not handed out twice at once"
    queue.done("x")
    queue.done("a")
    assert drain(queue) == ["x"]


def test_a_delayed_urgent_key_goes_ahead_when_it_comes_due(clock: FakeClock) -> None:
    queue = urgent_queue(clock)
    queue.add_after(Urgent("x"), 1.0)
    queue.add("a")
    clock.step(1.0)
    assert drain(queue) == ["x", "a"]


def test_without_urgent_types_every_key_is_first_in_first_out(queue: WorkQueue[str]) -> None:
    for key in ("a", Urgent("x"), "b"):
        queue.add(key)
    assert drain(queue) == ["a", "x", "b"]


def test_done_twice_does_not_duplicate_a_queued_key(queue: WorkQueue[str]) -> None:
    queue.add("a")
    queue.get(timeout=0)
    queue.done("a")
    queue.add("a")
    queue.done("a")  # misuse: no get() in between
    assert len(queue) == 1


def test_a_key_is_never_handed_to_two_getters_at_once(queue: WorkQueue[str]) -> None:
    first_has_it = threading.Event()
    release_first = threading.Event()
    second_result: list[tuple[str | None, bool]] = []
    second_done = threading.Event()

    def first() -> None:
        key, _ = queue.get(timeout=DEADLINE)
        assert key == "a"
        first_has_it.set()
        release_first.wait(DEADLINE)
        queue.done("a")

    def second() -> None:
        second_result.append(queue.get(timeout=DEADLINE))
        second_done.set()

    queue.add("a")
    t1 = in_thread(first)
    assert first_has_it.wait(DEADLINE)
    queue.add("a")  # dirty while processing
    t2 = in_thread(second)
    # The second getter must still be blocked: its only candidate is being processed.
    assert not second_done.wait(0.1)
    release_first.set()
    assert second_done.wait(DEADLINE)
    assert second_result == [("a", False)]
    t1.join(DEADLINE)
    t2.join(DEADLINE)


def test_concurrent_workers_never_process_the_same_key_together() -> None:
    queue: WorkQueue[int] = WorkQueue()
    in_flight: set[int] = set()
    guard = threading.Lock()
    overlaps: list[int] = []
    processed = 0

    def worker() -> None:
        nonlocal processed
        while True:
            key, shutting_down = queue.get()
            if shutting_down:
                return
            assert key is not None
            with guard:
                if key in in_flight:
                    overlaps.append(key)
                in_flight.add(key)
                processed += 1
            queue.add(key)  # an event for the key arrives while it is processed
            with guard:
                in_flight.discard(key)
            queue.done(key)

    workers = [in_thread(worker) for _ in range(4)]
    for i in range(2000):
        queue.add(i % 5)
    assert queue.shutdown_with_drain(DEADLINE)
    for thread in workers:
        thread.join(DEADLINE)
    assert overlaps == []
    assert processed >= 5


def test_get_blocks_until_a_key_is_added(queue: WorkQueue[str]) -> None:
    got: list[tuple[str | None, bool]] = []
    returned = threading.Event()

    def getter() -> None:
        got.append(queue.get(timeout=DEADLINE))
        returned.set()

    thread = in_thread(getter)
    assert not returned.wait(0.05)
    queue.add("a")
    assert returned.wait(DEADLINE)
    assert got == [("a", False)]
    thread.join(DEADLINE)


def test_get_with_a_timeout_returns_none_when_nothing_comes(queue: WorkQueue[str]) -> None:
    assert queue.get(timeout=0.01) == (None, False)


# -- shutdown -----------------------------------------------------------------------------------------------------


def test_shutdown_wakes_a_blocked_get_which_returns_none_and_true(queue: WorkQueue[str]) -> None:
    got: list[tuple[str | None, bool]] = []
    returned = threading.Event()

    def getter() -> None:
        got.append(queue.get())
        returned.set()

    thread = in_thread(getter)
    assert not returned.wait(0.05)
    queue.shutdown()
    assert returned.wait(DEADLINE)
    assert got == [(None, True)]
    thread.join(DEADLINE)


def test_adds_after_shutdown_are_ignored(queue: WorkQueue[str]) -> None:
    queue.shutdown()
    queue.add("a")
    queue.add_after("b", 1.0)
    queue.add_rate_limited("c")
    assert len(queue) == 0
    assert queue.waiting_count() == 0
    assert queue.get(timeout=0) == (None, True)
    assert queue.shutting_down()


def test_keys_queued_before_shutdown_are_still_handed_out(queue: WorkQueue[str]) -> None:
    queue.add("a")
    queue.shutdown()
    assert queue.get(timeout=0) == ("a", False)
    assert queue.get(timeout=0) == (None, True)


def test_shutdown_drops_delayed_keys(queue: WorkQueue[str], clock: FakeClock) -> None:
    queue.add_after("a", 1.0)
    queue.shutdown()
    clock.step(2.0)
    assert queue.waiting_count() == 0
    assert queue.get(timeout=0) == (None, True)


def test_shutdown_with_drain_waits_for_processing_to_finish(queue: WorkQueue[str]) -> None:
    queue.add("a")
    key, _ = queue.get(timeout=0)
    assert key == "a"
    drained: list[bool] = []
    returned = threading.Event()

    def drainer() -> None:
        drained.append(queue.shutdown_with_drain(DEADLINE))
        returned.set()

    thread = in_thread(drainer)
    assert not returned.wait(0.05), "drain returned while a key was still processing"
    queue.done("a")
    assert returned.wait(DEADLINE)
    assert drained == [True]
    thread.join(DEADLINE)


def test_shutdown_with_drain_reports_a_timeout(queue: WorkQueue[str]) -> None:
    queue.add("a")
    queue.get(timeout=0)
    assert queue.shutdown_with_drain(timeout=0.01) is False


def test_shutdown_with_drain_returns_at_once_when_nothing_is_processing(queue: WorkQueue[str]) -> None:
    assert queue.shutdown_with_drain(timeout=0) is True


# -- delayed keys -------------------------------------------------------------------------------------------------


def test_a_delayed_key_is_not_ready_before_its_time_and_is_ready_after(
    queue: WorkQueue[str], clock: FakeClock
) -> None:
    queue.add_after("a", 10.0)
    clock.step(9.9)
    assert queue.get(timeout=0) == (None, False)
    clock.step(0.1)
    assert queue.get(timeout=0) == ("a", False)


def test_readding_a_waiting_key_with_a_later_delay_does_not_postpone_it(
    queue: WorkQueue[str], clock: FakeClock
) -> None:
    queue.add_after("a", 5.0)
    queue.add_after("a", 50.0)
    clock.step(5.0)
    assert drain(queue) == ["a"]
    clock.step(100.0)
    assert drain(queue) == [], "the later request was merged into the earlier one"


def test_readding_a_waiting_key_with_an_earlier_delay_moves_it_earlier(
    queue: WorkQueue[str], clock: FakeClock
) -> None:
    queue.add_after("a", 50.0)
    queue.add_after("a", 5.0)
    assert queue.waiting_count() == 1
    clock.step(5.0)
    assert drain(queue) == ["a"]
    clock.step(100.0)
    assert drain(queue) == [], "the superseded due time must not fire again"


def test_a_delay_of_zero_or_less_adds_at_once(queue: WorkQueue[str]) -> None:
    queue.add_after("a", 0)
    queue.add_after("b", -1.0)
    assert queue.waiting_count() == 0
    assert drain(queue) == ["a", "b"]


def test_a_delayed_add_of_an_already_queued_key_does_not_duplicate_it(
    queue: WorkQueue[str], clock: FakeClock
) -> None:
    queue.add("a")
    queue.add_after("a", 1.0)
    clock.step(1.0)
    assert len(queue) == 1
    assert drain(queue) == ["a"]


def test_delayed_keys_become_ready_in_order_of_due_time_then_of_adding(
    queue: WorkQueue[str], clock: FakeClock
) -> None:
    queue.add_after("late", 3.0)
    queue.add_after("tie-1", 2.0)
    queue.add_after("early", 1.0)
    queue.add_after("tie-2", 2.0)
    clock.step(3.0)
    assert drain(queue) == ["early", "tie-1", "tie-2", "late"]


def test_a_delayed_key_that_comes_due_while_processing_waits_for_done(
    queue: WorkQueue[str], clock: FakeClock
) -> None:
    queue.add("a")
    queue.get(timeout=0)
    queue.add_after("a", 1.0)
    clock.step(1.0)
    assert queue.get(timeout=0) == (None, False)
    queue.done("a")
    assert drain(queue) == ["a"]


def test_len_counts_ready_keys_and_waiting_count_counts_delayed_keys(
    queue: WorkQueue[str], clock: FakeClock
) -> None:
    queue.add("a")
    queue.add("b")
    queue.add_after("c", 1.0)
    queue.add_after("d", 2.0)
    assert (len(queue), queue.waiting_count()) == (2, 2)
    clock.step(1.0)
    assert (len(queue), queue.waiting_count()) == (3, 1)
    queue.get(timeout=0)
    assert (len(queue), queue.waiting_count()) == (2, 1)


def test_a_blocked_get_wakes_for_a_delayed_key_on_the_real_clock() -> None:
    queue: WorkQueue[str] = WorkQueue()
    start = time.monotonic()
    got: list[tuple[str | None, bool]] = []
    returned = threading.Event()

    def getter() -> None:
        got.append(queue.get())  # no timeout: only the key's due time can end this wait
        returned.set()

    queue.add_after("a", 0.05)
    thread = in_thread(getter)
    # The deadline bounds a hang only (a loaded machine may run the getter late): no upper bound on the time taken.
    assert returned.wait(DEADLINE), "get() slept past the key's due time"
    assert got == [("a", False)]
    assert time.monotonic() - start >= 0.05, "not before it was due"
    thread.join(DEADLINE)


def test_a_sleeping_get_is_woken_when_an_earlier_delay_is_added() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("slow", 30.0)
    got: list[tuple[str | None, bool]] = []
    returned = threading.Event()

    def getter() -> None:
        got.append(queue.get(timeout=DEADLINE))
        returned.set()

    thread = in_thread(getter)
    assert not returned.wait(0.05)
    queue.add_after("fast", 0.05)
    assert returned.wait(DEADLINE), "the getter kept sleeping towards the 30 s due time"
    assert got == [("fast", False)]
    thread.join(DEADLINE)


def test_a_key_due_centuries_ahead_does_not_kill_a_sleeping_get() -> None:
    """Condition.wait refuses timeouts beyond threading.TIMEOUT_MAX; a getter must sleep, not raise."""
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("never", 1e12)
    got: list[tuple[str | None, bool]] = []
    errors: list[BaseException] = []
    returned = threading.Event()

    def getter() -> None:
        try:
            got.append(queue.get())
        except BaseException as err:  # the test reports what would have killed the thread
            errors.append(err)
        returned.set()

    thread = in_thread(getter)
    assert not returned.wait(0.05), f"get() returned early: {got or errors}"
    queue.add("now")
    assert returned.wait(DEADLINE), "the getter did not wake for a ready key"
    assert (got, errors) == ([("now", False)], [])
    thread.join(DEADLINE)


def NO_JITTER() -> float:  # every delay its full length
    return 1.0


# -- rate limiting ------------------------------------------------------------------------------------------------


def test_exponential_limiter_doubles_from_the_base_delay_and_forget_resets_it() -> None:
    limiter = ExponentialRateLimiter(base_delay=0.005, max_delay=0.03, draw=NO_JITTER)
    assert [limiter.when("a") for _ in range(5)] == [0.005, 0.01, 0.02, 0.03, 0.03]
    assert limiter.when("b") == 0.005, "each key backs off on its own"
    limiter.forget("a")
    assert limiter.when("a") == 0.005


def test_exponential_limiter_exact_delays_with_the_defaults() -> None:
    limiter = ExponentialRateLimiter(draw=NO_JITTER)
    assert [limiter.when("a") for _ in range(4)] == [0.005, 0.01, 0.02, 0.04]


def test_exponential_limiter_stays_at_the_cap_after_many_failures() -> None:
    limiter = ExponentialRateLimiter(base_delay=0.005, max_delay=300.0, draw=NO_JITTER)
    delays = [limiter.when("a") for _ in range(2000)]
    assert delays[-1] == 300.0
    assert limiter.num_requeues("a") == 2000


def test_exponential_limiter_jitters_each_delay_into_its_upper_half() -> None:
    """Keys that failed in the same cycle must not come back in step: each delay is drawn from [d/2, d]."""
    draws = iter([0.0, 0.5, 0.999])
    limiter = ExponentialRateLimiter(base_delay=1.0, max_delay=300.0, draw=lambda: next(draws))
    assert [limiter.when(key) for key in ("a", "b", "c")] == pytest.approx([0.5, 0.75, 0.9995])


def test_exponential_limiter_rejects_negative_delays() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        ExponentialRateLimiter(base_delay=-1.0)


def test_add_rate_limited_delays_a_key_by_its_backoff(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock, rate_limiter=ExponentialRateLimiter(base_delay=1.0, draw=NO_JITTER))
    queue.add_rate_limited("a")  # due in 1 s
    clock.step(0.5)
    assert drain(queue) == []
    clock.step(0.5)
    assert drain(queue) == ["a"]
    queue.add_rate_limited("a")  # due in 2 s
    clock.step(1.5)
    assert drain(queue) == []
    clock.step(0.5)
    assert drain(queue) == ["a"]


def test_num_requeues_counts_rate_limited_adds_until_forget(queue: WorkQueue[str]) -> None:
    assert queue.num_requeues("a") == 0
    queue.add_rate_limited("a")
    queue.add_rate_limited("a")
    assert queue.num_requeues("a") == 2
    assert queue.num_requeues("b") == 0
    queue.forget("a")
    assert queue.num_requeues("a") == 0


def test_cycle_timers_each_fire_never_early_and_one_per_tick(clock: FakeClock) -> None:
    from mcad.loop.tools import cycle_after
    from mcad.model.keys import CYCLE_TICK_SECONDS, CycleDue

    q: WorkQueue[object] = WorkQueue(clock=clock)
    cycle_after(q, clock.monotonic(), 1.0)
    cycle_after(q, clock.monotonic(), 5.0 + CYCLE_TICK_SECONDS * 0.2)  # later: kept beside the earlier one
    cycle_after(q, clock.monotonic(), 5.0 + CYCLE_TICK_SECONDS * 0.5)  # the same tick: one cycle
    clock.step(0.999)
    assert drain(q) == [], "never early"
    clock.step(0.001)
    assert [type(k) for k in drain(q)] == [CycleDue]
    clock.step(3.99)
    assert drain(q) == []
    clock.step(0.02)
    assert [type(k) for k in drain(q)] == [CycleDue], "the later timer fires too, once"
    clock.step(10)
    assert drain(q) == []
