"""Whether a queued AppWrapper fits now, over an explicit snapshot of free room, and if not, what blocks it.

Contract:
- ``fits(aw, need, snapshot, targets)`` is the one fit check: used by the dispatch cycle, by explain
  (``Dispatcher.assess_queue``), by the Backoff announcements and by group refreshes. In order: a held AppWrapper
  never fits; with quota trees, its quota nodes must have room (quota before capacity: one over its quota waits on
  quota whatever the cluster has free); with ``--fit=nodes`` (``snapshot.room`` set) ``targets`` must place its
  pods; and its outstanding demand ``need`` must fit the free total (pods that pack usually add up to the demand,
  but not when custompodresources declare more than the templates in one resource and less in another).
- ``Fit``: ``about`` is what blocks it, compared between cycles to decide whether its Backoff message must be
  rewritten; ``why`` builds that message only when it is written; ``plan`` (--fit=nodes) says how many pods of
  which requests go on which node; ``cluster`` (hub mode) names the worker the whole gang goes to; ``domain``,
  for a gang that requires a topology level, the domain of it the plan is in.
- ``Targets`` is where a gang may go: ``SingleCluster`` (every node; for a gang that requires a topology level,
  the nodes of one domain of it, chosen best fit: ``mcad.model.topology``), or the hub's workers
  (``mcad.hub.placement.WorkerPlacement``, one worker per gang). ``node_sets`` lists the node sets one gang may
  use whole (so preemption and "could it ever fit" judge a required level as the fit does).
- ``could_ever_fit`` (quota included: an unknown node or a demand over a hard limit never fits) and
  ``fits_without`` answer the questions preemption asks (on the empty cluster; once these
  AppWrappers are gone) with the same rules.
- ``Homes``: where each gang that requires a topology level was last dispatched (its worker and domain), so a
  reset gang goes back there when it still fits there. The targets keep it; only the dispatch cycle writes it, as
  it dispatches (``Targets.dispatched``), and the dispatcher drops an AppWrapper's when it is deleted
  (``Targets.forget``). A fit only reads it: a dry run (explain, ``/debug``), a fit that then fails on the free
  total, and the reservations' what-ifs leave it as it was.
- Pure: reads the snapshot, the views and the homes; decides nothing, writes nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector, format_amount
from mcad.api.views import NodeView
from mcad.model import placement, topology
from mcad.model.accounting import Snapshot
from mcad.model.plans import PlanEntry

# How many AppWrappers' last topology domain is remembered (``Homes``).
HOMES_KEPT = 10_000


@dataclass(frozen=True, slots=True)
class Fit:
    fits: bool
    about: frozenset[str] = frozenset()  # what blocks it (compared to decide whether to rewrite its status)
    why: Callable[[], str] = str  # the Backoff message, built only when it is written
    plan: tuple[PlanEntry, ...] = ()  # --fit=nodes: (node, pod requests, pods)
    cluster: str = ""  # hub mode: the worker it goes to
    domain: str = ""  # with a required topology level: the domain (label value) of it the plan is in
    short_of_room: bool = False  # it does not fit for want of room (not quota, not a hold): room may be reserved
    quota_at: tuple[str, str] | None = None  # (tree, node): the quota node it does not fit under


def refused(about: str | frozenset[str], why: str) -> Fit:
    """A Fit that does not fit, with a fixed message."""
    return Fit(False, frozenset({about}) if isinstance(about, str) else about, partial(str, why))


class Targets(Protocol):
    """Where a gang may be placed (with --fit=nodes)."""

    def node_sets(self, aw: AppWrapperView, snapshot: Snapshot) -> list[tuple[str, Sequence[NodeView]]]:
        """The sets of nodes, one of which must take the whole gang, with their worker's name ("" for one
        cluster)."""
        ...

    def fit(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot) -> Fit:
        """Whether its pods can be placed on the snapshot's room, and where."""
        ...

    def nodes_for(self, key: str, snapshot: Snapshot) -> Sequence[NodeView]:
        """The nodes a dispatched AppWrapper's pods may be on (where it was placed)."""
        ...

    def pack(self, aw: AppWrapperView, nodes: Sequence[NodeView], room: Mapping[str, ResourceVector], *,
             in_given_order: bool = False) -> placement.Packing:
        """Its pods on one of its node sets, with ``room``, keeping what else it asks of the topology."""
        ...

    def dispatched(self, aw: AppWrapperView, fit: Fit) -> None:
        """The dispatch cycle dispatched ``aw`` as ``fit`` says: its home is where it went (``Homes``)."""
        ...

    def forget(self, key: str) -> None:
        """The AppWrapper is gone: drop its home."""
        ...


@dataclass(frozen=True, slots=True)
class Home:
    """Where a gang that requires ``level`` was dispatched: ``domain`` (the label value) in ``cluster`` (its worker;
    "" for one cluster); for the AppWrapper of ``uid``."""

    uid: str
    level: str
    cluster: str
    domain: str


class Homes:
    """Each gang's ``Home``, by AppWrapper key, written when it is dispatched (``record``), never when it is fitted.

    It is one AppWrapper's home only while its uid and required level are those it was dispatched with: one deleted
    and re-created under the same name, or whose level changed, has none. Bounded: the ``size`` dispatched last
    are kept (reading changes no order, so a dry run changes nothing); one forgotten is placed as a fresh gang, as
    after a restart or a change of leader (it is in memory only)."""

    def __init__(self, size: int = HOMES_KEPT) -> None:
        self._size = size
        self._kept: OrderedDict[str, Home] = OrderedDict()

    def record(self, aw: AppWrapperView, fit: Fit) -> None:
        """``aw`` was dispatched as ``fit`` says; a fit with no domain (no required level, or its own pods exist
        already and no plan was made) leaves its home as it was."""
        if not aw.topology_required or not fit.domain:
            return
        self._kept[aw.key] = Home(aw.uid, aw.topology_required, fit.cluster, fit.domain)
        self._kept.move_to_end(aw.key)
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)

    def of(self, aw: AppWrapperView) -> Home | None:
        home = self._kept.get(aw.key)
        if home is None or home.uid != aw.uid or home.level != aw.topology_required:
            return None
        return home

    def forget(self, key: str) -> None:
        self._kept.pop(key, None)

    def __len__(self) -> int:
        return len(self._kept)


class SnapshotIndex(topology.Index):
    """``topology.Index`` remembered for a snapshot's own nodes and room: the domains of each level and their
    allocatable room (in ``Snapshot.facts``: the same while the nodes are, across passes) and each domain's free
    room (a ``topology.DomainRoom`` in ``Snapshot.memo``, kept in step as the pass takes room)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def domains(self, nodes: Sequence[NodeView], level: str) -> topology.Domains:
        snapshot = self._snapshot
        if nodes is not snapshot.nodes:
            return topology.domains(nodes, level)
        key = ("topology domains", level)
        found = snapshot.facts.get(key)
        if found is None:
            found = snapshot.facts[key] = topology.domains(nodes, level)
        return found  # type: ignore[return-value]

    def most(self, nodes: Sequence[NodeView], level: str, resource: str) -> Mapping[str, int] | None:
        snapshot = self._snapshot
        if nodes is not snapshot.nodes:
            return None
        key = ("topology allocatable", level, resource)
        found = snapshot.facts.get(key)
        if found is None:
            found = snapshot.facts[key] = {value: topology.free_room(members, {}, resource)
                                           for value, members in self.domains(nodes, level)}
        return found  # type: ignore[return-value]

    def free(self, nodes: Sequence[NodeView], level: str, resource: str,
             room: Mapping[str, ResourceVector]) -> dict[str, int]:
        snapshot = self._snapshot
        if nodes is not snapshot.nodes or room is not snapshot.room:
            return super().free(nodes, level, resource, room)
        key = ("topology free", level, resource)
        kept = snapshot.memo.get(key)
        if not isinstance(kept, topology.DomainRoom):
            kept = snapshot.memo[key] = topology.DomainRoom(self.domains(nodes, level), room, resource)
        return kept.free


def pack_in_set(aw: AppWrapperView, nodes: Sequence[NodeView], room: Mapping[str, ResourceVector],
                hierarchy: topology.Hierarchy, *, in_given_order: bool = False) -> placement.Packing:
    """``aw``'s pods on one node set (a domain of its required level, a worker): its preferred level and its pod
    sets' asks kept (``mcad.model.topology.pack_within``); a gang that asks nothing packs plainly."""
    if topology.asks(aw):
        return topology.pack_within(aw, nodes, room, hierarchy, in_given_order=in_given_order)
    return placement.pack(aw.gang, nodes, room, in_given_order=in_given_order)


class SingleCluster:
    """One cluster: a gang's pods pack onto any of its nodes, or, when it requires a topology level
    (``mcad.model.topology``), onto the nodes of one domain of that level; ``hierarchy`` is the configured levels a
    preferred level falls back up."""

    def __init__(self, hierarchy: topology.Hierarchy = topology.NO_HIERARCHY) -> None:
        self.hierarchy = hierarchy
        # Where each gang that requires a level was dispatched: reset, it goes back there when it still fits there.
        self.homes = Homes()

    def node_sets(self, aw: AppWrapperView, snapshot: Snapshot) -> list[tuple[str, Sequence[NodeView]]]:
        level = aw.topology_required
        if level:
            return [("", nodes) for _, nodes in SnapshotIndex(snapshot).domains(snapshot.nodes, level)]
        return [("", snapshot.nodes)]

    def pack(self, aw: AppWrapperView, nodes: Sequence[NodeView], room: Mapping[str, ResourceVector], *,
             in_given_order: bool = False) -> placement.Packing:
        return pack_in_set(aw, nodes, room, self.hierarchy, in_given_order=in_given_order)

    def nodes_for(self, key: str, snapshot: Snapshot) -> Sequence[NodeView]:
        return snapshot.nodes

    def dispatched(self, aw: AppWrapperView, fit: Fit) -> None:
        self.homes.record(aw, fit)

    def forget(self, key: str) -> None:
        self.homes.forget(key)

    def fit(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot) -> Fit:
        if snapshot.room is None or snapshot.consumed(aw.key):
            # Own pods that exist already (a restart between creating objects and recording it): only the aggregate
            # remainder can be judged, the nodes they run on are known to the ledger already.
            return Fit(True)
        domain = ""
        if topology.asks(aw):
            home = self.homes.of(aw)
            placed = topology.place(aw, snapshot.nodes, snapshot.room, self.hierarchy,
                                    home=home.domain if home is not None else "", index=SnapshotIndex(snapshot))
            packing, domain = placed.packing, placed.domain
        else:
            packing = placement.pack(aw.gang, snapshot.nodes, snapshot.room)
        if not packing.fits:
            return Fit(False, packing.about, packing.explain, short_of_room=True)
        return Fit(True, plan=packing.placement, domain=domain)


def fits(aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, targets: Targets) -> Fit:
    if aw.held:  # e.g. its priorityClassName names no PriorityClass (mcad.k8s.tenantstore): no room is enough
        return refused("held", aw.held)
    if snapshot.quota is not None:
        charges, unknown = snapshot.quota.forest.charges(aw.labels)
        if unknown:
            return refused("quota: unknown node", unknown)
        verdict = snapshot.quota.check(charges, aw.demand)
        if not verdict.fits:
            return Fit(False, verdict.about, partial(str, verdict.why), quota_at=verdict.at)
    fit = Fit(True) if snapshot.room is None else targets.fit(aw, need, snapshot)
    if fit.fits and not need.fits_in(snapshot.free):
        return Fit(False, short_resources(need, snapshot.free),
                   partial(describe_shortfall, need, snapshot.free, snapshot.capacity), short_of_room=True)
    return fit


def could_ever_fit(aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, targets: Targets,
                   fit: Fit | None = None) -> bool:
    """Whether ``aw`` would fit with nothing else running: not if it is held (``AppWrapperView.held``), names a
    quota node that does not exist, asks more than its quota allows even with nothing else charged
    (``QuotaLedger.never_fits``), is larger than the cluster's capacity, or (--fit=nodes) its pods pack onto no set
    of empty nodes it may use."""
    if aw.held or (fit is not None and "quota: unknown node" in fit.about):
        return False
    if snapshot.quota is not None:
        charges, unknown = snapshot.quota.forest.charges(aw.labels)
        if unknown or snapshot.quota.never_fits(charges, aw.demand):
            return False
    if snapshot.room is None or snapshot.consumed(aw.key) or not need.fits_in(snapshot.capacity):
        return need.fits_in(snapshot.capacity)
    return any(targets.pack(aw, nodes, {}).fits  # {}: every node empty
               for _, nodes in targets.node_sets(aw, snapshot))


def fits_without(aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot, targets: Targets,
                 footprints: Iterable[Sequence[PlanEntry]],
                 node_sets: Sequence[tuple[str, Sequence[NodeView]]] | None = None) -> bool:
    """Whether ``aw`` would fit the cluster once the AppWrappers of these footprints (what each frees, by node:
    ``Accountant.footprint``) are gone, in one of ``node_sets`` (default: all it may use). Capacity only: quota is
    the caller's."""
    footprints = list(footprints)
    freed = ResourceVector()
    for footprint in footprints:
        for _, requests, count in footprint:
            freed = freed + requests.scale(count)
    if snapshot.room is None or snapshot.consumed(aw.key) or not need.fits_in(snapshot.free + freed):
        return need.fits_in(snapshot.free + freed)
    after = dict(snapshot.room)
    for footprint in footprints:
        for node, requests, count in footprint:
            if node in after:
                after[node] = after[node] + requests.scale(count)
    sets = targets.node_sets(aw, snapshot) if node_sets is None else node_sets
    return any(targets.pack(aw, nodes, after).fits for _, nodes in sets)


def short_resources(demand: ResourceVector, free: ResourceVector) -> frozenset[str]:
    return frozenset(demand.shortfall(free).keys())


def describe_shortfall(demand: ResourceVector, free: ResourceVector, capacity: ResourceVector) -> str:
    """'short of cpu 2 (needs 4, 2 free)', per short resource; notes a demand larger than the whole cluster."""
    short = demand.shortfall(free)
    parts = []
    for name, amount in sorted(short.items()):
        need, have = format_amount(name, demand.get(name)), format_amount(name, max(free.get(name), 0))
        parts.append(f"{name} {format_amount(name, amount)} (needs {need}, {have} free)")
    why = "short of " + ", ".join(parts)
    if not demand.fits_in(capacity):
        why += "; more than the whole cluster has"
    return why
