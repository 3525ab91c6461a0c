"""What /debug/explain and /debug/queue say about fault tolerance (``mcad.serve.healthreport``), from a dispatcher
stepped key by key with the harness's clock: an unhealthy AppWrapper with its reset due, one in its retry pause
(when it is dispatched again and where its room is held), its reset history, its policy with a refused annotation
ignored, and the start-up checks still ahead of one without minAvailable."""

from __future__ import annotations

from typing import Any

from mcad.api import faulttolerance as ft
from mcad.serve.debug import Reports
from test.component.harness import last_status
from test.component.test_health import FAST, failed, gpu_gang_on_an_evict_node, one_pod_of_two, running_gang


def reports(h: Any) -> Reports:
    return Reports(h.dispatcher.view, lambda: {"identity": "test", "leader": True})


def explained(h: Any, name: str = "g") -> dict[str, Any]:
    doc = reports(h).explain("ns", name)
    assert doc is not None
    return doc


def test_an_unhealthy_appwrapper_says_when_it_is_reset_unless_it_recovers(harness_factory: Any) -> None:
    h = running_gang(harness_factory, FAST)
    healthy = explained(h)
    assert healthy["health"]["state"] == "Healthy" and healthy["health"]["next"] is None
    assert healthy["resets"] == {"count": 0, "retryLimit": 2, "history": []}

    h.lw["pod"].modify(failed("g-1", "2", "g", 137, node_name="n1"))
    h.drain()
    h.clock.advance(4)
    doc = explained(h)
    health = doc["health"]
    assert health["state"] == "Unhealthy"
    unhealthy = next(c for c in health["conditions"] if c["type"] == "Unhealthy")
    assert unhealthy["reason"] == "FailedPods"
    assert "pod g-1 exited 137 in container trainer on node n1" in unhealthy["message"]
    assert health["next"]["action"] == "reset" and health["next"]["inSeconds"] == 6.0
    assert health["next"]["text"] == "reset (1 of 2) in 6s unless it recovers", health["next"]

    policy = doc["faultTolerance"]
    assert policy["failureGracePeriod"] == "10s" and policy["retryPausePeriod"] == "30s"
    assert policy["retryLimit"] == 2 and policy["admissionGracePeriod"] == "24h"  # the harness cluster's default
    assert policy["fromAnnotations"] == ["failureGracePeriodDuration", "retryPausePeriodDuration", "retryLimit"]
    assert policy["ignored"] == [] and policy["defaults"] == "controller"


def test_in_its_retry_pause_it_says_when_it_is_dispatched_again_and_where_its_room_is_held(
        harness_factory: Any) -> None:
    h = running_gang(harness_factory, FAST)
    h.lw["pod"].modify(failed("g-1", "2", "g", 137, node_name="n1"))
    h.drain()
    h.clock.advance(10)
    h.drain()
    assert last_status(h, "g")["resettingCount"] == 1
    h.clock.advance(5)
    doc = explained(h)
    assert doc["state"] == "Pending"
    assert doc["summary"].startswith("It is in its retry pause after a reset (FailedPods; reset 1 of 2 so far): it "
                                     "is queued again at its place in 25s, at "), doc["summary"]
    assert doc["summary"].endswith("; meanwhile its room is held on node(s) n0, n1."), doc["summary"]
    assert doc["health"]["state"] == "Resetting"
    assert doc["health"]["next"]["action"] == "dispatch" and doc["health"]["next"]["inSeconds"] == 25.0
    pause = doc["pause"]
    assert pause["heldOn"] == ["n0", "n1"] and pause["held"] == {"cpu": "4"} and pause["reason"] == "FailedPods"
    assert pause["inSeconds"] == 25.0
    history = doc["resets"]["history"]
    assert doc["resets"]["count"] == 1 and len(history) == 1
    assert history[0]["reason"] == "FailedPods" and history[0]["counted"] is True
    assert "Resetting (reset 1 of 2): pod g-1 exited 137 in container trainer on node n1" in history[0]["message"]

    # The queue lists it apart: it is neither queued nor dispatched, and holds its room.
    queue = reports(h).queue()
    assert [q["name"] for q in queue["queued"]] == [] and [d["name"] for d in queue["dispatched"]] == []
    assert [(r["name"], r["state"], r["reason"], r["resettingCount"], r["retryLimit"])
            for r in queue["resetting"]] == [("g", "Resetting", "FailedPods", 1, 2)]
    assert queue["resetting"][0]["pauseEndsAt"] == pause["until"]

    for name in ("g-0", "g-1"):
        h.lw["pod"].delete(f"ns/{name}")
    h.clock.advance(25)
    h.drain()
    again = explained(h)
    assert again["summary"].startswith("It is dispatched (Running)"), again["summary"]
    assert again["health"]["state"] == "Healthy" and again["pause"] is None
    assert again["resets"]["count"] == 1 and len(again["resets"]["history"]) == 1
    assert [r["name"] for r in reports(h).queue()["resetting"]] == []


def test_a_reset_for_a_sick_node_says_it_was_not_counted(harness_factory: Any) -> None:
    h = gpu_gang_on_an_evict_node(harness_factory)
    doc = explained(h, "t")
    assert doc["summary"].startswith("It is in its retry pause after a reset (NodeUnhealthy; not counted against "
                                     "retryLimit; 0 of 2 used): "), doc["summary"]
    assert doc["summary"].endswith("its room is held on node(s) n0."), doc["summary"]
    assert doc["resets"]["count"] == 0 and doc["resets"]["history"][0]["counted"] is False


def test_a_refused_annotation_shows_as_ignored_and_the_default_stands(harness_factory: Any) -> None:
    h = running_gang(harness_factory, {ft.RETRY_LIMIT: "many", ft.FAILURE_GRACE: "15s"})
    policy = explained(h)["faultTolerance"]
    assert policy["retryLimit"] == 3 and policy["failureGracePeriod"] == "15s"
    assert policy["fromAnnotations"] == ["failureGracePeriodDuration"]
    assert len(policy["ignored"]) == 1 and policy["ignored"][0].startswith(f"{ft.RETRY_LIMIT}: 'many' must be")


def test_a_period_below_its_floor_shows_as_raised_to_the_floor(harness_factory: Any) -> None:
    # Stored around the webhook (off, or a namespace it does not review): the controller uses the floor.
    h = running_gang(harness_factory, {ft.RETRY_PAUSE: "1ns", ft.FAILURE_GRACE: "0s"})
    policy = explained(h)["faultTolerance"]
    assert policy["retryPausePeriod"] == "10s" and policy["failureGracePeriod"] == "10s"
    assert sorted(policy["ignored"]) == [
        f"{ft.FAILURE_GRACE}: '0s' is below the cluster's floor of 10s: 10s is used",
        f"{ft.RETRY_PAUSE}: '1ns' is below the cluster's floor of 10s: 10s is used"]


def test_without_min_available_it_says_when_the_start_up_checks_reset_it(harness_factory: Any) -> None:
    h = one_pod_of_two(harness_factory)
    h.clock.advance(20)
    check = explained(h)["health"]["next"]
    assert check["action"] == "check" and check["inSeconds"] == 40.0
    assert check["text"] == ("reset in 40s unless all 2 pods exist by then (admissionGracePeriod 1m; 1 exist)")


def test_the_dispatched_list_marks_an_unhealthy_one(harness_factory: Any) -> None:
    h = running_gang(harness_factory, FAST)
    assert [(d["name"], d["health"]) for d in reports(h).queue()["dispatched"]] == [("g", "Healthy")]
    h.lw["pod"].modify(failed("g-1", "2", "g", 137, node_name="n1"))
    h.drain()
    marked = reports(h).queue()["dispatched"]
    assert [(d["name"], d["health"], d["healthReason"]) for d in marked] == [("g", "Unhealthy", "FailedPods")]
