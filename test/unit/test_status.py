"""Status building: upstream vocabulary, a bounded condition log keyed by (type, reason) whose last entry of a type
is its current value, pendingpodconditions, and no change when nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mcad.api.statusview import status_view
from mcad.api.views import Unschedulable
from mcad.model import lifecycle, status

T0 = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=UTC)
T1 = T0 + timedelta(seconds=5)
T2 = T0 + timedelta(seconds=10)
T3 = T0 + timedelta(seconds=15)


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
    status.requeued(original, T1, priority=0, reason="r", message="m", requeuings=1, requeue_wait=1)
    assert repr(original) == snapshot
    stuck = status.with_pod_counts(original, T1, pending=1, running=0, succeeded=0, failed_=0,
                                   unschedulable=[("p", Unschedulable("m", ""))])
    snapshot = repr(stuck)
    status.with_pod_counts(stuck, T2, pending=0, running=1, succeeded=0, failed_=0)
    status.dispatched(stuck, T2, priority=0)
    assert repr(stuck) == snapshot


# -- the condition log -----------------------------------------------------------------------------------------


def entries(s: dict[str, object], type_: str) -> list[tuple[str, str]]:
    """(reason, lastTransitionMicroTime) of every entry of ``type_``, oldest first."""
    return [(c.get("reason", ""), c["lastTransitionMicroTime"])  # type: ignore[index, union-attr]
            for c in s["conditions"] if c["type"] == type_]  # type: ignore[index, union-attr]


def requeue(s: dict[str, object], now: datetime, message: str = "minimum=1, running=0") -> dict[str, object]:
    return status.requeued(s, now, priority=0, reason=status.MIN_PODS_NOT_RUNNING, message=message, requeuings=1,
                           requeue_wait=2)


def test_a_later_backoff_reason_keeps_the_requeues_preemption_triggered_entry() -> None:
    ran = status.dispatched({}, T0, priority=0)
    back = requeue(ran, T1)
    assert status.is_draining(back)
    waits = status.queued(back, T2, priority=0, why="short of cpu=1")
    # Upstream's "Fail Fast Preemption" spec looks for a PreemptionTriggered condition after this point.
    assert entries(waits, "Backoff") == [("PreemptionTriggered", status.micro_time(T1)),
                                         ("AppWrapperNotRunnable.", status.micro_time(T2))]
    assert status.latest(waits["conditions"], "Backoff")["reason"] == "AppWrapperNotRunnable."  # type: ignore[index, arg-type]
    assert not status.is_draining(waits), "readers go by the latest Backoff"
    assert waits["conditions"][-1]["type"] == "Backoff"  # type: ignore[index]
    assert status.queued(waits, T3, priority=0, why="short of cpu=1") == waits, "same decision, same status"


def test_a_second_requeue_moves_its_entries_last_and_stamps_them_now() -> None:
    first = status.queued(requeue(status.dispatched({}, T0, priority=0), T1), T1, priority=0, why="short of cpu=1")
    second = requeue(status.dispatched(first, T2, priority=0), T3)  # the very same message as the first requeue
    assert entries(second, "Backoff") == [("AppWrapperNotRunnable.", status.micro_time(T1)),
                                          ("PreemptionTriggered", status.micro_time(T3))]
    assert entries(second, "PreemptCandidate") == [("MinPodsNotRunning", status.micro_time(T3))]
    assert status.is_draining(second)


def test_a_requeue_is_an_event_even_when_it_says_the_same_as_the_last_one() -> None:
    once = requeue(status.dispatched({}, T0, priority=0), T1)
    twice = requeue(once, T2)
    assert entries(twice, "PreemptCandidate") == [("MinPodsNotRunning", status.micro_time(T2))]
    assert entries(twice, "Backoff") == [("PreemptionTriggered", status.micro_time(T2))]


def test_a_new_message_alone_keeps_the_transition_time() -> None:
    first = status.queued({}, T0, priority=0, why="short of cpu=1; position 2 in the queue")
    second = status.queued(first, T1, priority=0, why="short of cpu=1; position 1 in the queue")
    [backoff] = [c for c in second["conditions"] if c["type"] == "Backoff"]
    assert backoff["message"].endswith("position 1 in the queue")
    assert backoff["lastUpdateMicroTime"] == status.micro_time(T1)
    assert backoff["lastTransitionMicroTime"] == status.micro_time(T0), "in Backoff since T0"


def test_a_new_status_or_a_return_to_an_older_reason_is_a_transition() -> None:
    log = status.with_condition([], "ClusterAvailable", T0, reason="Unreachable", status="False")
    log = status.with_condition(log, "ClusterAvailable", T1, reason="Unreachable", status="True")
    assert [(c["status"], c["lastTransitionMicroTime"]) for c in log] == [("True", status.micro_time(T1))]
    log = status.with_condition(log, "ClusterAvailable", T2, reason="Healthy")
    log = status.with_condition(log, "ClusterAvailable", T3, reason="Unreachable", status="True")
    assert [(c["reason"], c["lastUpdateMicroTime"], c["lastTransitionMicroTime"]) for c in log] == [
        ("Healthy", status.micro_time(T2), status.micro_time(T2)),
        ("Unreachable", status.micro_time(T3), status.micro_time(T3))]


def test_the_log_is_bounded_oldest_first_and_keeps_the_current_entry_of_every_type() -> None:
    log = status.with_condition([], "Init", T0)
    log = status.with_condition(log, "Queueing", T0, reason="AwaitingHeadOfLine")
    for i in range(3 * status.MAX_CONDITIONS):
        log = status.with_condition(log, "Backoff", T0 + timedelta(seconds=i), reason=f"r{i}")
        log = status.with_condition(log, "PreemptCandidate", T0 + timedelta(seconds=i), reason=f"p{i}")
    assert len(log) == status.MAX_CONDITIONS
    assert [c["type"] for c in log[:2]] == ["Init", "Queueing"], "the only entries of their types are kept"
    last = 3 * status.MAX_CONDITIONS - 1
    assert status.latest(log, "Backoff")["reason"] == f"r{last}"  # type: ignore[index]
    assert status.latest(log, "PreemptCandidate")["reason"] == f"p{last}"  # type: ignore[index]
    stamps = [c["lastUpdateMicroTime"] for c in log[2:]]
    assert stamps == sorted(stamps), "the newest history is what is kept, in order"
    assert {c["reason"] for c in log[2:]} == {f"{t}{i}" for t in "rp" for i in range(last - 8, last + 1)}


def test_the_bound_holds_even_with_more_types_than_entries() -> None:
    log: list[dict[str, object]] = []
    for i in range(status.MAX_CONDITIONS + 5):
        log = status.with_condition(log, f"T{i}", T0, reason="x")  # type: ignore[arg-type]
    assert [c["type"] for c in log] == [f"T{i}" for i in range(5, status.MAX_CONDITIONS + 5)]


def test_readers_read_the_latest_entry_of_a_type() -> None:
    # Two Dispatched entries can only come from someone else's writes; the latest one is the current dispatch.
    s = {"conditions": [{"type": "Dispatched", "reason": "Old", "lastTransitionMicroTime": status.micro_time(T0)},
                        {"type": "Backoff", "reason": "PreemptionTriggered"},
                        {"type": "Dispatched", "reason": "AppWrapperRunnable",
                         "lastTransitionMicroTime": status.micro_time(T1)},
                        {"type": "Backoff", "reason": "AppWrapperNotRunnable."}]}
    assert lifecycle.dispatched_at(status_view(s)) == T1
    assert not status.is_draining(s)
    assert status.latest(s["conditions"], "Running") is None
    assert status.latest(None, "Backoff") is None


# -- pendingpodconditions --------------------------------------------------------------------------------------

NO_ROOM = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No victims."


def counts(s: dict[str, object], now: datetime, *pods: tuple[str, Unschedulable]) -> dict[str, object]:
    return status.with_pod_counts(s, now, pending=len(pods), running=1, succeeded=0, failed_=0, unschedulable=pods)


def test_pending_pod_conditions_name_each_unschedulable_pod_as_upstream_writes_them() -> None:
    ran = status.dispatched({}, T0, priority=0)
    s = counts(ran, T1, ("w-1", Unschedulable(NO_ROOM, "2026-11-21T12:00:03Z")), ("w-0", Unschedulable("x", "")))
    assert s["pendingpodconditions"] == [
        {"podname": "w-0", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                           "message": "x"}]},
        {"podname": "w-1", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                           "message": NO_ROOM, "lastTransitionTime": "2026-11-21T12:00:03Z"}]}]
    again = counts(s, T2, ("w-0", Unschedulable("x", "")), ("w-1", Unschedulable(NO_ROOM, "2026-11-21T12:00:03Z")))
    assert again == s, "the same pods later: the same status (no write)"
    cleared = counts(s, T3)
    assert "pendingpodconditions" not in cleared
    assert counts(cleared, T3) == cleared


def test_pending_pod_conditions_are_bounded() -> None:
    pods = [(f"w-{i:03d}", Unschedulable(NO_ROOM, "")) for i in range(100)]
    s = counts(status.dispatched({}, T0, priority=0), T1, *reversed(pods))
    assert [p["podname"] for p in s["pendingpodconditions"]] == [  # type: ignore[attr-defined, index]
        f"w-{i:03d}" for i in range(status.MAX_PENDING_PODS)]
    assert s["pending"] == 100, "the count still counts them all"


def test_pending_pod_conditions_go_with_the_dispatch_they_belong_to() -> None:
    stuck = counts(status.dispatched({}, T0, priority=0), T1, ("w-0", Unschedulable(NO_ROOM, "")))
    assert stuck["pendingpodconditions"]
    for after in (status.dispatched(stuck, T2, priority=0), requeue(stuck, T2), status.completed(stuck, T2),
                  status.failed(stuck, T2, priority=0, reason="r", message="m")):
        assert "pendingpodconditions" not in after
    assert status.hold_completion(stuck, T2)["pendingpodconditions"], "still dispatched: still followed"



def test_the_expected_start_is_kept_while_queued_and_dropped_when_it_leaves_the_queue() -> None:
    queued = status.queued({}, T0, priority=0, why="short of cpu")
    known = status.with_estimate(queued, at=T0 + timedelta(minutes=10, milliseconds=600))
    assert known["estimatedStart"] == "2026-11-21T12:10:01Z", "RFC 3339, to the nearest second"
    assert "estimateWhy" not in known and known["conditions"] == queued["conditions"], "nothing else changes"
    unknown = status.with_estimate(known, at=None, why="no limits")
    assert "estimatedStart" not in unknown and unknown["estimateWhy"] == "no limits"
    assert status.with_estimate(unknown, at=T0)["estimatedStart"] == "2026-11-21T12:00:00Z"
    assert status.queued(known, T1, priority=0, why="short of memory")["estimatedStart"] == known["estimatedStart"]
    for gone in (status.dispatched(known, T1, priority=0), status.dispatched(unknown, T1, priority=0),
                 status.failed(unknown, T1, priority=0, reason="InvalidSpec", message="bad"),
                 status.completed(known, T1),
                 status.requeued(known, T1, priority=0, reason="r", message="m", requeuings=1, requeue_wait=1)):
        assert "estimatedStart" not in gone and "estimateWhy" not in gone, gone
