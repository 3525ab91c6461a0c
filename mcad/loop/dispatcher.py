"""The dispatcher loop: one thread that takes work-queue keys one by one and hands each to the owner it concerns.

Contract:
- Informer handlers and timers only enqueue keys (``mcad.model.keys``); this thread is the only one that reads them
  and the only one that reads or writes what is decided (the accountant and the owners in ``Owners``), so the hot
  path has no locks. Other threads read what the loop publishes (``LoopState`` for metrics, /debug snapshots built
  between two keys through ``call``) and never its maps. Each kind of key has one handler (``_handlers``); a key
  of no known kind is a bug: it is dropped with an error. Likewise each kind of write outcome (what a job of the
  write pool returned or raised, collected on its ``Written`` key) goes to the owner that submitted it
  (``_outcomes``, by the outcome's class or the nearest base listed); an outcome of no known kind is a bug, logged
  as an error and dropped.
- The loop builds nothing: ``mcad.wiring`` builds every owner and hands them over in ``Owners``. Each owner is
  handed the others it needs, so none calls back into this class; the loop only routes keys and runs the steps
  of a sync in order. Where objects go (this cluster, or in hub mode a worker) is the ``Sites``' business: the
  loop never asks which mode it is in.
- Nothing is decided before the AppWrapper, Node and Pod informers have all synced and the accountant has been
  rebuilt from them (``rebuild``), with a reservation for every AppWrapper already dispatched (a restart never
  dispatches past capacity while it catches up).
- A ``DISPATCH`` key (coalesced, so a burst of events costs one cycle) runs one dispatch cycle
  (``mcad.loop.cycle``). Capacity that frees up triggers a cycle at once; there are no timed sleeps.
- An AppWrapper's sync (``_sync_appwrapper``): gone, it is forgotten by every owner and its objects are cleaned
  up (``Sites.deleted``); in its retry pause after a reset, it is left there (``mcad.loop.health``); queued, it
  is failed when its spec or namespace forbids it, else queued (``mcad.loop.queued``); in a final state, what it
  holds is released by the one rule for that (``Active.release_final``), and its objects are cleaned up on time
  (``mcad.loop.health``); dispatched,
  it is adopted, followed and its health checked (``mcad.loop.active``, ``mcad.loop.follower``,
  ``mcad.loop.health``). A node whose facts change makes the AppWrappers on it look again.
- Status is not proof of a final state: what a final state releases is ``Active.release_final``'s to decide, at a
  sync and at the ``rebuild``, which reads the pods first so that the rule holds after a restart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from mcad.api.appwrapper import ACTIVE_STATES, FINAL_STATES, AppWrapperView
from mcad.api.views import NodeView, PodView
from mcad.clock import Clock
from mcad.k8s.dispatchjob import Dispatched
from mcad.k8s.informer import Store
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.wrapped import WrappedObjects
from mcad.loop.fairsharing import SAVE_INTERVAL_SECONDS
from mcad.loop.loopcalls import LoopCalls
from mcad.loop.owners import Owners, Settings
from mcad.loop.pinning import Ungated
from mcad.loop.quotastatus import QUOTA_STATUS_WINDOW_SECONDS
from mcad.loop.sites import Cleaned
from mcad.loop.statussync import StatusWritten
from mcad.loop.view import LoopView
from mcad.metrics import PUBLISH_INTERVAL_SECONDS, LoopState, Metrics
from mcad.model import keys, status
from mcad.model import quota as quota_trees
from mcad.model.keys import DISPATCH, PUBLISH, QUOTA, QUOTA_STATUS, AppWrapperEvent, Key

R = TypeVar("R")
T = TypeVar("T")
# A key that held the loop this long is logged (info): every key behind it, a new AppWrapper's included, waited.
SLOW_KEY_SECONDS = 0.1
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
    def __init__(self, owners: Owners, settings: Settings, *, appwrappers: Store[AppWrapperView],
                 nodes: Store[NodeView], pods: Store[PodView], queue: WorkQueue[Key], clock: Clock, metrics: Metrics,
                 quota_subtrees: Store[quota_trees.SubtreeView] | None = None,
                 wrapped: WrappedObjects | None = None) -> None:
        self.appwrappers, self.nodes, self.pods, self.quota_subtrees = appwrappers, nodes, pods, quota_subtrees
        self.wrapped = wrapped  # informers over wrapped kinds (this cluster's), stopped with the controller
        self.queue, self.clock, self.metrics = queue, clock, metrics
        self.owners, self.settings = owners, settings
        # What /debug and the metrics read of the loop (answers, never the owners), between two keys.
        self.view = LoopView(owners, settings, appwrappers, clock)
        # Set once the ledger is rebuilt from synced informers: from then on decisions (and /debug reads) are valid.
        self.running = threading.Event()
        self.calls = LoopCalls(queue)  # /debug reads, run on this thread between two keys
        # For scrapes (mcad.metrics): what the loop published last, and when; a Publish key is due.
        self.published = LoopState()
        self._published_at = float("-inf")
        self._publish_due = False
        self._handlers = self._handler_table()
        self._outcomes = self._outcome_table()
        appwrappers.add_handler(lambda _t, old, new: queue.add(AppWrapperEvent(either(new, old).key)))
        nodes.add_handler(lambda _t, old, new: queue.add(keys.NodeEvent(either(new, old).name)))
        pods.add_handler(lambda _t, old, new: queue.add(keys.PodEvent(either(new, old).uid)))
        if quota_subtrees is not None:
            quota_subtrees.add_handler(lambda _t, _old, _new: queue.add(QUOTA))

    @property
    def cycles(self) -> int:
        return self.owners.cycle.count

    @property
    def preemptions(self) -> int:
        """Victims evicted so far (priority preemption and quota reclaim)."""
        return self.owners.preemptors.evicted

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
        if self.owners.fair is not None:
            self.owners.fair.save(now_here=True)  # a stop (a rollout, a new leader) loses none of the usage
        self.owners.writes.close()

    def start(self) -> None:
        """Once the informers have synced: start the write pool, rebuild the ledger and ask for the first cycle."""
        self.owners.writes.start()
        self.rebuild()
        self.running.set()
        self.owners.sites.start()
        # Gated pods, and pinned ones not bound yet, are looked at once the ledger is whole.
        for pod in self.pods.list():
            if pod.pin is not None:
                self.queue.add(keys.PodEvent(pod.uid))
        self.queue.add(DISPATCH)
        if self.owners.fair is not None:
            self.owners.fair.load()  # before the first cycle: after a restart or a change of leader
            if self.owners.fair.stored:
                self.queue.add_after(keys.FAIR_SHARE_SAVE, SAVE_INTERVAL_SECONDS)
        ledger = self.owners.accountant.ledger
        log.info("dispatcher started", appwrappers=len(self.appwrappers), nodes=len(self.nodes),
                 pods=len(self.pods), capacity=ledger.capacity().format(), free=ledger.free().format())

    def process_next(self, timeout: float | None = None) -> Key | None:
        """Take one key (waiting up to ``timeout``), process it and settle its retry state; None if none came."""
        key, _ = self.queue.get(timeout)
        if key is None:
            return None
        started = self.clock.monotonic()
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
            if (took := self.clock.monotonic() - started) >= SLOW_KEY_SECONDS:  # every key behind it waited
                log.info("slow work-queue key", key=type(key).__name__, ms=round(took * 1000, 1))
        return key

    def process(self, key: Key) -> None:
        handler = self._handlers.get(type(key))
        if handler is None:
            raise UnknownKey(f"the dispatcher has no handler for work-queue key {key!r}")
        handler(key)

    def _handler_table(self) -> dict[type[Any], Callable[[Any], None]]:
        """What each kind of key (``mcad.model.keys``) means, and the sites' own kinds (hub mode's)."""
        o = self.owners
        statuses = o.decisions.sync
        return {
            keys.PodEvent: lambda k: self._sync_pod(k.uid),
            keys.NodeEvent: lambda k: self._sync_node(k.name),
            AppWrapperEvent: lambda k: self._sync_appwrapper(k.appwrapper),
            keys.Written: lambda k: self._collect(k.appwrapper),
            keys.StatusRetry: lambda k: statuses.retry(k.appwrapper),
            keys.BackoffStatus: lambda _k: statuses.pace_due(),
            keys.DispatchRetry: lambda k: o.dispatches.retry_due(k.appwrapper),
            keys.MinAvailableCheck: lambda k: o.follower.check_min_available(k.appwrapper),
            keys.DeadlineCheck: lambda k: o.follower.check_deadline(k.appwrapper),
            keys.PodCounts: lambda k: o.follower.pod_counts_due(k.appwrapper),
            keys.HealthDue: lambda k: o.health.due(k.appwrapper),
            keys.Recovered: lambda _k: self._recovered(),
            keys.Call: lambda _k: self.calls.run(),
            keys.QuotaChanged: lambda _k: self._sync_quota(),
            keys.QuotaStatus: lambda _k: o.quota_status.write() if o.quota_status is not None else None,
            keys.Dispatch: lambda _k: o.cycle.run(),
            keys.RoomFreed: lambda _k: o.cycle.run_paced(),
            keys.FairShareSave: lambda _k: self._save_fair_share(),
            keys.CycleDue: lambda _k: o.cycle.run(),
            keys.EstimatesDue: lambda _k: o.cycle.estimates_due(),
            keys.Publish: lambda _k: self._publish(),
            **o.sites.handlers(),
        }

    def _outcome_table(self) -> dict[type[Any], Callable[[str, Any], None]]:
        """What each kind of write outcome (``mcad.k8s.writes``) means: the owner it goes to, with its key."""
        o = self.owners
        return {
            Dispatched: o.dispatches.done,
            Cleaned: o.sites.cleaned,
            StatusWritten: o.decisions.sync.written,
            Ungated: lambda _key, outcome: o.pinning.done(outcome),
            type(None): lambda _key, _outcome: None,  # a job with nothing to report: deletes, QuotaSubtree status
            Exception: lambda key, err: log.error("background write failed", appwrapper=key, error=repr(err)),
        }

    def _save_fair_share(self) -> None:
        if self.owners.fair is not None:
            self.owners.fair.save()
            self.queue.add_after(keys.FAIR_SHARE_SAVE, SAVE_INTERVAL_SECONDS)

    def _recovered(self) -> None:
        """The API server answers again: what waits out a backoff most likely failed because it was away."""
        self.owners.dispatches.recovered()
        self.owners.decisions.sync.retry_all()

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
        for cluster in self.owners.sites.placed().values():
            placed[cluster] = placed.get(cluster, 0) + 1
        o = self.owners
        ledger = o.accountant.ledger
        self.published = LoopState(
            capacity=(ledger.capacity(), ledger.in_use(), ledger.reserved(), ledger.free()),
            queue={"queued": len(o.queued.pending), "dispatching": len(o.dispatches.in_flight),
                   "preempting": len(o.preemptors)},
            decided=o.decisions.sync.decided_states(), placed=placed, reservations=len(o.reservations.held),
            backoff_statuses_waiting=o.decisions.sync.paced_count(), gated=o.pinning.counts())

    def call(self, fn: Callable[[], R], timeout: float) -> R:
        """Run ``fn`` on the dispatcher thread, the only one that may read its state (``mcad.loop.loopcalls``)."""
        return self.calls.call(fn, timeout)

    def rebuild(self) -> None:
        """Ledger from the synced stores: nodes, pods, and the reservations of dispatched AppWrappers."""
        # Before the pods: a pod counts for its AppWrapper only where the AppWrapper is placed.
        for aw in self.appwrappers.list():
            self.owners.sites.adopt(aw)
        for node in self.nodes.list():
            self.owners.accountant.observe_node(node)
        for pod in self.pods.list():
            self.owners.accountant.observe_pod(self.owners.ownership.claim(self.owners.sites.claim(pod)))
        if self.owners.quota_status is not None:
            self.owners.quota_status.read_forest()
        for aw in self.appwrappers.list():
            current = self.owners.decisions.status(aw)
            if current.canrun and current.state in ACTIVE_STATES:
                self.owners.active.reserve(aw)
            elif current.resetting_since:
                self.owners.active.reserve(aw)  # in its retry pause: its room stays held (``mcad.loop.health``)
            elif current.state in FINAL_STATES:
                # After the pods: those still running keep it charged.
                self.owners.active.release_final(aw, current.state)
            elif self.owners.queued.is_queued(aw) and aw.namespace not in self.settings.protected_namespaces:
                self.owners.queued.enqueue(aw)  # a protected one is failed by its sync, never queued
        if self.settings.fit == "nodes":
            # Plans of dispatched AppWrappers whose pods are not all bound yet: their unbound pods, placed again on
            # the room left (where the scheduler will put them is not known; this keeps their room from being
            # promised twice).
            snapshot = self.owners.cycle.snapshot()
            for key in self.owners.accountant.ledger.reserved_keys():
                held = self.appwrappers.get(key)
                if held is not None and self.owners.accountant.ledger.reservation(key):
                    nodes = self.owners.accountant.home_nodes(held, self.owners.targets.nodes_for(key, snapshot))
                    self.owners.accountant.replan(key, held.gang, nodes, snapshot)

    # ------------------------------------------------------------------------------------------ key handlers

    def _collect(self, key: str) -> None:
        """Outcomes of background writes for one AppWrapper (or pod, or QuotaSubtree), in the order they finished,
        each to its owner (``_outcomes``)."""
        for outcome in self.owners.writes.results(key):
            handler = next((self._outcomes[kind] for kind in type(outcome).__mro__ if kind in self._outcomes), None)
            if handler is None:  # a bug where the job was written: it returned what nobody reads
                log.error("a write outcome of no known kind: dropped", appwrapper=key, outcome=repr(outcome))
                continue
            handler(key, outcome)

    def _sync_quota(self) -> None:
        """A QuotaSubtree changed: rebuild the forest, re-derive every charge, and look at the queue again (queued
        AppWrappers may be charged elsewhere now: a default node appeared, a tree went away)."""
        if self.owners.quota_status is None or not self.running.is_set():
            return
        self.owners.quota_status.read_forest()
        for key in list(self.owners.queued.pending.ordered()):
            aw = self.appwrappers.get(key)
            if aw is not None:
                self.owners.queued.enqueue(aw)
        self.owners.notices.groups_changed()
        self.queue.add(DISPATCH)
        self.queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)

    def _sync_pod(self, uid: str) -> None:
        pod = self.pods.get(uid)
        if pod is None:
            owner = self.owners.accountant.forget_pod(uid)
            labelled = self.owners.ownership.forget(uid)
            self.owners.pinning.forget(uid, owner or labelled)
            if owner:
                self.queue.add(AppWrapperEvent(owner))
            self.owners.active.capacity_may_have_grown()
            return
        # Hub mode: a pod in a worker its AppWrapper is not placed in is nobody's.
        claimed = self.owners.sites.claim(pod)
        # A pod its AppWrapper's objects did not make is nobody's, whatever its label says (mcad.loop.ownership).
        counted = self.owners.ownership.claim(claimed)
        self.owners.accountant.observe_pod(counted)
        self.owners.pinning.observe(claimed)
        if counted.appwrapper:
            self.queue.add(AppWrapperEvent(counted.appwrapper))
            if counted.appwrapper in self.owners.queued.pending:
                waiting = self.appwrappers.get(counted.appwrapper)
                if waiting is not None:
                    self.owners.queued.enqueue(waiting)  # its own pods now count: it may need its own group
        if pod.terminal or pod.deleting:
            self.owners.active.capacity_may_have_grown()

    def _sync_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            self._tell_holders(name)
            self.owners.accountant.forget_node(name)
            self.owners.pinning.node_changed(name)
            return
        # Status heartbeats change nothing we count; only new or changed capacity deserves a cycle.
        if self.owners.accountant.observe_node(node):
            self.owners.active.capacity_may_have_grown()
            self.owners.pinning.node_changed(name)
            self._tell_holders(name)

    def _tell_holders(self, node: str) -> None:
        """The AppWrappers with pods on a node whose health, readiness or cordon may have changed look again."""
        for key in self.owners.accountant.holders({node}):
            self.queue.add(AppWrapperEvent(key))

    def _sync_appwrapper(self, key: str) -> None:
        # An object above some of its pods arrived, or an informer synced: pods whose verdict changed count anew.
        for uid in self.owners.ownership.recheck(key):
            self.queue.add(keys.PodEvent(uid))
        aw = self.appwrappers.get(key)
        if (aw is None or aw.deleting) and (key in self.owners.queued.pending or key in self.owners.preemptors):
            # One that waited in the queue may have held others back (strict FIFO, a preemptor): look again.
            self.queue.add(DISPATCH)
        if aw is None or aw.deleting:
            gone, uids = self.owners.active.views.get(key), self.owners.active.object_uids(key)
            self._forget(key)
            self.owners.sites.deleted(key, aw, gone, uids)
            return
        if key in self.owners.dispatches:
            return  # its dispatch writes are under way; their outcome decides
        previous = self.owners.active.views.get(key)
        if previous is not None and previous.uid != aw.uid:
            # Deleted and re-created under the same name while we were not looking: clean up the old one.
            self.owners.sites.delete_objects(previous, self.owners.active.object_uids(key))
            self._forget(key)
        # Drops a decision the informer now shows, and re-drives a status write that failed (this event may be
        # its pods or objects changing, long after the write gave up).
        self.owners.decisions.sync.observed(aw)
        if self.owners.health.paused(aw):
            # It pauses after a reset, holding its room; queued when the pause ends.
            self.owners.queued.pending.remove(key)
            return
        if self.owners.queued.is_queued(aw):
            self._sync_queued(aw)
            return
        self.owners.queued.pending.remove(key)
        state = self.owners.decisions.state(aw)
        if state in FINAL_STATES:
            self.owners.active.release_final(aw, state)
            self.owners.health.finished(aw)
            return
        self.owners.active.adopt(aw)
        self.owners.follower.follow(aw)
        self.owners.health.check(aw)

    def _sync_queued(self, aw: AppWrapperView) -> None:
        """A queued AppWrapper: failed when its spec or namespace forbids it, else in the queue at its place."""
        if aw.demand_error:
            self.owners.queued.pending.remove(aw.key)
            self.owners.decisions.fail(aw, status.INVALID_SPEC, aw.demand_error)
            self.owners.health.finished(aw)  # delete-when-finished: its timer starts with the failure
        elif aw.namespace in self.settings.protected_namespaces:
            self.owners.queued.pending.remove(aw.key)
            self.owners.decisions.fail(aw, status.PROTECTED_NAMESPACE, protected_namespace_message(aw.namespace))
            self.owners.health.finished(aw)
        elif self.owners.queued.enqueue(aw):
            # New arrivals and changed ones need a decision; our own status writes coming back do not.
            self.queue.add(DISPATCH)

    def _forget(self, key: str) -> None:
        """It is gone: every owner drops what it kept for it."""
        self.owners.active.forget(key)
        self.owners.decisions.forget(key)
        self.owners.reservations.forget(key)
        self.owners.preemptors.forget(key)
        self.owners.evictions.forget(key)
        self.owners.dispatches.forget(key)
        self.owners.notices.forget(key)
        self.owners.queued.forget(key)
        self.owners.targets.forget(key)
