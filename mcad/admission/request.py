"""An AdmissionReview request and the answer to it, as plain typed values.

Contract:
- ``AdmissionRequest.parse(review)`` reads an ``admission.k8s.io/v1`` AdmissionReview (a parsed JSON object) and
  returns the request, or raises ``ValueError`` with a message saying what is missing. ``source`` is who sent
  it (the peer's address, given by the server, never read from the review). ``obj`` is the AppWrapper
  as sent (after earlier mutating webhooks), ``old`` the stored one on UPDATE (None on CREATE); ``sub_resource``
  is "status" for a write of the status subresource, "" for the AppWrapper itself.
- ``Outcome`` is a reviewer's answer: allowed or not, a message (shown to the user by kubectl on refusal), a JSON
  patch (mutation only) and warnings. ``Outcome.response(uid)`` renders the AdmissionReview to send back.
- ``Reviewer`` is the type of a reviewer: a pure function of the request (it may ask ``facts``, see
  ``mcad.admission.facts``) that never raises for any request content.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcad.api.raw import as_list, as_mapping

ADMISSION_API_VERSION = "admission.k8s.io/v1"


@dataclass(frozen=True)
class UserInfo:
    """Who sent the request, as the API server authenticated them (authentication.k8s.io/v1 UserInfo)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()  # sorted, so the value can key a cache

    @classmethod
    def parse(cls, raw: Any) -> UserInfo:
        info = as_mapping(raw)
        extra = as_mapping(info.get("extra"))
        return cls(username=str(info.get("username") or ""), uid=str(info.get("uid") or ""),
                   groups=tuple(str(g) for g in as_list(info.get("groups"))),
                   extra=tuple(sorted((str(k), tuple(str(v) for v in as_list(vs))) for k, vs in extra.items())))

    def as_json(self) -> dict[str, Any]:
        """The UserInfo fields of a SubjectAccessReview spec."""
        body: dict[str, Any] = {"user": self.username, "groups": list(self.groups)}
        if self.uid:
            body["uid"] = self.uid
        if self.extra:
            body["extra"] = {k: list(v) for k, v in self.extra}
        return body


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    operation: str  # CREATE or UPDATE (the webhooks are registered for nothing else)
    group: str  # the AppWrapper's API group: workload.codeflare.dev or mcad.ibm.com
    namespace: str
    name: str
    user: UserInfo
    obj: Mapping[str, Any]
    old: Mapping[str, Any] | None
    dry_run: bool = False
    sub_resource: str = ""  # "status" for appwrappers/status, "" for the AppWrapper itself
    source: str = ""  # the peer's address, as the webhook server saw it ("" when unknown)

    @classmethod
    def parse(cls, review: Any, *, source: str = "") -> AdmissionRequest:
        request = as_mapping(as_mapping(review).get("request"))
        uid = request.get("uid")
        if not isinstance(uid, str) or not uid:
            raise ValueError("not an AdmissionReview: request.uid is missing")
        obj = request.get("object")
        if not isinstance(obj, Mapping):
            raise ValueError("AdmissionReview request.object is missing")
        old = request.get("oldObject")
        kind = as_mapping(request.get("kind"))
        return cls(uid=uid, operation=str(request.get("operation") or ""), group=str(kind.get("group") or ""),
                   namespace=str(request.get("namespace") or ""),
                   name=str(request.get("name") or as_mapping(obj.get("metadata")).get("name") or ""),
                   user=UserInfo.parse(request.get("userInfo")), obj=obj,
                   old=old if isinstance(old, Mapping) else None, dry_run=bool(request.get("dryRun")),
                   sub_resource=str(request.get("subResource") or ""), source=source)


@dataclass(frozen=True)
class Outcome:
    allowed: bool
    message: str = ""
    patch: Sequence[Mapping[str, Any]] = ()  # RFC 6902 operations; only a mutating reviewer sets them
    warnings: Sequence[str] = field(default=())
    code: int = 403  # the HTTP-like code kubectl shows with a refusal

    @classmethod
    def allow(cls, *, patch: Sequence[Mapping[str, Any]] = (), warnings: Sequence[str] = ()) -> Outcome:
        return cls(True, patch=tuple(patch), warnings=tuple(warnings))

    @classmethod
    def deny(cls, message: str, *, code: int = 403) -> Outcome:
        return cls(False, message=message, code=code)

    def response(self, uid: str) -> dict[str, Any]:
        answer: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if not self.allowed:
            answer["status"] = {"code": self.code, "message": self.message,
                                "reason": "Forbidden" if self.code == 403 else "Invalid"}
        if self.patch:
            answer["patchType"] = "JSONPatch"
            answer["patch"] = base64.b64encode(json.dumps(list(self.patch)).encode()).decode()
        if self.warnings:
            answer["warnings"] = list(self.warnings)
        return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": answer}


Reviewer = Callable[[AdmissionRequest], Outcome]
