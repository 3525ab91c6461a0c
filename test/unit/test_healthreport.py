"""What /debug/explain says of fault tolerance (``mcad.serve.healthreport``), from statuses built by
``mcad.model.status`` and a policy: what is due and when, in each state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from mcad.api import faulttolerance as ft
from mcad.model import status
from mcad.serve.healthreport import Facts, health_document, pause_document, policy_document, resets_document

T0 = datetime(2026, 11, 27, 2, 0, 0, tzinfo=UTC)
RUNNING = Facts(running=True, expected_pods=2, ready_pods=2, existing_pods=2)


def policy(**annotations: str) -> ft.FaultPolicy:
    return ft.policy({ft.PREFIX + name if "/" not in name else name: value for name, value in annotations.items()})


def dispatched() -> dict[str, Any]:
    return status.dispatched({}, T0, priority=0)


def unhealthy(raw: dict[str, Any], at: datetime, reason: str = "FailedPods") -> dict[str, Any]:
    return status.unhealthy(raw, at, reason=reason, message="pod w-1 exited 137")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_healthy_running_one_has_nothing_due() -> None:
    doc = health_document(dispatched(), policy(), at(1), RUNNING)
    assert doc == {"state": "Healthy", "conditions": [], "next": None}


def test_a_graced_failure_is_reset_when_its_grace_ends_or_failed_when_retries_are_used_up() -> None:
    raw = unhealthy(dispatched(), at(10))
    doc = health_document(raw, policy(), at(30), RUNNING)
    assert doc["state"] == "Unhealthy"
    assert doc["next"] == {"action": "reset", "at": "2026-11-27T02:01:10Z", "inSeconds": 40.0,
                           "text": "reset (1 of 3) in 40s unless it recovers"}
    used_up = {**raw, "resettingCount": 3}
    assert health_document(used_up, policy(), at(30), RUNNING)["next"]["text"] == (
        "Failed in 40s unless it recovers (retryLimit 3 used up)")
    none = health_document(raw, policy(retryLimit="0"), at(30), RUNNING)["next"]
    assert none["action"] == "fail" and none["text"] == "Failed in 40s unless it recovers (retryLimit is 0)"
    overdue = health_document(raw, policy(), at(500), RUNNING)["next"]
    assert overdue["inSeconds"] == 0 and overdue["text"] == "reset (1 of 3) now unless it recovers"


def test_a_reset_acted_on_at_once_and_at_risk_nodes_have_nothing_due() -> None:
    assert health_document(unhealthy(dispatched(), at(1), "NodeUnhealthy"), policy(), at(2), RUNNING)["next"] is None
    risky = status.at_risk(dispatched(), at(1), reason="NodeCordoned", message="Its running pods are on node(s) n1 "
                           "cordoned.")
    doc = health_document(risky, policy(), at(2), RUNNING)
    assert doc["state"] == "AtRisk" and doc["next"] is None
    assert doc["conditions"] == [{"type": "AtRisk", "status": "True", "reason": "NodeCordoned",
                                  "message": "Its running pods are on node(s) n1 cordoned.",
                                  "since": "2026-11-27T02:00:01.000000Z"}]


def test_in_its_pause_it_is_queued_again_when_the_pause_ends_and_says_where_its_room_is() -> None:
    raw = status.resetting(unhealthy(dispatched(), at(10)), at(70), priority=0, reason="FailedPods",
                           message="Resetting (reset 1 of 3): ...", counted=True)
    doc = health_document(raw, policy(), at(100), Facts(running=False))
    assert doc["state"] == "Resetting"
    assert doc["next"]["action"] == "dispatch" and doc["next"]["inSeconds"] == 60.0
    assert doc["next"]["text"] == "queued again at its place in 1m, at the end of its 1m30s retry pause"
    pause = pause_document(raw, policy(), at(100), ["n1"], {"cpu": "4"})
    assert pause == {"since": "2026-11-27T02:01:10Z", "until": "2026-11-27T02:02:40Z", "inSeconds": 60.0,
                     "reason": "FailedPods", "heldOn": ["n1"], "held": {"cpu": "4"}}
    assert resets_document(raw, policy()) == {"count": 1, "retryLimit": 3, "history": [
        {"time": "2026-11-27T02:01:10.000000Z", "reason": "FailedPods", "counted": True,
         "message": "Resetting (reset 1 of 3): ..."}]}
    resumed = status.resume(raw, at(160))
    assert pause_document(resumed, policy(), at(161), [], {}) is None
    assert health_document(resumed, policy(), at(161), Facts(running=False))["state"] == "NotRunning"


def test_start_up_checks_are_due_only_without_min_available_and_until_all_pods_run() -> None:
    some = Facts(running=True, expected_pods=4, ready_pods=1, existing_pods=4)
    doc = health_document(dispatched(), policy(), at(100), some)
    assert doc["next"]["text"] == ("reset in 3m20s unless all 4 pods are Running or Succeeded by then "
                                   "(warmupGracePeriod 5m; 1 are)")
    assert health_document(dispatched(), policy(), at(100), Facts(running=True, expected_pods=4, ready_pods=1,
                                                                  existing_pods=4, min_available=4))["next"] is None


def test_a_finished_one_says_when_its_objects_go() -> None:
    done = status.completed(dispatched(), at(10))
    doc = health_document(done, policy(successTTLDuration="1h"), at(70), RUNNING)
    assert doc["state"] == "Finished"
    assert doc["next"]["text"] == "its objects are deleted in 59m (successTTLDuration 1h)"
    failed = status.failed(dispatched(), at(10), priority=0, reason="RetryLimitReached", message="x")
    assert health_document(failed, policy(), at(11), RUNNING)["next"] is None, "deleted as it failed"
    kept = health_document(failed, policy(**{"deletionOnFailureGracePeriodDuration": "10m",
                                             ft.DELETE_WHEN_FINISHED: "true"}), at(70), RUNNING)["next"]
    assert kept["text"] == ("its objects are deleted and then the AppWrapper itself in 9m "
                            "(deletionOnFailureGracePeriodDuration 10m)")
    cleaned = status.resources_deleted(done, at(4000), reason="SuccessTTLExpired", message="gone")
    assert health_document(cleaned, policy(), at(4001), RUNNING)["next"] is None


def test_the_policy_names_its_own_annotations_and_those_ignored() -> None:
    doc = policy_document(policy(retryLimit="x", terminalExitCodes="3,42"),
                          {ft.RETRY_LIMIT: "x", ft.TERMINAL_EXIT_CODES: "3,42"}, defaults_known=False)
    assert doc["retryLimit"] == 3 and doc["terminalExitCodes"] == [3, 42] and doc["successTTL"] == "168h"
    assert doc["fromAnnotations"] == ["terminalExitCodes"] and doc["defaults"] == "built-in"
    assert doc["ignored"] == [f"{ft.RETRY_LIMIT}: 'x' must be an integer in 0..1000"]
