"""Completion, failure and requeue-wait rules (mcad.model.lifecycle), on views only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mcad.api.appwrapper import SchedulingSpec, appwrapper_view
from mcad.api.statusview import StatusView, status_view
from mcad.api.validation import MAX_DISPATCH_LIMIT_SECONDS, MAX_REQUEUE_SECONDS
from mcad.api.wrappedview import NOT_SYNCED, WrappedView, wrapped_view
from mcad.model.lifecycle import (
    FAR_FUTURE,
    MAX_TIMER_SECONDS,
    REQUEUE_FLOOR_CAP_SECONDS,
    REQUEUES_AS_SPECIFIED,
    Outcome,
    current_requeue_wait,
    deadline_due,
    evaluate,
    requeue_due,
    requeue_floor_note,
    requeue_wait,
    seconds_until,
    specified_requeue_wait,
    tracked_items,
    watched_kinds,
)

UID = "aw-uid"


def item(kind: str, name: str, completion: str | None = None, api_version: str = "batch/v1") -> dict[str, Any]:
    out: dict[str, Any] = {"generictemplate": {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}}
    if completion is not None:
        out["completionstatus"] = completion
    return out


def view(*items: dict[str, Any]) -> Any:
    return appwrapper_view({"metadata": {"name": "aw", "namespace": "ns", "uid": UID},
                            "spec": {"resources": {"GenericItems": list(items)}}})


def obj(name: str, *conditions: tuple[str, str], owner: str = UID, reason: str = "", message: str = "") -> WrappedView:
    return wrapped_view({"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}",
                                      "labels": {"workload.codeflare.dev/appwrapper": "aw"},
                                      "ownerReferences": [{"uid": owner, "controller": True}]},
                         "status": {"conditions": [{"type": t, "status": s, "reason": reason, "message": message}
                                                   for t, s in conditions]}})


def lookup_of(*objects: WrappedView) -> Any:
    store = {o.name: o for o in objects}
    return lambda _api_version, _kind, _namespace, name: store.get(name)


def test_complete_needs_the_condition_true_not_just_present() -> None:
    aw = view(item("Job", "j", "Complete"))
    assert evaluate(aw, lookup_of(obj("j", ("Complete", "False"))), 0).outcome is Outcome.RUNNING
    assert evaluate(aw, lookup_of(obj("j", ("Complete", "True"))), 0).outcome is Outcome.COMPLETED


def test_types_match_exactly_not_as_substrings() -> None:
    aw = view(item("Deployment", "d", "Progress", api_version="apps/v1"))
    assert evaluate(aw, lookup_of(obj("d", ("Progressing", "True"))), 0).outcome is Outcome.RUNNING
    aw = view(item("Deployment", "d", "Available, progressing", api_version="apps/v1"))
    assert evaluate(aw, lookup_of(obj("d", ("Progressing", "True"))), 1).outcome is Outcome.HOLD_COMPLETION


def test_every_item_with_completionstatus_must_be_complete() -> None:
    aw = view(item("Job", "a", "Complete"), item("Job", "b", "Complete"))
    assert evaluate(aw, lookup_of(obj("a", ("Complete", "True"))), 0).outcome is Outcome.RUNNING
    both = lookup_of(obj("a", ("Complete", "True")), obj("b", ("Complete", "True")))
    assert evaluate(aw, both, 0).outcome is Outcome.COMPLETED
    assert evaluate(aw, both, 2).outcome is Outcome.HOLD_COMPLETION


def test_an_object_owned_by_another_appwrapper_does_not_count() -> None:
    aw = view(item("Job", "j", "Complete"))
    stale = obj("j", ("Complete", "True"), owner="old-uid")
    assert evaluate(aw, lookup_of(stale), 0).outcome is Outcome.RUNNING


def test_a_failed_job_fails_the_appwrapper_even_without_completionstatus() -> None:
    aw = view(item("Job", "train"))
    verdict = evaluate(aw, lookup_of(obj("train", ("Failed", "True"), reason="BackoffLimitExceeded",
                                         message="Job has reached the specified backoff limit")), 0)
    assert verdict.outcome is Outcome.FAILED
    assert verdict.reason == "BackoffLimitExceeded"
    assert verdict.message == "Job train failed (BackoffLimitExceeded): Job has reached the specified backoff limit"


def test_no_decision_while_a_kind_is_not_synced() -> None:
    aw = view(item("Job", "j", "Complete"))
    assert evaluate(aw, lambda *_: NOT_SYNCED, 0).outcome is Outcome.UNKNOWN


def test_without_completionstatus_it_runs_until_deleted() -> None:
    aw = view(item("Service", "s", api_version="v1"))
    assert watched_kinds(aw) == set()
    assert evaluate(aw, lookup_of(), 0).outcome is Outcome.RUNNING
    assert tracked_items(view(item("Job", "j"))) and watched_kinds(view(item("Job", "j"))) == {("batch/v1", "Job")}


@pytest.mark.parametrize(("growth", "waits"), [
    ("exponential", [10, 20, 40, 80, 100, 100]),
    ("linear", [10, 20, 30, 40, 50, 60]),
    ("none", [10, 10, 10, 10, 10, 10]),
    ("bogus", [10, 10, 10, 10, 10, 10]),
])
def test_requeue_wait_grows_per_growth_type_and_is_capped(growth: str, waits: list[int]) -> None:
    spec = SchedulingSpec(min_available=1, requeue_seconds=10, requeue_max_seconds=100 if growth != "linear" else 0,
                          growth=growth)
    assert [requeue_wait(spec, n) for n in range(6)] == waits


def test_a_huge_requeue_count_waits_at_most_the_maximum() -> None:
    """Without the cap, 300 << 32 s is more than timedelta holds: requeue_due would raise OverflowError."""
    for growth in ("exponential", "linear", "none"):
        spec = SchedulingSpec(min_available=1, requeue_seconds=MAX_REQUEUE_SECONDS, growth=growth)
        assert requeue_wait(spec, 10**6) == MAX_REQUEUE_SECONDS
    assert requeue_wait(SchedulingSpec(requeue_seconds=300), 10**6) == MAX_REQUEUE_SECONDS


DISPATCHED = "2026-01-01T00:00:00Z"


def dispatched_status(**extra: Any) -> StatusView:
    return status_view({"conditions": [{"type": "Dispatched", "status": "True", "lastTransitionMicroTime": DISPATCHED}],
                        "controllerfirstdispatchtimestamp": DISPATCHED, **extra})


@pytest.mark.parametrize("spec", [{"requeuing": {"timeInSeconds": 10**12, "maxTimeInSeconds": 10**12}},
                                  {"dispatchDuration": {"limit": 10**12}, "minAvailable": 10**12}])
def test_huge_times_of_an_old_object_are_refused_and_its_timers_stay_finite(spec: dict[str, Any]) -> None:
    """Before the bounds, 10^12 s raised OverflowError in requeue_due/deadline_due and the timer was never set."""
    aw = appwrapper_view({"metadata": {"name": "old", "namespace": "ns"},
                          "spec": {"schedulingSpec": {"minAvailable": 1, **spec},
                                   "resources": {"GenericItems": [item("Job", "j")]}}})
    assert "must be between" in (aw.demand_error or "")
    assert aw.scheduling.requeue_seconds <= MAX_REQUEUE_SECONDS
    assert aw.scheduling.dispatch_limit_seconds <= MAX_DISPATCH_LIMIT_SECONDS
    now = datetime(2026, 1, 1, tzinfo=UTC)
    status = dispatched_status()
    for due in (requeue_due(aw.scheduling, status), deadline_due(aw.scheduling, status)):
        assert due is not None and 0 <= seconds_until(due, now) <= MAX_TIMER_SECONDS


def test_a_zero_requeue_time_of_an_old_object_is_refused_and_waits_a_second_if_dispatched() -> None:
    """0 used to dispatch and delete in a tight loop (557 requeues in 21 s)."""
    aw = appwrapper_view({"metadata": {"name": "old", "namespace": "ns"},
                          "spec": {"schedulingSpec": {"minAvailable": 1, "requeuing": {"timeInSeconds": 0}},
                                   "resources": {"GenericItems": [item("Job", "j")]}}})
    assert aw.demand_error == "spec.schedulingSpec.requeuing.timeInSeconds is 0; it must be between 1 and 604800"
    assert aw.scheduling.requeue_seconds == 1
    assert all(requeue_wait(aw.scheduling, n) >= 1 for n in range(5))


@pytest.mark.parametrize("recorded", [0, -5, 10**12, "300", True, None])
def test_a_recorded_wait_out_of_range_or_of_the_wrong_type_falls_back_to_the_spec(recorded: Any) -> None:
    spec = SchedulingSpec(min_available=1, requeue_seconds=30)
    assert current_requeue_wait(spec, dispatched_status(requeueingTimeInSeconds=recorded)) == 30
    assert current_requeue_wait(spec, dispatched_status(requeueingTimeInSeconds=45)) == 45


@pytest.mark.parametrize(("stamp", "due"), [("9999-12-31T23:59:59Z", FAR_FUTURE),
                                           # UTC moves these out of datetime's range: read as no stamp at all
                                           ("9999-12-31T23:00:00-05:00", None), ("0001-01-01T00:00:00+05:00", None)])
def test_stamps_at_the_edges_of_time_never_raise(stamp: str, due: datetime | None) -> None:
    status = status_view({"conditions": [{"type": "Dispatched", "status": "True", "lastTransitionMicroTime": stamp}],
                          "controllerfirstdispatchtimestamp": stamp})
    spec = SchedulingSpec(min_available=1, requeue_seconds=MAX_REQUEUE_SECONDS,
                          dispatch_limit_seconds=MAX_DISPATCH_LIMIT_SECONDS)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert requeue_due(spec, status) == deadline_due(spec, status) == due
    assert 0 <= seconds_until(due, now) <= MAX_TIMER_SECONDS


def test_scheduling_spec_defaults_match_the_crd() -> None:
    aw = appwrapper_view({"metadata": {"name": "a"}, "spec": {"schedulingSpec": {"minAvailable": 2},
                                                            "resources": {"GenericItems": [item("Job", "j")]}}})
    assert aw.scheduling == SchedulingSpec(min_available=2, requeue_seconds=300, growth="exponential")


def test_complete_before_any_pod_exists_is_not_completion() -> None:
    aw = view(item("Deployment", "d", "Progressing", api_version="apps/v1"))
    progressing = lookup_of(obj("d", ("Progressing", "True")))
    assert evaluate(aw, progressing, 0, pods_pending_creation=True).outcome is Outcome.HOLD_COMPLETION
    assert evaluate(aw, progressing, 0).outcome is Outcome.COMPLETED


def test_jobs_are_watched_for_failure_only_when_asked() -> None:
    aw = view(item("Job", "train"))
    assert watched_kinds(aw, jobs=False) == set()
    failed = lookup_of(obj("train", ("Failed", "True"), reason="BackoffLimitExceeded"))
    assert evaluate(aw, failed, 0, jobs=False).outcome is Outcome.RUNNING
    assert evaluate(aw, failed, 0, jobs=True).outcome is Outcome.FAILED


@pytest.mark.parametrize("spec", [
    SchedulingSpec(min_available=1, requeue_seconds=1, growth="none"),
    SchedulingSpec(min_available=1, requeue_seconds=1, requeue_max_seconds=1, growth="exponential"),
    SchedulingSpec(min_available=1, requeue_seconds=1, requeue_max_seconds=1, growth="linear"),
])
def test_unlimited_requeuing_at_one_second_slows_down_to_the_floor(spec: SchedulingSpec) -> None:
    """timeInSeconds 1, never growing, maxNumRequeuings 0: without the floor a gang that never starts cycles once a
    second for ever. The first REQUEUES_AS_SPECIFIED requeues wait what the spec says, then the wait doubles up to
    REQUEUE_FLOOR_CAP_SECONDS and stays there."""
    waits = [requeue_wait(spec, n) for n in range(1, 40)]
    assert waits[:REQUEUES_AS_SPECIFIED] == [1] * REQUEUES_AS_SPECIFIED
    assert waits[REQUEUES_AS_SPECIFIED:REQUEUES_AS_SPECIFIED + 4] == [2, 4, 8, 16]
    assert waits[-1] == REQUEUE_FLOOR_CAP_SECONDS and max(waits) == REQUEUE_FLOOR_CAP_SECONDS
    assert waits == sorted(waits)
    # A day of such a gang: requeues once every 5 minutes at most, after the first few.
    day, total, requeues = 24 * 3600, 0, 0
    while total < day:
        requeues += 1
        total += requeue_wait(spec, requeues)
    assert requeues < day / REQUEUE_FLOOR_CAP_SECONDS + 20, f"{requeues} requeues in a day"
    assert requeue_floor_note(spec, REQUEUES_AS_SPECIFIED) == ""
    note = requeue_floor_note(spec, REQUEUES_AS_SPECIFIED + 1)
    assert "waits 2 s instead of the 1 s its requeuing asks" in note and f"up to {REQUEUE_FLOOR_CAP_SECONDS} s" in note


def test_the_floor_keeps_every_longer_wait_the_spec_gives() -> None:
    for spec in (SchedulingSpec(min_available=1, requeue_seconds=600, growth="none"),
                 SchedulingSpec(min_available=1, requeue_seconds=10, growth="exponential"),
                 SchedulingSpec(min_available=1, requeue_seconds=10, requeue_max_seconds=3000, growth="linear")):
        for n in range(60):
            assert requeue_wait(spec, n) >= specified_requeue_wait(spec, n)
            if requeue_wait(spec, n) > specified_requeue_wait(spec, n):
                assert requeue_wait(spec, n) <= REQUEUE_FLOOR_CAP_SECONDS
                assert requeue_floor_note(spec, n)
    assert [requeue_wait(SchedulingSpec(requeue_seconds=600, growth="none"), n) for n in range(10)] == [600] * 10


def test_a_recorded_wait_below_the_floor_of_its_count_is_raised() -> None:
    spec = SchedulingSpec(min_available=1, requeue_seconds=1, growth="none")
    assert current_requeue_wait(spec, dispatched_status(requeueingTimeInSeconds=1, numberOfRequeueings=3)) == 1
    assert current_requeue_wait(spec, dispatched_status(requeueingTimeInSeconds=1, numberOfRequeueings=30)) == \
        REQUEUE_FLOOR_CAP_SECONDS
