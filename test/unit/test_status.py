"""Status building: upstream vocabulary, one entry per condition type, and no change when nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mcad import status

T0 = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=UTC)
T1 = T0 + timedelta(seconds=5)


def types(s: dict[str, object]) -> list[str]:
    return [c["type"] for c in s["conditions"]]  # type: ignore[index, union-attr]


def test_micro_time_has_microseconds_and_z() -> None:
    assert status.micro_time(T0) == "2026-11-21T12:00:00.123456Z"


def test_first_queued_status_has_the_upstream_vocabulary() -> None:
    s = status.queued({}, T0, priority=3, why="short of cpu=2 (needs 4, 2 free)")
    assert s["state"] == "Pending"
    assert s["canrun"] is False
    assert s["queuejobstate"] == "Backoff"
    assert s["controllerfirsttimestamp"] == "2026-11-21T12:00:00.123456Z"
    assert s["systempriority"] == 3.0
    assert types(s) == ["Init", "Queueing", "HeadOfLine", "Backoff"]
    backoff = s["conditions"][-1]
    assert backoff["reason"] == "AppWrapperNotRunnable."
    assert backoff["message"] == "Insufficient resources to dispatch AppWrapper. short of cpu=2 (needs 4, 2 free)"
    assert backoff["status"] == "True"
    assert s["message"] == "short of cpu=2 (needs 4, 2 free)"
    assert (s["pending"], s["running"], s["Succeeded"], s["failed"]) == (0, 0, 0, 0)


def test_same_decision_later_changes_nothing() -> None:
    first = status.queued({}, T0, priority=0, why="short of cpu=1")
    again = status.queued(first, T1, priority=0, why="short of cpu=1")
    assert again == first


def test_new_reason_updates_the_entry_and_moves_it_last() -> None:
    first = status.queued({}, T0, priority=0, why="short of cpu=1")
    second = status.queued(first, T1, priority=0, why="short of memory=1Gi")
    assert types(second) == ["Init", "Queueing", "HeadOfLine", "Backoff"]
    assert second["conditions"][-1]["lastUpdateMicroTime"] == status.micro_time(T1)
    assert second["conditions"][0] == first["conditions"][0], "Init keeps its first timestamp"


def test_dispatch_after_backoff_keeps_the_log_and_clears_the_message() -> None:
    waited = status.queued({}, T0, priority=0, why="short of cpu=1")
    s = status.dispatched(waited, T1, priority=0)
    assert types(s) == ["Init", "Queueing", "HeadOfLine", "Backoff", "Dispatched"]
    assert s["state"] == "Running"
    assert s["canrun"] is True
    assert s["queuejobstate"] == "Dispatched"
    assert s["conditions"][-1]["reason"] == "AppWrapperRunnable"
    assert s["controllerfirstdispatchtimestamp"] == status.micro_time(T1)
    assert s["controllerfirsttimestamp"] == status.micro_time(T0)
    assert "message" not in s


def test_dispatch_on_first_sight_matches_the_seed_sequence() -> None:
    s = status.dispatched({}, T0, priority=0)
    assert types(s) == ["Init", "Queueing", "HeadOfLine", "Dispatched"]


def test_failed_is_terminal_and_says_why() -> None:
    s = status.failed({}, T0, priority=0, reason="ItemCreationFailure.", message="GenericItems[0] (Pod x): boom")
    assert s["state"] == "Failed"
    assert s["canrun"] is False
    assert s["queuejobstate"] == "Failed"
    assert s["conditions"][-1] == {"type": "Failed", "status": "True", "reason": "ItemCreationFailure.",
                                   "message": "GenericItems[0] (Pod x): boom",
                                   "lastUpdateMicroTime": status.micro_time(T0),
                                   "lastTransitionMicroTime": status.micro_time(T0)}


def test_pod_counts_add_running_once() -> None:
    s = status.dispatched({}, T0, priority=0)
    counted = status.with_pod_counts(s, T1, pending=1, running=2, succeeded=0, failed_=0)
    assert (counted["pending"], counted["running"]) == (1, 2)
    assert types(counted)[-1] == "Running"
    assert counted["conditions"][-1]["reason"] == "PodsRunning"
    assert counted["queuejobstate"] == "Running"
    assert status.with_pod_counts(counted, T1 + timedelta(seconds=1), pending=1, running=2, succeeded=0,
                                  failed_=0) == counted


def test_builders_never_mutate_their_input() -> None:
    original = status.queued({}, T0, priority=0, why="x")
    snapshot = repr(original)
    status.dispatched(original, T1, priority=0)
    status.failed(original, T1, priority=0, reason="r", message="m")
    status.with_pod_counts(original, T1, pending=0, running=1, succeeded=0, failed_=0)
    assert repr(original) == snapshot
