"""Reservations for blocked gangs, and backfill that cannot delay them (DESIGN.md, "Scheduling policy").

Contract:
- In a pass of decisions (``Reservations.start(snapshot, now)``: a dispatch cycle, or a dry run for explain), the
  first ``limit`` candidates in dispatch order that wait for capacity (not quota, not a hold), and that would fit
  once what AppWrappers run has ended, hold a reservation (``wait``; the caller goes on to the next member of a
  demand group while reservations are left). With ``--fit=nodes`` it is the nodes its pods would pack
  onto (``Reservation.plan``); in aggregate mode an amount (its outstanding demand). The pass takes each reservation
  from its snapshot when it is made, so those behind it are dispatched only where they do not use reserved room.
- Which nodes: pods of no AppWrapper are taken to stay (nothing says when they end), AppWrappers' pods to end. The
  gang is packed first-fit on what would then be free (less what earlier reservations of the pass hold), trying
  the nodes with the most free room now first (of the gang's scarcest resource: GPUs, else cpu, else memory), so
  it waits for the nodes that free soonest by what is known. A gang that requires a topology level reserves in
  one domain of it: among those it would pack into, the one that lacks the least of its scarcest resource now
  (ties: the domain's value), so it waits for the domain that frees first by what is known
  (``mcad.model.topology``). A reservation keeps its nodes from one pass to the
  next while its gang still packs there, so it does not wander as room frees elsewhere. Node-health rules apply
  as in every fit (``mcad.model.placement``): no node sick for the gang's pods is reserved for them, one they
  should avoid (PreferNoSchedule) only when nothing else will do, and such a node is not kept from a pass before.
- Backfill: a candidate that does not fit with the reservations taken, and whose run time is bounded
  (``dispatchDuration.limit`` L: the follower deletes its objects when it runs out), fits if it fits once the
  reservations it is sure to end before are given back: those whose start bound is known and no earlier than
  now + L. A reservation's start bound is the latest dispatch deadline among the AppWrappers holding room on its
  nodes (anywhere, in aggregate mode): by then its room is free, whatever happens. It is unknown (no backfill
  onto it) when any of them has no bound. A candidate without a bound uses unreserved room only.
- A reservation follows its AppWrapper's position: each pass makes them anew in dispatch order, so one whose
  AppWrapper dispatched, was deleted or was overtaken by a higher-priority one is not made again.
- ``limit`` 0: no reservations (best-effort FIFO: a blocked AppWrapper's room goes to whatever fits first).
- One kept out by reservations is told whose and where (``behind_reservations``): those of its own namespace by
  holder and nodes (or amount), another namespace's only as such (``mcad.model.disclosure``); /debug/queue lists them
  all, to those who may list their namespaces.
- Pure: reads the snapshot and what its ``Horizon`` says (handed in by ``mcad.wiring``); decides nothing else and
  writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Protocol

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ZERO, ResourceVector
from mcad.api.views import NodeView
from mcad.model import disclosure, placement
from mcad.model.accounting import Snapshot
from mcad.model.fairshare import FairPass, share, tenant_of
from mcad.model.fit import Fit, Targets, could_ever_fit, fits
from mcad.model.plans import Plan

# How many blocked AppWrappers hold reservations at once by default (chosen by the churn benchmark at full size,
# docs/scheduling.md "How many": its large gangs waited about a third less with 30 than with 8, the smaller classes
# about as long, for about 10 % more controller CPU).
DEFAULT_RESERVATIONS = 30
# What the status of one kept out by reservations is about, besides what it lacks with them taken.
BEHIND = "behind a reservation"
# How many nodes a message names before it says "and N more".
NODES_SHOWN = 8


@dataclass(frozen=True, slots=True)
class Reservation:
    key: str  # the AppWrapper that holds it
    need: ResourceVector  # its outstanding demand
    plan: Plan = ()  # --fit=nodes: (node, pod requests, pods) its gang would take once room frees
    # What it withholds from the free total: its demand in aggregate mode (all that frees goes to it); with
    # --fit=nodes only the room free now on its nodes (the rest is held by what runs there, counted once).
    withheld: ResourceVector = ZERO

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({node for node, _, _ in self.plan}))

    def where(self) -> str:
        """'on nodes n1, n2' or, in aggregate mode, 'of cpu=20'."""
        if not self.plan:
            return f"of {self.need.format()}"
        return f"on nodes {names(self.nodes)}"


def behind_reservations(blocking: Collection[Reservation], reader: str) -> str:
    """What one kept out by ``blocking`` is told: the reservations of its own namespace by holder and place;
    another namespace's neither by holder nor by the nodes or amount it holds (``mcad.model.disclosure``)."""
    own = [f"waiting behind the reservation of {r.key} {r.where()}" for r in blocking
           if disclosure.same_namespace(r.key, reader)]
    others = sum(1 for r in blocking if not disclosure.same_namespace(r.key, reader))
    if others == 1:
        own.append(f"waiting behind the reservation of {disclosure.ANOTHER}")
    elif others > 1:
        own.append(f"waiting behind the reservations of {others} AppWrappers in other namespaces")
    return "; ".join(own)


def names(nodes: Collection[str]) -> str:
    shown = sorted(nodes)[:NODES_SHOWN]
    more = len(nodes) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


class Horizon(Protocol):
    """What the running work will leave behind, and when (``mcad.loop.active`` answers on the loop thread)."""

    def lasting_room(self) -> Mapping[str, ResourceVector]:
        """Per node: what would be free once every AppWrapper's pods there ended."""
        ...

    def lasting_free(self) -> ResourceVector:
        """The cluster's capacity less what pods of no AppWrapper use."""
        ...

    def start_bound(self, nodes: Collection[str] | None, ignoring: Collection[str] = ()) -> datetime | None:
        """When every AppWrapper holding room on these nodes (None: anywhere) is sure to be gone: the latest of
        their dispatch deadlines, at least now; None when one of them has none. AppWrappers in ``ignoring`` are
        left out (those the pass dispatched: it counts them itself)."""
        ...


class Reservations:
    """The reservations of the last dispatch cycle, kept so the next one can keep their nodes."""

    def __init__(self, limit: int, targets: Targets, horizon: Horizon) -> None:
        if limit < 0:
            raise ValueError(f"reservations must be 0 or more, not {limit}")
        self.limit = limit
        self.targets = targets
        self.horizon = horizon
        self.held: dict[str, Reservation] = {}  # key -> its reservation, as the last cycle made them

    def start(self, snapshot: Snapshot, now: datetime, *, dry_run: bool = False, fair: FairPass | None = None) -> Pass:
        """A pass over ``snapshot``; ``dry_run``: what it makes is not kept for the next pass; ``fair``: the
        tenants' scores when fair sharing orders the queue (``mcad.model.fairshare``)."""
        return Pass(self, snapshot, now, dry_run, fair=fair)

    def forget(self, key: str) -> None:
        self.held.pop(key, None)


@dataclass
class Pass:
    owner: Reservations
    snapshot: Snapshot
    now: datetime
    dry_run: bool
    fair: FairPass | None = None
    made: list[Reservation] = field(default_factory=list)
    # What this pass dispatched: key -> (the nodes of its plan, None in aggregate mode; its run-time limit in s).
    # Reservations' start bounds count these from here, not from the loop's records: the cycle records a dispatch
    # as it goes and a dry run never does, and both must bound alike.
    taken: dict[str, tuple[frozenset[str] | None, float]] = field(default_factory=dict)
    _bounds: dict[str, datetime | None] = field(default_factory=dict)
    # Per node: free once AppWrappers' pods end, less what this pass's reservations hold there (kept as they are
    # made, so that each reservation does not subtract all the earlier ones again).
    _lasting: dict[str, ResourceVector] | None = None
    # Members of one demand group (``mcad.model.pending.demand_group``) are judged alike by a fit check, and a
    # group's members waiting for room are judged one after another, each taking a reservation. Between two
    # dispatches of the pass, the room with every reservation given back is the same for all of them (what a
    # reservation takes is given back with it), so the fit on that room is made once per group (keyed by the
    # number of dispatches it was made after); whether a group could ever fit (the empty cluster) once per pass.
    _unreserved: dict[Hashable, tuple[int, Snapshot, Fit]] = field(default_factory=dict)
    _ever: dict[Hashable, bool] = field(default_factory=dict)

    # -- candidates -----------------------------------------------------------------------------------------------

    def fit(self, aw: AppWrapperView, need: ResourceVector) -> Fit:
        """``fit.fits`` on the pass's snapshot, reservations taken; a candidate with a bounded run time that does
        not fit is tried again with the reservations it ends before given back (backfill)."""
        fit = fits(aw, need, self.snapshot, self.owner.targets)
        limit = aw.scheduling.dispatch_limit_seconds
        if fit.fits or limit <= 0 or not self.made:
            return fit
        ends = self.now + timedelta(seconds=limit)
        before = [r for r in self.made if (bound := self._start_bound(r)) is not None and ends <= bound]
        if not before:
            return fit
        trial = self._without(before)
        backfill = fits(aw, need, trial, self.owner.targets)
        return backfill if backfill.fits else fit

    def take(self, aw: AppWrapperView, need: ResourceVector, fit: Fit) -> None:
        """``aw`` is dispatched in this pass: its room is taken from the snapshot, and it holds room until its
        run-time limit (if any) for the start bounds of reservations made after it."""
        self.snapshot.take(need, fit.plan)
        nodes = frozenset(node for node, _, _ in fit.plan) if self.snapshot.room is not None else None
        self.taken[aw.key] = (nodes, aw.scheduling.dispatch_limit_seconds)
        if self.fair is not None:
            quota = self.snapshot.quota
            charges = quota.forest.charges(aw.labels)[0] if quota is not None else None
            self.fair.took(tenant_of(aw, charges), share(need, self.snapshot.capacity))

    def wait(self, aw: AppWrapperView, need: ResourceVector, fit: Fit,
             group: Hashable | None = None) -> tuple[frozenset[str], Callable[[], str]]:
        """A candidate that waits: why (``explain``), and it takes a reservation if one is left and room is what
        it waits for (``holds`` says whether it did). Returns (what its status is about, its message). ``group``:
        its demand group, when its fit on the pass's room may be taken as its group's (see ``_unreserved``)."""
        about, why = self.explain(aw, need, fit, group)
        if not self.full and fit.short_of_room:
            # Its message says what it lacks, not that it holds a reservation: holders change many times a second
            # under churn, and a status write each time would cost more than the news is worth (/debug/queue,
            # mcadctl and mcad_reservations show them as they are).
            self._reserve(aw, need, fit, group)
        return about, why

    def explain(self, aw: AppWrapperView, need: ResourceVector, fit: Fit,
                group: Hashable | None = None) -> tuple[frozenset[str], Callable[[], str]]:
        """Why a candidate that does not fit waits, taking no reservation: whose reservations keep it out when they
        are what does; else what it lacks, against the room no reservation took (the shortfall it would have).
        What it is about is what it lacks with the reservations taken, plus ``BEHIND`` when reservations are what
        keep it out, never whose they are: under churn holders change many times a second, and each change would
        cost a status write. ``group`` as for ``wait``."""
        if not self.made:
            return fit.about, fit.why
        unreserved, why_unreserved = self._fit_unreserved(aw, need, group)
        if not unreserved.fits:
            return fit.about, why_unreserved
        if unreserved.plan:
            used = {node for node, _, _ in unreserved.plan}
            blocking = [r for r in self.made if not r.plan or used & set(r.nodes)] or list(self.made)
        else:
            blocking = list(self.made)
        return fit.about | {BEHIND}, partial(behind_reservations, blocking, aw.namespace)

    def _fit_unreserved(self, aw: AppWrapperView, need: ResourceVector,
                        group: Hashable | None) -> tuple[Fit, Callable[[], str]]:
        """Its fit with every reservation of the pass given back, and that fit's message worded for it (a fit's
        message names the AppWrapper's pods): its group's, when one of its group was judged since the last
        dispatch of the pass."""
        dispatches = len(self.taken)
        known = self._unreserved.get(group) if group is not None else None
        if known is not None and known[0] == dispatches:
            trial, unreserved = known[1], known[2]
            # The trial room is this pass's own copy, never changed once made: the message can wait until read.
            return unreserved, partial(_worded_on, trial, self.owner.targets, aw, need)
        trial = self._without(self.made)
        unreserved = fits(aw, need, trial, self.owner.targets)
        if group is not None:
            self._unreserved[group] = (dispatches, trial, unreserved)
        return unreserved, unreserved.why

    def _could_ever_fit(self, aw: AppWrapperView, need: ResourceVector, fit: Fit, group: Hashable | None) -> bool:
        if group is None:
            return could_ever_fit(aw, need, self.snapshot, self.owner.targets, fit)
        if group not in self._ever:
            self._ever[group] = could_ever_fit(aw, need, self.snapshot, self.owner.targets, fit)
        return self._ever[group]

    def holds(self, key: str) -> bool:
        """Whether it took a reservation in this pass."""
        return any(reservation.key == key for reservation in self.made)

    @property
    def full(self) -> bool:
        """Whether every reservation is taken."""
        return len(self.made) >= self.owner.limit

    def describe(self, reservation: Reservation) -> dict[str, object]:
        """For /debug/queue and mcadctl: whose it is, where, and when it is sure to start (None: unknown)."""
        bound = self._start_bound(reservation)
        return {"appwrapper": reservation.key, "nodes": list(reservation.nodes),
                "amount": reservation.need.format(),
                "startsBy": bound.isoformat() if bound is not None else None}

    def finish(self) -> None:
        """The pass is over: what it made is what is held now (unless a dry run)."""
        if not self.dry_run:
            self.owner.held = {r.key: r for r in self.made}

    # -- reserving ------------------------------------------------------------------------------------------------

    def _reserve(self, aw: AppWrapperView, need: ResourceVector, fit: Fit,
                 group: Hashable | None = None) -> Reservation | None:
        snapshot = self.snapshot
        if not self._could_ever_fit(aw, need, fit, group):
            return None  # it would hold the room for ever
        plan: Plan = ()
        if snapshot.room is None or snapshot.consumed(aw.key):
            # Aggregate mode (or its own pods exist already, a restart mid-dispatch: only the rest can be judged).
            if not need.fits_in(self._lasting_free()):
                return None
        else:
            found = self._nodes_for(aw)
            if found is None:
                return None
            plan = found
        withheld = need
        if plan and snapshot.room is not None:
            withheld = ResourceVector()
            for node, requests, count in plan:
                wanted, free = requests.scale(count), snapshot.room.get(node, ResourceVector()).clamp()
                withheld = withheld + (wanted - (wanted - free).clamp())  # min(wanted, free) per resource
        reservation = Reservation(aw.key, need, plan, withheld)
        snapshot.take(withheld, plan)
        self.made.append(reservation)
        if self._lasting is not None:
            for node, requests, count in plan:
                if node in self._lasting:
                    self._lasting[node] = self._lasting[node] - requests.scale(count)
        return reservation

    def _nodes_for(self, aw: AppWrapperView) -> Plan | None:
        """Where its pods would pack once AppWrappers' pods end, around what earlier reservations hold: its
        previous nodes if it still packs there, else the nodes with the most free room first."""
        snapshot = self.snapshot
        assert snapshot.room is not None
        lasting = self._lasting_room()
        room = snapshot.room
        previous = self.owner.held.get(aw.key)
        if previous is not None and previous.plan:
            mine = set(previous.nodes)
            for _, nodes in self.owner.targets.node_sets(aw, snapshot):
                # A node a PreferNoSchedule health verdict now asks its pods to avoid is not kept: the fresh
                # choice below takes it again only if nothing else will do.
                kept = [node for node in nodes if node.name in mine and not placement.prefers_not(node, aw.demand)]
                packing = self.owner.targets.pack(aw, kept, lasting)
                if kept and packing.fits:
                    return packing.placement
        scarcest = _scarcest(aw)
        choices: list[tuple[int, int, Plan]] = []
        for index, (_, nodes) in enumerate(self.owner.targets.node_sets(aw, snapshot)):
            ordered = sorted(nodes, key=lambda node: (-room.get(node.name, node.allocatable).get(scarcest),
                                                      node.name))
            packing = self.owner.targets.pack(aw, ordered, lasting, in_given_order=True)
            if packing.fits:
                if not aw.topology_required:
                    return packing.placement
                choices.append((self._lacks(aw, nodes, scarcest), index, packing.placement))
        return min(choices)[2] if choices else None

    def _lacks(self, aw: AppWrapperView, nodes: Collection[NodeView], scarcest: str) -> int:
        """How much of ``scarcest`` a domain lacks now to hold ``aw``: the least lacking is expected to free first.
        Read from the pass's snapshot only, which the dispatch cycle and its dry run change alike (what the loop
        records of a dispatch during the cycle, such as its deadline, a dry run never sees)."""
        assert self.snapshot.room is not None
        free = sum(max(self.snapshot.room.get(node.name, node.allocatable).get(scarcest), 0) for node in nodes)
        return max(aw.demand.get(scarcest) - free, 0)

    def _lasting_room(self) -> Mapping[str, ResourceVector]:
        """Per node: free once AppWrappers' pods end, less what this pass's reservations hold there (read only:
        ``_reserve`` keeps it)."""
        if self._lasting is None:
            self._lasting = dict(self.owner.horizon.lasting_room())
            for reservation in self.made:
                for node, requests, count in reservation.plan:
                    if node in self._lasting:
                        self._lasting[node] = self._lasting[node] - requests.scale(count)
        return self._lasting

    def _lasting_free(self) -> ResourceVector:
        total = self.owner.horizon.lasting_free()
        for reservation in self.made:
            total = total - reservation.need  # what it will hold once it runs
        return total

    # -- what reservations hold back ------------------------------------------------------------------------------

    def _start_bound(self, reservation: Reservation) -> datetime | None:
        if reservation.key not in self._bounds:
            nodes = reservation.nodes if reservation.plan else None
            bound = self.owner.horizon.start_bound(nodes, ignoring=self.taken)
            for used, limit in self.taken.values():
                if bound is None:
                    break
                if nodes is None or used is None or used & set(nodes):
                    bound = max(bound, self.now + timedelta(seconds=limit)) if limit > 0 else None
            self._bounds[reservation.key] = bound
        return self._bounds[reservation.key]

    def _without(self, reservations: list[Reservation]) -> Snapshot:
        trial = self.snapshot.copy()
        for reservation in reservations:
            trial.give(reservation.withheld, reservation.plan)
        return trial


def _worded_on(trial: Snapshot, targets: Targets, aw: AppWrapperView, need: ResourceVector) -> str:
    """Why ``aw`` does not fit ``trial``, worded for it."""
    return fits(aw, need, trial, targets).why()


def _scarcest(aw: AppWrapperView) -> str:
    total = aw.demand
    for name in (placement.GPU, "cpu", "memory"):
        if total.get(name) > 0:
            return name
    return "cpu"
