"""One dispatch's API writes, run in the background: read the AppWrapper's templates, create its objects, and say
how it went as a ``Dispatched`` outcome. The dispatcher decides; this module only carries a decision out.

Contract:
- ``create_objects(writer, sites, aw, status, cluster)`` is a job for the write pool (``mcad.k8s.writes``): a generator
  of one API request per step (``mcad.k8s.apply.Steps``) whose return value is a ``Dispatched``. It runs on a write
  thread and touches no dispatcher state: everything it needs is passed in, everything it learnt is in the outcome,
  which the dispatcher thread collects (``Written(key)``).
- The templates are read no older than the view decided about (``not_older_than=aw.resource_version``): from the
  templates cache when it holds them (``mcad.k8s.templates``, no request), else from the API server, a step of its
  own. If the AppWrapper read is not that very spec (gone, another uid or generation), nothing is created and the
  outcome is ``stale``: the decision was about something that no longer exists, and the dispatcher decides again.
- Otherwise ``sites.apply_steps`` creates the objects (in this cluster, or in the hub's worker ``cluster``). A
  refusal comes back as ``error`` (an ``apply.DispatchFailed``, classified for retrying), with what was created
  already undone by the apply; an ``ApiError`` of the read becomes one too, naming where it happened. Anything
  else raised is the write pool's to report (the dispatcher logs it).
- ``status`` is the Dispatched status the dispatcher decided; it is carried through untouched, to be written once
  the objects exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mcad.api.appwrapper import KIND, AppWrapperView
from mcad.errors import ApiError
from mcad.k8s import apply
from mcad.model.retry import classify


class Sites(Protocol):
    """Where a dispatch creates its objects (``mcad.loop.sites.Sites``: this cluster, or the hub's chosen worker)."""

    def apply_steps(self, aw: AppWrapperView, items: Sequence[Mapping[str, Any]],
                    cluster: str) -> apply.Steps[tuple[str, ...]]:
        """Background thread: create its objects, one request per step; returns their uids."""
        ...


class Writer(apply.ObjectWriter, Protocol):
    """Everything the dispatcher writes through (and the one read a dispatch needs)."""

    def apply_status(self, api_version: str, kind: str, namespace: str, name: str, new_status: Mapping[str, Any],
                     *, field_manager: str) -> Mapping[str, Any]:
        """QuotaSubtree status (server-side apply)."""
        ...

    def replace_status(self, api_version: str, kind: str, namespace: str, name: str, uid: str,
                       new_status: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        """AppWrapper status, conditioned on the AppWrapper's uid."""
        ...

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete that very pod with no grace period (a preemption victim that did not go in time)."""
        ...

    def read(self, api_version: str, kind: str, namespace: str, name: str, *,
             not_older_than: str = "") -> Mapping[str, Any]:
        """The object as the API server has it (at ``not_older_than`` or later): the dispatch reads the
        AppWrapper's templates this way, since the controller keeps none."""
        ...

    def patch_json(self, api_version: str, kind: str, namespace: str, name: str,
                   operations: list[dict[str, Any]]) -> Mapping[str, Any]:
        """Hub mode only (finalizers)."""
        ...


@dataclass(frozen=True, slots=True)
class Dispatched:
    """Outcome of a dispatch job: the objects were applied (``error`` None), or not and what was applied is undone.
    ``status`` is the Dispatched status to write once they are."""

    aw: AppWrapperView
    status: Mapping[str, Any]
    uids: tuple[str, ...] = ()
    error: apply.DispatchFailed | None = None
    # The AppWrapper read for its templates is not the one decided about (another generation or uid, or gone):
    # nothing was applied; it is decided about again.
    stale: bool = False


def create_objects(writer: Writer, sites: Sites, aw: AppWrapperView, status: Mapping[str, Any],
                   cluster: str = "") -> apply.Steps[Dispatched]:
    """Read ``aw``'s templates and create its objects in ``cluster`` ("" for this one), one request per step."""
    # In steps of one request: the write pool interleaves them with other AppWrappers' (see mcad.k8s.writes).
    try:
        try:
            raw = writer.read(aw.api_version, KIND, aw.namespace, aw.name, not_older_than=aw.resource_version)
        except ApiError as err:
            if err.status == 404:
                return Dispatched(aw, status, stale=True)
            raise
        meta = raw.get("metadata") or {}
        if meta.get("uid") != aw.uid or meta.get("generation") != aw.generation:
            return Dispatched(aw, status, stale=True)
        items = apply.generic_items(raw)
        asked = bool(meta.get("resourceVersion"))
        del raw  # the whole object, templates and all, need not live as long as the creates take
        if asked:
            # A step per request: the creates take their own. A read the templates cache answered made no request
            # (its answer carries no resourceVersion, mcad.k8s.templates), and a step without one would only send
            # the dispatch to the back of the write pool's queue.
            yield
        uids = yield from sites.apply_steps(aw, items, cluster)
    except apply.DispatchFailed as err:
        return Dispatched(aw, status, error=err)
    except ApiError as err:
        where = f"worker cluster {cluster}" if cluster else "the API server"
        return Dispatched(aw, status, error=apply.DispatchFailed(
            f"{where}: {err.reason} ({err.status}): {err.message}", kind=classify(err)))
    return Dispatched(aw, status, uids)
