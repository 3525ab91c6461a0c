"""The dashboard's headline numbers: a bounded history of the controller's own metrics and the summary
document built from it (``/ui/api/summary``).

Contract:
- ``MetricsHistory.sample(now)`` reads from ``Metrics`` the dispatched-decision counter
  (``mcad_dispatch_decisions_total{decision="dispatched"}``), the cumulative buckets of
  ``mcad_dispatch_latency_seconds`` (creation to first dispatch) and the AppWrappers by ``status.state``
  (``Metrics.sources.appwrapper_states``, O(AppWrappers): the reason it is sampled, not read per request), and
  keeps them stamped with ``now``. The caller drives it every ``SAMPLE_INTERVAL_SECONDS``
  (``mcad.cli.controller.start_history_sampling``); this module has no thread and no clock of its own. ``now`` is
  monotonic seconds (``Clock.monotonic()``), the same clock for ``sample`` and ``summary``. A sample stamped
  before the newest one kept is ignored, so the history stays in time order.
- Bounded: at most ``WINDOW_SAMPLES`` samples (an hour of 10-s intervals has 360 intervals, so 361 samples); the
  oldest goes first. ``summary(now)`` uses only the samples of the hour up to ``now``.
- Counter resets (the history pointed at a new ``Metrics``, as when a replica's dispatcher is rebuilt, or any
  count going down) never give a negative increase: across a reset the increase is the value after it, as
  Prometheus counts it. A histogram counts as reset when any of its cumulative buckets went down; one whose
  bucket bounds changed counts only from the first sample with the new bounds.
- Thread safety: one caller of ``sample`` at a time (the sampling thread); ``summary`` from any thread. The
  samples are a tuple replaced whole, so a reader sees the history before or after a sample, never half of it.
- ``summary(now)`` is this JSON-ready document::

    {"states": {"queued": n, "dispatched": n, "completed": n, "failed": n},
     "dispatchesPerMinute": x,
     "timeToDispatch": {"p50": seconds | null, "p99": seconds | null, "windowSeconds": s},
     "sparkline": [60 counts, oldest minute first]}

  * ``states``, from the newest sample of the hour (so at most one interval old; all 0 before the first one):
    ``queued`` counts the states that are neither active nor final (``State.NEW``, i.e. no status yet, and
    ``Pending``); ``dispatched`` the active ones (``ACTIVE_STATES``: ``Running``, ``RunningHoldCompletion``);
    ``completed`` ``Completed`` and ``failed`` ``Failed`` (``FINAL_STATES``). A state string mcad does not know
    (written by someone else) is counted nowhere.
  * ``dispatchesPerMinute``: the dispatches of the minute up to the newest sample (which must be at most 60 s old,
    else 0): the counter's increase since the newest sample at least 60 s older than it, scaled down to a minute
    when the samples' spacing makes that span longer. Never scaled up: while the history is younger than a minute
    it is the increase since the first sample, so 2 dispatches in a controller's first 20 s show as 2, not as the
    6 a minute they would extrapolate to.
  * ``timeToDispatch``: quantiles of the histogram's bucket increases over the hour, interpolated linearly within
    the bucket the rank falls in, as Prometheus' ``histogram_quantile`` does (the first bucket starts at 0; a rank
    in the +Inf bucket gives the highest finite bound); ``null`` when nothing was dispatched in the window.
    ``windowSeconds`` is the time the samples used span (less than an hour after a start).
  * ``sparkline``: dispatches in each of the last 60 minutes before ``now``, oldest first; an interval's increase
    counts in the minute its closing sample falls in. Minutes before the first sample are 0.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol

from mcad.api.appwrapper import ACTIVE_STATES, FINAL_STATES, State

SAMPLE_INTERVAL_SECONDS = 10.0
HOUR_SECONDS = 3600.0
MINUTE_SECONDS = 60.0
SPARKLINE_MINUTES = 60
WINDOW_SAMPLES = int(HOUR_SECONDS / SAMPLE_INTERVAL_SECONDS) + 1

# status.state -> the dashboard's count it adds to. Not active and not final means it waits to be dispatched.
STATE_GROUPS: Mapping[str, str] = {
    **{state.value: "queued" for state in State if state not in ACTIVE_STATES | FINAL_STATES},
    **{state.value: "dispatched" for state in ACTIVE_STATES},
    State.COMPLETED.value: "completed",
    State.FAILED.value: "failed",
}
GROUPS = ("queued", "dispatched", "completed", "failed")

# (upper bound, cumulative count) per bucket, ascending, +Inf last: a Prometheus histogram's buckets.
Buckets = tuple[tuple[float, float], ...]


class StateSource(Protocol):
    """``mcad.metrics.Sources``: what counts AppWrappers by ``status.state`` (None: nothing wired yet)."""

    @property
    def appwrapper_states(self) -> Callable[[], Mapping[str, int]] | None: ...


class MetricsSource(Protocol):
    """What a sample reads (``mcad.metrics.Metrics``)."""

    @property
    def sources(self) -> StateSource: ...

    def dispatched_total(self) -> float: ...

    def latency_buckets(self) -> Buckets: ...


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # monotonic seconds
    dispatched: float  # the dispatched-decision counter
    bounds: tuple[float, ...]  # the time-to-dispatch histogram's bucket upper bounds, +Inf last
    counts: tuple[float, ...]  # and their cumulative counts
    states: Mapping[str, int]  # the dashboard's groups (GROUPS) -> AppWrappers


def grouped(states: Mapping[str, int]) -> dict[str, int]:
    """AppWrappers by ``status.state`` -> by the dashboard's groups (see ``STATE_GROUPS``)."""
    counts = dict.fromkeys(GROUPS, 0)
    for state, count in states.items():
        group = STATE_GROUPS.get(state)
        if group is not None:
            counts[group] += count
    return counts


def counter_increase(before: float, after: float) -> float:
    """A counter's increase between two readings; a reading lower than the one before means it restarted at 0."""
    return after - before if after >= before else after


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q``-quantile (0 < q < 1) of cumulative ``buckets``, the way Prometheus' ``histogram_quantile``
    estimates it: find the first bucket whose cumulative count reaches rank = q * total, and interpolate linearly
    between its lower bound (the previous bucket's upper bound, or 0 for the first) and its upper bound. A rank in
    the +Inf bucket answers the highest finite bound. None without observations or without a +Inf bucket."""
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for index, (upper, cumulative) in enumerate(buckets):
        if cumulative >= rank:
            if math.isinf(upper):
                return buckets[index - 1][0]
            if index == 0 and upper <= 0:
                return upper
            inside = cumulative - below
            return lower + (upper - lower) * ((rank - below) / inside) if inside > 0 else upper
        lower, below = upper, cumulative
    return None  # cumulative counts below the total: not a well-formed histogram


class MetricsHistory:
    """Samples of one controller's metrics, and the dashboard's summary of them (see the module docstring)."""

    def __init__(self, metrics: MetricsSource, *, window: int = WINDOW_SAMPLES) -> None:
        if window < 2:
            raise ValueError("a history needs at least two samples to show a rate")
        self.metrics = metrics
        self.window = window
        self._samples: tuple[Sample, ...] = ()

    @property
    def samples(self) -> tuple[Sample, ...]:
        return self._samples

    def sample(self, now: float) -> None:
        """Read the metrics now and keep them (the oldest sample goes once the window is full)."""
        kept = self._samples
        if kept and now < kept[-1].at:
            return
        source = self.metrics.sources.appwrapper_states
        states = grouped(source()) if source is not None else dict.fromkeys(GROUPS, 0)
        buckets = self.metrics.latency_buckets()
        taken = Sample(now, self.metrics.dispatched_total(), tuple(bound for bound, _ in buckets),
                       tuple(count for _, count in buckets), states)
        self._samples = (*kept, taken)[-self.window:]

    def summary(self, now: float) -> dict[str, Any]:
        """The summary document of the hour up to ``now`` (see the module docstring)."""
        hour = [s for s in self._samples if now - HOUR_SECONDS <= s.at <= now]
        return {
            "states": dict(hour[-1].states) if hour else dict.fromkeys(GROUPS, 0),
            "dispatchesPerMinute": _per_minute(hour, now),
            "timeToDispatch": _time_to_dispatch(hour),
            "sparkline": _sparkline(hour, now),
        }


def _per_minute(hour: Sequence[Sample], now: float) -> float:
    """See ``dispatchesPerMinute`` in the module docstring; ``hour`` is in time order and ends at or before ``now``."""
    if len(hour) < 2 or hour[-1].at < now - MINUTE_SECONDS:
        return 0.0
    end = hour[-1]
    start = 0  # the newest sample a minute or more before ``end``, else the oldest
    for index in range(len(hour) - 2, -1, -1):
        if hour[index].at <= end.at - MINUTE_SECONDS:
            start = index
            break
    window = hour[start:]
    span = end.at - window[0].at
    if span <= 0:
        return 0.0
    increase = sum(counter_increase(a.dispatched, b.dispatched) for a, b in pairwise(window))
    return round(increase * min(1.0, MINUTE_SECONDS / span), 2)


def latency_increase(samples: Sequence[Sample]) -> Buckets | None:
    """The histogram's increase over ``samples`` (in time order), bucket by bucket: the sum of the increases
    between consecutive samples, where a reset (any bucket went down) counts the sample after it whole, and a
    change of bucket bounds (another histogram) starts the sum again from the sample after it. Between resets the
    increases telescope, so only the samples around a reset are compared bucket by bucket. None with fewer than
    two samples."""
    if len(samples) < 2:
        return None
    total = [0.0] * len(samples[0].counts)
    start = samples[0]
    for a, b in pairwise(samples):
        if a.bounds != b.bounds:
            total, start = list(b.counts), b
        elif any(map(operator.lt, b.counts, a.counts)):
            # Close the segment from ``start`` to ``a``, and count ``b`` whole.
            total = [t + x - s + y for t, s, x, y in zip(total, start.counts, a.counts, b.counts, strict=True)]
            start = b
    last = samples[-1]
    return tuple(zip(last.bounds, (t + x - s for t, s, x in zip(total, start.counts, last.counts, strict=True)),
                     strict=True))


def _time_to_dispatch(samples: Sequence[Sample]) -> dict[str, Any]:
    increase = latency_increase(samples)
    p50 = histogram_quantile(0.5, increase) if increase is not None else None
    p99 = histogram_quantile(0.99, increase) if increase is not None else None
    return {"p50": None if p50 is None else round(p50, 3), "p99": None if p99 is None else round(p99, 3),
            "windowSeconds": round(samples[-1].at - samples[0].at, 1) if samples else 0.0}


def _sparkline(samples: Sequence[Sample], now: float) -> list[int]:
    minutes = [0.0] * SPARKLINE_MINUTES
    for a, b in pairwise(samples):
        ago = int((now - b.at) // MINUTE_SECONDS)
        if 0 <= ago < SPARKLINE_MINUTES:
            minutes[SPARKLINE_MINUTES - 1 - ago] += counter_increase(a.dispatched, b.dispatched)
    return [round(count) for count in minutes]
