"""What the controller keeps of an object an AppWrapper wraps: the slim view its informers store. Pure.

Contract:
- ``wrapped_view(raw)`` keeps what completion and failure detection (``mcad.model.lifecycle``) and pod ownership
  (``mcad.model.ownership``) read of a wrapped object: identity, its controlling owner's uid (in a worker cluster,
  which has no ownerReference, the AppWrapper uid label instead) and apiVersion, kind and name, the AppWrapper it
  belongs to (``"namespace/name"``, from the label mcad stamps on it) and its ``status.conditions`` as (type,
  status, reason, message) tuples. It never raises: ill-typed fields read as absent.
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
    # The controlling owner's apiVersion, kind and name ("" when it has none): the next link of a pod's owner chain
    # when this object is not itself wrapped (a Deployment's ReplicaSet), ``mcad.model.ownership``.
    owner_api_version: str = ""
    owner_kind: str = ""
    owner_name: str = ""

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
    controller = next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True),
                      None) if isinstance(refs, list) else None
    owner_uid = str(controller.get("uid") or "") if controller is not None else ""
    if not owner_uid and isinstance(labels.get(APPWRAPPER_UID_LABEL), str):
        owner_uid = labels[APPWRAPPER_UID_LABEL]  # hub mode: ownerReferences cannot cross clusters
    raw_conditions = as_mapping(raw.get("status")).get("conditions")
    conditions = tuple(
        (str(c.get("type") or ""), str(c.get("status") or ""), str(c.get("reason") or ""), str(c.get("message") or ""))
        for c in (raw_conditions if isinstance(raw_conditions, list) else []) if isinstance(c, Mapping))
    return WrappedView(namespace=namespace, name=str(meta.get("name") or ""), uid=str(meta.get("uid") or ""),
                       owner_uid=owner_uid,
                       appwrapper=f"{namespace}/{owner}" if isinstance(owner, str) and owner else None,
                       conditions=conditions,
                       owner_api_version=_text(controller, "apiVersion"), owner_kind=_text(controller, "kind"),
                       owner_name=_text(controller, "name"))


def _text(ref: Mapping[str, Any] | None, field: str) -> str:
    value = ref.get(field) if ref is not None else None
    return value if isinstance(value, str) else ""

