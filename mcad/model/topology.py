"""Topology-aware placement: a gang, or one pod set of it, in one domain of a node label (a rack, a block, a zone).

Contract:
- A level is a node label key; a domain of it is the set of nodes sharing one value of that label. A node without
  the label is in no domain of that level and never takes pods that must be in one.
- What is asked (``mcad.api.topologyasks``): the AppWrapper's ``topology_required`` (every pod in one domain) and
  ``topology_preferred`` (as few domains as can be), and the same per pod set (``PodGroup.topology_required`` /
  ``topology_preferred``, from Kueue's pod-set annotations). ``asks(aw)`` says whether any of them is set.
- ``Hierarchy``: the levels the cluster is configured with (``--topology-level``, largest first, e.g. block, rack,
  host). A preferred level falls back up it: first one domain of the level asked, then one domain of each larger
  level in turn, then the whole node set, packed into as few domains as it can (the nodes of the domains with the
  most free room first). A preferred level that is not configured has no larger levels: one domain of it, else the
  whole node set. Required levels need no configuration.
- ``place(aw, nodes, room, hierarchy)``: the whole placement. With a required level, each domain of it is tried
  alone and the one it fits best is chosen: the least free room left in the gang's scarcest resource (GPUs, else
  cpu, else memory), so large domains stay whole for large gangs; ties by the domain's value (deterministic).
  Within the chosen nodes, ``pack_within`` places the rest of the asks. A gang dispatched before into a domain
  (its ``home``: a reset requeued it) goes back there when it still fits there, whatever fits best
  (``at_home``); the caller says which domain that is (``mcad.model.fit.Homes``).
- ``home(level, nodes, used)``: where a pod of a dispatched gang that requires a level is placed again (a node
  refused it, or turned sick): the domain of the gang's other pods, never another.
- ``pack_within(aw, nodes, room, hierarchy)``: the preferred level and the pod sets' own asks over ``nodes`` (the
  node set the caller chose: a domain of the required level, a worker cluster). Pod sets that ask are placed
  first, largest first, each in its own best domain, and the room they take is gone for the rest; the pod sets
  that ask nothing then pack over every node. Greedy, not a search: a gang that fits only with another choice of
  domain for its first pod set is reported as not fitting.
- When nothing fits, the ``Packing`` says why in a line that names the level and the domains with the most room
  for the gang's largest pod set: "needs 3 pod(s) of nvidia.com/gpu 8 in one topology.example.com/rack: rack-a has
  room for 2, rack-b for 1". Its ``about`` is ``topology:<level>`` (no amounts), so a status message is
  rewritten only when what blocks the gang changes; the line is worded when read, from ``room`` as it is then
  (surveying every domain costs more than the decision, and most such lines are never read).
- ``Index``: how nodes fall into domains and each domain's free room; ``PLAIN`` computes them at each ask, and
  ``mcad.model.fit.SnapshotIndex`` remembers them for a pass's snapshot, the free room kept in step as the pass
  takes room (``DomainRoom``, which ``Snapshot.take`` and ``give`` keep in step). The choice is the same either way.
- Pure: reads the views and the room it is given; never changes ``room``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from mcad.api.appwrapper import AppWrapperView
from mcad.api.podgroups import PodGroup
from mcad.api.resources import ResourceVector
from mcad.api.views import NodeView
from mcad.model import placement

# How many domains a message names, the roomiest first.
DOMAINS_NAMED = 3

Domains = list[tuple[str, list[NodeView]]]


class Index:
    """How nodes fall into the domains of a level, and each domain's free room of a resource: computed here each
    time; ``mcad.model.fit.SnapshotIndex`` remembers both for a snapshot's nodes, since a pass asks for every gang."""

    def domains(self, nodes: Sequence[NodeView], level: str) -> Domains:
        return domains(nodes, level)

    def free(self, nodes: Sequence[NodeView], level: str, resource: str,
             room: Mapping[str, ResourceVector]) -> dict[str, int]:
        return {value: free_room(members, room, resource) for value, members in self.domains(nodes, level)}

    def most(self, nodes: Sequence[NodeView], level: str, resource: str) -> Mapping[str, int] | None:
        """Each domain's allocatable ``resource``, the most it can ever have free; None: not known cheaply."""
        return None


PLAIN = Index()


class DomainRoom:
    """The free room of one resource in each domain of one level, kept in step as a snapshot's room changes
    (``mcad.model.accounting.Snapshot`` tells it of each change; its copies keep none)."""

    def __init__(self, found: Domains, room: Mapping[str, ResourceVector], resource: str) -> None:
        self.resource = resource
        self.of_node = {node.name: value for value, members in found for node in members}
        self.free = {value: free_room(members, room, resource) for value, members in found}

    def room_changed(self, node: str, before: ResourceVector, after: ResourceVector) -> None:
        value = self.of_node.get(node)
        if value is not None:
            self.free[value] += max(after.get(self.resource), 0) - max(before.get(self.resource), 0)


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """The configured levels, largest first."""

    levels: tuple[str, ...] = ()

    def fallbacks(self, level: str) -> tuple[str, ...]:
        """``level``, then each configured level larger than it, nearest first."""
        if level not in self.levels:
            return (level,)
        return tuple(reversed(self.levels[: self.levels.index(level) + 1]))


NO_HIERARCHY = Hierarchy()


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a gang goes: its ``packing``; with a required level, the ``domain`` (label value) chosen."""

    packing: placement.Packing
    domain: str = ""


def asks(aw: AppWrapperView) -> bool:
    return bool(aw.topology_required or aw.topology_preferred
                or any(group.topology_required or group.topology_preferred for group in aw.gang))


def domains(nodes: Sequence[NodeView], level: str) -> Domains:
    """(label value, its nodes) for each domain of ``level``, by value; nodes without the label are left out."""
    found: dict[str, list[NodeView]] = {}
    for node in nodes:
        value = node.labels.get(level)
        if value is not None:
            found.setdefault(value, []).append(node)
    return sorted(found.items())


def place(aw: AppWrapperView, nodes: Sequence[NodeView], room: Mapping[str, ResourceVector],
          hierarchy: Hierarchy = NO_HIERARCHY, *, home: str = "", index: Index = PLAIN) -> Placed:
    """Where ``aw``'s pods go on ``nodes`` (see the module docstring); ``home``: the domain of its required level it
    was placed in before (a reset requeued it), taken again when the gang still fits there."""
    if not aw.topology_required:
        return Placed(pack_within(aw, nodes, room, hierarchy, index=index))
    if home:
        back = at_home(aw, nodes, room, hierarchy, home=home, index=index)
        if back is not None:
            return back
    chosen = _best_domain(aw.gang, nodes, room, aw.topology_required,
                          lambda members: pack_within(aw, members, room, hierarchy), index)
    return chosen if isinstance(chosen, Placed) else Placed(chosen)


def at_home(aw: AppWrapperView, nodes: Sequence[NodeView], room: Mapping[str, ResourceVector],
            hierarchy: Hierarchy = NO_HIERARCHY, *, home: str, index: Index = PLAIN) -> Placed | None:
    """``aw`` placed in ``home``, the domain of its required level it was dispatched into before, when it fits
    there whole; else None."""
    members = next((m for value, m in index.domains(nodes, aw.topology_required) if value == home), None)
    packing = pack_within(aw, members, room, hierarchy) if members else None
    return Placed(packing, home) if packing is not None and packing.fits else None


def home(level: str, nodes: Sequence[NodeView], used: Collection[str]) -> list[NodeView]:
    """The nodes a pod of a gang that requires ``level`` may be placed on again (its node refused it, or turned
    sick): those of the domain its other pods are on (``used``: the nodes it holds pods or planned room on), or,
    when it holds none, those that have the label at all."""
    values = {node.labels.get(level) for node in nodes if node.name in used} - {None}
    if not values:
        return [node for node in nodes if level in node.labels]
    return [node for node in nodes if node.labels.get(level) in values]


def pack_within(aw: AppWrapperView, nodes: Sequence[NodeView], room: Mapping[str, ResourceVector],
                hierarchy: Hierarchy = NO_HIERARCHY, *, in_given_order: bool = False,
                index: Index = PLAIN) -> placement.Packing:
    """``aw``'s pods on ``nodes``, keeping its preferred level and its pod sets' asks (see the module docstring)."""
    if aw.topology_preferred:
        return _preferring(aw.gang, nodes, room, hierarchy, aw.topology_preferred, index)
    return _pack_groups(aw.gang, nodes, room, hierarchy, in_given_order=in_given_order, index=index)


# -- how ----------------------------------------------------------------------------------------------------------


def _pack_groups(groups: Sequence[PodGroup], nodes: Sequence[NodeView], room: Mapping[str, ResourceVector],
                 hierarchy: Hierarchy, *, in_given_order: bool = False, index: Index = PLAIN
                 ) -> placement.Packing:
    """Pod sets that ask for a level first, each in its own domain; then the others over every node."""
    asking = [g for g in groups if g.topology_required or g.topology_preferred]
    if not asking:
        return placement.pack(groups, nodes, room, in_given_order=in_given_order)
    by_name = {node.name: node for node in nodes}
    left: dict[str, ResourceVector] = {}
    taken: list[tuple[str, ResourceVector, int]] = []
    for group in sorted(asking, key=placement.group_size, reverse=True):
        alone = (dataclasses.replace(group, topology_required="", topology_preferred=""),)
        now = _Overlay(room, left)
        if group.topology_required:
            chosen = _best_domain(alone, nodes, now, group.topology_required, partial(_pack_plain, alone, room=now),
                                  index)
            packing = chosen.packing if isinstance(chosen, Placed) else chosen
        else:
            packing = _preferring(alone, nodes, now, hierarchy, group.topology_preferred, index)
        if not packing.fits:
            return packing
        for node, requests, count in packing.placement:
            left[node] = now.get(node, by_name[node].allocatable) - requests.scale(count)
        taken.extend(packing.placement)
    rest = [g for g in groups if not (g.topology_required or g.topology_preferred)]
    packing = placement.pack(rest, nodes, _Overlay(room, left), in_given_order=in_given_order)
    if not packing.fits:
        return packing
    return placement.Packing(True, (*taken, *packing.placement))


def _pack_plain(groups: Sequence[PodGroup], nodes: Sequence[NodeView], *,
                room: Mapping[str, ResourceVector]) -> placement.Packing:
    return placement.pack(groups, nodes, room)


def _preferring(groups: Sequence[PodGroup], nodes: Sequence[NodeView], room: Mapping[str, ResourceVector],
                hierarchy: Hierarchy, level: str, index: Index = PLAIN) -> placement.Packing:
    """One domain of ``level``, else of each larger level, else every node, roomiest domains first."""
    def inner(members: Sequence[NodeView]) -> placement.Packing:
        return _pack_groups(groups, members, room, hierarchy)

    fallbacks = hierarchy.fallbacks(level)
    for each in fallbacks:
        chosen = _best_domain(groups, nodes, room, each, inner, index)
        if isinstance(chosen, Placed):
            return chosen.packing
    # As few domains as can be: the domains with the most free room first (of the largest level, then of the
    # level asked inside it), nodes without the label last.
    ranks = [_domain_ranks(index.domains(nodes, each), index.free(nodes, each, _scarcest(groups), room))
             for each in (fallbacks[-1], level)]
    ordered = sorted(nodes, key=lambda node: (*(rank.get(node.name, len(rank)) for rank in ranks), node.name))
    return _pack_groups(groups, ordered, room, hierarchy, in_given_order=True)


def _best_domain(groups: Sequence[PodGroup], nodes: Sequence[NodeView], room: Mapping[str, ResourceVector],
                 level: str, inner: Callable[[Sequence[NodeView]], placement.Packing],
                 index: Index = PLAIN) -> Placed | placement.Packing:
    """The domain of ``level`` that ``inner`` fits the groups in with the least room left; else why none does.

    The domains are tried in that order, (room left, value), and the first that takes the gang is the one: room
    left is the domain's free room in the scarcest resource less the gang's demand of it, which does not depend on
    where in the domain the pods go. A domain with less free room than the demand cannot take it and is not packed.
    """
    scarcest = _scarcest(groups)
    demand = sum((g.requests.scale(g.count) for g in groups), ResourceVector()).get(scarcest)
    every = index.domains(nodes, level)
    most = index.most(nodes, level, scarcest)
    if most is None or any(room_ever >= demand for room_ever in most.values()):
        # Free room is summed only when some domain could ever hold the gang: none, for GPU gangs on cpu nodes.
        free = index.free(nodes, level, scarcest, room)
        ordered = sorted((left, value, members) for value, members in every if (left := free[value] - demand) >= 0)
        for _, value, members in ordered:
            packing = inner(members)
            if packing.fits:
                return Placed(packing, value)
    return placement.Packing(False, reason=partial(_why_none, groups, every, room, level),
                             about=frozenset({f"topology:{level}"}))


def free_room(members: Sequence[NodeView], room: Mapping[str, ResourceVector], resource: str) -> int:
    """The free room of ``resource`` on ``members`` (a node over-committed counts as none, not less)."""
    return sum(max(room.get(node.name, node.allocatable).get(resource), 0) for node in members)


def _why_none(groups: Sequence[PodGroup], every: Domains,
              room: Mapping[str, ResourceVector], level: str) -> str:
    pods = sum(group.count for group in groups)
    if not every:
        return f"needs {pods} pod(s) in one {level}, and no node has that label"
    largest = max(groups, key=placement.group_size)
    what = f"{largest.count} pod(s) of {placement.describe_pod(largest.requests)}"
    needs = (f"needs {what} in one {level}" if len(groups) == 1
             else f"needs its {pods} pod(s) in one {level}, {what} among them")
    room_for = sorted(((-placement.room_for(largest, members, room), value) for value, members in every))
    named = [f"{value} has room for {-count}" if i == 0 else f"{value} for {-count}"
             for i, (count, value) in enumerate(room_for[:DOMAINS_NAMED])]
    more = f"; {len(every) - DOMAINS_NAMED} other domain(s) have less" if len(every) > DOMAINS_NAMED else ""
    return f"{needs}: {', '.join(named)}{more}"


def _domain_ranks(found: Domains, free: Mapping[str, int]) -> dict[str, int]:
    """Node name -> its domain's rank by ``free`` room, roomiest first (ties by value)."""
    order = sorted(free, key=lambda value: (-free[value], value))
    rank = {value: i for i, value in enumerate(order)}
    return {node.name: rank[value] for value, members in found for node in members}


def _scarcest(groups: Sequence[PodGroup]) -> str:
    """The resource a gang is placed by: GPUs if it asks for any, else cpu, else memory."""
    for name in (placement.GPU, "cpu", "memory"):
        if any(group.requests.get(name) > 0 and group.count > 0 for group in groups):
            return name
    return "cpu"


class _Overlay(Mapping[str, ResourceVector]):
    """``base`` with ``changed`` laid over it: room after some pod sets were placed, without copying all nodes."""

    def __init__(self, base: Mapping[str, ResourceVector], changed: Mapping[str, ResourceVector]) -> None:
        self._base, self._changed = base, dict(changed)

    def __getitem__(self, name: str) -> ResourceVector:
        if name in self._changed:
            return self._changed[name]
        return self._base[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._changed
        yield from (name for name in self._base if name not in self._changed)

    def __len__(self) -> int:
        return len(set(self._base) | set(self._changed))
