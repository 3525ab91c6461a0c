"""One dispatch cycle: a pass over the queue that dispatches what fits and tells the rest why they wait.

Contract (dispatcher thread only; built by ``mcad.wiring`` with the owners each step calls on, in one frozen
``CycleOwners``, and the loop's ``LoopTools``):
``run()`` is one pass over the queued AppWrappers in dispatch order (priority, creation time, name), one candidate
per demand group (the next of a group too when its candidate took a reservation and more are left):
1. Snapshot the free room (``Accountant.snapshot``); pods of dispatched AppWrappers beyond their plans are placed
   first (``mcad.loop.pinning``); the pass (``mcad.model.reservations.Pass``) takes from its copy as it
   dispatches, and as blocked ones take reservations.
2. Pass by a candidate that is gone or decided meanwhile, that waits for its previous pods to go (draining), or
   whose last dispatch failed and waits out its backoff; with strict FIFO, one held by an earlier one of its quota
   node (``mcad.model.fifo``).
3. Fit it (``fit.fits``, on room no reservation holds; one with a bounded run time may also use the room of
   reservations it ends before: backfill); a quota reclaim under way in its trees holds back one that would borrow.
4. It fits: dispatch it (``dispatch``: reserved now, its objects written in the background by
   ``mcad.loop.dispatches``) and take its room from the snapshot.
5. It does not: if victims are going away for it, or it can make room by evicting others (``mcad.loop.evictions``:
   quota reclaim, then priority preemption), it holds the queue: the pass stops, nothing behind it may take that
   room.
6. Else it waits: it takes a reservation if one is left (not with strict FIFO, where it holds what it waits for:
   its quota node and those charged there or below when quota blocks it, the whole cluster when room does; nothing
   if it could never run); why it waits is told after the pass, once the dispatched ones left, so positions are
   right.
7. After the pass: drop the dispatched from the queue, tell those that wait (``mcad.loop.notices``, handed the
   pass explicitly: it judges members and newcomers against the same reservations), and announce the newcomers.

``assess()`` is the same judgement over a scratch copy, deciding nothing (``mcad.model.assess``, for /debug).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import structlog

from mcad.api.appwrapper import AppWrapperView
from mcad.k8s.informer import Store
from mcad.loop.active import Active
from mcad.loop.decisions import Decisions
from mcad.loop.dispatches import Dispatches
from mcad.loop.evictions import Evictions
from mcad.loop.notices import Notices
from mcad.loop.pinning import Pinning
from mcad.loop.queued import Queued
from mcad.loop.sites import Sites
from mcad.loop.tools import LoopTools
from mcad.model import disclosure, lifecycle, status
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.assess import QueueAssessment, assess
from mcad.model.fifo import BEHIND_IN_DOMAIN, StrictFifo
from mcad.model.fit import Targets, could_ever_fit, refused
from mcad.model.keys import DISPATCH
from mcad.model.plans import Plan
from mcad.model.preemption import Preemptors, preemption_refusal
from mcad.model.reservations import BEHIND, Pass, Reservations

log = structlog.get_logger("mcad.loop.dispatcher")

Waiting = tuple[AppWrapperView, frozenset[str], Callable[[], str]]


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


class DispatchCycle:
    def __init__(self, owners: CycleOwners, tools: LoopTools, *, strict_fifo: bool, by_nodes: bool) -> None:
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
        self._queue = tools.queue
        self._clock = tools.clock
        self._metrics = tools.metrics
        self._strict_fifo = strict_fifo
        self._by_nodes = by_nodes
        self.count = 0

    def snapshot(self, *, scratch_quota: bool = False) -> Snapshot:
        return self._accountant.snapshot(by_nodes=self._by_nodes, scratch_quota=scratch_quota)

    def run(self) -> None:
        started = time.perf_counter()
        self.count += 1
        snapshot = self.snapshot()  # 1
        self._pinning.place_extras(snapshot, {key: r.nodes for key, r in self._reservations.held.items()})
        reserving = self._reservations.start(snapshot, self._clock.now())
        done, waiting, held_by, visited, dispatched = self._pass(reserving)
        reserving.finish()
        for key in done:  # 7
            self._pending.remove(key)
        self._tell(reserving, waiting, held_by)
        self._metrics.cycle(time.perf_counter() - started)
        log.info("dispatch cycle", cycle=self.count, queued=len(self._pending), dispatched=dispatched,
                 visited=visited, reservations=len(reserving.made), free=snapshot.free.format(),
                 duration_ms=round((time.perf_counter() - started) * 1000, 2))

    def _pass(self, reserving: Pass) -> tuple[list[str], list[Waiting], str, int, int]:
        """Steps 2-6 over the queue: the keys to drop from it (dispatched, or gone), those that wait, the
        preemptor that stopped the pass by holding the queue (if one did), how many were visited and dispatched."""
        snapshot = reserving.snapshot
        cursor = self._pending.cycle()
        held_by = ""
        fifo = StrictFifo(snapshot.quota.forest if snapshot.quota is not None else None) \
            if self._strict_fifo else None
        done: list[str] = []
        waiting: list[Waiting] = []
        dispatched = 0
        while (candidate := cursor.next()) is not None:
            key, _ = candidate
            aw = self._appwrappers.get(key)
            if aw is None or not self._queued.is_queued(aw):  # 2
                done.append(key)  # went away or was decided meanwhile; its own event tidies up the rest
                cursor.passed()
                continue
            if self._queued.draining(aw):
                cursor.blocked()  # its own group: it waits for the pods of its previous dispatch to go
                continue
            if self._dispatches.waiting(key):
                cursor.passed()  # its last dispatch failed: not before its backoff passes (its timer says when)
                continue
            if fifo is not None and key not in self._preemptors and fifo.held(aw):
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
            held = self._evictions.blocked_by_reclaim(aw) if fit.fits else ""
            if held:
                fit = refused("reclaim", held)
            if fit.fits:  # 4
                cursor.passed()
                self.dispatch(aw, fit.plan, fit.cluster)
                done.append(key)
                dispatched += 1
                snapshot.take(need, fit.plan)
                continue
            room = self._evictions.makes_room(aw, need, snapshot, reclaim=not held)  # 5
            if room.holds:
                held_by = key
                cursor.stop()
                continue
            if self._strict_fifo:  # 6
                told = fit.about, fit.why
            elif self._preemptors.abandoned(key):
                # Its victims did not go: holding their room for it could hold it for ever (a pod finalizer).
                told = reserving.explain(aw, need, fit)
            else:
                told = reserving.wait(aw, need, fit)
            about, why = self._why_waiting(aw, *told)
            if room.about:  # it outranks running work, yet evicts nobody: say why
                about, why = about | {room.about}, partial(lambda w, r: f"{w()}; {r}", why, room.why)
            if self._strict_fifo and not could_ever_fit(aw, need, snapshot, self._targets, fit):
                # It would hold everyone behind it for ever: let them pass, and say so.
                about = about | {"never fits"}
                never = preemption_refusal(aw, need, snapshot, self._targets)
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
        return done, waiting, held_by, cursor.visited, dispatched

    def _tell(self, reserving: Pass, waiting: list[Waiting], held_by: str) -> None:
        """Step 7: what those that wait are told, judged against this pass's reservations."""
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

    def _why_waiting(self, aw: AppWrapperView, about: frozenset[str],
                     why: Callable[[], str]) -> tuple[frozenset[str], Callable[[], str]]:
        """What blocks a candidate that waits, and its message (one that gave up on its victims says so)."""
        gave_up_on = self._preemptors.abandoned(aw.key)
        if gave_up_on:
            gave_up = (f"its preemption victims did not finish terminating within "
                       f"{self._preemptors.victim_timeout:g} s ({disclosure.listed(gave_up_on, aw.namespace)}), "
                       f"so it no longer holds the queue")
            about, why = about | {"victims stuck"}, partial(lambda w, g: f"{w()}; {g}", why, gave_up)
        return about, why

    def dispatch(self, aw: AppWrapperView, plan: Plan = (), cluster: str = "") -> None:
        """Reserve now, write in the background: the objects, then the Dispatched status (``mcad.loop.active``).
        Hub mode: the objects go into ``cluster`` (the sites put the cleanup finalizer on first)."""
        self._active.reserve(aw, plan)
        self._sites.placing(aw.key, cluster)
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

    def assess(self) -> QueueAssessment:
        """Every queued AppWrapper in dispatch order with what a cycle would do with it now, deciding nothing."""
        reserving = self._reservations.start(self.snapshot(scratch_quota=True), self._clock.now(), dry_run=True)
        return assess(self._pending, self._appwrappers, reserving, preemptors=self._preemptors,
                      draining=self._queued.draining, blocked_by_reclaim=self._evictions.blocked_by_reclaim,
                      strict_fifo=self._strict_fifo, targets=self._targets)
