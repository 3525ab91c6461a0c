"""The dispatcher loop: one thread that owns the ledger and decides what runs.

Contract:
- Informer handlers only enqueue keys (``("aw", ns/name)``, ``("node", name)``, ``("pod", uid)``, ``DISPATCH``);
  this thread is the only reader of those keys and the only writer of the ledger, so the hot path has no locks.
- Nothing is decided before the AppWrapper, Node and Pod informers have all synced and the ledger has been
  rebuilt from them, with a reservation for every AppWrapper that is already dispatched (a restart never
  dispatches past capacity while it catches up).
- A ``DISPATCH`` key (coalesced by the queue, so a burst of events costs one cycle) walks the queued AppWrappers
  in order (priority, creation time, name) and dispatches every one that fits: with ``fit="nodes"`` (default)
  when all of its pods pack onto the nodes' room (``placement.pack``; room planned for dispatched pods not yet
  bound is held back), with ``fit="aggregate"`` when its demand fits the free total. With ``strict_fifo`` it
  stops at the first that does not fit; with ``preemption`` one that does not fit may evict strictly
  lower-priority dispatched AppWrappers (``_preempt_for``) and then holds back everything behind it. The walk
  is over ``PendingQueue`` groups (same demand, and with fit="nodes" same pod shapes), so its cost follows what
  can fit, not the queue's length. A dispatch is reserved in the ledger before its API writes and released if
  they fail.
- A waiting AppWrapper gets a Backoff condition saying what blocks it (the short resources, or with fit="nodes"
  the node constraints) and its queue position, written when it first waits and again only when what blocks it
  changes or its position does (exactly up to 10, then by powers of two); not for every change of the amounts,
  which would be one write per waiting AppWrapper per cycle.
- Capacity that frees up (an AppWrapper deleted, completed or failed; a pod finished or gone; a node added or
  ready) triggers a new cycle at once. There are no timed sleeps between decisions.
- Status is written (server-side apply, status subresource) only when it differs from the last status seen
  or written for that AppWrapper.
- After dispatch (``mcad.lifecycle``): events of its pods and of its wrapped objects (``WrappedObjects``
  informers) decide Completed / RunningHoldCompletion / Failed; ``("requeue", key)`` and ``("deadline", key)``
  timers are ``add_after`` delays computed from times in status, so they survive restarts. A requeued
  AppWrapper's objects are deleted and it waits in the queue, out of the cycle, until its old pods are gone.
- Hub mode (``hub``; ``mcad.hub`` for the workers, ``mcad.hubdispatch`` for the decisions, mixed in here): the
  ledger holds every worker's nodes (names qualified "<worker>/<node>") and pods, and a gang fits when it packs
  onto one usable worker that its ``clusterScheduling`` allows; its objects go there, without ownerReferences,
  after a cleanup finalizer is on the AppWrapper; ``status.targetClusterName`` names the worker.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

import structlog

from mcad import apply, events, lifecycle, placement, quota, status
from mcad.api.appwrapper import (
    ACTIVE_STATES,
    FIELD_MANAGER,
    FINAL_STATES,
    KIND,
    WORKER_CLEANUP_FINALIZER,
    AppWrapperView,
    State,
)
from mcad.api.podgroups import PodGroup
from mcad.api.resources import ResourceVector, format_amount
from mcad.api.statusview import StatusView
from mcad.api.views import NodeView, PodView
from mcad.clock import Clock, RealClock
from mcad.clusters import Policy as ClusterPolicy
from mcad.errors import ApiError
from mcad.fit import Fit
from mcad.hub import Hub
from mcad.hubdispatch import Cleaned, HubMode
from mcad.informer import Informer, Store
from mcad.ledger import Ledger
from mcad.metrics import Metrics, base_units
from mcad.pending import PendingQueue
from mcad.retry import Backoff, FailureKind, Policy, classify
from mcad.statussync import StatusSync, StatusWritten
from mcad.workqueue import WorkQueue
from mcad.wrapped import WrappedObjects
from mcad.writes import Writes

Key = tuple[str, str]
DISPATCH: Key = ("dispatch", "")
# Work handed to the dispatcher thread by other threads (``Dispatcher.call``): reads of its state for /debug.
CALL: Key = ("call", "")
# A QuotaSubtree changed: rebuild the forest. QUOTA_STATUS: write the QuotaSubtrees' status (coalesced).
QUOTA: Key = ("quota", "")
QUOTA_STATUS: Key = ("quota-status", "")
QUOTA_STATUS_WINDOW_SECONDS = 2.0
# The API server answers again after failing (an informer's Reconnects group says so): retry waiting writes now.
RECOVERED: Key = ("recovered", "")
R = TypeVar("R")
# Strict FIFO: what the AppWrappers behind a blocked head say. It does not name the head, so a new head does not
# mean rewriting the status of every AppWrapper behind it.
BEHIND_STRICT_FIFO = "waiting behind earlier AppWrappers (strict FIFO)"
# Pod counts in a dispatched AppWrapper's status are written at most once per this window, in the writers' low
# priority lane: a gang's pods move through Pending and Running within moments, one write for all of it is enough,
# and API server capacity is better spent creating the next gang.
POD_COUNT_WINDOW_SECONDS = 5.0
# How a queued AppWrapper is judged to fit: "nodes" packs its pods onto the nodes' free room (first-fit
# decreasing; taints, nodeSelector, affinity), "aggregate" compares its total demand with the cluster's free total.
FIT_MODES = ("nodes", "aggregate")
# Retrying failed writes (mcad.retry). Object writes: per AppWrapper 0.5 s doubling to 5 s, so a fault of 20 s
# costs each AppWrapper about ten attempts and it runs within 5 s of the fault's end; at most 10 retries a second
# in all; failing TRANSIENT-ly for 5 minutes (and 10 attempts) fails the AppWrapper. Status writes: 0.25 s doubling
# to 4 s, so a status is right within 4 s of a fault's end, at most 50 a second in all; giving up only stops the
# timer (the next event of the AppWrapper writes again).
DISPATCH_RETRY = Policy(base=0.5, cap=5.0, rate=10.0, burst=100, give_up_attempts=10, give_up_seconds=300.0)
STATUS_RETRY = Policy(base=0.25, cap=4.0, rate=50.0, burst=500, give_up_attempts=20, give_up_seconds=300.0)
# A preemptor waits this long for its victims' pods to go before it force-deletes those whose grace period is
# over and stops holding the queue (a pod finalizer or a process ignoring SIGTERM would hold it for ever).
DEFAULT_VICTIM_TIMEOUT_SECONDS = 300.0
# Decisions (metrics) and the Event reason each is told with.
_EVENT_REASONS = {"dispatched": events.DISPATCHED, "queued": events.QUEUED, "preempted": events.PREEMPTED,
                  "requeued": events.REQUEUED, "completed": events.COMPLETED, "failed": events.FAILED}
log = structlog.get_logger("mcad.dispatcher")


class Writer(apply.ObjectWriter, Protocol):
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
class _Dispatched:
    """Outcome of a dispatch job: the objects were applied (``error`` None), or not and what was applied is undone.
    ``status`` is the Dispatched status to write once they are."""

    aw: AppWrapperView
    status: Mapping[str, Any]
    uids: tuple[str, ...] = ()
    error: apply.DispatchFailed | None = None
    # The AppWrapper read for its templates is not the one decided about (another generation or uid, or gone):
    # nothing was applied; it is decided about again.
    stale: bool = False


@dataclass(slots=True)
class _Planned:
    """Pods of one shape planned on one node and not bound yet (``count`` goes down as they bind)."""

    node: str
    requests: ResourceVector
    count: int


@dataclass(frozen=True, slots=True)
class Assessment:
    """What a dispatch cycle would do now with one queued AppWrapper (``Dispatcher.assess_queue``)."""

    key: str
    state: str  # Queued, Draining (requeued; its old pods are still there), Preempting (waiting for victims)
    fits_now: bool
    why: str


def _quantities(vector: ResourceVector, resources: Iterable[str]) -> dict[str, str]:
    return {name: format_amount(name, vector.get(name)) for name in sorted(resources)}


def _take(room: dict[str, ResourceVector], plan: Iterable[tuple[str, ResourceVector, int]]) -> None:
    for node, requests, count in plan:
        if node in room:
            room[node] = room[node] - requests.scale(count)


def _placement_facts(node: NodeView) -> tuple[Any, ...]:
    """What fit decisions read of a node (heartbeats change none of it)."""
    return (node.allocatable, node.schedulable, node.ready, node.unschedulable, node.taints, dict(node.labels))


@functools.lru_cache(maxsize=1024)
def _one_copy(written: tuple[frozenset[str], int]) -> tuple[frozenset[str], int]:
    """The kept copy of a (what blocks it, its place) equal to this one: thousands of waiting AppWrappers remember
    it, and it takes few values (places past 10 are powers of two)."""
    return written


def protected_namespace_message(namespace: str) -> str:
    return (f"namespace {namespace} is protected: mcad creates nothing there unless the controller runs with "
            f"--allow-protected-namespace={namespace}")


def short_resources(demand: ResourceVector, free: ResourceVector) -> frozenset[str]:
    return frozenset(demand.shortfall(free).keys())


def describe_shortfall(demand: ResourceVector, free: ResourceVector, capacity: ResourceVector) -> str:
    """'short of cpu 2 (needs 4, 2 free)', per short resource; notes a demand larger than the whole cluster."""
    short = demand.shortfall(free)
    parts = []
    for name, amount in sorted(short.items()):
        need, have = format_amount(name, demand.get(name)), format_amount(name, max(free.get(name), 0))
        parts.append(f"{name} {format_amount(name, amount)} (needs {need}, {have} free)")
    why = "short of " + ", ".join(parts)
    if not demand.fits_in(capacity):
        why += "; more than the whole cluster has"
    return why


class Dispatcher(HubMode):
    def __init__(self, *, appwrappers: Store[AppWrapperView], nodes: Informer[NodeView],
                 pods: Informer[PodView], writer: Writer, queue: WorkQueue[Key] | None = None,
                 clock: Clock | None = None, strict_fifo: bool = False, write_workers: int = 32,
                 wrapped: WrappedObjects | None = None, preemption: bool = False, fit: str = "nodes",
                 metrics: Metrics | None = None, recorder: events.EventSink | None = None,
                 quota_subtrees: Store[quota.SubtreeView] | None = None, hub: Hub | None = None,
                 cluster_policy: ClusterPolicy | None = None,
                 victim_timeout: float = DEFAULT_VICTIM_TIMEOUT_SECONDS,
                 protected_namespaces: frozenset[str] = frozenset()) -> None:
        if fit not in FIT_MODES:
            raise ValueError(f"fit must be one of {', '.join(FIT_MODES)}, not {fit!r}")
        if hub is not None and fit != "nodes":
            raise ValueError("hub mode places pods on a worker's nodes: fit must be 'nodes'")
        self.appwrappers = appwrappers
        self.nodes = nodes
        self.pods = pods
        self.writer = writer
        self.queue: WorkQueue[Key] = queue if queue is not None else WorkQueue(name="dispatcher")
        self.clock = clock if clock is not None else RealClock()
        self.strict_fifo = strict_fifo
        self.preemption = preemption
        self.fit = fit
        self.metrics = metrics if metrics is not None else Metrics()
        self.recorder: events.EventSink = recorder if recorder is not None else events.DiscardEvents()
        # Quota trees: None when not served (no QuotaSubtree CRD, or --no-quota); then nothing is charged.
        self.quota_subtrees = quota_subtrees
        self.quota: quota.QuotaLedger | None = quota.QuotaLedger() if quota_subtrees is not None else None
        self._quota_written: dict[str, Mapping[str, Any]] = {}
        # (tree, node, resource, limit, used, borrowed) rows for metrics, replaced whole when quota status is written
        self.quota_samples: tuple[tuple[str, str, str, float, float, float], ...] = ()
        # Set once the ledger is rebuilt from synced informers: from then on decisions (and /debug reads) are valid.
        self.running = threading.Event()
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        # --fit=nodes: where each dispatched AppWrapper's pods were planned to go, as [node, pod requests, pods not
        # bound yet] entries, and their sum per node; a pod that binds takes its entry down, so a cycle reads the
        # planned room per node without looking at the plans (their number grows with a slow scheduler).
        self._plans: dict[str, list[_Planned]] = {}
        self._planned: dict[str, ResourceVector] = {}
        # Objects of wrapped kinds, watched for completion; None: completion is not watched (tests of other parts).
        self.wrapped = wrapped
        self.ledger = Ledger()
        self.writes = Writes(self.queue, workers=write_workers)
        # The status the loop decided for each AppWrapper, written until it lands (see mcad.statussync).
        self.statuses = StatusSync(writer, self.writes, self.queue, Backoff(self.clock, STATUS_RETRY), self.clock)
        # Failed dispatches: each AppWrapper's backoff, and when it may be tried again (the cycle passes it by until
        # then; a DISPATCH is due at that time).
        self._dispatch_retries = Backoff(self.clock, DISPATCH_RETRY)
        self._retry_at: dict[str, float] = {}
        # Dispatches whose writes are under way: reserved in the ledger, neither queued nor dispatched yet.
        self._inflight: dict[str, AppWrapperView] = {}
        self.cycles = 0
        self.pending = PendingQueue()
        # Queued AppWrappers that have no Backoff status yet: announced after the next cycle.
        self._unannounced: set[str] = set()
        self._pod_owner: dict[str, str] = {}
        self._pods_by_appwrapper: dict[str, dict[str, str]] = {}
        # The last view of each dispatched AppWrapper: once it is deleted, its items say what to clean up.
        self._dispatched: dict[str, AppWrapperView] = {}
        # uids of the objects applied for each dispatched AppWrapper (unknown after a restart): one request each
        # to delete them, instead of a read to check their owner first.
        self._object_uids: dict[str, tuple[str, ...]] = {}
        # Per waiting AppWrapper: what its last Backoff message was about (the short resources, its place).
        # Per pending group: what blocked its head when the group's members were last brought up to date.
        self._backoff_written: dict[str, tuple[frozenset[str], int]] = {}
        self._group_about: dict[Any, frozenset[str]] = {}
        # Dispatched AppWrappers whose lifecycle timers (minAvailable check, dispatch deadline) are set.
        self._timed: set[str] = set()
        # Dispatched AppWrappers whose minAvailable was met at the check: nothing more to check.
        self._min_available_met: set[str] = set()
        # Priority preemption: preemptor -> the victims it waits for (their pods are going away), and since when.
        self._preempting: dict[str, frozenset[str]] = {}
        self._preempting_since: dict[str, float] = {}
        self.victim_timeout = victim_timeout
        # Namespaces where nothing is created (kube-system, the controller's own): an AppWrapper there fails at
        # once, whatever admission let through.
        self.protected_namespaces = protected_namespaces
        # Preemptors that stopped waiting for victims that did not go in time (the victims, and the uids of their
        # pods still there): they preempt nobody else until those pods are gone (else each timeout would evict
        # another round of victims).
        self._abandoned: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        # Quota reclaim: reclaimer -> its charges (while its victims go, nobody else may borrow in those trees).
        self._reclaiming: dict[str, quota.Charges] = {}
        self.preemptions = 0
        self._init_hub(hub, cluster_policy)
        appwrappers.add_handler(lambda _t, old, new: self.queue.add(("aw", (new or old).key)))  # type: ignore[union-attr]
        nodes.add_handler(lambda _t, old, new: self.queue.add(("node", (new or old).name)))  # type: ignore[union-attr]
        pods.add_handler(lambda _t, old, new: self.queue.add(("pod", (new or old).uid)))  # type: ignore[union-attr]
        if quota_subtrees is not None:
            quota_subtrees.add_handler(lambda _t, _old, _new: self.queue.add(QUOTA))

    # ------------------------------------------------------------------------------------------ loop

    def run(self, stop: threading.Event) -> None:
        informers = (self.appwrappers, self.nodes, self.pods) + (
            (self.quota_subtrees,) if self.quota_subtrees is not None else ())
        while not all(i.has_synced() for i in informers):
            if stop.wait(0.05):
                return
        self.start()
        while not self.queue.shutting_down():
            self.process_next()
        self.writes.close()

    def start(self) -> None:
        """Once the informers have synced: rebuild the ledger and ask for the first cycle."""
        self.rebuild()
        self.running.set()
        if self.hub is not None:
            for name in self.hub.names:  # adopt every worker's state now, whatever the prober said before
                self.queue.add(("cluster", name))
            for name in set(self._placed.values()) - set(self.hub.names):
                # Removed from the configuration: treated as a worker that never comes back.
                log.warning("AppWrappers are placed in a worker cluster that is not configured; they are requeued "
                            "after unreachableTimeoutSeconds", cluster=name)
                self.queue.add_after(("cluster", name), self.hub.config.unreachable_timeout_seconds)
        self.queue.add(DISPATCH)
        log.info("dispatcher started", appwrappers=len(self.appwrappers), nodes=len(self.nodes),
                 pods=len(self.pods), capacity=self.ledger.capacity().format(), free=self.ledger.free().format())

    def process_next(self, timeout: float | None = None) -> Key | None:
        """Take one key (waiting up to ``timeout``), process it and settle its retry state; None if none came."""
        key, _ = self.queue.get(timeout)
        if key is None:
            return None
        try:
            self.process(key)
            # Hub mode's AppWrapper and cleanup keys fail through their background writes, reported on another
            # key: their failure counts are reset when a write of theirs succeeds, so their backoff grows.
            if key[0] not in ("aw", "cleanup"):
                self.queue.forget(key)
        except Exception:
            log.exception("processing failed; retrying with backoff", key=f"{key[0]}:{key[1]}")
            self.queue.add_rate_limited(key)
        finally:
            self.queue.done(key)
        return key

    def process(self, key: Key) -> None:
        kind, name = key
        if kind == "pod":
            self._sync_pod(name)
        elif kind == "node":
            self._sync_node(name)
        elif kind == "aw":
            self._sync_appwrapper(name)
        elif kind == "written":
            self._collect(name)
        elif kind == "status":
            self.statuses.retry(name)
        elif kind == "retry":
            self._retry_due(name)
        elif kind == "recovered":
            self._api_recovered()
        elif kind == "requeue":
            self._check_min_available(name)
        elif kind == "deadline":
            self._check_deadline(name)
        elif kind == "call":
            self._run_calls()
        elif kind == "quota":
            self._sync_quota()
        elif kind == "quota-status":
            self._write_quota_status()
        elif kind == "cluster":
            self._sync_cluster(name)
        elif kind == "cleanup":
            self._clean_leftovers(name)
        elif kind == "counts":
            aw = self.appwrappers.get(name)
            if aw is not None and not self._is_queued(aw) and self._state(aw) not in FINAL_STATES:
                self._update_pod_counts(aw)
        else:
            self._dispatch_cycle()

    def call(self, fn: Callable[[], R], timeout: float) -> R:
        """Run ``fn`` on the dispatcher thread, the only one that may read its state, and return its result.
        Raises ``TimeoutError`` when the loop does not get to it in time (it is busy, or not running)."""
        future: Future[R] = Future()
        self._calls.append((fn, future))
        self.queue.add(CALL)
        return future.result(timeout)

    def _run_calls(self) -> None:
        while self._calls:
            fn, future = self._calls.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as err:  # the caller gets it; the loop goes on
                future.set_exception(err)

    def queue_lengths(self) -> dict[str, int]:
        """For metrics, from any thread: lengths of containers only this thread changes (len() is atomic)."""
        return {"queued": len(self.pending), "dispatching": len(self._inflight), "preempting": len(self._preempting)}

    def rebuild(self) -> None:
        """Ledger from the synced stores: nodes, pods, and the reservations of dispatched AppWrappers."""
        if self.hub is not None:
            # Before the pods: a pod counts for its AppWrapper only in the worker the AppWrapper is placed in.
            for aw in self.appwrappers.list():
                if aw.target_cluster:
                    self._placed[aw.key] = aw.target_cluster
        for node in self.nodes.list():
            self.ledger.upsert_node(node)
        for pod in self.pods.list():
            self._track_pod(pod)
        if self.quota is not None and self.quota_subtrees is not None:
            self.quota.set_forest(quota.Forest.build(self.quota_subtrees.list()))
        for aw in self.appwrappers.list():
            if self._status(aw).canrun and self._state(aw) in ACTIVE_STATES:
                self._reserve(aw)
            elif self._is_queued(aw) and aw.namespace not in self.protected_namespaces:
                self._enqueue(aw)  # a protected one is failed by its sync, never queued
        if self.fit == "nodes":
            self._replan_after_restart()

    def _replan_after_restart(self) -> None:
        """Plans of dispatched AppWrappers whose pods are not all bound yet: their unbound pods, placed again on
        the room left (where the scheduler will put them is not known; this keeps their room from being promised
        twice)."""
        room = self._room()
        for key in self.ledger.reserved_keys():
            aw = self.appwrappers.get(key)
            if aw is None or not self.ledger.reservation(key):
                continue
            bound: dict[ResourceVector, int] = {}
            for uid in self._pods_by_appwrapper.get(key, {}):
                pod = self.ledger.pod(uid)
                if pod is not None and (pod.node_name or pod.terminal):
                    bound[pod.requests] = bound.get(pod.requests, 0) + 1
            groups = []
            for group in self.gang(aw):
                done = min(bound.get(group.requests, 0), group.count)
                bound[group.requests] = bound.get(group.requests, 0) - done
                if group.count > done:
                    groups.append(dataclasses.replace(group, count=group.count - done))
            nodes = self.ledger.nodes() if self.hub is None else self.nodes_in(self._placed.get(key, ""))
            packing = placement.pack(groups, nodes, room)
            if packing.fits:
                self._plan_add(key, packing.placement)
                _take(room, packing.placement)

    # ------------------------------------------------------------------------------------------ reads (/debug)

    def assess_queue(self) -> list[Assessment]:
        """Every queued AppWrapper in dispatch order with what a cycle would do with it now, deciding nothing:
        the same fit checks as ``_dispatch_cycle`` on a copy of the free room. Dispatcher thread only.
        One fit check per demand group (a group blocked once stays blocked), as in a cycle."""
        real_quota = self.quota
        if real_quota is not None:
            self.quota = real_quota.copy()  # what would be dispatched is charged on a scratch copy
        try:
            return self._assess(self.ledger.free(), self.ledger.capacity(),
                                self._room() if self.fit == "nodes" else None)
        finally:
            self.quota = real_quota

    def _assess(self, free: ResourceVector, capacity: ResourceVector,
                room: dict[str, ResourceVector] | None) -> list[Assessment]:
        blocked: dict[Any, str] = {}
        held = ""  # why everything behind a blocked head waits (strict FIFO, or a waiting preemptor)
        out = []
        for key in self.pending.ordered():
            aw = self.appwrappers.get(key)
            entry = self.pending.entry(key)
            if aw is None or entry is None:
                continue
            group = entry[1]
            if key in self._preempting:
                victims = ", ".join(sorted(self._preempting[key]))
                out.append(Assessment(key, "Preempting", False,
                                      f"waiting for lower-priority AppWrappers it preempted to leave: {victims}"))
                held = held or f"held behind {key}, which is preempting to make room"
            elif self._draining(aw):
                out.append(Assessment(key, "Draining", False,
                                      "requeued; waiting for the pods of its previous dispatch to go"))
            elif held:
                out.append(Assessment(key, "Queued", False, held))
            elif group in blocked:
                out.append(Assessment(key, "Queued", False, blocked[group]))
            else:
                need = (aw.demand - self.ledger.consumed(key)).clamp()
                fit = self._fits(aw, need, free, capacity, room)
                reclaimed = self._blocked_by_reclaim(aw) if fit.fits else ""
                if reclaimed:
                    out.append(Assessment(key, "Queued", False, reclaimed))
                elif fit.fits:
                    free = free - need
                    if room is not None:
                        _take(room, fit.plan)
                    if self.quota is not None:
                        self.quota.charge(key, aw.labels, aw.demand)
                    out.append(Assessment(key, "Queued", True, "fits now: the next dispatch cycle dispatches it"))
                else:
                    blocked[group] = fit.why()
                    out.append(Assessment(key, "Queued", False, blocked[group]))
                    if self.strict_fifo:
                        held = BEHIND_STRICT_FIFO
        return out

    def status_of(self, aw: AppWrapperView) -> StatusView:
        """Its status as this controller knows it: the last one written, else the last one seen."""
        return self._status(aw)

    def pod_phases(self, key: str) -> list[str]:
        return self._phases(key)

    def dispatching(self, key: str) -> bool:
        """Its dispatch writes are under way."""
        return key in self._inflight

    def placed_counts(self) -> dict[str, int]:
        """Hub mode, from any thread: AppWrappers whose objects are in each worker."""
        counts: dict[str, int] = {}
        for cluster in list(self._placed.values()):  # one C-level copy: safe against the dispatcher thread
            counts[cluster] = counts.get(cluster, 0) + 1
        return counts

    def usable_clusters(self) -> frozenset[str]:
        """Hub mode: the workers placement uses now (adopted on this thread). Dispatcher thread only."""
        return frozenset(self._usable)

    def placed(self) -> dict[str, str]:
        """Hub mode: AppWrapper key -> the worker its objects are in. Dispatcher thread only."""
        return dict(self._placed)

    def planned_by_node(self) -> dict[str, ResourceVector]:
        """--fit=nodes: room held per node for dispatched pods that are not bound yet."""
        return dict(self._planned)

    # ------------------------------------------------------------------------------------------ quota trees

    def _sync_quota(self) -> None:
        """A QuotaSubtree changed: rebuild the forest, re-derive every charge, and look at the queue again (queued
        AppWrappers may be charged elsewhere now: a default node appeared, a tree went away)."""
        if self.quota is None or self.quota_subtrees is None or not self.running.is_set():
            return
        self.quota.set_forest(quota.Forest.build(self.quota_subtrees.list()))
        for key in list(self.pending.ordered()):
            aw = self.appwrappers.get(key)
            if aw is not None:
                self._enqueue(aw)
        self._group_about.clear()
        self.queue.add(DISPATCH)
        self.queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)

    def _write_quota_status(self) -> None:
        """Each QuotaSubtree's status: what its nodes have allocated (their usage), and the total; written only
        when it changed. Also refreshes the rows metrics read."""
        if self.quota is None or self.quota_subtrees is None:
            return
        samples = []
        for tree_name, tree in sorted(self.quota.forest.trees.items()):
            for node_name in tree.ordered():
                node = tree.nodes[node_name]
                used, borrowed = self.quota.usage(tree_name, node_name), self.quota.borrowed(tree_name, node_name)
                for resource in sorted(tree.resources):
                    samples.append((tree_name, node_name, resource, base_units(resource, node.limit.get(resource)),
                                    base_units(resource, used.get(resource)),
                                    base_units(resource, borrowed.get(resource))))
        self.quota_samples = tuple(samples)
        for view in self.quota_subtrees.list():
            own_tree = self.quota.forest.trees.get(view.tree)
            if own_tree is None:
                continue
            limited = own_tree.resources
            children, total = [], ResourceVector()
            for node in view.nodes:
                if own_tree.nodes.get(node.name) is not node:
                    continue  # a definition the tree ignored (see its errors)
                used = self.quota.usage(view.tree, node.name)
                total = total + used
                children.append({"name": node.name, "allocated": {"requests": _quantities(used, limited)}})
            new = {"totalAllocation": {"requests": _quantities(total, limited)}, "children": children}
            if new == self._quota_written.get(view.key) or new == {k: view.status.get(k) for k in new}:
                continue
            self._quota_written[view.key] = new
            self.writes.submit(f"quota:{view.key}", partial(self._apply_quota_status, view, new), tenant=view.namespace,
                               urgent=False)

    def _apply_quota_status(self, view: quota.SubtreeView, new: Mapping[str, Any]) -> None:
        try:
            self.writer.apply_status(view.api_version, quota.KIND, view.namespace, view.name, new,
                                     field_manager=FIELD_MANAGER)
        except ApiError as err:
            if err.status != 404:
                log.warning("quota status write refused", subtree=view.key, status_code=err.status,
                            reason=err.message)

    def _capacity_may_have_grown(self) -> None:
        if self.pending:
            self.queue.add(DISPATCH)

    # ------------------------------------------------------------------------------------------ events

    def _track_pod(self, pod: PodView) -> None:
        if self.hub is not None and pod.appwrapper and self._placed.get(pod.appwrapper) != pod.cluster:
            pod = self._stray_pod(pod)
        if pod.appwrapper and pod.appwrapper in self._plans and (pod.node_name or pod.terminal):
            before = self.ledger.pod(pod.uid)
            if before is None or not (before.node_name or before.terminal):
                self._plan_pod_bound(pod.appwrapper, pod)
        self.ledger.upsert_pod(pod)
        owner = self._pod_owner.get(pod.uid)
        if owner and owner != pod.appwrapper:
            self._untrack_pod(owner, pod.uid)
        if pod.appwrapper:
            self._pod_owner[pod.uid] = pod.appwrapper
            self._pods_by_appwrapper.setdefault(pod.appwrapper, {})[pod.uid] = pod.phase

    def _untrack_pod(self, owner: str, uid: str) -> None:
        pods = self._pods_by_appwrapper.get(owner)
        if pods is not None:
            pods.pop(uid, None)
            if not pods:
                del self._pods_by_appwrapper[owner]  # deleted AppWrappers must not leave an entry each behind

    def _sync_pod(self, uid: str) -> None:
        pod = self.pods.get(uid)
        owner = self._pod_owner.get(uid)
        if pod is None:
            self.ledger.delete_pod(uid)
            self._pod_owner.pop(uid, None)
            if owner:
                self._untrack_pod(owner, uid)
                self.queue.add(("aw", owner))
            self._capacity_may_have_grown()
            return
        self._track_pod(pod)
        if pod.appwrapper:
            self.queue.add(("aw", pod.appwrapper))
            if pod.appwrapper in self.pending:
                queued = self.appwrappers.get(pod.appwrapper)
                if queued is not None:
                    self._enqueue(queued)  # its own pods now count: it may need its own group
        if pod.terminal or pod.deleting:
            self._capacity_may_have_grown()

    def _sync_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            self.ledger.delete_node(name)
            return
        before = self.ledger.node(name)
        self.ledger.upsert_node(node)
        # Status heartbeats change nothing we count; only new or changed capacity deserves a cycle.
        if before is None or _placement_facts(before) != _placement_facts(node):
            self._capacity_may_have_grown()

    def _status(self, aw: AppWrapperView) -> StatusView:
        """What the loop decided last for ``aw``: its own decision until the informer shows it landed (our writes
        may not be back from the watch yet, or may be failing), then the informer's status."""
        intent = self.statuses.intent(aw)
        return intent if intent is not None else aw.status

    def _state(self, aw: AppWrapperView) -> str:
        return self._status(aw).state

    def _is_queued(self, aw: AppWrapperView) -> bool:
        if aw.key in self._inflight:
            return False
        current = self._status(aw)
        return not aw.deleting and not current.canrun and current.state in (State.NEW, State.PENDING)

    def _sync_appwrapper(self, key: str) -> None:
        aw = self.appwrappers.get(key)
        if (aw is None or aw.deleting) and (key in self.pending or key in self._preempting):
            # One that waited in the queue may have held others back (strict FIFO, a preemptor): look again.
            self.queue.add(DISPATCH)
        if self.hub is not None and aw is not None and aw.deleting:
            self._forget(key)
            self._clean_up_deleted(aw)
            return
        if aw is None or aw.deleting:
            if aw is not None and WORKER_CLEANUP_FINALIZER in aw.finalizers and ("", key) not in self._cleanups:
                # Dispatched by a hub earlier: without worker connections its objects there cannot be deleted,
                # but the AppWrapper must not be stuck deleting for ever.
                log.warning("hub mode is off: the objects this AppWrapper may have in a worker cluster are not "
                            "deleted", appwrapper=key, cluster=aw.target_cluster or "unknown")
                self._remove_finalizer(aw)
            gone = self._dispatched.pop(key, None)
            if gone is not None and self.hub is None:
                self._delete_wrapped(gone, self._object_uids.get(key, ()))
            self._forget(key)
            self._placed.pop(key, None)
            return
        if key in self._inflight:
            return  # its dispatch writes are under way; their outcome decides
        previous = self._dispatched.get(key)
        if previous is not None and previous.uid != aw.uid:
            # Deleted and re-created under the same name while we were not looking: clean up the old one.
            del self._dispatched[key]
            self._delete_wrapped(previous, self._object_uids.get(key, ()))
            self._forget(key)
        # Drops a decision the informer now shows, and re-drives a status write that failed (this event may be
        # its pods or objects changing, long after the write gave up).
        self.statuses.observed(aw)
        if self._is_queued(aw):
            if aw.demand_error:
                self.pending.remove(key)
                self._fail(aw, status.INVALID_SPEC, aw.demand_error)
            elif aw.namespace in self.protected_namespaces:
                self.pending.remove(key)
                self._fail(aw, status.PROTECTED_NAMESPACE, protected_namespace_message(aw.namespace))
            elif self._enqueue(aw):
                # New arrivals and changed ones need a decision; our own status writes coming back do not.
                self.queue.add(DISPATCH)
            return
        self.pending.remove(key)
        state = self._state(aw)
        if state in FINAL_STATES:
            if self.ledger.is_reserved(key):
                self._release(key)
                self._capacity_may_have_grown()
            return
        if not self.ledger.is_reserved(key):
            self._reserve(aw)
        self._dispatched[key] = aw
        self.queue.add_after(("counts", key), POD_COUNT_WINDOW_SECONDS)
        self._follow_lifecycle(aw)

    # ------------------------------------------------------------------------------------------ lifecycle

    def _phases(self, key: str) -> list[str]:
        return list(self._pods_by_appwrapper.get(key, {}).values())

    def _follow_lifecycle(self, aw: AppWrapperView) -> None:
        """A dispatched AppWrapper: set its timers once, and act on what its wrapped objects and pods say."""
        key = aw.key
        if key not in self._timed:
            self._timed.add(key)
            current = self._status(aw)
            now = self.clock.now()
            spec = aw.scheduling
            if spec.min_available > 0 and key not in self._min_available_met:
                due = lifecycle.requeue_due(spec, current)
                self.queue.add_after(("requeue", key), lifecycle.seconds_until(due, now) if due
                                     else lifecycle.current_requeue_wait(spec, current))
            if spec.dispatch_limit_seconds > 0:
                due = lifecycle.deadline_due(spec, current)
                self.queue.add_after(("deadline", key), lifecycle.seconds_until(due, now) if due
                                     else spec.dispatch_limit_seconds)
        wrapped = self._wrapped_of(key)
        if wrapped is None:
            return
        phases = self._phases(key)
        jobs = "Failed" in phases
        kinds = lifecycle.watched_kinds(aw, jobs=jobs)
        if not kinds:
            return
        if not all([wrapped.ensure(api_version, kind) for api_version, kind in kinds]):
            # A kind's informer is still listing: look again shortly (its events will also bring us back).
            self.queue.add_after(("aw", key), 0.2)
            return
        active = sum(1 for phase in phases if phase not in ("Succeeded", "Failed"))
        expects_pods = any(group.count > 0 for group in self.gang(aw))
        verdict = lifecycle.evaluate(aw, wrapped.lookup, active,
                                     pods_pending_creation=expects_pods and not phases, jobs=jobs)
        current = self._status(aw)
        now = self.clock.now()
        if verdict.outcome is lifecycle.Outcome.FAILED:
            self._finish(aw, status.failed(current.raw(), now, priority=aw.priority, reason=verdict.reason,
                                           message=verdict.message))
            log.warning("appwrapper failed", appwrapper=key, reason=verdict.reason, message=verdict.message)
            self._note(aw, "failed", f"{verdict.reason}: {verdict.message}")
        elif verdict.outcome is lifecycle.Outcome.COMPLETED:
            self._finish(aw, status.completed(current.raw(), now))
            log.info("appwrapper completed", appwrapper=key)
            self._note(aw, "completed", "Every wrapped item reports completion and no pod is active; its "
                                        "resources are released.")
        elif verdict.outcome is lifecycle.Outcome.HOLD_COMPLETION and self._state(aw) != State.RUNNING_HOLD_COMPLETION:
            self._write_status(aw, status.hold_completion(current.raw(), now))

    def _finish(self, aw: AppWrapperView, new: Mapping[str, Any], *, stop: bool = False) -> None:
        """A final state: write it, release the reservation at once; ``stop`` also deletes the wrapped objects."""
        self._write_status(aw, new)
        if stop:
            self._delete_wrapped(aw, self._object_uids.get(aw.key, ()))
        self._undispatch(aw.key)

    def _undispatch(self, key: str) -> None:
        """It no longer holds capacity: drop its plan, timers and reservation (its pods count while they exist)."""
        self._dispatched.pop(key, None)
        self._plan_drop(key)
        self._timed.discard(key)
        self._min_available_met.discard(key)
        if self.ledger.is_reserved(key):
            self._release(key)
            self._capacity_may_have_grown()

    def _reserve(self, aw: AppWrapperView) -> None:
        """Its capacity in the ledger and, with quota trees, its charges."""
        self.ledger.reserve(aw.key, aw.demand)
        if self.quota is not None:
            self.quota.charge(aw.key, aw.labels, aw.demand)
            self.queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)

    def _release(self, key: str) -> None:
        self.ledger.release(key)
        if self.quota is not None and self.quota.is_charged(key):
            self.quota.release(key)
            self.queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)

    def _dispatched_now(self, key: str) -> AppWrapperView | None:
        aw = self.appwrappers.get(key)
        if aw is None or aw.deleting or key in self._inflight or self._is_queued(aw):
            return None
        return aw if self._state(aw) in ACTIVE_STATES else None

    def _check_min_available(self, key: str) -> None:
        aw = self._dispatched_now(key)
        if aw is None or aw.scheduling.min_available <= 0:
            return
        current = self._status(aw)
        now = self.clock.now()
        wait = lifecycle.current_requeue_wait(aw.scheduling, current)
        due = lifecycle.requeue_due(aw.scheduling, current)
        if due is not None and (remaining := lifecycle.seconds_until(due, now)) > 0:
            self.queue.add_after(("requeue", key), remaining)  # an earlier dispatch's timer
            return
        phases = self._phases(key)
        running, succeeded = phases.count("Running"), phases.count("Succeeded")
        minimum = aw.scheduling.min_available
        if running + succeeded >= minimum:
            self._min_available_met.add(key)
            return
        done = current.requeuings
        why = (f"Insufficient number of Running and Completed pods, minimum={minimum}, running={running}, "
               f"completed={succeeded}, {wait} s after dispatch.")
        limit = aw.scheduling.max_requeuings
        if limit > 0 and done >= limit:
            message = f"{why} Requeued {done} times already; maxNumRequeuings is {limit}."
            log.warning("appwrapper failed", appwrapper=key, reason=status.MAX_REQUEUINGS_REACHED, message=message)
            self._note(aw, "failed", f"{status.MAX_REQUEUINGS_REACHED}: {message}")
            self._finish(aw, status.failed(current.raw(), now, priority=aw.priority,
                                           reason=status.MAX_REQUEUINGS_REACHED,
                                           message=message, preempted=True), stop=True)
            return
        self._requeue(aw, status.MIN_PODS_NOT_RUNNING, why, requeuings=done + 1,
                      requeue_wait=lifecycle.requeue_wait(aw.scheduling, done + 1))

    def _check_deadline(self, key: str) -> None:
        aw = self._dispatched_now(key)
        limit = aw.scheduling.dispatch_limit_seconds if aw is not None else 0
        if aw is None or limit <= 0:
            return
        current = self._status(aw)
        now = self.clock.now()
        due = lifecycle.deadline_due(aw.scheduling, current)
        if due is not None and (remaining := lifecycle.seconds_until(due, now)) > 0:
            self.queue.add_after(("deadline", key), remaining)
            return
        message = f"Dispatch deadline exceeded: allowed to run for {limit} s (dispatchDuration.limit)."
        log.warning("appwrapper failed", appwrapper=key, reason=status.DISPATCH_DEADLINE_EXCEEDED)
        self._note(aw, "failed", f"{status.DISPATCH_DEADLINE_EXCEEDED}: {message}")
        self._finish(aw, status.failed(current.raw(), now, priority=aw.priority,
                                       reason=status.DISPATCH_DEADLINE_EXCEEDED,
                                       message=message, preempted=True), stop=True)

    def _requeue(self, aw: AppWrapperView, reason: str, message: str, *, requeuings: int, requeue_wait: int) -> None:
        """Take a dispatched AppWrapper back: delete its objects, queue it at its place; it stays out of the
        cycle (draining) until its old pods are gone, so they are not mistaken for its new ones."""
        key = aw.key
        log.info("appwrapper requeued", appwrapper=key, reason=reason, message=message, requeuings=requeuings)
        preempted = reason in (status.PREEMPTED_BY_PRIORITY, status.PREEMPTED_BY_QUOTA_RECLAIM)
        self._note(aw, "preempted" if preempted else "requeued", message)
        self._write_status(aw, status.requeued(self._status(aw).raw(), self.clock.now(), priority=aw.priority,
                                               reason=reason, message=message, requeuings=requeuings,
                                               requeue_wait=requeue_wait))
        self._delete_wrapped(aw, self._object_uids.pop(key, ()))
        self._undispatch(key)
        self._backoff_written.pop(key, None)
        if aw.demand_error:
            # Dispatched before its spec was refused (a bound added since): it is not dispatched again.
            self._fail(aw, status.INVALID_SPEC, aw.demand_error)
            return
        self._enqueue(aw)
        # Its Backoff tells of the requeue; once it waits like the rest, say what it waits for (see _announce).
        self._unannounced.add(key)
        self.queue.add(DISPATCH)

    def _draining(self, aw: AppWrapperView) -> bool:
        # Requeued and not yet looked at again (its current Backoff is the requeue's): its old pods may remain.
        return aw.key in self._pods_by_appwrapper and self._status(aw).backoff == status.PREEMPTION_TRIGGERED

    def _enqueue(self, aw: AppWrapperView) -> bool:
        """Put ``aw`` in the pending queue, or move it; True if that changed its place or its group."""
        # An AppWrapper whose own pods exist already (see _dispatch_cycle) needs less than its group: keep it apart.
        group: Any
        if self.ledger.consumed(aw.key) or self._draining(aw):
            group = (aw.demand, aw.key)
        elif self.fit == "nodes":
            # Same total, different pods (one 8-GPU pod, eight 1-GPU pods) fit differently: not one group.
            group = (aw.demand, tuple((g.count, g.requests, g.node_selector, g.tolerations, g.required_affinity)
                                      for g in self.gang(aw)))
        else:
            group = aw.demand
        if self.quota is not None:
            # Charged elsewhere, judged elsewhere: a group's members must share their quota nodes too.
            group = (group, self.quota.forest.charges(aw.labels))
        if aw.held:
            # A held head would hold back its whole group; and once it is let go, the change of group is what
            # brings it a cycle.
            group = (group, aw.held)
        before = self.pending.entry(aw.key)
        if before is None and not self._status(aw).backoff:
            self._unannounced.add(aw.key)
        elif before is not None and before[1] != group:
            # A new group (its old pods went, its quota node changed): a cycle may only ever visit the group's
            # head, so its own Backoff is written at the end of the next cycle.
            self._unannounced.add(aw.key)
        self.pending.upsert(aw.key, aw.order(), aw.demand, group=group)
        return before != (aw.order(), group)

    def _forget(self, key: str) -> None:
        self._undispatch(key)
        self._preempting.pop(key, None)
        self._preempting_since.pop(key, None)
        self._abandoned.pop(key, None)
        self._reclaiming.pop(key, None)
        self.statuses.forget(key)
        self._dispatch_retries.forget(key)
        self._retry_at.pop(key, None)
        self._object_uids.pop(key, None)
        self._backoff_written.pop(key, None)
        self._unannounced.discard(key)
        self.pending.remove(key)

    def _update_pod_counts(self, aw: AppWrapperView) -> None:
        phases = self._phases(aw.key)
        current = self._status(aw).raw()
        new = status.with_pod_counts(current, self.clock.now(), pending=phases.count("Pending"),
                                     running=phases.count("Running"), succeeded=phases.count("Succeeded"),
                                     failed_=phases.count("Failed"), unschedulable=self._unschedulable_pods(aw.key))
        self._write_status(aw, new, urgent=False)

    def _unschedulable_pods(self, key: str) -> list[tuple[str, status.Unschedulable]]:
        """(name, the scheduler's verdict) of its Pending pods that no node could take."""
        out = []
        for uid, phase in self._pods_by_appwrapper.get(key, {}).items():
            pod = self.ledger.pod(uid) if phase == "Pending" else None
            if pod is not None and pod.unschedulable is not None:
                out.append((pod.name, pod.unschedulable))
        return out

    # ------------------------------------------------------------------------------------------ decisions

    def _dispatch_cycle(self) -> None:
        started = time.perf_counter()
        self.cycles += 1
        free = self.ledger.free()
        capacity = self.ledger.capacity()
        room = self._room() if self.fit == "nodes" else None
        cursor = self.pending.cycle()
        held_by = ""  # why the cycle stopped early, when a preemptor holds the queue
        done: list[str] = []
        waiting: list[tuple[AppWrapperView, frozenset[str], Callable[[], str]]] = []
        dispatched = 0
        while (candidate := cursor.next()) is not None:
            key, _ = candidate
            aw = self.appwrappers.get(key)
            if aw is None or not self._is_queued(aw):
                done.append(key)  # went away or was decided meanwhile; its own event tidies up the rest
                cursor.passed()
                continue
            # Its own pods can exist already (the controller stopped between creating its objects and
            # recording that): they are in use, so only the rest of the demand must fit.
            if self._draining(aw):
                cursor.blocked()  # its own group: it waits for the pods of its previous dispatch to go
                continue
            if self._in_retry_backoff(key):
                cursor.passed()  # its last dispatch failed: not before its backoff passes (its timer says when)
                continue
            need = (aw.demand - self.ledger.consumed(key)).clamp()
            fit = self._fits(aw, need, free, capacity, room)
            held = self._blocked_by_reclaim(aw) if fit.fits else ""
            if held:
                fit = Fit(False, frozenset({"reclaim"}), partial(str, held))
            if fit.fits:
                cursor.passed()
                self._dispatch(aw, fit.plan, fit.cluster)
                done.append(key)
                dispatched += 1
                free = free - need
                if room is not None:
                    _take(room, fit.plan)
                continue
            may_preempt = not self._victims_stuck(key)
            if self._waiting_for_victims(key) or (may_preempt and (
                    (not held and self._reclaim_for(aw, need, free, room))
                    or (self.preemption and self._preempt_for(aw, need, free, capacity, room)))):
                # Victims are going away for it: nothing behind it may take what they free.
                held_by = f"held behind {key}, which is preempting lower-priority AppWrappers to make room"
                cursor.stop()
                continue
            about, why = fit.about, fit.why
            if key in self._abandoned:
                gave_up = (f"its preemption victims did not finish terminating within {self.victim_timeout:g} s "
                           f"({', '.join(sorted(self._abandoned[key][0]))}), so it no longer holds the queue")
                about, why = about | {"victims stuck"}, partial(lambda w, g: f"{w()}; {g}", why, gave_up)
            if self.strict_fifo and not self._could_ever_fit(aw, need, capacity, room, fit):
                # It would hold everyone behind it for ever: let them pass, and say so.
                about = about | {"never fits"}
                why = partial(lambda w: f"{w()}; it cannot fit even the empty cluster, so it does not hold the "
                                        f"queue (strict FIFO)", why)
                waiting.append((aw, about, why))
                cursor.blocked()
                continue
            # Written after the cycle, once the dispatched ones have left the queue, so the position is right.
            waiting.append((aw, about, why))
            if self.strict_fifo:
                cursor.stop()
            else:
                cursor.blocked()
        for key in done:
            self.pending.remove(key)
        for aw, about, why in waiting:
            self._set_queued(aw, about, why)
            if not self.strict_fifo:
                self._refresh_group(aw, about, free, capacity, room)
        self._announce(free, capacity, room, held_by)
        self.metrics.cycle(time.perf_counter() - started)
        log.info("dispatch cycle", cycle=self.cycles, queued=len(self.pending), dispatched=dispatched,
                 visited=cursor.visited, free=free.format(),
                 duration_ms=round((time.perf_counter() - started) * 1000, 2))

    # ------------------------------------------------------------------------------------------ fit

    def gang(self, aw: AppWrapperView) -> tuple[PodGroup, ...]:
        """The pods ``aw`` will create (parsed with its spec)."""
        return aw.gang

    def _plan_add(self, key: str, plan: Iterable[tuple[str, ResourceVector, int]]) -> None:
        self._plan_drop(key)
        entries = [_Planned(node, requests, count) for node, requests, count in plan if count > 0]
        if not entries:
            return
        self._plans[key] = entries
        for entry in entries:
            self._planned[entry.node] = self._planned.get(entry.node, ResourceVector()) + \
                entry.requests.scale(entry.count)

    def _plan_drop(self, key: str) -> None:
        for entry in self._plans.pop(key, []):
            self._unplan(entry.node, entry.requests.scale(entry.count))

    def _unplan(self, node: str, amount: ResourceVector) -> None:
        left = self._planned.get(node, ResourceVector()) - amount
        if left:
            self._planned[node] = left
        else:
            self._planned.pop(node, None)

    def _plan_pod_bound(self, key: str, pod: PodView) -> None:
        """One pod of ``key`` is bound (or done): one planned pod fewer, of its shape and on its node if the plan
        has one there, else of its shape anywhere, else any (custompodresources may differ from the pods)."""
        live = [e for e in self._plans.get(key, []) if e.count > 0]
        entry = (next((e for e in live if e.node == pod.node_name and e.requests == pod.requests), None)
                 or next((e for e in live if e.requests == pod.requests), None)
                 or (live[0] if live else None))
        if entry is None:
            return
        entry.count -= 1
        self._unplan(entry.node, entry.requests)
        if all(e.count <= 0 for e in self._plans[key]):
            del self._plans[key]

    def _room(self) -> dict[str, ResourceVector]:
        """Per node: allocatable - its pods' requests - pods planned there by dispatches not yet bound.
        O(nodes): the planned sums are kept up to date pod by pod."""
        room = self.ledger.room_by_node()
        for node, planned in self._planned.items():
            if node in room:
                room[node] = room[node] - planned
        return room

    def _fits(self, aw: AppWrapperView, need: ResourceVector, free: ResourceVector, capacity: ResourceVector,
              room: dict[str, ResourceVector] | None) -> Fit:
        if aw.held:  # e.g. its priorityClassName names no PriorityClass (mcad.tenantstore): no room is enough
            return Fit(False, frozenset({"held"}), partial(str, aw.held))
        if self.quota is not None:
            # Quota before capacity: an AppWrapper over its quota waits on quota, whatever the cluster has free.
            charges, unknown = self.quota.forest.charges(aw.labels)
            if unknown:
                return Fit(False, frozenset({"quota: unknown node"}), partial(str, unknown))
            verdict = self.quota.check(charges, aw.demand)
            if not verdict.fits:
                return Fit(False, verdict.about, partial(str, verdict.why))
        if self.hub is not None and room is not None:
            fit = self._fits_somewhere(aw, need, room)
        elif room is None or self.ledger.consumed(aw.key):
            # Own pods that exist already (a restart between creating objects and recording it): only the aggregate
            # remainder can be judged, the nodes they run on are known to the ledger already.
            fit = Fit(True)
        else:
            packing = placement.pack(self.gang(aw), self.ledger.nodes(), room)
            if not packing.fits:
                return Fit(False, packing.about, partial(str, packing.why))
            fit = Fit(True, plan=packing.placement)
        # Pods that pack usually add up to the demand, but not when an item's custompodresources declare more
        # than its templates in one resource and less in another (the pods are the templates', the charge the
        # larger of each): the demand must fit the free total too.
        if fit.fits and not need.fits_in(free):
            return Fit(False, short_resources(need, free), partial(describe_shortfall, need, free, capacity))
        return fit

    def _footprint(self, key: str) -> list[tuple[str, ResourceVector, int]]:
        """What evicting a dispatched AppWrapper frees, by node: its active bound pods and (--fit=nodes) the
        unbound rest of its plan; ("", outstanding reservation, 1) stands for what is reserved but not placed."""
        freed: list[tuple[str, ResourceVector, int]] = []
        for uid in self._pods_by_appwrapper.get(key, {}):
            pod = self.ledger.pod(uid)
            if pod is not None and pod.node_name and not pod.terminal:
                freed.append((pod.node_name, pod.requests, 1))
        plan = self._plans.get(key)
        if plan is not None:
            freed.extend((e.node, e.requests, e.count) for e in plan if e.count > 0)
        elif self.ledger.reservation(key):
            freed.append(("", self.ledger.reservation(key), 1))
        return freed

    def _preempt_for(self, aw: AppWrapperView, need: ResourceVector, free: ResourceVector,
                     capacity: ResourceVector, room: dict[str, ResourceVector] | None) -> bool:
        """Priority preemption for a queued AppWrapper that does not fit. True while it waits for victims.

        Victims are dispatched AppWrappers of strictly lower priority, lowest priority and then most recently
        dispatched first; only as many as needed, and none at all unless evicting them makes it fit (with
        --fit=nodes: makes its pods pack onto the nodes). An AppWrapper that would not fit on the empty cluster
        never preempts. Strictly lower priority means a victim can never preempt its preemptor back: no loops.
        """
        key = aw.key
        if not self._could_ever_fit(aw, need, capacity, room):
            return False
        charges = self._charges(aw)

        def fits_without(victims: list[tuple[AppWrapperView, list[tuple[str, ResourceVector, int]]]]) -> bool:
            if not self._fits_without(aw, need, free, room, [footprint for _, footprint in victims]):
                return False
            if self.quota is None:
                return True
            trial = self.quota.copy()  # what they are charged goes back to the quota trees too
            for victim, _ in victims:
                trial.release(victim.key)
            return trial.check(charges, aw.demand).fits

        victims_taken = {v for victims in self._preempting.values() for v in victims}
        candidates = []
        for victim in self._dispatched.values():
            if (victim.priority >= aw.priority or victim.key in victims_taken or victim.key in self._inflight
                    or self._state(victim) not in ACTIVE_STATES):
                continue
            candidates.append((self._victim_rank(victim), victim))
        candidates.sort(key=lambda c: c[0])
        chosen: list[tuple[AppWrapperView, list[tuple[str, ResourceVector, int]]]] = []
        for _, victim in candidates:
            footprint = self._footprint(victim.key)
            if not footprint:
                continue
            chosen.append((victim, footprint))
            if fits_without(chosen):
                break
        else:
            return False
        # Fewest victims: drop any that are not needed, trying the most valuable (highest priority, oldest) first.
        for entry in reversed(chosen[:-1]):
            rest = [other for other in chosen if other is not entry]
            if fits_without(rest):
                chosen.remove(entry)
        message = f"Preempted by AppWrapper {key} (priority {aw.priority})."
        for victim, _ in chosen:
            current = self._status(victim)
            self._requeue(victim, status.PREEMPTED_BY_PRIORITY, message, requeuings=current.requeuings,
                          requeue_wait=current.requeue_wait)
        self.preemptions += len(chosen)
        names = sorted(victim.key for victim, _ in chosen)
        self._start_preempting(key, frozenset(names))
        log.info("preempting", appwrapper=key, priority=aw.priority, victims=names)
        why = f"preempting {len(names)} lower-priority AppWrapper(s) to make room: {', '.join(names)}"
        self._set_queued(aw, frozenset({"preempting"}), partial(str, why))
        return True

    def _could_ever_fit(self, aw: AppWrapperView, need: ResourceVector, capacity: ResourceVector,
                        room: dict[str, ResourceVector] | None, fit: Fit | None = None) -> bool:
        """Whether ``aw`` would fit with nothing else running: not if it is held (``AppWrapperView.held``), names a
        quota node that does not exist (``fit`` says so), is larger than the cluster's capacity, or (--fit=nodes)
        its pods pack onto no set of empty nodes it may use."""
        if aw.held or (fit is not None and "quota: unknown node" in fit.about):
            return False
        if room is None or self.ledger.consumed(aw.key) or not need.fits_in(capacity):
            return need.fits_in(capacity)
        return any(placement.pack(self.gang(aw), nodes, {}).fits  # {}: every node empty
                   for _, nodes in self._node_sets(aw))

    def _start_preempting(self, key: str, victims: frozenset[str]) -> None:
        """``key`` waits for ``victims`` to go, holding the queue, for at most ``victim_timeout`` seconds."""
        self._preempting[key] = victims
        self._preempting_since[key] = self.clock.monotonic()
        self.queue.add_after(DISPATCH, self.victim_timeout)  # looks again at the latest then, events or not

    def _victim_rank(self, victim: AppWrapperView) -> tuple[Any, ...]:
        """Preemption order, smallest first: lowest priority, then most recently dispatched (then created)."""
        since = lifecycle.dispatched_at(self._status(victim))
        created = lifecycle.parse_time(victim.created)
        return (victim.priority, -(since.timestamp() if since else 0.0),
                -(created.timestamp() if created else 0.0), victim.key)

    def _fits_without(self, aw: AppWrapperView, need: ResourceVector, free: ResourceVector,
                      room: dict[str, ResourceVector] | None,
                      footprints: Iterable[list[tuple[str, ResourceVector, int]]]) -> bool:
        """Whether ``aw`` would fit the cluster once the AppWrappers of these footprints are gone."""
        freed = ResourceVector()
        for footprint in footprints:
            for _, requests, count in footprint:
                freed = freed + requests.scale(count)
        if room is None or self.ledger.consumed(aw.key) or not need.fits_in(free + freed):
            return need.fits_in(free + freed)
        after = dict(room)
        for footprint in footprints:
            for node, requests, count in footprint:
                if node in after:
                    after[node] = after[node] + requests.scale(count)
        return any(placement.pack(self.gang(aw), nodes, after).fits for _, nodes in self._node_sets(aw))

    def _waiting_for_victims(self, key: str) -> bool:
        """It preempted (priority or quota reclaim) and its victims are still going away, for less than
        ``victim_timeout``; past that, ``_give_up_on_victims``."""
        waiting_for = self._preempting.get(key)
        if waiting_for is None:
            return False
        left = frozenset(v for v in waiting_for if v in self._dispatched or v in self._pods_by_appwrapper)
        if left and self.clock.monotonic() - self._preempting_since.get(key, 0.0) < self.victim_timeout:
            return True
        del self._preempting[key]  # the victims are gone and it still does not fit: look again
        self._preempting_since.pop(key, None)
        self._reclaiming.pop(key, None)
        if left:
            self._give_up_on_victims(key, left)
        return False

    def _give_up_on_victims(self, key: str, victims: frozenset[str]) -> None:
        """Its victims' pods did not go within ``victim_timeout`` (a finalizer, a process ignoring SIGTERM with a
        long grace period): force-delete those whose grace period is over, as the kubelet would have by now, and
        stop holding the queue. It preempts nobody else until these victims' pods are gone."""
        now = self.clock.now().timestamp()
        forced, stuck, remaining = [], [], set()
        for victim in sorted(victims):
            for uid in list(self._pods_by_appwrapper.get(victim, {})):
                pod = self.ledger.pod(uid)
                if pod is None or pod.terminal:
                    continue
                remaining.add(uid)
                if pod.deleting and 0 < pod.grace_ends <= now:
                    forced.append(f"{pod.namespace}/{pod.name}")
                    self.writes.submit(victim, partial(self._force_delete_pod, pod), tenant=pod.namespace)
                else:
                    stuck.append(f"{pod.namespace}/{pod.name}")
        self._abandoned[key] = (victims, frozenset(remaining))
        log.warning("preemption victims did not go in time; no longer holding the queue", appwrapper=key,
                    victims=sorted(victims), timeout_s=self.victim_timeout, force_deleted=forced, still_there=stuck)
        aw = self.appwrappers.get(key)
        if aw is not None:
            detail = f"force-deleted {len(forced)} pod(s) past their grace period" if forced else \
                "none of their pods is past its grace period"
            self._event(aw, events.QUEUED, f"Its preemption victims did not finish terminating within "
                                           f"{self.victim_timeout:g} s ({detail}); it no longer holds the queue.")

    def _force_delete_pod(self, pod: PodView) -> None:
        try:
            self.writer.force_delete_pod(pod.namespace, pod.name, pod.uid)
        except ApiError as err:
            if err.status not in (404, 409):
                log.warning("force deletion refused", pod=f"{pod.namespace}/{pod.name}", status_code=err.status,
                            reason=err.message)

    def _victims_stuck(self, key: str) -> bool:
        """It gave up waiting for victims whose pods are still there: preempting again would only add victims.
        Those very pods: a victim dispatched again later has new pods, which do not count."""
        abandoned = self._abandoned.get(key)
        if abandoned is None:
            return False
        if any(self.ledger.pod(uid) is not None for uid in abandoned[1]):
            return True
        del self._abandoned[key]
        return False

    def _charges(self, aw: AppWrapperView) -> quota.Charges:
        if self.quota is None:
            return ()
        return self.quota.forest.charges(aw.labels)[0]

    def _reclaim_for(self, aw: AppWrapperView, need: ResourceVector, free: ResourceVector,
                     room: dict[str, ResourceVector] | None) -> bool:
        """Quota reclaim for a queued AppWrapper that does not borrow at its own node but does not fit, because
        others borrowed quota above it or hold the cluster's capacity while borrowing: preempt borrowers (lowest
        priority, then most recently dispatched; only as many as needed). True when it reclaims."""
        if self.quota is None or aw.held:
            return False
        charges = self._charges(aw)
        # Cheap first: most blocked AppWrappers have nobody to reclaim from (no copy of the ledger per cycle).
        if not charges or not self.quota.borrowers(charges):
            return False
        taken = {v for victims in self._preempting.values() for v in victims}
        exclude = taken | set(self._inflight) | {k for k in self.quota.charged_keys() if k not in self._dispatched}

        def rank(k: str) -> tuple[Any, ...]:
            return self._victim_rank(self._dispatched[k])

        def capacity_after(_trial: quota.QuotaLedger, victims: list[str]) -> bool:
            return self._fits_without(aw, need, free, room, [self._footprint(v) for v in victims])

        victims = self.quota.reclaim_victims(charges, aw.demand, rank=rank, fits_after=capacity_after,
                                             exclude=exclude)
        if not victims:
            return False
        key = aw.key
        message = f"Preempted to give borrowed quota back to AppWrapper {key}."
        for victim_key in victims:
            victim = self._dispatched[victim_key]
            current = self._status(victim)
            self._requeue(victim, status.PREEMPTED_BY_QUOTA_RECLAIM, message, requeuings=current.requeuings,
                          requeue_wait=current.requeue_wait)
        self.preemptions += len(victims)
        self._start_preempting(key, frozenset(victims))
        self._reclaiming[key] = charges
        log.info("reclaiming quota", appwrapper=key, victims=victims)
        why = f"reclaiming quota borrowed by {len(victims)} AppWrapper(s): {', '.join(sorted(victims))}"
        self._set_queued(aw, frozenset({"reclaiming"}), partial(str, why))
        return True

    def _blocked_by_reclaim(self, aw: AppWrapperView) -> str:
        """While a reclaim waits for its victims, nobody may borrow in its trees again (the victims, requeued at
        their old places, would otherwise take the quota straight back)."""
        if not self._reclaiming or self.quota is None:
            return ""
        charges = self._charges(aw)
        trees = {tree for tree, _ in charges}
        for reclaimer, theirs in self._reclaiming.items():
            if reclaimer != aw.key and trees & {tree for tree, _ in theirs} and \
                    self.quota.borrows_at_own_node(charges, aw.demand):
                return f"it would borrow quota that {reclaimer} is reclaiming"
        return ""

    def _refresh_group(self, head: AppWrapperView, about: frozenset[str], free: ResourceVector,
                       capacity: ResourceVector, room: dict[str, ResourceVector] | None) -> None:
        """The rest of a blocked head's group is skipped by the cycle; when what blocks the head changes, what
        blocks them changed too: rewrite their Backoff once (O(group) per change, not per cycle), so no member
        keeps saying "not-ready taint" once the truth is "too little cpu"."""
        entry = self.pending.entry(head.key)
        if entry is None:
            return
        group = entry[1]
        previous = self._group_about.get(group)
        self._group_about[group] = about
        # First sight of the group (a new one, or after a restart): its members were announced one by one.
        if previous is None or previous == about:
            return
        for key in self.pending.members(group):
            member = self.appwrappers.get(key) if key != head.key else None
            if member is None or not self._is_queued(member) or self._draining(member) or key in self._preempting:
                continue
            fit = self._fits(member, (member.demand - self.ledger.consumed(key)).clamp(), free, capacity, room)
            if not fit.fits:
                self._set_queued(member, fit.about, fit.why)
        if len(self._group_about) > 2 * self.pending.group_count() + 16:
            self._group_about = {g: a for g, a in self._group_about.items() if self.pending.has_group(g)}

    def _announce(self, free: ResourceVector, capacity: ResourceVector,
                  room: dict[str, ResourceVector] | None, held_by: str = "") -> None:
        """First Backoff status of AppWrappers that arrived and still wait (the cycle may not have visited them:
        ``held_by`` says why, when a preemptor stopped it early)."""
        held = set()
        for key in self._unannounced:
            aw = self.appwrappers.get(key)
            if aw is None or key not in self.pending or key in self._backoff_written or key in self._preempting:
                continue
            if self._draining(aw):
                held.add(key)  # its requeue message stands until its old pods are gone
                continue
            if self.strict_fifo:
                self._set_queued(aw, frozenset({BEHIND_STRICT_FIFO}), partial(str, BEHIND_STRICT_FIFO))
                continue
            need = (aw.demand - self.ledger.consumed(key)).clamp()
            fit = self._fits(aw, need, free, capacity, room)
            if fit.fits:
                # It would fit, yet the cycle did not dispatch it: a preemptor holds the queue, or its last
                # dispatch failed and it waits out its backoff. Never an empty reason.
                why = held_by or ("waiting for the next dispatch cycle" if not self._in_retry_backoff(key)
                                  else "its last dispatch failed; retrying after its backoff")
                self._set_queued(aw, frozenset({why}), partial(str, why))
            else:
                self._set_queued(aw, fit.about, fit.why)
        self._unannounced = held

    def _set_queued(self, aw: AppWrapperView, about: frozenset[str], why: Callable[[], str]) -> None:
        """Write the Backoff status, unless the last one was about the same short resources and about the same
        place in the queue: exact for the first ten, then by powers of two, so that an AppWrapper moving up a long
        queue is rewritten O(log n) times in all, not once per dispatch ahead of it."""
        position = self.pending.position(aw.key)
        place = position if position <= 10 else 1 << (position.bit_length() - 1)
        if self._backoff_written.get(aw.key) == (about, place) and self._state(aw) == State.PENDING:
            return
        reason = why()
        message = f"{reason}; position {position} in the queue" if position else reason
        before = self._backoff_written.get(aw.key)
        if before is None:
            self.metrics.decision("queued")
        if before is None or before[0] != about:
            # An Event when what blocks it changes, not when its place does (that changes every cycle).
            self._event(aw, events.QUEUED, f"Waiting: {reason}.")
        self._write_status(aw, status.queued(self._status(aw).raw(), self.clock.now(), priority=aw.priority,
                                             why=message))
        self._backoff_written[aw.key] = _one_copy((about, place))

    def _dispatch(self, aw: AppWrapperView, plan: tuple[tuple[str, ResourceVector, int], ...] = (),
                  cluster: str = "") -> None:
        """Reserve now, write in the background: the objects, then the Dispatched status (see ``_collect``).
        Hub mode: first the cleanup finalizer on the AppWrapper (nothing may exist in a worker without it), and
        the objects go into ``cluster``."""
        self._reserve(aw)
        if self.hub is not None:
            self._placed[aw.key] = cluster
            # What a previous dispatch left there is overwritten now (and must not be deleted later).
            self._leftovers.get(cluster, {}).pop(aw.key, None)
        if plan:
            self._plan_add(aw.key, plan)
        self._inflight[aw.key] = aw
        self._preempting.pop(aw.key, None)
        if self._reclaiming.pop(aw.key, None) is not None:
            # Ones it held earlier in this cycle (they would have borrowed what it reclaimed) may go now.
            self.queue.add(DISPATCH)
        current = self._status(aw)
        wait = lifecycle.current_requeue_wait(aw.scheduling, current) if aw.scheduling.min_available > 0 else 0
        new = status.dispatched(current.raw(), self.clock.now(), priority=aw.priority, requeue_wait=wait,
                                cluster=cluster)
        hub = self.hub

        def job() -> apply.Steps[_Dispatched]:
            # In steps of one request: the write pool interleaves them with other AppWrappers' (see mcad.writes).
            try:
                # The templates, which the controller does not keep (bounded memory): read now, no older than
                # the view decided about, and only if it is that very spec.
                try:
                    raw = self.writer.read(aw.api_version, KIND, aw.namespace, aw.name,
                                           not_older_than=aw.resource_version)
                except ApiError as err:
                    if err.status == 404:
                        return _Dispatched(aw, new, stale=True)
                    raise
                meta = raw.get("metadata") or {}
                if meta.get("uid") != aw.uid or meta.get("generation") != aw.generation:
                    return _Dispatched(aw, new, stale=True)
                items = apply.generic_items(raw)
                del raw
                yield
                if hub is None:
                    uids = yield from apply.dispatch_steps(self.writer, aw, items)
                else:
                    self._add_finalizer(aw)
                    yield
                    worker = hub.worker(cluster)
                    if worker is None:
                        raise apply.DispatchFailed(f"worker cluster {cluster} is not configured",
                                                   kind=FailureKind.UNAVAILABLE)
                    worker.ensure_namespace(aw.namespace)
                    yield
                    uids = yield from apply.dispatch_steps(hub.writer(cluster), aw, items, remote=True)
            except apply.DispatchFailed as err:
                return _Dispatched(aw, new, error=err)
            except ApiError as err:
                where = f"worker cluster {cluster}" if cluster else "the API server"
                return _Dispatched(aw, new, error=apply.DispatchFailed(
                    f"{where}: {err.reason} ({err.status}): {err.message}", kind=classify(err)))
            return _Dispatched(aw, new, uids)

        self.writes.submit(aw.key, job, tenant=aw.namespace)

    def _collect(self, key: str) -> None:
        """Outcomes of background writes for one AppWrapper, in the order they finished."""
        for outcome in self.writes.results(key):
            if isinstance(outcome, _Dispatched):
                self._dispatch_done(key, outcome)
            elif isinstance(outcome, Cleaned):
                self._cleaned(key, outcome)
            elif isinstance(outcome, StatusWritten):
                self.statuses.written(key, outcome)
            elif isinstance(outcome, Exception):
                log.error("background write failed", appwrapper=key, error=repr(outcome))

    def _dispatch_done(self, key: str, outcome: _Dispatched) -> None:
        aw = outcome.aw
        self._inflight.pop(key, None)
        current = self.appwrappers.get(key)
        still_there = current is not None and current.uid == aw.uid and not current.deleting
        if outcome.error is not None or outcome.stale:
            self._plan_drop(key)
            self._placed.pop(key, None)  # what was applied is undone
            if self.ledger.is_reserved(key) and (still_there or current is None):
                self._release(key)
                self._capacity_may_have_grown()
            if still_there and outcome.error is not None:
                self._dispatch_failed(current, outcome.error)  # type: ignore[arg-type]
            elif still_there:
                # The informer is behind (a newer spec, or it is gone): decide again once it caught up, after a
                # short backoff of its own rather than at once (a read that keeps disagreeing must not spin).
                retry = self._dispatch_retries.failed(key, FailureKind.UNAVAILABLE)
                log.info("dispatch read another spec than decided about; deciding again", appwrapper=key,
                         delay_s=round(retry.delay, 3))
                self._retry_at[key] = self.clock.monotonic() + retry.delay
                self._enqueue(current)  # type: ignore[arg-type]
                self.queue.add_after(("retry", key), retry.delay)
            return
        if not still_there:
            # Deleted while its objects were being created: take them back at once.
            self._delete_wrapped(aw, outcome.uids)
            return
        self._dispatch_retries.succeeded(key)
        self._retry_at.pop(key, None)
        self._object_uids[key] = outcome.uids
        self._backoff_written.pop(key, None)
        self._dispatched[key] = aw
        # Its pods may have come and started while the writes were under way (their events found it in flight).
        self.queue.add_after(("counts", key), POD_COUNT_WINDOW_SECONDS)
        first = lifecycle.dispatched_at(self._status(aw)) is None
        # From here on it is dispatched for the loop, whether or not this write lands at once (mcad.statussync):
        # a status write that fails never makes it dispatch again.
        self._write_status(aw, outcome.status)
        cluster = self._placed.get(key) if self.hub is not None else None
        log.info("dispatched", appwrapper=key, demand=aw.demand.format(), **({"cluster": cluster} if cluster else {}))
        where = f" in worker cluster {cluster}" if cluster else ""
        self._note(aw, "dispatched",
                   f"Its wrapped objects were created{where}; it reserves {aw.demand.format() or 'nothing'}.")
        created = lifecycle.parse_time(aw.created)
        if first and created is not None:
            # Creation to first dispatch; a requeued AppWrapper's later dispatches would say more about its
            # requeue wait than about the queue.
            self.metrics.dispatch_latency((self.clock.now() - created).total_seconds())
        self._follow_lifecycle(current)  # type: ignore[arg-type]

    def _dispatch_failed(self, aw: AppWrapperView, error: apply.DispatchFailed) -> None:
        """Its objects could not all be created (what was is undone). A refusal that would repeat fails it at once;
        anything else is tried again after its own backoff (the cycle passes it by until then), and its status says
        so from the first failure; failing TRANSIENT-ly for too long fails it (``DISPATCH_RETRY``)."""
        key = aw.key
        retry = self._dispatch_retries.failed(key, error.kind)
        if retry.give_up:
            self._retry_at.pop(key, None)
            message = error.message if error.kind is FailureKind.PERMANENT else \
                f"{error.message} (gave up after {retry.attempts} attempts in {retry.seconds:.0f} s)"
            self._fail(aw, status.ITEM_CREATION_FAILURE, message)
            return
        log.warning("dispatch failed; will retry", appwrapper=key, attempts=retry.attempts,
                    delay_s=round(retry.delay, 3), reason=error.message)
        self._retry_at[key] = self.clock.monotonic() + retry.delay
        self._enqueue(aw)
        # A timer of its own: DISPATCH timers of several AppWrappers would merge into the earliest one.
        self.queue.add_after(("retry", key), retry.delay)
        why = f"creating its objects failed, retrying with backoff: {error.message}"
        self._set_queued(aw, frozenset({"dispatch failed"}), partial(str, why))

    def _api_recovered(self) -> None:
        """The API server answers again after failing: the dispatches and status writes that wait out a backoff
        most likely failed because it was away, so they go now instead of up to a backoff late (the retry
        budget of ``mcad.retry`` still bounds how many go at once)."""
        if self._retry_at:
            log.info("api server answers again; retrying failed dispatches now", appwrappers=len(self._retry_at))
            self._retry_at.clear()
            self.queue.add(DISPATCH)
        self.statuses.retry_all()

    def _retry_due(self, key: str) -> None:
        """Its ("retry", key) timer fired: a cycle tries it again, unless a later failure moved its time."""
        due = self._retry_at.get(key)
        if due is None:
            return
        remaining = due - self.clock.monotonic()
        if remaining > 0:
            self.queue.add_after(("retry", key), remaining)
            return
        del self._retry_at[key]
        self.queue.add(DISPATCH)

    def _in_retry_backoff(self, key: str) -> bool:
        """Its last dispatch failed and its backoff has not passed yet."""
        due = self._retry_at.get(key)
        if due is None:
            return False
        if due > self.clock.monotonic():
            return True
        del self._retry_at[key]
        return False

    def _delete_wrapped(self, aw: AppWrapperView, uids: tuple[str, ...] = ()) -> None:
        if self.hub is None:
            self.writes.submit(aw.key, lambda: apply.delete_wrapped_steps(self.writer, aw, uids), tenant=aw.namespace)
            return
        cluster = self._placed.get(aw.key)
        if cluster:
            # Deleted from the worker when it can be reached (now, or when it comes back); retried until done.
            self._leftovers.setdefault(cluster, {})[aw.key] = aw
            self._clean_leftovers(cluster)

    def _fail(self, aw: AppWrapperView, reason: str, message: str) -> None:
        log.warning("appwrapper failed", appwrapper=aw.key, reason=reason, message=message)
        self._note(aw, "failed", f"{reason}: {message}")
        self._write_status(aw, status.failed(self._status(aw).raw(), self.clock.now(), priority=aw.priority,
                                             reason=reason, message=message))

    def _note(self, aw: AppWrapperView, decision: str, message: str) -> None:
        """A decision: counted, and told to the AppWrapper's owner as an Event."""
        self.metrics.decision(decision)
        self._event(aw, _EVENT_REASONS[decision], message)

    def _event(self, aw: AppWrapperView, reason: str, message: str) -> None:
        # The recorder never blocks: it rate-limits and drops on its own (see mcad.events).
        self.recorder.record(events.ObjectRef(aw.api_version, KIND, aw.namespace, aw.name, aw.uid),
                             events.REASON_TYPES[reason], reason, message)

    def _write_status(self, aw: AppWrapperView, new: Mapping[str, Any], *, urgent: bool = True) -> None:
        """Decide ``new`` as ``aw``'s status, unless it equals what the loop decided or saw last: later decisions
        build on it at once, and ``self.statuses`` writes it until it lands, whatever fails meanwhile."""
        view = StatusView.of(new)
        if view == self._status(aw):
            return
        self.statuses.want(aw, view, urgent=urgent)
