"""What a dispatch cycle would do now with each queued AppWrapper, deciding nothing (for /debug and mcadctl).

Contract:
- ``assess(...)`` is the dispatch cycle's own pass (``mcad.model.walk``) run with rules that peek (the caller's:
  ``mcad.loop.cycle.DispatchCycle.assess``, over copies of who waits for whose victims, evicting nobody) and read
  as what each queued AppWrapper is told: its state (Queued; Draining: requeued and its old pods are still there;
  Preempting: waiting for victims), whether it fits now (the next cycle dispatches it) and why not, and the
  reservation it holds. One that would preempt or reclaim says whom the next cycle evicts for it.
- What would be dispatched is taken from the snapshot, and its quota charged there: the caller passes a snapshot
  whose quota ledger is a scratch copy (``Accountant.snapshot(scratch_quota=True)``). Nothing else is changed.
- Where the cycle stops (a preemptor holds the queue, or strict FIFO waits for the cluster's room) the walk goes
  on only to tell each group's head that it is held; the members of a group the walk blocked are told by rule as
  their head's successor would be. Its cost on the dispatcher thread is therefore O(groups + AppWrappers judged),
  not O(queue): 100,000 queued AppWrappers of a few demands cost a few fit checks and two copies of the queue's
  order (C speed).
- The result, a ``QueueAssessment``, says what every queued AppWrapper is told, by rule for the ones not visited:
  a member of a blocked group is told what the group's next one would be, worded for that one (naming its wrapped
  objects), so a member in another namespace is told only that an AppWrapper in another namespace ahead of it
  with the same demand does not fit (``mcad.model.disclosure``).
  It holds only its own copies, so it may be read on any thread once the walk returned: iterating it (dispatch
  order, O(queue)) is for a reader's thread, ``of(key)``, ``position(key)`` and ``fitting_ahead(key)`` are cheap.
- Dispatch order is priority, then age; with fair sharing it is the walk's order, then the rest as
  ``mcad.model.fairshare.projected_order`` projects them (as a cycle would take them if all their room freed). That
  projection is made on the first reader's thread that asks (``in_dispatch_order``, ``position``,
  ``dispatch_order``: O(queue x log tenants) once, then a lookup), from copies taken on the dispatcher thread
  (each group's tenant, each tenant's score and weight: O(groups)), never on the dispatcher thread.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterator, KeysView, Mapping
from dataclasses import dataclass
from functools import partial

from mcad.api.appwrapper import AppWrapperView
from mcad.model import disclosure
from mcad.model.estimate import Estimate
from mcad.model.fairshare import ENTRY_SECONDS, projected_order, share
from mcad.model.fifo import BEHIND_IN_DOMAIN as BEHIND_IN_DOMAIN_WHY
from mcad.model.fifo import BEHIND_STRICT_FIFO
from mcad.model.fit import Targets
from mcad.model.pending import Frozen, Order, PendingQueue
from mcad.model.preemption import RECLAIMING, WAITING_FOR_VICTIMS
from mcad.model.reservations import Pass
from mcad.model.walk import (
    BLOCKED,
    DISPATCH,
    DRAINING,
    GONE,
    HELD,
    HOLDS,
    NEVER_FITS,
    RETRYING,
    STOP,
    WAITS,
    AppWrappers,
    Rules,
    Verdict,
    walk,
)


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
    # Whom the next cycle evicts for it (preemption or quota reclaim), or whose going it waits for (Preempting): keys
    # of any namespace, for the controller and tests; a reader is shown ``why``, worded for its namespace.
    evicts: tuple[str, ...] = ()


class QueueAssessment:
    """What every queued AppWrapper is told, from one walk (see the module docstring). Read-only, thread-safe."""

    def __init__(self, queue: Frozen, judged: Mapping[str, Assessment], blocked: Mapping[Hashable, tuple[str, str]],
                 held_after: Order | None, held: Callable[[str], str] | None,
                 projection: Callable[[], list[str]] | None = None) -> None:
        # Every queued key's order, in dispatch order (the order's last element is the key); read, never changed.
        self.orders = queue.orders
        self.per_namespace = queue.per_namespace  # how many are queued in each namespace
        self._entries = queue.entries  # key -> its order and pending group
        self._judged = judged  # the ones the walk looked at
        # group -> what its members not looked at are told, and the namespace of the one it was worded for ("": it
        # names nobody); by the group object's identity, which every member's entry shares (``PendingQueue``): a
        # group is a tuple of tuples, hashed anew on every lookup.
        self._blocked = {id(group): told for group, told in blocked.items()}
        self._held_after = held_after  # everything after this order is held back (by ``held``)
        self._held = held
        self.walked: tuple[str, ...] = ()  # the keys the walk judged, in the order it judged them
        self._estimates: Mapping[str, Estimate] = {}
        # With fair sharing: the queue's keys as fair sharing would take them, made once when first asked.
        self._projection = projection
        self._fair_orders: list[Order] | None = None
        self._fair_places: dict[str, int] = {}

    def estimated(self, estimates: Mapping[str, Estimate]) -> None:
        """Each estimated AppWrapper's start (``mcad.model.estimate``), set once by whoever made the assessment."""
        self._estimates = estimates

    def estimate(self, key: str) -> Estimate | None:
        """When ``key`` is expected to start; None when it was not estimated (too far back in the queue)."""
        return self._estimates.get(key)

    def estimates(self) -> Mapping[str, Estimate]:
        """Every estimated AppWrapper's start (at most ``mcad.model.estimate.ESTIMATED`` of them)."""
        return self._estimates

    def dispatch_order(self) -> Iterator[str]:
        """The queued keys as the walk took them (fair sharing's order included), then the rest in their order."""
        if self._projection is not None:
            yield from (order[2] for order in self.in_dispatch_order())
            return
        yield from self.walked
        seen = set(self.walked)
        yield from (order[2] for order in self.orders if order[2] not in seen)

    def in_dispatch_order(self) -> list[Order]:
        """Every queued order in dispatch order: ``orders``, or with fair sharing the walk's then the projection's
        (see the module docstring)."""
        if self._projection is None:
            return self.orders
        if self._fair_orders is None:
            # Two readers racing make the same lists; each is set whole, the places before the orders they index.
            walked = [key for key in self.walked if key in self._entries]
            seen = set(walked)
            keys = walked + [key for key in self._projection() if key not in seen and key in self._entries]
            self._fair_places = {key: place for place, key in enumerate(keys, 1)}
            self._fair_orders = [self._entries[key].order for key in keys]
        return self._fair_orders

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
        if self._projection is not None:
            self.in_dispatch_order()
            return self._fair_places.get(key, 0)
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
        told = None if entry is None else self._blocked.get(id(entry.group))
        if told is None:
            return None
        why, worded_for = told
        if worded_for and not disclosure.same_namespace(key, worded_for):
            why = disclosure.judged_alike()  # that wording names the other one's objects
        return Assessment(key, "Queued", False, why)


def assess(pending: PendingQueue, appwrappers: AppWrappers, reserving: Pass, rules: Rules, *, strict_fifo: bool,
           targets: Targets, preempting: Mapping[str, frozenset[str]]) -> QueueAssessment:
    """The walk's verdicts (``mcad.model.walk``, going on past a hold) as what each queued AppWrapper is told.
    ``preempting``: the preemptors waiting for their victims (told so even where the walk does not reach them)."""
    queue = pending.frozen()
    blocked: dict[Hashable, tuple[str, str]] = {}
    judged: dict[str, Assessment] = {}
    held: Callable[[str], str] | None = None
    held_after: Order | None = None
    walked: list[str] = []
    for verdict in walk(pending, appwrappers, reserving, rules, strict_fifo=strict_fifo, targets=targets,
                        past_hold=True):
        key, kind = verdict.key, verdict.kind
        if kind in (GONE, HELD):
            continue  # a held one is told by rule (held_after), as are the rest of its group
        walked.append(key)
        judged[key] = _assessment(verdict, reserving)
        if kind == HOLDS or verdict.step == STOP:
            held_after = verdict.order
            held = partial(disclosure.held_behind_preemptor, key) if kind == HOLDS else _behind_strict_fifo
        elif verdict.step == BLOCKED and kind != DRAINING:  # a draining one is alone in its group
            blocked[verdict.group] = _members_told(verdict, reserving, strict_fifo=strict_fifo,
                                                   successor=_successor(pending, appwrappers, key))
    for key, victims in preempting.items():
        # Beyond where the walk stopped, or in a group it did not reach: still preempting.
        aw = appwrappers.get(key)
        if key not in judged and aw is not None and pending.entry(key) is not None:
            judged[key] = _preempting(key, victims, aw.namespace)
    assessed = QueueAssessment(queue, judged, blocked, held_after, held,
                               _fair_projection(pending, queue, appwrappers, reserving))
    assessed.walked = tuple(walked)
    return assessed


def _fair_projection(pending: PendingQueue, queue: Frozen, appwrappers: AppWrappers,
                     reserving: Pass) -> Callable[[], list[str]] | None:
    """With fair sharing, how a reader's thread projects the queue's order (``projected_order``), from copies
    taken here: each group's tenant, each tenant's score (usage over weight) and weight; None without."""
    fair = reserving.fair
    if fair is None:
        return None
    tenants = pending.tenants()
    weights = {tenant: fair.weight(tenant) for tenant in set(tenants.values())}
    scores = {tenant: fair.usage.get(tenant, 0.0) / weight for tenant, weight in weights.items()}
    capacity, entries = reserving.snapshot.capacity, queue.entries

    def tenant(key: str) -> str:
        entry = entries.get(key)
        return tenants.get(entry.group, "") if entry is not None else ""

    def taken(key: str) -> float:
        aw = appwrappers.get(key)
        if aw is None:
            return 0.0
        return share(aw.demand, capacity) * ENTRY_SECONDS / weights.get(tenant(key), 1.0)

    return lambda: projected_order(queue.orders, tenant, taken, scores)


def _assessment(verdict: Verdict, reserving: Pass) -> Assessment:
    key, kind = verdict.key, verdict.kind
    aw = verdict.aw
    namespace = aw.namespace if aw is not None else disclosure.namespace_of(key)
    if kind == DRAINING:
        return Assessment(key, "Draining", False, "requeued; waiting for the pods of its previous dispatch to go")
    if kind == RETRYING:
        return Assessment(key, "Queued", False, "its last dispatch failed: it is dispatched again once its backoff "
                                                "has passed, if it still fits")
    if kind == DISPATCH:
        return Assessment(key, "Queued", True, "fits now: the next dispatch cycle dispatches it")
    if kind == HOLDS and verdict.room is not None:
        room = verdict.room
        victims = disclosure.listed(room.victims, namespace)
        if room.kind == WAITING_FOR_VICTIMS:
            return _preempting(key, frozenset(room.victims), namespace)
        if room.kind == RECLAIMING:
            return Assessment(key, "Queued", False, f"the next dispatch cycle reclaims quota borrowed by "
                                                    f"{len(room.victims)} AppWrapper(s) to make room: {victims}",
                              evicts=room.victims)
        spares = f"; it {room.spared}" if room.spared else ""
        return Assessment(key, "Queued", False, f"the next dispatch cycle preempts {len(room.victims)} "
                                                f"lower-priority AppWrapper(s) to make room: {victims}{spares}",
                          evicts=room.victims)
    made = verdict.made
    return Assessment(key, "Queued", False, verdict.why(), reserving.describe(made) if made is not None else None)


def _preempting(key: str, victims: frozenset[str], namespace: str) -> Assessment:
    return Assessment(key, "Preempting", False, f"waiting for lower-priority AppWrappers it preempted to leave: "
                                                f"{disclosure.listed(victims, namespace)}",
                      evicts=tuple(sorted(victims)))


def _successor(pending: PendingQueue, appwrappers: AppWrappers, key: str) -> AppWrapperView | None:
    after = pending.next_in_group(key)
    return None if after is None else appwrappers.get(after)


def _members_told(verdict: Verdict, reserving: Pass, *, strict_fifo: bool,
                  successor: AppWrapperView | None) -> tuple[str, str]:
    """What the members of a group the walk blocked at ``verdict`` are told (they are judged alike): what the
    next of them, ``successor``, would be told; with the namespace of the one it is worded for ("": it names
    nobody). The wording names that one's wrapped objects: members in other namespaces are told it by rule
    (``QueueAssessment.told``)."""
    if verdict.kind == WAITS and verdict.made is not None and successor is not None:
        # Its head took the last reservation: they wait behind it (its own message tells of what it lacks).
        need = reserving.snapshot.need(successor.key, successor.demand)
        return reserving.explain(successor, need, reserving.fit(successor, need))[1](), successor.namespace
    if strict_fifo and verdict.kind == WAITS and NEVER_FITS not in verdict.about:
        return BEHIND_IN_DOMAIN_WHY, ""  # it holds its quota domain: its members, who share it, are behind it
    return verdict.why(), disclosure.namespace_of(verdict.key)


def _behind_strict_fifo(_reader: str) -> str:
    return BEHIND_STRICT_FIFO  # names nobody: the same for every reader
