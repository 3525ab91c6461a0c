"""The deciding part of the event recorder, on a stepped clock: token buckets, aggregation keys and windows, the
queue bound, what counts as dropped and why, Event names and bodies, and the sender's retry policy. No threads,
no API server."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from mcad.k8s import events
from mcad.k8s.eventlimits import EventLimits, LogLimiter, TokenBucket
from mcad.k8s.events import (
    DROP_GLOBAL,
    DROP_INVALID,
    DROP_PER_OBJECT,
    DROP_QUEUE_FULL,
    DROP_SEND_FAILED,
    DROP_STOPPED,
    NORMAL,
    WARNING,
    EventPlanner,
    ObjectRef,
    Outcome,
    Retry,
)

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
START = datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)


def aw(name: str = "job", uid: str | None = None, namespace: str = "team-a") -> ObjectRef:
    return ObjectRef.appwrapper(namespace, name, uid or f"uid-{name}")


class Planner:
    """An ``EventPlanner`` and the time it is asked at, which the test steps."""

    def __init__(self, limits: EventLimits | None = None) -> None:
        self.seconds = 0.0
        self.planner = EventPlanner(limits, now=self.seconds)

    def advance(self, seconds: float) -> None:
        self.seconds += seconds

    def plan(self, ref: ObjectRef, reason: str = events.QUEUED, message: str = "waiting",
             type_: str = NORMAL) -> Outcome | str:
        return self.planner.plan(ref, type_, reason, message, monotonic=self.seconds,
                                 wall=START + timedelta(seconds=self.seconds))

    def take_all(self) -> list[events.EventWrite]:
        taken = []
        while (write := self.planner.take()) is not None:
            taken.append(write)
        return taken


# -- token buckets --

def test_token_bucket_gives_its_burst_then_refills_at_its_rate_and_never_beyond_the_burst() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.take(0.4)  # 0.8 of a token
    assert bucket.take(0.5)
    assert not bucket.take(0.5)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]  # capped at 3, not 200


def test_token_bucket_ignores_a_clock_that_goes_back() -> None:
    bucket = TokenBucket(rate=1.0, burst=1, now=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(5.0)
    assert not bucket.take(10.5)  # the step back did not reset the stamp
    assert bucket.take(11.0)


# -- per-object, global and queue limits --

def test_one_object_gets_its_burst_then_one_event_per_interval_while_others_are_unaffected() -> None:
    p = Planner(EventLimits(per_object_burst=25, per_object_interval=60.0))
    noisy = aw("noisy")
    outcomes = [p.plan(noisy, message=f"blocked by cpu {i}") for i in range(26)]
    assert outcomes == [Outcome.QUEUED] * 25 + [DROP_PER_OBJECT]
    assert p.plan(aw("quiet")) is Outcome.QUEUED
    p.advance(59.0)
    assert p.plan(noisy, message="blocked by memory") == DROP_PER_OBJECT
    p.advance(1.0)
    assert p.plan(noisy, message="blocked by memory") is Outcome.QUEUED
    assert p.plan(noisy, message="blocked by gpu") == DROP_PER_OBJECT
    counters = p.planner.counters()
    assert counters.dropped == {DROP_PER_OBJECT: 3}
    assert counters.recorded == 30
    assert counters.queued == 27


def test_the_global_bucket_bounds_all_objects_together() -> None:
    p = Planner(EventLimits(global_burst=100, global_rate=10.0))
    outcomes = [p.plan(aw(f"aw-{i}")) for i in range(150)]
    assert outcomes.count(Outcome.QUEUED) == 100
    assert outcomes[100:] == [DROP_GLOBAL] * 50
    p.advance(0.1)  # one token
    assert [p.plan(aw(f"late-{i}")) for i in range(2)] == [Outcome.QUEUED, DROP_GLOBAL]
    assert p.planner.counters().dropped == {DROP_GLOBAL: 51}


def test_a_full_queue_drops_without_spending_tokens_and_taking_a_write_makes_room() -> None:
    p = Planner(EventLimits(queue_size=3, per_object_burst=4))
    ref = aw()
    assert [p.plan(ref, message=str(i)) for i in range(4)] == [Outcome.QUEUED] * 3 + [DROP_QUEUE_FULL]
    assert len(p.planner) == 3
    assert p.planner.take() is not None
    assert p.plan(ref, message="3") is Outcome.QUEUED  # the 4th token was not spent by the queue_full drop
    assert p.plan(ref, message="4") == DROP_QUEUE_FULL
    p.take_all()
    assert p.plan(ref, message="5") == DROP_PER_OBJECT  # burst 4 now spent
    assert p.planner.counters().dropped == {DROP_QUEUE_FULL: 2, DROP_PER_OBJECT: 1}


def test_forgotten_objects_start_with_a_full_bucket_so_memory_stays_bounded() -> None:
    p = Planner(EventLimits(per_object_burst=1, max_tracked=2))
    assert p.plan(aw("a"), message="1") is Outcome.QUEUED
    assert p.plan(aw("a"), message="2") == DROP_PER_OBJECT
    p.plan(aw("b"))
    p.plan(aw("c"))  # three objects, room for two: "a", least recently used, is forgotten
    assert p.plan(aw("a"), message="3") is Outcome.QUEUED


# -- aggregation --

def test_a_repeat_while_the_create_is_queued_folds_into_it_at_no_cost() -> None:
    p = Planner(EventLimits(global_burst=1, global_rate=0.001))
    ref = aw()
    assert p.plan(ref) is Outcome.QUEUED
    p.advance(5.0)
    assert p.plan(ref) is Outcome.FOLDED  # the global bucket is empty: folding spends no token
    (write,) = p.take_all()
    assert write.create
    assert (write.count, write.calls) == (2, 2)
    assert write.first_timestamp == "2024-01-01T12:00:00Z"
    assert write.last_timestamp == "2024-01-01T12:00:05Z"
    counters = p.planner.counters()
    assert (counters.recorded, counters.aggregated, counters.dropped) == (2, 1, {})


def test_a_repeat_after_the_create_was_taken_patches_the_same_event_with_the_next_count() -> None:
    p = Planner()
    ref = aw()
    p.plan(ref)
    (create,) = p.take_all()
    p.planner.finished(create, ok=True)
    p.advance(30.0)
    assert p.plan(ref) is Outcome.QUEUED
    (patch,) = p.take_all()
    assert not patch.create
    assert patch.name == create.name
    assert patch.count == 2
    assert patch.first_timestamp == create.first_timestamp
    assert patch.last_timestamp == "2024-01-01T12:00:30Z"
    assert events.patch_body(patch) == {"count": 2, "lastTimestamp": "2024-01-01T12:00:30Z"}
    p.planner.finished(patch, ok=True)
    assert (p.planner.counters().sent, p.planner.counters().aggregated) == (2, 1)


@pytest.mark.parametrize("change", ["uid", "type", "reason", "message"])
def test_the_aggregation_key_is_object_uid_type_reason_and_message(change: str) -> None:
    p = Planner()
    p.plan(aw("job", uid="one"), events.REQUEUED, "too few pods", WARNING)
    (first,) = p.take_all()
    other = {
        "uid": (aw("job", uid="two"), events.REQUEUED, "too few pods", WARNING),  # a re-created namesake
        "type": (aw("job", uid="one"), events.REQUEUED, "too few pods", NORMAL),
        "reason": (aw("job", uid="one"), events.PREEMPTED, "too few pods", WARNING),
        "message": (aw("job", uid="one"), events.REQUEUED, "too few pods (1 of 4)", WARNING),
    }[change]
    assert p.plan(*other) is Outcome.QUEUED
    (second,) = p.take_all()
    assert second.create
    assert second.name != first.name


def test_a_repeat_after_the_window_starts_a_new_event_and_within_it_extends_the_old_one() -> None:
    p = Planner(EventLimits(aggregation_window=600.0))
    ref = aw()
    p.plan(ref)
    (first,) = p.take_all()
    p.advance(599.0)
    p.plan(ref)
    (patch,) = p.take_all()
    assert (patch.create, patch.name, patch.count) == (False, first.name, 2)
    p.advance(600.5)  # the window runs from the last occurrence
    p.plan(ref)
    (fresh,) = p.take_all()
    assert (fresh.create, fresh.count) == (True, 1)
    assert fresh.name != first.name


def test_a_create_given_up_on_is_forgotten_so_the_next_occurrence_creates_again() -> None:
    p = Planner()
    ref = aw()
    p.plan(ref)
    p.plan(ref)
    (write,) = p.take_all()
    p.planner.finished(write, ok=False)
    assert p.planner.counters().dropped == {DROP_SEND_FAILED: 2}  # both calls it carried
    p.plan(ref)
    (again,) = p.take_all()
    assert (again.create, again.count) == (True, 1)


def test_a_renamed_create_is_what_later_repeats_patch() -> None:
    p = Planner()
    ref = aw()
    p.plan(ref)
    (write,) = p.take_all()
    write.name = p.planner.new_name(ref.name, START)  # as the sender does after a 409
    p.planner.finished(write, ok=True)
    p.plan(ref)
    (patch,) = p.take_all()
    assert patch.name == write.name


# -- bad input, stop, counters --

@pytest.mark.parametrize(("ref", "type_", "reason"), [
    (aw(), "Info", events.QUEUED),
    (aw(), NORMAL, ""),
    (ObjectRef.appwrapper("team-a", "", "uid"), NORMAL, events.QUEUED),
])
def test_invalid_events_are_counted_not_queued(ref: ObjectRef, type_: str, reason: str) -> None:
    p = Planner()
    assert p.plan(ref, reason, "m", type_) == DROP_INVALID
    assert len(p.planner) == 0
    assert p.planner.counters().dropped == {DROP_INVALID: 1}


def test_drop_queued_counts_every_call_the_queued_writes_carried() -> None:
    p = Planner()
    p.plan(aw("a"))
    p.plan(aw("a"))
    p.plan(aw("b"))
    assert p.planner.drop_queued(DROP_STOPPED) == 2
    counters = p.planner.counters()
    assert counters.dropped == {DROP_STOPPED: 3}
    assert counters.queued == 0


def test_counters_are_a_snapshot() -> None:
    p = Planner(EventLimits(per_object_burst=1))
    p.plan(aw(), message="1")
    p.plan(aw(), message="2")
    snapshot = p.planner.counters()
    p.planner.send_error(503)
    p.plan(aw(), message="3")
    assert snapshot.dropped == {DROP_PER_OBJECT: 1}
    assert snapshot.send_errors == {}
    assert p.planner.counters().send_errors == {503: 1}


def test_a_recorder_never_raises_to_its_caller_and_counts_what_it_refused() -> None:
    # Never started: no thread, and the connection is never used.
    recorder = events.EventRecorder(None, instance="test")  # type: ignore[arg-type]
    recorder.record(None, NORMAL, events.QUEUED, "a bug in the caller")  # type: ignore[arg-type]
    recorder.record(aw(), "Bogus", events.QUEUED, "m")  # type: ignore[arg-type]
    recorder.record(aw(), NORMAL, events.QUEUED, "m")
    assert recorder.counters().queued == 1
    assert recorder.stop(0.0)
    recorder.record(aw(), NORMAL, events.DISPATCHED, "after stop")
    counters = recorder.counters()
    assert counters.dropped == {DROP_INVALID: 1, DROP_STOPPED: 2}
    assert counters.queued == 0


def test_the_dashboard_keeps_what_was_recorded_even_when_rate_limited_with_messages_cut() -> None:
    from mcad.k8s.recentevents import RecentEvents
    recent = RecentEvents()
    recorder = events.EventRecorder(None, instance="test", limits=EventLimits(per_object_burst=1),  # type: ignore[arg-type]
                                    recent=recent)
    recorder.record(aw(), NORMAL, events.QUEUED, "first")
    recorder.record(aw(), WARNING, events.QUEUED, "x" * 5000)  # over the object's burst: not sent, still shown
    recorder.record(aw(), "Bogus", events.QUEUED, "invalid")  # type: ignore[arg-type]
    shown = recent.of("team-a", "job", "uid-job")
    assert [e["type"] for e in shown] == [WARNING, NORMAL]
    assert len(shown[0]["message"].encode()) <= events.MAX_MESSAGE_BYTES
    assert recorder.counters().dropped == {DROP_PER_OBJECT: 1, DROP_INVALID: 1}


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="global_rate"):
        EventLimits(global_rate=0)
    with pytest.raises(ValueError, match="queue_size"):
        EventLimits(queue_size=0)


# -- names, messages, bodies --

def test_event_names_are_the_object_name_and_a_strictly_increasing_hex_stamp() -> None:
    planner = EventPlanner()
    names = [planner.new_name("job-1", START) for _ in range(3)]
    assert len(set(names)) == 3
    stamps = [int(name.removeprefix("job-1."), 16) for name in names]
    assert stamps == sorted(stamps)
    assert stamps[0] == int(START.timestamp() * 1e9)


def test_a_long_object_name_is_shortened_to_a_valid_event_name() -> None:
    long_name = "a" * 230 + "-b." + "c" * 20  # a legal 253-character AppWrapper name
    name = events.event_name(long_name, 0x17A0F2B3C4D5E6F7)
    assert len(name) <= 253
    assert DNS_SUBDOMAIN.match(name), name
    assert name.endswith(".17a0f2b3c4d5e6f7")
    cut_at_dash = events.event_name("x" * 235 + "-" + "y" * 17, 0x17A0F2B3C4D5E6F7)
    assert DNS_SUBDOMAIN.match(cut_at_dash), cut_at_dash


def test_long_messages_are_cut_at_1_kib_on_a_character_boundary() -> None:
    assert events.truncate_message("short") == "short"
    cut = events.truncate_message("é" * 600)  # 1,200 bytes
    assert len(cut.encode()) <= 1024
    assert cut.endswith("…")
    assert set(cut[:-1]) == {"é"}
    p = Planner()
    p.plan(aw(), message="x" * 5000)
    (write,) = p.take_all()
    assert len(write.message.encode()) == 1024


def test_the_event_body_points_at_the_appwrapper_and_names_the_reporter() -> None:
    p = Planner()
    ref = ObjectRef.appwrapper("team-a", "trainer", "0b5c")
    p.plan(ref, events.FAILED, "Job train failed (BackoffLimitExceeded)", WARNING)
    (write,) = p.take_all()
    body = events.event_body(write, component="mcad-controller", instance="mcad-7d9f")
    assert body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": write.name, "namespace": "team-a"},
        "involvedObject": {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                           "namespace": "team-a", "name": "trainer", "uid": "0b5c"},
        "type": "Warning",
        "reason": "Failed",
        "message": "Job train failed (BackoffLimitExceeded)",
        "count": 1,
        "firstTimestamp": "2024-01-01T12:00:00Z",
        "lastTimestamp": "2024-01-01T12:00:00Z",
        "source": {"component": "mcad-controller"},
        "reportingComponent": "mcad-controller",
        "reportingInstance": "mcad-7d9f",
    }


def test_every_dispatcher_reason_has_its_type() -> None:
    assert events.REASON_TYPES == {"Queued": NORMAL, "Dispatched": NORMAL, "Preempted": WARNING,
                                   "Requeued": WARNING, "Completed": NORMAL, "Failed": WARNING,
                                   "ClusterUnavailable": WARNING, "ClusterAvailable": NORMAL,
                                   "PlacementReplanned": WARNING, "PlacementRefused": WARNING,
                                   "StatusNotDecided": WARNING, "Unhealthy": WARNING, "Reset": WARNING,
                                   "NodesAtRisk": WARNING, "CleanedUp": NORMAL}


# -- the sender's policy --

@pytest.mark.parametrize(("status", "create", "attempt", "expected"), [
    (404, False, 0, Retry.AS_CREATE),  # the Event expired: create it again
    (404, False, 3, Retry.AS_CREATE),
    (404, True, 0, Retry.GIVE_UP),  # the namespace is gone
    (403, True, 0, Retry.GIVE_UP),  # terminating namespace, or no RBAC
    (422, True, 0, Retry.GIVE_UP),
    (409, True, 0, Retry.RENAME),
    (409, True, 3, Retry.GIVE_UP),
    (503, True, 0, Retry.BACKOFF),
    (0, False, 2, Retry.BACKOFF),
    (0, False, 3, Retry.GIVE_UP),
])
def test_after_failure(status: int, create: bool, attempt: int, expected: Retry) -> None:
    transient = status in (0, 429, 500, 502, 503, 504)
    assert events.after_failure(status, create=create, transient=transient, attempt=attempt, retries=3) is expected


def test_retry_delays_double() -> None:
    assert [events.retry_delay(n, 0.5) for n in range(3)] == [0.5, 1.0, 2.0]


def test_errors_are_logged_once_per_namespace_and_status_per_interval() -> None:
    limiter = LogLimiter(interval=600.0)
    assert limiter.allow(("gone", 404), 0.0)
    assert not limiter.allow(("gone", 404), 10.0)
    assert limiter.allow(("gone", 403), 10.0)
    assert limiter.allow(("other", 404), 10.0)
    assert not limiter.allow(("gone", 404), 599.0)
    assert limiter.allow(("gone", 404), 600.0)


def test_the_log_limiter_remembers_a_bounded_number_of_keys() -> None:
    limiter = LogLimiter(interval=600.0, max_keys=2)
    for namespace in ("a", "b", "c"):
        assert limiter.allow(namespace, 0.0)
    assert limiter.allow("a", 1.0)  # forgotten: may log again (bounded memory over bounded silence)
    assert not limiter.allow("c", 1.0)
