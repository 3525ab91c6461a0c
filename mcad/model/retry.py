"""After an API write fails: what the failure means, and when (or whether) to try again. Pure, no I/O.

Contract:
- ``classify(err)`` sorts an ``ApiError`` into one of four kinds:
  * ``UNAVAILABLE``: the API server did not serve the request for reasons of its own that pass: no answer at all
    (status 0: refused, reset, unreachable), 429 (throttled), 503 (unavailable), 401 (the controller's credentials
    are being rotated). Retried with backoff; never a reason to fail the AppWrapper, since it says nothing about it.
  * ``TIMEOUT``: the request went out and no answer came within the client's timeout (status 0, reason
    ``Timeout``, ``mcad.errors.TIMED_OUT``). The server may be overloaded, or the request itself too heavy (a huge
    object, a slow admission webhook of a wrapped kind), which retrying would never cure. Retried with backoff;
    the first ``timeouts_tolerated`` of a key in a row are not counted (like UNAVAILABLE), every later one is
    counted like TRANSIENT, so a request that always times out gives up in the end.
  * ``TRANSIENT``: server-side trouble that usually passes: 500 without a deterministic message, 502, 504, and
    unusual codes. Retried with backoff and counted: ``Backoff`` gives up once a key has failed this way for long
    enough.
  * ``PERMANENT``: the same request would fail the same way: every other 4xx (400 bad request, 403 forbidden or
    refused by admission, 404 a kind or namespace not served, 409 a conflict that retrying cannot resolve, 413 too
    large, 422 invalid) and the 500s whose message says so (etcd's request-size limit, ResourceExhausted). The
    caller fails the AppWrapper at once with the API server's message.
- ``Backoff`` keeps, per key, the failures since its last success: ``failed(key, kind)`` returns a ``Retry`` (the
  delay before the next attempt, or ``give_up`` with the attempts and seconds spent) and ``succeeded(key)``
  forgets the key. Delays grow exponentially per key from ``base`` to ``cap`` (one key's failures never speed up
  or slow down another's, and another key's success resets nothing), and across all keys a token bucket bounds
  the rate of retries (``rate`` per second, ``burst``), so a thousand failing keys cannot add up to a thousand
  requests a second. A key gives up once it has failed ``give_up_attempts`` times counting TRANSIENT failures
  (and TIMEOUTs past the tolerated ones) and its first counted failure is ``give_up_seconds`` old; UNAVAILABLE
  failures grow its delay but are not counted. Memory: one entry per key that failed and has not succeeded or
  been forgotten since.
- Jitter: each key's own delay is drawn from [d/2, d] ("equal jitter", d the exponential delay), from a random
  source the caller may hand in (tests pass a fixed one), so keys that failed in the same instant (a cycle's
  dispatches, refused together) do not come back in the same instant, and a key still waits at least half its
  delay. The shared bucket's wait is not jittered: it already spaces retries out.
- ``RetryTimes`` adds when each key may be tried again to its ``Backoff``: ``waiting(key)`` is True until then;
  ``remaining(key)`` says how long a timer that fired early still has to wait (None: it waits for nothing);
  ``release_all()`` lets every key go at once (the API server answers again: the failures most likely came from
  its absence). ``reader()`` is its read-only face (``RetryReader``: ``waiting`` and ``attempts``), for owners that
  read the times another owner keeps.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from mcad.errors import TIMED_OUT


class FailureKind(Enum):
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


class _Error(Protocol):
    status: int
    reason: str
    message: str


# 500s that are really refusals: the object (with its managedFields) exceeds etcd's request limit, or a gRPC limit
# downstream of the API server. The same object would be refused again, however often it is sent.
_DETERMINISTIC_500 = re.compile(
    r"request is too large|too large to|larger than (the )?max|ResourceExhausted|exceeds? (the )?(maximum|limit)",
    re.IGNORECASE)
_UNAVAILABLE = frozenset({0, 401, 429, 503})


def classify(err: _Error) -> FailureKind:
    """What a failed request's answer says about trying it again (see the module docstring)."""
    status = err.status
    if status == 0 and err.reason == TIMED_OUT:
        return FailureKind.TIMEOUT
    if status in _UNAVAILABLE:
        return FailureKind.UNAVAILABLE
    if status == 500:
        return FailureKind.PERMANENT if _DETERMINISTIC_500.search(err.message or "") else FailureKind.TRANSIENT
    if 400 <= status < 500:
        return FailureKind.PERMANENT
    return FailureKind.TRANSIENT


class Clock(Protocol):
    def monotonic(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Retry:
    """The verdict after a failure: try again after ``delay`` seconds, or ``give_up``."""

    delay: float
    give_up: bool = False
    attempts: int = 0  # failures since the last success, this one included
    seconds: float = 0.0  # since the first counted failure


@dataclass(slots=True)
class _Failures:
    attempts: int = 0
    counted: int = 0
    first_counted: float | None = None
    timeouts_in_a_row: int = 0


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``reserve()`` takes one and says how long to wait for it;
    ``try_take()`` takes one only if it is there."""

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1 (rate={rate}, burst={burst})")
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock.monotonic()

    def reserve(self) -> float:
        self._refill()
        self._tokens -= 1.0
        # Negative tokens are reservations already handed out: this one waits for its turn behind them.
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate

    def try_take(self) -> float:
        """Take a token if one is there (0.0); else take nothing and say how long until one is."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate

    def _refill(self) -> None:
        now = self._clock.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now


@dataclass(frozen=True, slots=True)
class Policy:
    """How one kind of write is retried: per key from ``base`` doubling to ``cap`` seconds; across keys at most
    ``rate`` retries a second (``burst`` at once); a key gives up after ``give_up_attempts`` counted failures
    spanning ``give_up_seconds``; the first ``timeouts_tolerated`` TIMEOUTs of a key in a row are not counted."""

    base: float
    cap: float
    rate: float
    burst: int
    give_up_attempts: int
    give_up_seconds: float
    timeouts_tolerated: int = 3


Random = Callable[[], float]
"""A source of floats in [0, 1): ``random.random`` or, in tests, a fixed sequence."""


def equal_jitter(delay: float, draw: Random) -> float:
    """A wait in [delay/2, delay]: spread, and never much shorter than asked."""
    return delay / 2 + draw() * delay / 2


class Backoff:
    """Per-key exponential backoff with a shared rate bound and a give-up rule (see the module docstring).
    Not thread-safe: the dispatcher thread owns it."""

    def __init__(self, clock: Clock, policy: Policy, draw: Random | None = None) -> None:
        if not 0 < policy.base <= policy.cap:
            raise ValueError(f"backoff needs 0 < base <= cap (base={policy.base}, cap={policy.cap})")
        self._clock = clock
        self._draw = draw if draw is not None else random.random
        self._timeouts_tolerated = policy.timeouts_tolerated
        self._base = policy.base
        self._cap = policy.cap
        self._bucket = TokenBucket(policy.rate, policy.burst, clock)
        self._give_up_attempts = policy.give_up_attempts
        self._give_up_seconds = policy.give_up_seconds
        self._failures: dict[str, _Failures] = {}

    def failed(self, key: str, kind: FailureKind) -> Retry:
        now = self._clock.monotonic()
        failures = self._failures.setdefault(key, _Failures())
        failures.attempts += 1
        failures.timeouts_in_a_row = failures.timeouts_in_a_row + 1 if kind is FailureKind.TIMEOUT else 0
        if kind is FailureKind.TRANSIENT or failures.timeouts_in_a_row > self._timeouts_tolerated:
            failures.counted += 1
            if failures.first_counted is None:
                failures.first_counted = now
        seconds = 0.0 if failures.first_counted is None else now - failures.first_counted
        if kind is FailureKind.PERMANENT or (failures.counted >= self._give_up_attempts
                                             and seconds >= self._give_up_seconds):
            del self._failures[key]
            return Retry(0.0, give_up=True, attempts=failures.attempts, seconds=seconds)
        own = equal_jitter(min(self._cap, self._base * 2.0 ** min(failures.attempts - 1, 64)), self._draw)
        return Retry(max(own, self._bucket.reserve()), attempts=failures.attempts, seconds=seconds)

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)

    forget = succeeded

    def attempts(self, key: str) -> int:
        """Failures since the last success (0 when it has not failed)."""
        failures = self._failures.get(key)
        return 0 if failures is None else failures.attempts

    def __len__(self) -> int:
        return len(self._failures)


class RetryTimes:
    """Per key, the time a failed attempt may be tried again (see the module docstring). Not thread-safe."""

    def __init__(self, clock: Clock, policy: Policy, draw: Random | None = None) -> None:
        self._clock = clock
        self.backoff = Backoff(clock, policy, draw)
        self._at: dict[str, float] = {}

    def failed(self, key: str, kind: FailureKind) -> Retry:
        retry = self.backoff.failed(key, kind)
        if retry.give_up:
            self._at.pop(key, None)
        else:
            self._at[key] = self._clock.monotonic() + retry.delay
        return retry

    def succeeded(self, key: str) -> None:
        self.backoff.succeeded(key)
        self._at.pop(key, None)

    forget = succeeded

    def attempts(self, key: str) -> int:
        return self.backoff.attempts(key)

    def waiting(self, key: str) -> bool:
        """Its last attempt failed and its time has not come yet. A question only: a time that has come stays
        until ``remaining`` hands it over (a dry run asking this must not take the retry from its timer)."""
        due = self._at.get(key)
        return due is not None and due - self._clock.monotonic() > 0

    def remaining(self, key: str) -> float | None:
        """Seconds until it may be tried again: None when it waits for nothing, 0 when its time has come (the
        time is then forgotten)."""
        due = self._at.get(key)
        if due is None:
            return None
        left = due - self._clock.monotonic()
        if left > 0:
            return left
        del self._at[key]
        return 0.0

    def release_all(self) -> int:
        """Every waiting key may go now; how many waited."""
        waited = len(self._at)
        self._at.clear()
        return waited

    def reader(self) -> RetryReader:
        """A read-only face of these times, for readers that must not record failures or successes."""
        return RetryReader(self)


class RetryReader:
    """What a reader may ask of ``RetryTimes`` another owns: nothing here records a failure or a success."""

    __slots__ = ("_times",)

    def __init__(self, times: RetryTimes) -> None:
        self._times = times

    def waiting(self, key: str) -> bool:
        """Its last attempt failed and its time has not come yet."""
        return self._times.waiting(key)

    def attempts(self, key: str) -> int:
        """Failed attempts since its last success."""
        return self._times.attempts(key)
