"""The dispatcher's hub-mode decisions: placement into one worker, leftovers, the finalizer, worker health.

Contract (a part of ``mcad.dispatcher.Dispatcher``, which mixes ``HubMode`` in: the same single thread runs
these methods on the same state; in single-cluster mode ``hub`` is None and none of this runs):
- ``_fits_somewhere``: a gang fits when its pods pack onto the nodes of one usable worker (as adopted from
  ``("cluster", name)`` keys by ``_sync_cluster``) that its ``clusterScheduling`` allows; ``cluster_policy`` picks
  among those that fit: first in config order, best (the least left of the gang's dominant resource) or spread
  (the most). The Backoff message names every allowed worker and why it does not fit.
- Where each AppWrapper's objects are is ``_placed``; a pod counts as an AppWrapper's only there (``_stray_pod``),
  and its objects anywhere else are leftovers, deleted by its uid label whenever that worker is usable; a failed
  delete retries on the ``("cleanup", worker)`` key with growing delays.
- ``_add_finalizer`` puts ``WORKER_CLEANUP_FINALIZER`` on an AppWrapper before anything of it exists in a worker;
  ``_clean_up_deleted`` removes it only once every configured worker holding its objects has deleted them.
- ``_sync_cluster``: a worker that stops being usable leaves placement at once; AppWrappers there keep their state
  with ClusterAvailable=False (only for a real outage: Unreachable or Unauthorized) and True again when it
  returns, each change also an Event (ClusterUnavailable, ClusterAvailable); past ``unreachableTimeoutSeconds``
  (or when the worker is no longer configured) they are requeued, reason ClusterUnreachableTimeout, not counted
  as a requeuing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from mcad import apply, events, placement, status
from mcad.api.appwrapper import KIND, WORKER_CLEANUP_FINALIZER, AppWrapperView
from mcad.api.podgroups import PodGroup
from mcad.api.resources import ResourceVector
from mcad.api.statusview import StatusView
from mcad.api.views import NodeView, PodView
from mcad.clusters import HealthState, Policy
from mcad.errors import ApiError
from mcad.fit import Fit
from mcad.retry import FailureKind, classify
from mcad.wrapped import WrappedObjects

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mcad.clock import Clock
    from mcad.dispatcher import Writer
    from mcad.hub import Hub
    from mcad.informer import Store
    from mcad.ledger import Ledger
    from mcad.workqueue import WorkQueue
    from mcad.writes import Writes

log = structlog.get_logger("mcad.dispatcher")


@dataclass(frozen=True, slots=True)
class Cleaned:
    """Hub mode: outcome of deleting an AppWrapper's objects in one worker, or of removing its finalizer."""

    cluster: str  # "" for the finalizer
    uid: str
    error: ApiError | None = None


def leftover_share(left: ResourceVector, capacity: ResourceVector, demand: ResourceVector) -> float:
    """How much of a worker stays free after a placement, as the smallest share left of any resource the gang
    asks for (the dominant one): best fit picks the smallest, spread the largest."""
    shares = [left.get(name) / capacity.get(name) for name in demand if capacity.get(name) > 0]
    return min(shares) if shares else 0.0


class HubMode:
    """Hub-mode state and methods of ``Dispatcher`` (see the module docstring)."""

    if TYPE_CHECKING:  # what the dispatcher provides
        queue: WorkQueue[tuple[str, str]]
        ledger: Ledger
        writes: Writes
        writer: Writer
        clock: Clock
        appwrappers: Store[AppWrapperView]
        wrapped: WrappedObjects | None
        _pods_by_appwrapper: dict[str, dict[str, str]]
        _pod_owner: dict[str, str]

        def _status(self, aw: AppWrapperView) -> StatusView: ...
        def _write_status(self, aw: AppWrapperView, new: Mapping[str, Any], *, urgent: bool = True) -> None: ...
        def _dispatched_now(self, key: str) -> AppWrapperView | None: ...
        def _event(self, aw: AppWrapperView, reason: str, message: str) -> None: ...
        def _capacity_may_have_grown(self) -> None: ...
        def gang(self, aw: AppWrapperView) -> tuple[PodGroup, ...]: ...
        def _requeue(self, aw: AppWrapperView, reason: str, message: str, *, requeuings: int,
                     requeue_wait: int) -> None: ...
        def _plan_drop(self, key: str) -> None: ...
        def _enqueue(self, aw: AppWrapperView) -> bool: ...

    def _init_hub(self, hub: Hub | None, cluster_policy: Policy | None) -> None:
        # None: single cluster. The workers usable for placement, as this thread last adopted them (see
        # _sync_cluster); where each AppWrapper's objects were created; objects left in a worker that are not where
        # their AppWrapper is placed (after a requeue, an unreachable worker, a restart), by worker.
        self.hub = hub
        self.cluster_policy = cluster_policy or (hub.config.policy if hub is not None else Policy.BEST)
        self._usable: set[str] = set()
        self._cluster_seen: dict[str, tuple[bool, str]] = {}
        self._placed: dict[str, str] = {}
        self._leftovers: dict[str, dict[str, AppWrapperView]] = {}
        self._cleanups: set[tuple[str, str]] = set()  # (cluster or "" for the finalizer, key) under way
        if hub is not None:
            hub.subscribe(lambda name: self.queue.add(("cluster", name)), lambda key: self.queue.add(("aw", key)))

    def nodes_in(self, cluster: str) -> list[NodeView]:
        """Hub mode: the ledger's nodes of one worker. Dispatcher thread only."""
        prefix = f"{cluster}/"
        return [node for node in self.ledger.nodes() if node.name.startswith(prefix)]

    def _allowed_clusters(self, aw: AppWrapperView) -> list[str]:
        """The workers ``aw``'s clusterScheduling lets it go to, in config order."""
        assert self.hub is not None
        return [name for name in self.hub.names if aw.clusters.allows(name, self.hub.config.worker(name).labels)]

    def _node_sets(self, aw: AppWrapperView) -> list[tuple[str, list[NodeView]]]:
        """Where ``aw`` may be placed: every node (single cluster), or each usable worker it may go to."""
        if self.hub is None:
            return [("", self.ledger.nodes())]
        return [(name, self.nodes_in(name)) for name in self._allowed_clusters(aw) if name in self._usable]

    def _fits_somewhere(self, aw: AppWrapperView, need: ResourceVector,
                        room: dict[str, ResourceVector]) -> Fit:
        """Hub mode: the gang must fit in one worker. Among the usable workers it may go to, ``cluster_policy``
        picks: the first in config order, the tightest fit (best: leaves the largest holes elsewhere) or the
        loosest (spread). Fit is judged by packing its pods onto the worker's nodes, as with one cluster."""
        assert self.hub is not None
        allowed = self._allowed_clusters(aw)
        if not allowed:
            why = f"no worker cluster matches its clusterScheduling ({aw.clusters.describe()})"
            return Fit(False, frozenset({"clusterScheduling"}), partial(str, why))
        fits: list[tuple[float, int, str, tuple[tuple[str, ResourceVector, int], ...]]] = []
        about: set[str] = set()
        reasons: list[str] = []
        consumed = self.ledger.consumed(aw.key)
        for order, name in enumerate(allowed):
            if name not in self._usable:
                about.add(f"{name}: {self.hub.health(name).state.value}")
                reasons.append(f"{name}: {self.hub.describe(name)}")
                continue
            nodes = self.nodes_in(name)
            free = ResourceVector()
            capacity = ResourceVector()
            for node in nodes:
                if node.schedulable:
                    free = free + room.get(node.name, ResourceVector())
                    capacity = capacity + node.allocatable
            if consumed:
                # Its own pods run there already (a restart between creating objects and recording it): only the
                # rest is judged, in that worker only.
                if self._placed.get(aw.key) == name and need.fits_in(free):
                    fits.append((0.0, order, name, ()))
                continue
            packing = placement.pack(self.gang(aw), nodes, room)
            if packing.fits:
                fits.append((leftover_share(free - aw.demand, capacity, aw.demand), order, name, packing.placement))
            else:
                about.update(f"{name}: {a}" for a in packing.about)
                reasons.append(f"{name}: {packing.why}")
        if not fits:
            why = "does not fit in any worker cluster: " + "; ".join(reasons) if reasons else \
                "does not fit in any worker cluster"
            return Fit(False, frozenset(about), partial(str, why))
        if self.cluster_policy is Policy.FIRST:
            chosen = min(fits, key=lambda f: f[1])
        elif self.cluster_policy is Policy.SPREAD:
            chosen = max(fits, key=lambda f: (f[0], -f[1]))
        else:
            chosen = min(fits, key=lambda f: (f[0], f[1]))
        return Fit(True, plan=chosen[3], cluster=chosen[2])

    def _wrapped_of(self, key: str) -> WrappedObjects | None:
        """The wrapped-object informers that can tell how ``key`` is doing: the hub's, or (hub mode) those of
        the worker it runs in, and none while that worker cannot be reached (its state is kept meanwhile)."""
        if self.hub is None:
            return self.wrapped
        cluster = self._placed.get(key, "")
        return self.hub.wrapped(cluster) if cluster in self._usable else None

    def _stray_pod(self, pod: PodView) -> PodView:
        """A pod of an AppWrapper, in a worker the AppWrapper is not placed in: it uses that worker's capacity but
        is not the AppWrapper's (it would make it look running, or draining); its objects there are deleted."""
        key = pod.appwrapper or ""
        aw = self.appwrappers.get(key)
        if aw is not None and not pod.terminal and not pod.deleting:
            leftovers = self._leftovers.setdefault(pod.cluster, {})
            if key not in leftovers:
                leftovers[key] = aw
                self._clean_leftovers(pod.cluster)
        return dataclasses.replace(pod, appwrapper=None)

    def _detach_pods(self, key: str) -> None:
        """Its pods (in a worker it leaves) stop counting as its own; they still count as usage where they run."""
        self._plan_drop(key)
        for uid in list(self._pods_by_appwrapper.get(key, {})):
            pod = self.ledger.pod(uid)
            if pod is not None:
                self.ledger.upsert_pod(dataclasses.replace(pod, appwrapper=None))
            self._pod_owner.pop(uid, None)
        self._pods_by_appwrapper.pop(key, None)

    def _clean_leftovers(self, cluster: str) -> None:
        """Delete, in the background, the objects of every AppWrapper left over in ``cluster`` (when usable)."""
        if cluster not in self._usable or self.hub is None:
            return
        hub = self.hub
        for key, aw in self._leftovers.get(cluster, {}).items():
            if (cluster, key) in self._cleanups:
                continue
            self._cleanups.add((cluster, key))

            def job(aw: AppWrapperView = aw) -> apply.Steps[Cleaned]:
                try:  # one delete per step: the write pool interleaves them with other AppWrappers' writes
                    yield from apply.delete_remote_steps(hub.writer(cluster), aw)
                except ApiError as err:
                    return Cleaned(cluster, aw.uid, err)
                return Cleaned(cluster, aw.uid)

            self.writes.submit(key, job, tenant=aw.namespace)

    def _clean_up_deleted(self, aw: AppWrapperView) -> None:
        """Hub mode, an AppWrapper being deleted: delete its objects in every worker that may hold some, then
        let it go (remove the finalizer). A worker that cannot be reached holds the deletion until it returns."""
        key = aw.key
        if WORKER_CLEANUP_FINALIZER not in aw.finalizers:
            self._placed.pop(key, None)
            return
        placed = self._placed.get(key)
        if placed:
            self._leftovers.setdefault(placed, {})[key] = aw
        holding = [c for c, leftovers in self._leftovers.items() if key in leftovers]
        for cluster in [c for c in holding if self.hub is not None and self.hub.worker(c) is None]:
            log.warning("not configured any more: its objects there are not deleted", appwrapper=key, cluster=cluster)
            self._leftovers[cluster].pop(key, None)
            holding.remove(cluster)
        for cluster in holding:
            self._clean_leftovers(cluster)
        if holding or ("", key) in self._cleanups:
            waiting = [c for c in holding if c not in self._usable]
            if waiting:
                log.info("deletion waits for worker clusters", appwrapper=key, clusters=waiting)
            return
        self._remove_finalizer(aw)

    def _remove_finalizer(self, aw: AppWrapperView) -> None:
        self._cleanups.add(("", aw.key))
        writer = self.writer

        def job() -> Cleaned:
            try:
                index = aw.finalizers.index(WORKER_CLEANUP_FINALIZER)
                writer.patch_json(aw.api_version, KIND, aw.namespace, aw.name, [
                    {"op": "test", "path": f"/metadata/finalizers/{index}", "value": WORKER_CLEANUP_FINALIZER},
                    {"op": "remove", "path": f"/metadata/finalizers/{index}"}])
            except ApiError as err:
                return Cleaned("", aw.uid, None if err.status == 404 else err)
            return Cleaned("", aw.uid)

        self.writes.submit(aw.key, job, tenant=aw.namespace)

    def _add_finalizer(self, aw: AppWrapperView) -> None:
        """Background thread: the cleanup finalizer on ``aw`` before anything of it exists in a worker."""
        if WORKER_CLEANUP_FINALIZER in aw.finalizers:
            return
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": aw.uid}]
        if aw.finalizers:
            ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": WORKER_CLEANUP_FINALIZER})
        else:
            ops.append({"op": "add", "path": "/metadata/finalizers", "value": [WORKER_CLEANUP_FINALIZER]})
        try:
            self.writer.patch_json(aw.api_version, KIND, aw.namespace, aw.name, ops)
        except ApiError as err:
            # 404: deleted meanwhile; 422: a test failed (another uid, or the finalizers changed): try again.
            raise apply.DispatchFailed(f"cannot add finalizer {WORKER_CLEANUP_FINALIZER}: {err.message}",
                                       kind=FailureKind.PERMANENT if err.status == 404 else
                                       FailureKind.UNAVAILABLE if classify(err) is FailureKind.UNAVAILABLE
                                       else FailureKind.TRANSIENT) from err

    def _cleaned(self, key: str, outcome: Cleaned) -> None:
        self._cleanups.discard((outcome.cluster, key))
        if outcome.error is not None:
            log.warning("worker cleanup failed; will retry", appwrapper=key, cluster=outcome.cluster or "(hub)",
                        reason=outcome.error.message)
            self.queue.add_rate_limited(("aw", key) if not outcome.cluster else ("cleanup", outcome.cluster))
            return
        if outcome.cluster:
            self.queue.forget(("cleanup", outcome.cluster))
            leftovers = self._leftovers.get(outcome.cluster, {})
            if key in leftovers and leftovers[key].uid == outcome.uid:
                del leftovers[key]
            if self._placed.get(key) == outcome.cluster:
                aw = self.appwrappers.get(key)
                if aw is None or aw.deleting:
                    self._placed.pop(key, None)
        self.queue.add(("aw", key))

    def _sync_cluster(self, name: str) -> None:
        """Adopt a worker's new health: in or out of placement; AppWrappers placed there are told; after
        ``unreachableTimeoutSeconds`` out, they are requeued (to go elsewhere)."""
        if self.hub is None:
            return
        if self.hub.worker(name) is None:
            self._requeue_from(name, f"worker cluster {name} is not in the clusters configuration any more; what "
                                     f"it left there is not deleted")
            return
        usable = self.hub.usable(name)
        health = self.hub.health(name)
        seen = (usable, health.state.value)
        before = self._cluster_seen.get(name)
        self._cluster_seen[name] = seen
        placed_here = [k for k, c in self._placed.items() if c == name]
        if usable:
            self._usable.add(name)
        else:
            self._usable.discard(name)
        if seen != before:
            log.info("worker cluster", cluster=name, usable=usable, state=health.state.value,
                     message=health.message, appwrappers=len(placed_here))
            self._capacity_may_have_grown()  # what waits may now fit, or wait for another reason
            down = health.state in (HealthState.UNREACHABLE, HealthState.UNAUTHORIZED)
            for key in placed_here:
                aw = self._dispatched_now(key)
                if aw is None:
                    continue
                current = self._status(aw).raw()
                health_told = status.latest(current.get("conditions"), status.CLUSTER_AVAILABLE) or {}
                told = health_told.get("status") == "False"
                # Only a real outage is told (not a worker still being listed at start), and its end.
                if down:
                    message = f"worker cluster {name} is {health.state.value.lower()}: {health.message}"
                    self._write_status(aw, status.cluster_available(
                        current, self.clock.now(), available=False, reason=health.state.value, message=message))
                    self._event(aw, events.CLUSTER_UNAVAILABLE, message)
                elif usable and told:
                    self._write_status(aw, status.cluster_available(current, self.clock.now(), available=True,
                                                                    reason=HealthState.HEALTHY.value))
                    self._event(aw, events.CLUSTER_AVAILABLE, f"worker cluster {name} is healthy again")
        if usable:
            self._clean_leftovers(name)
            for key in placed_here:
                self.queue.add(("aw", key))  # lifecycle decisions waited for its wrapped objects
            self._capacity_may_have_grown()
            return
        timeout = self.hub.config.unreachable_timeout_seconds
        if health.state not in (HealthState.UNREACHABLE, HealthState.UNAUTHORIZED):
            return
        down_for = self.hub.worker(name).health.down_for()  # type: ignore[union-attr]
        if down_for < timeout:
            self.queue.add_after(("cluster", name), timeout - down_for + 0.05)
            return
        self._requeue_from(name, f"worker cluster {name} has been {health.state.value.lower()} for {int(down_for)} s "
                                 f"(unreachableTimeoutSeconds {int(timeout)}); its objects there are deleted when it "
                                 f"returns")

    def _requeue_from(self, name: str, message: str) -> None:
        """Every AppWrapper running in worker ``name`` back to the queue, to go elsewhere."""
        for key in [k for k, c in self._placed.items() if c == name]:
            aw = self._dispatched_now(key)
            if aw is None:
                continue
            current = self._status(aw)
            self._requeue(aw, status.CLUSTER_UNREACHABLE_TIMEOUT, message, requeuings=current.requeuings,
                          requeue_wait=current.requeue_wait)
            # It waits for nothing there: its old pods count as that worker's usage, not as its own.
            self._detach_pods(key)
            self._placed.pop(key, None)
            self._enqueue(aw)
        if self.hub is not None and self.hub.worker(name) is None:
            self._leftovers.pop(name, None)  # no connection will ever delete them
