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
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from mcad.api.appwrapper import AppWrapperView
from mcad.model import disclosure
from mcad.model.fifo import BEHIND_IN_DOMAIN, BEHIND_STRICT_FIFO, StrictFifo
from mcad.model.fit import Targets, could_ever_fit, refused
from mcad.model.pending import PendingQueue
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


def assess(pending: PendingQueue, appwrappers: AppWrappers, reserving: Pass, *,
           preemptors: Preemptors, draining: Callable[[AppWrapperView], bool],
           blocked_by_reclaim: Callable[[AppWrapperView], str], strict_fifo: bool,
           targets: Targets) -> list[Assessment]:
    blocked: dict[Hashable, str] = {}
    quota = reserving.snapshot.quota
    fifo = StrictFifo(quota.forest if quota is not None else None) if strict_fifo else None
    reserved_heads: set[Hashable] = set()  # groups whose head took a reservation
    # Why everything behind a blocked head waits (strict FIFO, or a waiting preemptor), worded for a reader's namespace.
    held: Callable[[str], str] | None = None
    out = []
    for key in pending.ordered():
        aw = appwrappers.get(key)
        entry = pending.entry(key)
        if aw is None or entry is None:
            continue
        group = entry[1]
        if key in preemptors:
            victims = disclosure.listed(preemptors.victims_of(key), aw.namespace)
            out.append(Assessment(key, "Preempting", False,
                                  f"waiting for lower-priority AppWrappers it preempted to leave: {victims}"))
            held = held or partial(disclosure.held_behind_preemptor, key)
        elif draining(aw):
            out.append(Assessment(key, "Draining", False,
                                  "requeued; waiting for the pods of its previous dispatch to go"))
        elif held:
            out.append(Assessment(key, "Queued", False, held(aw.namespace)))
        elif fifo is not None and fifo.held(aw):
            out.append(Assessment(key, "Queued", False, BEHIND_IN_DOMAIN))
        elif group in blocked:
            if group in reserved_heads:  # the head's message tells of its own reservation, not of theirs
                need = reserving.snapshot.need(key, aw.demand)
                blocked[group] = reserving.explain(aw, need, reserving.fit(aw, need))[1]()
                reserved_heads.discard(group)
            out.append(Assessment(key, "Queued", False, blocked[group]))
        else:
            snapshot = reserving.snapshot
            need = snapshot.need(key, aw.demand)
            fit = reserving.fit(aw, need)
            reclaimed = blocked_by_reclaim(aw) if fit.fits else ""
            if reclaimed:
                out.append(Assessment(key, "Queued", False, reclaimed))
                if fifo is not None:
                    fifo.hold(aw, refused("reclaim", reclaimed))  # its domain waits behind it
            elif fit.fits:
                snapshot.take(need, fit.plan)
                if snapshot.quota is not None:
                    snapshot.quota.charge(key, aw.labels, aw.demand)
                out.append(Assessment(key, "Queued", True, "fits now: the next dispatch cycle dispatches it"))
            else:
                held_before = len(reserving.made)
                why = fit.why() if strict_fifo else reserving.wait(aw, need, fit)[1]()
                made = reserving.made[-1] if len(reserving.made) > held_before else None
                if made is None or reserving.full:  # as in a cycle: else the next of its group is judged too
                    blocked[group] = why
                    if made is not None:
                        reserved_heads.add(group)
                out.append(Assessment(key, "Queued", False, why,
                                      reserving.describe(made) if made is not None else None))
                if fifo is not None and could_ever_fit(aw, need, snapshot, targets, fit) and fifo.hold(aw, fit):
                    held = _behind_strict_fifo
    return out


def _behind_strict_fifo(_reader: str) -> str:
    return BEHIND_STRICT_FIFO  # names nobody: the same for every reader
