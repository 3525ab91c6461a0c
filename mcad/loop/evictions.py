"""Carrying out preemption and quota reclaim: victims requeued, their preemptor waiting for them, and giving up.

Contract (the dispatcher thread runs this; ``mcad.model.preemption`` chooses, this module acts: victims are taken
back through ``mcad.loop.active``, the preemptor is told through ``mcad.loop.notices``; built by ``mcad.wiring``
with what it reads and acts through in one frozen ``EvictionOwners``, and the loop's ``LoopTools``):
- ``makes_room(aw, need, snapshot)`` is asked by the one pass (``mcad.model.walk``) for a queued AppWrapper that
  does not fit. Its ``holds`` is True while ``aw`` holds the queue because victims go away for it: it waits for
  those it chose earlier, or it chooses some now, quota reclaim first (borrowers above it), then, with
  ``--preemption``, priority preemption (strictly lower priorities), only when it provably runs once they are gone
  (``mcad.model.preemption``).
  When it outranks running work but evicts nobody, ``about``/``why`` say why for its status: an error in its own
  quota or binding, more than its quota or the cluster could ever give it, no choice of victims that makes it fit,
  its backoff after a round that did not make it run, or the eviction rate bound.
- Bounds: at most ``--preemption-max-evictions-per-minute`` victims in any minute, over all preemptors and
  reclaims (``EvictionBudget``; a cycle is due when the bound allows the round); a preemptor whose victims went
  and that still did not run evicts nobody for ``--preemption-backoff`` seconds, doubling per round up to 16x,
  reset when it runs (``Preemptors.backing_off``).
- Victims are requeued at once keeping their requeuing count, each with its reason (PreemptedByPriority,
  PreemptedByQuotaReclaim), and the preemptor's Backoff names them.
- Each side is named to the other only within one namespace (``mcad.model.disclosure``): a victim in another
  namespace than its preemptor reads "Preempted by an AppWrapper in another namespace", and the preemptor
  counts such victims.
- A preemptor waits at most ``victim_timeout`` seconds (a cycle is due then, events or not). Past it, victims'
  pods whose grace period is over are force-deleted (as the kubelet would have by now), the preemptor stops
  holding the queue and an Event says so; it chooses nobody else until those very pods are gone.
- ``blocked_by_reclaim(aw)``: why ``aw`` may not borrow now (a reclaim waits for its victims in its trees).
- ``peek()``: the same judgement for a dry run (``mcad.model.assess``): over copies of ``Preemptors`` and the
  eviction budget, it chooses victims and gives up on stuck ones as a cycle would, but evicts nobody, tells
  nobody, deletes no pod, writes no Event and sets no timer; its ``Room`` names the victims.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import structlog

from mcad.api.appwrapper import ACTIVE_STATES, AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.api.views import PodView
from mcad.errors import ApiError
from mcad.k8s import events
from mcad.k8s.informer import Store
from mcad.loop.active import Active
from mcad.loop.decisions import Decisions
from mcad.loop.notices import Notices
from mcad.loop.tools import LoopTools, cycle_after
from mcad.model import disclosure, lifecycle, status
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.fit import Targets
from mcad.model.preemption import (
    NO_ROOM,
    PREEMPTING,
    RECLAIMING,
    WAITING_FOR_VICTIMS,
    Candidate,
    EvictionBudget,
    Preemptors,
    Room,
    blocked_by_reclaim,
    preemption_refusal,
    priority_victims,
    reclaim_victims,
    victim_rank,
)
from mcad.model.quota import Charges

log = structlog.get_logger("mcad.loop.dispatcher")

# Victims evicted in any minute, over every preemptor and reclaim (--preemption-max-evictions-per-minute): well
# above what a healthy cluster's priority changes evict, low enough that a preemptor gone wrong cannot clear a
# large cluster in one go.
DEFAULT_MAX_EVICTIONS_PER_MINUTE = 100
# A preemptor whose victims went and that still did not run preempts again no sooner than this, doubling per round
# up to 16 times as long (--preemption-backoff).
DEFAULT_PREEMPTION_BACKOFF_SECONDS = 60.0
BACKOFF_CAP_FACTOR = 16


class PodDeleter(Protocol):
    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete that very pod with no grace period."""
        ...


@dataclass(frozen=True, slots=True)
class EvictionOwners:
    """What ``Evictions`` reads and acts through: victims chosen among what ``active`` holds (not those in flight:
    ``in_flight``, the read-only view of ``mcad.loop.dispatches``' record) and taken back through it, preemptors
    told through ``notices``, Events through ``decisions``; who waits for whom is the ``preemptors``'."""

    preemptors: Preemptors
    accountant: Accountant
    targets: Targets
    active: Active
    decisions: Decisions
    notices: Notices
    in_flight: Mapping[str, AppWrapperView]
    appwrappers: Store[AppWrapperView]


class Evictions:
    def __init__(self, owners: EvictionOwners, tools: LoopTools, *, pods: PodDeleter, priority_preemption: bool,
                 budget: EvictionBudget | None = None) -> None:
        self.preemptors = owners.preemptors
        self.budget = budget if budget is not None else EvictionBudget(DEFAULT_MAX_EVICTIONS_PER_MINUTE)
        self._accountant = owners.accountant
        self._targets = owners.targets
        self._active = owners.active
        self._decisions = owners.decisions
        self._notices = owners.notices
        self._dispatched = owners.active.views  # read live
        self._in_flight = owners.in_flight
        self._appwrappers = owners.appwrappers
        self._queue = tools.queue
        self._clock = tools.clock
        self._writes = tools.writes
        self._pods = pods
        self._priority_preemption = priority_preemption
        self._act = True

    def peek(self) -> Evictions:
        """Evictions for a dry run: the same judgement over copies of who waits for whom and of the eviction
        budget, evicting nobody, telling nobody and setting no timer (``mcad.model.assess``)."""
        twin = copy.copy(self)
        twin.preemptors = self.preemptors.copy()
        twin.budget = self.budget.copy()
        twin._act = False
        return twin

    @property
    def victim_timeout(self) -> float:
        return self.preemptors.victim_timeout

    def makes_room(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, *, reclaim: bool) -> Room:
        """Whether ``aw``, which does not fit, holds the queue because victims go away for it (see the module
        docstring), and, when it evicts nobody though it outranks running work, why; ``reclaim`` False: a reclaim
        elsewhere already holds it back from borrowing."""
        # Judged before the wait is checked, as that check may be the one that gives up (in this very pass).
        stuck = self.preemptors.stuck(aw.key, lambda uid: self._accountant.ledger.pod(uid) is not None)
        if self._waiting_for_victims(aw.key):
            return Room(True, kind=WAITING_FOR_VICTIMS, victims=tuple(sorted(self.preemptors.victims_of(aw.key))))
        if stuck:
            return NO_ROOM
        now = self._clock.monotonic()
        wait = self.preemptors.backing_off(aw.key, now)
        if wait > 0:
            if not (self._priority_preemption and self._candidates(aw)) and not self._may_reclaim(aw, snapshot):
                return NO_ROOM
            self._due(wait)  # events or not, it is looked at again when it may preempt
            rounds = self.preemptors.rounds(aw.key)
            return Room(False, "preemption backoff",
                        f"it evicted {rounds} round(s) of victims and still did not run, so it evicts nobody "
                        f"for {wait:.0f} s more (backoff)")
        if reclaim:
            room = self._reclaim_for(aw, need, snapshot)
            if room.holds or room.about:
                return room
        if self._priority_preemption:
            return self._preempt_for(aw, need, snapshot)
        return NO_ROOM

    def blocked_by_reclaim(self, aw: AppWrapperView) -> str:
        return blocked_by_reclaim(aw, self._accountant.quota, self.preemptors.reclaiming)

    def _candidates(self, aw: AppWrapperView) -> list[Candidate]:
        """Running AppWrappers of lower priority that nobody has chosen yet."""
        taken = self.preemptors.victims_taken()
        return [Candidate(victim.key, victim.priority, self._rank(victim))
                for victim in self._dispatched.values()
                if victim.priority < aw.priority and victim.key not in taken
                and victim.key not in self._in_flight and self._decisions.status(victim).state in ACTIVE_STATES]

    def _may_reclaim(self, aw: AppWrapperView, snapshot: Snapshot) -> bool:
        if snapshot.quota is None or aw.held:
            return False
        charges = snapshot.quota.forest.charges(aw.labels)[0]
        return bool(charges) and bool(snapshot.quota.borrowers(charges))

    def _preempt_for(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot) -> Room:
        key = aw.key
        candidates = self._candidates(aw)
        if not candidates:
            return NO_ROOM  # it outranks nobody running: nothing to say
        refusal = preemption_refusal(aw, need, snapshot, self._targets)
        if refusal:
            return Room(False, "evicts nobody", f"it evicts nobody: {refusal}")
        chosen = priority_victims(aw, need, snapshot, self._targets, candidates, self._accountant.footprint)
        if not chosen:
            return Room(False, "evicts nobody",
                        "it evicts nobody: it would not fit even with every lower-priority AppWrapper gone")
        over = self._over_budget(len(chosen))
        if over:
            return Room(False, "eviction rate bound", over)
        names = sorted(chosen)
        self._evict_and_wait(aw, names, status.PREEMPTED_BY_PRIORITY,
                             lambda victim: f"Preempted by {_appwrapper(key, victim)} (priority {aw.priority}).",
                             "preempting", f"preempting {len(names)} lower-priority AppWrapper(s) to make room")
        return Room(True, kind=PREEMPTING, victims=tuple(names))

    def _over_budget(self, victims: int) -> str:
        """Why ``victims`` evictions may not happen now ("" if they may); a cycle is due when they may."""
        now = self._clock.monotonic()
        if self.budget.allows(victims, now):
            return ""
        wait = self.budget.free_at(victims, now) - now
        self._due(wait)
        return (f"it would evict {victims} AppWrapper(s), but the controller evicts at most "
                f"{self.budget.per_minute} a minute (--preemption-max-evictions-per-minute); it may in {wait:.0f} s")

    def _reclaim_for(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot) -> Room:
        if snapshot.quota is None or aw.held:
            return NO_ROOM
        ranks = {k: self._rank(v) for k, v in self._dispatched.items()}
        exclude = self.preemptors.victims_taken() | set(self._in_flight)
        victims = reclaim_victims(aw, need, snapshot, self._targets, ranks, self._accountant.footprint, exclude)
        if not victims:
            return NO_ROOM
        over = self._over_budget(len(victims))
        if over:
            return Room(False, "eviction rate bound", f"reclaiming its quota: {over}")
        names = sorted(victims)
        self._evict_and_wait(aw, names, status.PREEMPTED_BY_QUOTA_RECLAIM,
                             lambda victim: f"Preempted to give borrowed quota back to {_appwrapper(aw.key, victim)}.",
                             "reclaiming", f"reclaiming quota borrowed by {len(names)} AppWrapper(s)",
                             reclaim=snapshot.quota.forest.charges(aw.labels)[0])
        return Room(True, kind=RECLAIMING, victims=tuple(names))

    def _evict_and_wait(self, aw: AppWrapperView, victims: list[str], reason: str, message: Callable[[str], str],
                        doing: str, told: str, reclaim: Charges | None = None) -> None:
        """``aw`` evicts ``victims`` (each requeued with ``message(its key)``, worded for its namespace by
        ``mcad.model.disclosure``) and waits for them to go; ``told`` is what ``aw``'s status says it is doing. A
        dry run (``peek``) only records the wait, on its copies, as the cycle would."""
        if self._act:
            for victim_key in victims:
                self._active.requeue_keeping_count(self._dispatched[victim_key], reason, message(victim_key))
        self._start(aw.key, victims, reclaim)
        if not self._act:
            return
        log.info(doing, appwrapper=aw.key, priority=aw.priority, victims=victims)
        self._notices.tell(aw, frozenset({doing}),
                           partial(str, f"{told}: {disclosure.listed(victims, aw.namespace)}"), paced=False)

    def _start(self, key: str, victims: Iterable[str], reclaim: Charges | None = None) -> None:
        """``key`` waits for ``victims`` to go, holding the queue, for at most ``victim_timeout`` seconds."""
        victims = list(victims)
        self.budget.spend(len(victims), self._clock.monotonic())
        self.preemptors.start(key, victims, self._clock.monotonic(), reclaim)
        self._due(self.victim_timeout)  # looks again at the latest then, events or not

    def _due(self, seconds: float) -> None:
        """A cycle in ``seconds``, events or not (not from a dry run)."""
        if self._act:
            cycle_after(self._queue, self._clock.monotonic(), seconds)

    def _rank(self, victim: AppWrapperView) -> tuple[Any, ...]:
        return victim_rank(victim.priority, lifecycle.dispatched_at(self._decisions.status(victim)),
                           lifecycle.parse_time(victim.created), victim.key)

    def _waiting_for_victims(self, key: str) -> bool:
        now = self._clock.monotonic()
        holding, gave_up_on = self.preemptors.check(
            key, lambda v: v in self._dispatched or self._accountant.has_pods(v), now)
        if gave_up_on:
            self._give_up_on_victims(key, gave_up_on)
        return holding

    def _give_up_on_victims(self, key: str, victims: frozenset[str]) -> None:
        """Its victims' pods did not go within ``victim_timeout`` (a finalizer, a process ignoring SIGTERM with a
        long grace period): force-delete those whose grace period is over and stop holding the queue."""
        now = self._clock.now().timestamp()
        forced, stuck, remaining = [], [], set()
        for victim in sorted(victims):
            for pod in self._accountant.live_pods(victim):
                remaining.add(pod.uid)
                if pod.deleting and 0 < pod.grace_ends <= now:
                    forced.append(f"{pod.namespace}/{pod.name}")
                    if self._act:
                        self._writes.submit(victim, partial(self._force_delete, pod), tenant=pod.namespace)
                else:
                    stuck.append(f"{pod.namespace}/{pod.name}")
        self.preemptors.gave_up(key, victims, frozenset(remaining))
        if not self._act:
            return
        log.warning("preemption victims did not go in time; no longer holding the queue", appwrapper=key,
                    victims=sorted(victims), timeout_s=self.victim_timeout, force_deleted=forced, still_there=stuck)
        aw = self._appwrappers.get(key)
        if aw is not None:
            detail = f"force-deleted {len(forced)} pod(s) past their grace period" if forced else \
                "none of their pods is past its grace period"
            self._decisions.event(aw, events.QUEUED, f"Its preemption victims did not finish terminating within "
                                                f"{self.victim_timeout:g} s ({detail}); it no longer holds the queue.")

    def _force_delete(self, pod: PodView) -> None:
        """Background thread."""
        try:
            self._pods.force_delete_pod(pod.namespace, pod.name, pod.uid)
        except ApiError as err:
            if err.status not in (404, 409):
                log.warning("force deletion refused", pod=f"{pod.namespace}/{pod.name}", status_code=err.status,
                            reason=err.message)


def _appwrapper(key: str, reader_key: str) -> str:
    """'AppWrapper ns/name' for a reader of its namespace, else 'an AppWrapper in another namespace'."""
    reader = disclosure.namespace_of(reader_key)
    return f"AppWrapper {key}" if disclosure.same_namespace(key, reader) else disclosure.ANOTHER
