"""API writes off the dispatcher thread: a small pool shared fairly between tenants, one write at a time per
AppWrapper, results as queue keys.

Contract:
- ``submit(key, job, tenant=..., urgent=...)`` runs ``job()`` on a worker thread. Jobs of the same key run one at
  a time, in submission order, so a later status never lands before an earlier one; jobs of different keys run in
  parallel (the API server, not this process, bounds a dispatch, and it serves concurrent requests well).
- A job may work in steps: when ``job()`` returns a generator, the pool runs it one step at a time (from one
  ``yield`` to the next; each step should be one API request, see ``mcad.k8s.apply.Steps``), and the generator's
  return value is the job's outcome. Between two steps the key goes back into the rotation below, so a job of 500
  requests holds a worker for one request at a time, not for all 500. Any other return value is the outcome of a
  one-step job.
- Fair shares: ready keys wait in two lanes (urgent, then low); within a lane, workers take tenants in turn
  (round-robin) and, within a tenant, its keys in turn, higher ``priority`` first (the AppWrapper's: when writes
  are the bottleneck, the dispatch order must not be lost in the write queue behind hundreds of lower-priority
  dispatches and statuses). The tenant is the submitter's to say (an AppWrapper's
  namespace). A tenant whose job arrives while others' long jobs hold every worker has at most one step of each
  of those tenants start ahead of its first: with one noisy tenant, it starts when the second running step ends.
  One tenant's many AppWrappers share its turn instead of multiplying it.
- Urgent jobs (dispatches, Failed and requeue statuses) start before others (pod-count statuses, the Pending
  status of a queued AppWrapper): when the API server is the bottleneck, the next gang's creation must not wait
  behind bookkeeping of the last ones, nor a new AppWrapper's dispatch behind the Pending statuses of a backlog
  of 100,000 the controller just found. A key is in the urgent lane when any of its jobs is urgent (its jobs run
  in order, so the ones before an urgent job inherit its lane and priority), decided again after every step and
  when an urgent job arrives; ``hurry(key)`` makes every job of the key urgent (the status its low write will
  send turned into a dispatch).
- When a job ends, its outcome (the job's return value, or the exception it raised, in any step) is stored and
  the key ``mcad.model.keys.Written(key)`` is added to the work queue; the dispatcher thread collects outcomes with
  ``results(key)`` and stays the only writer of its own state. Outcomes of one key are returned in completion
  order.
- ``pending(key)`` says whether a job of that key is queued or running (between its steps too). ``close()`` starts
  no more jobs; the workers finish the jobs already started (all their steps), within 30 s in all.
- Constructing the pool starts no thread: ``start()`` starts the workers (idempotent, and a no-op with
  ``workers=0``), so whoever wires the pool decides when threads run. ``submit`` on a pool with workers that was
  never started raises ``RuntimeError`` instead of queueing a job nobody would run.
- ``workers=0`` runs each job inline, inside ``submit``, every step to the end: same outcomes and keys, no threads
  (for stepped tests).

Bounds: ``workers`` threads. The pool holds, per job not finished, one small entry (its callable, tenant and lane)
and copies nothing; a started stepwise job also holds its generator's state (a dispatch keeps the names and uids
of what it applied, not the manifests). How many jobs are queued is up to the submitters: the dispatcher queues a
dispatch per AppWrapper it admitted and a status write per state change, so the queue is bounded by the number of
AppWrappers times the writes pending for each.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from mcad.model.keys import Written

log = structlog.get_logger("mcad.k8s.writes")
Job = Callable[[], Any]
CLOSE_TIMEOUT_SECONDS = 30.0


class KeyQueue(Protocol):
    def add(self, key: Any) -> None: ...


@dataclass
class _Job:
    fn: Job
    tenant: str
    urgent: bool
    priority: int = 0


@dataclass
class _Key:
    """The jobs of one key: the one under way (with its generator once it proves stepwise) and those not started."""

    queued: deque[_Job] = field(default_factory=deque)
    current: _Job | None = None
    steps: Generator[Any, Any, Any] | None = None

    def head(self) -> _Job:
        return self.current if self.current is not None else self.queued[0]


class _Lane:
    """Ready keys of one lane: a rotation of tenants, each with its keys by priority, in turn among equals.

    An entry can go stale (its key was moved to the other lane): ``pop`` skips the entries ``valid`` refuses."""

    def __init__(self) -> None:
        self._tenants: deque[str] = deque()
        self._keys: dict[str, list[tuple[int, int, str]]] = {}  # tenant -> heap of (-priority, arrival, key)
        self._arrivals = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._tenants)

    def push(self, tenant: str, key: str, priority: int = 0) -> int:
        """Returns the entry's token, which ``pop`` hands to ``valid``."""
        keys = self._keys.get(tenant)
        if keys is None:
            self._keys[tenant] = keys = []
            self._tenants.append(tenant)
        token = next(self._arrivals)
        heapq.heappush(keys, (-priority, token, key))
        return token

    def pop(self, valid: Callable[[str, int], bool]) -> str | None:
        """The next key in turn, or None when only stale entries were left."""
        while self._tenants:
            tenant = self._tenants.popleft()
            keys = self._keys[tenant]
            found = None
            while keys and found is None:
                _, token, key = heapq.heappop(keys)
                if valid(key, token):
                    found = key
            if keys:
                self._tenants.append(tenant)  # its other keys wait for its next turn, behind the other tenants
            else:
                del self._keys[tenant]
            if found is not None:
                return found
        return None


class Writes:
    def __init__(self, queue: KeyQueue, *, workers: int = 8) -> None:
        self._queue = queue
        self._inline = workers == 0
        self._cond = threading.Condition()
        # Keys ready for their next step, by lane; a key is in at most one lane, and only while no step of it runs.
        self._lanes: tuple[_Lane, _Lane] = (_Lane(), _Lane())
        self._waiting: dict[str, tuple[int, int]] = {}  # key -> (its lane, its entry's token) while in a lane
        self._keys: dict[str, _Key] = {}  # present = busy (a job queued or under way)
        self._outcomes: dict[str, list[Any]] = {}
        self._closed = False
        self._workers = workers
        self._started = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the worker threads; again, or with ``workers=0``, nothing happens."""
        with self._cond:
            if self._started:
                return
            self._started = True
            self._threads = [threading.Thread(target=self._work, name=f"mcad-write-{i}", daemon=True)
                             for i in range(self._workers)]
            # Under the lock, so that close() never sees a thread not started yet (Thread.start returns once the
            # thread runs, before it first waits for this lock).
            for thread in self._threads:
                thread.start()

    def submit(self, key: str, job: Job, *, tenant: str, urgent: bool = True, priority: int = 0) -> None:
        with self._cond:
            if not self._inline and not self._started:
                raise RuntimeError(f"write pool not started: submit({key!r}) would never run; call start() first")
            state = self._keys.get(key)
            if state is not None:
                state.queued.append(_Job(job, tenant, urgent, priority))
                self._relane(key, state)
                return
            self._keys[key] = state = _Key(deque([_Job(job, tenant, urgent, priority)]))
            if not self._inline:
                self._ready(key, state)
                return
        self._run_inline(key)

    def hurry(self, key: str) -> None:
        """Every job of ``key`` not finished becomes urgent (a decision that must not wait behind bookkeeping
        was made while a low job of the key waits): the key moves to the urgent lane if it waits in the low one."""
        with self._cond:
            state = self._keys.get(key)
            if state is None:
                return
            for job in (state.current, *state.queued):
                if job is not None:
                    job.urgent = True
            self._relane(key, state)

    def pending(self, key: str) -> bool:
        with self._cond:
            return key in self._keys

    def idle(self) -> bool:
        with self._cond:
            return not self._keys

    def results(self, key: str) -> list[Any]:
        with self._cond:
            return self._outcomes.pop(key, [])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + CLOSE_TIMEOUT_SECONDS
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------------------------------ internals

    def _ready(self, key: str, state: _Key, *, wake: bool = True) -> None:
        """Lock held: put a busy key back in the rotation, under its head job's tenant, in the urgent lane if any
        of its jobs is urgent (its jobs run in order: an urgent one waits for those before it, which so inherit
        its lane and its priority). ``wake`` False: the caller is a worker that takes the next key itself before it
        lets go of the lock, so no other worker need wake for this one."""
        jobs = [job for job in (state.current, *state.queued) if job is not None]
        lane = 0 if any(job.urgent for job in jobs) else 1
        head = state.head()
        token = self._lanes[lane].push(head.tenant, key, max(job.priority for job in jobs))
        self._waiting[key] = (lane, token)
        if wake:
            self._cond.notify()

    def _relane(self, key: str, state: _Key) -> None:
        """Lock held: a key waiting in the low lane whose jobs now include an urgent one moves to the urgent lane
        (its low entry goes stale)."""
        if self._waiting.get(key, (0, 0))[0] == 1 and any(
                job.urgent for job in (state.current, *state.queued) if job is not None):
            self._ready(key, state)

    def _valid(self, key: str, token: int) -> bool:
        """Lock held: whether a lane's entry is the key's current one (then it leaves the rotation)."""
        if self._waiting.get(key, (0, -1))[1] != token:
            return False
        del self._waiting[key]
        return True

    def _run_inline(self, key: str) -> None:
        while True:
            with self._cond:
                state = self._keys[key]
                if state.current is None:
                    if not state.queued:
                        del self._keys[key]
                        return
                    state.current = state.queued.popleft()
            self._step(key, state)

    def _next_key(self) -> str | None:
        """Lock held: the key whose step runs next; once closed, only keys with a job under way, and None when
        none is left."""
        while True:
            for lane in self._lanes:
                while lane:
                    key = lane.pop(self._valid)
                    if key is None:
                        break
                    if not self._closed or self._keys[key].current is not None:
                        return key
                    # Closed: a job not started stays so (the key leaves the rotation for good).
            if self._closed and all(state.current is None for state in self._keys.values()):
                return None
            self._cond.wait()

    def _work(self) -> None:
        done: tuple[str, _Key] | None = None  # the key whose step this worker ran last
        while True:
            with self._cond:
                if done is not None:
                    last, state = done
                    if state.current is None and not state.queued:
                        del self._keys[last]
                    else:
                        # This worker takes a key next, under this same lock: waking another for this one would
                        # cost a thread switch for nothing (and the one woken would find it gone).
                        self._ready(last, state, wake=False)
                    if self._closed:
                        self._cond.notify_all()  # workers waiting for the last started job to end may stop
                key = self._next_key()
                if key is None:
                    return
                state = self._keys[key]
                if state.current is None:
                    state.current = state.queued.popleft()
            self._step(key, state)
            done = key, state

    def _step(self, key: str, state: _Key) -> None:
        """Run one step of the key's current job, outside the lock; record the outcome if the job ended."""
        job = state.current
        assert job is not None
        try:
            if state.steps is None:
                result = job.fn()
                if not inspect.isgenerator(result):
                    self._finish(key, state, result)
                    return
                state.steps = result
            next(state.steps)
        except StopIteration as end:
            self._finish(key, state, end.value)
        except Exception as err:  # handed to the dispatcher thread, which decides what it means
            self._finish(key, state, err)

    def _finish(self, key: str, state: _Key, outcome: Any) -> None:
        with self._cond:
            state.current = None
            state.steps = None
            self._outcomes.setdefault(key, []).append(outcome)
        self._queue.add(Written(key))
