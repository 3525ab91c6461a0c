"""WrappedObjects: discovery of a wrapped kind runs on its own thread, never the caller's; a transient failure is
retried with the kind's own backoff (never remembered as an answer); a kind not served is re-checked rarely; the
AppWrappers that asked are woken through ``on_change`` once the answer is in; the kinds known are bounded.

Time is a FakeClock and discovery is stepped (``background=False`` and ``discover_next``) wherever delays are
asserted; the test of the caller's thread runs the real background thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import structlog

from mcad.api.wrappedview import WrappedView, wrapped_view
from mcad.errors import ApiError
from mcad.k8s.informer import Informer
from mcad.k8s.kube import ApiResource
from mcad.k8s.wrapped import UNWATCHABLE, WrappedObjects, informer_factory
from test.fakes import FakeClock, FakeListerWatcher
from test.support import wait_until

TIMEOUT = 5.0


class Woken:
    """The ``on_change`` callback: records the AppWrapper keys it is given, in order."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, key: str) -> None:
        with self._lock:
            self.keys.append(key)

    def seen(self) -> list[str]:
        with self._lock:
            return list(self.keys)


def informer() -> Informer[WrappedView]:
    return Informer("wrapped-configmap", FakeListerWatcher(), transform=wrapped_view)


class Answers:
    """A factory that gives its answers in order (an ``ApiError`` is raised) and records who asked, and from
    which thread."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str]] = []
        self.threads: list[threading.Thread] = []

    def __call__(self, api_version: str, kind: str) -> Any:
        self.asked.append((api_version, kind))
        self.threads.append(threading.current_thread())
        answer = self.answers.pop(0)
        if isinstance(answer, ApiError):
            raise answer
        return answer


def stepped(factory: Any, woken: Woken, clock: FakeClock, **options: Any) -> WrappedObjects:
    """Retry delays without jitter unless ``draw`` is given: each its full length."""
    return WrappedObjects(factory, woken, clock=clock, background=False, **{"draw": lambda: 1.0, **options})


def test_discovery_never_runs_on_the_callers_thread_and_the_waiting_appwrapper_is_woken() -> None:
    entered = threading.Event()
    release = threading.Event()
    watched = informer()
    threads: list[threading.Thread] = []

    def slow_factory(api_version: str, kind: str) -> Any:
        threads.append(threading.current_thread())
        entered.set()
        release.wait(TIMEOUT)  # an API server that takes its time to answer discovery
        return watched if kind == "ConfigMap" else UNWATCHABLE

    woken = Woken()
    wrapped = WrappedObjects(slow_factory, woken)
    try:
        assert wrapped.ensure("v1", "ConfigMap", waiter="team/a") is False, "not known yet"
        assert threads == [] or threads[0] is not threading.current_thread(), "discovery ran on the caller's thread"
        assert entered.wait(TIMEOUT), "discovery runs meanwhile, elsewhere"
        assert threads[0] is not threading.current_thread()
        assert wrapped.ensure("v1", "ConfigMap", waiter="team/b") is False, "asked again while discovery runs"
        release.set()
        wait_until(lambda: sorted(woken.seen()) == ["team/a", "team/b"] or None, TIMEOUT,
                   "both waiting AppWrappers woken once the kind's informer has synced")
        assert wrapped.ensure("v1", "ConfigMap") is True
        assert len(threads) == 1, "asked once"
        assert wrapped.informers() == [watched]
        assert wrapped.ensure("v1", "Service", waiter="team/c") is False
        wait_until(lambda: "team/c" in woken.seen() or None, TIMEOUT, "the second kind answered")
        assert threads[1] is threads[0], "one discovery thread for every kind"
    finally:
        release.set()
        wrapped.stop()
    wait_until(lambda: not threads[0].is_alive() or None, TIMEOUT, "the discovery thread ended by stop()")


def test_a_transient_failure_is_retried_with_the_kinds_own_growing_backoff_and_never_remembered() -> None:
    clock = FakeClock()
    woken = Woken()
    failures = [ApiError(503, "ServiceUnavailable", "later"), ApiError(0, "", "connection refused"),
                ApiError(500, "InternalError", "etcd"), ApiError(504, "GatewayTimeout", "slow")] * 2
    watched = informer()
    answers = Answers(*failures, watched)
    wrapped = stepped(answers, woken, clock)
    try:
        assert wrapped.ensure("v1", "ConfigMap", waiter="team/a") is False
        assert wrapped.discover_next() is True, "asked at once"
        for delay in (0.5, 1, 2, 4, 8, 16, 30, 30):  # doubling per kind, and on at the cap
            clock.advance(delay - 0.01)
            assert wrapped.discover_next() is False, f"not due before {delay} s"
            assert wrapped.ensure("v1", "ConfigMap", waiter="team/a") is False, "a failure is not an answer"
            clock.advance(0.01)
            assert wrapped.discover_next() is True, f"due after {delay} s"
        assert answers.answers == [], "asked once per failure, then answered"
        assert wrapped.informers() == [watched]
        wait_until(lambda: woken.seen() == ["team/a"] or None, TIMEOUT, "the waiting AppWrapper woken, once")
        assert wrapped.ensure("v1", "ConfigMap") is True
        clock.advance(3600)
        assert wrapped.discover_next() is False, "an informer is a final answer"
    finally:
        wrapped.stop()


def test_retry_delays_are_jittered_into_their_upper_half() -> None:
    """Kinds whose discovery failed together (an aggregated API down) do not ask again together."""
    clock = FakeClock()
    answers = Answers(ApiError(503, "ServiceUnavailable", "later"), UNWATCHABLE)
    wrapped = stepped(answers, Woken(), clock, draw=lambda: 0.0)
    try:
        wrapped.ensure("v1", "ConfigMap", waiter="team/a")
        assert wrapped.discover_next() is True
        clock.advance(0.25 - 0.01)
        assert wrapped.discover_next() is False
        clock.advance(0.01)
        assert wrapped.discover_next() is True, "due after half of the 0.5 s first delay"
    finally:
        wrapped.stop()


def test_one_kinds_failures_do_not_delay_another_kind() -> None:
    clock = FakeClock()
    answers = {"Job": [ApiError(503, "ServiceUnavailable", "later")] * 3, "Service": [UNWATCHABLE]}
    asked: list[str] = []

    def factory(api_version: str, kind: str) -> Any:
        asked.append(kind)
        answer = answers[kind].pop(0)
        if isinstance(answer, ApiError):
            raise answer
        return answer

    woken = Woken()
    wrapped = stepped(factory, woken, clock)
    wrapped.ensure("batch/v1", "Job")
    assert wrapped.discover_next() is True
    clock.advance(0.5)
    assert wrapped.discover_next() is True  # Job's second failure: next in 1 s
    assert wrapped.ensure("v1", "Service", waiter="team/s") is False
    assert wrapped.discover_next() is True, "a new kind is asked at once, whatever another kind's backoff"
    assert asked == ["Job", "Job", "Service"]
    assert woken.seen() == ["team/s"], "an unwatchable kind is an answer: its waiter is woken at once"
    assert wrapped.ensure("v1", "Service") is True


@pytest.mark.parametrize("not_served", [None, ApiError(404, "NotFound", "v1 does not serve kind Widget")],
                         ids=["not-in-discovery", "404"])
def test_a_kind_not_served_is_remembered_and_checked_again_rarely(not_served: Any) -> None:
    clock = FakeClock()
    woken = Woken()
    answers = Answers(not_served, None, UNWATCHABLE)
    wrapped = stepped(answers, woken, clock, recheck_seconds=300.0)
    assert wrapped.ensure("example.com/v1", "Widget", waiter="team/a") is False
    assert wrapped.discover_next() is True
    assert woken.seen() == ["team/a"], "an answer, if a negative one: the waiter is woken, asks again, waits again"
    for _ in range(10):
        assert wrapped.ensure("example.com/v1", "Widget", waiter="team/a") is False
    assert len(answers.asked) == 1, "remembered: asking ensure again asks the API server nothing"
    clock.advance(299)
    assert wrapped.discover_next() is False
    clock.advance(1)
    assert wrapped.discover_next() is True, "checked again: a CRD may have been installed since"
    assert woken.seen() == ["team/a", "team/a"], "woken once per answer, however often it asked"
    assert wrapped.ensure("example.com/v1", "Widget", waiter="team/b") is False
    clock.advance(300)
    assert wrapped.discover_next() is True
    assert woken.seen()[-1] == "team/b", "served now (and unwatchable here): the waiter is woken"
    assert wrapped.ensure("example.com/v1", "Widget") is True
    assert answers.answers == []


def test_the_kinds_known_are_bounded_and_one_more_is_refused_with_an_error() -> None:
    clock = FakeClock()
    answers = Answers(UNWATCHABLE, UNWATCHABLE)
    wrapped = stepped(answers, Woken(), clock, max_kinds=2)
    wrapped.ensure("v1", "Service")
    wrapped.ensure("v1", "Secret")
    with structlog.testing.capture_logs() as logs:
        assert wrapped.ensure("v1", "ConfigMap", waiter="team/a") is True, "not waited for, as an unwatchable kind"
    assert [e["log_level"] for e in logs] == ["error"], logs
    assert logs[0]["kind"] == "ConfigMap"
    assert wrapped.lookup("v1", "ConfigMap", "team", "a") is None, "reports nothing, as an unwatchable kind"
    while wrapped.discover_next():
        pass
    assert answers.asked == [("v1", "Service"), ("v1", "Secret")], "the refused kind is never asked about"


def test_a_kind_the_controller_may_not_watch_is_not_waited_for_and_reports_nothing() -> None:
    answers = Answers(UNWATCHABLE)
    wrapped = stepped(answers, Woken(), FakeClock())
    assert wrapped.ensure("v1", "Secret") is False, "not known yet"
    assert wrapped.discover_next() is True
    assert wrapped.ensure("v1", "Secret") is True
    assert wrapped.ensure("v1", "Secret") is True
    assert answers.asked == [("v1", "Secret")], "asked once per kind"
    assert wrapped.lookup("v1", "Secret", "team", "s") is None
    assert wrapped.informers() == []


class FakeClient:
    def __init__(self, error: ApiError | None) -> None:
        self.error = error

    def resource(self, api_version: str, kind: str) -> ApiResource:
        if self.error is not None:
            raise self.error
        return ApiResource("configmaps", True)

    def allowed(self, verb: str, api_version: str, kind: str, namespace: str = "") -> bool:
        return False


def test_the_factory_says_not_served_only_for_a_404_and_raises_any_other_failure() -> None:
    def make(error: ApiError | None) -> Any:
        return informer_factory(None, FakeClient(error))("v1", "ConfigMap")  # type: ignore[arg-type]

    assert make(ApiError(404, "NotFound", "v1 does not serve kind ConfigMap")) is None
    for status in (0, 500, 503):
        with pytest.raises(ApiError):
            make(ApiError(status, "Trouble", "passing"))
    assert make(None) is UNWATCHABLE
