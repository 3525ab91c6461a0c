"""WrappedObjects with kinds it may not watch: not waited for, looked up as objects that report nothing; a kind whose
access could not be checked is asked about again."""

from __future__ import annotations

from mcad.kube import ApiError
from mcad.wrapped import UNWATCHABLE, WrappedObjects


def test_a_kind_the_controller_may_not_watch_is_not_waited_for_and_reports_nothing() -> None:
    asked: list[tuple[str, str]] = []

    def factory(api_version: str, kind: str) -> object:
        asked.append((api_version, kind))
        return UNWATCHABLE

    wrapped = WrappedObjects(factory, lambda _key: None)  # type: ignore[arg-type]
    assert wrapped.ensure("v1", "Secret") is True
    assert wrapped.ensure("v1", "Secret") is True
    assert asked == [("v1", "Secret")], "asked once per kind"
    assert wrapped.lookup("v1", "Secret", "team", "s") is None
    assert wrapped.informers() == []


def test_a_kind_whose_access_cannot_be_checked_is_asked_about_again() -> None:
    answers = [ApiError(503, "ServiceUnavailable", "later"), UNWATCHABLE]

    def factory(api_version: str, kind: str) -> object:
        answer = answers.pop(0)
        if isinstance(answer, ApiError):
            raise answer
        return answer

    wrapped = WrappedObjects(factory, lambda _key: None)  # type: ignore[arg-type]
    assert wrapped.ensure("v1", "Service") is False
    assert wrapped.ensure("v1", "Service") is True
    assert answers == []
