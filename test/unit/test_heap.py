"""The start-up heap policy (mcad.cli.heap): the cyclic collector is off while the informers list, and once they have
synced (or the bound passed, or the controller stops) what they made is frozen and the collector is on again."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
import structlog

from mcad.cli.heap import StartupHeap
from test.fakes import FakeClock
from test.support import wait_until

made: list[StartupHeap] = []


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    yield
    for heap in made:
        heap.forget()
    made.clear()
    gc.enable()
    gc.unfreeze()  # the test process's objects go back to the oldest generation, as before


def startup_heap(*args: object, **kwargs: object) -> StartupHeap:
    made.append(StartupHeap(*args, **kwargs))  # type: ignore[arg-type]
    return made[-1]


def test_the_collector_is_off_until_the_informers_synced_then_the_start_up_is_frozen() -> None:
    synced = threading.Event()
    heap = startup_heap(synced.is_set, threading.Event())
    heap.pause()
    made = [[i] for i in range(1000)]  # what a list makes, tracked by the collector
    assert not gc.isenabled()
    synced.set()
    wait_until(gc.isenabled, 10, "the collector to be on again once synced")
    assert gc.get_freeze_count() >= len(made)


def test_a_list_that_never_ends_runs_without_the_collector_only_up_to_the_bound() -> None:
    heap = startup_heap(lambda: False, threading.Event(), bound_seconds=0.0)
    heap.pause()
    wait_until(gc.isenabled, 10, "the collector to be on again after the bound")


def test_a_stop_turns_the_collector_back_on() -> None:
    stop = threading.Event()
    heap = startup_heap(lambda: False, stop)
    heap.pause()
    assert not gc.isenabled()
    stop.set()
    wait_until(gc.isenabled, 10, "the collector to be on again once stopped")
    heap.settle()  # a second settle does nothing
    assert gc.isenabled()


def test_a_slow_collection_is_logged() -> None:
    clock = FakeClock()
    heap = startup_heap(lambda: True, threading.Event(), clock=clock)
    heap.settle()
    with structlog.testing.capture_logs() as logs:
        heap._timed("start", {"generation": 2})
        clock.advance(1.5)
        heap._timed("stop", {"generation": 2, "collected": 7})
        heap._timed("start", {"generation": 0})
        clock.advance(0.01)
        heap._timed("stop", {"generation": 0, "collected": 0})
    slow = [line for line in logs if line["event"] == "slow garbage collection"]
    assert [{k: v for k, v in line.items() if k != "frozen"} for line in slow] == [
        {"event": "slow garbage collection", "log_level": "warning", "seconds": 1.5, "generation": 2, "collected": 7}]
    assert slow[0]["frozen"] > 0, "its survivors were frozen"


def test_what_survives_a_slow_full_collection_is_frozen_and_a_fast_or_young_one_freezes_nothing() -> None:
    clock = FakeClock()
    heap = startup_heap(lambda: True, threading.Event(), clock=clock)
    heap.settle()

    def collection(generation: int, seconds: float) -> None:
        heap._timed("start", {"generation": generation})
        clock.advance(seconds)
        heap._timed("stop", {"generation": generation, "collected": 0})

    before = gc.get_freeze_count()
    survivors = [[i] for i in range(5000)]  # long-lived objects made after the start-up
    collection(2, 0.01)
    collection(0, 0.5)
    assert gc.get_freeze_count() < before + len(survivors), "neither a fast full nor a slow young one freezes"
    collection(2, 0.3)
    assert gc.get_freeze_count() >= before + len(survivors)
