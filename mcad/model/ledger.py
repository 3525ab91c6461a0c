"""The capacity ledger: how much of the cluster is free for the next dispatch, kept up to date event by event.

Contract (DESIGN.md, "Free capacity"):
- ``capacity()`` = Σ allocatable of schedulable nodes (``NodeView.schedulable``).
- ``in_use()`` = Σ requests of non-terminal pods bound to a schedulable node. Pods bound to an unknown or
  unschedulable node count nowhere in it; when a node appears, flips schedulable <-> unschedulable or is
  deleted, the usage of its pods moves with it.
- A reservation is made for an AppWrapper (key ``"namespace/name"``) when it is dispatched. Its *consumed* part is
  Σ requests of its own pods (``PodView.appwrapper == key``) that are bound to a node or Succeeded (a Failed pod
  consumes nothing: its share stays reserved for its replacement); its outstanding part, ``reservation(key)`` =
  max(0, demand - consumed) per resource. So a bound running pod is in ``in_use`` and shrinks the reservation, a
  finished pod is in neither, and nothing is counted twice. Pods of an AppWrapper
  without a reservation count only in ``in_use``.
- ``pods_by_node()``: per node name, how many non-terminal pods are bound to it. Each takes one of the node's
  allocatable ``pods`` whatever it requests, as the scheduler counts; the vectors above leave that out (requests
  carry no ``pods``), reports (``/debug/ledger``) add it.
- ``reserved()`` = Σ outstanding parts; ``free()`` = capacity - in_use - reserved, which may be negative per
  resource (over-commitment is information: callers compare with ``fits_in``/``shortfall``).

Every event costs O(size of one view): the ledger keeps running totals (capacity, in use, reserved), per-node
sums of bound pod requests (so a node flip moves one vector, not its pods one by one), per-AppWrapper consumed sums
and outstanding parts (so a pod event adjusts at most one node and one AppWrapper). Nothing is rescanned.

Single-threaded by design: the dispatcher thread owns the ledger, so there are no locks.
"""

from __future__ import annotations

from dataclasses import replace

from mcad.api.resources import ZERO, ResourceVector
from mcad.api.views import NodeView, PodView


class Ledger:
    __slots__ = (
        "_capacity",
        "_consumed",
        "_demand",
        "_in_use",
        "_lasting",
        "_node_list",
        "_node_pods",
        "_node_usage",
        "_nodes",
        "_outstanding",
        "_pods",
        "_reserved",
    )

    def __init__(self) -> None:
        self._nodes: dict[str, NodeView] = {}
        self._node_list: tuple[NodeView, ...] | None = None  # nodes(), until a node changes
        self._pods: dict[str, PodView] = {}
        # Σ requests of non-terminal pods bound to each node name, known node or not: a pod may be seen before its
        # node, and a node's usage must be at hand when it turns schedulable.
        self._node_usage: dict[str, ResourceVector] = {}
        # How many non-terminal pods are bound to each node name: each takes one of the node's allocatable "pods"
        # (110 by default), as the scheduler counts them, whatever they request. Reported, not part of the vectors.
        self._node_pods: dict[str, int] = {}
        # The part of it that pods of no AppWrapper use: nothing says when they end (reservations plan around it).
        self._lasting: dict[str, ResourceVector] = {}
        # Σ requests of each AppWrapper's bound-or-terminal pods, reserved or not: a reservation made for an
        # AppWrapper whose pods already exist (a restart re-reserving running AppWrappers) starts out right.
        self._consumed: dict[str, ResourceVector] = {}
        self._demand: dict[str, ResourceVector] = {}
        self._outstanding: dict[str, ResourceVector] = {}
        self._capacity = ZERO
        self._in_use = ZERO
        self._reserved = ZERO

    # -- nodes ----------------------------------------------------------------------------------------------------

    def upsert_node(self, node: NodeView) -> None:
        old = self._nodes.get(node.name)
        self._nodes[node.name] = node
        if old is None or not _same_but_version(old, node):
            self._node_list = None
        counted = old.allocatable if old is not None and old.schedulable else None
        was = counted is not None
        if was and node.schedulable and counted == node.allocatable:
            return  # the common case: a status heartbeat that changes nothing the ledger counts
        if counted is not None:
            self._capacity -= counted
        if node.schedulable:
            self._capacity += node.allocatable
        if was != node.schedulable:
            usage = self._node_usage.get(node.name)
            if usage is not None:
                self._in_use = self._in_use + usage if node.schedulable else self._in_use - usage

    def delete_node(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        if old is not None:
            self._node_list = None
        if old is None or not old.schedulable:
            return
        self._capacity -= old.allocatable
        usage = self._node_usage.get(name)
        if usage is not None:
            self._in_use -= usage

    # -- pods -----------------------------------------------------------------------------------------------------

    def upsert_pod(self, pod: PodView) -> None:
        old = self._pods.get(pod.uid)
        self._pods[pod.uid] = pod
        if old is not None:
            if (
                old.node_name == pod.node_name
                and old.terminal == pod.terminal
                and (old.phase == "Failed") == (pod.phase == "Failed")
                and old.appwrapper == pod.appwrapper
                and old.requests == pod.requests
            ):
                return  # status churn (conditions, IPs, resourceVersion) that changes nothing the ledger counts
            self._account(old, -1)
        self._account(pod, 1)

    def delete_pod(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            self._account(old, -1)

    def _account(self, pod: PodView, sign: int) -> None:
        """Add (sign 1) or remove (sign -1) the pod's contribution to its node's usage and its AppWrapper's use."""
        requests = pod.requests
        node = pod.node_name
        if node and not pod.terminal:
            count = self._node_pods.get(node, 0) + sign
            if count:
                self._node_pods[node] = count
            else:
                self._node_pods.pop(node, None)
        if not requests:
            return
        if node and not pod.terminal:
            self._node_usage[node] = usage = _shift(self._node_usage.get(node, ZERO), requests, sign)
            if not usage:
                del self._node_usage[node]
            if pod.appwrapper is None:
                self._lasting[node] = lasting = _shift(self._lasting.get(node, ZERO), requests, sign)
                if not lasting:
                    del self._lasting[node]
            known = self._nodes.get(node)
            if known is not None and known.schedulable:
                self._in_use = _shift(self._in_use, requests, sign)
        key = pod.appwrapper
        # A Failed pod consumes nothing of its AppWrapper's reservation: its share stays reserved for the pod that
        # replaces it (its controller's, or a reset's: mcad.loop.health), so no other work takes the room of a gang
        # that is recovering. A Succeeded pod's share is done with.
        if key is not None and (node or pod.terminal) and pod.phase != "Failed":
            self._consumed[key] = consumed = _shift(self._consumed.get(key, ZERO), requests, sign)
            if not consumed:
                del self._consumed[key]
            if key in self._demand:
                self._refresh(key)

    # -- reservations ---------------------------------------------------------------------------------------------

    def reserve(self, appwrapper: str, demand: ResourceVector) -> None:
        """Reserve ``demand`` for a dispatched AppWrapper, replacing any earlier reservation of the same key."""
        self._demand[appwrapper] = demand
        self._refresh(appwrapper)

    def release(self, appwrapper: str) -> None:
        self._demand.pop(appwrapper, None)
        outstanding = self._outstanding.pop(appwrapper, None)
        if outstanding is not None:
            self._reserved -= outstanding

    def demand(self, appwrapper: str) -> ResourceVector | None:
        """What a dispatched AppWrapper asked for (None when it holds no reservation)."""
        return self._demand.get(appwrapper)

    def reserved_keys(self) -> list[str]:
        return list(self._demand)

    def is_reserved(self, appwrapper: str) -> bool:
        return appwrapper in self._demand

    def _refresh(self, key: str) -> None:
        """Recompute one AppWrapper's outstanding part and adjust the running total by the difference."""
        outstanding = (self._demand[key] - self._consumed.get(key, ZERO)).clamp()
        previous = self._outstanding.get(key, ZERO)
        self._outstanding[key] = outstanding
        if outstanding != previous:
            self._reserved = self._reserved - previous + outstanding

    # -- queries --------------------------------------------------------------------------------------------------

    def capacity(self) -> ResourceVector:
        """Σ allocatable of schedulable nodes."""
        return self._capacity

    def in_use(self) -> ResourceVector:
        """Σ requests of non-terminal pods bound to schedulable nodes."""
        return self._in_use

    def reserved(self) -> ResourceVector:
        """Σ over reservations of max(0, demand - consumed) per resource."""
        return self._reserved

    def free(self) -> ResourceVector:
        """capacity - in_use - reserved; may be negative per resource."""
        return self._capacity - self._in_use - self._reserved

    def reservation(self, appwrapper: str) -> ResourceVector:
        """The outstanding part of one AppWrapper's reservation (ZERO when it has none)."""
        return self._outstanding.get(appwrapper, ZERO)

    def consumed(self, appwrapper: str) -> ResourceVector:
        """Σ requests of the AppWrapper's pods that are bound to a node or Succeeded (not Failed), reserved or not."""
        return self._consumed.get(appwrapper, ZERO)

    def room_by_node(self) -> dict[str, ResourceVector]:
        """Per known node, schedulable or not: allocatable - requests of its non-terminal pods. Placement decides
        which nodes a pod may use (a tainted node is fine for a pod that tolerates the taint)."""
        return {name: node.allocatable - self._node_usage.get(name, ZERO) for name, node in self._nodes.items()}

    def pods_by_node(self) -> dict[str, int]:
        """Per node name: how many non-terminal pods are bound to it (each uses one of its allocatable ``pods``)."""
        return dict(self._node_pods)

    def lasting_room_by_node(self) -> dict[str, ResourceVector]:
        """Per known node: allocatable - requests of its non-terminal pods that belong to no AppWrapper, i.e. what
        would be free once every AppWrapper's pods there ended."""
        return {name: node.allocatable - self._lasting.get(name, ZERO) for name, node in self._nodes.items()}

    def lasting_free(self) -> ResourceVector:
        """capacity - requests of the pods of no AppWrapper on schedulable nodes."""
        free = self._capacity
        for name, usage in self._lasting.items():
            node = self._nodes.get(name)
            if node is not None and node.schedulable:
                free = free - usage
        return free

    def nodes(self) -> tuple[NodeView, ...]:
        """Every known node: the same tuple until a node is added, removed or changes in more than its
        resourceVersion (a status heartbeat), so that facts derived from the nodes alone outlive one pass
        (``mcad.model.accounting.Snapshot.facts``)."""
        if self._node_list is None:
            self._node_list = tuple(self._nodes.values())
        return self._node_list

    def node(self, name: str) -> NodeView | None:
        return self._nodes.get(name)

    def pod(self, uid: str) -> PodView | None:
        return self._pods.get(uid)


def _same_but_version(old: NodeView, new: NodeView) -> bool:
    """The same node in everything a decision reads: only its resourceVersion moved."""
    return old == replace(new, resource_version=old.resource_version)


def _shift(total: ResourceVector, delta: ResourceVector, sign: int) -> ResourceVector:
    return total + delta if sign > 0 else total - delta
