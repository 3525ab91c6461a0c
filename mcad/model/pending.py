"""The queued AppWrappers, in dispatch order, arranged so that a dispatch cycle never walks the whole queue.

Contract:
- ``upsert(key, order, demand)`` adds an AppWrapper or moves it (new priority, new demand); ``remove(key)`` drops
  it. Both cost O(log n) to find the place plus a memmove of one group's list.
- AppWrappers with the same demand form a group, kept in dispatch order. Within one cycle free capacity only
  shrinks, so once a group's first remaining member does not fit, no later member of that group can fit either.
- ``cycle()`` returns a ``Cursor`` that yields candidates in global dispatch order across groups (a heap over
  group heads). The caller answers each candidate with ``passed()`` (dispatched, failed, or otherwise done with
  it for this cycle; the caller removes it from the queue after the cycle) or ``blocked()`` (it did not fit: the
  rest of its group is skipped for this cycle). A cycle therefore costs O((candidates passed + groups) · log
  groups), not O(queue length): 10,000 identical GPU AppWrappers that cannot fit cost one check.
- ``position(key)`` is the 1-based place of a queued AppWrapper in dispatch order, in O(log n): every order is
  also kept in one sorted list (sortedcontainers), so a Backoff message can say where an AppWrapper stands.
- The queue must not be modified while a cursor is in use.
- ``frozen()`` copies the orders, the entries and the counts by namespace (keys are ``namespace/name``), for a
  reader of the queue on another thread.
- ``demand_group(aw, ...)`` is the group an AppWrapper belongs in: members must be judged alike by a fit check
  (same demand; with --fit=nodes the same pods; the same quota nodes; the same reason to be held; the same
  run-time bound, which decides backfill) and, with fair sharing, be one tenant's.
- Fair sharing (``cycle(score)``): among groups whose heads have the same priority, the head of the tenant with the
  lowest score goes first, then dispatch order; scores may grow during the pass (each dispatch adds to its
  tenant's), and a head is re-placed lazily when its tenant's score grew since it was pushed.
- With fair sharing a group is one tenant's (``TenantGroup``): groups that differ only in their tenant are judged
  alike by a fit check (a tenant orders, it does not change what fits), which ``alike(group)`` names.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

from sortedcontainers import SortedList

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.model import topology

Order = tuple[int, str, str]  # (-priority, creation time, namespace/name): see AppWrapperView.order


@dataclass(frozen=True, slots=True)
class QueuedEntry:
    order: Order
    group: Hashable


class Alike:
    """What a fit check sees of a group with fair sharing (its ``base``), with its hash computed once: a pass looks
    it up for every tenant's group, and ``base`` is nested tuples, which Python hashes anew each time."""

    __slots__ = ("_hash", "base")

    def __init__(self, base: Hashable) -> None:
        self.base = base
        self._hash = hash(base)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Alike):
            return NotImplemented
        return self is other or (self._hash == other._hash and self.base == other.base)


class TenantGroup:
    """A group with fair sharing: ``base``, the group its members would be in without it, kept one tenant's.
    Immutable; its hash is computed once (as ``Alike``'s)."""

    __slots__ = ("_hash", "alike", "base", "tenant")

    def __init__(self, base: Hashable, tenant: str) -> None:
        self.base, self.tenant = base, tenant
        self.alike = Alike(base)
        self._hash = hash((self.alike, tenant))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TenantGroup):
            return NotImplemented
        return self is other or (self._hash == other._hash and self.tenant == other.tenant and self.base == other.base)

    def __repr__(self) -> str:
        return f"TenantGroup({self.base!r}, {self.tenant!r})"

    def share_alike(self, same: Alike) -> None:
        """Take ``same``, equal to its ``alike``, in its place (``PendingQueue`` shares one among a base's groups):
        nothing it equals or hashes to changes."""
        if same != self.alike:
            raise ValueError(f"{same.base!r} is not what {self!r} is alike to")
        self.alike = same


def alike(group: Hashable) -> Hashable:
    """What a fit check sees of ``group``: the same for groups that differ only in their tenant."""
    return group.alike if isinstance(group, TenantGroup) else group


@dataclass(frozen=True, slots=True)
class Frozen:
    orders: list[Order]  # every key's order, in dispatch order (its last element is the key)
    entries: dict[str, QueuedEntry]
    per_namespace: dict[str, int]  # how many are queued in each namespace


class PendingQueue:
    def __init__(self) -> None:
        self._entries: dict[str, QueuedEntry] = {}
        # group -> its members' orders, sorted; the key is the order's last element (orders are unique per key)
        self._groups: dict[Hashable, list[Order]] = {}
        self._demands: dict[Hashable, ResourceVector] = {}
        self._group_keys: dict[Hashable, Hashable] = {}  # each group's key object, shared by its members
        self._all: SortedList = SortedList()
        self._per_namespace: dict[str, int] = {}  # how many are queued in each namespace (the key's prefix)
        self._tenants: dict[Hashable, str] = {}  # group -> its tenant (fair sharing only)
        # Fair sharing: one ``Alike`` per base, shared by every tenant's group of it, so that a pass's lookups by it
        # find the very object (no comparison of nested tuples). Pruned to the queue's groups as it grows.
        self._alikes: dict[Alike, Alike] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def upsert(self, key: str, order: Order, demand: ResourceVector, *, group: Hashable | None = None,
               tenant: str = "") -> None:
        """Add or move ``key``. ``group`` defaults to the demand; pass another to keep members apart. ``tenant``
        (fair sharing): whose usage orders its group among those of the same priority; a group has one."""
        if order[2] != key:
            raise ValueError(f"the order's last element must be the key: {order!r} for {key!r}")
        group_key: Hashable = demand if group is None else group
        # Members of a group share its key object (thousands of equal tuples would each cost their own memory).
        group_key = self._group_keys.setdefault(group_key, group_key)
        if group_key is group and isinstance(group, TenantGroup):
            self._share_alike(group)
        current = self._entries.get(key)
        if current is not None:
            if current.order == order and current.group == group_key:
                return
            self.remove(key)
        namespace = key.partition("/")[0]  # counted afresh: a move went through remove()
        self._per_namespace[namespace] = self._per_namespace.get(namespace, 0) + 1
        self._entries[key] = QueuedEntry(order, group_key)
        self._all.add(order)
        members = self._groups.setdefault(group_key, [])
        bisect.insort(members, order)
        self._demands[group_key] = demand
        if tenant:
            self._tenants[group_key] = tenant

    def _share_alike(self, group: TenantGroup) -> None:
        if len(self._alikes) > 2 * len(self._groups) + 16:
            self._alikes = {kept.alike: kept.alike for kept in self._groups if isinstance(kept, TenantGroup)}
        group.share_alike(self._alikes.setdefault(group.alike, group.alike))

    def entry(self, key: str) -> tuple[Order, Hashable] | None:
        """(order, group) of ``key``, or None when it is not queued."""
        found = self._entries.get(key)
        return None if found is None else (found.order, found.group)

    def remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        namespace = key.partition("/")[0]
        left = self._per_namespace[namespace] - 1
        if left:
            self._per_namespace[namespace] = left
        else:
            del self._per_namespace[namespace]
        self._all.remove(entry.order)
        members = self._groups[entry.group]
        del members[bisect.bisect_left(members, entry.order)]
        if not members:
            del self._groups[entry.group]
            del self._demands[entry.group]
            self._group_keys.pop(entry.group, None)
            self._tenants.pop(entry.group, None)

    def position(self, key: str) -> int:
        """1-based place of ``key`` in dispatch order; 0 when it is not queued."""
        entry = self._entries.get(key)
        return 0 if entry is None else int(self._all.bisect_left(entry.order)) + 1

    def ordered(self) -> Iterator[str]:
        """Every key in dispatch order (for display; O(n log groups))."""
        return (order[2] for order in heapq.merge(*self._groups.values()))

    def tenants(self) -> dict[Hashable, str]:
        """A copy of each group's tenant (fair sharing only; O(groups))."""
        return dict(self._tenants)

    def frozen(self) -> Frozen:
        """Copies of every order, in dispatch order, of every key's entry (order and group) and of the counts by
        namespace: for a reader that walks the queue after the dispatcher thread moved on. The copies run at C
        speed (no per-key Python), a few milliseconds for 100,000 queued."""
        return Frozen(list(self._all), dict(self._entries), dict(self._per_namespace))

    def members(self, group: Hashable) -> list[str]:
        """Keys of one group, in dispatch order."""
        return [order[2] for order in self._groups.get(group, ())]

    def next_in_group(self, key: str) -> str | None:
        """The member of ``key``'s group after it in dispatch order (None: it is the last, or not queued)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        members = self._groups[entry.group]
        index = bisect.bisect_right(members, entry.order)
        return members[index][2] if index < len(members) else None

    def has_group(self, group: Hashable) -> bool:
        return group in self._groups

    def group_count(self) -> int:
        return len(self._groups)

    def cycle(self, score: Callable[[str], float] | None = None) -> Cursor:
        """A pass in dispatch order; with ``score`` (fair sharing: a tenant's score, which may only grow during the
        pass), groups of one priority go lowest tenant score first, then in dispatch order."""
        return Cursor(self, score)


class Cursor:
    """One pass over the queue in dispatch order; see the module docstring for the protocol."""

    def __init__(self, queue: PendingQueue, score: Callable[[str], float] | None = None) -> None:
        self._groups = queue._groups
        self._demands = queue._demands
        self._tenants = queue._tenants
        self._score = score
        # (-priority, tenant score (0 without fair sharing), order, tiebreak, group)
        self._heap: list[tuple[int, float, Order, int, Hashable]]
        self._position: dict[Hashable, int] = {}  # the member of a group that is its candidate, when not its first
        self._current: tuple[int, float, Order, int, Hashable] | None = None
        self.visited = 0
        # Fair sharing: what a fit sees of groups dropped from the pass (``drop_alike``): the priority of the one
        # judged, which heads to keep and the heads dropped as alike to it; and those heads by the key of the one
        # judged.
        self._dropped: dict[Hashable, tuple[int, Callable[[str], bool], list[str]]] = {}
        self.dropped: dict[str, list[str]] = {}
        if score is None:
            self._heap = [(members[0][0], 0.0, members[0], tiebreak, group)
                          for tiebreak, (group, members) in enumerate(self._groups.items())]
        else:
            tenants = self._tenants
            self._heap = [(members[0][0], score(tenants.get(group, "")), members[0], tiebreak, group)
                          for tiebreak, (group, members) in enumerate(self._groups.items())]
        heapq.heapify(self._heap)

    def _entry(self, order: Order, tiebreak: int, group: Hashable) -> tuple[int, float, Order, int, Hashable]:
        score = self._score(self._tenants.get(group, "")) if self._score is not None else 0.0
        return order[0], score, order, tiebreak, group

    def next(self) -> tuple[str, ResourceVector] | None:
        """The next candidate (key, group demand), or None when every group is exhausted or blocked."""
        if self._current is not None:
            raise RuntimeError("answer the current candidate with passed() or blocked() first")
        heap, score = self._heap, self._score
        if score is not None:
            tenants, dropped_by = self._tenants, self._dropped
            while heap:
                _, pushed, order, tiebreak, group = heap[0]
                if dropped_by and isinstance(group, TenantGroup) and (
                        dropped := dropped_by.get(group.alike)) is not None:
                    priority, keep, heads = dropped
                    if order[0] == priority and not keep(order[2]):
                        heapq.heappop(heap)
                        heads.append(order[2])
                        continue
                # Scores only grow in a pass: a head whose tenant's score grew since it was pushed goes back in its
                # new place, and one whose score is as pushed is truly the lowest.
                if score(tenants.get(group, "")) <= pushed:
                    break
                heapq.heapreplace(heap, self._entry(order, tiebreak, group))
        if not heap:
            return None
        self._current = heap[0]
        self.visited += 1
        order, group = self._current[2], self._current[4]
        return order[2], self._demands[group]

    def passed(self) -> None:
        """Done with the current candidate; its group's next member becomes a candidate."""
        *_, tiebreak, group = self._take()
        position = self._position.get(group, 0) + 1
        members = self._groups[group]
        if position < len(members):
            self._position[group] = position
            heapq.heapreplace(self._heap, self._entry(members[position], tiebreak, group))
        else:
            heapq.heappop(self._heap)

    def blocked(self) -> None:
        """The current candidate did not fit: skip the rest of its group for this cycle."""
        self._take()
        heapq.heappop(self._heap)

    def drop_alike(self, keep: Callable[[str], bool]) -> None:
        """With fair sharing: the current candidate waits without a reservation and its group is blocked; every
        other tenant's group alike to its group (``alike``) whose head has its priority is dropped from the pass
        unlooked at (unless ``keep(head)``), its head recorded in ``dropped`` under the current candidate's key.
        Call before answering ``blocked()``."""
        if self._current is not None and isinstance(group := self._current[4], TenantGroup):
            order = self._current[2]
            heads = self.dropped.setdefault(order[2], [])
            self._dropped[group.alike] = (order[0], keep, heads)

    def stop(self) -> None:
        """End the cycle early (strict FIFO stops at the first candidate that does not fit)."""
        self._current = None
        self._heap.clear()

    def _take(self) -> tuple[int, float, Order, int, Hashable]:
        if self._current is None:
            raise RuntimeError("no current candidate: call next() first")
        current, self._current = self._current, None
        return current


def demand_group(aw: AppWrapperView, *, apart: bool, by_nodes: bool, quota_charges: Hashable | None,
                 tenant: str = "") -> Hashable:
    """The pending group of ``aw``: ``apart`` puts it in one of its own (its own pods exist already, so it needs
    less than its demand; or it waits for its previous pods to go)."""
    group: Hashable
    if apart:
        group = (aw.demand, aw.key)
    elif by_nodes:
        # Same total, different pods (one 8-GPU pod, eight 1-GPU pods) fit differently: not one group.
        group = (aw.demand, tuple((g.count, g.requests, g.node_selector, g.tolerations, g.required_affinity)
                                  for g in aw.gang))
    else:
        group = aw.demand
    if by_nodes and topology.asks(aw):
        # One domain for the gang (or one pod set) fits where its twin spread over domains may not: judged apart.
        group = (group, "topology", aw.topology_required, aw.topology_preferred,
                 tuple((g.topology_required, g.topology_preferred) for g in aw.gang))
    if quota_charges is not None:
        # Charged elsewhere, judged elsewhere: a group's members must share their quota nodes too.
        group = (group, quota_charges)
    if aw.scheduling.dispatch_limit_seconds > 0:
        # A bounded run time may let it use reserved room (backfill, mcad.model.reservations) where an unbounded twin
        # may not: judged apart.
        group = (group, "limit", aw.scheduling.dispatch_limit_seconds)
    if aw.held:
        # A held head would hold back its whole group; and once it is let go, the change of group is what brings
        # it a cycle.
        group = (group, aw.held)
    if tenant:
        # Fair sharing orders groups by their tenant's usage: a group is one tenant's.
        group = TenantGroup(group, tenant)
    return group
