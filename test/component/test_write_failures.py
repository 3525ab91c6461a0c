"""Failed API writes, stepped with a fake clock: each answer class is retried or not as mcad.model.retry says, a
dispatch
whose status write fails is never dispatched again, and its status lands once writes work again."""

from __future__ import annotations

from typing import Any

import pytest

from mcad.errors import TIMED_OUT
from mcad.k8s.kube import ApiError
from test.component.harness import aw, last_status, node, pod
from test.fakes import wait_informed

# Every class of answer, by what it must do to a dispatch: (status, message).
UNAVAILABLE = [(0, "connection refused"), (401, "Unauthorized"), (429, "too many requests"),
               (503, "the server is currently unable to handle the request")]
TRANSIENT = [(500, "Internal error occurred: failed calling webhook"), (502, "bad gateway"), (504, "timeout"),
             (599, "an unusual code")]
PERMANENT = [(400, "bad request"), (403, "forbidden by admission webhook"), (404, "namespaces \"gone\" not found"),
             (409, "conflict with mcad-controller"), (413, "request entity too large"), (422, "spec: Invalid value"),
             (500, "etcdserver: request is too large"), (500, "rpc error: code = ResourceExhausted desc = grpc")]


def failing(h: Any, status: int, message: str) -> None:
    h.writer.fail_apply = ApiError(status, "Injected", message)


@pytest.mark.parametrize(("code", "message"), PERMANENT)
def test_a_refusal_that_would_repeat_fails_the_appwrapper_at_the_first_attempt(harness_factory: Any, code: int,
                                                                            message: str) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    failing(h, code, message)
    h.drain()
    h.clock.advance(60)
    h.drain()
    assert h.writer.attempts == 1, "never sent again"
    status = last_status(h, "a")
    assert status["state"] == "Failed"
    assert message in status["message"] and "GenericItems[0] (ConfigMap a-cm)" in status["message"]
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 8000


@pytest.mark.parametrize(("code", "message"), TRANSIENT)
def test_trouble_that_usually_passes_is_retried_with_backoff_then_given_up(harness_factory: Any, code: int,
                                                                          message: str) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    failing(h, code, message)
    h.drain()
    seen = [h.writer.attempts]
    for _ in range(70):  # 5 minutes and more of failures, one step of 5 s (the longest delay) at a time
        h.clock.advance(5)
        h.drain()
        seen.append(h.writer.attempts)
    status = last_status(h, "a")
    assert status["state"] == "Failed", status
    assert "gave up after" in status["message"] and message in status["message"], status["message"]
    attempts = seen[-1]
    assert 60 <= attempts <= 62, f"one attempt per 5 s at most once the delay is capped, not {attempts}"
    assert seen[-1] == seen[-10], "nothing more is sent once it failed"


def test_a_request_that_keeps_timing_out_is_given_up_in_the_end(harness_factory: Any) -> None:
    """A request sent and never answered in time (a huge object, a hung webhook of a wrapped kind) is not
    UNAVAILABLE, retried for ever. A few timeouts in a row are tolerated; then they count like TRANSIENT ones."""
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    h.writer.fail_apply = ApiError(0, TIMED_OUT, "POST /api/v1/namespaces/ns/configmaps: no answer within 30 s")
    h.drain()
    for _ in range(80):  # 400 s of timeouts, one step of 5 s (the longest delay) at a time
        h.clock.advance(5)
        h.drain()
    status = last_status(h, "a")
    assert status["state"] == "Failed", status
    assert "gave up after" in status["message"] and "no answer within 30 s" in status["message"], status["message"]
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 8000


@pytest.mark.parametrize(("code", "message"), UNAVAILABLE)
def test_an_unavailable_api_server_is_waited_for_and_never_fails_the_appwrapper(harness_factory: Any, code: int,
                                                                                message: str) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    failing(h, code, message)
    h.drain()
    for _ in range(120):  # 10 minutes of an outage
        h.clock.advance(5)
        h.drain()
    assert last_status(h, "a")["state"] == "Pending"
    assert 120 <= h.writer.attempts <= 122, "at most one attempt per 5 s"
    h.writer.fail_apply = None
    h.clock.advance(5)
    h.drain()
    assert last_status(h, "a")["state"] == "Running"


def test_a_status_write_that_fails_never_dispatches_again_and_lands_when_writes_work(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    h.writer.fail_status = ApiError(500, "InternalError", "Internal error occurred: failed calling webhook")
    h.drain()
    assert h.writer.applied == ["a-cm"]
    dispatched_at = h.clock.now()
    # 20 s of failing status writes, with events of its pods and cycles (new arrivals) coming in meanwhile.
    h.lw["pod"].add(pod("a-0", "1", appwrapper="a"))
    for i in range(20):
        h.lw["aw"].add(aw(f"n{i}", "10m"))
        wait_informed(lambda i=i: h.dispatcher.appwrappers.get(f"ns/n{i}"), 5, "the new AppWrapper")
        h.clock.advance(1)
        h.drain()
    assert h.writer.applied.count("a-cm") == 1, "dispatched once, whatever the status writes do"
    assert h.dispatcher.owners.accountant.ledger.is_reserved("ns/a")
    # Its retries back off (0.25 s doubling to 4 s): a few per second at first, then one per 4 s.
    assert h.writer.status_attempts_of["a"] <= 12, h.writer.status_attempts_of

    h.writer.fail_status = None
    h.clock.advance(4)
    h.drain()
    landed = last_status(h, "a")
    assert landed["state"] == "Running"
    assert landed["controllerfirstdispatchtimestamp"] == dispatched_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), \
        "the first dispatch's time, not that of the first status write that landed"
    assert h.writer.applied.count("a-cm") == 1


def test_a_failed_status_write_is_driven_again_by_the_next_event_after_giving_up(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    h.writer.fail_status = ApiError(500, "InternalError", "Internal error occurred: failed calling webhook")
    h.drain()
    for _ in range(80):  # past the give-up point: 20 attempts and 5 minutes
        h.clock.advance(4)
        h.drain()
    attempts = h.writer.status_attempts
    h.clock.advance(60)
    h.drain()
    assert h.writer.status_attempts == attempts, "gave up: no timer"
    assert 72 <= attempts <= 78, "about one attempt per 4 s for the 5 minutes until it gave up"
    h.writer.fail_status = None
    h.lw["pod"].add(pod("a-0", "1", appwrapper="a"))  # its pod changes: the status is written again at once
    wait_informed(lambda: h.dispatcher.pods.get("uid-a-0"), 5, "the pod")
    h.drain()
    assert last_status(h, "a")["state"] == "Running"
    assert h.writer.applied.count("a-cm") == 1


def test_a_status_refused_for_good_is_not_retried_until_the_next_decision(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    h.writer.fail_status = ApiError(422, "Invalid", "status.message: Too long")
    h.drain()
    attempts = h.writer.status_attempts
    for _ in range(10):
        h.clock.advance(5)
        h.drain()
    assert h.writer.status_attempts == attempts
    assert h.writer.applied == ["a-cm"]


def test_each_failing_appwrapper_is_retried_at_its_own_time(harness_factory: Any) -> None:
    """Retries of several AppWrappers due at different times: none is lost to another's earlier timer."""
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    h.writer.fail_for.update({"a-cm": ApiError(503, "ServiceUnavailable", "down"),
                              "b-cm": ApiError(503, "ServiceUnavailable", "down")})
    h.drain()  # a fails at 0 s: again at 0.5 s
    h.clock.advance(0.3)
    h.lw["aw"].add(aw("b", "1"))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/b"), 5, "b")
    h.drain()  # b fails at 0.3 s: again at 0.8 s
    h.clock.advance(0.2)
    h.drain()
    assert h.writer.attempts == 3, "a at 0.5 s (again at 1.5 s)"
    h.clock.advance(0.3)
    h.drain()
    assert h.writer.attempts == 4, "b at 0.8 s, by its own timer, with no event in between"
