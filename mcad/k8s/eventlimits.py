"""How much the Event recorder (``mcad.k8s.events``) may write, and the buckets that hold it to that. No I/O.

Contract:
- ``EventLimits``: the recorder's limits (per object, global, queue, aggregation window, memory, send retries,
  error logging, request timeout), with the reasons for their defaults; a limit that makes no sense (a burst below
  one, a rate or window not positive, a negative retry count) raises ValueError when constructed.
- ``TokenBucket(rate, burst, now)``: ``burst`` tokens refilled at ``rate`` per second of the monotonic time it is
  given (the caller passes ``now``: it holds no clock); ``take(now)`` spends one if there is one.
- ``LogLimiter(interval, max_keys)``: ``allow(key, now)`` says yes to a key at most once per ``interval`` seconds,
  remembering at most ``max_keys`` keys (least recently allowed forgotten first).
Neither is thread-safe: the recorder calls them under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EventLimits:
    """How much the recorder may write.

    Per object: a burst of 25 covers an AppWrapper's whole normal life (Queued, Dispatched, Completed) plus about
    seven requeue rounds (Requeued, Queued, Dispatched each) in full; one token a minute thereafter keeps every
    event of a requeue loop at the default 300 s period forever (3 per 5 min), while an object whose events flap
    every dispatch cycle is cut to one a minute. (client-go's kubelet-oriented filter refills one per 5 minutes,
    where repeats are noise such as image pull backoff; here a repeat is a real transition.)
    Global: 10/s with a burst of 100 is a small share of an API server's default 200 mutating requests in
    flight, left to the writes that matter (dispatches, statuses); a burst of 100 still reports a large
    dispatch cycle in full. Queue: 1,000 writes is 100 s of the global rate, enough to ride out a slow API server.
    """

    per_object_burst: int = 25
    per_object_interval: float = 60.0  # seconds per token
    global_burst: int = 100
    global_rate: float = 10.0  # tokens per second
    queue_size: int = 1000
    aggregation_window: float = 600.0
    # Objects (buckets) and aggregation keys remembered, least recently used forgotten first: bounds memory
    # with any number of AppWrappers. A forgotten object starts again with a full bucket; the global bucket
    # still bounds the total.
    max_tracked: int = 4096
    send_retries: int = 3
    retry_base_delay: float = 0.5  # seconds; doubles per retry
    error_log_interval: float = 600.0
    request_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("per_object_burst", "global_burst", "queue_size", "max_tracked"):
            if getattr(self, name) < 1:
                raise ValueError(f"EventLimits.{name} must be at least 1, not {getattr(self, name)}")
        for name in ("per_object_interval", "global_rate", "aggregation_window", "request_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EventLimits.{name} must be positive, not {getattr(self, name)}")
        if self.send_retries < 0 or self.retry_base_delay < 0 or self.error_log_interval < 0:
            raise ValueError("EventLimits.send_retries, retry_base_delay and error_log_interval must not be negative")


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second of the monotonic clock; a write takes one."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def available(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= 1.0

    def take(self, now: float) -> bool:
        if not self.available(now):
            return False
        self.tokens -= 1.0
        return True


class LogLimiter:
    """Says yes to a key at most once per ``interval`` seconds; remembers at most ``max_keys`` keys."""

    def __init__(self, interval: float, max_keys: int = 1024) -> None:
        self._interval = interval
        self._max_keys = max_keys
        self._last: OrderedDict[Any, float] = OrderedDict()

    def allow(self, key: Any, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        if len(self._last) > self._max_keys:
            self._last.popitem(last=False)
        return True
