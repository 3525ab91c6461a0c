"""What a dispatch cycle would do now with each queued AppWrapper, deciding nothing (for /debug and mcadctl).

Contract:
- ``assess(...)`` walks the queue in dispatch order with the cycle's own rules (``fit.fits`` over a snapshot with
  the reservations of blocked ones taken as the walk makes them, backfill included (``mcad.model.reservations``, a dry
  run of its pass); one fit check per demand group: a group blocked once stays blocked; a reclaim under way holds
  back those that would borrow; a preemptor waiting for its victims holds back everything behind it, and strict
  FIFO what ``mcad.model.fifo`` says) and says,
  for each AppWrapper, its state (Queued, Draining: requeued and its old pods are still there, Preempting:
  waiting for victims), whether it fits now and why not.
- What would be dispatched is taken from the snapshot, and its quota charged there: the caller passes a snapshot
  whose quota ledger is a scratch copy (``Accountant.snapshot(scratch_quota=True)``). Nothing else is changed.
- The walk judges as a cycle does: group heads (``PendingQueue.cycle``), and only what a cycle would look at. Once a
  group is blocked the rest of it is told the same as its head's successor, and once the queue is held (a waiting
  preemptor, or strict FIFO held by the cluster) everything after is told so; those members are not visited. Its
  cost on the dispatcher thread is therefore O(groups + AppWrappers judged), not O(queue): 100,000 queued
  AppWrappers of a few demands cost a few fit checks and two copies of the queue's order (C speed). With strict
  FIFO every member is judged (a member's quota domain decides what it is told), as before.
- The result, a ``QueueAssessment``, says what every queued AppWrapper is told, by rule for the ones not visited.
  It holds only its own copies, so it may be read on any thread once the walk returned: iterating it (dispatch
  order, O(queue)) is for a reader's thread, ``of(key)``, ``position(key)`` and ``fitting_ahead(key)`` are cheap.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterator, KeysView, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from mcad.api.appwrapper import AppWrapperView
from mcad.model import disclosure
from mcad.model.fifo import BEHIND_IN_DOMAIN, BEHIND_STRICT_FIFO, StrictFifo
from mcad.model.fit import Targets, could_ever_fit, refused
from mcad.model.pending import Frozen, Order, PendingQueue
from mcad.model.preemption import Preemptors
from mcad.model.reservations import Pass


class AppWrappers(Protocol):
    """What assessing reads of the AppWrappers: one by key (the informer's store, ``mcad.k8s.informer.Store``)."""

    def get(self, key: str) -> AppWrapperView | None: ...


@dataclass(frozen=True, slots=True)
class Assessment:
    """What a dispatch cycle would do now with one queued AppWrapper."""

    key: str
    state: str  # Queued, Draining (requeued; its old pods are still there), Preempting (waiting for victims)
    fits_now: bool
    why: str
    # The reservation it holds (mcad.model.reservations.Pass.describe: nodes or amount, and when it is sure to start),
    # if any.
    reservation: Mapping[str, object] | None = None


class QueueAssessment:
    """What every queued AppWrapper is told, from one walk (see the module docstring). Read-only, thread-safe."""

    def __init__(self, queue: Frozen, judged: Mapping[str, Assessment], blocked: Mapping[Hashable, str],
                 held_after: Order | None, held: Callable[[str], str] | None) -> None:
        # Every queued key's order, in dispatch order (the order's last element is the key); read, never changed.
        self.orders = queue.orders
        self.per_namespace = queue.per_namespace  # how many are queued in each namespace
        self._entries = queue.entries  # key -> its order and pending group
        self._judged = judged  # the ones the walk looked at
        # group -> what its members not looked at are told; by the group object's identity, which every member's
        # entry shares (``PendingQueue``): a group is a tuple of tuples, hashed anew on every lookup.
        self._blocked = {id(group): why for group, why in blocked.items()}
        self._held_after = held_after  # everything after this order is held back (by ``held``)
        self._held = held

    def __len__(self) -> int:
        return len(self.orders)

    def __iter__(self) -> Iterator[Assessment]:
        """Every queued AppWrapper's assessment, in dispatch order (O(queue): not on the dispatcher thread)."""
        for order in self.orders:
            found = self.told(order)
            if found is not None:
                yield found

    def keys(self) -> KeysView[str]:
        """The keys queued when the walk ran."""
        return self._entries.keys()

    def judged(self) -> list[Assessment]:
        """The ones the walk looked at (waiting preemptors first, then in dispatch order): every one that fits now
        or holds a reservation is among them."""
        return list(self._judged.values())

    def of(self, key: str) -> Assessment | None:
        index = self._index(key)
        return None if index is None else self.told(self.orders[index])

    def position(self, key: str) -> int:
        """1-based place in dispatch order; 0 when it was not queued."""
        index = self._index(key)
        return 0 if index is None else index + 1

    def fitting_ahead(self, key: str) -> int:
        """How many ahead of ``key`` fit now (only judged ones can: those not visited are blocked or held)."""
        place = self.position(key)
        return sum(1 for other in self._judged.values()
                   if other.fits_now and 0 < self.position(other.key) < place)

    def _index(self, key: str) -> int | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        index = bisect.bisect_left(self.orders, entry.order)
        return index if index < len(self.orders) and self.orders[index] == entry.order else None

    def is_told(self, order: Order) -> bool:
        """Whether ``told(order)`` has an answer, without making it: what a page asks of each row it skips."""
        key = order[2]
        if key in self._judged or (self._held is not None and self._held_after is not None
                                   and order > self._held_after):
            return True
        entry = self._entries.get(key)
        return entry is not None and id(entry.group) in self._blocked

    def told(self, order: Order) -> Assessment | None:
        """What the queued AppWrapper of this order (one of ``orders``) is told."""
        key = order[2]
        found = self._judged.get(key)
        if found is not None:
            return found
        if self._held is not None and self._held_after is not None and order > self._held_after:
            return Assessment(key, "Queued", False, self._held(key.partition("/")[0]))
        entry = self._entries.get(key)
        why = None if entry is None else self._blocked.get(id(entry.group))
        return None if why is None else Assessment(key, "Queued", False, why)


def assess(pending: PendingQueue, appwrappers: AppWrappers, reserving: Pass, *,
           preemptors: Preemptors, draining: Callable[[AppWrapperView], bool],
           blocked_by_reclaim: Callable[[AppWrapperView], str], strict_fifo: bool,
           targets: Targets) -> QueueAssessment:
    queue = pending.frozen()
    blocked: dict[Hashable, str] = {}
    judged: dict[str, Assessment] = {}
    quota = reserving.snapshot.quota
    fifo = StrictFifo(quota.forest if quota is not None else None) if strict_fifo else None
    reserved_heads: set[Hashable] = set()  # groups whose head took a reservation
    # Waiting preemptors are told so wherever they stand; the first of them holds back everything behind it.
    first_preemptor: tuple[Order, str] | None = None
    for key in preemptors:
        aw = appwrappers.get(key)
        entry = pending.entry(key)
        if aw is None or entry is None:
            continue
        victims = disclosure.listed(preemptors.victims_of(key), aw.namespace)
        judged[key] = Assessment(key, "Preempting", False,
                                 f"waiting for lower-priority AppWrappers it preempted to leave: {victims}")
        if first_preemptor is None or entry[0] < first_preemptor[0]:
            first_preemptor = (entry[0], key)
    # Why everything behind a blocked head waits (strict FIFO, or a waiting preemptor), worded for a reader's
    # namespace, and the order after which it does.
    held: Callable[[str], str] | None = None
    held_after: Order | None = None
    cursor = pending.cycle()
    while (candidate := cursor.next()) is not None:
        key = candidate[0]
        aw = appwrappers.get(key)
        entry = pending.entry(key)
        if aw is None or entry is None or key in judged:
            cursor.passed()
            continue
        order, group = entry
        if held is None and first_preemptor is not None and order > first_preemptor[0]:
            held, held_after = partial(disclosure.held_behind_preemptor, first_preemptor[1]), first_preemptor[0]
        if held is not None:
            # Held back: only a draining one (always alone in its group) is told otherwise; the rest of the group
            # is told by rule.
            if draining(aw):
                judged[key] = Assessment(key, "Draining", False,
                                         "requeued; waiting for the pods of its previous dispatch to go")
            cursor.blocked()
            continue
        if draining(aw):
            judged[key] = Assessment(key, "Draining", False,
                                     "requeued; waiting for the pods of its previous dispatch to go")
            cursor.passed()
            continue
        if fifo is not None and fifo.held(aw):
            judged[key] = Assessment(key, "Queued", False, BEHIND_IN_DOMAIN)
            cursor.passed()
            continue
        if group in blocked:
            # The member after a head that took a reservation (or, with strict FIFO, any member: all are visited).
            if group in reserved_heads:  # the head's message tells of its own reservation, not of theirs
                need = reserving.snapshot.need(key, aw.demand)
                blocked[group] = reserving.explain(aw, need, reserving.fit(aw, need))[1]()
                reserved_heads.discard(group)
            judged[key] = Assessment(key, "Queued", False, blocked[group])
            if fifo is None:
                cursor.blocked()
            else:
                cursor.passed()
            continue
        snapshot = reserving.snapshot
        need = snapshot.need(key, aw.demand)
        fit = reserving.fit(aw, need)
        reclaimed = blocked_by_reclaim(aw) if fit.fits else ""
        if reclaimed:
            judged[key] = Assessment(key, "Queued", False, reclaimed)
            if fifo is not None:
                fifo.hold(aw, refused("reclaim", reclaimed))  # its domain waits behind it
        elif fit.fits:
            snapshot.take(need, fit.plan)
            if snapshot.quota is not None:
                snapshot.quota.charge(key, aw.labels, aw.demand)
            judged[key] = Assessment(key, "Queued", True, "fits now: the next dispatch cycle dispatches it")
        else:
            held_before = len(reserving.made)
            why = fit.why() if strict_fifo else reserving.wait(aw, need, fit)[1]()
            made = reserving.made[-1] if len(reserving.made) > held_before else None
            if made is None or reserving.full:  # as in a cycle: else the next of its group is judged too
                blocked[group] = why
                if made is not None:
                    reserved_heads.add(group)
            judged[key] = Assessment(key, "Queued", False, why,
                                     reserving.describe(made) if made is not None else None)
            if fifo is not None and could_ever_fit(aw, need, snapshot, targets, fit) and fifo.hold(aw, fit):
                held, held_after = _behind_strict_fifo, order
            if group in blocked and group not in reserved_heads and fifo is None:
                cursor.blocked()
                continue
        cursor.passed()
    if held is None and first_preemptor is not None:
        held, held_after = partial(disclosure.held_behind_preemptor, first_preemptor[1]), first_preemptor[0]
    return QueueAssessment(queue, judged, blocked, held_after, held)


def _behind_strict_fifo(_reader: str) -> str:
    return BEHIND_STRICT_FIFO  # names nobody: the same for every reader
