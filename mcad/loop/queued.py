"""The queued AppWrappers: which ones wait, in which order and group, and which ones are newcomers to announce.

Contract (dispatcher thread only; built by ``mcad.wiring``):
- ``is_queued(aw)``: not deleting, not being dispatched, and its status (as decided, ``mcad.loop.decisions``) is
  New or Pending without ``canrun``. ``draining(aw)``: requeued and not yet looked at again, while its old pods
  remain (their room is not its own yet). ``waits_in_queue(aw)``: queued and judged by the cycle (not draining,
  not waiting for preemption victims).
- ``enqueue(aw)`` puts it in ``pending`` (``mcad.model.pending``) or moves it there, in its demand group (its own
  group when its pods exist already, or it drains); an AppWrapper new to the queue (without a Backoff of its own)
  or changed group becomes a newcomer, told what it waits for after the next cycle (``mcad.loop.notices``).
- ``dispatched_now(key)``: the AppWrapper if it is dispatched and active now (neither queued nor being written).
- What is being dispatched it reads from ``in_flight``, the read-only view of the record ``mcad.loop.dispatches``
  owns and alone writes.

Who calls it: the dispatcher, the cycle, and the owners that put work back in the queue (active, dispatches, the
hub's sites); notices read its newcomers.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcad.api.appwrapper import ACTIVE_STATES, AppWrapperView, State
from mcad.k8s.informer import Store
from mcad.loop.decisions import Decisions
from mcad.model import status
from mcad.model.accounting import Accountant
from mcad.model.fairshare import tenant_of
from mcad.model.pending import PendingQueue, demand_group
from mcad.model.preemption import Preemptors


class Queued:
    def __init__(self, appwrappers: Store[AppWrapperView], decisions: Decisions, accountant: Accountant, *,
                 in_flight: Mapping[str, AppWrapperView], preemptors: Preemptors, by_nodes: bool,
                 fair: bool = False) -> None:
        self.pending = PendingQueue()
        self._appwrappers = appwrappers
        self._decisions = decisions
        self._accountant = accountant
        # Dispatches whose writes are under way: the read-only view of mcad.loop.dispatches' record, read live.
        self._in_flight = in_flight
        self._preemptors = preemptors
        self._by_nodes = by_nodes
        self._fair = fair  # groups are one tenant's, for fair sharing's order
        self._newcomers: set[str] = set()

    @property
    def fair(self) -> bool:
        """Whether fair sharing orders the queue (then its live order is priority and age only)."""
        return self._fair

    def is_queued(self, aw: AppWrapperView) -> bool:
        if aw.key in self._in_flight:
            return False
        current = self._decisions.status(aw)
        return not aw.deleting and not current.canrun and current.state in (State.NEW, State.PENDING)

    def draining(self, aw: AppWrapperView) -> bool:
        return self._accountant.has_pods(aw.key) and \
            self._decisions.status(aw).backoff == status.PREEMPTION_TRIGGERED

    def waits_in_queue(self, aw: AppWrapperView) -> bool:
        return self.is_queued(aw) and not self.draining(aw) and aw.key not in self._preemptors

    def dispatched_now(self, key: str) -> AppWrapperView | None:
        aw = self._appwrappers.get(key)
        if aw is None or aw.deleting or key in self._in_flight or self.is_queued(aw):
            return None
        return aw if self._decisions.state(aw) in ACTIVE_STATES else None

    def enqueue(self, aw: AppWrapperView) -> bool:
        """Put ``aw`` in the pending queue, or move it; True if that changed its place or its group."""
        quota = self._accountant.quota
        charges = quota.forest.charges(aw.labels) if quota is not None else None
        tenant = tenant_of(aw, charges[0] if charges is not None else None) if self._fair else ""
        group = demand_group(aw, apart=bool(self._accountant.ledger.consumed(aw.key)) or self.draining(aw),
                             by_nodes=self._by_nodes, quota_charges=charges, tenant=tenant)
        before = self.pending.entry(aw.key)
        if before is None and not self._decisions.status(aw).backoff:
            self._newcomers.add(aw.key)
        elif before is not None and before[1] != group:
            # A new group (its old pods went, its quota node changed): a cycle may only ever visit the group's
            # head, so its own Backoff is written at the end of the next cycle.
            self._newcomers.add(aw.key)
        self.pending.upsert(aw.key, aw.order(), aw.demand, group=group, tenant=tenant)
        return before != (aw.order(), group)

    def announce_later(self, key: str) -> None:
        """Told what it waits for after the next cycle (its requeue message stands until then)."""
        self._newcomers.add(key)

    def take_newcomers(self) -> set[str]:
        """The newcomers to announce now; those not told yet are handed back with ``announce_later``."""
        taken, self._newcomers = self._newcomers, set()
        return taken

    def forget(self, key: str) -> None:
        self._newcomers.discard(key)
        self.pending.remove(key)
