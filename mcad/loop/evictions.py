"""Carrying out preemption and quota reclaim: victims requeued, their preemptor waiting for them, and giving up.

Contract (the dispatcher thread runs this; ``mcad.model.preemption`` chooses, this module acts: victims are taken
back through ``mcad.loop.active``, the preemptor is told through ``mcad.loop.notices``; built by ``mcad.wiring``
with what it reads and acts through in one frozen ``EvictionOwners``, and the loop's ``LoopTools``):
- ``makes_room(aw, need, snapshot)`` is asked by the one pass (``mcad.model.walk``) for a queued AppWrapper that
  does not fit. Its ``holds`` is True while ``aw`` holds the queue because victims go away for it: it waits for
  those it chose earlier, or it chooses some now, quota reclaim first (borrowers above it), then, with
  ``--preemption``, priority preemption (strictly lower priorities), only when it provably runs once they are gone
  (``mcad.model.preemption``): of the sets that make it fit, the lowest priorities, then the one that loses the
  least work, then the fewest.
  When it outranks running work but evicts nobody, ``about``/``why`` say why for its status: an error in its own
  quota or binding, more than its quota or the cluster could ever give it, no choice of victims that makes it fit,
  its backoff after a round that did not make it run, or the eviction rate bound.
- Bounds: at most ``--preemption-max-evictions-per-minute`` victims in any minute, over all preemptors and
  reclaims (``EvictionBudget``; a cycle is due when the bound allows the round); a preemptor whose victims went
  and that still did not run evicts nobody for ``--preemption-backoff`` seconds, doubling per round up to 16x,
  reset when it runs (``Preemptors.backing_off``).
- Who is no priority preemption victim: one dispatched less than its minimum run time ago (its
  ``mcad.codeflare.dev/min-runtime``, else ``--preemption-min-runtime``, at most
  ``--preemption-min-runtime-ceiling``: ``mcad.api.minruntime``), and one evicted before (by preemption or
  reclaim) and dispatched again less than ``--preemption-cooldown`` ago (``Cooldowns``). Quota reclaim spares
  neither. When such ones would have been evicted (they are in the choice made with them as candidates), the
  preemptor's status and explain say how many it spares and why, each is counted once per preemptor in
  ``mcad_preemption_spared_total{reason}``, and when it evicts nobody for them a cycle is due when the first of
  them may go.
- Victims are requeued at once keeping their requeuing count, each with its reason (PreemptedByPriority,
  PreemptedByQuotaReclaim) and a message naming the preemptor and, for priority preemption, why these: the least
  work lost (among the lowest priorities), how many and how much (of the work, only that of the reader's own
  namespace when the victims span several); the preemptor's Backoff names them.
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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Protocol

import structlog

from mcad.api import minruntime
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
    SPARED_COOLDOWN,
    SPARED_MIN_RUNTIME,
    WAITING_FOR_VICTIMS,
    Candidate,
    Cooldowns,
    EvictionBudget,
    Preemptors,
    Room,
    Work,
    blocked_by_reclaim,
    describe_work,
    preemption_refusal,
    priority_victims,
    reclaim_victims,
    spared_phrase,
    total_work,
    victim_rank,
    work_lost,
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
# An AppWrapper evicted by preemption is no priority preemption victim for this long after it is dispatched again
# (--preemption-cooldown): two preemptors in turn would otherwise bounce it back and forth, each round throwing away
# its warm-up. Ten minutes: longer than a typical restart and warm-up, short against the jobs preemption is for.
DEFAULT_PREEMPTION_COOLDOWN_SECONDS = 600.0


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
                 budget: EvictionBudget | None = None, min_runtime: minruntime.MinRuntime = minruntime.DEFAULT,
                 cooldown: float = DEFAULT_PREEMPTION_COOLDOWN_SECONDS) -> None:
        self.preemptors = owners.preemptors
        self.budget = budget if budget is not None else EvictionBudget(DEFAULT_MAX_EVICTIONS_PER_MINUTE)
        self._min_runtime = min_runtime
        # Shared with a dry run's twin, which reads it only: a pass never dispatches one it evicted again.
        self.cooldowns = Cooldowns(cooldown)
        self._metrics = tools.metrics
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
            if not (self._priority_preemption and self._candidates(aw)[0]) and not self._may_reclaim(aw, snapshot):
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

    def forget(self, key: str) -> None:
        """It is gone: its cooldown with it."""
        self.cooldowns.forget(key)

    def _candidates(self, aw: AppWrapperView) -> tuple[list[Candidate], dict[str, tuple[str, float]]]:
        """Running AppWrappers of lower priority that nobody has chosen yet, each with its work lost now; and those
        of them that are no victim now, each with why (``SPARED_REASONS``) and when it may be (wall seconds)."""
        taken = self.preemptors.victims_taken()
        now = self._clock.now().timestamp()
        found: list[Candidate] = []
        spared: dict[str, tuple[str, float]] = {}
        for victim in self._dispatched.values():
            if victim.priority >= aw.priority or victim.key in taken or victim.key in self._in_flight:
                continue
            current = self._decisions.status(victim)
            if current.state not in ACTIVE_STATES:
                continue
            dispatched = lifecycle.dispatched_at(current)
            started = _seconds(dispatched or lifecycle.parse_time(victim.created))
            run = max(now - started, 0.0) if started is not None else 0.0
            found.append(Candidate(victim.key, victim.priority, self._rank(victim, dispatched),
                                   work_lost(victim.demand, run), run))
            least = self._min_runtime.seconds(victim.min_runtime)
            if started is not None and run < least:
                spared[victim.key] = (SPARED_MIN_RUNTIME, started + least)
                continue
            cooled = self.cooldowns.until(victim.key, victim.uid, started)
            if cooled > now:
                spared[victim.key] = (SPARED_COOLDOWN, cooled)
            elif cooled and self._act:
                self.cooldowns.done(victim.key)
        return found, spared

    def _may_reclaim(self, aw: AppWrapperView, snapshot: Snapshot) -> bool:
        if snapshot.quota is None or aw.held:
            return False
        charges = snapshot.quota.forest.charges(aw.labels)[0]
        return bool(charges) and bool(snapshot.quota.borrowers(charges))

    def _preempt_for(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot) -> Room:
        key = aw.key
        candidates, spared = self._candidates(aw)
        if not candidates:
            return NO_ROOM  # it outranks nobody running: nothing to say
        refusal = preemption_refusal(aw, need, snapshot, self._targets)
        if refusal:
            return Room(False, "evicts nobody", f"it evicts nobody: {refusal}")
        victims_now = [c for c in candidates if c.key not in spared]
        chosen = priority_victims(aw, need, snapshot, self._targets, victims_now, self._accountant.footprint)
        # Those it spares: the ones the same choice would take were they candidates (another choice only when
        # some are spared: at most twice the fit checks, and only then).
        spares = sorted(k for k in priority_victims(aw, need, snapshot, self._targets, candidates,
                                                    self._accountant.footprint) if k in spared) if spared else []
        self._count_spared(key, {k: spared[k][0] for k in spares})
        sparing = spared_phrase(spared[k][0] for k in spares)
        if not chosen:
            if spares:
                # Events or not, it is looked at again when the first spared one may go (any of them, as the
                # choice may then take another).
                first = min(until for _, until in spared.values()) - self._clock.now().timestamp()
                self._due(first)
                return Room(False, "spares victims",
                            f"it evicts nobody for now: it would fit only by evicting AppWrappers it {sparing}; "
                            f"it looks again in {first:.0f} s, when the first AppWrapper it spares may be evicted",
                            spared=sparing)
            return Room(False, "evicts nobody",
                        "it evicts nobody: it would not fit even with every lower-priority AppWrapper gone")
        over = self._over_budget(len(chosen))
        if over:
            return Room(False, "eviction rate bound", over, spared=sparing)
        names = sorted(chosen)
        works = {c.key: c.work for c in victims_now}
        told = f"preempting {len(names)} lower-priority AppWrapper(s) to make room, losing the least work " \
               f"({_work_told(names, works, aw.namespace)})"
        self._evict_and_wait(aw, names, status.PREEMPTED_BY_PRIORITY,
                             lambda victim: f"Preempted by {_appwrapper(key, victim)} (priority {aw.priority}); "
                                            f"chosen for the least work lost: {len(names)} AppWrapper(s), "
                                            f"{_work_told(names, works, disclosure.namespace_of(victim))}.",
                             "preempting", told, then=f"; it {sparing}" if sparing else "")
        return Room(True, kind=PREEMPTING, victims=tuple(names), spared=sparing)

    def _count_spared(self, key: str, spared: Mapping[str, str]) -> None:
        """Each AppWrapper ``key`` spares, once per preemptor (``mcad_preemption_spared_total``); not in a dry
        run."""
        if not spared or not self._act:
            return
        for victim in sorted(self.preemptors.newly_spared(key, spared)):
            self._metrics.preemption_spared(spared[victim])

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
        ranks = _Ranks(self._dispatched, self._rank)
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
                        doing: str, told: str, reclaim: Charges | None = None, then: str = "") -> None:
        """``aw`` evicts ``victims`` (each requeued with ``message(its key)``, worded for its namespace by
        ``mcad.model.disclosure``) and waits for them to go; ``told`` is what ``aw``'s status says it is doing, before
        the victims, ``then`` after them. A dry run (``peek``) only records the wait, on its copies, as the cycle
        would."""
        if self._act:
            now = self._clock.now().timestamp()
            for victim_key in victims:
                victim = self._dispatched[victim_key]
                self.cooldowns.evicted(victim_key, victim.uid, now)
                self._active.requeue_keeping_count(victim, reason, message(victim_key))
        self._start(aw.key, victims, reclaim)
        if not self._act:
            return
        log.info(doing, appwrapper=aw.key, priority=aw.priority, victims=victims)
        self._notices.tell(aw, frozenset({doing}),
                           partial(str, f"{told}: {disclosure.listed(victims, aw.namespace)}{then}"), paced=False)

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

    def _rank(self, victim: AppWrapperView, dispatched: datetime | None = None) -> tuple[Any, ...]:
        if dispatched is None:
            dispatched = lifecycle.dispatched_at(self._decisions.status(victim))
        return victim_rank(victim.priority, dispatched, lifecycle.parse_time(victim.created), victim.key)

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


def _work_told(victims: list[str], works: Mapping[str, Work], reader: str) -> str:
    """The work the ``victims`` lose, as told to a reader of namespace ``reader``: all of it when they are all in
    that namespace, else only theirs there (the work of another namespace's AppWrapper tells its size and age)."""
    own = [key for key in victims if disclosure.same_namespace(key, reader)]
    lost = describe_work(total_work(works[key] for key in own))
    return lost if len(own) == len(victims) else f"{lost} of it in this namespace"


def _seconds(when: datetime | None) -> float | None:
    return when.timestamp() if when is not None else None


def _appwrapper(key: str, reader_key: str) -> str:
    """'AppWrapper ns/name' for a reader of its namespace, else 'an AppWrapper in another namespace'."""
    reader = disclosure.namespace_of(reader_key)
    return f"AppWrapper {key}" if disclosure.same_namespace(key, reader) else disclosure.ANOTHER


class _Ranks(Mapping[str, tuple[Any, ...]]):
    """The victim rank of each dispatched AppWrapper, made when first asked: a reclaim asks of its few candidates,
    not of every AppWrapper dispatched (each rank parses the status's dispatch time)."""

    def __init__(self, dispatched: Mapping[str, AppWrapperView],
                 rank: Callable[[AppWrapperView], tuple[Any, ...]]) -> None:
        self._dispatched, self._rank = dispatched, rank
        self._made: dict[str, tuple[Any, ...]] = {}

    def __getitem__(self, key: str) -> tuple[Any, ...]:
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = self._rank(self._dispatched[key])
        return made

    def __contains__(self, key: object) -> bool:
        return key in self._dispatched

    def __iter__(self) -> Iterator[str]:
        return iter(self._dispatched)

    def __len__(self) -> int:
        return len(self._dispatched)
