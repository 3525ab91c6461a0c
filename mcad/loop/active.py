"""The dispatched AppWrappers: what each holds in the accountant, and how it stops holding it.

Contract (dispatcher thread only; built by ``mcad.wiring``, which then ``connect``s the sites and the watchers,
since those are built with this owner in hand):
- ``reserve(aw, plan)`` takes its capacity, plan and quota charges; ``release(key)`` gives them back. With quota
  trees, either one schedules the QuotaSubtree usage write.
- ``dispatched(aw, current, new, uids)``: its objects exist (``mcad.loop.dispatches``): from here on it is
  dispatched for the loop, whether or not its status write lands at once; a Dispatched Event, the dispatch
  latency of its first dispatch, the topology levels it asked for (each dispatch), and its watchers
  (``mcad.loop.follower``, ``mcad.loop.pinning``) are told.
- ``adopt(aw)``: an AppWrapper found dispatched at a sync (a restart, a status that landed) holds its reservation.
- ``reset`` (objects deleted, its room held while it pauses), ``finish`` (a final state, released at once),
  ``requeue`` (objects deleted, back in the queue at its place, draining until its old pods are gone) and
  ``requeue_keeping_count`` (requeued for another's sake: a preemptor,
  a reclaim, a worker gone) take it back; ``forget`` drops it when it is gone. Each tells the watchers it no
  longer holds anything (``undispatched``).
- ``release_final(aw, state)`` is the one rule for what a final state (Completed, Failed) releases, applied
  wherever one is found (an AppWrapper's sync, the rebuild after a restart). Status is not proof: what ``aw``
  holds (reservation, plan, quota charges) goes when this loop decided that state for this very incarnation
  (``Decisions.decided_final``) or none of its pods still runs; otherwise it keeps what it holds, or takes it again
  (after a restart nothing is known to be decided here), and a StatusNotDecided Event says so once
  (``Decisions.tell_undecided``). Released room asks for a cycle. ``finish`` decides a final state here, so it
  releases at once.
- ``lasting_room``, ``lasting_free`` and ``start_bound`` tell reservations (``mcad.model.reservations.Horizon``)
  what running work leaves behind, and by when.
- Capacity that may have grown asks for a dispatch cycle (coalesced) when one has something to do.

Who calls it: the dispatcher's key handlers, dispatches, the follower, evictions, pinning and the hub's sites.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

import structlog

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.clock import Clock
from mcad.k8s.informer import Store
from mcad.k8s.workqueue import WorkQueue
from mcad.loop.decisions import Decisions
from mcad.loop.notices import Notices
from mcad.loop.queued import Queued
from mcad.loop.quotastatus import QUOTA_STATUS_WINDOW_SECONDS
from mcad.loop.sites import Sites
from mcad.metrics import Metrics
from mcad.model import keys, lifecycle, status, topologyasked
from mcad.model.accounting import Accountant
from mcad.model.keys import DISPATCH, QUOTA_STATUS, ROOM_FREED, Key
from mcad.model.plans import Plan

log = structlog.get_logger("mcad.loop.dispatcher")

# Pod counts in a dispatched AppWrapper's status are written at most once per this window, in the writers' low
# priority lane: a gang's pods move through Pending and Running within moments, one write for all of it is enough,
# and API server capacity is better spent creating the next gang.
POD_COUNT_WINDOW_SECONDS = 5.0


class Watcher(Protocol):
    """An owner that keeps state per dispatched AppWrapper."""

    def dispatched(self, aw: AppWrapperView) -> None:
        """Its objects exist now (``aw``: its current view)."""
        ...

    def undispatched(self, key: str) -> None:
        """It holds no plan any more: finished, requeued or gone."""
        ...


class Active:
    def __init__(self, appwrappers: Store[AppWrapperView], accountant: Accountant, decisions: Decisions,
                 queued: Queued, notices: Notices, *, queue: WorkQueue[Key], clock: Clock, metrics: Metrics) -> None:
        self._appwrappers = appwrappers
        self._accountant = accountant
        self._decisions = decisions
        self._queued = queued
        self._notices = notices
        self._queue = queue
        self._clock = clock
        self._metrics = metrics
        self._sites: Sites | None = None
        self._watchers: tuple[Watcher, ...] = ()
        self._placing: Callable[[], bool] = lambda: False
        # The last view of each dispatched AppWrapper: once it is deleted, its items say what to clean up.
        self.views: dict[str, AppWrapperView] = {}
        # uids of the objects created for each dispatched AppWrapper (unknown after a restart).
        self._uids: dict[str, tuple[str, ...]] = {}
        # How many AppWrappers were adopted (followed without being dispatched here, so not told to the watchers):
        # a reader of ``views`` that keeps its own record of them (``FairSharing``) compares only when this moved.
        self.adoptions = 0

    def connect(self, sites: Sites, watchers: Sequence[Watcher], placing: Callable[[], bool]) -> None:
        """``placing``: pods beyond their plans wait to be placed (``Pinning.placing``), which a cycle does."""
        self._sites = sites
        self._watchers = tuple(watchers)
        self._placing = placing

    @property
    def sites(self) -> Sites:
        assert self._sites is not None, "mcad.wiring connects the sites before the loop runs"
        return self._sites

    # -- what it holds ---------------------------------------------------------------------------------------------

    def reserve(self, aw: AppWrapperView, plan: Plan = ()) -> None:
        self._accountant.assume(aw.key, aw.demand, aw.labels, plan)
        if self._accountant.quota is not None:
            self._queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)

    def release(self, key: str) -> bool:
        """Its reservation, plan and charges go; True if it held any."""
        held = self._accountant.forget(key)
        if held and self._accountant.quota is not None:
            self._queue.add_after(QUOTA_STATUS, QUOTA_STATUS_WINDOW_SECONDS)
        return held

    def capacity_may_have_grown(self) -> None:
        """A cycle, if one has anything to do: something waits in the queue, or pods wait to be placed. Paced
        (``mcad.loop.cycle``): under churn room frees many times a second, and one cycle can use all of it."""
        if self._queued.pending or self._placing():
            self._queue.add(ROOM_FREED)

    def object_uids(self, key: str) -> tuple[str, ...]:
        return self._uids.get(key, ())

    # -- the horizon of reservations (mcad.model.reservations.Horizon) ---------------------------------------------

    def lasting_room(self) -> Mapping[str, ResourceVector]:
        return self._accountant.ledger.lasting_room_by_node()

    def lasting_free(self) -> ResourceVector:
        return self._accountant.ledger.lasting_free()

    def start_bound(self, nodes: Collection[str] | None, ignoring: Collection[str] = ()) -> datetime | None:
        """When every AppWrapper holding room on ``nodes`` (None: anywhere), but those in ``ignoring``, is sure to
        be gone: the latest of their dispatch deadlines, at least now; None when one of them has none."""
        latest = self._clock.now()
        for key in self._accountant.holders(nodes):
            if key in ignoring:
                continue
            aw = self.views.get(key) or self._appwrappers.get(key)
            if aw is None or aw.scheduling.dispatch_limit_seconds <= 0:
                return None
            deadline = lifecycle.deadline_due(aw.scheduling, self._decisions.status(aw))
            if deadline is None:
                return None
            latest = max(latest, deadline)
        return latest

    # -- becoming dispatched ---------------------------------------------------------------------------------------

    def dispatched(self, aw: AppWrapperView, current: AppWrapperView, new: Mapping[str, Any],
                   uids: tuple[str, ...]) -> None:
        key = aw.key
        self._uids[key] = uids
        self._notices.reset(key)
        self.views[key] = aw
        # Its pods may have come and started while the writes were under way (their events found it in flight).
        self._queue.add_after(keys.PodCounts(key), POD_COUNT_WINDOW_SECONDS)
        first = lifecycle.dispatched_at(self._decisions.status(aw)) is None
        self._decisions.decide(aw, new)
        cluster = self.sites.where(key)
        log.info("dispatched", appwrapper=key, demand=aw.demand.format(), **({"cluster": cluster} if cluster else {}))
        where = f" in worker cluster {cluster}" if cluster else ""
        self._decisions.note(aw, "dispatched",
                             f"Its wrapped objects were created{where}; it reserves {aw.demand.format() or 'nothing'}.")
        asked = topologyasked.asked(aw)
        if asked:
            self._metrics.topology_placed(asked)
        created = lifecycle.parse_time(aw.created)
        if first and created is not None:
            # Creation to first dispatch; a requeued AppWrapper's later dispatches would say more about its
            # requeue wait than about the queue.
            self._metrics.dispatch_latency((self._clock.now() - created).total_seconds(),
                                           aw.spec.priority_class or str(aw.priority))
        for watcher in self._watchers:
            watcher.dispatched(current)

    def adopt(self, aw: AppWrapperView) -> None:
        """Found active at a sync: it holds its reservation (taken again after a restart) and is followed."""
        if not self._accountant.holds(aw.key):
            self.reserve(aw)
        if aw.key not in self.views:
            self.adoptions += 1
        self.views[aw.key] = aw
        self._queue.add_after(keys.PodCounts(aw.key), POD_COUNT_WINDOW_SECONDS)

    def release_final(self, aw: AppWrapperView, state: str) -> None:
        """``aw`` is found in the final ``state``: what it holds goes, unless that state was not decided here while
        its pods still run; then it keeps (or takes again) its reservation, and says why once (module docstring)."""
        if not self._decisions.decided_final(aw):
            running = self._accountant.live_pods(aw.key)
            if running:
                if not self._accountant.holds(aw.key):
                    self.reserve(aw)
                self._decisions.tell_undecided(aw, state, len(running))
                return
        if self.release(aw.key):
            self.capacity_may_have_grown()

    # -- taken back --------------------------------------------------------------------------------------------------

    def finish(self, aw: AppWrapperView, new: Mapping[str, Any], *, stop: bool = False) -> None:
        """A final state: written, its reservation released at once; ``stop`` also deletes its objects."""
        self._decisions.decide(aw, new)
        if stop:
            self.sites.delete_objects(aw, self.object_uids(aw.key))
        self.undispatch(aw.key)

    def requeue_keeping_count(self, aw: AppWrapperView, reason: str, message: str) -> None:
        current = self._decisions.status(aw)
        self.requeue(aw, reason, message, requeuings=current.requeuings, requeue_wait=current.requeue_wait)

    def requeue(self, aw: AppWrapperView, reason: str, message: str, *, requeuings: int, requeue_wait: int) -> None:
        key = aw.key
        log.info("appwrapper requeued", appwrapper=key, reason=reason, message=message, requeuings=requeuings)
        preempted = reason in (status.PREEMPTED_BY_PRIORITY, status.PREEMPTED_BY_QUOTA_RECLAIM)
        self._decisions.note(aw, "preempted" if preempted else "requeued", message)
        self._decisions.decide(aw, status.requeued(self._decisions.status(aw).raw(), self._clock.now(),
                                                   priority=aw.priority, reason=reason, message=message,
                                                   requeuings=requeuings, requeue_wait=requeue_wait))
        self.sites.delete_objects(aw, self._uids.pop(key, ()))
        self.undispatch(key)
        self._notices.reset(key)
        if aw.demand_error:
            # Dispatched before its spec was refused (a bound added since): it is not dispatched again.
            self._decisions.fail(aw, status.INVALID_SPEC, aw.demand_error)
            return
        self._queued.enqueue(aw)
        # Its Backoff tells of the requeue; once it waits like the rest, say what it waits for (mcad.loop.notices).
        self._queued.announce_later(key)
        self._queue.add(DISPATCH)

    def reset(self, aw: AppWrapperView, new: Mapping[str, Any], hold: Plan) -> None:
        """A reset (``mcad.loop.health``): ``new`` written, its objects deleted, and while it pauses its room held
        (``hold``: where its pods ran, less sick nodes; aggregate when empty). It is not queued: once its pause
        ends the health owner releases the hold and queues it, at its place."""
        key = aw.key
        self._decisions.decide(aw, new)
        self.sites.delete_objects(aw, self._uids.pop(key, ()))
        self.undispatch(key)
        self._notices.reset(key)
        self.reserve(aw, hold)

    def undispatch(self, key: str) -> None:
        """It no longer holds capacity: its plan, timers and reservation go (its pods count while they exist)."""
        self.views.pop(key, None)
        for watcher in self._watchers:
            watcher.undispatched(key)
        if self.release(key):
            self.capacity_may_have_grown()

    def forget(self, key: str) -> None:
        self.undispatch(key)
        self._uids.pop(key, None)
