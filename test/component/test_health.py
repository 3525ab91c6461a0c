"""Fault tolerance on the dispatcher loop (``mcad.loop.health``), time handed in by the harness's clock: failed
pods reset after their grace period and keep their room while they pause, terminal exit codes and the retry limit
fail, sick nodes reset without counting, finished AppWrappers are cleaned up on time."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mcad.api import faulttolerance as ft
from mcad.api.statusview import status_view
from mcad.model import status
from test.component.harness import gang_aw, last_status, node, pod

FAST = {ft.FAILURE_GRACE: "10s", ft.RETRY_PAUSE: "30s", ft.RETRY_LIMIT: "2"}


def annotated(raw: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    raw["metadata"]["annotations"] = dict(annotations)
    return raw


def failed(name: str, cpu: str, appwrapper: str, code: int, node_name: str = "n0") -> dict[str, Any]:
    raw = pod(name, cpu, appwrapper=appwrapper, node_name=node_name)
    raw["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]}
    return raw


def condition(raw: dict[str, Any], type_: str) -> dict[str, Any]:
    found = status.latest(raw.get("conditions"), type_)
    assert found is not None, f"no {type_} condition in {raw.get('conditions')}"
    return dict(found)


def running_gang(harness_factory: Any, annotations: dict[str, str], **options: Any) -> Any:
    h = harness_factory(nodes=[node("n0", "2"), node("n1", "2")], pods=[],
                        aws=[annotated(gang_aw("g", 2, {"cpu": "2"}), annotations)], **options)
    h.drain()
    assert last_status(h, "g")["state"] == "Running"
    h.lw["pod"].add(pod("g-0", "2", appwrapper="g", node_name="n0"))
    h.lw["pod"].add(pod("g-1", "2", appwrapper="g", node_name="n1"))
    h.drain()
    return h


def test_a_failed_pod_resets_after_its_grace_keeping_the_room_then_dispatches_again(harness_factory: Any) -> None:
    h = running_gang(harness_factory, FAST)
    h.lw["pod"].modify(failed("g-1", "2", "g", 137, node_name="n1"))
    h.drain()
    unhealthy = condition(last_status(h, "g"), status.UNHEALTHY)
    assert unhealthy["reason"] == "FailedPods" and "g-1 exited 137" in unhealthy["message"]
    assert last_status(h, "g")["state"] == "Running", "its own controller has the grace period to recover it"

    h.clock.advance(10)
    h.drain()
    reset = last_status(h, "g")
    assert reset["state"] == "Pending" and reset["resettingCount"] == 1
    assert condition(reset, status.RESETTING)["status"] == "True"
    assert "reset 1 of 2" in reset["message"] and "n0, n1" in reset["message"], reset["message"]
    assert h.writer.deleted.count("ConfigMap g-cm") == 1
    # Its pods go; its room stays held: a small AppWrapper created during the pause waits.
    for name in ("g-0", "g-1"):
        h.lw["pod"].delete(f"ns/{name}")
    h.lw["aw"].add(gang_aw("small", 1, {"cpu": "2"}))
    h.drain()
    assert last_status(h, "small")["state"] == "Pending"
    assert h.writer.applied.count("small-cm") == 0

    h.clock.advance(30)
    h.drain()
    assert h.writer.applied.count("g-cm") == 2, "dispatched again once its pause ended"
    again = last_status(h, "g")
    assert again["state"] == "Running" and again["resettingCount"] == 1
    assert condition(again, status.UNHEALTHY)["status"] == "False"


def test_a_terminal_exit_code_fails_at_once_and_deletes_its_objects(harness_factory: Any) -> None:
    h = running_gang(harness_factory, {**FAST, ft.TERMINAL_EXIT_CODES: "3"})
    h.lw["pod"].modify(failed("g-0", "2", "g", 3))
    h.drain()
    final = last_status(h, "g")
    assert final["state"] == "Failed"
    assert condition(final, "Failed")["reason"] == "TerminalExitCode"
    assert "pod g-0 exited 3" in final["message"] and "on node n0" in final["message"], final["message"]
    assert h.writer.deleted.count("ConfigMap g-cm") == 1
    assert not h.dispatcher.owners.accountant.ledger.is_reserved("ns/g")


def test_with_retryable_codes_any_other_code_is_terminal(harness_factory: Any) -> None:
    h = running_gang(harness_factory, {**FAST, ft.RETRYABLE_EXIT_CODES: "137"})
    h.lw["pod"].modify(failed("g-0", "2", "g", 1))
    h.drain()
    assert "not in retryableExitCodes" in last_status(h, "g")["message"]
    assert last_status(h, "g")["state"] == "Failed"


def test_past_the_retry_limit_it_fails_naming_the_cause(harness_factory: Any) -> None:
    h = running_gang(harness_factory, {**FAST, ft.RETRY_LIMIT: "1"})
    for round_ in range(2):
        h.lw["pod"].modify(failed("g-1", "2", "g", 137, node_name="n1"))
        h.drain()
        h.clock.advance(10)
        h.drain()
        if round_ == 0:
            assert last_status(h, "g")["resettingCount"] == 1
            for name in ("g-0", "g-1"):
                h.lw["pod"].delete(f"ns/{name}")
            h.clock.advance(30)
            h.drain()
            assert last_status(h, "g")["state"] == "Running"
            h.lw["pod"].add(pod("g-0", "2", appwrapper="g", node_name="n0"))
            h.lw["pod"].add(pod("g-1", "2", appwrapper="g", node_name="n1"))
            h.drain()
    final = last_status(h, "g")
    assert final["state"] == "Failed" and condition(final, "Failed")["reason"] == "RetryLimitReached"
    assert "g-1 exited 137" in final["message"] and "retryLimit is 1" in final["message"], final["message"]


def test_gpu_pods_on_an_evict_node_reset_without_counting_and_their_room_avoids_it(harness_factory: Any) -> None:
    h = running_gang(harness_factory, FAST)
    sick = node("n1", "2")
    sick["metadata"]["labels"] = {"autopilot.ibm.com/gpuhealth": "EVICT"}
    h.lw["node"].modify(sick)
    h.drain()
    assert last_status(h, "g").get("resettingCount", 0) == 0, "cpu-only pods are not kept off GPU-sick nodes"
    h2 = gpu_gang_on_an_evict_node(harness_factory)
    reset = last_status(h2, "t")
    assert reset["state"] == "Pending" and reset.get("resettingCount", 0) == 0
    assert condition(reset, status.UNHEALTHY)["reason"] == "NodeUnhealthy"
    assert "not counted" in reset["message"] and "held on node(s) n0." in reset["message"], reset["message"]


def gpu_gang_on_an_evict_node(harness_factory: Any) -> Any:
    """A running gang ``t`` of two 1-GPU pods on n0 and n1, then n1 labelled EVICT."""
    gpu = {"cpu": "1", "nvidia.com/gpu": "1"}
    h = harness_factory(nodes=[_gpu("n0"), _gpu("n1")], pods=[], aws=[annotated(gang_aw("t", 2, gpu), FAST)])
    h.drain()
    for i in range(2):
        raw = pod(f"t-{i}", "1", appwrapper="t", node_name=f"n{i}")
        raw["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
        h.lw["pod"].add(raw)
    h.drain()
    sick = _gpu("n1")
    sick["metadata"]["labels"] = {"autopilot.ibm.com/gpuhealth": "EVICT"}
    h.lw["node"].modify(sick)
    h.drain()
    return h


def _gpu(name: str) -> dict[str, Any]:
    raw = node(name, "4")
    raw["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    return raw


def test_completed_objects_are_deleted_after_the_success_ttl_and_the_appwrapper_too_when_asked(
        harness_factory: Any) -> None:
    h = running_gang(harness_factory, {ft.SUCCESS_TTL: "60s", ft.DELETE_WHEN_FINISHED: "true"})
    raw = h.lw["aw"].get("ns/g")
    assert raw is not None
    raw["spec"]["resources"]["GenericItems"][0]["completionstatus"] = "Complete"
    h.lw["aw"].modify(raw)
    for name in ("g-0", "g-1"):
        done = pod(name, "2", appwrapper="g")
        done["status"]["phase"] = "Succeeded"
        h.lw["pod"].modify(done)
    h.drain()
    # No wrapped-object informers in this harness: completion is decided the way the follower does for a kind it
    # may not watch (never); so finish it as the follower would and check the cleanup timer alone.
    aw_view = h.dispatcher.appwrappers.get("ns/g")
    h.dispatcher.owners.active.finish(aw_view, status.completed(h.dispatcher.owners.decisions.status(aw_view).raw(),
                                                         h.clock.now()))
    h.drain()
    h.dispatcher.owners.health.finished(aw_view)
    h.drain()
    assert "ConfigMap g-cm" not in h.writer.deleted
    h.clock.advance(61)
    h.drain()
    assert h.writer.deleted.count("ConfigMap g-cm") == 1
    assert "AppWrapper g" in h.writer.deleted
    assert condition(last_status(h, "g"), status.DELETING_RESOURCES)["reason"] == "SuccessTTLExpired"


def one_pod_of_two(harness_factory: Any) -> Any:
    """A gang of two dispatched with start-up checks on (admission grace 1m, warmup 5m), only one pod made."""
    h = harness_factory(nodes=[node("n0", "2"), node("n1", "2")], pods=[],
                        aws=[annotated(gang_aw("g", 2, {"cpu": "2"}), FAST)],
                        fault_defaults=ft.FaultDefaults(admission_grace=60.0, warmup_grace=300.0))
    h.drain()
    h.lw["pod"].add(pod("g-0", "2", appwrapper="g", node_name="n0"))
    h.drain()
    return h


def test_too_few_pods_after_the_admission_grace_period_reset_it(harness_factory: Any) -> None:
    h = one_pod_of_two(harness_factory)
    h.clock.advance(59)
    h.drain()
    assert last_status(h, "g")["state"] == "Running"
    h.clock.advance(2)
    h.drain()
    reset = last_status(h, "g")
    assert reset["state"] == "Pending" and reset["resettingCount"] == 1
    assert "1 of its 2 pods exist 1m after dispatch" in reset["message"], reset["message"]


def test_a_failed_pods_room_stays_held_during_its_grace_period(harness_factory: Any) -> None:
    h = running_gang(harness_factory, FAST)
    h.lw["pod"].modify(failed("g-1", "2", "g", 137, node_name="n1"))
    h.drain()
    h.lw["aw"].add(gang_aw("small", 1, {"cpu": "2"}))
    h.drain()
    assert h.writer.applied.count("small-cm") == 0, "the failed pod's room went to other work during the grace"


def test_resets_for_sick_nodes_count_once_they_repeat(harness_factory: Any) -> None:
    """--fit=aggregate cannot keep a gang off a sick node: after 3 uncounted resets in a row the next counts."""
    sick = _gpu("n0")
    sick["metadata"]["labels"] = {"autopilot.ibm.com/gpuhealth": "EVICT"}
    h = harness_factory(nodes=[sick], pods=[], fit="aggregate",
                        aws=[annotated(gang_aw("t", 1, {"cpu": "1", "nvidia.com/gpu": "1"}), FAST)])
    h.drain()
    counts = []
    for round_ in range(4):
        raw = pod(f"t-{round_}", "1", appwrapper="t", node_name="n0")
        raw["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
        h.lw["pod"].add(raw)
        h.drain()
        counts.append(last_status(h, "t").get("resettingCount", 0))
        h.lw["pod"].delete(f"ns/t-{round_}")
        h.clock.advance(30)
        h.drain()
    assert counts == [0, 0, 0, 1], counts
    assert "3 resets in a row were not" in last_status(h, "t")["resets"][-1]["message"]


def test_pods_stuck_terminating_after_a_reset_are_force_deleted_after_the_forceful_grace(
        harness_factory: Any) -> None:
    h = running_gang(harness_factory, {**FAST, ft.FORCEFUL_DELETION_GRACE: "20s", ft.RETRY_PAUSE: "60s"})
    h.lw["pod"].modify(failed("g-1", "2", "g", 137, node_name="n1"))
    h.drain()
    h.clock.advance(10)
    h.drain()
    assert last_status(h, "g")["resettingCount"] == 1
    # Its objects were deleted; g-0's node no longer answers, so the pod stays, marked for deletion.
    stuck = pod("g-0", "2", appwrapper="g", node_name="n0")
    stuck["metadata"]["deletionTimestamp"] = "1970-01-01T00:00:00Z"  # its own grace period is over
    h.lw["pod"].modify(stuck)
    h.drain()
    h.clock.advance(19)
    h.drain()
    assert h.writer.force_deleted == []
    h.clock.advance(2)
    h.drain()
    assert h.writer.force_deleted == ["g-0"], "only the pod still terminating, once"


def test_cordoned_and_not_ready_nodes_under_running_pods_are_reported(harness_factory: Any) -> None:
    h = running_gang(harness_factory, FAST)
    cordoned = node("n1", "2")
    cordoned["spec"] = {"unschedulable": True}
    h.lw["node"].modify(cordoned)
    h.drain()
    risk = condition(last_status(h, "g"), status.AT_RISK)
    assert risk["status"] == "True" and risk["reason"] == "NodeCordoned" and "n1" in risk["message"], risk
    assert last_status(h, "g")["state"] == "Running", "reported, nothing more"
    h.lw["node"].modify(node("n1", "2"))
    h.drain()
    assert condition(last_status(h, "g"), status.AT_RISK)["status"] == "False"


def test_after_a_restart_in_its_retry_pause_it_holds_its_room_until_the_pause_ends(harness_factory: Any) -> None:
    at = "2024-01-01T00:00:00.000000Z"  # the harness clock's now: the pause began as the controller restarted
    paused = status.resetting({}, datetime(2024, 1, 1, tzinfo=UTC), priority=0, reason="FailedPods",
                              message="Resetting (reset 1 of 2): pod g-1 exited 137.", counted=True)
    assert status_view(paused).resetting_since == at
    gang = annotated(gang_aw("g", 2, {"cpu": "2"}), FAST)
    gang["status"] = paused
    h = harness_factory(nodes=[node("n0", "2"), node("n1", "2"), node("n2", "2")], pods=[],
                        aws=[gang, gang_aw("small", 1, {"cpu": "2"})])
    h.drain()
    assert h.dispatcher.owners.accountant.ledger.is_reserved("ns/g")
    assert h.writer.applied.count("small-cm") == 1, "one small pod's room is left besides the gang's"
    h.lw["aw"].add(gang_aw("small2", 1, {"cpu": "2"}))
    h.drain()
    assert h.writer.applied.count("small2-cm") == 0, "the paused gang's room went to other work"
    assert h.writer.applied.count("g-cm") == 0
    h.clock.advance(30)
    h.drain()
    assert h.writer.applied.count("g-cm") == 1, "dispatched again into the room it held"
    assert h.writer.applied.count("small2-cm") == 0


def test_a_retry_pause_of_unknown_start_ends_at_once_rather_than_never(harness_factory: Any) -> None:
    paused = status.resetting({}, datetime(2024, 1, 1, tzinfo=UTC), priority=0, reason="FailedPods",
                              message="Resetting.", counted=True)
    for entry in paused["conditions"]:
        entry.pop("lastTransitionMicroTime", None)  # a status written by someone else
    gang = annotated(gang_aw("g", 2, {"cpu": "2"}), FAST)
    gang["status"] = paused
    h = harness_factory(nodes=[node("n0", "2"), node("n1", "2")], pods=[], aws=[gang])
    h.drain()
    assert h.writer.applied.count("g-cm") == 1


def test_a_namespace_past_its_resets_per_minute_defers_the_next_reset_and_says_why(harness_factory: Any) -> None:
    one_a_minute = ft.FaultDefaults(admission_grace=86400.0, warmup_grace=86400.0, max_namespace_resets_per_minute=1)
    h = harness_factory(nodes=[node("n0", "2")], pods=[], fault_defaults=one_a_minute,
                        aws=[annotated(gang_aw(name, 1, {"cpu": "1"}), FAST) for name in ("a", "b")])
    h.drain()
    for name in ("a", "b"):
        h.lw["pod"].add(pod(f"{name}-0", "1", appwrapper=name, node_name="n0"))
    h.drain()
    for name in ("a", "b"):
        h.lw["pod"].modify(failed(f"{name}-0", "1", name, 137))
    h.drain()
    h.clock.advance(10)
    h.drain()
    statuses = {name: last_status(h, name) for name in ("a", "b")}
    reset = next(name for name, raw in statuses.items() if raw.get("resettingCount") == 1)
    waiting = "b" if reset == "a" else "a"
    deferred = statuses[waiting]
    assert deferred["state"] == "Running" and not deferred.get("resettingCount")
    assert condition(deferred, status.UNHEALTHY)["reason"] == "FailedPods"
    assert "Its reset is deferred: namespace ns has had 1 resets in the last minute" in deferred["message"], \
        deferred["message"]
    assert "--max-resets-per-namespace-per-minute" in condition(deferred, status.UNHEALTHY)["message"]
    assert h.writer.deleted.count(f"ConfigMap {waiting}-cm") == 0, "nothing of it is deleted while it waits"

    h.clock.advance(59)  # 59 s after the first reset: still no room
    h.drain()
    assert not last_status(h, waiting).get("resettingCount")
    h.clock.advance(1)
    h.drain()
    assert last_status(h, waiting)["resettingCount"] == 1, "reset once the first one left the minute"
    assert h.writer.deleted.count(f"ConfigMap {waiting}-cm") == 1


def test_periods_below_the_floors_got_past_admission_and_the_floors_are_used(harness_factory: Any) -> None:
    # The webhook was off, or does not review the namespace: the controller paces the resets all the same.
    h = running_gang(harness_factory, {ft.FAILURE_GRACE: "0s", ft.RETRY_PAUSE: "1ns", ft.RETRY_LIMIT: "1000"})
    h.lw["pod"].modify(failed("g-1", "2", "g", 137, node_name="n1"))
    h.drain()
    h.clock.advance(9.9)
    h.drain()
    assert last_status(h, "g")["state"] == "Running", "the grace floor (10s) holds the reset"
    h.clock.advance(0.1)
    h.drain()
    reset = last_status(h, "g")
    assert reset["resettingCount"] == 1 and "after a 10s pause" in reset["message"], reset["message"]
    for name in ("g-0", "g-1"):
        h.lw["pod"].delete(f"ns/{name}")
    h.clock.advance(9.9)
    h.drain()
    assert h.writer.applied.count("g-cm") == 1, "the retry pause floor (10s) holds the dispatch"
    h.clock.advance(0.1)
    h.drain()
    assert h.writer.applied.count("g-cm") == 2


def test_delete_when_finished_deletes_an_appwrapper_that_failed_before_dispatch_after_the_failure_grace(
        harness_factory: Any) -> None:
    invalid = annotated(gang_aw("bad", 1, {"cpu": "1"}), {ft.DELETE_WHEN_FINISHED: "true",
                                                         ft.DELETION_ON_FAILURE_GRACE: "5s"})
    invalid["spec"]["priority"] = 2**40  # out of int32: InvalidSpec, before anything is created
    kept = annotated(gang_aw("kept", 1, {"cpu": "1"}), {ft.DELETION_ON_FAILURE_GRACE: "5s"})
    kept["spec"]["priority"] = 2**40
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=[invalid, kept])
    h.drain()
    for name in ("bad", "kept"):
        assert last_status(h, name)["state"] == "Failed"
        assert condition(last_status(h, name), status.FAILED)["reason"] == "InvalidSpec"
    h.clock.advance(4.9)
    h.drain()
    assert "AppWrapper bad" not in h.writer.deleted
    h.clock.advance(0.1)
    h.drain()
    assert h.writer.deleted.count("AppWrapper bad") == 1
    assert "AppWrapper kept" not in h.writer.deleted, "only where its annotation (or the cluster's flag) asks"
    assert h.writer.applied == []
