"""The one pass: the queue walked in dispatch order, with the verdict of the scheduling rules on each one looked at.

Contract:
- ``walk(pending, appwrappers, reserving, rules, ...)`` yields a ``Verdict`` for each AppWrapper it looks at, in
  dispatch order. The dispatch cycle (``mcad.loop.cycle``) runs it with rules that act; the dry run behind
  explain, ``/debug/queue``, the dashboard and ``mcadctl`` (``mcad.model.assess``) runs it with rules that only
  peek, over copies. Both read the same verdicts, so a scheduling rule is written here, once, and what explain says
  is what the next cycle does with the same state.
- The rules, in the order they apply to a candidate:
  1. ``GONE``: deleted, or decided meanwhile (no longer queued): the cycle drops it from the queue.
  2. ``DRAINING``: requeued, and the pods of its previous dispatch are still there; its group (of its own) waits.
  3. ``RETRYING``: its last dispatch failed and its backoff has not passed.
  4. ``BEHIND_IN_DOMAIN`` (strict FIFO): an earlier one of its quota domain waits (a waiting preemptor is exempt).
  5. ``DISPATCH``: it fits (``Pass.fit``: reservations taken, backfill for a bounded run time) and no quota
     reclaim under way holds back its borrowing. The walk takes its room from the pass's snapshot and calls
     ``rules.dispatch`` before yielding (the cycle reserves it and starts writing; a dry run charges its scratch
     quota ledger), so those behind it are judged on what is left.
  6. ``HOLDS``: it does not fit, and victims go away for it (``rules.makes_room``: chosen earlier and still
     there, or chosen now by quota reclaim or priority preemption). Nothing behind it is judged: the cycle stops.
  7. ``WAITS``: everything else; with ``about`` and ``why`` for its status (what it lacks, whose reservations keep
     it out, why it evicts nobody though it outranks running work, that its victims did not go) and the
     reservation it took, if any (``Pass.wait``; never with strict FIFO, where it holds its domain or the whole
     cluster instead, unless it could never fit, when it holds nothing and says so).
- With fair sharing a group is one tenant's, and groups that differ only in their tenant (``pending.alike``) are
  judged alike: once one of them waits without a reservation and its group is blocked, a later one of the same
  priority is told the same (``WAITS``, blocked, what it lacks; its message worded for it when it is read),
  without a second fit check. Within a pass free room only shrinks and reservations only grow, so the second
  check could only find less. Not with strict FIFO, nor for one that waits for victims it chose, whose victims
  did not go, or that outranks running work (those verdicts say more than what the group lacks).
  With ``dropped`` (the dispatch cycle), those later groups are not even looked at: the pass drops them
  (``Cursor.drop_alike``: same priority, not a preemptor waiting for its victims nor one whose victims did not go)
  and records each one's head in ``dropped``, under the key of the one judged, for the caller to tell them what it
  was told; a dry run (``dropped`` None) yields each one's verdict.
- Each verdict carries how the walk goes on after it (``step``): ``PASSED`` (the next of its group is a candidate),
  ``BLOCKED`` (the rest of its group is not looked at in this pass: they are judged alike) or ``STOP`` (nothing
  after it is). With ``past_hold`` (a dry run), the walk goes on after a ``STOP`` to tell each further group's head
  ``HELD`` (or ``DRAINING``), judging nothing.
- Cost: O((candidates passed + groups) · log groups) per walk (``mcad.model.pending.Cursor``): a group blocked
  once costs one judgement, whatever its size, and with fair sharing so do all the tenants' groups alike to it.
- The queue must not change while a walk is in progress; verdicts are read on the dispatcher thread.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ZERO, ResourceVector
from mcad.model import disclosure, topology
from mcad.model.accounting import Snapshot
from mcad.model.fifo import BEHIND_IN_DOMAIN as BEHIND_IN_DOMAIN_WHY
from mcad.model.fifo import StrictFifo
from mcad.model.fit import Fit, Targets, could_ever_fit, refused
from mcad.model.pending import Order, PendingQueue, alike
from mcad.model.preemption import Room, preemption_refusal
from mcad.model.reservations import Pass, Reservation

GONE = "gone"
DRAINING = "draining"
RETRYING = "retrying"
BEHIND_IN_DOMAIN = "behind in domain"
DISPATCH = "dispatch"
HOLDS = "holds"
WAITS = "waits"
HELD = "held"

PASSED = "passed"
BLOCKED = "blocked"
STOP = "stop"

NEVER_FITS = "never fits"
VICTIMS_STUCK = "victims stuck"


class AppWrappers(Protocol):
    """What the walk reads of the AppWrappers: one by key (the informer's store, ``mcad.k8s.informer.Store``)."""

    def get(self, key: str) -> AppWrapperView | None: ...


class Rules(Protocol):
    """What the walk asks of the owners: facts it cannot see in the snapshot, and the acts of a pass."""

    @property
    def victim_timeout(self) -> float: ...

    def queued(self, aw: AppWrapperView) -> bool:
        """Still queued: not deleted, dispatched or decided meanwhile."""
        ...

    def draining(self, aw: AppWrapperView) -> bool: ...

    def retrying(self, key: str) -> bool:
        """Its last dispatch failed and its backoff has not passed."""
        ...

    def preempting(self, key: str) -> bool:
        """It waits for victims it chose."""
        ...

    def blocked_by_reclaim(self, aw: AppWrapperView) -> str: ...

    def makes_room(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, *, reclaim: bool) -> Room:
        """Whether victims go away for ``aw``, which does not fit (the cycle's rules evict them)."""
        ...

    def abandoned(self, key: str) -> frozenset[str]:
        """The victims it gave up waiting for."""
        ...

    def judged_apart(self, key: str) -> bool:
        """It is a preemptor waiting for its victims, or one whose victims did not go: with fair sharing it is judged
        on its own even where its group is alike to another tenant's (``preempting`` or ``abandoned``)."""
        ...

    def dispatch(self, aw: AppWrapperView, fit: Fit) -> None:
        """It is dispatched in this pass (its room is already taken from the snapshot)."""
        ...


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the pass decides for one AppWrapper it looks at (see the module docstring)."""

    kind: str
    key: str
    order: Order
    group: Hashable
    step: str
    aw: AppWrapperView | None = None
    need: ResourceVector = ZERO
    fit: Fit | None = None
    about: frozenset[str] = frozenset()
    why: Callable[[], str] = str
    room: Room | None = None  # HOLDS: who goes away for it
    made: Reservation | None = None  # WAITS: the reservation it took


def walk(pending: PendingQueue, appwrappers: AppWrappers, reserving: Pass, rules: Rules, *, strict_fifo: bool,
         targets: Targets, past_hold: bool = False, dropped: dict[str, list[str]] | None = None) -> Iterator[Verdict]:
    snapshot = reserving.snapshot
    cursor = pending.cycle(reserving.fair.score if reserving.fair is not None else None)
    if dropped is not None:
        cursor.dropped = dropped
    fifo = StrictFifo(snapshot.quota.forest if snapshot.quota is not None else None) if strict_fifo else None
    held = False
    # Fair sharing: the verdict of a blocked group, by what a fit check sees of it (see the module docstring).
    judged_alike: dict[Hashable, Verdict] = {}
    while (candidate := cursor.next()) is not None:
        key = candidate[0]
        aw = appwrappers.get(key)
        entry = pending.entry(key)
        order, group = entry if entry is not None else ((0, "", key), key)
        if aw is None or not rules.queued(aw):  # 1
            cursor.passed()
            yield Verdict(GONE, key, order, group, PASSED)
            continue
        if held:
            # Past the one that holds the queue (a dry run only): a group's head says what its group waits for.
            cursor.blocked()
            yield Verdict(DRAINING if rules.draining(aw) else HELD, key, order, group, BLOCKED, aw)
            continue
        verdict = _judge(aw, order, group, reserving, rules, fifo, strict_fifo=strict_fifo, targets=targets,
                         judged_alike=judged_alike)
        if verdict.step == PASSED:
            cursor.passed()
        elif verdict.step == BLOCKED:
            if dropped is not None and judged_alike.get(alike(group)) is verdict:
                cursor.drop_alike(rules.judged_apart)
            cursor.blocked()
        elif past_hold:
            cursor.blocked()
            held = True
        else:
            cursor.stop()
        yield verdict


def _judge(aw: AppWrapperView, order: Order, group: Hashable, reserving: Pass, rules: Rules,
           fifo: StrictFifo | None, *, strict_fifo: bool, targets: Targets,
           judged_alike: dict[Hashable, Verdict]) -> Verdict:
    key = aw.key
    snapshot = reserving.snapshot
    if rules.draining(aw):  # 2
        return Verdict(DRAINING, key, order, group, BLOCKED, aw)
    if rules.retrying(key):  # 3
        return Verdict(RETRYING, key, order, group, PASSED, aw)
    if fifo is not None and not rules.preempting(key) and fifo.held(aw):  # 4
        # A group shares its quota nodes: when its domain holds it by quota, all its members are held alike.
        return Verdict(BEHIND_IN_DOMAIN, key, order, group, BLOCKED if fifo.by_quota(aw) else PASSED, aw,
                       about=frozenset({BEHIND_IN_DOMAIN_WHY}), why=partial(str, BEHIND_IN_DOMAIN_WHY))
    # Its own pods can exist already (the controller stopped between creating its objects and recording that):
    # they are in use, so only the rest of the demand must fit.
    need = snapshot.need(key, aw.demand)
    base = alike(group)
    earlier = judged_alike.get(base) if base is not group else None
    if (earlier is not None and earlier.order[0] == order[0] and earlier.fit is not None
            and not rules.judged_apart(key)):
        return Verdict(WAITS, key, order, group, BLOCKED, aw, need, earlier.fit, earlier.about,
                       partial(_worded_for, reserving, aw, need))
    fit = reserving.fit(aw, need)
    reclaim = rules.blocked_by_reclaim(aw) if fit.fits else ""
    if reclaim:
        fit = refused("reclaim", reclaim)
    if fit.fits:  # 5
        reserving.take(aw, need, fit)
        rules.dispatch(aw, fit)
        return Verdict(DISPATCH, key, order, group, PASSED, aw, need, fit)
    room = rules.makes_room(aw, need, snapshot, reclaim=not reclaim)  # 6
    if room.holds:
        return Verdict(HOLDS, key, order, group, STOP, aw, need, fit, room=room)
    # 7
    made_before = len(reserving.made)
    if strict_fifo:
        about, why = fit.about, fit.why
    elif rules.abandoned(key):
        # Its victims did not go: holding their room for it could hold it for ever (a pod finalizer).
        about, why = reserving.explain(aw, need, fit)
    else:
        # A gang that asks for a topology level fits by its own home domain (``mcad.model.fit.Homes``), not only by
        # its group: its fits are not shared with its group's.
        about, why = reserving.wait(aw, need, fit, None if topology.asks(aw) else group)
    made = reserving.made[-1] if len(reserving.made) > made_before else None
    gave_up_on = rules.abandoned(key)
    if gave_up_on:
        gave_up = (f"its preemption victims did not finish terminating within {rules.victim_timeout:g} s "
                   f"({disclosure.listed(gave_up_on, aw.namespace)}), so it no longer holds the queue")
        about, why = about | {VICTIMS_STUCK}, partial(_joined, why, gave_up)
    if room.about:  # it outranks running work, yet evicts nobody: say why
        about, why = about | {room.about}, partial(_joined, why, room.why)
    if fifo is None:
        # The next of its group takes the next reservation (other nodes), if it may.
        step = PASSED if made is not None and not reserving.full else BLOCKED
        verdict = Verdict(WAITS, key, order, group, step, aw, need, fit, about, why, made=made)
        if step == BLOCKED and made is None and not gave_up_on and not room.about and base is not group:
            judged_alike[base] = verdict
        return verdict
    if not could_ever_fit(aw, need, snapshot, targets, fit):
        # It would hold everyone behind it for ever: let them pass, and say so.
        never = preemption_refusal(aw, need, snapshot, targets)
        if not never or never == "it would not fit even the empty cluster":
            never = "it cannot fit even the empty cluster"
        return Verdict(WAITS, key, order, group, BLOCKED, aw, need, fit, about | {NEVER_FITS},
                       partial(_joined, why, f"{never}, so it does not hold the queue (strict FIFO)"))
    # It waits for the cluster's room: everything behind it waits; or on its quota: what it holds is in fifo, and
    # its group is held alike.
    step = STOP if fifo.hold(aw, fit) else BLOCKED
    return Verdict(WAITS, key, order, group, step, aw, need, fit, about, why)


def worded_for(reserving: Pass, aw: AppWrapperView) -> Callable[[], str]:
    """Why ``aw``, judged alike to another tenant's group, waits, worded for it when read (``_worded_for``)."""
    return partial(_worded_for, reserving, aw, reserving.snapshot.need(aw.key, aw.demand))


def _worded_for(reserving: Pass, aw: AppWrapperView, need: ResourceVector) -> str:
    """Why ``aw``, judged alike to another tenant's group, waits, worded for it (a fit's message names the wrapped
    objects, a reservation's its namespace): its own fit, made only when its message is read."""
    return reserving.explain(aw, need, reserving.fit(aw, need))[1]()


def _joined(first: Callable[[], str], then: str) -> str:
    return f"{first()}; {then}"
