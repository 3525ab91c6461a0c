"""The leader's pod label: one merge patch per write, bounded retries, a later write cancels an earlier one."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from mcad.errors import ApiError
from mcad.k8s import leaderpod
from mcad.k8s.leaderpod import LEADER_LABEL, LeaderPodLabel


class Stop(threading.Event):
    """A stop event whose waits return at once (no sleeping in unit tests), recording the delays asked."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.delays.append(timeout or 0.0)
        return self.is_set()


def patched(monkeypatch: pytest.MonkeyPatch, answers: list[ApiError | None]) -> list[tuple[str, Any]]:
    sent: list[tuple[str, Any]] = []
    pending = iter(answers)

    def request_json(conn: Any, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        sent.append((f"{method} {path} {kwargs['content_type']}", kwargs["body"]))
        answer = next(pending)
        if answer is not None:
            raise answer
        return {}

    monkeypatch.setattr(leaderpod.kube, "request_json", request_json)
    return sent


def label(stop: threading.Event, **kwargs: Any) -> LeaderPodLabel:
    return LeaderPodLabel(SimpleNamespace(), namespace="mcad-system", pod="mcad-0", stop=stop,  # type: ignore[arg-type]
                          **kwargs)


def test_mark_and_unmark_are_one_merge_patch_of_the_label(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = patched(monkeypatch, [None, None])
    pod = label(Stop())
    assert pod.mark() and pod.unmark()
    request = "PATCH /api/v1/namespaces/mcad-system/pods/mcad-0 application/merge-patch+json"
    assert sent == [(request, {"metadata": {"labels": {LEADER_LABEL: "true"}}}),
                    (request, {"metadata": {"labels": {LEADER_LABEL: None}}})]


def test_failures_are_retried_with_doubling_delays_then_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    unavailable = ApiError(503, "ServiceUnavailable", "etcd is busy")
    sent = patched(monkeypatch, [unavailable] * 4)
    stop = Stop()
    assert not label(stop, attempts=4, first_delay=0.5).mark()
    assert len(sent) == 4 and stop.delays == [0.5, 1.0, 2.0]


def test_a_refusal_that_would_repeat_is_not_retried_and_stop_ends_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    for refusal in (ApiError(404, "NotFound", "pods mcad-0 not found"), ApiError(403, "Forbidden", "cannot patch")):
        sent = patched(monkeypatch, [refusal])
        assert not label(Stop()).mark() and len(sent) == 1
    sent = patched(monkeypatch, [ApiError(500, "InternalError", "boom")] * 5)
    stop = Stop()
    stop.set()
    assert not label(stop).mark() and len(sent) == 1


def test_a_later_unmark_cancels_a_mark_under_way(monkeypatch: pytest.MonkeyPatch) -> None:
    pod: LeaderPodLabel
    unmarked: list[bool] = []

    class UnmarkDuringTheWait(Stop):
        def wait(self, timeout: float | None = None) -> bool:
            if not unmarked:
                unmarked.append(pod.unmark())  # leadership ended while the mark waited to try again
            return False

    sent = patched(monkeypatch, [ApiError(500, "InternalError", "boom"), None])
    pod = label(UnmarkDuringTheWait())
    assert not pod.mark()
    assert unmarked == [True]
    assert [body["metadata"]["labels"][LEADER_LABEL] for _, body in sent] == ["true", None]
