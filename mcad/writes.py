"""API writes off the dispatcher thread: a small pool, one write at a time per AppWrapper, results as queue keys.

Contract:
- ``submit(key, job, urgent=...)`` runs ``job()`` on a worker thread. Jobs of the same key run one at a time, in
  submission order, so a later status never lands before an earlier one; jobs of different keys run in parallel
  (the API server, not this process, bounds a dispatch, and it serves concurrent requests well).
- Urgent jobs (dispatches, Failed and Backoff statuses) start before others (pod-count statuses): when the API
  server is the bottleneck, the next gang's creation must not wait behind bookkeeping of the last ones.
- When a job ends, its outcome (the job's return value, or the exception it raised) is stored and the key
  ``("written", key)`` is added to the work queue; the dispatcher thread collects outcomes with ``results(key)``
  and stays the only writer of its own state. Outcomes of one key are returned in completion order.
- ``pending(key)`` says whether a job of that key is queued or running. ``close()`` stops the workers after the
  jobs already started.
- ``workers=0`` runs each job inline, inside ``submit``: same outcomes and keys, no threads (for stepped tests).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Protocol

import structlog

log = structlog.get_logger("mcad.writes")
Job = Callable[[], Any]


class KeyQueue(Protocol):
    def add(self, key: Any) -> None: ...


class Writes:
    def __init__(self, queue: KeyQueue, *, workers: int = 8) -> None:
        self._queue = queue
        self._inline = workers == 0
        self._cond = threading.Condition()
        # Keys ready to start a job, by lane; each key is in at most one lane and only while it is not running.
        self._lanes: tuple[deque[Hashable], deque[Hashable]] = (deque(), deque())
        self._jobs: dict[Hashable, deque[tuple[bool, Job]]] = {}  # key -> its jobs not started; present = busy
        self._outcomes: dict[Hashable, list[Any]] = {}
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"mcad-write-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: Hashable, job: Job, *, urgent: bool = True) -> None:
        with self._cond:
            jobs = self._jobs.get(key)
            if jobs is not None:
                jobs.append((urgent, job))
                return
            self._jobs[key] = deque([(urgent, job)])
            if not self._inline:
                self._lanes[0 if urgent else 1].append(key)
                self._cond.notify()
                return
        self._run_inline(key)

    def pending(self, key: Hashable) -> bool:
        with self._cond:
            return key in self._jobs

    def idle(self) -> bool:
        with self._cond:
            return not self._jobs

    def results(self, key: Hashable) -> list[Any]:
        with self._cond:
            return self._outcomes.pop(key, [])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)

    def _run_inline(self, key: Hashable) -> None:
        while (job := self._next_job_of(key)) is not None:
            self._finish(key, _call(job))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._lanes[0] or self._lanes[1]):
                    self._cond.wait()
                if self._closed:
                    return
                key = (self._lanes[0] or self._lanes[1]).popleft()
                _, job = self._jobs[key].popleft()
            while True:
                self._finish(key, _call(job))
                with self._cond:
                    jobs = self._jobs[key]
                    if not jobs:
                        del self._jobs[key]
                        break
                    urgent, job = jobs[0]
                    if not urgent and self._lanes[0]:
                        # Its next job is bookkeeping while urgent work waits: requeue the key behind the others.
                        self._lanes[1].append(key)
                        self._cond.notify()
                        break
                    jobs.popleft()

    def _next_job_of(self, key: Hashable) -> Job | None:
        with self._cond:
            jobs = self._jobs[key]
            if not jobs:
                del self._jobs[key]
                return None
            return jobs.popleft()[1]

    def _finish(self, key: Hashable, outcome: Any) -> None:
        with self._cond:
            self._outcomes.setdefault(key, []).append(outcome)
        self._queue.add(("written", key))


def _call(job: Job) -> Any:
    try:
        return job()
    except Exception as err:  # handed to the dispatcher thread, which decides what it means
        return err
