"""What admission checks may ask the cluster, as a Protocol (a kube-backed implementation caches every answer).

Contract (every method bounded in time by the implementation; an answer that cannot be had raises
``FactUnavailable`` with a message, and the reviewer then refuses the request saying so: never admits unchecked):
- ``resource_for(api_version, kind)``: the resource an item's kind is served as (discovery), or None if the API
  server does not serve that kind.
- ``may(user, verb, resource, namespace, name="")``: whether ``user`` holds the right (SubjectAccessReview), and
  the API server's reason when it does not.
- ``namespace(name)``: the Namespace object (its labels and annotations are the admin's: tenants with AppWrapper
  rights cannot change them), or None if it does not exist.
- ``priority_class(name)``: the value of the PriorityClass, or None if there is none of that name.
  These two are the questions the namespace admins' rules ask (``mcad.model.tenancy.NamespaceFacts``, which
  ``Facts`` extends: the model states what it reads, and never imports admission).

``NodeLabels``: what admission may know of the nodes' label keys, for warnings only (never a refusal):
``carried(key)`` is True when some node carries the label ``key``, False when none does, None when it cannot tell
(not known yet, or not at once: it never waits and never raises). Kept apart from ``Facts``: it is read from memory
the process keeps, not asked of the API server, and its answer may be missing.

``asked_for(source)`` marks the questions asked within it (in this thread or task) as asked for the request of
``source`` (the webhook's peer): ``current_source()`` tells an implementation whom to charge a costly question to.

``at_hand_only()``: within it an implementation answers from what it holds and raises ``WouldAsk`` (not a
``FactUnavailable``: nothing is refused for it) where it would have to ask the API server; ``only_at_hand()`` tells
it so. The webhook judges a request on its event loop this way, and hands it to a worker thread, which may wait on
the API server, only when a question must be asked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mcad.admission.request import UserInfo
from mcad.model.tenancy import NamespaceFacts

_T = TypeVar("_T")
_SOURCE: ContextVar[str] = ContextVar("mcad_admission_source", default="")
_AT_HAND_ONLY: ContextVar[bool] = ContextVar("mcad_admission_at_hand_only", default=False)


@contextlib.contextmanager
def _within(var: ContextVar[_T], value: _T) -> Iterator[None]:
    """``var`` is ``value`` in this thread or task until the block ends."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def asked_for(source: str) -> contextlib.AbstractContextManager[None]:
    return _within(_SOURCE, source)


def current_source() -> str:
    """The source of the request whose questions are being asked ("" outside ``asked_for``)."""
    return _SOURCE.get()


def at_hand_only() -> contextlib.AbstractContextManager[None]:
    return _within(_AT_HAND_ONLY, True)


def only_at_hand() -> bool:
    """Whether the facts asked now must come from what is held (inside ``at_hand_only``)."""
    return _AT_HAND_ONLY.get()


class WouldAsk(Exception):
    """Inside ``at_hand_only``: answering needs the API server. The caller asks again where it may wait."""


class FactUnavailable(Exception):
    """The API server could not answer a question admission must ask; the message says which."""


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    resource: str  # plural, e.g. "deployments"
    kind: str
    namespaced: bool


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class NodeLabels(Protocol):
    def carried(self, key: str) -> bool | None: ...


class Facts(NamespaceFacts, Protocol):
    """Also ``namespace(name)`` and ``priority_class(name)``, from ``NamespaceFacts``."""

    def resource_for(self, api_version: str, kind: str) -> Resource | None: ...

    def may(self, user: UserInfo, verb: str, resource: Resource, namespace: str, name: str = "") -> Decision: ...
