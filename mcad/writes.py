"""API writes off the dispatcher thread: a small pool, one write at a time per AppWrapper, results as queue keys.

Contract:
- ``submit(key, job)`` runs ``job()`` on a worker thread. Jobs of the same key run one at a time, in submission
  order, so a later status never lands before an earlier one; jobs of different keys run in parallel (the API
  server, not this process, is the bottleneck of a dispatch, and it serves concurrent requests well).
- When a job ends, its outcome (the job's return value, or the exception it raised) is stored and the key
  ``("written", key)`` is added to the work queue; the dispatcher thread collects outcomes with ``results(key)``
  and stays the only writer of its own state. Outcomes of one key are returned in completion order.
- ``pending(key)`` says whether a job of that key is queued or running. ``close()`` waits for running jobs.
- ``workers=0`` runs each job inline, inside ``submit``: same outcomes and keys, no threads (for stepped tests).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import structlog

log = structlog.get_logger("mcad.writes")


class KeyQueue(Protocol):
    def add(self, key: Any) -> None: ...


class Writes:
    def __init__(self, queue: KeyQueue, *, workers: int = 8) -> None:
        self._queue = queue
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mcad-write") if workers else None
        self._lock = threading.Lock()
        self._waiting: dict[Hashable, deque[Callable[[], Any]]] = {}  # key -> jobs not started; present = busy
        self._outcomes: dict[Hashable, list[Any]] = {}

    def submit(self, key: Hashable, job: Callable[[], Any]) -> None:
        with self._lock:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.append(job)
                return
            self._waiting[key] = deque()
        if self._executor is None:
            self._run(key, job)
        else:
            self._executor.submit(self._run, key, job)

    def pending(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._waiting

    def results(self, key: Hashable) -> list[Any]:
        with self._lock:
            return self._outcomes.pop(key, [])

    def idle(self) -> bool:
        with self._lock:
            return not self._waiting

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def _run(self, key: Hashable, job: Callable[[], Any]) -> None:
        while True:
            try:
                outcome: Any = job()
            except Exception as err:  # handed to the dispatcher thread, which decides what it means
                outcome = err
            with self._lock:
                self._outcomes.setdefault(key, []).append(outcome)
                waiting = self._waiting[key]
                if waiting:
                    job = waiting.popleft()
                else:
                    del self._waiting[key]
                    job = None  # type: ignore[assignment]
            self._queue.add(("written", key))
            if job is None:
                return
