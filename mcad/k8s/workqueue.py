"""A work queue for controller keys: deduplicating, delaying and rate-limited, with client-go ``workqueue`` semantics.

Contract:

* Keys, not objects. A key is any hashable, immutable value (a ``NamedTuple`` or a string); the worker reads the
  latest state from the informer store when it processes the key.
* Fair: ready keys are handed out first in, first out, within their lane. A key whose type is one of the queue's
  ``urgent`` types goes to the urgent lane, which ``get()`` empties first. A type always takes the same lane, so the
  guarantees below hold per key. The urgent types must be ones that cannot come faster than the worker takes
  them, or the other lane would starve.
* Stingy: adding a key that is already waiting to be processed does nothing, so a burst of events for one object
  costs one pass of the worker.
* Never processed concurrently: between ``get()`` returning a key and the matching ``done(key)`` no other ``get()``
  returns that key. Adding it meanwhile marks it dirty and ``done`` puts it back at the tail of the queue, exactly
  once, so no change is lost.
* Every ``get()`` that returns a key must be followed by one ``done(key)``, normally in a ``finally``.
* Delayed keys (``add_after``) become ready in order of their due time, ties in the order they were added. A key
  already waiting keeps the earlier of its two due times: a later request never postpones an earlier one. A delayed
  add is a separate request from a plain ``add``: when it comes due it is deduplicated like any other add.
* Retries: ``add_rate_limited`` delays a key by its per-key exponential backoff; ``forget`` resets the backoff once
  the key was processed successfully (or given up on). The default limiter draws each delay from [d/2, d]
  (``mcad.model.retry.equal_jitter``), so keys that failed together (one cycle's) do not come back together.
* Shutdown: later adds are ignored, delayed keys are dropped, keys already queued are still handed out, and
  ``get()`` returns ``(None, True)`` once the queue is empty. ``shutdown_with_drain`` also waits until every key
  handed out has been marked ``done``.

There is no timer thread. Due keys are moved to the queue by whichever caller touches the queue next; a blocked
``get()`` sleeps on the condition no longer than until the earliest due time, and ``add_after`` wakes it when it
brings that time forward. Due times use the injected ``Clock``; a ``get`` timeout is real time, because it bounds how
long the calling thread blocks. With a fake clock, ``get(timeout=0)`` after stepping the clock is deterministic.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from mcad.clock import Clock, RealClock
from mcad.model.retry import equal_jitter

K = TypeVar("K", bound=Hashable)

# 2.0 ** 1024 raises OverflowError; past this exponent base * 2 ** n is either already capped at max_delay or
# becomes float infinity, which min() caps just the same.
_MAX_EXPONENT = 1000


class RateLimiter(Protocol):
    """Per-key backoff. ``when`` both answers and counts a failure, so call it once per retry."""

    def when(self, key: Hashable) -> float: ...

    def forget(self, key: Hashable) -> None: ...

    def num_requeues(self, key: Hashable) -> int: ...


class ExponentialRateLimiter:
    """``delay = min(max_delay, base_delay * 2 ** failures)`` with equal jitter (a wait in [delay/2, delay] drawn
    from ``draw``; ``lambda: 1.0`` for none), counting failures per key until ``forget``."""

    def __init__(self, base_delay: float = 0.005, max_delay: float = 300.0, *,
                 draw: Callable[[], float] = random.random) -> None:
        if base_delay < 0 or max_delay < 0:
            raise ValueError(f"delays must not be negative (base_delay={base_delay}, max_delay={max_delay})")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._draw = draw
        self._failures: dict[Hashable, int] = {}
        # Several workers may retry keys at once; the limiter is shared and cheap, so a plain lock suffices.
        self._lock = threading.Lock()

    def when(self, key: Hashable) -> float:
        with self._lock:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        return equal_jitter(min(self.max_delay, self.base_delay * 2.0 ** min(failures, _MAX_EXPONENT)), self._draw)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def num_requeues(self, key: Hashable) -> int:
        with self._lock:
            return self._failures.get(key, 0)


class WorkQueue(Generic[K]):
    """Rate-limiting, delaying work queue. Thread-safe; see the module docstring for the guarantees."""

    def __init__(self, *, clock: Clock | None = None, rate_limiter: RateLimiter | None = None, name: str = "",
                 urgent: frozenset[type] = frozenset()) -> None:
        self.name = name
        self._urgent_types = urgent
        self._clock: Clock = clock if clock is not None else RealClock()
        self._rate_limiter: RateLimiter = rate_limiter if rate_limiter is not None else ExponentialRateLimiter()
        self._cond = threading.Condition(threading.Lock())
        # Invariants, all under _cond: every key in _queue or _urgent is in _dirty, is not in _processing, and appears
        # once, in the lane of its type. _dirty holds the keys that need a pass (queued, or added again while being
        # processed).
        self._queue: deque[K] = deque()
        self._urgent: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        # Delayed keys: a heap of (ready_at, seq, key) and the live entry of each key. Moving a key earlier pushes a
        # new entry and leaves the old one behind; an entry is live only if it matches _waiting, so stale ones are
        # skipped when popped. seq breaks ties in insertion order and keeps keys from ever being compared.
        self._heap: list[tuple[float, int, K]] = []
        self._waiting: dict[K, tuple[float, int]] = {}
        self._seq = 0
        self._shutting_down = False

    # -- ready keys ---------------------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        with self._cond:
            self._promote_due()
            self._add(key)

    def get(self, timeout: float | None = None) -> tuple[K | None, bool]:
        """Wait for a ready key and mark it processing. Returns ``(key, False)``, ``(None, True)`` once shut down
        and empty, or ``(None, False)`` when ``timeout`` (seconds, real time; ``None`` waits forever) runs out."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._cond:
            while True:
                self._promote_due()
                if self._urgent or self._queue:
                    key = self._urgent.popleft() if self._urgent else self._queue.popleft()
                    self._dirty.discard(key)
                    if not self._dirty:
                        # A set never shrinks: after a burst (every AppWrapper of a restart at once) its table
                        # would keep the burst's size for ever.
                        self._dirty = set()
                    self._processing.add(key)
                    return key, False
                if self._shutting_down:
                    return None, True
                wait = self._until_next_due()
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None, False
                    wait = remaining if wait is None else min(wait, remaining)
                # Condition.wait raises OverflowError past TIMEOUT_MAX (~292 years): a key due that late (a timer
                # computed from a user's value) must not kill the worker thread. Waking early only re-checks.
                self._cond.wait(None if wait is None else min(wait, threading.TIMEOUT_MAX))

    def done(self, key: K) -> None:
        with self._cond:
            if key not in self._processing:
                # A second done() (or one without get()) must not push a queued key twice.
                return
            self._processing.discard(key)
            if key in self._dirty:
                self._lane(key).append(key)
                self._cond.notify()
            if self._shutting_down and not self._processing:
                # Only drainers wait after shutdown (getters return at once), so this reaches them.
                self._cond.notify_all()

    # -- delayed and rate-limited keys --------------------------------------------------------------------------

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` once ``delay`` seconds have passed on the clock; ``delay <= 0`` adds it now."""
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutting_down:
                return
            self._promote_due()
            ready_at = self._clock.monotonic() + delay
            current = self._waiting.get(key)
            if current is not None and current[0] <= ready_at:
                return
            was_first = self._heap[0][0] if self._heap else None
            self._seq += 1
            self._waiting[key] = (ready_at, self._seq)
            heapq.heappush(self._heap, (ready_at, self._seq, key))
            if was_first is None or ready_at < was_first:
                # Every sleeping get() bounded its wait by the old earliest due time; all must recompute, or a getter
                # that leaves with a key could take the only correctly timed wait with it.
                self._cond.notify_all()

    def add_rate_limited(self, key: K) -> None:
        self.add_after(key, self._rate_limiter.when(key))

    def forget(self, key: K) -> None:
        self._rate_limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self._rate_limiter.num_requeues(key)

    # -- lifecycle and introspection ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        with self._cond:
            self._begin_shutdown()

    def shutdown_with_drain(self, timeout: float | None = None) -> bool:
        """Shut down, then wait (real time) until every key handed out is done. False if ``timeout`` ran out."""
        with self._cond:
            self._begin_shutdown()
            return self._cond.wait_for(lambda: not self._processing, timeout)

    def shutting_down(self) -> bool:
        with self._cond:
            return self._shutting_down

    def __len__(self) -> int:
        """Keys ready to be handed out (for metrics; it is stale as soon as it returns)."""
        with self._cond:
            self._promote_due()
            return len(self._queue) + len(self._urgent)

    def waiting_count(self) -> int:
        """Keys waiting for their delay to pass (for metrics)."""
        with self._cond:
            self._promote_due()
            return len(self._waiting)

    # -- helpers, all called with _cond held --------------------------------------------------------------------

    def _add(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # done() queues it; queueing it now would let a second worker take it.
        self._lane(key).append(key)
        self._cond.notify()

    def _lane(self, key: K) -> deque[K]:
        return self._urgent if type(key) in self._urgent_types else self._queue

    def _promote_due(self) -> None:
        if not self._heap:
            return
        now = self._clock.monotonic()
        while self._heap and self._heap[0][0] <= now:
            ready_at, seq, key = heapq.heappop(self._heap)
            if self._waiting.get(key) == (ready_at, seq):
                del self._waiting[key]
                self._add(key)

    def _until_next_due(self) -> float | None:
        if not self._heap:
            return None
        return max(self._heap[0][0] - self._clock.monotonic(), 0.0)

    def _begin_shutdown(self) -> None:
        self._shutting_down = True
        self._heap.clear()
        self._waiting.clear()
        self._cond.notify_all()
