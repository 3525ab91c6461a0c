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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from mcad.admission.request import UserInfo


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


class Facts(Protocol):
    def resource_for(self, api_version: str, kind: str) -> Resource | None: ...

    def may(self, user: UserInfo, verb: str, resource: Resource, namespace: str, name: str = "") -> Decision: ...

    def namespace(self, name: str) -> Mapping[str, Any] | None: ...

    def priority_class(self, name: str) -> int | None: ...
