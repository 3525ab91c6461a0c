"""Hub mode's ``Sites``: objects created in worker clusters, leftovers deleted there, worker health adopted.

Contract (``mcad.loop.sites`` for the protocol; the dispatcher thread runs all of this, writes go to its write pool):
- A dispatch goes into the worker ``WorkerPlacement`` chose, without ownerReferences, and only once the cleanup
  finalizer (``WORKER_CLEANUP_FINALIZER``) is on the AppWrapper: nothing of it may exist in a worker without it.
  The worker's namespace is created when missing. ``status.targetClusterName`` names the worker.
- A pod counts as an AppWrapper's only in the worker it is placed in (``claim``); its objects anywhere else are
  leftovers, deleted by its uid label whenever that worker is usable; a failed delete retries on the
  ``WorkerCleanup`` key with growing delays.
- The finalizer comes off a deleted AppWrapper only once every configured worker holding its objects has deleted
  them; a worker that cannot be reached holds the deletion until it returns, one that is no longer configured
  does not (its objects there are left, and that is logged).
- ``WorkerClusters`` is what it uses of the hub (``mcad.hub.connections.Hub`` in production), typed as a protocol.
- ``ClusterEvent`` keys adopt a worker's new health: a worker that stops being usable leaves placement at
  once; AppWrappers there keep their state with ClusterAvailable=False (only for a real outage: Unreachable or
  Unauthorized) and True again when it returns, each change also an Event (ClusterUnavailable,
  ClusterAvailable); past ``unreachableTimeoutSeconds`` (or when the worker is no longer configured) they are
  requeued, reason ClusterUnreachableTimeout, not counted as a requeuing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import structlog

from mcad.api.appwrapper import KIND, WORKER_CLEANUP_FINALIZER, AppWrapperView
from mcad.api.views import NodeView, PodView
from mcad.clock import Clock
from mcad.errors import ApiError
from mcad.hub.clusters import HealthState, HealthStatus, HubConfig, WorkerHealth
from mcad.hub.placement import WorkerDirectory, WorkerPlacement
from mcad.k8s import apply, events
from mcad.k8s.informer import Store
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.wrapped import WrappedObjects
from mcad.k8s.writes import Writes
from mcad.loop.active import Active
from mcad.loop.decisions import Decisions
from mcad.loop.pinning import PodWriter
from mcad.loop.queued import Queued
from mcad.loop.sites import Cleaned, FinalizerWriter, remove_finalizer
from mcad.model import status
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.keys import AppWrapperEvent, ClusterEvent, WorkerCleanup
from mcad.model.retry import FailureKind, classify

log = structlog.get_logger("mcad.loop.dispatcher")


class WorkerConnection(Protocol):
    health: WorkerHealth

    def ensure_namespace(self, namespace: str) -> None:
        ...


class WorkerClusters(WorkerDirectory, Protocol):
    """The workers as hub mode's dispatch and cleanup use them (``mcad.hub.connections.Hub``)."""

    @property
    def config(self) -> HubConfig:  # the whole configuration, where placement reads only a part of it
        ...

    def health(self, name: str) -> HealthStatus:  # the whole status, where placement reads only its state
        ...

    def worker(self, name: str) -> WorkerConnection | None:
        ...

    def subscribe(self, on_change: Callable[[str], None], on_wrapped_change: Callable[[str], None]) -> None:
        ...

    def usable(self, name: str) -> bool:
        ...

    def writer(self, name: str) -> apply.ObjectWriter:
        ...

    def wrapped(self, name: str) -> WrappedObjects | None:
        ...


class WorkerPods:
    """For ``mcad.loop.pinning``: a pod is patched in its worker, which names its nodes without the worker's prefix."""

    def __init__(self, hub: WorkerClusters, placement: WorkerPlacement) -> None:
        self._hub = hub
        self._placement = placement

    def writer(self, pod: PodView) -> PodWriter:
        return cast(PodWriter, self._hub.writer(pod.cluster))

    def local_node(self, node: str) -> str:
        return node.partition("/")[2]

    def nodes_for(self, key: str, snapshot: Snapshot) -> Sequence[NodeView]:
        return self._placement.nodes_for(key, snapshot)


class WorkerSites:
    def __init__(self, hub: WorkerClusters, placement: WorkerPlacement, *, active: Active, queued: Queued,
                 decisions: Decisions,
                 accountant: Accountant, appwrappers: Store[AppWrapperView], finalizers: FinalizerWriter,
                 writes: Writes, queue: WorkQueue[Any], clock: Clock, gate: bool = False) -> None:
        self.hub = hub
        self._gate = gate  # --placement=binding: pod templates get mcad's scheduling gate
        self.placement = placement
        self._active = active
        self._queued = queued
        self._decisions = decisions
        self._accountant = accountant
        self._appwrappers = appwrappers
        self._finalizers = finalizers
        self._writes = writes
        self._queue = queue
        self._clock = clock
        # Per worker: (usable, health state) as last adopted; objects left there that are not where their
        # AppWrapper is placed (after a requeue, an unreachable worker, a restart); deletions under way as
        # (worker, or "" for the finalizer, key).
        self._seen: dict[str, tuple[bool, str]] = {}
        self._leftovers: dict[str, dict[str, AppWrapperView]] = {}
        self._cleanups: set[tuple[str, str]] = set()
        hub.subscribe(lambda name: queue.add(ClusterEvent(name)), lambda key: queue.add(AppWrapperEvent(key)))

    # -- Sites ------------------------------------------------------------------------------------------------

    def handlers(self) -> Mapping[type[Any], Callable[[Any], None]]:
        return {ClusterEvent: lambda k: self._sync_cluster(k.name),
                WorkerCleanup: lambda k: self._clean_leftovers(k.name)}

    def start(self) -> None:
        for name in self.hub.names:  # adopt every worker's state now, whatever the prober said before
            self._queue.add(ClusterEvent(name))
        for name in set(self.placement.placed.values()) - set(self.hub.names):
            # Removed from the configuration: treated as a worker that never comes back.
            log.warning("AppWrappers are placed in a worker cluster that is not configured; they are requeued "
                        "after unreachableTimeoutSeconds", cluster=name)
            self._queue.add_after(ClusterEvent(name), self.hub.config.unreachable_timeout_seconds)

    def adopt(self, aw: AppWrapperView) -> None:
        if aw.target_cluster:
            self.placement.placed[aw.key] = aw.target_cluster

    def claim(self, pod: PodView) -> PodView:
        """A pod of an AppWrapper in a worker it is not placed in uses that worker's capacity but is not the
        AppWrapper's (it would make it look running, or draining); its objects there are deleted."""
        key = pod.appwrapper
        if not key or self.placement.placed.get(key) == pod.cluster:
            return pod
        aw = self._appwrappers.get(key)
        if aw is not None and not pod.terminal and not pod.deleting:
            leftovers = self._leftovers.setdefault(pod.cluster, {})
            if key not in leftovers:
                leftovers[key] = aw
                self._clean_leftovers(pod.cluster)
        return dataclasses.replace(pod, appwrapper=None)

    def placing(self, key: str, cluster: str) -> None:
        self.placement.placed[key] = cluster
        # What a previous dispatch left there is overwritten now (and must not be deleted later).
        self._leftovers.get(cluster, {}).pop(key, None)

    def unplace(self, key: str) -> None:
        self.placement.placed.pop(key, None)

    def where(self, key: str) -> str:
        return self.placement.placed.get(key, "")

    def placed(self) -> Mapping[str, str]:
        return self.placement.placed

    def apply_steps(self, aw: AppWrapperView, items: Sequence[Mapping[str, Any]],
                    cluster: str) -> apply.Steps[tuple[str, ...]]:
        self._add_finalizer(aw)
        yield
        worker = self.hub.worker(cluster)
        if worker is None:
            raise apply.DispatchFailed(f"worker cluster {cluster} is not configured", kind=FailureKind.UNAVAILABLE)
        worker.ensure_namespace(aw.namespace)
        yield
        return (yield from apply.dispatch_steps(self.hub.writer(cluster), aw, items, remote=True, gate=self._gate,
                                                health=self._accountant.node_health))

    def delete_objects(self, aw: AppWrapperView, uids: tuple[str, ...]) -> None:
        cluster = self.placement.placed.get(aw.key)
        if cluster:
            # Deleted from the worker when it can be reached (now, or when it comes back); retried until done.
            self._leftovers.setdefault(cluster, {})[aw.key] = aw
            self._clean_leftovers(cluster)

    def deleted(self, key: str, aw: AppWrapperView | None, last_dispatched: AppWrapperView | None,
                uids: tuple[str, ...]) -> None:
        if aw is None:
            self.placement.placed.pop(key, None)
            return
        self._clean_up_deleted(aw)

    def wrapped_of(self, key: str) -> WrappedObjects | None:
        """Those of the worker it runs in, and none while that worker cannot be reached (its state is kept)."""
        cluster = self.placement.placed.get(key, "")
        return self.hub.wrapped(cluster) if cluster in self.placement.usable else None

    def cleaned(self, key: str, outcome: Cleaned) -> None:
        self._cleanups.discard((outcome.cluster, key))
        if outcome.error is not None:
            log.warning("worker cleanup failed; will retry", appwrapper=key, cluster=outcome.cluster or "(hub)",
                        reason=outcome.error.message)
            retry = AppWrapperEvent(key) if not outcome.cluster else WorkerCleanup(outcome.cluster)
            self._queue.add_rate_limited(retry)
            return
        if outcome.cluster:
            self._queue.forget(WorkerCleanup(outcome.cluster))
            leftovers = self._leftovers.get(outcome.cluster, {})
            if key in leftovers and leftovers[key].uid == outcome.uid:
                del leftovers[key]
            if self.placement.placed.get(key) == outcome.cluster:
                aw = self._appwrappers.get(key)
                if aw is None or aw.deleting:
                    self.placement.placed.pop(key, None)
        self._queue.add(AppWrapperEvent(key))

    # -- leftovers and the finalizer ------------------------------------------------------------------------------

    def _clean_leftovers(self, cluster: str) -> None:
        """Delete, in the background, the objects of every AppWrapper left over in ``cluster`` (when usable)."""
        if cluster not in self.placement.usable:
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

            self._writes.submit(key, job, tenant=aw.namespace)

    def _clean_up_deleted(self, aw: AppWrapperView) -> None:
        """An AppWrapper being deleted: delete its objects in every worker that may hold some, then let it go
        (remove the finalizer). A worker that cannot be reached holds the deletion until it returns."""
        key = aw.key
        if WORKER_CLEANUP_FINALIZER not in aw.finalizers:
            self.placement.placed.pop(key, None)
            return
        placed = self.placement.placed.get(key)
        if placed:
            self._leftovers.setdefault(placed, {})[key] = aw
        holding = [c for c, leftovers in self._leftovers.items() if key in leftovers]
        for cluster in [c for c in holding if self.hub.worker(c) is None]:
            log.warning("not configured any more: its objects there are not deleted", appwrapper=key, cluster=cluster)
            self._leftovers[cluster].pop(key, None)
            holding.remove(cluster)
        for cluster in holding:
            self._clean_leftovers(cluster)
        if holding or ("", key) in self._cleanups:
            waiting = [c for c in holding if c not in self.placement.usable]
            if waiting:
                log.info("deletion waits for worker clusters", appwrapper=key, clusters=waiting)
            return
        self._cleanups.add(("", key))
        remove_finalizer(self._finalizers, self._writes, aw)

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
            self._finalizers.patch_json(aw.api_version, KIND, aw.namespace, aw.name, ops)
        except ApiError as err:
            # 404: deleted meanwhile; 422: a test failed (another uid, or the finalizers changed): try again.
            raise apply.DispatchFailed(f"cannot add finalizer {WORKER_CLEANUP_FINALIZER}: {err.message}",
                                       kind=FailureKind.PERMANENT if err.status == 404 else
                                       classify(err) if classify(err) in (FailureKind.UNAVAILABLE, FailureKind.TIMEOUT)
                                       else FailureKind.TRANSIENT) from err

    # -- worker health --------------------------------------------------------------------------------------------

    def _sync_cluster(self, name: str) -> None:
        """Adopt a worker's new health: in or out of placement; AppWrappers placed there are told; after
        ``unreachableTimeoutSeconds`` out, they are requeued (to go elsewhere)."""
        worker = self.hub.worker(name)
        if worker is None:
            self._requeue_from(name, f"worker cluster {name} is not in the clusters configuration any more; what "
                                     f"it left there is not deleted")
            return
        usable = self.hub.usable(name)
        health = self.hub.health(name)
        seen = (usable, health.state.value)
        before = self._seen.get(name)
        self._seen[name] = seen
        placed_here = [k for k, c in self.placement.placed.items() if c == name]
        if usable:
            self.placement.usable.add(name)
        else:
            self.placement.usable.discard(name)
        if seen != before:
            log.info("worker cluster", cluster=name, usable=usable, state=health.state.value,
                     message=health.message, appwrappers=len(placed_here))
            self._active.capacity_may_have_grown()  # what waits may now fit, or wait for another reason
            self._tell_placed(name, placed_here, usable, health.state, health.message)
        if usable:
            self._clean_leftovers(name)
            for key in placed_here:
                self._queue.add(AppWrapperEvent(key))  # lifecycle decisions waited for its wrapped objects
            self._active.capacity_may_have_grown()
            return
        timeout = self.hub.config.unreachable_timeout_seconds
        if health.state not in (HealthState.UNREACHABLE, HealthState.UNAUTHORIZED):
            return
        down_for = worker.health.down_for()
        if down_for < timeout:
            self._queue.add_after(ClusterEvent(name), timeout - down_for + 0.05)
            return
        self._requeue_from(name, f"worker cluster {name} has been {health.state.value.lower()} for {int(down_for)} s "
                                 f"(unreachableTimeoutSeconds {int(timeout)}); its objects there are deleted when it "
                                 f"returns")

    def _tell_placed(self, name: str, placed_here: list[str], usable: bool, state: HealthState,
                     message: str) -> None:
        """ClusterAvailable on the AppWrappers placed in a worker: False for a real outage (not for a worker still
        being listed at start), True again when it ends."""
        down = state in (HealthState.UNREACHABLE, HealthState.UNAUTHORIZED)
        for key in placed_here:
            aw = self._queued.dispatched_now(key)
            if aw is None:
                continue
            current = self._decisions.status(aw).raw()
            health_told = status.latest(current.get("conditions"), status.CLUSTER_AVAILABLE) or {}
            told = health_told.get("status") == "False"
            if down:
                why = f"worker cluster {name} is {state.value.lower()}: {message}"
                self._decisions.decide(aw, status.cluster_available(current, self._clock.now(), available=False,
                                                                    reason=state.value, message=why))
                self._decisions.event(aw, events.CLUSTER_UNAVAILABLE, why)
            elif usable and told:
                self._decisions.decide(aw, status.cluster_available(current, self._clock.now(), available=True,
                                                                    reason=HealthState.HEALTHY.value))
                self._decisions.event(aw, events.CLUSTER_AVAILABLE, f"worker cluster {name} is healthy again")

    def _requeue_from(self, name: str, message: str) -> None:
        """Every AppWrapper running in worker ``name`` back to the queue, to go elsewhere."""
        for key in [k for k, c in self.placement.placed.items() if c == name]:
            aw = self._queued.dispatched_now(key)
            if aw is None:
                continue
            self._active.requeue_keeping_count(aw, status.CLUSTER_UNREACHABLE_TIMEOUT, message)
            # It waits for nothing there: its old pods count as that worker's usage, not as its own.
            self._accountant.detach_pods(key)
            self.placement.placed.pop(key, None)
            self._queued.enqueue(aw)
        if self.hub.worker(name) is None:
            self._leftovers.pop(name, None)  # no connection will ever delete them
