"""Watching the objects AppWrappers wrap, for their conditions: one label-selected informer per kind, on demand.

Contract:
- ``WrappedView`` keeps what completion and failure detection read of a wrapped object: identity, the uid of its
  controlling owner (in a worker cluster, which has no ownerReference, the AppWrapper uid label instead),
  the AppWrapper it belongs to (``"namespace/name"``, from the label mcad stamps on it) and its
  ``status.conditions`` as (type, status, reason, message) tuples.
- ``WrappedObjects.ensure(api_version, kind)`` starts an informer for that kind the first time it is asked
  (selecting only objects that carry the AppWrapper label, so a cluster's other Jobs cost nothing), and says
  whether it has synced. Each event that adds or removes an object or changes its conditions enqueues the
  owning AppWrapper's key through ``on_change``: completion is detected from events, not by polling.
- ``lookup`` answers from the informer's store: the object, ``None`` when it does not exist, or ``NOT_SYNCED``
  when the kind's informer has not finished its first list (no decision may be taken on that).
- ``informer_factory(conn, client, prefix)`` is the factory for one cluster (the hub's own, or each worker's in hub
  mode, whose informers are named after the worker).
- Kinds the API server does not serve get no informer (``ensure`` returns False and logs once): an AppWrapper
  wrapping them fails at dispatch with its own message.
- Kinds the controller may not list and watch in every namespace (its RBAC, asked once per kind with a
  SelfSubjectAccessReview: least privilege grants list/watch only on kinds whose completion is worth watching, and
  never on Secrets) get no informer either, and are not waited for: ``ensure`` returns True and ``lookup`` None,
  as for an object that reports no conditions, so an item of such a kind never completes the AppWrapper (as a
  completionstatus on a Service never does) and a Job of it is not seen failing. Logged once per kind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from mcad import kube
from mcad.api.appwrapper import APPWRAPPER_LABEL, APPWRAPPER_UID_LABEL
from mcad.api.raw import as_mapping
from mcad.errors import ApiError
from mcad.informer import Informer, Reconnects

log = structlog.get_logger("mcad.wrapped")

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


class Unwatchable:
    def __repr__(self) -> str:
        return "UNWATCHABLE"


# The controller's RBAC does not let it list and watch that kind in every namespace.
UNWATCHABLE: Final = Unwatchable()

# Builds (not starts) the informer for one kind; None when the API server does not serve it, UNWATCHABLE when the
# controller may not watch it. Raises ApiError when that could not be found out (asked again next time).
InformerFactory = Callable[[str, str], "Informer[WrappedView] | Unwatchable | None"]


def informer_factory(conn: kube.Connection, client: kube.Client, prefix: str = "",
                     peers: Reconnects | None = None) -> InformerFactory:
    """Informers over one wrapped kind in the cluster of ``conn``, only objects carrying the AppWrapper label,
    named ``<prefix>wrapped-<kind>``, reconnecting with ``peers``; None for a kind that cluster does not serve."""
    def make(api_version: str, kind: str) -> Informer[WrappedView] | Unwatchable | None:
        try:
            resource = client.resource(api_version, kind)
        except ApiError:
            return None
        if not all(client.allowed(verb, api_version, kind) for verb in ("list", "watch")):
            return UNWATCHABLE
        group, _, version = api_version.rpartition("/")
        return Informer(f"{prefix}wrapped-{kind.lower()}",
                        kube.ResourceClient(conn, group=group, version=version, plural=resource.plural,
                                            label_selector=APPWRAPPER_LABEL),
                        transform=wrapped_view, peers=peers)
    return make


class WrappedObjects:
    def __init__(self, factory: InformerFactory, on_change: Callable[[str], None]) -> None:
        self._factory = factory
        self._on_change = on_change
        self._informers: dict[tuple[str, str], Informer[WrappedView] | Unwatchable | None] = {}
        self._lock = threading.Lock()

    def ensure(self, api_version: str, kind: str) -> bool:
        """Start watching ``kind`` if not yet; True once its informer has synced."""
        key = (api_version, kind)
        with self._lock:
            known = key in self._informers
            informer = self._informers.get(key)
        if not known:
            try:
                informer = self._factory(api_version, kind)
            except ApiError as err:
                log.warning("cannot tell whether a wrapped kind may be watched; asking again later",
                            api_version=api_version, kind=kind, reason=str(err))
                return False
            if informer is None:
                log.warning("wrapped kind not served; its completion cannot be watched", api_version=api_version,
                            kind=kind)
            elif isinstance(informer, Unwatchable):
                log.warning("wrapped kind may not be listed and watched (RBAC); the completion of its items is not "
                            "watched", api_version=api_version, kind=kind)
            else:
                informer.add_handler(self._handle)
                informer.start()
                log.info("watching wrapped kind", api_version=api_version, kind=kind)
            with self._lock:
                self._informers[key] = informer
        if isinstance(informer, Unwatchable):
            return True  # nothing to wait for
        return informer is not None and informer.has_synced()

    def lookup(self, api_version: str, kind: str, namespace: str, name: str) -> WrappedView | NotSynced | None:
        with self._lock:
            informer = self._informers.get((api_version, kind))
        if isinstance(informer, Unwatchable):
            return None  # as an object that reports nothing
        if informer is None or not informer.has_synced():
            return NOT_SYNCED
        return informer.get(f"{namespace}/{name}")

    def informers(self) -> list[Informer[WrappedView]]:
        """The informers started so far (for metrics)."""
        with self._lock:
            return [i for i in self._informers.values() if isinstance(i, Informer)]

    def stop(self) -> None:
        for informer in self.informers():
            informer.stop()

    def _handle(self, _type: str, old: WrappedView | None, new: WrappedView | None) -> None:
        # Only conditions (and existence) decide anything: most updates of a Job's status change neither.
        if old is not None and new is not None and old.conditions == new.conditions:
            return
        view = new or old
        if view is not None and view.appwrapper:
            self._on_change(view.appwrapper)
