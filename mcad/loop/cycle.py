"""One dispatch cycle: the one pass over the queue, acted on: what fits is dispatched, the rest told why it waits.

Contract (dispatcher thread only; built by ``mcad.wiring`` with the owners each step calls on, in one frozen
``CycleOwners``, and the loop's ``LoopTools``):
``run()`` is one pass over the queued AppWrappers in dispatch order (priority, creation time, name), one candidate
per demand group (the next of a group too when its candidate took a reservation and more are left):
1. Snapshot the free room (``Accountant.snapshot``); pods of dispatched AppWrappers beyond their plans are placed
   first (``mcad.loop.pinning``); the pass (``mcad.model.reservations.Pass``) takes from its copy as it
   dispatches, and as blocked ones take reservations.
2. Walk the queue (``mcad.model.walk``: every scheduling rule, written once) with ``WalkRules`` that act: one that
   fits is dispatched (``dispatch``: reserved now, the targets told where it went (``Targets.dispatched``: its
   home, should a reset requeue it), its objects written in the background by ``mcad.loop.dispatches``); one for
   which victims go away (``mcad.loop.evictions`` evicts them) holds the queue and ends the pass; the verdicts of
   those that wait are kept, with the reservations they took.
3. After the pass: drop the dispatched (and the gone) from the queue, tell those that wait (``mcad.loop.notices``,
   handed the pass explicitly: it judges members and newcomers against the same reservations; why they wait is
   told once the dispatched ones left, so positions are right), and announce the newcomers.

``run_paced()`` is the cycle room that freed asks for (the ROOM_FREED key): at once, or, within ``interval``
seconds (``--cycle-interval``) of the last cycle's start, one cycle at the interval's end for all such asks.

``estimates_due()`` (the ESTIMATES_DUE key) tells queued AppWrappers their expected start in their status
(``Notices.tell_estimates``, from ``assess()``'s estimates): ``ESTIMATE_INTERVAL_SECONDS`` after a cycle found the
queue not empty, and again each interval while an estimate that moved waits out its minute. One dry run per
interval at most, whatever the rate of cycles, and none while nothing changes; which of them are written is
``mcad.model.estimatetold``'s rule.

``assess()`` is the same walk with rules that peek (``Evictions.peek``) over a snapshot whose quota ledger is a
scratch copy, deciding nothing (``mcad.model.assess``, for explain, /debug, the dashboard and mcadctl).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

import structlog

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.k8s.informer import Store
from mcad.loop.active import Active
from mcad.loop.decisions import Decisions
from mcad.loop.dispatches import Dispatches
from mcad.loop.evictions import Evictions
from mcad.loop.fairsharing import FairSharing
from mcad.loop.notices import Notices
from mcad.loop.pinning import Pinning
from mcad.loop.queued import Queued
from mcad.loop.sites import Sites
from mcad.loop.tools import LoopTools
from mcad.model import lifecycle, status
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.assess import QueueAssessment, assess
from mcad.model.estimate import ESTIMATED, Estimate, Holder, Waiter, estimate_starts
from mcad.model.fit import Fit, Targets
from mcad.model.keys import DISPATCH, ESTIMATES_DUE, ROOM_FREED
from mcad.model.preemption import Preemptors, Room
from mcad.model.reservations import BEHIND, Pass, Reservations
from mcad.model.walk import BEHIND_IN_DOMAIN, GONE, HOLDS, WAITS, walk, worded_for
from mcad.model.walk import DISPATCH as DISPATCHED

log = structlog.get_logger("mcad.loop.dispatcher")

Waiting = tuple[AppWrapperView, frozenset[str], Callable[[], str]]

# How often queued AppWrappers' expected starts are judged again for their status while cycles run: an arrival's
# first estimate is written within this long (paced). A dry run costs about what a cycle does (under churn with quota
# reclaim, one every 5 s took an eighth of the controller's CPU); a write is at most once a minute anyway.
ESTIMATE_INTERVAL_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class CycleOwners:
    """Every owner the cycle's steps call on (see the module docstring), and the AppWrappers it reads."""

    appwrappers: Store[AppWrapperView]
    accountant: Accountant
    queued: Queued
    active: Active
    decisions: Decisions
    dispatches: Dispatches
    evictions: Evictions
    reservations: Reservations
    notices: Notices
    pinning: Pinning
    sites: Sites
    preemptors: Preemptors
    targets: Targets
    fair: FairSharing | None = None


class DispatchCycle:
    def __init__(self, owners: CycleOwners, tools: LoopTools, *, strict_fifo: bool, by_nodes: bool,
                 interval: float = 0.0) -> None:
        self._appwrappers = owners.appwrappers
        self._accountant = owners.accountant
        self._queued = owners.queued
        self._pending = owners.queued.pending
        self._active = owners.active
        self._decisions = owners.decisions
        self._dispatches = owners.dispatches
        self._evictions = owners.evictions
        self._reservations = owners.reservations
        self._notices = owners.notices
        self._pinning = owners.pinning
        self._sites = owners.sites
        self._preemptors = owners.preemptors
        self._targets = owners.targets
        self._fair = owners.fair
        self._queue = tools.queue
        self._clock = tools.clock
        self._metrics = tools.metrics
        self._strict_fifo = strict_fifo
        self._by_nodes = by_nodes
        self._interval = interval
        self._last_started = float("-inf")
        self.count = 0
        self.deferred = 0  # asks for a cycle that came within the interval and were folded into the next one
        self._estimates_timer = False  # an ESTIMATES_DUE key is due

    def snapshot(self, *, scratch_quota: bool = False) -> Snapshot:
        return self._accountant.snapshot(by_nodes=self._by_nodes, scratch_quota=scratch_quota)

    def run_paced(self) -> None:
        """A cycle for room that freed: now, or, within ``interval`` seconds of the last cycle's start, then (the
        asks between are folded into it: the ROOM_FREED key is coalesced). New arrivals and everything else ask
        ``run`` (the DISPATCH key) and are judged at once: pacing costs freed room at most ``interval`` of idling,
        never a newcomer's wait on an idle cluster."""
        wait = self._last_started + self._interval - self._clock.monotonic()
        if wait > 0:
            self.deferred += 1
            # One coalesced key: every ask for freed room until then is folded into this one timer.
            self._queue.add_after(ROOM_FREED, wait)
            return
        self.run()

    def run(self) -> None:
        self._last_started = self._clock.monotonic()
        started = time.perf_counter()
        self.count += 1
        snapshot = self.snapshot()  # 1
        self._pinning.place_extras(snapshot, {key: r.nodes for key, r in self._reservations.held.items()})
        reserving = self._reservations.start(snapshot, self._clock.now(),
                                             fair=self._fair.begin(snapshot, act=True) if self._fair else None)
        alike: dict[str, list[str]] = {}  # fair sharing: heads of groups judged alike to another's, by it (walk)
        done, waiting, held_by, visited, dispatched = self._pass(reserving, alike)  # 2
        reserving.finish()
        for key in done:  # 3
            self._pending.remove(key)
        self._tell(reserving, waiting, held_by, alike)
        self._estimates_later()
        self._metrics.cycle(time.perf_counter() - started)
        log.info("dispatch cycle", cycle=self.count, queued=len(self._pending), dispatched=dispatched,
                 visited=visited, reservations=len(reserving.made), free=snapshot.free.format(),
                 duration_ms=round((time.perf_counter() - started) * 1000, 2))

    def _pass(self, reserving: Pass, alike: dict[str, list[str]]) -> tuple[list[str], list[Waiting], str, int, int]:
        """Step 2: the one pass (``mcad.model.walk``) with rules that act. Returns the keys to drop from the
        queue (dispatched, or gone), those that wait, the preemptor that stopped the pass by holding the queue (if
        one did), how many were visited and dispatched; ``alike`` gets the heads the pass dropped, under the key of
        the one they are judged alike to (that one is among those that wait)."""
        done: list[str] = []
        waiting: list[Waiting] = []
        held_by = ""
        visited = dispatched = 0
        rules = WalkRules(self._queued, self._dispatches, self._evictions,
                          self.dispatch)
        for verdict in walk(self._pending, self._appwrappers, reserving, rules, strict_fifo=self._strict_fifo,
                            targets=self._targets, dropped=alike):
            visited += 1
            kind = verdict.kind
            if kind == GONE:
                done.append(verdict.key)  # its own event tidies up the rest
            elif kind == DISPATCHED:
                done.append(verdict.key)
                dispatched += 1
            elif kind == HOLDS:
                held_by = verdict.key
            elif kind in (WAITS, BEHIND_IN_DOMAIN) and verdict.aw is not None:
                waiting.append((verdict.aw, verdict.about, verdict.why))
        return done, waiting, held_by, visited, dispatched

    def _tell(self, reserving: Pass, waiting: list[Waiting], held_by: str, alike: dict[str, list[str]]) -> None:
        """Step 3: what those that wait are told, judged against this pass's reservations; the heads dropped as
        alike to one of them are told what it was, when that is news to them."""
        if alike:
            for key, about in self._notices.alike_news(alike, {aw.key: about for aw, about, _ in waiting}):
                aw = self._appwrappers.get(key)
                if aw is not None:
                    waiting.append((aw, about, worded_for(reserving, aw)))
        if not self._strict_fifo:
            for aw, about, _ in waiting:
                # Members are told again when what they lack changes, not when reservations ahead come and go:
                # that would rewrite every member of a group (10,000 small ones) each time.
                self._notices.refresh_group(aw, about - {BEHIND}, reserving)
        # Then the ones the pass judged: a group's refresh knows only what they lack, not all the pass found
        # (a member of another's group may be a head of its own with more to say, e.g. why it evicts nobody).
        for aw, about, why in waiting:
            self._notices.tell(aw, about, why)
        self._notices.announce(reserving, held_by)

    def dispatch(self, aw: AppWrapperView, fit: Fit) -> None:
        """Reserve now (``fit.plan``), write in the background: the objects, then the Dispatched status
        (``mcad.loop.active``). Hub mode: the objects go into ``fit.cluster`` (the sites put the cleanup finalizer on
        first). The targets remember where it went (its home, should a reset requeue it): only here, never in a
        dry run."""
        cluster = fit.cluster
        self._active.reserve(aw, fit.plan)
        self._sites.placing(aw.key, cluster)
        self._targets.dispatched(aw, fit)
        reclaimed = aw.key in self._preemptors.reclaiming
        self._preemptors.dispatched(aw.key)
        if reclaimed:
            # Ones it held earlier in this cycle (they would have borrowed what it reclaimed) may go now.
            self._queue.add(DISPATCH)
        current = self._decisions.status(aw)
        wait = lifecycle.current_requeue_wait(aw.scheduling, current) if aw.scheduling.min_available > 0 else 0
        new = status.dispatched(current.raw(), self._clock.now(), priority=aw.priority, requeue_wait=wait,
                                cluster=cluster)
        self._dispatches.start(aw, new, cluster)

    def estimates_due(self) -> None:
        """The ESTIMATES_DUE timer fired: the queued AppWrappers' expected starts, told in their status when the
        rule says so (``Notices.tell_estimates``); the next judgement in an interval while any are queued."""
        self._estimates_timer = False
        if not len(self._pending):
            return
        told, held = self._notices.tell_estimates(self.assess())
        if told:
            log.debug("expected starts told", appwrappers=told)
        if held:
            self._estimates_later()  # their minute ends: judged again then
        # Otherwise not again until a cycle ran: estimates move when what runs or waits does, and each of those runs
        # a cycle (which arms the next judgement), so a queue where nothing changes costs no dry runs.

    def _estimates_later(self) -> None:
        if not self._estimates_timer and len(self._pending):
            self._estimates_timer = True
            self._queue.add_after(ESTIMATES_DUE, ESTIMATE_INTERVAL_SECONDS)

    def assess(self) -> QueueAssessment:
        """Every queued AppWrapper in dispatch order with what a cycle would do with it now, deciding nothing: the
        same walk with rules that peek (``Evictions.peek``: copies of who waits for whom, nobody evicted) over a
        snapshot whose quota ledger is a copy."""
        snapshot = self.snapshot(scratch_quota=True)
        reserving = self._reservations.start(snapshot, self._clock.now(), dry_run=True,
                                             fair=self._fair.begin(snapshot, act=False) if self._fair else None)
        evictions = self._evictions.peek()
        quota = reserving.snapshot.quota

        def dispatch(aw: AppWrapperView, _fit: Fit) -> None:
            if quota is not None:
                quota.charge(aw.key, aw.labels, aw.demand)
            evictions.preemptors.dispatched(aw.key)

        rules = WalkRules(self._queued, self._dispatches, evictions, dispatch)
        free = snapshot.free  # before the walk takes room for those that fit now (take makes a new vector)
        assessed = assess(self._pending, self._appwrappers, reserving, rules, strict_fifo=self._strict_fifo,
                          targets=self._targets, preempting=self._preemptors.waiters())
        assessed.estimated(self._estimate(assessed, free, snapshot.capacity))
        return assessed

    def _estimate(self, assessed: QueueAssessment, free: ResourceVector,
                  capacity: ResourceVector) -> dict[str, Estimate]:
        """When the first queued AppWrappers may start (``mcad.model.estimate``), from the dispatched ones' run-time
        limits and the queue in the order the walk took it."""
        queued = []
        for key in islice(assessed.dispatch_order(), ESTIMATED):
            aw = self._appwrappers.get(key)
            if aw is not None:
                told = assessed.of(key)
                queued.append(Waiter(key, aw.demand, aw.scheduling.dispatch_limit_seconds,
                                     blocked=told is not None and not told.fits_now))
        running = [Holder(aw.demand, lifecycle.deadline_due(aw.scheduling, self._decisions.status(aw))
                          if aw.scheduling.dispatch_limit_seconds > 0 else None)
                   for aw in self._active.views.values()]
        return estimate_starts(queued, running, free, capacity, self._clock.now())


class WalkRules:
    """The walk's rules (``mcad.model.walk.Rules``) over the loop's owners: a cycle's, whose ``makes_room`` evicts,
    or a dry run's over ``Evictions.peek``; ``dispatch`` is what the pass does with one that fits."""

    def __init__(self, queued: Queued, dispatches: Dispatches, evictions: Evictions,
                 dispatch: Callable[[AppWrapperView, Fit], None]) -> None:
        self._queued = queued
        self._dispatches = dispatches
        self._evictions = evictions
        self._preemptors = evictions.preemptors
        self.dispatch = dispatch
        # Asked for every tenant's group a pass drops as alike to another's: the preemptors' own answer, no hop.
        self.judged_apart = self._preemptors.judged_apart

    @property
    def victim_timeout(self) -> float:
        return self._preemptors.victim_timeout

    def queued(self, aw: AppWrapperView) -> bool:
        return self._queued.is_queued(aw)

    def draining(self, aw: AppWrapperView) -> bool:
        return self._queued.draining(aw)

    def retrying(self, key: str) -> bool:
        return self._dispatches.waiting(key)

    def preempting(self, key: str) -> bool:
        return key in self._preemptors

    def blocked_by_reclaim(self, aw: AppWrapperView) -> str:
        return self._evictions.blocked_by_reclaim(aw)

    def makes_room(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, *, reclaim: bool) -> Room:
        return self._evictions.makes_room(aw, need, snapshot, reclaim=reclaim)

    def abandoned(self, key: str) -> frozenset[str]:
        return self._preemptors.abandoned(key)
