"""The resource accountant: what the nodes have, what runs on them and what is promised, held by one object.

Contract (DESIGN.md, "Free capacity"; the equivalent of Kueue's cache):
- ``Accountant`` owns every piece of state about capacity that is remembered across events: the ``Ledger`` (nodes,
  pods, reservations), the plans of ``--fit=nodes`` dispatches and the pins of ``--placement=binding``
  (``plans``, one ``mcad.model.plans.Plans``: room on a node promised to pods that are not bound yet), the quota
  charges (``quota.QuotaLedger``, None when quota trees are not served) and the one index of which pods belong to
  which AppWrapper. Nothing else keeps any of these.
- Its vocabulary: ``observe_node``/``forget_node`` and ``observe_pod``/``forget_pod`` for informer events;
  ``assume(key, demand, labels, plan)`` when a dispatch is decided (reserve, charge, plan);
  ``forget(key)`` when an AppWrapper stops holding capacity; ``snapshot(fit_by_nodes)`` for a pass of decisions.
- It tells ``plans`` what only the pods say: a pod of an AppWrapper that binds (or ends without binding) takes one
  planned pod off its plan, a pod that goes frees its pin's slot, and an AppWrapper that holds no capacity, or
  whose pods are detached, holds no plan. The loop's owners pin through ``plans`` (``mcad.loop.pinning``).
- What needs both its pods and its plan is asked here: ``replan`` (after a restart, its pods not bound yet planned
  again; pods pinned before keep their node), ``beyond_demand`` (how far one more pod beyond its plan would take
  its pods past its demand: a pod is pinned beyond the plan only while that is ZERO), ``holders`` and
  ``footprint`` (what it holds where, for reservations and preemption), ``room`` (per node, with planned pods).
- ``Snapshot`` is a scratch copy of free room for one pass of decisions (a dispatch cycle, an explain):
  ``take`` subtracts what a decision would use, and nothing it does reaches the accountant.
- Sick nodes (``mcad.model.nodehealth``): the accountant holds the controller's node-health rules and marks each
  node it is told of with what they say (``NodeView.health``, once per node event: O(rules)), so every decision over
  its nodes (``mcad.model.placement``, pinning, reservations, preemption, explain) reads the marks and no decision
  needs the rules. A label change is a placement fact like any other (``observe_node`` says fit may differ).
  ``node_verdict(node, requests)`` says what they say of a pod of ``requests`` there; ``evicted_pods(key)`` lists
  an AppWrapper's bound, unfinished pods on NoExecute nodes for them, with the verdict (what the loop's health
  watch resets it for).
- Pure: no I/O, no threads; the dispatcher thread owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from mcad.api.appwrapper import AppWrapperView
from mcad.api.nodemarks import Effect, Verdict
from mcad.api.podgroups import PodGroup
from mcad.api.resources import ZERO, ResourceVector
from mcad.api.views import NodeView, PodView, Unschedulable
from mcad.model import placement, quota, topology
from mcad.model.ledger import Ledger
from mcad.model.nodehealth import NodeHealth
from mcad.model.plans import Plan, PlanEntry, Plans


def _placement_facts(node: NodeView) -> tuple[object, ...]:
    """What fit decisions read of a node (heartbeats change none of it)."""
    return (node.allocatable, node.schedulable, node.ready, node.unschedulable, node.taints, dict(node.labels))


@dataclass(slots=True)
class Snapshot:
    """Free room as one pass of decisions sees it; ``take`` is that pass's own bookkeeping.

    ``room`` (per node: allocatable - its pods - pods planned there) is None with ``--fit=aggregate``. ``quota`` is
    the ledger fit checks read: the accountant's own in a dispatch cycle (a dispatch charges it through ``assume``),
    a scratch copy in a dry run (which charges it itself)."""

    free: ResourceVector
    capacity: ResourceVector
    room: dict[str, ResourceVector] | None
    nodes: Sequence[NodeView]
    quota: quota.QuotaLedger | None
    consumed: Callable[[str], ResourceVector]
    # Facts derived from ``nodes`` alone (the domains of each topology level, their allocatable room:
    # ``mcad.model.fit.SnapshotIndex``), shared with its copies and with later snapshots of the same nodes (the
    # accountant hands the same dict on while ``Ledger.nodes()`` is the same tuple), so computed once per node set.
    facts: dict[object, object] = field(default_factory=dict)
    # What is kept of this snapshot's room for the pass: not shared with its copies.
    memo: dict[object, topology.DomainRoom] = field(default_factory=dict)

    def need(self, key: str, demand: ResourceVector) -> ResourceVector:
        """What is left to fit of an AppWrapper's demand: its own pods that exist already are in use."""
        return (demand - self.consumed(key)).clamp()

    def take(self, need: ResourceVector, plan: Iterable[PlanEntry]) -> None:
        self.free = self.free - need
        if self.room is not None:
            self._move(plan, -1)

    def give(self, need: ResourceVector, plan: Iterable[PlanEntry]) -> None:
        """Undo a ``take``."""
        self.free = self.free + need
        if self.room is not None:
            self._move(plan, 1)

    def _move(self, plan: Iterable[PlanEntry], sign: int) -> None:
        assert self.room is not None
        kept = list(self.memo.values())
        for node, requests, count in plan:
            before = self.room.get(node)
            if before is None:
                continue
            after = self.room[node] = before + requests.scale(sign * count)
            for watcher in kept:
                watcher.room_changed(node, before, after)

    def copy(self) -> Snapshot:
        """A copy to try decisions on (the quota ledger is shared: fit checks only read it). Facts about the nodes
        are shared; what is kept of the room is not (the copy's room changes apart)."""
        return replace(self, room=dict(self.room) if self.room is not None else None, memo={})



class Accountant:
    def __init__(self, *, quota_trees: bool = False, node_health: NodeHealth | None = None) -> None:
        self.ledger = Ledger()
        # The controller's node-health rules (Autopilot's by default); NO_RULES marks no node.
        self.node_health = node_health if node_health is not None else NodeHealth()
        # Quota trees: None when not served (no QuotaSubtree CRD, or --no-quota); then nothing is charged.
        self.quota: quota.QuotaLedger | None = quota.QuotaLedger() if quota_trees else None
        # --fit=nodes: where each dispatched AppWrapper's pods not bound yet go, and the pods pinned there.
        self.plans = Plans()
        # The pods of each AppWrapper (uid -> phase), and the owner of each such pod.
        self._pod_owner: dict[str, str] = {}
        self._pods_by_appwrapper: dict[str, dict[str, str]] = {}
        # Snapshot.facts of the node set ``_facts_of`` (Ledger.nodes()), handed to each snapshot of it.
        self._facts_of: Sequence[NodeView] | None = None
        self._facts: dict[object, object] = {}

    # -- nodes ----------------------------------------------------------------------------------------------------

    def observe_node(self, node: NodeView) -> bool:
        """A node was added or changed; True when fit decisions may now differ (new, or placement facts changed)."""
        before = self.ledger.node(node.name)
        marks = self.node_health.marks(node.labels)
        if marks != node.health:
            node = replace(node, health=marks)
        self.ledger.upsert_node(node)
        return before is None or _placement_facts(before) != _placement_facts(node)

    def forget_node(self, name: str) -> None:
        self.ledger.delete_node(name)

    def node_verdict(self, name: str, requests: ResourceVector) -> Verdict | None:
        """What the node-health rules say of a pod of ``requests`` on node ``name`` (None: healthy for it, or a
        node not known)."""
        node = self.ledger.node(name)
        return placement.health_verdict(node, requests) if node is not None else None

    def evicted_pods(self, key: str) -> list[tuple[PodView, Verdict]]:
        """Its pods bound to a node whose NoExecute verdict applies to them and not ended, with that verdict (in
        no particular order): what the loop's health watch resets the AppWrapper for. O(its pods)."""
        out = []
        for uid in self._pods_by_appwrapper.get(key, {}):
            pod = self.ledger.pod(uid)
            if pod is None or not pod.node_name or pod.terminal:
                continue
            verdict = self.node_verdict(pod.node_name, pod.requests)
            if verdict is not None and verdict.effect is Effect.NO_EXECUTE:
                out.append((pod, verdict))
        return out

    # -- pods -----------------------------------------------------------------------------------------------------

    def observe_pod(self, pod: PodView) -> None:
        """A pod was added or changed. A pod of an AppWrapper that binds (or ends unbound) takes one planned pod
        off its plan."""
        if pod.appwrapper and pod.appwrapper in self.plans and (pod.node_name or pod.terminal):
            before = self.ledger.pod(pod.uid)
            if before is None or not (before.node_name or before.terminal):
                self.plans.pod_bound(pod.appwrapper, pod.uid, pod.node_name, pod.requests)
        self.ledger.upsert_pod(pod)
        owner = self._pod_owner.get(pod.uid)
        if owner and owner != pod.appwrapper:
            self._untrack(owner, pod.uid)
        if pod.appwrapper:
            self._pod_owner[pod.uid] = pod.appwrapper
            self._pods_by_appwrapper.setdefault(pod.appwrapper, {})[pod.uid] = pod.phase
        else:
            self._pod_owner.pop(pod.uid, None)

    def forget_pod(self, uid: str) -> str | None:
        """A pod is gone; returns the AppWrapper it belonged to, if any. A pin it held frees its slot."""
        self.plans.unpin(uid)
        self.ledger.delete_pod(uid)
        owner = self._pod_owner.pop(uid, None)
        if owner:
            self._untrack(owner, uid)
        return owner

    def detach_pods(self, key: str) -> None:
        """Its pods stop counting as its own (it left the worker they run in); they still count as usage there."""
        self.plans.drop(key)
        for uid in list(self._pods_by_appwrapper.get(key, {})):
            pod = self.ledger.pod(uid)
            if pod is not None:
                self.ledger.upsert_pod(_unowned(pod))
            self._pod_owner.pop(uid, None)
        self._pods_by_appwrapper.pop(key, None)

    def _untrack(self, owner: str, uid: str) -> None:
        pods = self._pods_by_appwrapper.get(owner)
        if pods is not None:
            pods.pop(uid, None)
            if not pods:
                del self._pods_by_appwrapper[owner]  # deleted AppWrappers must not leave an entry each behind

    def phases(self, key: str) -> list[str]:
        return list(self._pods_by_appwrapper.get(key, {}).values())

    def has_pods(self, key: str) -> bool:
        return key in self._pods_by_appwrapper

    def unschedulable_pods(self, key: str) -> list[tuple[str, Unschedulable]]:
        """(name, the scheduler's verdict) of its Pending pods that no node could take."""
        out = []
        for uid, phase in self._pods_by_appwrapper.get(key, {}).items():
            pod = self.ledger.pod(uid) if phase == "Pending" else None
            if pod is not None and pod.unschedulable is not None:
                out.append((pod.name, pod.unschedulable))
        return out

    def bound_by_requests(self, key: str) -> dict[ResourceVector, int]:
        """How many of its pods are bound (or done), by their requests: what a restart need not plan again."""
        bound: dict[ResourceVector, int] = {}
        for uid in self._pods_by_appwrapper.get(key, {}):
            pod = self.ledger.pod(uid)
            if pod is not None and (pod.node_name or pod.terminal):
                bound[pod.requests] = bound.get(pod.requests, 0) + 1
        return bound

    def pods(self, key: str) -> list[PodView]:
        """Every pod of the AppWrapper that exists, ended or not."""
        found = (self.ledger.pod(uid) for uid in self._pods_by_appwrapper.get(key, {}))
        return [pod for pod in found if pod is not None]

    def live_pods(self, key: str) -> list[PodView]:
        """Its pods that have not ended."""
        pods = (self.ledger.pod(uid) for uid in self._pods_by_appwrapper.get(key, {}))
        return [pod for pod in pods if pod is not None and not pod.terminal]

    # -- what dispatched AppWrappers hold ---------------------------------------------------------------------------

    def assume(self, key: str, demand: ResourceVector, labels: Mapping[str, str], plan: Plan = ()) -> None:
        """A dispatch: its demand reserved, charged to its quota nodes, and (--fit=nodes) its pods planned."""
        self.ledger.reserve(key, demand)
        if self.quota is not None:
            self.quota.charge(key, labels, demand)
        if plan:
            self.plans.plan(key, plan)

    def forget(self, key: str) -> bool:
        """It holds no capacity any more (its pods still count while they exist); True if it held some."""
        self.plans.drop(key)
        held = self.ledger.is_reserved(key)
        if held:
            self.ledger.release(key)
        if self.quota is not None and self.quota.is_charged(key):
            self.quota.release(key)
            held = True
        return held

    def holds(self, key: str) -> bool:
        return self.ledger.is_reserved(key)

    def holders(self, nodes: Collection[str] | None) -> set[str]:
        """The AppWrappers that hold room on these nodes (None: anywhere): pods of theirs that are bound there and
        running, pods planned there, or (anywhere only) demand reserved and not yet covered by pods."""
        found = self.plans.planned_on(nodes)
        for key, pods in self._pods_by_appwrapper.items():
            if key in found:
                continue
            for uid in pods:
                pod = self.ledger.pod(uid)
                if pod is not None and pod.node_name and not pod.terminal and (nodes is None or pod.node_name in nodes):
                    found.add(key)
                    break
        if nodes is None:
            found.update(key for key in self.ledger.reserved_keys() if self.ledger.reservation(key))
        return found

    def footprint(self, key: str) -> list[PlanEntry]:
        """What evicting a dispatched AppWrapper frees, by node: its active bound pods and (--fit=nodes) the
        unbound rest of its plan; ("", outstanding reservation, 1) stands for what is reserved but not placed."""
        freed: list[PlanEntry] = []
        for uid in self._pods_by_appwrapper.get(key, {}):
            pod = self.ledger.pod(uid)
            if pod is not None and pod.node_name and not pod.terminal:
                freed.append((pod.node_name, pod.requests, 1))
        if key in self.plans:
            freed.extend(self.plans.unbound(key))
        elif self.ledger.reservation(key):
            freed.append(("", self.ledger.reservation(key), 1))
        return freed

    def home_nodes(self, aw: AppWrapperView, nodes: Sequence[NodeView]) -> Sequence[NodeView]:
        """Where ``aw``'s pods may be placed again (a node refused one, turned sick, or mcad restarted): ``nodes``,
        or, when it requires a topology level, the domain of them its pods and plan are in
        (``mcad.model.topology.home``): a gang that must share one domain never gets a pod elsewhere."""
        if not aw.topology_required:
            return nodes
        used = {node for node, _, _ in self.footprint(aw.key) if node}
        return topology.home(aw.topology_required, nodes, used)

    # -- plans, over its pods (the plans themselves: ``self.plans``) ----------------------------------------------

    def replan(self, key: str, gang: Sequence[PodGroup], nodes: Sequence[NodeView], snapshot: Snapshot) -> None:
        """After a restart: its pods not bound yet, planned again on the snapshot's room left (where the scheduler
        will put them is not known; this keeps their room from being promised twice). Taken from the snapshot."""
        bound = self.bound_by_requests(key)
        # Pods mcad pinned before the restart and not bound yet keep their node: their slots come first.
        pinned = [pod for pod in self.live_pods(key)
                  if not pod.node_name and pod.pin is not None and pod.pin.pinned_to and not pod.pin.gated]
        for pod in pinned:
            bound[pod.requests] = bound.get(pod.requests, 0) + 1
        groups = []
        for group in gang:
            done = min(bound.get(group.requests, 0), group.count)
            bound[group.requests] = bound.get(group.requests, 0) - done
            if group.count > done:
                groups.append(replace(group, count=group.count - done))
        packing = placement.pack(groups, nodes, snapshot.room or {})
        self.plans.plan(key, packing.placement if packing.fits else ())
        if packing.fits:
            snapshot.take(ZERO, packing.placement)
        for pod in pinned:
            assert pod.pin is not None
            self.plans.pin_extra(key, pod.uid, pod.pin.pinned_to, pod.requests)
            snapshot.take(ZERO, ((pod.pin.pinned_to, pod.requests, 1),))

    def beyond_demand(self, key: str, requests: ResourceVector) -> ResourceVector:
        """How much more than ``key``'s demand its pods would hold with one more of ``requests`` beyond its plan:
        its running bound pods, its plan's unbound slots and that pod (ZERO: it fits within the demand; also for
        an AppWrapper that holds no reservation, whose pods are not planned)."""
        demand = self.ledger.demand(key)
        if demand is None:
            return ZERO
        held = requests
        for uid in self._pods_by_appwrapper.get(key, {}):
            pod = self.ledger.pod(uid)
            if pod is not None and pod.node_name and not pod.terminal:
                held = held + pod.requests
        for _node, planned, count in self.plans.unbound(key):
            held = held + planned.scale(count)
        return (held - demand).clamp()

    def room(self) -> dict[str, ResourceVector]:
        """Per node: allocatable - its pods' requests - pods planned there by dispatches not yet bound."""
        room = self.ledger.room_by_node()
        for node, planned in self.plans.planned_by_node().items():
            if node in room:
                room[node] = room[node] - planned
        return room

    # -- decisions ------------------------------------------------------------------------------------------------

    def snapshot(self, *, by_nodes: bool, scratch_quota: bool = False) -> Snapshot:
        """Free room for one pass of decisions; ``scratch_quota``: over a copy of the quota ledger (a dry run)."""
        charges = self.quota.copy() if scratch_quota and self.quota is not None else self.quota
        nodes = self.ledger.nodes() if by_nodes else ()
        if nodes is not self._facts_of:
            self._facts_of, self._facts = nodes, {}
        return Snapshot(free=self.ledger.free(), capacity=self.ledger.capacity(),
                        room=self.room() if by_nodes else None, nodes=nodes, quota=charges,
                        consumed=self.ledger.consumed, facts=self._facts)


def _unowned(pod: PodView) -> PodView:
    return replace(pod, appwrapper=None)
