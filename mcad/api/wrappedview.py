"""What the controller keeps of an object an AppWrapper wraps: the slim view its informers store. Pure.

Contract:
- ``wrapped_view(raw)`` keeps what completion and failure detection (``mcad.model.lifecycle``) read of a wrapped
  object: identity, the uid of its controlling owner (in a worker cluster, which has no ownerReference, the
  AppWrapper uid label instead), the AppWrapper it belongs to (``"namespace/name"``, from the label mcad stamps on
  it) and its ``status.conditions`` as (type, status, reason, message) tuples. It never raises: ill-typed fields
  read as absent.
- ``NOT_SYNCED`` is what a lookup answers while the kind's informer has not finished its first list
  (``mcad.k8s.wrapped.WrappedObjects.lookup``): no decision may be taken on that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from mcad.api.appwrapper import APPWRAPPER_LABEL, APPWRAPPER_UID_LABEL
from mcad.api.raw import as_mapping

Condition = tuple[str, str, str, str]  # type, status, reason, message


class NotSynced:
    def __repr__(self) -> str:
        return "NOT_SYNCED"


NOT_SYNCED: Final = NotSynced()


@dataclass(frozen=True, slots=True)
class WrappedView:
    namespace: str
    name: str
    uid: str
    owner_uid: str  # the controlling owner's uid, else the AppWrapper uid label (hub mode); "" when neither
    appwrapper: str | None
    conditions: tuple[Condition, ...]

    def condition(self, type_: str) -> Condition | None:
        """The condition of ``type_`` (case-insensitive), if the object reports one."""
        wanted = type_.lower()
        return next((c for c in self.conditions if c[0].lower() == wanted), None)


def wrapped_view(raw: Mapping[str, Any]) -> WrappedView:
    meta = as_mapping(raw.get("metadata"))
    namespace = str(meta.get("namespace") or "")
    labels = as_mapping(meta.get("labels"))
    owner = labels.get(APPWRAPPER_LABEL)
    refs = meta.get("ownerReferences")
    owner_uid = next((str(r.get("uid") or "") for r in refs if isinstance(r, Mapping) and r.get("controller")),
                     "") if isinstance(refs, list) else ""
    if not owner_uid and isinstance(labels.get(APPWRAPPER_UID_LABEL), str):
        owner_uid = labels[APPWRAPPER_UID_LABEL]  # hub mode: ownerReferences cannot cross clusters
    raw_conditions = as_mapping(raw.get("status")).get("conditions")
    conditions = tuple(
        (str(c.get("type") or ""), str(c.get("status") or ""), str(c.get("reason") or ""), str(c.get("message") or ""))
        for c in (raw_conditions if isinstance(raw_conditions, list) else []) if isinstance(c, Mapping))
    return WrappedView(namespace=namespace, name=str(meta.get("name") or ""), uid=str(meta.get("uid") or ""),
                       owner_uid=owner_uid,
                       appwrapper=f"{namespace}/{owner}" if isinstance(owner, str) and owner else None,
                       conditions=conditions)

