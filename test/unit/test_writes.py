"""The write pool: per-key order, urgent work first, fair shares between tenants and keys, stepwise jobs, outcomes
handed back as queue keys."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mcad.k8s.writes import Writes
from mcad.model.keys import Written


class Keys:
    """Stands in for the work queue: records the keys added, and lets a test wait for them."""

    def __init__(self) -> None:
        self.added: list[Any] = []
        self.cond = threading.Condition()

    def add(self, key: Any) -> None:
        with self.cond:
            self.added.append(key)
            self.cond.notify_all()

    def wait_for(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.added) >= count, timeout=5), self.added

    def wait_for_key(self, key: Any) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.added, timeout=5), self.added


@pytest.fixture
def keys() -> Keys:
    return Keys()


def started_pool(keys: Keys, workers: int) -> Writes:
    pool = Writes(keys, workers=workers)
    pool.start()
    return pool


@pytest.fixture
def pool(keys: Keys) -> Iterator[Writes]:
    writes = started_pool(keys, 4)
    yield writes
    writes.close()


def test_threads_start_with_start_not_with_the_pool_and_only_once(keys: Keys) -> None:
    before = set(threading.enumerate())
    pool = Writes(keys, workers=3)
    assert set(threading.enumerate()) - before == set(), "constructing the pool starts no thread"
    pool.start()
    pool.start()
    started = set(threading.enumerate()) - before
    assert sorted(t.name for t in started) == ["mcad-write-0", "mcad-write-1", "mcad-write-2"]
    pool.close()
    assert not any(t.is_alive() for t in started)


def test_a_job_submitted_to_a_pool_never_started_raises_instead_of_waiting_for_ever(keys: Keys) -> None:
    pool = Writes(keys, workers=2)
    with pytest.raises(RuntimeError, match="not started"):
        pool.submit("a", lambda: 1, tenant="t")
    assert pool.idle() and keys.added == [], "nothing was queued"
    pool.start()
    pool.submit("a", lambda: 1, tenant="t")
    keys.wait_for(1)
    assert pool.results("a") == [1]
    pool.close()


def test_an_inline_pool_needs_no_start(keys: Keys) -> None:
    before = set(threading.enumerate())
    pool = Writes(keys, workers=0)
    pool.start()
    assert set(threading.enumerate()) - before == set()
    pool.submit("a", lambda: 7, tenant="t")
    assert pool.results("a") == [7]


def test_jobs_of_one_key_run_in_submission_order(pool: Writes, keys: Keys) -> None:
    ran: list[int] = []
    for i in range(50):
        pool.submit("aw", lambda i=i: ran.append(i) or i, tenant="t")
    keys.wait_for(50)
    assert ran == list(range(50))
    assert pool.results("aw") == list(range(50))
    assert pool.results("aw") == []


def test_outcomes_come_back_as_written_keys_and_exceptions_are_outcomes(pool: Writes, keys: Keys) -> None:
    def boom() -> None:
        raise RuntimeError("refused")

    pool.submit("a", boom, tenant="t")
    keys.wait_for(1)
    assert keys.added == [Written("a")]
    [outcome] = pool.results("a")
    assert isinstance(outcome, RuntimeError)


def behind_a_busy_worker(keys: Keys, submit: Callable[[Writes, list[str]], None], jobs: int) -> list[str]:
    """The order in which ``jobs`` jobs ran that ``submit(pool, order)`` queued while the one worker of the pool was
    held by another job: each job appends its name to ``order``. The pool is idle afterwards."""
    pool = started_pool(keys, 1)
    gate = threading.Event()
    started = threading.Event()
    order: list[str] = []
    try:
        pool.submit("busy", lambda: (started.set(), gate.wait(5)), tenant="t")
        assert started.wait(5)
        submit(pool, order)
        gate.set()
        keys.wait_for(jobs + 1)
        assert pool.idle()
        return order
    finally:
        pool.close()


def test_urgent_jobs_start_before_bookkeeping(keys: Keys) -> None:
    def submit(pool: Writes, order: list[str]) -> None:
        pool.submit("counts", lambda: order.append("counts"), tenant="t", urgent=False)
        pool.submit("dispatch", lambda: order.append("dispatch"), tenant="t")

    assert behind_a_busy_worker(keys, submit, 2) == ["dispatch", "counts"]


def test_a_key_busy_with_bookkeeping_yields_to_urgent_work_between_its_jobs(keys: Keys) -> None:
    def submit(pool: Writes, order: list[str]) -> None:
        pool.submit("busy", lambda: order.append("busy-counts"), tenant="t", urgent=False)
        pool.submit("b", lambda: order.append("b-dispatch"), tenant="t")

    assert behind_a_busy_worker(keys, submit, 2) == ["b-dispatch", "busy-counts"]


def test_an_urgent_job_lifts_the_bookkeeping_queued_before_it_on_its_key(keys: Keys) -> None:
    """A backlog's Pending statuses wait in the low lane; a dispatch of one of them must not wait behind
    all the others' (its own Pending write, before it on its key, goes first, in the urgent lane)."""
    def submit(pool: Writes, order: list[str]) -> None:
        pool.submit("b", lambda: order.append("b-pending"), tenant="t", urgent=False)
        pool.submit("a", lambda: order.append("a-pending"), tenant="t", urgent=False)
        pool.submit("a", lambda: order.append("a-dispatch"), tenant="t")

    assert behind_a_busy_worker(keys, submit, 3) == ["a-pending", "a-dispatch", "b-pending"]


def test_hurry_moves_a_waiting_key_to_the_urgent_lane(keys: Keys) -> None:
    def submit(pool: Writes, order: list[str]) -> None:
        pool.submit("b", lambda: order.append("b"), tenant="t", urgent=False)
        pool.submit("a", lambda: order.append("a"), tenant="t", urgent=False)
        pool.hurry("a")
        pool.hurry("a")  # again: still one run of its job (the stale entries are skipped)
        pool.hurry("unknown")  # no job: nothing to do

    assert behind_a_busy_worker(keys, submit, 2) == ["a", "b"]


def test_hurry_lifts_a_stepwise_job_waiting_between_its_steps(keys: Keys) -> None:
    pool = started_pool(keys, 1)
    trace = Trace(held=True)
    try:
        pool.submit("counts", trace.job("counts", 2), tenant="a", urgent=False)
        trace.wait_started(1)
        pool.submit("other", trace.job("other", 1), tenant="b", urgent=False)
        pool.submit("third", trace.job("third", 1), tenant="c", urgent=False)
        trace.release(1)  # counts' first step ends: it waits for its next turn in the low lane, behind b and c
        trace.wait_started(2)  # other's step runs
        pool.hurry("counts")
        trace.release(10**6)
        keys.wait_for(3)
        assert trace.started == ["counts", "other", "counts", "third"]
    finally:
        pool.close()


def test_inline_mode_runs_the_job_inside_submit(keys: Keys) -> None:
    pool = Writes(keys, workers=0)
    pool.submit("a", lambda: 42, tenant="t")
    assert keys.added == [Written("a")]
    assert pool.results("a") == [42]
    assert pool.idle()


class Trace:
    """Stepwise jobs whose steps record their start, in one list for all keys; with ``held``, each step then waits
    until the test lets one step end (``release``), so the test decides when a worker is free again."""

    def __init__(self, *, held: bool) -> None:
        self.held = held
        self.started: list[str] = []
        self.cond = threading.Condition()
        self.permits = 0
        self.running: dict[str, int] = {}

    def job(self, key: str, steps: int, result: Any = None, fail_at: int | None = None) -> Any:
        def run() -> Iterator[None]:
            for index in range(steps):
                if index:
                    yield  # a step ends between two requests
                self._step(key)
                if index == fail_at:
                    raise RuntimeError(f"{key} refused at step {index}")
            return result
        return run

    def _step(self, key: str) -> None:
        with self.cond:
            self.running[key] = self.running.get(key, 0) + 1
            assert self.running[key] == 1, f"two steps of {key} at once"
            self.started.append(key)
            self.cond.notify_all()
            if self.held:
                assert self.cond.wait_for(lambda: self.permits > 0, timeout=5), "never released"
                self.permits -= 1
            self.running[key] -= 1

    def release(self, steps: int) -> None:
        with self.cond:
            self.permits += steps
            self.cond.notify_all()

    def wait_started(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.started) >= count, timeout=5), self.started

    def step_by_step_until(self, key: str) -> None:
        """Let one held step end at a time (each frees one worker, which starts the next step) until ``key``
        has started."""
        while key not in self.started:
            count = len(self.started)
            self.release(1)
            self.wait_started(count + 1)


def test_a_tenant_arriving_while_another_holds_every_worker_starts_after_one_more_step(keys: Keys) -> None:
    workers = 3
    pool = started_pool(keys, workers)
    trace = Trace(held=True)
    try:
        for i in range(10):  # a big tenant: ten AppWrappers of 50 writes each
            pool.submit(f"big/{i}", trace.job(f"big/{i}", 50), tenant="big")
        trace.wait_started(workers)  # every worker is in the middle of one of them
        arrived = len(trace.started)
        pool.submit("small/aw", trace.job("small/aw", 1, result="dispatched"), tenant="small")
        trace.step_by_step_until("small/aw")
        ahead = trace.started[arrived:].index("small/aw")
        # The contract allows one step per worker; with one other tenant, it is at most one step in all.
        assert ahead <= 1, trace.started[arrived:]
        trace.release(10**6)
        keys.wait_for_key(Written("small/aw"))
        assert pool.results("small/aw") == ["dispatched"]
    finally:
        trace.release(10**6)
        pool.close()


def test_keys_of_one_tenant_take_turns_step_by_step(keys: Keys) -> None:
    pool = started_pool(keys, 1)
    trace = Trace(held=True)
    try:
        pool.submit("a1", trace.job("a1", 3), tenant="t")
        trace.wait_started(1)
        pool.submit("a2", trace.job("a2", 3), tenant="t")
        pool.submit("a3", trace.job("a3", 3), tenant="t")
        trace.release(10**6)
        keys.wait_for(3)
        assert trace.started == ["a1", "a2", "a3"] * 3
    finally:
        pool.close()


def test_within_a_tenant_higher_priority_keys_go_first_and_equals_take_turns(keys: Keys) -> None:
    pool = started_pool(keys, 1)
    trace = Trace(held=True)
    try:
        pool.submit("first", trace.job("first", 1), tenant="t")
        trace.wait_started(1)  # holds the only worker while the others queue
        pool.submit("low", trace.job("low", 1), tenant="t", priority=0)
        pool.submit("high-a", trace.job("high-a", 2), tenant="t", priority=10)
        pool.submit("high-b", trace.job("high-b", 2), tenant="t", priority=10)
        pool.submit("other", trace.job("other", 1), tenant="u", priority=-5)
        trace.release(10**6)
        keys.wait_for(5)
        # Tenants still take turns (u's low-priority key is not starved by t's); within t, priority 10 first,
        # its two keys in turn step by step, then priority 0.
        assert trace.started == ["first", "high-a", "other", "high-b", "high-a", "high-b", "low"], trace.started
    finally:
        pool.close()


def test_tenants_take_turns_whatever_their_number_of_keys(keys: Keys) -> None:
    pool = started_pool(keys, 1)
    trace = Trace(held=True)
    try:
        pool.submit("a1", trace.job("a1", 3), tenant="a")
        trace.wait_started(1)
        pool.submit("a2", trace.job("a2", 3), tenant="a")
        pool.submit("b1", trace.job("b1", 3), tenant="b")
        trace.release(10**6)
        keys.wait_for(3)
        # From b's arrival, the tenants alternate while both have work; a's two keys share a's turns.
        assert trace.started == ["a1", "a2", "b1", "a1", "b1", "a2", "b1", "a1", "a2"]
    finally:
        pool.close()


def test_jobs_of_one_key_run_whole_and_in_order_even_in_steps(pool: Writes, keys: Keys) -> None:
    trace = Trace(held=False)
    for i in range(8):
        pool.submit(f"other{i}", trace.job(f"other{i}", 5), tenant=f"t{i % 3}")
    order: list[str] = []
    pool.submit("aw", lambda: order.append("first") or (yield from trace.job("aw", 4, result="first")()),
                tenant="t0")
    pool.submit("aw", lambda: order.append("second") or "second", tenant="t0")
    pool.submit("aw", lambda: order.append("third") or (yield from trace.job("aw", 3, result="third")()),
                tenant="t0")
    keys.wait_for(11)
    assert order == ["first", "second", "third"]
    assert pool.results("aw") == ["first", "second", "third"]
    assert trace.started.count("aw") == 7


def test_a_step_that_raises_ends_its_job_and_the_next_job_of_the_key_runs(pool: Writes, keys: Keys) -> None:
    trace = Trace(held=False)
    pool.submit("aw", trace.job("aw", 5, fail_at=1), tenant="t")
    pool.submit("aw", trace.job("aw", 1, result="next"), tenant="t")
    keys.wait_for(2)
    failed, following = pool.results("aw")
    assert isinstance(failed, RuntimeError) and str(failed) == "aw refused at step 1"
    assert following == "next"
    assert trace.started == ["aw"] * 3


def test_urgent_steps_go_before_the_next_step_of_started_bookkeeping(keys: Keys) -> None:
    pool = started_pool(keys, 1)
    trace = Trace(held=True)
    try:
        pool.submit("counts", trace.job("counts", 3), tenant="a", urgent=False)
        trace.wait_started(1)
        pool.submit("more-counts", trace.job("more-counts", 1), tenant="b", urgent=False)
        pool.submit("dispatch", trace.job("dispatch", 2), tenant="c")
        trace.release(10**6)
        keys.wait_for(3)
        assert trace.started == ["counts", "dispatch", "dispatch", "more-counts", "counts", "counts"]
    finally:
        pool.close()


def test_close_finishes_the_jobs_started_and_starts_no_other(keys: Keys) -> None:
    pool = started_pool(keys, 1)
    trace = Trace(held=True)
    pool.submit("started", trace.job("started", 3, result="done"), tenant="a")
    trace.wait_started(1)
    pool.submit("queued", trace.job("queued", 1), tenant="b")
    closing = threading.Thread(target=pool.close)
    closing.start()
    trace.release(10**6)
    closing.join(timeout=5)
    assert not closing.is_alive()
    assert trace.started == ["started"] * 3
    assert pool.results("started") == ["done"]
    assert keys.added == [Written("started")]


def test_inline_mode_runs_every_step_inside_submit(keys: Keys) -> None:
    pool = Writes(keys, workers=0)
    trace = Trace(held=False)
    pool.submit("a", trace.job("a", 4, result="applied"), tenant="t")
    assert trace.started == ["a"] * 4
    assert keys.added == [Written("a")]
    assert pool.results("a") == ["applied"]
    assert pool.idle()
