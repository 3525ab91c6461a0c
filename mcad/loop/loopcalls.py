"""Work other threads hand to a loop that owns its state: run there, between two keys, and answered by a future.

Contract:
- ``call(fn, timeout)`` from any thread queues ``fn`` and one ``CALL`` key; the loop, when it takes that key, runs
  ``run()``: every function handed in so far, in order, each result (or exception) given to its caller. The caller
  waits at most ``timeout`` (``TimeoutError``: the loop is busy or not running); a call whose caller stopped
  waiting is still run, and its result dropped.
- Used by /debug (``mcad.serve.snapshots``) to read the dispatcher's state on its own thread, never beside it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from mcad.k8s.workqueue import WorkQueue
from mcad.model.keys import CALL, Key

R = TypeVar("R")


class LoopCalls:
    def __init__(self, queue: WorkQueue[Key]) -> None:
        self._queue = queue
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()

    def call(self, fn: Callable[[], R], timeout: float) -> R:
        future: Future[R] = Future()
        self._calls.append((fn, future))  # deque.append is atomic: any thread may hand work in
        self._queue.add(CALL)
        return future.result(timeout)

    def run(self) -> None:
        """On the loop's thread."""
        while self._calls:
            fn, future = self._calls.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as err:  # the caller gets it; the loop goes on
                future.set_exception(err)
