"""mcad.serve.history: the dashboard's headline numbers from a real ``Metrics``, sampled on a stepped clock (monotonic
seconds handed to ``sample`` and ``summary``); quantiles checked against values worked out by hand."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime

import pytest

from mcad.cli.controller import start_history_sampling
from mcad.metrics import Metrics
from mcad.serve.history import (
    SPARKLINE_MINUTES,
    WINDOW_SAMPLES,
    MetricsHistory,
    Sample,
    counter_increase,
    histogram_quantile,
    latency_increase,
)
from test.support import wait_until

INF = float("inf")


def dispatch(metrics: Metrics, *latencies: float) -> None:
    """What the dispatcher records for each first dispatch."""
    for seconds in latencies:
        metrics.decision("dispatched")
        metrics.dispatch_latency(seconds)


def every_10s(history: MetricsHistory, start: float, end: float) -> None:
    t = start
    while t <= end:
        history.sample(t)
        t += 10


def test_quantiles_interpolate_within_the_bucket_the_rank_falls_in() -> None:
    # 2 in (0, 1], 4 in (1, 2], 2 above 2.
    buckets = ((1.0, 2.0), (2.0, 6.0), (INF, 8.0))
    assert histogram_quantile(0.5, buckets) == pytest.approx(1.5)  # rank 4: 2 of the 4 in (1, 2]
    assert histogram_quantile(0.25, buckets) == pytest.approx(1.0)  # rank 2: the top of (0, 1]
    assert histogram_quantile(0.125, buckets) == pytest.approx(0.5)  # rank 1: the first bucket starts at 0
    assert histogram_quantile(0.99, buckets) == 2.0  # rank 7.92 is in +Inf: the highest finite bound
    assert histogram_quantile(0.5, ((1.0, 0.0), (INF, 0.0))) is None  # no observations
    assert histogram_quantile(0.5, ((1.0, 3.0), (2.0, 3.0))) is None  # no +Inf bucket


def test_time_to_dispatch_p50_p99_over_the_hour_from_the_metrics_histogram() -> None:
    metrics = Metrics()
    history = MetricsHistory(metrics)
    history.sample(0.0)
    dispatch(metrics, *[0.3] * 4, *[3.0] * 6)  # 4 in (0.25, 0.5], 6 in (2.5, 5]
    history.sample(10.0)
    ttd = history.summary(10.0)["timeToDispatch"]
    # p50: rank 5, the first of the 6 in (2.5, 5]: 2.5 + 2.5 * 1/6; p99: rank 9.9: 2.5 + 2.5 * 5.9/6.
    assert ttd == {"p50": round(2.5 + 2.5 / 6, 3), "p99": round(2.5 + 2.5 * 5.9 / 6, 3), "windowSeconds": 10.0}
    assert ttd["p50"] == 2.917 and ttd["p99"] == 4.958


def test_no_dispatch_gives_null_quantiles() -> None:
    metrics = Metrics()
    history = MetricsHistory(metrics)
    assert history.summary(0.0) == {
        "states": {"queued": 0, "dispatched": 0, "completed": 0, "failed": 0}, "dispatchesPerMinute": 0.0,
        "timeToDispatch": {"p50": None, "p99": None, "windowSeconds": 0.0}, "sparkline": [0] * SPARKLINE_MINUTES}
    dispatch(metrics, 5.0)  # before the first sample: not in any interval the history saw
    every_10s(history, 0.0, 60.0)
    assert history.summary(60.0)["timeToDispatch"] == {"p50": None, "p99": None, "windowSeconds": 60.0}


def test_dispatches_beyond_the_last_bucket_answer_its_bound() -> None:
    metrics = Metrics()
    history = MetricsHistory(metrics)
    history.sample(0.0)
    dispatch(metrics, 100_000.0)  # above 24 h, the last finite bucket
    history.sample(10.0)
    assert history.summary(10.0)["timeToDispatch"]["p50"] == 86400.0


def test_rate_and_sparkline_count_each_interval_in_the_minute_it_ends() -> None:
    metrics = Metrics()
    history = MetricsHistory(metrics)
    history.sample(0.0)
    for t in range(10, 130, 10):
        dispatch(metrics, *[1.0] * (1 if t <= 60 else 2))
        history.sample(float(t))
    summary = history.summary(120.0)
    # Intervals closing at 10..60 (1 each) are a minute ago or more; those closing at 70..120 (2 each) are in the
    # last minute: 12 over the 60 s the samples at 60..120 span.
    assert summary["sparkline"] == [0] * (SPARKLINE_MINUTES - 2) + [6, 12]
    assert summary["dispatchesPerMinute"] == 12.0
    # Half a minute later, with no new sample: the samples of the last 60 s span 30 s and saw 6.
    later = history.summary(150.0)
    assert later["dispatchesPerMinute"] == 12.0
    # Minutes now end at 150: (90, 150] holds the intervals closing at 100..120 (6), (30, 90] those closing at
    # 40..60 (3) and 70..90 (6), (-30, 30] those closing at 10..30 (3).
    assert later["sparkline"][-4:] == [0, 3, 9, 6]


def test_two_dispatches_in_a_controllers_first_20_seconds_are_2_a_minute_not_6() -> None:
    """The dashboard showed 6 dispatches a minute when 2 had happened: the increase over the samples of a young
    history (20 s) was scaled up to a minute. A minute's count is now never extrapolated."""
    metrics = Metrics()
    history = MetricsHistory(metrics)
    history.sample(0.0)
    dispatch(metrics, 1.0)
    history.sample(10.0)
    dispatch(metrics, 1.0)
    history.sample(20.0)
    assert history.summary(20.0)["dispatchesPerMinute"] == 2.0
    every_10s(history, 30.0, 60.0)
    assert history.summary(60.0)["dispatchesPerMinute"] == 2.0  # (0, 60]: both
    history.sample(70.0)
    assert history.summary(70.0)["dispatchesPerMinute"] == 1.0  # (10, 70]: the second only
    history.sample(80.0)
    assert history.summary(80.0)["dispatchesPerMinute"] == 0.0


@pytest.mark.parametrize("per_interval", [0, 1, 3, 7])
def test_a_known_number_of_dispatches_in_the_last_minute_is_the_rate(per_interval: int) -> None:
    """Three minutes of ``per_interval`` dispatches every 10 s, then the rate at several moments: always the number
    dispatched in the minute up to the newest sample (6 intervals), however long the history."""
    metrics = Metrics()
    history = MetricsHistory(metrics)
    history.sample(0.0)
    for t in range(10, 190, 10):
        dispatch(metrics, *[1.0] * per_interval)
        history.sample(float(t))
    assert history.summary(180.0)["dispatchesPerMinute"] == 6 * per_interval
    assert history.summary(185.0)["dispatchesPerMinute"] == 6 * per_interval  # the newest sample is 5 s old
    # A minute with no sample at all: nothing is known about it.
    assert history.summary(180.0 + 61.0)["dispatchesPerMinute"] == 0.0


def test_samples_spaced_wider_than_10s_scale_the_rate_down_to_a_minute() -> None:
    """The sampling thread waits 10 s after each sample, so the spacing drifts above 10 s: 6 intervals of 12 s
    span 72 s, and the 12 dispatches in them are 10 a minute."""
    metrics = Metrics()
    history = MetricsHistory(metrics)
    history.sample(0.0)
    for t in range(12, 84, 12):
        dispatch(metrics, 1.0, 1.0)
        history.sample(float(t))
    # The newest sample at least 60 s before 72 is the one at 12: 5 intervals, 10 dispatches over 60 s.
    assert history.summary(72.0)["dispatchesPerMinute"] == 10.0
    history = MetricsHistory(metrics)
    history.sample(0.0)
    dispatch(metrics, *[1.0] * 11)
    history.sample(66.0)  # one interval of 66 s: 11 dispatches over 66 s are 10 a minute
    assert history.summary(66.0)["dispatchesPerMinute"] == 10.0


def test_states_map_mcad_states_to_the_four_counts() -> None:
    metrics = Metrics()
    metrics.sources.appwrapper_states = lambda: {"": 2, "Pending": 3, "Running": 4, "RunningHoldCompletion": 1,
                                                 "Completed": 5, "Failed": 6, "SomethingElse": 7}
    history = MetricsHistory(metrics)
    history.sample(0.0)
    assert history.summary(0.0)["states"] == {"queued": 5, "dispatched": 5, "completed": 5, "failed": 6}


def test_the_window_keeps_an_hour_of_samples_and_forgets_what_came_before() -> None:
    metrics = Metrics()
    history = MetricsHistory(metrics)
    history.sample(0.0)
    dispatch(metrics, *[0.3] * 100)  # more than an hour before the end
    every_10s(history, 10.0, 5000.0)
    dispatch(metrics, 3.0, 3.0)
    history.sample(5010.0)
    assert len(history.samples) == WINDOW_SAMPLES == 361
    assert history.samples[0].at == 5010.0 - 3600.0
    summary = history.summary(5010.0)
    assert summary["timeToDispatch"] == {"p50": 3.75, "p99": 4.975, "windowSeconds": 3600.0}
    assert summary["sparkline"] == [0] * (SPARKLINE_MINUTES - 1) + [2]
    # Summaries only read the hour up to ``now``: a later one no longer sees those two.
    assert history.summary(5010.0 + 3601.0)["timeToDispatch"]["p50"] is None


def test_a_counter_reset_never_gives_a_negative_rate() -> None:
    before = Metrics()
    history = MetricsHistory(before)
    dispatch(before, *[30.0] * 100)
    history.sample(0.0)
    dispatch(before, *[30.0] * 10)
    history.sample(10.0)
    # A new Metrics (a restarted process, a new leader): its counts start again at 0, and it dispatched 3 since.
    after = Metrics()
    dispatch(after, 0.3, 0.3, 0.3)
    history.metrics = after
    history.sample(20.0)
    summary = history.summary(20.0)
    assert summary["dispatchesPerMinute"] == 13.0  # (10 + 3) in the 20 s the history has, not scaled up to 39
    assert summary["sparkline"][-1] == 13
    # 10 in (10, 30] before the reset, 3 in (0.25, 0.5] after it: p50 (rank 6.5) is in (10, 30].
    assert summary["timeToDispatch"]["p50"] == pytest.approx(10 + 20 * 3.5 / 10)


def test_increases_across_a_reset_are_the_values_after_it() -> None:
    assert counter_increase(100.0, 3.0) == 3.0
    assert counter_increase(3.0, 5.0) == 2.0


def reading(at: float, *counts: float, bounds: tuple[float, ...] = (1.0, INF)) -> Sample:
    return Sample(at, 0.0, bounds, counts, {})


def test_histogram_increases_sum_across_resets_and_restart_on_other_bounds() -> None:
    # +3/+3, then a reset (the le=1 bucket goes down): (1, 12) counts whole, then +1/+2.
    readings = [reading(0, 5, 9), reading(10, 6, 12), reading(20, 1, 12), reading(30, 2, 14)]
    assert latency_increase(readings) == ((1.0, 1 + 1 + 1), (INF, 3 + 12 + 2))
    # Other bounds: only what comes from the first reading with them on counts.
    readings.append(reading(40, 1, 2, 3, bounds=(1.0, 2.0, INF)))
    readings.append(reading(50, 1, 4, 6, bounds=(1.0, 2.0, INF)))
    assert latency_increase(readings) == ((1.0, 1), (2.0, 4), (INF, 6))
    assert latency_increase(readings[:1]) is None


def test_a_sample_from_before_the_newest_is_ignored() -> None:
    history = MetricsHistory(Metrics())
    history.sample(20.0)
    history.sample(10.0)
    assert [s.at for s in history.samples] == [20.0]


class _Ticks:
    """A clock whose monotonic time advances 10 s per reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        self.t += 10.0
        return self.t

    def now(self) -> datetime:
        raise AssertionError("the sampler needs no wall clock")


def test_the_sampling_thread_samples_until_stopped_and_survives_a_failing_source() -> None:
    metrics = Metrics()
    failing = threading.Event()

    def states() -> Mapping[str, int]:
        if failing.is_set():
            raise RuntimeError("informer store unavailable")
        return {"Pending": 1}

    metrics.sources.appwrapper_states = states
    history = MetricsHistory(metrics)
    stop = threading.Event()
    failing.set()
    thread = start_history_sampling(history, 0.01, stop, clock=_Ticks())
    try:
        wait_until(lambda: thread.is_alive() and not history.samples, 5, "the sampler running while sampling fails")
        failing.clear()
        wait_until(lambda: len(history.samples) >= 3, 10, "three samples")
        assert history.summary(history.samples[-1].at)["states"]["queued"] == 1
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
