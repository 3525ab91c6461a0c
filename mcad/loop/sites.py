"""Where an AppWrapper's objects live: the seam between the dispatcher's decisions and the cluster(s) they touch.

Contract:
- ``Sites`` is everything the dispatcher does differently in hub mode, behind one protocol with two
  implementations: ``LocalCluster`` (below: the objects go into the API server the controller runs against) and
  ``mcad.hub.sites.WorkerSites`` (into one worker cluster each, chosen by ``mcad.hub.placement.WorkerPlacement``).
  ``mcad.wiring`` builds one and hands it to the loop's owners, which never ask which it is. An implementation
  that takes AppWrappers back (a worker gone) is handed the owners it needs (``mcad.loop.active``,
  ``mcad.loop.queued``, ``mcad.loop.decisions``); none calls back into the dispatcher.
- Writes go through the dispatcher's write pool (``mcad.k8s.writes``) as jobs of the AppWrapper's key; their outcomes
  (``Cleaned``) come back to the dispatcher thread and are handed to ``Sites.cleaned``.
- An AppWrapper that carries ``WORKER_CLEANUP_FINALIZER`` (dispatched by a hub earlier) and is being deleted while
  hub mode is off has the finalizer removed: its objects in a worker cannot be reached, but it must not be stuck
  deleting for ever. This is logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from mcad.api.appwrapper import KIND, WORKER_CLEANUP_FINALIZER, AppWrapperView
from mcad.api.views import PodView
from mcad.errors import ApiError
from mcad.k8s import apply
from mcad.k8s.wrapped import WrappedObjects
from mcad.k8s.writes import Writes
from mcad.model.nodehealth import NodeHealth

log = structlog.get_logger("mcad.loop.dispatcher")


@dataclass(frozen=True, slots=True)
class Cleaned:
    """Outcome of deleting an AppWrapper's objects in one worker, or of removing its finalizer (``cluster`` "")."""

    cluster: str
    uid: str
    error: ApiError | None = None


class FinalizerWriter(Protocol):
    def patch_json(self, api_version: str, kind: str, namespace: str, name: str,
                   operations: list[dict[str, Any]]) -> Mapping[str, Any]:
        ...


class Sites(Protocol):
    """Where objects are created and deleted, and which informers tell how they do (see the module docstring)."""

    def handlers(self) -> Mapping[type[Any], Callable[[Any], None]]:
        """Work-queue key kinds of its own (``mcad.model.keys``), with their handlers."""
        ...

    def start(self) -> None:
        """The ledger is rebuilt: adopt what is known now."""
        ...

    def adopt(self, aw: AppWrapperView) -> None:
        """At a rebuild, before pods: where an AppWrapper's objects already are."""
        ...

    def claim(self, pod: PodView) -> PodView:
        """A pod as the ledger should count it: one in a place its AppWrapper is not placed in is not its own."""
        ...

    def placing(self, key: str, cluster: str) -> None:
        """A dispatch into ``cluster`` is decided."""
        ...

    def unplace(self, key: str) -> None:
        """What a dispatch applied was undone."""
        ...

    def where(self, key: str) -> str:
        """The worker its objects are in ("" for this cluster)."""
        ...

    def placed(self) -> Mapping[str, str]:
        """Hub mode: AppWrapper key -> the worker its objects are in (empty for this cluster)."""
        ...

    def apply_steps(self, aw: AppWrapperView, items: Sequence[Mapping[str, Any]],
                    cluster: str) -> apply.Steps[tuple[str, ...]]:
        """Background thread: create its objects, one request per step; returns their uids."""
        ...

    def delete_objects(self, aw: AppWrapperView, uids: tuple[str, ...]) -> None:
        """Delete its objects (in the background, retried where no garbage collector would finish the job)."""
        ...

    def deleted(self, key: str, aw: AppWrapperView | None, last_dispatched: AppWrapperView | None,
                uids: tuple[str, ...]) -> None:
        """The AppWrapper is being deleted (``aw``) or gone (None); ``last_dispatched``: its view when it was last
        dispatched, whose items say what to delete."""
        ...

    def wrapped_of(self, key: str) -> WrappedObjects | None:
        """The informers over its wrapped objects, None when they cannot tell now."""
        ...

    def cleaned(self, key: str, outcome: Cleaned) -> None:
        ...


def remove_finalizer(writer: FinalizerWriter, writes: Writes, aw: AppWrapperView) -> None:
    """Remove ``WORKER_CLEANUP_FINALIZER`` from ``aw`` in the background; the outcome is a ``Cleaned("")``."""

    def job() -> Cleaned:
        try:
            index = aw.finalizers.index(WORKER_CLEANUP_FINALIZER)
            writer.patch_json(aw.api_version, KIND, aw.namespace, aw.name, [
                {"op": "test", "path": f"/metadata/finalizers/{index}", "value": WORKER_CLEANUP_FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{index}"}])
        except ApiError as err:
            return Cleaned("", aw.uid, None if err.status == 404 else err)
        return Cleaned("", aw.uid)

    writes.submit(aw.key, job, tenant=aw.namespace)


class LocalCluster:
    """Single-cluster mode: objects go into the controller's own API server, with ownerReferences."""

    def __init__(self, writer: apply.ObjectWriter, finalizers: FinalizerWriter, writes: Writes,
                 wrapped: WrappedObjects | None, retry: Callable[[str], None], again: Callable[[str], None],
                 gate: bool = False, health: NodeHealth | None = None) -> None:
        self._writer = writer
        self._gate = gate  # --placement=binding: pod templates get mcad's scheduling gate
        self._health = health  # pods of a rule's resource kept off the nodes its rules make sick
        self._finalizers = finalizers
        self._writes = writes
        self._wrapped = wrapped
        self._retry = retry  # look at the AppWrapper again after a backoff
        self._again = again  # look at it again now
        self._removing: set[str] = set()  # finalizer removals under way

    def handlers(self) -> Mapping[type[Any], Callable[[Any], None]]:
        return {}

    def start(self) -> None:
        pass

    def adopt(self, aw: AppWrapperView) -> None:
        pass

    def claim(self, pod: PodView) -> PodView:
        return pod

    def placing(self, key: str, cluster: str) -> None:
        pass

    def unplace(self, key: str) -> None:
        pass

    def where(self, key: str) -> str:
        return ""

    def placed(self) -> Mapping[str, str]:
        return {}

    def apply_steps(self, aw: AppWrapperView, items: Sequence[Mapping[str, Any]],
                    cluster: str) -> apply.Steps[tuple[str, ...]]:
        return apply.dispatch_steps(self._writer, aw, items, gate=self._gate, health=self._health)

    def delete_objects(self, aw: AppWrapperView, uids: tuple[str, ...], *, owner_gone: bool = False) -> None:
        self._writes.submit(aw.key, lambda: apply.delete_wrapped_steps(self._writer, aw, uids, owner_gone=owner_gone),
                            tenant=aw.namespace)

    def deleted(self, key: str, aw: AppWrapperView | None, last_dispatched: AppWrapperView | None,
                uids: tuple[str, ...]) -> None:
        if aw is not None and WORKER_CLEANUP_FINALIZER in aw.finalizers and key not in self._removing:
            log.warning("hub mode is off: the objects this AppWrapper may have in a worker cluster are not "
                        "deleted", appwrapper=key, cluster=aw.target_cluster or "unknown")
            self._removing.add(key)
            remove_finalizer(self._finalizers, self._writes, aw)
        if last_dispatched is not None:
            # Only what makes pods: the garbage collector takes the rest now that the AppWrapper is deleted.
            self.delete_objects(last_dispatched, uids, owner_gone=True)

    def wrapped_of(self, key: str) -> WrappedObjects | None:
        return self._wrapped

    def cleaned(self, key: str, outcome: Cleaned) -> None:
        self._removing.discard(key)
        if outcome.error is not None:
            log.warning("finalizer removal failed; will retry", appwrapper=key, reason=outcome.error.message)
            self._retry(key)
        else:
            self._again(key)
