"""Preemption and quota reclaim: which dispatched AppWrappers to evict for a queued one, and who waits for whom.

Contract:
- ``priority_victims``: for a queued AppWrapper that does not fit, the dispatched AppWrappers of strictly lower
  priority to evict, none at all unless evicting them makes it fit, capacity (``fit.fits_without``) and quota both
  (over a copy of the quota ledger without them). Of the sets it tries it keeps the one whose highest victim
  priority is lowest, then that loses the least work (``Candidate.work``: run time so far times demand, GPUs
  first, then cpu; ``work_lost``), then the fewest victims. Priority comes first because a victim of higher
  priority, requeued into a full cluster, would in turn preempt the lower ones: more work lost in all, not less.
  It tries two sets, each greedy then pruned: candidates taken in order until it fits, then any the rest make
  unnecessary dropped (the costliest tried first); both orders take the lowest priority first, then one by work
  lost (cheapest first), the other by run time (the least work lost per unit freed first: a large young gang
  before many small old ones); ties by ``victim_rank``. That is at most 2 x (2 x candidates) fit checks, linear
  in the candidates, where the best set over all subsets would be exponential. A gang that requires one topology
  domain is judged per domain (victims with pods or room there), and the domain whose set is cheapest by the same
  measure, then needs the fewest, wins.
  ``preemption_refusal``: one that could never run as it is never preempts: held, a quota label naming an unknown
  node (the error is never read as "charged nowhere"), more than its quota allows even with nothing else charged,
  or more than the empty cluster. Strictly lower priority means a victim can never preempt its preemptor back: no
  loops.
- Who is no candidate at all is the caller's (``mcad.loop.evictions``): one that ran less than its minimum run time
  (``mcad.api.minruntime``), or that was evicted before and was dispatched again less than the cooldown ago
  (``Cooldowns``: bounded memory of who was evicted, dropped once the cooldown is over or the AppWrapper is gone).
- ``reclaim_victims``: for one that does not borrow at its own quota node yet does not fit because others borrowed
  above it, the borrowers to evict (``quota.QuotaLedger.reclaim_victims`` ranks and trims them), so that it fits
  the capacity once they are gone. ``blocked_by_reclaim``: while a reclaim waits for its victims, nobody may borrow
  in its trees again (the victims, requeued at their old places, would otherwise take the quota straight back).
- ``Preemptors`` remembers who waits for whose pods to go, since when, and who gave up waiting: a preemptor holds
  the queue while its victims are still there, for at most ``victim_timeout`` seconds; then it stops holding the
  queue and preempts nobody else until the very pods it gave up on are gone (else each timeout would evict
  another round of victims). A preemptor whose wait ended without it dispatching (victims gone, or given up on)
  may not preempt again for a backoff (``backing_off``), doubling per round up to a cap, reset when it dispatches.
  It also remembers whom each preemptor spared (``newly_spared``), so each one spared is counted once.
- ``EvictionBudget``: at most N victims evicted in any minute, over all preemptors and reclaims.
- ``Room``: whether victims go away for a queued AppWrapper (and which), or why it evicts nobody. ``Preemptors``
  and ``EvictionBudget`` copy themselves for a dry run to change as a cycle would.
- Pure: decisions over a ``Snapshot``; times are passed in; the caller requeues the victims and writes statuses.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.api.views import NodeView
from mcad.model import disclosure, quota
from mcad.model.accounting import Snapshot
from mcad.model.fit import Targets, could_ever_fit, fits_without
from mcad.model.placement import GPU
from mcad.model.plans import PlanEntry

Footprints = Callable[[str], Sequence[PlanEntry]]


# Work lost by evicting: (GPU-seconds, cpu core-seconds), compared GPUs first (a GPU hour costs more than any cpu
# hour), cpu deciding between AppWrappers that hold no GPU.
Work = tuple[float, float]
NO_WORK: Work = (0.0, 0.0)


def work_lost(demand: ResourceVector, run_seconds: float) -> Work:
    """What evicting an AppWrapper of ``demand`` that ran ``run_seconds`` throws away (see ``Work``)."""
    run = max(run_seconds, 0.0)
    return (demand.get(GPU) * run, demand.get("cpu") / 1000 * run)


def total_work(works: Iterable[Work]) -> Work:
    gpu = cpu = 0.0
    for g, c in works:
        gpu, cpu = gpu + g, cpu + c
    return (gpu, cpu)


def describe_work(work: Work) -> str:
    """``3.0 GPU-hours`` (when any GPU work is lost), else ``0.25 CPU-hours`` (two significant digits below one)."""
    seconds, unit = (work[0], "GPU") if work[0] > 0 else (work[1], "CPU")
    hours = seconds / 3600
    shown = f"{hours:.1f}" if hours >= 1 else f"{hours:.2g}"
    return f"{shown} {unit}-hours"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A dispatched AppWrapper that may be evicted: its key, priority and ``victim_rank``; the work evicting it
    loses and how long it has run (seconds)."""

    key: str
    priority: int
    rank: tuple[Any, ...]
    work: Work = NO_WORK
    run: float = 0.0


def victim_rank(priority: int, dispatched_at: datetime | None, created: datetime | None,
                key: str) -> tuple[Any, ...]:
    """Lowest priority, then most recently dispatched (then created), smallest first: quota reclaim's order, and
    priority preemption's last tie-break."""
    return (priority, -(dispatched_at.timestamp() if dispatched_at else 0.0),
            -(created.timestamp() if created else 0.0), key)


def preemption_refusal(aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, targets: Targets) -> str:
    """Why no eviction can ever make ``aw`` run as it is ("" when some might): it is held, its quota labels name a
    node that does not exist, it asks more than its quota allows at all, or it does not fit the empty cluster.
    Phrased to follow its Backoff message ("...; it evicts nobody: <this>")."""
    if aw.held:
        return "it is held (see above)"
    if snapshot.quota is not None:
        charges, unknown = snapshot.quota.forest.charges(aw.labels)
        if unknown:
            return "its quota labels name a quota node that does not exist"
        never = snapshot.quota.never_fits(charges, aw.demand)
        if never:
            return never
    if not could_ever_fit(aw, need, snapshot, targets):
        return "it would not fit even the empty cluster"
    return ""


def priority_victims(aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, targets: Targets,
                     candidates: Iterable[Candidate], footprint: Footprints) -> list[str]:
    """The lower-priority AppWrappers whose eviction makes ``aw`` fit: the lowest priorities, losing the least work,
    then the fewest (see the module docstring); [] when no choice does, and always when ``preemption_refusal`` has
    a reason (an error in its own quota is never read as "no quota to check")."""
    if preemption_refusal(aw, need, snapshot, targets):
        return []
    charges = snapshot.quota.forest.charges(aw.labels)[0] if snapshot.quota is not None else ()
    eligible = [(c, freed) for c in candidates if c.priority < aw.priority if (freed := footprint(c.key))]
    by_work = sorted(eligible, key=lambda e: (e[0].priority, e[0].work, e[0].rank))
    by_run = sorted(eligible, key=lambda e: (e[0].priority, e[0].run, e[0].rank))
    # The same order twice (one resource, equal demands) gives the same set: tried once.
    orders = [by_work] if [c.key for c, _ in by_run] == [c.key for c, _ in by_work] else [by_work, by_run]
    of = {c.key: c for c, _ in eligible}

    def cost(victims: list[str]) -> tuple[int, Work, int]:
        return (max(of[key].priority for key in victims), total_work(of[key].work for key in victims),
                len(victims))

    def fewest(among: list[tuple[Candidate, Sequence[PlanEntry]]],
               node_sets: Sequence[tuple[str, Sequence[NodeView]]] | None) -> list[str]:
        def fits_once_gone(victims: list[tuple[Candidate, Sequence[PlanEntry]]]) -> bool:
            if not fits_without(aw, need, snapshot, targets, [freed for _, freed in victims], node_sets):
                return False
            if snapshot.quota is None:
                return True
            trial = snapshot.quota.copy()  # what they are charged goes back to the quota trees too
            for victim, _ in victims:
                trial.release(victim.key)
            return trial.check(charges, aw.demand).fits

        chosen: list[tuple[Candidate, Sequence[PlanEntry]]] = []
        for entry in among:
            chosen.append(entry)
            if fits_once_gone(chosen):
                break
        else:
            return []
        # Drop any that are not needed, trying the costliest (last taken) first.
        for entry in reversed(chosen[:-1]):
            rest = [other for other in chosen if other is not entry]
            if fits_once_gone(rest):
                chosen.remove(entry)
        return [victim.key for victim, _ in chosen]

    def least_lost(names: set[str] | None,
                   node_sets: Sequence[tuple[str, Sequence[NodeView]]] | None) -> list[str]:
        """The cheapest of the orders' sets, among the candidates with pods or room on ``names`` (None: all)."""
        best: list[str] = []
        for order in orders:
            among = order if names is None else \
                [(c, freed) for c, freed in order if any(node in names for node, _, _ in freed)]
            victims = fewest(among, node_sets) if among else []
            if victims and (not best or cost(victims) < cost(best)):
                best = victims
        return best

    if not aw.topology_required:
        return least_lost(None, None)
    # One domain must hold it: the victims each domain needs, counting only those with pods or room there, and the
    # domain whose set costs least (``cost``: lowest top priority, least work, fewest), then the ones taken soonest
    # (ties: the domain's order).
    position = {c.key: i for i, (c, _) in enumerate(by_work)}
    best: tuple[tuple[int, Work, int], list[int], list[str]] | None = None
    for node_set in targets.node_sets(aw, snapshot):
        victims = least_lost({node.name for node in node_set[1]}, [node_set])
        if victims:
            score = (cost(victims), sorted(position[key] for key in victims), victims)
            if best is None or score[:2] < best[:2]:
                best = score
    return best[2] if best is not None else []


def reclaim_victims(aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, targets: Targets,
                    ranks: Mapping[str, tuple[Any, ...]], footprint: Footprints,
                    exclude: Iterable[str]) -> list[str]:
    """Borrowers to evict so that ``aw`` gets its own quota back and fits; [] when there is nobody to reclaim
    from or reclaiming would not make it fit. ``ranks``: the dispatched AppWrappers that may be evicted."""
    if snapshot.quota is None or aw.held:
        return []
    charges = snapshot.quota.forest.charges(aw.labels)[0]
    # Cheap first: most blocked AppWrappers have nobody to reclaim from (no copy of the ledger per cycle).
    if not charges or not snapshot.quota.borrowers(charges):
        return []
    excluded = set(exclude) | {k for k in snapshot.quota.charged_keys() if k not in ranks}

    def capacity_after(_trial: quota.QuotaLedger, victims: list[str]) -> bool:
        return fits_without(aw, need, snapshot, targets, [footprint(v) for v in victims])

    return snapshot.quota.reclaim_victims(charges, aw.demand, rank=lambda k: ranks[k], fits_after=capacity_after,
                                          exclude=excluded) or []


def blocked_by_reclaim(aw: AppWrapperView, quota_ledger: quota.QuotaLedger | None,
                       reclaiming: Mapping[str, quota.Charges]) -> str:
    """Why ``aw`` may not borrow now ("" if it may): a reclaim in one of its trees waits for its victims."""
    if not reclaiming or quota_ledger is None:
        return ""
    charges = quota_ledger.forest.charges(aw.labels)[0]
    trees = {tree for tree, _ in charges}
    for reclaimer, theirs in reclaiming.items():
        if reclaimer != aw.key and trees & {tree for tree, _ in theirs} and \
                quota_ledger.borrows_at_own_node(charges, aw.demand):
            return f"it would borrow quota that {disclosure.named(reclaimer, aw.namespace)} is reclaiming"
    return ""


@dataclass(frozen=True, slots=True)
class Room:
    """Whether victims go away for a queued AppWrapper that does not fit: ``holds``, they do (``victims``, chosen
    now or earlier; ``kind`` says how: waiting, preempting or reclaiming) and it holds the queue; else, when it
    outranks running work yet evicts nobody, ``about`` (compared between cycles) and ``why`` (for its Backoff
    message). ``spared``: who it would have evicted but spares (minimum run time, cooldown), worded by
    ``spared_phrase``; "" when nobody."""

    holds: bool
    about: str = ""
    why: str = ""
    kind: str = ""
    victims: tuple[str, ...] = ()
    spared: str = ""


NO_ROOM = Room(False)
WAITING_FOR_VICTIMS = "waiting"
PREEMPTING = "preempting"
RECLAIMING = "reclaiming"

# Why an AppWrapper that would have been a victim is spared (the label values of the spared metric).
SPARED_MIN_RUNTIME = "min-runtime"
SPARED_COOLDOWN = "cooldown"
SPARED_REASONS = (SPARED_MIN_RUNTIME, SPARED_COOLDOWN)


def spared_phrase(reasons: Iterable[str]) -> str:
    """``spares 2 AppWrapper(s) that ran less than their minimum run time and 1 preempted before and dispatched
    again less than the cooldown ago`` for the reasons of those spared (one each); "" for none."""
    reasons = list(reasons)
    parts = []
    if count := reasons.count(SPARED_MIN_RUNTIME):
        parts.append(f"{count} AppWrapper(s) that ran less than their minimum run time")
    if count := reasons.count(SPARED_COOLDOWN):
        parts.append(f"{count} AppWrapper(s) preempted before and dispatched again less than the preemption "
                     f"cooldown ago")
    return f"spares {' and '.join(parts)}" if parts else ""


class Cooldowns:
    """Who was evicted by preemption or quota reclaim: for ``seconds`` after it is dispatched again it is no
    priority preemption victim (0: off), so that two preemptors do not bounce one AppWrapper back and forth.

    Bounded: one entry per AppWrapper evicted whose cooldown is not over, dropped by the caller once it is
    (``done``) or once the AppWrapper is gone (``forget``), and at most ``MAX`` (the oldest go first: it then only
    loses its protection early). A restart forgets every cooldown. Times are wall-clock seconds, as status times
    are."""

    MAX = 10_000

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._evicted: OrderedDict[str, tuple[str, float]] = OrderedDict()  # key -> (uid evicted, when)

    def __len__(self) -> int:
        return len(self._evicted)

    def evicted(self, key: str, uid: str, now: float) -> None:
        if self.seconds <= 0:
            return
        self._evicted.pop(key, None)
        self._evicted[key] = (uid, now)
        while len(self._evicted) > self.MAX:
            self._evicted.popitem(last=False)

    def until(self, key: str, uid: str, dispatched: float | None) -> float:
        """When ``key`` (that very object, ``uid``), dispatched again at ``dispatched``, may be a victim again; 0
        when it was never evicted (or its cooldowns are off)."""
        entry = self._evicted.get(key)
        if entry is None or entry[0] != uid:
            return 0.0
        # Never counted from before the eviction: a status not yet showing the new dispatch holds it too.
        return max(entry[1], dispatched or 0.0) + self.seconds

    def done(self, key: str) -> None:
        """Its cooldown is over."""
        self._evicted.pop(key, None)

    forget = done


class EvictionBudget:
    """At most ``per_minute`` victims evicted in any 60 s (0: no bound), over every preemptor and reclaim: however
    the choice of victims goes wrong, the cluster loses at most that much work a minute. One round larger than the
    whole bound may go when nothing was evicted in the last minute (else it could never preempt at all)."""

    WINDOW = 60.0

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._times: deque[float] = deque()  # when each victim of the last minute was evicted; at most per_minute

    def _prune(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.WINDOW:
            self._times.popleft()

    def allows(self, victims: int, now: float) -> bool:
        if self.per_minute <= 0:
            return True
        self._prune(now)
        return not self._times or len(self._times) + victims <= self.per_minute

    def free_at(self, victims: int, now: float) -> float:
        """When ``allows(victims)`` turns true (``now`` if it is)."""
        if self.allows(victims, now):
            return now
        if victims > self.per_minute:
            return self._times[-1] + self.WINDOW  # an oversized round waits for an empty window
        must_age_out = len(self._times) + victims - self.per_minute  # >= 1, as it is not allowed now
        return self._times[must_age_out - 1] + self.WINDOW

    def copy(self) -> EvictionBudget:
        """A copy to spend in a dry run."""
        twin = EvictionBudget(self.per_minute)
        twin._times = self._times.copy()
        return twin

    def spend(self, victims: int, now: float) -> None:
        if self.per_minute <= 0:
            return
        self._prune(now)
        self._times.extend([now] * victims)
        while len(self._times) > max(self.per_minute, victims):  # bounded even after one oversized round
            self._times.popleft()


class Preemptors:
    """Who waits for which victims to go (and since when), who reclaims quota, who gave up waiting, and who must
    wait out a backoff before preempting again."""

    def __init__(self, victim_timeout: float, backoff: float = 0.0, backoff_cap: float = 0.0) -> None:
        self.victim_timeout = victim_timeout
        # A preemptor whose victims went (or that gave up on them) and that still did not dispatch preempts again
        # no sooner than backoff seconds later, doubling each round up to backoff_cap; dispatching resets it.
        self.backoff = backoff
        self.backoff_cap = max(backoff_cap, backoff)
        self._rounds: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self._waiting: dict[str, frozenset[str]] = {}
        self._since: dict[str, float] = {}
        # Reclaimer -> its charges (while its victims go, nobody else may borrow in those trees).
        self.reclaiming: dict[str, quota.Charges] = {}
        # Preemptors that stopped waiting: the victims, and the uids of their pods still there then.
        self._abandoned: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        # Preemptor -> those it spared so far (minimum run time, cooldown), until it dispatches or goes.
        self._spared: dict[str, frozenset[str]] = {}
        self.evicted = 0  # victims chosen so far, for /debug

    def __len__(self) -> int:
        return len(self._waiting)

    def copy(self) -> Preemptors:
        """A copy for a dry run to change as a cycle would change this one."""
        twin = Preemptors(self.victim_timeout, self.backoff, self.backoff_cap)
        twin._rounds = self._rounds.copy()
        twin._not_before = self._not_before.copy()
        twin._waiting = self._waiting.copy()
        twin._since = self._since.copy()
        twin.reclaiming = self.reclaiming.copy()
        twin._abandoned = self._abandoned.copy()
        twin._spared = self._spared.copy()
        twin.evicted = self.evicted
        return twin

    def __contains__(self, key: object) -> bool:
        return key in self._waiting

    def __iter__(self) -> Iterator[str]:
        """The preemptors waiting for their victims."""
        return iter(list(self._waiting))

    def start(self, key: str, victims: Iterable[str], now: float,
              reclaim: quota.Charges | None = None) -> frozenset[str]:
        """``key`` waits for ``victims`` to go, holding the queue; ``reclaim``: its quota charges, when it
        reclaims quota."""
        chosen = frozenset(victims)
        self._waiting[key] = chosen
        self._since[key] = now
        self._rounds[key] = self._rounds.get(key, 0) + 1
        self.evicted += len(chosen)
        if reclaim is not None:
            self.reclaiming[key] = reclaim
        return chosen

    def victims_of(self, key: str) -> frozenset[str]:
        return self._waiting.get(key, frozenset())

    def victims_taken(self) -> set[str]:
        """Victims some preemptor waits for: nobody else picks them again."""
        return {v for victims in self._waiting.values() for v in victims}

    def check(self, key: str, still_there: Callable[[str], bool], now: float) -> tuple[bool, frozenset[str]]:
        """(whether ``key`` still holds the queue for its victims, the victims it gives up on now). It holds while
        any victim is still there, for less than ``victim_timeout``; once all are gone or the time is up it holds
        nothing (and, when time is up, returns those still there)."""
        victims = self._waiting.get(key)
        if victims is None:
            return False, frozenset()
        left = frozenset(v for v in victims if still_there(v))
        if left and now - self._since.get(key, 0.0) < self.victim_timeout:
            return True, frozenset()
        self.done(key)
        # Its victims went (or it stops waiting for them) and it did not dispatch, or it would not be asked.
        if self.backoff > 0:
            rounds = self._rounds.get(key, 1)
            self._not_before[key] = now + min(self.backoff * 2 ** (rounds - 1), self.backoff_cap)
        return False, left

    def backing_off(self, key: str, now: float) -> float:
        """Seconds before ``key`` may preempt again (0: it may)."""
        until = self._not_before.get(key)
        if until is None:
            return 0.0
        if until <= now:
            del self._not_before[key]
            return 0.0
        return until - now

    def rounds(self, key: str) -> int:
        return self._rounds.get(key, 0)

    def dispatched(self, key: str) -> None:
        """It runs: it holds nothing and its next preemption (after a requeue) starts a fresh backoff."""
        self.done(key)
        self._rounds.pop(key, None)
        self._not_before.pop(key, None)
        self._spared.pop(key, None)

    def newly_spared(self, key: str, spared: Iterable[str]) -> frozenset[str]:
        """Those of ``spared`` that ``key`` had not spared before (each is counted once per preemptor)."""
        spared = frozenset(spared)
        before = self._spared.get(key, frozenset())
        if spared - before:
            self._spared[key] = before | spared
        return spared - before

    def done(self, key: str) -> None:
        """It dispatched, or its victims are gone: it holds nothing any more."""
        self._waiting.pop(key, None)
        self._since.pop(key, None)
        self.reclaiming.pop(key, None)

    def gave_up(self, key: str, victims: frozenset[str], pods_left: frozenset[str]) -> None:
        self._abandoned[key] = (victims, pods_left)

    def judged_apart(self, key: str) -> bool:
        """It waits for its victims, or gave up on them (``mcad.model.walk``: judged on its own)."""
        return key in self._waiting or key in self._abandoned

    def abandoned(self, key: str) -> frozenset[str]:
        """The victims it gave up waiting for (empty if none)."""
        entry = self._abandoned.get(key)
        return entry[0] if entry is not None else frozenset()

    def stuck(self, key: str, pod_exists: Callable[[str], bool]) -> bool:
        """It gave up on victims whose very pods are still there: preempting again would only add victims (a
        victim dispatched again later has new pods, which do not count)."""
        entry = self._abandoned.get(key)
        if entry is None:
            return False
        if any(pod_exists(uid) for uid in entry[1]):
            return True
        del self._abandoned[key]
        return False

    def forget(self, key: str) -> None:
        self.dispatched(key)
        self._abandoned.pop(key, None)

    def waiters(self) -> dict[str, frozenset[str]]:
        return dict(self._waiting)
