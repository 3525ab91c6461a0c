"""The dispatcher loop: one thread that takes work-queue keys one by one and decides what runs.

Contract:
- Informer handlers and timers only enqueue keys (``mcad.model.keys``); this thread is the only one that reads them
  and the only one that reads or writes what is decided (the accountant, the pending queue, the owners it
  composes), so the hot path has no locks. Other threads read what the loop publishes (``LoopState`` for
  metrics, /debug snapshots built between two keys) and never its maps. Each kind of key has one handler; a
  key of no known kind is a bug: it is dropped with an error.
- Nothing is decided before the AppWrapper, Node and Pod informers have all synced and the accountant has been
  rebuilt from them, with a reservation for every AppWrapper already dispatched (a restart never dispatches past
  capacity while it catches up).
- A ``DISPATCH`` key (coalesced, so a burst of events costs one cycle) runs one dispatch cycle
  (``_dispatch_cycle``, its steps numbered): the queued AppWrappers in order (priority, creation time, name), one
  fit check (``fit.fits``) per demand group, over a snapshot of free room; every one that fits is dispatched:
  reserved now, its objects written in the background (``mcad.k8s.dispatchjob``), released if they fail. With strict
  FIFO one that does not fit holds back the later ones of its quota node, or everything when it waits for the
  cluster's room (``mcad.model.fifo`` has the rule); one that makes room by eviction (``mcad.loop.evictions``)
  holds everything behind it. Capacity that frees up triggers a cycle at once; there are no timed sleeps.
- Statuses are the loop's decisions, written until they land (``mcad.loop.statussync``) and only when they differ
  from the last one decided or seen; waiting AppWrappers are told what blocks them by ``mcad.loop.notices``;
  dispatched ones are followed by ``mcad.loop.follower``. Where objects go (this cluster, or in hub mode a worker)
  is the ``Sites``' and ``Targets``' business (``mcad.loop.sites``, ``mcad.hub.sites``, ``mcad.hub.placement``): the
  loop
  never asks which mode it is in.
- Status is not proof of a final state: capacity and quota are released on a final state (Completed, Failed) only
  when this loop decided it (for this incarnation, uid) or none of the AppWrapper's pods is still running. A final
  state it did not decide (written by someone granted ``appwrappers/status``, or decided before a restart) while
  its pods run keeps its reservation and quota charges, after a restart too (``rebuild`` reads the pods first),
  until its pods end or it is deleted; it is logged and told in one Warning Event (``StatusNotDecided``) naming
  the state. Admission refuses such writes (``mcad.admission.review``); this holds when admission was bypassed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import structlog

from mcad.api.appwrapper import ACTIVE_STATES, FINAL_STATES, KIND, AppWrapperView, State
from mcad.api.resources import ResourceVector
from mcad.api.statusview import StatusView
from mcad.api.views import NodeView, PodView
from mcad.clock import Clock, RealClock
from mcad.hub.placement import Policy as ClusterPolicy
from mcad.hub.placement import WorkerPlacement
from mcad.hub.sites import WorkerClusters, WorkerPods, WorkerSites
from mcad.k8s import events
from mcad.k8s.dispatchjob import Dispatched, Writer
from mcad.k8s.informer import Store
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.wrapped import WrappedObjects
from mcad.k8s.writes import Writes
from mcad.loop.dispatches import Dispatches
from mcad.loop.evictions import (
    BACKOFF_CAP_FACTOR,
    DEFAULT_MAX_EVICTIONS_PER_MINUTE,
    DEFAULT_PREEMPTION_BACKOFF_SECONDS,
    Evictions,
)
from mcad.loop.follower import Follower
from mcad.loop.loopcalls import LoopCalls
from mcad.loop.notices import Notices
from mcad.loop.pinning import PLACEMENT_MODES, Here, Pinning, Ungated
from mcad.loop.quotastatus import QUOTA_STATUS_WINDOW_SECONDS, QuotaStatusWriter
from mcad.loop.sites import Cleaned, LocalCluster, Sites
from mcad.loop.statussync import StatusSync, StatusWritten
from mcad.metrics import PUBLISH_INTERVAL_SECONDS, LoopState, Metrics
from mcad.model import disclosure, keys, lifecycle, status
from mcad.model import quota as quota_trees
from mcad.model.accounting import Accountant, Plan, Snapshot
from mcad.model.assess import Assessment, assess
from mcad.model.fifo import BEHIND_IN_DOMAIN, StrictFifo
from mcad.model.fit import Fit, SingleCluster, Targets, could_ever_fit, fits, refused
from mcad.model.keys import DISPATCH, PUBLISH, QUOTA, QUOTA_STATUS, AppWrapperEvent, Key
from mcad.model.ledger import Ledger
from mcad.model.pending import PendingQueue, demand_group
from mcad.model.preemption import EvictionBudget, Preemptors, preemption_refusal
from mcad.model.reservations import BEHIND, DEFAULT_RESERVATIONS, Pass, Reservations
from mcad.model.retry import Backoff, Policy

R = TypeVar("R")
T = TypeVar("T")
# Pod counts in a dispatched AppWrapper's status are written at most once per this window, in the writers' low
# priority lane: a gang's pods move through Pending and Running within moments, one write for all of it is enough,
# and API server capacity is better spent creating the next gang.
POD_COUNT_WINDOW_SECONDS = 5.0
# How a queued AppWrapper is judged to fit: "nodes" packs its pods onto the nodes' free room (first-fit
# decreasing; taints, nodeSelector, affinity), "aggregate" compares its total demand with the cluster's free total.
FIT_MODES = ("nodes", "aggregate")
# Retrying failed status writes (mcad.model.retry): 0.25 s doubling to 4 s, so a status is right within 4 s of a fault's
# end, at most 50 a second in all; giving up only stops the timer (the next event of the AppWrapper writes again).
# Failed object writes: mcad.loop.dispatches.
STATUS_RETRY = Policy(base=0.25, cap=4.0, rate=50.0, burst=500, give_up_attempts=20, give_up_seconds=300.0)
# A preemptor waits this long for its victims' pods to go before it force-deletes those whose grace period is
# over and stops holding the queue (a pod finalizer or a process ignoring SIGTERM would hold it for ever).
DEFAULT_VICTIM_TIMEOUT_SECONDS = 300.0
# Decisions (metrics) and the Event reason each is told with.
_EVENT_REASONS = {"dispatched": events.DISPATCHED, "queued": events.QUEUED, "preempted": events.PREEMPTED,
                  "requeued": events.REQUEUED, "completed": events.COMPLETED, "failed": events.FAILED}
log = structlog.get_logger("mcad.loop.dispatcher")


def either(new: T | None, old: T | None) -> T:
    """The object an informer event is about: the new one, else (deleted) the old one; an event has one of them."""
    found = new if new is not None else old
    assert found is not None, "an informer event about no object"
    return found


class UnknownKey(TypeError):
    """A work-queue key of a kind the dispatcher has no handler for (a bug where the key was made)."""


def protected_namespace_message(namespace: str) -> str:
    return (f"namespace {namespace} is protected: mcad creates nothing there unless the controller runs with "
            f"--allow-protected-namespace={namespace}")


class Dispatcher:
    def __init__(self, *, appwrappers: Store[AppWrapperView], nodes: Store[NodeView],
                 pods: Store[PodView], writer: Writer, queue: WorkQueue[Key] | None = None,
                 clock: Clock | None = None, strict_fifo: bool = False, write_workers: int = 32,
                 wrapped: WrappedObjects | None = None, preemption: bool = False, fit: str = "nodes",
                 metrics: Metrics | None = None, recorder: events.EventSink | None = None,
                 quota_subtrees: Store[quota_trees.SubtreeView] | None = None, hub: WorkerClusters | None = None,
                 cluster_policy: ClusterPolicy | None = None,
                 victim_timeout: float = DEFAULT_VICTIM_TIMEOUT_SECONDS,
                 preemption_backoff: float = DEFAULT_PREEMPTION_BACKOFF_SECONDS,
                 max_evictions_per_minute: int = DEFAULT_MAX_EVICTIONS_PER_MINUTE,
                 protected_namespaces: frozenset[str] = frozenset(),
                 reservations: int = DEFAULT_RESERVATIONS, placement: str = "binding") -> None:
        if fit not in FIT_MODES:
            raise ValueError(f"fit must be one of {', '.join(FIT_MODES)}, not {fit!r}")
        if placement not in PLACEMENT_MODES:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENT_MODES)}, not {placement!r}")
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
        # Every piece of capacity state (ledger, plans, quota charges, pods by AppWrapper): mcad.model.accounting.
        self.accountant = Accountant(quota_trees=quota_subtrees is not None)
        # Set once the ledger is rebuilt from synced informers: from then on decisions (and /debug reads) are valid.
        self.running = threading.Event()
        self.calls = LoopCalls(self.queue)  # /debug reads, run on this thread between two keys
        # Objects of wrapped kinds, watched for completion; None: completion is not watched (tests of other parts).
        self.wrapped = wrapped
        self.writes = Writes(self.queue, workers=write_workers)
        # QuotaSubtree objects: their definitions read into the quota ledger, their usage written back.
        self.quota_status = QuotaStatusWriter(self.quota, quota_subtrees, writer, self.writes) \
            if self.quota is not None and quota_subtrees is not None else None
        # The status the loop decided for each AppWrapper, written until it lands (see mcad.loop.statussync).
        self.statuses = StatusSync(writer, self.writes, self.queue, Backoff(self.clock, STATUS_RETRY), self.clock)
        self.cycles = 0
        self.pending = PendingQueue()
        # The last view of each dispatched AppWrapper: once it is deleted, its items say what to clean up.
        self._dispatched: dict[str, AppWrapperView] = {}
        # AppWrapper key -> uid of the incarnation this loop decided a final state for: only such a final state
        # releases capacity while pods of it still run. And the (uid, state) a StatusNotDecided Event named, so
        # it is told once. Both are dropped with the AppWrapper (``_forget``).
        self._decided_final: dict[str, str] = {}
        self._undecided_told: dict[str, tuple[str, str]] = {}
        # Priority preemption and quota reclaim: who waits for which victims (mcad.model.preemption).
        self.preemptors = Preemptors(victim_timeout, preemption_backoff, preemption_backoff * BACKOFF_CAP_FACTOR)
        # Namespaces where nothing is created (the kube-* ones, the controller's own): an AppWrapper there fails at
        # once, whatever admission let through.
        self.protected_namespaces = protected_namespaces
        # Where objects go and which informers tell how they do: this cluster, or (hub mode) the workers.
        self.hub = hub
        self.placement: WorkerPlacement | None = None
        self.targets: Targets
        self.sites: Sites
        # Pods pinned to the nodes of their plan (mcad.loop.pinning): only where a per-node plan exists.
        binding = placement == "binding" and fit == "nodes"
        self.placement_mode = "binding" if binding else "advisory"
        if hub is None:
            self.targets = SingleCluster()
            self.sites = LocalCluster(writer, writer, self.writes, wrapped,
                                      retry=lambda key: self.queue.add_rate_limited(AppWrapperEvent(key)),
                                      again=lambda key: self.queue.add(AppWrapperEvent(key)), gate=binding)
        else:
            self.placement = self.targets = WorkerPlacement(hub, cluster_policy)
            self.sites = WorkerSites(hub, self.placement, host=self, accountant=self.accountant,
                                     appwrappers=appwrappers, finalizers=writer, writes=self.writes, queue=self.queue,
                                     clock=self.clock, gate=binding)
        # Blocked AppWrappers that hold room until it frees, and backfill around them (mcad.model.reservations).
        self.reservations = Reservations(reservations, self.targets, self)
        self._pass: Pass | None = None  # the dispatch cycle's, while its waiting AppWrappers are told why
        # Dispatches whose writes are under way, and what becomes of them (mcad.loop.dispatches).
        self.dispatches = Dispatches(self, appwrappers=appwrappers, accountant=self.accountant, sites=self.sites,
                                     writer=writer, writes=self.writes, queue=self.queue, clock=self.clock)
        self.evictions = Evictions(self.preemptors, self.accountant, self.targets, self, dispatched=self._dispatched,
                                   in_flight=self.dispatches.in_flight, appwrappers=appwrappers,
                                   queue=self.queue, clock=self.clock, writes=self.writes, pods=writer,
                                   priority_preemption=preemption,
                                   budget=EvictionBudget(max_evictions_per_minute))
        # What waiting AppWrappers are told (their Backoff status), written only when it changes.
        self.notices = Notices(self.pending, appwrappers, self, metrics=self.metrics, clock=self.clock,
                               strict_fifo=strict_fifo)
        # Dispatched AppWrappers: their timers and what their pods and wrapped objects say (mcad.loop.follower).
        self.follower = Follower(self, self.accountant, self.sites, self.queue, self.clock)
        where = Here(writer) if hub is None or self.placement is None else WorkerPods(hub, self.placement)
        self.pinning = Pinning(binding=binding, accountant=self.accountant, pods=pods, where=where,
                               writes=self.writes, queue=self.queue, host=self, recorder=self.recorder,
                               metrics=self.metrics)
        self._handlers = self._handler_table()
        # For scrapes (mcad.metrics): what the loop published last, and when; a Publish key is due.
        self.published = LoopState()
        self._published_at = float("-inf")
        self._publish_due = False
        appwrappers.add_handler(lambda _t, old, new: self.queue.add(AppWrapperEvent(either(new, old).key)))
        nodes.add_handler(lambda _t, old, new: self.queue.add(keys.NodeEvent(either(new, old).name)))
        pods.add_handler(lambda _t, old, new: self.queue.add(keys.PodEvent(either(new, old).uid)))
        if quota_subtrees is not None:
            quota_subtrees.add_handler(lambda _t, _old, _new: self.queue.add(QUOTA))

    @property
    def ledger(self) -> Ledger:
        return self.accountant.ledger

    @property
    def quota(self) -> quota_trees.QuotaLedger | None:
        return self.accountant.quota

    @property
    def preemptions(self) -> int:
        """Victims evicted so far (priority preemption and quota reclaim)."""
        return self.preemptors.evicted

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
        """Once the informers have synced: start the write pool, rebuild the ledger and ask for the first cycle."""
        self.writes.start()
        self.rebuild()
        self.running.set()
        self.sites.start()
        # Gated pods, and pinned ones not bound yet, are looked at once the ledger is whole.
        for pod in self.pods.list():
            if pod.pin is not None:
                self.queue.add(keys.PodEvent(pod.uid))
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
            if not isinstance(key, (keys.Publish, keys.Call)):
                self._changed()
            # Hub mode's AppWrapper and cleanup keys fail through their background writes, reported on another
            # key: their failure counts are reset when a write of theirs succeeds, so their backoff grows.
            if not isinstance(key, (AppWrapperEvent, keys.WorkerCleanup)):
                self.queue.forget(key)
        except UnknownKey:
            log.exception("a work-queue key of no known kind: dropped", key=repr(key))  # a bug: retrying cannot help
            self.queue.forget(key)
        except Exception:
            log.exception("processing failed; retrying with backoff", key=repr(key))
            self.queue.add_rate_limited(key)
        finally:
            self.queue.done(key)
        return key

    def process(self, key: Key) -> None:
        handler = self._handlers.get(type(key))
        if handler is None:
            raise UnknownKey(f"the dispatcher has no handler for work-queue key {key!r}")
        handler(key)

    def _handler_table(self) -> dict[type[Any], Callable[[Any], None]]:
        """What each kind of key (``mcad.model.keys``) means, and the sites' own kinds (hub mode's)."""
        return {
            keys.PodEvent: lambda k: self._sync_pod(k.uid),
            keys.NodeEvent: lambda k: self._sync_node(k.name),
            AppWrapperEvent: lambda k: self._sync_appwrapper(k.appwrapper),
            keys.Written: lambda k: self._collect(k.appwrapper),
            keys.StatusRetry: lambda k: self.statuses.retry(k.appwrapper),
            keys.DispatchRetry: lambda k: self.dispatches.retry_due(k.appwrapper),
            keys.MinAvailableCheck: lambda k: self.follower.check_min_available(k.appwrapper),
            keys.DeadlineCheck: lambda k: self.follower.check_deadline(k.appwrapper),
            keys.PodCounts: lambda k: self._pod_counts_due(k.appwrapper),
            keys.Recovered: lambda _k: self._api_recovered(),
            keys.Call: lambda _k: self.calls.run(),
            keys.QuotaChanged: lambda _k: self._sync_quota(),
            keys.QuotaStatus: lambda _k: self.quota_status.write() if self.quota_status is not None else None,
            keys.Dispatch: lambda _k: self._dispatch_cycle(),
            keys.Publish: lambda _k: self._publish(),
            **self.sites.handlers(),
        }

    def _pod_counts_due(self, key: str) -> None:
        aw = self.appwrappers.get(key)
        if aw is not None and not self._is_queued(aw) and self._state(aw) not in FINAL_STATES:
            self._update_pod_counts(aw)

    def _changed(self) -> None:
        """Something may have changed: publish the loop's state for scrapes, at most once per interval."""
        if self._publish_due:
            return
        self._publish_due = True
        self.queue.add_after(PUBLISH, self._published_at + PUBLISH_INTERVAL_SECONDS - self.clock.monotonic())

    def _publish(self) -> None:
        """For scrapes: what the loop knows, in O(nodes' resources + decisions under way + placements)."""
        self._publish_due = False
        self._published_at = self.clock.monotonic()
        placed: dict[str, int] = {}
        if self.placement is not None:
            for cluster in self.placement.placed.values():
                placed[cluster] = placed.get(cluster, 0) + 1
        ledger = self.ledger
        self.published = LoopState(
            capacity=(ledger.capacity(), ledger.in_use(), ledger.reserved(), ledger.free()),
            queue={"queued": len(self.pending), "dispatching": len(self.dispatches.in_flight),
                   "preempting": len(self.preemptors)},
            decided=self.statuses.decided_states(), placed=placed, reservations=len(self.reservations.held),
            gated=self.pinning.counts())

    def call(self, fn: Callable[[], R], timeout: float) -> R:
        """Run ``fn`` on the dispatcher thread, the only one that may read its state (``mcad.loop.loopcalls``)."""
        return self.calls.call(fn, timeout)

    def rebuild(self) -> None:
        """Ledger from the synced stores: nodes, pods, and the reservations of dispatched AppWrappers."""
        # Before the pods: a pod counts for its AppWrapper only where the AppWrapper is placed.
        for aw in self.appwrappers.list():
            self.sites.adopt(aw)
        for node in self.nodes.list():
            self.accountant.observe_node(node)
        for pod in self.pods.list():
            self._track_pod(pod)
        if self.quota_status is not None:
            self.quota_status.read_forest()
        for aw in self.appwrappers.list():
            if self._status(aw).canrun and self._state(aw) in ACTIVE_STATES:
                self._reserve(aw)
            elif self._state(aw) in FINAL_STATES and self.accountant.live_pods(aw.key):
                # Not known to be decided here (this process decided nothing yet): its running pods keep it
                # charged, as its sync will say (``_holds_undecided_final``).
                self._reserve(aw)
            elif self._is_queued(aw) and aw.namespace not in self.protected_namespaces:
                self.enqueue(aw)  # a protected one is failed by its sync, never queued
        if self.fit == "nodes":
            self._replan_after_restart()

    def _replan_after_restart(self) -> None:
        """Plans of dispatched AppWrappers whose pods are not all bound yet: their unbound pods, placed again on
        the room left (where the scheduler will put them is not known; this keeps their room from being promised
        twice)."""
        snapshot = self._snapshot()
        for key in self.accountant.reserved_keys():
            aw = self.appwrappers.get(key)
            if aw is not None and self.ledger.reservation(key):
                self.accountant.replan(key, aw.gang, self.targets.nodes_for(key, snapshot), snapshot)

    # ------------------------------------------------------------------------------------------ reads (/debug)

    def assess_queue(self) -> list[Assessment]:
        """Every queued AppWrapper in dispatch order with what a cycle would do with it now, deciding nothing
        (``mcad.model.assess``). Dispatcher thread only."""
        reserving = self.reservations.start(self._snapshot(scratch_quota=True), self.clock.now(), dry_run=True)
        return assess(self.pending, self.appwrappers, reserving,
                      preemptors=self.preemptors, draining=self._draining,
                      blocked_by_reclaim=self.evictions.blocked_by_reclaim, strict_fifo=self.strict_fifo,
                      targets=self.targets)

    def status_of(self, aw: AppWrapperView) -> StatusView:
        """Its status as this controller knows it: the last one written, else the last one seen."""
        return self._status(aw)

    def placed(self) -> dict[str, str]:
        """Hub mode: AppWrapper key -> the worker its objects are in. Dispatcher thread only."""
        return dict(self.placement.placed) if self.placement is not None else {}

    # ------------------------------------------------------------------------------------------ quota trees

    def _sync_quota(self) -> None:
        """A QuotaSubtree changed: rebuild the forest, re-derive every charge, and look at the queue again (queued
        AppWrappers may be charged elsewhere now: a default node appeared, a tree went away)."""
        if self.quota_status is None or not self.running.is_set():
            return
        self.quota_status.read_forest()
        for key in list(self.pending.ordered()):
            aw = self.appwrappers.get(key)
            if aw is not None:
                self.enqueue(aw)
        self.notices.groups_changed()
        self.queue.add(DISPATCH)
        self.queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)

    def capacity_may_have_grown(self) -> None:
        if self.pending or self.pinning.placing():
            self.queue.add(DISPATCH)

    # ------------------------------------------------------------------------------------------ events

    def _track_pod(self, pod: PodView) -> PodView:
        """Into the accountant as the sites count it (hub mode: a pod in a worker its AppWrapper is not placed in
        is nobody's); returns that view."""
        claimed = self.sites.claim(pod)
        self.accountant.observe_pod(claimed)
        return claimed

    def _sync_pod(self, uid: str) -> None:
        pod = self.pods.get(uid)
        if pod is None:
            owner = self.accountant.forget_pod(uid)
            self.pinning.forget(uid, owner)
            if owner:
                self.queue.add(AppWrapperEvent(owner))
            self.capacity_may_have_grown()
            return
        self.pinning.observe(self._track_pod(pod))
        if pod.appwrapper:
            self.queue.add(AppWrapperEvent(pod.appwrapper))
            if pod.appwrapper in self.pending:
                queued = self.appwrappers.get(pod.appwrapper)
                if queued is not None:
                    self.enqueue(queued)  # its own pods now count: it may need its own group
        if pod.terminal or pod.deleting:
            self.capacity_may_have_grown()

    def _sync_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            self.accountant.forget_node(name)
            self.pinning.node_changed(name)
            return
        # Status heartbeats change nothing we count; only new or changed capacity deserves a cycle.
        if self.accountant.observe_node(node):
            self.capacity_may_have_grown()
            self.pinning.node_changed(name)

    def _status(self, aw: AppWrapperView) -> StatusView:
        """What the loop decided last for ``aw``: its own decision until the informer shows it landed (our writes
        may not be back from the watch yet, or may be failing), then the informer's status."""
        intent = self.statuses.intent(aw)
        return intent if intent is not None else aw.status

    def _state(self, aw: AppWrapperView) -> str:
        return self._status(aw).state

    def _is_queued(self, aw: AppWrapperView) -> bool:
        if aw.key in self.dispatches:
            return False
        current = self._status(aw)
        return not aw.deleting and not current.canrun and current.state in (State.NEW, State.PENDING)

    def _sync_appwrapper(self, key: str) -> None:
        aw = self.appwrappers.get(key)
        if (aw is None or aw.deleting) and (key in self.pending or key in self.preemptors):
            # One that waited in the queue may have held others back (strict FIFO, a preemptor): look again.
            self.queue.add(DISPATCH)
        if aw is None or aw.deleting:
            gone, uids = self._dispatched.get(key), self.dispatches.object_uids(key)
            self._forget(key)
            self.sites.deleted(key, aw, gone, uids)
            return
        if key in self.dispatches:
            return  # its dispatch writes are under way; their outcome decides
        previous = self._dispatched.get(key)
        if previous is not None and previous.uid != aw.uid:
            # Deleted and re-created under the same name while we were not looking: clean up the old one.
            del self._dispatched[key]
            self._delete_wrapped(previous, self.dispatches.object_uids(key))
            self._forget(key)
        # Drops a decision the informer now shows, and re-drives a status write that failed (this event may be
        # its pods or objects changing, long after the write gave up).
        self.statuses.observed(aw)
        if self._is_queued(aw):
            if aw.demand_error:
                self.pending.remove(key)
                self.fail(aw, status.INVALID_SPEC, aw.demand_error)
            elif aw.namespace in self.protected_namespaces:
                self.pending.remove(key)
                self.fail(aw, status.PROTECTED_NAMESPACE, protected_namespace_message(aw.namespace))
            elif self.enqueue(aw):
                # New arrivals and changed ones need a decision; our own status writes coming back do not.
                self.queue.add(DISPATCH)
            return
        self.pending.remove(key)
        state = self._state(aw)
        if state in FINAL_STATES:
            if self._holds_undecided_final(aw, state):
                return
            if self.release(key):
                self.capacity_may_have_grown()
            return
        if not self.accountant.holds(key):
            self._reserve(aw)
        self._dispatched[key] = aw
        self.queue.add_after(keys.PodCounts(key), POD_COUNT_WINDOW_SECONDS)
        self.follower.follow(aw)

    def _holds_undecided_final(self, aw: AppWrapperView, state: str) -> bool:
        """A final state this loop did not decide while pods of ``aw`` still run: its reservation and charges stay
        (taken again if it held none: a restart, or a release before this) and an Event names the state once. True
        when that is so; False when the final state may release what it holds."""
        if self._decided_final.get(aw.key) == aw.uid:
            return False
        running = self.accountant.live_pods(aw.key)
        if not running:
            return False
        if not self.accountant.holds(aw.key):
            self._reserve(aw)
        if self._undecided_told.get(aw.key) != (aw.uid, state):
            self._undecided_told[aw.key] = (aw.uid, state)
            message = (f"status.state {state} was not decided by mcad while {len(running)} of its pods still run: its "
                       f"capacity and quota stay charged until they end or the AppWrapper is deleted (only the "
                       f"controller writes AppWrapper status)")
            log.warning("final state not decided by the controller", appwrapper=aw.key,
                        reason=events.STATUS_NOT_DECIDED, state=state, pods=len(running))
            self.event(aw, events.STATUS_NOT_DECIDED, message)
        return True

    # ------------------------------------------------------------------------------------------ lifecycle

    def finish(self, aw: AppWrapperView, new: Mapping[str, Any], *, stop: bool = False) -> None:
        """A final state: write it, release the reservation at once; ``stop`` also deletes the wrapped objects."""
        self.write_status(aw, new)
        if stop:
            self._delete_wrapped(aw, self.dispatches.object_uids(aw.key))
        self._undispatch(aw.key)

    def _undispatch(self, key: str) -> None:
        """It no longer holds capacity: drop its plan, timers and reservation (its pods count while they exist)."""
        self._dispatched.pop(key, None)
        self.follower.forget(key)
        self.pinning.undispatched(key)
        if self.release(key):
            self.capacity_may_have_grown()

    def _reserve(self, aw: AppWrapperView, plan: Plan = ()) -> None:
        """Its capacity in the ledger, its plan and, with quota trees, its charges."""
        self.accountant.assume(aw.key, aw.demand, aw.labels, plan)
        if self.quota is not None:
            self.queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)

    def release(self, key: str) -> bool:
        """Its reservation, plan and charges go; True if it held any."""
        held = self.accountant.forget(key)
        if held and self.quota is not None:
            self.queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)
        return held

    def dispatched_now(self, key: str) -> AppWrapperView | None:
        aw = self.appwrappers.get(key)
        if aw is None or aw.deleting or key in self.dispatches or self._is_queued(aw):
            return None
        return aw if self._state(aw) in ACTIVE_STATES else None

    def requeue_keeping_count(self, aw: AppWrapperView, reason: str, message: str) -> None:
        """Back to the queue for another's sake (a preemptor, a reclaim, a worker gone): its requeuing count and
        wait stay as they are."""
        current = self._status(aw)
        self.requeue(aw, reason, message, requeuings=current.requeuings, requeue_wait=current.requeue_wait)

    def requeue(self, aw: AppWrapperView, reason: str, message: str, *, requeuings: int, requeue_wait: int) -> None:
        """Take a dispatched AppWrapper back: delete its objects, queue it at its place; it stays out of the
        cycle (draining) until its old pods are gone, so they are not mistaken for its new ones."""
        key = aw.key
        log.info("appwrapper requeued", appwrapper=key, reason=reason, message=message, requeuings=requeuings)
        preempted = reason in (status.PREEMPTED_BY_PRIORITY, status.PREEMPTED_BY_QUOTA_RECLAIM)
        self.note(aw, "preempted" if preempted else "requeued", message)
        self.write_status(aw, status.requeued(self._status(aw).raw(), self.clock.now(), priority=aw.priority,
                                               reason=reason, message=message, requeuings=requeuings,
                                               requeue_wait=requeue_wait))
        self._delete_wrapped(aw, self.dispatches.take_object_uids(key))
        self._undispatch(key)
        self.notices.reset(key)
        if aw.demand_error:
            # Dispatched before its spec was refused (a bound added since): it is not dispatched again.
            self.fail(aw, status.INVALID_SPEC, aw.demand_error)
            return
        self.enqueue(aw)
        # Its Backoff tells of the requeue; once it waits like the rest, say what it waits for (mcad.loop.notices).
        self.notices.to_announce(key)
        self.queue.add(DISPATCH)

    def _draining(self, aw: AppWrapperView) -> bool:
        # Requeued and not yet looked at again (its current Backoff is the requeue's): its old pods may remain.
        return self.accountant.has_pods(aw.key) and self._status(aw).backoff == status.PREEMPTION_TRIGGERED

    def enqueue(self, aw: AppWrapperView) -> bool:
        """Put ``aw`` in the pending queue, or move it; True if that changed its place or its group."""
        group = demand_group(aw, apart=bool(self.accountant.consumed(aw.key)) or self._draining(aw),
                             by_nodes=self.fit == "nodes",
                             quota_charges=self.quota.forest.charges(aw.labels) if self.quota is not None else None)
        before = self.pending.entry(aw.key)
        if before is None and not self._status(aw).backoff:
            self.notices.to_announce(aw.key)
        elif before is not None and before[1] != group:
            # A new group (its old pods went, its quota node changed): a cycle may only ever visit the group's
            # head, so its own Backoff is written at the end of the next cycle.
            self.notices.to_announce(aw.key)
        self.pending.upsert(aw.key, aw.order(), aw.demand, group=group)
        return before != (aw.order(), group)

    def _forget(self, key: str) -> None:
        self._undispatch(key)
        self._decided_final.pop(key, None)
        self._undecided_told.pop(key, None)
        self.reservations.forget(key)
        self.preemptors.forget(key)
        self.statuses.forget(key)
        self.dispatches.forget(key)
        self.notices.forget(key)
        self.pending.remove(key)

    def _update_pod_counts(self, aw: AppWrapperView) -> None:
        phases = self.accountant.phases(aw.key)
        current = self._status(aw).raw()
        unplaced = self.pinning.waiting(aw.key)
        new = status.with_pod_counts(current, self.clock.now(), pending=phases.count("Pending"),
                                     running=phases.count("Running"), succeeded=phases.count("Succeeded"),
                                     failed_=phases.count("Failed"),
                                     unschedulable=self.accountant.unschedulable_pods(aw.key) + unplaced)
        self.write_status(aw, new, urgent=False)

    # ------------------------------------------------------------------------------------------ decisions

    def _dispatch_cycle(self) -> None:
        """One pass over the queue in dispatch order (priority, creation time, name), one candidate per group (the
        next of a group too when its candidate took a reservation and more are left):
        1. Snapshot the free room (``Accountant.snapshot``); the pass takes from its copy as it dispatches, and as
           blocked ones take reservations (``mcad.model.reservations``).
        2. Pass by a candidate that is gone or decided meanwhile, that waits for its previous pods to go
           (draining), or whose last dispatch failed and waits out its backoff.
        3. Fit it (``fit.fits``, on room no reservation holds; one with a bounded run time may also use the room of
           reservations it ends before: backfill); a quota reclaim under way in its trees holds back one that would
           borrow.
        4. It fits: dispatch it (reserved now, written in the background) and take its room from the snapshot.
        5. It does not: if victims are going away for it, or it can make room by evicting others (quota reclaim,
           then priority preemption), it holds the queue: the pass stops, nothing behind it may take that room.
        6. Else it waits: it takes a reservation if one is left (not with strict FIFO, where it holds what it
           waits for, ``mcad.model.fifo``: its quota node and those charged there or below when quota blocks it, the
           whole cluster (the pass stops) when room does; nothing if it could never run); why it waits is written
           after the pass (once the dispatched ones left, so positions are right).
        7. After the pass: drop the dispatched from the queue, write the Backoff of those that wait and refresh
           their groups' members when what blocks the head changed, and announce the newcomers."""
        started = time.perf_counter()
        self.cycles += 1
        snapshot = self._snapshot()  # 1
        # Pods of dispatched AppWrappers beyond their plans go first, on room nobody else holds.
        self.pinning.place_extras(snapshot, {key: r.nodes for key, r in self.reservations.held.items()})
        reserving = self.reservations.start(snapshot, self.clock.now())
        cursor = self.pending.cycle()
        held_by = ""  # the preemptor that stopped the cycle early by holding the queue (notices word it per reader)
        fifo = StrictFifo(snapshot.quota.forest if snapshot.quota is not None else None) if self.strict_fifo else None
        done: list[str] = []
        waiting: list[tuple[AppWrapperView, frozenset[str], Callable[[], str]]] = []
        dispatched = 0
        while (candidate := cursor.next()) is not None:
            key, _ = candidate
            aw = self.appwrappers.get(key)
            if aw is None or not self._is_queued(aw):  # 2
                done.append(key)  # went away or was decided meanwhile; its own event tidies up the rest
                cursor.passed()
                continue
            if self._draining(aw):
                cursor.blocked()  # its own group: it waits for the pods of its previous dispatch to go
                continue
            if self.dispatches.waiting(key):
                cursor.passed()  # its last dispatch failed: not before its backoff passes (its timer says when)
                continue
            if fifo is not None and key not in self.preemptors and fifo.held(aw):
                # Strict FIFO: an earlier one of its quota node (or namespace) cannot dispatch (mcad.model.fifo).
                waiting.append((aw, frozenset({BEHIND_IN_DOMAIN}), partial(str, BEHIND_IN_DOMAIN)))
                if fifo.by_quota(aw):
                    cursor.blocked()  # its group shares its quota nodes: all held alike
                else:
                    cursor.passed()
                continue
            # Its own pods can exist already (the controller stopped between creating its objects and
            # recording that): they are in use, so only the rest of the demand must fit.
            need = snapshot.need(key, aw.demand)
            fit = reserving.fit(aw, need)  # 3
            held = self.evictions.blocked_by_reclaim(aw) if fit.fits else ""
            if held:
                fit = refused("reclaim", held)
            if fit.fits:  # 4
                cursor.passed()
                self._dispatch(aw, fit.plan, fit.cluster)
                done.append(key)
                dispatched += 1
                snapshot.take(need, fit.plan)
                continue
            room = self.evictions.makes_room(aw, need, snapshot, reclaim=not held)  # 5
            if room.holds:
                held_by = key
                cursor.stop()
                continue
            if self.strict_fifo:  # 6
                told = fit.about, fit.why
            elif self.preemptors.abandoned(key):
                # Its victims did not go: holding their room for it could hold it for ever (a pod finalizer).
                told = reserving.explain(aw, need, fit)
            else:
                told = reserving.wait(aw, need, fit)
            about, why = self._why_waiting(aw, *told)
            if room.about:  # it outranks running work, yet evicts nobody: say why
                about, why = about | {room.about}, partial(lambda w, r: f"{w()}; {r}", why, room.why)
            if self.strict_fifo and not could_ever_fit(aw, need, snapshot, self.targets, fit):
                # It would hold everyone behind it for ever: let them pass, and say so.
                about = about | {"never fits"}
                never = preemption_refusal(aw, need, snapshot, self.targets)
                if not never or never == "it would not fit even the empty cluster":
                    never = "it cannot fit even the empty cluster"
                why = partial(lambda w, n: f"{w()}; {n}, so it does not hold the queue (strict FIFO)", why, never)
                waiting.append((aw, about, why))
                cursor.blocked()
                continue
            waiting.append((aw, about, why))
            if fifo is not None:
                if fifo.hold(aw, fit):
                    cursor.stop()  # it waits for the cluster's room: everything behind it waits
                else:
                    cursor.blocked()  # it waits on its quota: what it holds is in fifo, its group is held alike
            elif not reserving.full and reserving.holds(key):
                cursor.passed()  # the next of its group takes the next reservation (other nodes), if it may
            else:
                cursor.blocked()
        reserving.finish()
        for key in done:  # 7
            self.pending.remove(key)
        self._pass = reserving  # what members and newcomers are told of reservations
        try:
            if not self.strict_fifo:
                for aw, about, _ in waiting:
                    # Members are told again when what they lack changes, not when reservations ahead come and go:
                    # that would rewrite every member of a group (10,000 small ones) each time.
                    self.notices.refresh_group(aw, about - {BEHIND}, snapshot)
            # Then the ones the pass judged: a group's refresh knows only what they lack, not all the pass found
            # (a member of another's group may be a head of its own with more to say, e.g. why it evicts nobody).
            for aw, about, why in waiting:
                self.notices.tell(aw, about, why)
            self.notices.announce(snapshot, held_by)
        finally:
            self._pass = None
        self.metrics.cycle(time.perf_counter() - started)
        log.info("dispatch cycle", cycle=self.cycles, queued=len(self.pending), dispatched=dispatched,
                 visited=cursor.visited, reservations=len(reserving.made), free=snapshot.free.format(),
                 duration_ms=round((time.perf_counter() - started) * 1000, 2))

    def _snapshot(self, *, scratch_quota: bool = False) -> Snapshot:
        return self.accountant.snapshot(by_nodes=self.fit == "nodes", scratch_quota=scratch_quota)

    def _why_waiting(self, aw: AppWrapperView, about: frozenset[str],
                     why: Callable[[], str]) -> tuple[frozenset[str], Callable[[], str]]:
        """What blocks a candidate that waits, and its message (one that gave up on its victims says so)."""
        gave_up_on = self.preemptors.abandoned(aw.key)
        if gave_up_on:
            gave_up = (f"its preemption victims did not finish terminating within {self.preemptors.victim_timeout:g} s "
                       f"({disclosure.listed(gave_up_on, aw.namespace)}), so it no longer holds the queue")
            about, why = about | {"victims stuck"}, partial(lambda w, g: f"{w()}; {g}", why, gave_up)
        return about, why

    def tell_waiting(self, aw: AppWrapperView, about: frozenset[str], why: str) -> None:
        self.notices.tell(aw, about, partial(str, why))

    # ------------------------------------------------------------------------------------------ for mcad.loop.notices

    def waits_in_queue(self, aw: AppWrapperView) -> bool:
        return self._is_queued(aw) and not self._draining(aw) and aw.key not in self.preemptors

    def draining(self, aw: AppWrapperView) -> bool:
        return self._draining(aw)

    def fit_of(self, aw: AppWrapperView, snapshot: Snapshot) -> Fit:
        need = snapshot.need(aw.key, aw.demand)
        reserving = self._pass
        if reserving is None or reserving.snapshot is not snapshot:
            return fits(aw, need, snapshot, self.targets)
        fit = reserving.fit(aw, need)
        if fit.fits:
            return fit
        about, why = reserving.explain(aw, need, fit)
        return Fit(False, about, why)

    # ---------------------------------------------------------------------------------- for mcad.model.reservations

    def lasting_room(self) -> Mapping[str, ResourceVector]:
        return self.accountant.lasting_room()

    def lasting_free(self) -> ResourceVector:
        return self.accountant.lasting_free()

    def start_bound(self, nodes: Collection[str] | None) -> datetime | None:
        latest = self.clock.now()
        for key in self.accountant.holders(nodes):
            aw = self._dispatched.get(key) or self.appwrappers.get(key)
            if aw is None or aw.scheduling.dispatch_limit_seconds <= 0:
                return None
            deadline = lifecycle.deadline_due(aw.scheduling, self._status(aw))
            if deadline is None:
                return None
            latest = max(latest, deadline)
        return latest

    def retrying(self, key: str) -> bool:
        return self.dispatches.waiting(key)

    def preempting(self, key: str) -> bool:
        return key in self.preemptors

    def _dispatch(self, aw: AppWrapperView, plan: Plan = (), cluster: str = "") -> None:
        """Reserve now, write in the background: the objects, then the Dispatched status (see ``_collect``).
        Hub mode: first the cleanup finalizer on the AppWrapper (nothing may exist in a worker without it), and
        the objects go into ``cluster``."""
        self._reserve(aw, plan)
        self.sites.placing(aw.key, cluster)
        reclaimed = aw.key in self.preemptors.reclaiming
        self.preemptors.dispatched(aw.key)
        if reclaimed:
            # Ones it held earlier in this cycle (they would have borrowed what it reclaimed) may go now.
            self.queue.add(DISPATCH)
        current = self._status(aw)
        wait = lifecycle.current_requeue_wait(aw.scheduling, current) if aw.scheduling.min_available > 0 else 0
        new = status.dispatched(current.raw(), self.clock.now(), priority=aw.priority, requeue_wait=wait,
                                cluster=cluster)
        self.dispatches.start(aw, new, cluster)

    def _collect(self, key: str) -> None:
        """Outcomes of background writes for one AppWrapper, in the order they finished."""
        for outcome in self.writes.results(key):
            if isinstance(outcome, Dispatched):
                self.dispatches.done(key, outcome)
            elif isinstance(outcome, Cleaned):
                self.sites.cleaned(key, outcome)
            elif isinstance(outcome, StatusWritten):
                self.statuses.written(key, outcome)
            elif isinstance(outcome, Ungated):
                self.pinning.done(outcome)
            elif isinstance(outcome, Exception):
                log.error("background write failed", appwrapper=key, error=repr(outcome))

    def dispatched(self, aw: AppWrapperView, current: AppWrapperView, new: Mapping[str, Any]) -> None:
        """Its objects exist (``mcad.loop.dispatches``): from here on it is dispatched for the loop, whether or not its
        status write lands at once (``mcad.loop.statussync``): a status write that fails never makes it dispatch
        again."""
        key = aw.key
        self.notices.reset(key)
        self._dispatched[key] = aw
        # Its pods may have come and started while the writes were under way (their events found it in flight).
        self.queue.add_after(keys.PodCounts(key), POD_COUNT_WINDOW_SECONDS)
        first = lifecycle.dispatched_at(self._status(aw)) is None
        self.write_status(aw, new)
        cluster = self.sites.where(key)
        log.info("dispatched", appwrapper=key, demand=aw.demand.format(), **({"cluster": cluster} if cluster else {}))
        where = f" in worker cluster {cluster}" if cluster else ""
        self.note(aw, "dispatched",
                  f"Its wrapped objects were created{where}; it reserves {aw.demand.format() or 'nothing'}.")
        created = lifecycle.parse_time(aw.created)
        if first and created is not None:
            # Creation to first dispatch; a requeued AppWrapper's later dispatches would say more about its
            # requeue wait than about the queue.
            self.metrics.dispatch_latency((self.clock.now() - created).total_seconds(),
                                          aw.spec.priority_class or str(aw.priority))
        self.follower.follow(current)
        self.pinning.dispatched(key)

    # ------------------------------------------------------------------------------------------ for mcad.loop.pinning

    def exists(self, key: str) -> bool:
        return self.appwrappers.get(key) is not None

    def pods_changed(self, key: str) -> None:
        self.queue.add(keys.PodCounts(key))

    def _api_recovered(self) -> None:
        """The API server answers again after failing: the dispatches and status writes that wait out a backoff
        most likely failed because it was away, so they go now instead of up to a backoff late."""
        self.dispatches.recovered()
        self.statuses.retry_all()

    def _delete_wrapped(self, aw: AppWrapperView, uids: tuple[str, ...] = ()) -> None:
        self.sites.delete_objects(aw, uids)

    def fail(self, aw: AppWrapperView, reason: str, message: str) -> None:
        log.warning("appwrapper failed", appwrapper=aw.key, reason=reason, message=message)
        self.note(aw, "failed", f"{reason}: {message}")
        self.write_status(aw, status.failed(self._status(aw).raw(), self.clock.now(), priority=aw.priority,
                                             reason=reason, message=message))

    def note(self, aw: AppWrapperView, decision: str, message: str) -> None:
        """A decision: counted, and told to the AppWrapper's owner as an Event."""
        self.metrics.decision(decision)
        self.event(aw, _EVENT_REASONS[decision], message)

    def event(self, aw: AppWrapperView, reason: str, message: str) -> None:
        # The recorder never blocks: it rate-limits and drops on its own (see mcad.k8s.events).
        self.recorder.record(events.ObjectRef(aw.api_version, KIND, aw.namespace, aw.name, aw.uid),
                             events.REASON_TYPES[reason], reason, message)

    def write_status(self, aw: AppWrapperView, new: Mapping[str, Any], *, urgent: bool = True) -> None:
        """Decide ``new`` as ``aw``'s status, unless it equals what the loop decided or saw last: later decisions
        build on it at once, and ``self.statuses`` writes it until it lands, whatever fails meanwhile."""
        view = StatusView.of(new)
        if view.state in FINAL_STATES:
            self._decided_final[aw.key] = aw.uid
        if view == self._status(aw):
            return
        self.statuses.want(aw, view, urgent=urgent)
