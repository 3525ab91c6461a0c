"""What a dispatch cycle would do now with each queued AppWrapper, deciding nothing (for /debug and mcadctl).

Contract:
- ``assess(...)`` walks the queue in dispatch order with the cycle's own rules (``fit.fits`` over a snapshot,
  one fit check per demand group: a group blocked once stays blocked; a reclaim under way holds back those that
  would borrow; strict FIFO and a preemptor waiting for its victims hold back everything behind them) and says,
  for each AppWrapper, its state (Queued, Draining: requeued and its old pods are still there, Preempting:
  waiting for victims), whether it fits now and why not.
- What would be dispatched is taken from the snapshot, and its quota charged there: the caller passes a snapshot
  whose quota ledger is a scratch copy (``Accountant.snapshot(scratch_quota=True)``). Nothing else is changed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from mcad.accounting import Snapshot
from mcad.api.appwrapper import AppWrapperView
from mcad.fit import Targets, fits
from mcad.informer import Store
from mcad.notices import BEHIND_STRICT_FIFO
from mcad.pending import PendingQueue
from mcad.preemption import Preemptors


@dataclass(frozen=True, slots=True)
class Assessment:
    """What a dispatch cycle would do now with one queued AppWrapper."""

    key: str
    state: str  # Queued, Draining (requeued; its old pods are still there), Preempting (waiting for victims)
    fits_now: bool
    why: str


def assess(pending: PendingQueue, appwrappers: Store[AppWrapperView], snapshot: Snapshot, targets: Targets, *,
           preemptors: Preemptors, draining: Callable[[AppWrapperView], bool],
           blocked_by_reclaim: Callable[[AppWrapperView], str], strict_fifo: bool) -> list[Assessment]:
    blocked: dict[Hashable, str] = {}
    held = ""  # why everything behind a blocked head waits (strict FIFO, or a waiting preemptor)
    out = []
    for key in pending.ordered():
        aw = appwrappers.get(key)
        entry = pending.entry(key)
        if aw is None or entry is None:
            continue
        group = entry[1]
        if key in preemptors:
            victims = ", ".join(sorted(preemptors.victims_of(key)))
            out.append(Assessment(key, "Preempting", False,
                                  f"waiting for lower-priority AppWrappers it preempted to leave: {victims}"))
            held = held or f"held behind {key}, which is preempting to make room"
        elif draining(aw):
            out.append(Assessment(key, "Draining", False,
                                  "requeued; waiting for the pods of its previous dispatch to go"))
        elif held:
            out.append(Assessment(key, "Queued", False, held))
        elif group in blocked:
            out.append(Assessment(key, "Queued", False, blocked[group]))
        else:
            need = snapshot.need(key, aw.demand)
            fit = fits(aw, need, snapshot, targets)
            reclaimed = blocked_by_reclaim(aw) if fit.fits else ""
            if reclaimed:
                out.append(Assessment(key, "Queued", False, reclaimed))
            elif fit.fits:
                snapshot.take(need, fit.plan)
                if snapshot.quota is not None:
                    snapshot.quota.charge(key, aw.labels, aw.demand)
                out.append(Assessment(key, "Queued", True, "fits now: the next dispatch cycle dispatches it"))
            else:
                blocked[group] = fit.why()
                out.append(Assessment(key, "Queued", False, blocked[group]))
                if strict_fifo:
                    held = BEHIND_STRICT_FIFO
    return out
