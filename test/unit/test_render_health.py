"""How mcadctl prints fault tolerance (``mcad.cli.render``): an explain document's health, retry pause, reset
history and policy; the queue's AppWrappers in their retry pause; nothing of it for a document from a controller
that does not send it."""

from __future__ import annotations

from typing import Any

from mcad.cli import render

RESET_MESSAGE = ("Resetting (reset 1 of 3): pod w-1 exited 137 in container trainer on node n-3. Its objects are "
                 "deleted and it is dispatched again after a 1m30s pause; meanwhile its room is held on node(s) n-3.")
IGNORED = "workload.codeflare.dev.appwrapper/retryLimit: 'many' must be an integer in 0..1000"
PAUSED: dict[str, Any] = {
    "namespace": "team-a", "name": "train", "found": True, "state": "Pending",
    "summary": "It is in its retry pause after a reset (FailedPods; reset 1 of 3 so far): it is queued again at its "
               "place in 40s, at 2025-03-01T12:00:40Z; meanwhile its room is held on node(s) n-3.",
    "details": ["demand: cpu=8"],
    "health": {"state": "Resetting",
               "conditions": [{"type": "Unhealthy", "status": "True", "reason": "FailedPods",
                               "message": RESET_MESSAGE, "since": "2025-03-01T11:59:50.000000Z"},
                              {"type": "Resetting", "status": "True", "reason": "FailedPods",
                               "message": RESET_MESSAGE, "since": "2025-03-01T11:59:50.000000Z"}],
               "next": {"action": "dispatch", "at": "2025-03-01T12:00:40Z", "inSeconds": 40.0,
                        "text": "queued again at its place in 40s, at the end of its 1m30s retry pause"}},
    "pause": {"since": "2025-03-01T11:59:10Z", "until": "2025-03-01T12:00:40Z", "inSeconds": 40.0,
              "reason": "FailedPods", "heldOn": ["n-3"], "held": {"cpu": "8"}},
    "resets": {"count": 1, "retryLimit": 3, "history": [
        {"time": "2025-03-01T10:00:00.000000Z", "reason": "NodeUnhealthy", "counted": False, "message": "moved"},
        {"time": "2025-03-01T11:59:10.000000Z", "reason": "FailedPods", "counted": True, "message": RESET_MESSAGE}]},
    "faultTolerance": {"admissionGracePeriod": "1m", "warmupGracePeriod": "5m", "failureGracePeriod": "1m",
                       "retryPausePeriod": "1m30s", "forcefulDeletionGracePeriod": "10m",
                       "deletionOnFailureGracePeriod": "0s", "successTTL": "168h", "retryLimit": 3,
                       "terminalExitCodes": [3, 42], "retryableExitCodes": [], "deleteWhenFinished": False,
                       "fromAnnotations": ["terminalExitCodes"],
                       "ignored": [f"{IGNORED}"],
                       "defaults": "controller"},
}


def test_explain_prints_health_pause_resets_and_policy() -> None:
    lines = render.explain_lines(PAUSED)
    assert lines[0].startswith("team-a/train [Pending]: It is in its retry pause after a reset")
    at = lines.index("Health: Resetting: queued again at its place in 40s, at the end of its 1m30s retry pause")
    assert lines[at + 1] == f"  Unhealthy=True (FailedPods) since 2025-03-01T11:59:50.000000Z: {RESET_MESSAGE}"
    assert lines[at + 3] == ("  retry pause: since 2025-03-01T11:59:10Z, until 2025-03-01T12:00:40Z; its room is "
                             "held on node(s) n-3")
    resets = lines.index("Resets: 1 counted of retryLimit 3")
    assert lines[resets + 1].split() == ["TIME", "REASON", "COUNTED", "MESSAGE"]
    assert lines[resets + 2].split()[:4] == ["2025-03-01T10:00:00.000000Z", "NodeUnhealthy", "no", "moved"]
    assert lines[resets + 3].split()[:3] == ["2025-03-01T11:59:10.000000Z", "FailedPods", "yes"]
    assert lines[resets + 3].endswith(RESET_MESSAGE)
    policy = lines.index("Fault tolerance:")
    assert lines[policy + 1] == ("  admissionGracePeriod 1m, warmupGracePeriod 5m, failureGracePeriod 1m, "
                                 "retryPausePeriod 1m30s, retryLimit 3, forcefulDeletionGracePeriod 10m, "
                                 "deletionOnFailureGracePeriod 0s, successTTL 168h")
    assert lines[policy + 2] == ("  terminal exit codes: 3,42; retryable: every other; delete when finished: no")
    assert lines[policy + 3] == "  set by its annotations: terminalExitCodes"
    assert lines[policy + 4] == ("  ignored (refused value, the default stands): "
                                 "workload.codeflare.dev.appwrapper/retryLimit: 'many' must be an integer in 0..1000")


def test_an_unhealthy_one_says_what_is_due_and_an_offline_one_that_defaults_are_built_in() -> None:
    doc = {**PAUSED, "pause": None, "resets": {"count": 0, "retryLimit": 3, "history": []},
           "health": {"state": "Unhealthy", "conditions": [], "next": {
               "action": "reset", "text": "reset (1 of 3) in 40s unless it recovers"}},
           "faultTolerance": {**PAUSED["faultTolerance"], "retryableExitCodes": [137], "defaults": "built-in",
                              "ignored": [], "fromAnnotations": []}}
    lines = render.explain_lines(doc)
    assert "Health: Unhealthy: reset (1 of 3) in 40s unless it recovers" in lines
    assert "Resets: 0 counted of retryLimit 3; none so far" in lines
    assert not any(line.startswith("  retry pause") for line in lines)
    assert "Fault tolerance (the controller's defaults are not known offline: built-in ones shown):" in lines
    assert any("retryable: only 137" in line for line in lines)
    assert "  set by its annotations: none (the cluster defaults)" in lines


def test_a_document_without_fault_tolerance_prints_as_before() -> None:
    old = {"namespace": "a", "name": "b", "state": "Running", "summary": "It is dispatched.", "details": ["x"]}
    assert render.explain_lines(old) == ["a/b [Running]: It is dispatched.", "  - x"]


def test_the_queue_lists_appwrappers_in_their_retry_pause() -> None:
    doc = {"controller": {"identity": "c"}, "queued": [], "dispatched": [], "resetting": [
        {"namespace": "team-a", "name": "train", "priority": 5, "state": "Resetting", "demand": {"cpu": "8"},
         "reason": "FailedPods", "resettingCount": 1, "retryLimit": 3, "pauseEndsAt": "2025-03-01T12:00:40Z"},
        {"namespace": "team-b", "name": "other", "priority": 0, "state": "Resetting", "reason": "NodeUnhealthy",
         "resettingCount": 0, "retryLimit": 3, "pauseEndsAt": "2025-03-01T12:01:00Z"}]}
    lines = render.queue_lines(doc)
    assert lines[0].endswith(": 0 queued, 0 dispatched, 2 resetting")
    at = lines.index(next(line for line in lines if line.startswith("Resetting (in their retry pause")))
    assert lines[at + 1].split() == ["NAMESPACE", "NAME", "PRIORITY", "RESETS", "REASON", "PAUSE-ENDS"]
    assert lines[at + 2].split() == ["team-a", "train", "5", "1/3", "FailedPods", "2025-03-01T12:00:40Z"]
    only = render.only_namespace(doc, "team-b")
    assert [r["name"] for r in only["resetting"]] == ["other"]
