"""The write pool: per-key order, urgent work first, outcomes handed back as queue keys."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mcad.writes import Writes


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


@pytest.fixture
def keys() -> Keys:
    return Keys()


@pytest.fixture
def pool(keys: Keys) -> Iterator[Writes]:
    writes = Writes(keys, workers=4)
    yield writes
    writes.close()


def test_jobs_of_one_key_run_in_submission_order(pool: Writes, keys: Keys) -> None:
    ran: list[int] = []
    for i in range(50):
        pool.submit("aw", lambda i=i: ran.append(i) or i)
    keys.wait_for(50)
    assert ran == list(range(50))
    assert pool.results("aw") == list(range(50))
    assert pool.results("aw") == []


def test_outcomes_come_back_as_written_keys_and_exceptions_are_outcomes(pool: Writes, keys: Keys) -> None:
    def boom() -> None:
        raise RuntimeError("refused")

    pool.submit("a", boom)
    keys.wait_for(1)
    assert keys.added == [("written", "a")]
    [outcome] = pool.results("a")
    assert isinstance(outcome, RuntimeError)


def test_urgent_jobs_start_before_bookkeeping(keys: Keys) -> None:
    pool = Writes(keys, workers=1)
    gate = threading.Event()
    started = threading.Event()
    order: list[str] = []
    try:
        pool.submit("busy", lambda: (started.set(), gate.wait(5)))
        assert started.wait(5)
        pool.submit("counts", lambda: order.append("counts"), urgent=False)
        pool.submit("dispatch", lambda: order.append("dispatch"))
        gate.set()
        keys.wait_for(3)
        assert order == ["dispatch", "counts"]
    finally:
        pool.close()


def test_a_key_busy_with_bookkeeping_yields_to_urgent_work_between_its_jobs(keys: Keys) -> None:
    pool = Writes(keys, workers=1)
    gate = threading.Event()
    started = threading.Event()
    order: list[str] = []
    try:
        pool.submit("a", lambda: (started.set(), gate.wait(5)))
        assert started.wait(5)
        pool.submit("a", lambda: order.append("a-counts"), urgent=False)
        pool.submit("b", lambda: order.append("b-dispatch"))
        gate.set()
        keys.wait_for(3)
        assert order == ["b-dispatch", "a-counts"]
    finally:
        pool.close()


def test_inline_mode_runs_the_job_inside_submit(keys: Keys) -> None:
    pool = Writes(keys, workers=0)
    pool.submit("a", lambda: 42)
    assert keys.added == [("written", "a")]
    assert pool.results("a") == [42]
    assert pool.idle()
