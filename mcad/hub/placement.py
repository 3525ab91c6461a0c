"""Hub mode's placement: which worker cluster a gang goes to, and where each AppWrapper's objects are.

Contract:
- ``WorkerPlacement`` is the hub's ``fit.Targets``: a gang fits when its pods pack onto the nodes of one usable
  worker that its ``clusterScheduling`` allows (nodes carry their worker in ``NodeView.cluster``), keeping what it
  asks of the topology within that worker (``mcad.model.topology``: domains are per worker);
  ``policy`` picks among those that fit: the first in config order, best (the least left of the gang's dominant
  resource) or spread (the most). The Backoff message names every allowed worker and why it does not fit.
- A gang that requires a topology level and was dispatched before (``homes``, ``mcad.model.fit.Homes``: written
  by ``dispatched`` when the dispatch cycle dispatches it, dropped by ``forget``) goes back to the same worker and
  domain when that worker is usable, still allowed, and the domain holds it whole, whatever the policy would
  pick; else it is placed as a fresh gang.
- ``usable`` is the set of workers placement uses, as the dispatcher thread last adopted them (``mcad.hub.sites``);
  a worker whose capacity is not known yet is neither full nor empty: it is not used.
- ``placed`` maps each AppWrapper to the worker its objects are in; a pod counts as an AppWrapper's only there.
- ``WorkerDirectory`` is what placement reads of the hub (``mcad.hub.connections.Hub`` in production): a
  protocol, so tests give a fake without casts. Its config and health are read through protocols too
  (``HubLayout``, ``WorkerState``), which ``mcad.hub.clusters``' ``HubConfig`` and ``HealthStatus`` satisfy: that
  module holds the connections and their threads, which placement does not reach.
- ``fit`` is pure: reads the snapshot, the homes, the hub's configuration and health; writes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Protocol

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.api.views import NodeView
from mcad.model import placement, topology
from mcad.model.accounting import Snapshot
from mcad.model.fit import Fit, Homes, pack_in_set


class Policy(enum.StrEnum):
    """How a gang that fits in several workers picks one (``--cluster-policy``, the hub config's ``policy``)."""

    FIRST = "first"  # the first worker in config order
    BEST = "best"  # the tightest fit, leaving the largest holes elsewhere
    SPREAD = "spread"  # the most free capacity, spreading load


class WorkerLabels(Protocol):
    """What placement reads of one configured worker (``mcad.hub.clusters.WorkerSpec``)."""

    @property
    def labels(self) -> Mapping[str, str]: ...


class HubLayout(Protocol):
    """What placement reads of the hub's configuration (``mcad.hub.clusters.HubConfig``)."""

    @property
    def policy(self) -> Policy: ...

    def worker(self, name: str) -> WorkerLabels: ...


class WorkerState(Protocol):
    """What placement reads of a worker's health (``mcad.hub.clusters.HealthStatus``): its state, for messages."""

    @property
    def state(self) -> enum.StrEnum: ...


class WorkerDirectory(Protocol):
    """What placement reads of the hub (``mcad.hub.connections.Hub``): the configured workers and their health."""

    @property
    def config(self) -> HubLayout:
        ...

    @property
    def names(self) -> list[str]:
        ...

    def health(self, name: str) -> WorkerState:
        ...

    def describe(self, name: str) -> str:
        ...


def leftover_share(left: ResourceVector, capacity: ResourceVector, demand: ResourceVector) -> float:
    """How much of a worker stays free after a placement, as the smallest share left of any resource the gang
    asks for (the dominant one): best fit picks the smallest, spread the largest."""
    shares = [left.get(name) / capacity.get(name) for name in demand if capacity.get(name) > 0]
    return min(shares) if shares else 0.0


def nodes_in(cluster: str, nodes: Sequence[NodeView]) -> list[NodeView]:
    """The nodes of one worker."""
    return [node for node in nodes if node.cluster == cluster]


class WorkerPlacement:
    def __init__(self, hub: WorkerDirectory, policy: Policy | None = None,
                 hierarchy: topology.Hierarchy = topology.NO_HIERARCHY) -> None:
        self.hub = hub
        self.policy = policy or hub.config.policy
        self.hierarchy = hierarchy
        self.usable: set[str] = set()
        self.placed: dict[str, str] = {}
        self.homes = Homes()

    def dispatched(self, aw: AppWrapperView, fit: Fit) -> None:
        self.homes.record(aw, fit)

    def forget(self, key: str) -> None:
        self.homes.forget(key)

    def allowed(self, aw: AppWrapperView) -> list[str]:
        """The workers ``aw``'s clusterScheduling lets it go to, in config order."""
        return [name for name in self.hub.names if aw.clusters.allows(name, self.hub.config.worker(name).labels)]

    def node_sets(self, aw: AppWrapperView, snapshot: Snapshot) -> list[tuple[str, Sequence[NodeView]]]:
        """Where ``aw`` may be placed: each usable worker it may go to; with a required topology level, each domain
        of it within such a worker (a domain never spans two workers, whatever their labels say)."""
        workers: list[tuple[str, Sequence[NodeView]]] = [
            (name, nodes_in(name, snapshot.nodes)) for name in self.allowed(aw) if name in self.usable]
        if not aw.topology_required:
            return workers
        return [(name, members) for name, nodes in workers
                for _, members in topology.domains(nodes, aw.topology_required)]

    def pack(self, aw: AppWrapperView, nodes: Sequence[NodeView], room: Mapping[str, ResourceVector], *,
             in_given_order: bool = False) -> placement.Packing:
        return pack_in_set(aw, nodes, room, self.hierarchy, in_given_order=in_given_order)

    def fit(self, aw: AppWrapperView, need: ResourceVector, snapshot: Snapshot) -> Fit:
        """The gang must fit in one worker; ``policy`` picks among those it fits in. Fit is judged by packing its
        pods onto the worker's nodes, as with one cluster."""
        allowed = self.allowed(aw)
        if not allowed:
            why = f"no worker cluster matches its clusterScheduling ({aw.clusters.describe()})"
            return Fit(False, frozenset({"clusterScheduling"}), partial(str, why))
        consumed = snapshot.consumed(aw.key)
        room = snapshot.room or {}
        home = self.homes.of(aw)
        if home is not None and not consumed and home.cluster in allowed and home.cluster in self.usable:
            back = topology.at_home(aw, nodes_in(home.cluster, snapshot.nodes), room, self.hierarchy,
                                    home=home.domain)
            if back is not None:
                return Fit(True, plan=back.packing.placement, cluster=home.cluster, domain=home.domain)
        fits: list[tuple[float, int, str, tuple[tuple[str, ResourceVector, int], ...], str]] = []
        about: set[str] = set()
        reasons: list[str] = []
        short_of_room = False  # a usable worker it may go to has too little room (one that waits can reserve it)
        for order, name in enumerate(allowed):
            if name not in self.usable:
                about.add(f"{name}: {self.hub.health(name).state.value}")
                reasons.append(f"{name}: {self.hub.describe(name)}")
                continue
            nodes = nodes_in(name, snapshot.nodes)
            free = ResourceVector()
            capacity = ResourceVector()
            for node in nodes:
                if node.schedulable:
                    free = free + room.get(node.name, ResourceVector())
                    capacity = capacity + node.allocatable
            if consumed:
                # Its own pods run there already (a restart between creating objects and recording it): only the
                # rest is judged, in that worker only.
                if self.placed.get(aw.key) == name and need.fits_in(free):
                    fits.append((0.0, order, name, (), ""))
                continue
            placed = (topology.place(aw, nodes, room, self.hierarchy) if topology.asks(aw)
                      else topology.Placed(placement.pack(aw.gang, nodes, room)))
            packing = placed.packing
            if packing.fits:
                fits.append((leftover_share(free - aw.demand, capacity, aw.demand), order, name, packing.placement,
                             placed.domain))
            else:
                about.update(f"{name}: {a}" for a in packing.about)
                reasons.append(f"{name}: {packing.why}")
                short_of_room = True
        if not fits:
            why = "does not fit in any worker cluster: " + "; ".join(reasons) if reasons else \
                "does not fit in any worker cluster"
            return Fit(False, frozenset(about), partial(str, why), short_of_room=short_of_room)
        if self.policy is Policy.FIRST:
            chosen = min(fits, key=lambda f: f[1])
        elif self.policy is Policy.SPREAD:
            chosen = max(fits, key=lambda f: (f[0], -f[1]))
        else:
            chosen = min(fits, key=lambda f: (f[0], f[1]))
        return Fit(True, plan=chosen[3], cluster=chosen[2], domain=chosen[4])

    def nodes_for(self, key: str, snapshot: Snapshot) -> Sequence[NodeView]:
        """The nodes its pods may be on: those of the worker it is placed in."""
        return nodes_in(self.placed.get(key, ""), snapshot.nodes)
