"""Leader election decisions (pure): when a candidate creates, takes, renews or waits, and the records it writes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcad.cli import controller
from mcad.k8s.leader import (
    DEFAULT_NAMESPACE,
    Decision,
    LeaseRecord,
    Observation,
    decide,
    default_identity,
    default_namespace,
    micro_time,
    next_poll_in,
    next_record,
    observe,
    released_record,
    validate_timings,
)

HELD_BY_A = LeaseRecord(holder="a", duration_seconds=15, acquire_time="t0", renew_time="t0", transitions=3)


def test_a_changed_record_restarts_the_observation_clock_and_an_unchanged_one_does_not() -> None:
    first = observe(None, HELD_BY_A, now=100.0)
    assert first == Observation(HELD_BY_A, 100.0)
    assert observe(first, HELD_BY_A, now=110.0) is first
    renewed = LeaseRecord(holder="a", duration_seconds=15, acquire_time="t0", renew_time="t1", transitions=3)
    assert observe(first, renewed, now=110.0) == Observation(renewed, 110.0)


def test_no_lease_means_create() -> None:
    assert decide(None, identity="b", now=0.0, fallback_duration=15) is Decision.CREATE


def test_a_live_claim_of_another_holder_means_wait_until_it_lapses_on_our_clock() -> None:
    seen = Observation(HELD_BY_A, at=100.0)
    assert decide(seen, identity="b", now=114.9, fallback_duration=99) is Decision.WAIT
    assert decide(seen, identity="b", now=115.0, fallback_duration=99) is Decision.TAKE


def test_the_holders_renew_time_is_never_compared_with_our_clock() -> None:
    # A renewTime a year in the past (the holder's clock is off) does not make the claim look lapsed.
    skewed = LeaseRecord(holder="a", duration_seconds=15, renew_time="2000-01-01T00:00:00.000000Z")
    assert decide(Observation(skewed, at=100.0), identity="b", now=101.0, fallback_duration=15) is Decision.WAIT


def test_no_holder_means_take_at_once() -> None:
    released = released_record(HELD_BY_A, now="t9")
    assert decide(Observation(released, at=100.0), identity="b", now=100.0, fallback_duration=15) is Decision.TAKE


def test_our_own_claim_means_renew() -> None:
    assert decide(Observation(HELD_BY_A, at=0.0), identity="a", now=1e9, fallback_duration=15) is Decision.RENEW


def test_a_record_without_a_duration_uses_ours() -> None:
    undated = LeaseRecord(holder="a")
    assert decide(Observation(undated, at=100.0), identity="b", now=104.0, fallback_duration=5) is Decision.WAIT
    assert decide(Observation(undated, at=100.0), identity="b", now=105.0, fallback_duration=5) is Decision.TAKE


def test_creating_starts_at_zero_transitions() -> None:
    assert next_record(None, identity="b", duration_seconds=15, now="t5") == LeaseRecord(
        holder="b", duration_seconds=15, acquire_time="t5", renew_time="t5", transitions=0)


def test_taking_over_counts_a_transition_and_resets_the_acquire_time() -> None:
    assert next_record(HELD_BY_A, identity="b", duration_seconds=4, now="t5") == LeaseRecord(
        holder="b", duration_seconds=4, acquire_time="t5", renew_time="t5", transitions=4)


def test_taking_a_released_lease_counts_a_transition_too() -> None:
    released = released_record(HELD_BY_A, now="t6")
    assert next_record(released, identity="b", duration_seconds=15, now="t7").transitions == 4


def test_renewing_keeps_acquire_time_and_transitions() -> None:
    assert next_record(HELD_BY_A, identity="a", duration_seconds=15, now="t5") == LeaseRecord(
        holder="a", duration_seconds=15, acquire_time="t0", renew_time="t5", transitions=3)


def test_releasing_clears_the_holder_and_keeps_the_count() -> None:
    assert released_record(HELD_BY_A, now="t8") == LeaseRecord(
        holder="", duration_seconds=1, acquire_time="t8", renew_time="t8", transitions=3)


def test_spec_round_trip_and_tolerance_of_missing_or_odd_fields() -> None:
    assert LeaseRecord.from_spec(HELD_BY_A.to_spec()) == HELD_BY_A
    assert LeaseRecord.from_spec(None) == LeaseRecord()
    assert LeaseRecord.from_spec({"holderIdentity": None, "leaseDurationSeconds": "15",
                                  "leaseTransitions": True}) == LeaseRecord()


def test_micro_time_is_the_api_format() -> None:
    assert micro_time(datetime(2024, 5, 6, 7, 8, 9, 12, tzinfo=UTC)) == "2024-05-06T07:08:09.000012Z"


def test_a_standby_polls_every_retry_period_but_wakes_when_the_claim_lapses() -> None:
    seen = Observation(HELD_BY_A, at=100.0)
    assert next_poll_in(seen, identity="b", now=101.0, retry_period=2, fallback_duration=15) == 2
    assert next_poll_in(seen, identity="b", now=114.5, retry_period=2, fallback_duration=15) == pytest.approx(0.5)
    assert next_poll_in(seen, identity="b", now=120.0, retry_period=2, fallback_duration=15) == 0
    assert next_poll_in(None, identity="b", now=0.0, retry_period=2, fallback_duration=15) == 2


@pytest.mark.parametrize("phase", [0.0, 0.1, 0.25, 0.49])
def test_protocol_a_standby_takes_over_within_duration_plus_retry_of_the_last_renewal(phase: float) -> None:
    """Step a leader (renewing every retry period until it crashes) and a standby polling at offset ``phase``
    through time with the pure functions: the standby waits out a full duration from the last renewal it saw,
    and takes over no later than ``duration + retry`` after that renewal."""
    duration, retry, crash = 4, 0.5, 10.0
    renewals = [i * retry for i in range(int(crash / retry) + 1)]  # the leader's writes, the last at the crash
    record_at = lambda t: LeaseRecord(holder="a", duration_seconds=duration,  # noqa: E731
                                      renew_time=str(max(r for r in renewals if r <= t)))
    observed: Observation | None = None
    now = phase
    while True:
        observed = observe(observed, record_at(now), now)
        if decide(observed, identity="b", now=now, fallback_duration=duration) is Decision.TAKE:
            break
        assert now < crash + duration + retry, "the standby never took over"
        now += next_poll_in(observed, identity="b", now=now, retry_period=retry, fallback_duration=duration)
    assert crash + duration <= now <= crash + duration + retry


@pytest.mark.parametrize(("lease", "renew", "retry", "words"), [
    (10, 10, 2, "renew deadline (10 s) must be shorter than the lease duration (10 s)"),
    (15, 10, 10, "retry period (10 s) must be shorter than the renew deadline (10 s)"),
    (15, 10, 0, "must be positive"),
])
def test_timings_that_could_give_two_leaders_are_refused(lease: float, renew: float, retry: float,
                                                         words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate_timings(lease, renew, retry)
    validate_timings(15, 10, 2)


def test_identity_is_the_pod_name_plus_a_random_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "mcad-controller-7d9f-abcde")
    first, second = default_identity(), default_identity()
    assert first.startswith("mcad-controller-7d9f-abcde_") and first != second
    monkeypatch.delenv("POD_NAME")
    assert default_identity().rsplit("_", 1)[0]


def test_namespace_from_env_then_service_account_file_then_default(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    account_file = tmp_path / "namespace"
    account_file.write_text("from-file\n")
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert default_namespace(account_file) == "from-env"
    monkeypatch.delenv("POD_NAMESPACE")
    assert default_namespace(account_file) == "from-file"
    assert default_namespace(tmp_path / "missing") == DEFAULT_NAMESPACE


def test_the_controller_refuses_bad_timings_before_connecting(tmp_path: Path) -> None:
    result = CliRunner().invoke(controller.main, [
        "--kubeconfig", str(tmp_path / "never-read"), "--leader-elect",
        "--leader-elect-lease-duration", "4", "--leader-elect-renew-deadline", "5"])
    assert result.exit_code == 2
    assert "renew deadline (5.0 s) must be shorter than the lease duration (4.0 s)" in result.output


def test_the_controller_ignores_election_timings_without_leader_election(tmp_path: Path) -> None:
    result = CliRunner().invoke(controller.main, [
        "--kubeconfig", str(tmp_path / "missing"), "--connect-only",
        "--leader-elect-lease-duration", "4", "--leader-elect-renew-deadline", "5"])
    assert result.exit_code == 2  # it got as far as connecting
    assert json.loads(result.stderr.strip().splitlines()[-1])["event"] == "cannot connect to the API server"


def test_controller_help_explains_the_election_flags() -> None:
    result = CliRunner().invoke(controller.main, ["--help"])
    for flag in ("--leader-elect / --no-leader-elect", "--leader-elect-lease-name", "--leader-elect-namespace",
                 "--leader-elect-lease-duration", "--leader-elect-renew-deadline", "--leader-elect-retry-period"):
        assert flag in result.output
