"""mcad.model.retry: what each API answer means for a retry, per-key backoff, the shared rate bound, giving up."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mcad.errors import TIMED_OUT
from mcad.model.retry import Backoff, FailureKind, Policy, RetryTimes, TokenBucket, classify
from test.fakes import FakeClock


@dataclass
class Answer:
    status: int
    message: str = ""
    reason: str = ""


def NO_JITTER() -> float:  # every delay its full length
    return 1.0


@pytest.mark.parametrize(("status", "message", "kind"), [
    (0, "connection refused", FailureKind.UNAVAILABLE),
    (0, "ReadTimeoutError", FailureKind.UNAVAILABLE),  # only kube's TIMED_OUT reason says the request went out
    (401, "Unauthorized", FailureKind.UNAVAILABLE),
    (429, "storage is (re)initializing", FailureKind.UNAVAILABLE),
    (503, "service unavailable", FailureKind.UNAVAILABLE),
    (500, "Internal error occurred: failed calling webhook", FailureKind.TRANSIENT),
    (502, "", FailureKind.TRANSIENT),
    (504, "the server was unable to return a response in the time allotted", FailureKind.TRANSIENT),
    (410, "Gone", FailureKind.PERMANENT),
    (400, "the body of the request was in an unknown format", FailureKind.PERMANENT),
    (403, 'admission webhook "x" denied the request', FailureKind.PERMANENT),
    (404, "the server could not find the requested resource", FailureKind.PERMANENT),
    (409, "Apply failed with 1 conflict", FailureKind.PERMANENT),
    (413, "Request entity too large: limit is 3145728", FailureKind.PERMANENT),
    (422, "ConfigMap \"x\" is invalid", FailureKind.PERMANENT),
    (500, "etcdserver: request is too large", FailureKind.PERMANENT),
    (500, "rpc error: code = ResourceExhausted desc = trying to send message larger than max (2097152 vs. "
          "2097152)", FailureKind.PERMANENT),
    (599, "", FailureKind.TRANSIENT),
])
def test_every_answer_class_has_a_meaning(status: int, message: str, kind: FailureKind) -> None:
    assert classify(Answer(status, message)) is kind


POLICY = Policy(base=0.5, cap=5.0, rate=1000.0, burst=1000, give_up_attempts=10, give_up_seconds=300.0)


def test_delays_double_per_key_up_to_the_cap_and_a_success_resets_only_that_key() -> None:
    clock = FakeClock()
    backoff = Backoff(clock, POLICY, NO_JITTER)
    assert [backoff.failed("a", FailureKind.TRANSIENT).delay for _ in range(6)] == [0.5, 1, 2, 4, 5, 5]
    assert backoff.failed("b", FailureKind.TRANSIENT).delay == 0.5, "another key's failures do not count"
    backoff.succeeded("b")
    assert backoff.failed("a", FailureKind.TRANSIENT).delay == 5, "another key's success resets nothing"
    backoff.succeeded("a")
    assert backoff.failed("a", FailureKind.UNAVAILABLE).delay == 0.5
    assert len(backoff) == 1


def test_transient_failures_give_up_after_enough_attempts_and_time_unavailable_ones_never() -> None:
    clock = FakeClock()
    backoff = Backoff(clock, POLICY, NO_JITTER)
    retries = []
    for _ in range(200):
        retries.append(backoff.failed("a", FailureKind.TRANSIENT))
        if retries[-1].give_up:
            break
        clock.advance(retries[-1].delay)
    last = retries[-1]
    assert last.give_up and last.seconds >= 300 and last.attempts >= 10
    assert last.attempts == len(retries)
    assert backoff.attempts("a") == 0, "a key that gave up is forgotten"

    for _ in range(1000):
        retry = backoff.failed("down", FailureKind.UNAVAILABLE)
        assert not retry.give_up
        clock.advance(retry.delay)


def test_a_permanent_failure_gives_up_at_once() -> None:
    backoff = Backoff(FakeClock(), POLICY, NO_JITTER)
    assert backoff.failed("a", FailureKind.PERMANENT) == backoff.failed("a", FailureKind.PERMANENT)
    assert backoff.failed("b", FailureKind.PERMANENT).give_up


def test_the_bucket_bounds_the_rate_of_retries_across_keys() -> None:
    clock = FakeClock()
    backoff = Backoff(clock, Policy(base=0.5, cap=5.0, rate=10.0, burst=20, give_up_attempts=10,
                                    give_up_seconds=300.0), NO_JITTER)
    delays = [backoff.failed(f"k{i}", FailureKind.TRANSIENT).delay for i in range(40)]
    assert delays[:20] == [0.5] * 20, "a burst of 20 at each key's own delay"
    assert delays[20:] == pytest.approx([(i + 1) / 10 if (i + 1) / 10 > 0.5 else 0.5 for i in range(20)])


def test_a_token_bucket_refills_at_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2.0, 2, clock)
    assert [bucket.reserve() for _ in range(4)] == [0, 0, 0.5, 1.0]
    clock.advance(1.0)
    assert bucket.reserve() == 0.5, "one second refilled two tokens, both already promised; this one waits"
    with pytest.raises(ValueError):
        TokenBucket(0, 1, clock)


def test_try_take_takes_only_a_token_that_is_there() -> None:
    clock = FakeClock()
    bucket = TokenBucket(4.0, 2, clock)
    assert [bucket.try_take(), bucket.try_take()] == [0.0, 0.0]
    assert bucket.try_take() == pytest.approx(0.25), "a quarter second until the next token"
    assert bucket.try_take() == pytest.approx(0.25), "asking took nothing"
    clock.advance(0.25)
    assert bucket.try_take() == 0.0
    assert bucket.try_take() == pytest.approx(0.25)


def test_a_request_that_timed_out_is_its_own_kind() -> None:
    assert classify(Answer(0, "POST /api/v1/x: no answer within 30 s", TIMED_OUT)) is FailureKind.TIMEOUT
    assert classify(Answer(0, "connection refused", "MaxRetryError")) is FailureKind.UNAVAILABLE


def test_timeouts_are_tolerated_a_few_times_in_a_row_then_counted_until_the_key_gives_up() -> None:
    """A request that always times out (a huge object, a hung webhook of a wrapped kind) must not be retried for
    ever, while one timeout between answers costs nothing."""
    clock = FakeClock()
    backoff = Backoff(clock, POLICY, NO_JITTER)
    retries = []
    for _ in range(200):
        retries.append(backoff.failed("slow", FailureKind.TIMEOUT))
        if retries[-1].give_up:
            break
        clock.advance(retries[-1].delay + 30.0)  # each attempt also waits out its 30 s request timeout
    last = retries[-1]
    assert last.give_up, "a key that only ever times out gives up"
    tolerated = POLICY.timeouts_tolerated
    assert last.attempts >= tolerated + POLICY.give_up_attempts and last.seconds >= POLICY.give_up_seconds
    assert last.attempts < 30, f"bounded: gave up after {last.attempts} attempts"

    # Another kind of failure in between starts the count of timeouts in a row again: a few timeouts while the
    # API server restarts (refused in between) are not counted.
    for _ in range(100):
        for kind in [FailureKind.TIMEOUT] * tolerated + [FailureKind.UNAVAILABLE]:
            retry = backoff.failed("flaky", kind)
            assert not retry.give_up
            clock.advance(retry.delay)


def test_delays_are_jittered_into_their_upper_half_so_keys_failed_together_spread_out() -> None:
    draws = iter([0.0, 0.25, 0.5, 0.75, 0.999] * 4)
    clock = FakeClock()
    backoff = Backoff(clock, POLICY, lambda: next(draws))
    first = [backoff.failed(f"k{i}", FailureKind.TRANSIENT).delay for i in range(5)]
    assert first == pytest.approx([0.25, 0.3125, 0.375, 0.4375, 0.49975]), "from [d/2, d] with d = 0.5"
    assert len(set(first)) == 5
    second = [backoff.failed(f"k{i}", FailureKind.TRANSIENT).delay for i in range(5)]
    assert all(0.5 <= d <= 1.0 for d in second)


def test_the_default_draw_spreads_a_cycle_of_failures() -> None:
    """Without a draw handed in: 100 keys that failed in the same instant do not come back in the same instant."""
    backoff = Backoff(FakeClock(), POLICY)
    delays = [backoff.failed(f"k{i}", FailureKind.TRANSIENT).delay for i in range(100)]
    assert all(0.25 <= d <= 0.5 for d in delays)
    assert len(set(delays)) > 90


def test_asking_whether_a_key_waits_never_takes_its_due_time_from_the_timer() -> None:
    clock = FakeClock()
    times = RetryTimes(clock, Policy(base=1.0, cap=8.0, rate=1000.0, burst=1000, give_up_attempts=10,
                                     give_up_seconds=300.0), draw=NO_JITTER)
    times.failed("a", FailureKind.TRANSIENT)
    assert times.waiting("a")
    clock.advance(1.0)
    # A dry run (explain, /debug, the expected starts) asks after the time came and before the timer fired.
    assert not times.waiting("a")
    assert not times.waiting("a")
    assert times.remaining("a") == 0.0, "the timer still finds its time come"
    assert times.remaining("a") is None, "and takes it: once"
