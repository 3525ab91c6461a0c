"""Placement that binds (``--placement=binding``): each gated pod of a dispatched AppWrapper is pinned to a node.

Contract (DESIGN.md, "Placement binds"):
- Dispatch puts mcad's scheduling gate (``PLACEMENT_GATE``) on every pod template (``mcad.k8s.apply``), so the
  scheduler leaves the pods alone. Each gated pod the pod informer shows is handed to ``observe`` (the loop's
  thread, like everything here). It takes an open slot of its AppWrapper's plan (``Plans.pin``, the accountant's
  plans: one of its requests, or the smallest that holds them when the plan has none of that shape, on a node its
  own constraints accept) and is ungated by one JSON patch (``mcad.loop.ungate``) that removes the gate and narrows its
  required node affinity to that node by name; the patch tests the pod's uid, gates and node selector terms, so it never
  applies to anything but the pod as mcad saw it. Patches run in the write pool,
  one key per pod, so a gang's pods are ungated in parallel; the outcome (``Ungated``) comes back to ``done``.
- Only a pod that a dispatched AppWrapper made is placed: its ``workload.codeflare.dev/appwrapper`` label names a
  dispatched AppWrapper of its namespace, and its owner chain reaches that AppWrapper's objects, uids checked
  (``mcad.loop.ownership``). Any other pod carrying the gate stays gated, and a ``PlacementRefused`` Event on the
  pod says why (once per pod); one whose chain cannot be told yet (an informer not synced) waits for its verdict.
  A gated pod whose AppWrapper exists but is not dispatched now (being dispatched, queued, requeued) waits and is
  looked at again when it is (``dispatched``); a gated pod of an AppWrapper that was deleted goes with it (its
  owners are the AppWrapper's, which the garbage collector deletes).
- Pods beyond the plan (a replacement, a scaled Deployment, an operator making more pods than its template says)
  wait for the next dispatch cycle, which runs ``place_extras`` before the queue: each is packed alone
  (``mcad.model.placement``) on the room free now (promised room is not free) on nodes no other AppWrapper's
  reservation holds and that have not refused its AppWrapper's pods, and pinned there (``Plans.pin_extra``),
  unless its AppWrapper's running pods, its plan and it would hold more than the AppWrapper's demand
  (``Accountant.beyond_demand``): room is never promised beyond what the AppWrapper asked for, whoever made the
  pod. Its slot goes with it, bound or gone, or when it is still not bound ``EXTRA_BIND_SECONDS`` after its pin
  (no scheduler takes it: a ``PlacementReplanned`` Event on the pod says so). One that fits nowhere or would exceed
  the demand stays gated;
  ``waiting(key)`` says why, and the AppWrapper's status lists it in ``pendingpodconditions`` ("waits for room:
  ...", "waits: ... more than its demand").
- A pinned pod that is not bound is watched: when its node is gone, not Ready, cordoned (and it does not tolerate
  that), labelled sick for it (a NoSchedule or NoExecute node-health verdict, ``mcad.model.nodehealth``: the
  node turned sick after the plan was made; plans and pins never choose such a node), or the scheduler reports it
  Unschedulable there (inter-pod anti-affinity, host ports: what mcad does not model), its slot is taken
  out of the plan, a ``PlacementReplanned`` Event on the AppWrapper says why, and the pod is deleted so its
  controller re-creates it, gated, to be placed afresh (the node that refused it is that AppWrapper's last resort
  from then on); that is for controllers that replace a deleted pod without counting a
  failure (``RECREATING_OWNERS``: ReplicaSets, so Deployments, StatefulSets, RayClusters). Any other pod's
  AppWrapper (a Job's would count the deleted pod against its backoffLimit) is requeued, its gang planned again.
  The scheduler's refusal re-plans only when another node can take the
  pod now: else the pin stays, the scheduler tries again as that node changes, the AppWrapper's
  ``pendingpodconditions`` carry its verdict, and each dispatch cycle looks again. A pod can be widened again
  only by re-creating it: Kubernetes lets a gated pod's node selection be narrowed, never widened, and an
  ungated pod's not at all. A wrapped bare Pod has no controller to re-create it, so its AppWrapper is requeued
  too. Bounded: after ``MAX_REPLANS`` re-plans of one dispatch, the AppWrapper is requeued.
- Ungate failures: a pod gone (404) frees its slot; a test that failed (the pod changed since it was read: 409 or
  422 on a ``test`` op) is tried again from the informer's newer view after a backoff; any other refusal is
  retried with backoff and, after ``UNGATE_ATTEMPTS``, the pod is ungated without a pin (never left gated for
  ever) with a ``PlacementReplanned`` Event saying so. Backoff delays are jittered (``mcad.model.retry.equal_jitter``).
- Hub mode: the same in each worker (``Where``: the pod is patched in its worker, pinned by the worker's node name;
  a wrapped bare Pod there has no owner, its AppWrapper's uid label says whose it is).
- ``--placement=advisory`` (or ``--fit=aggregate``, which makes no per-node plan): no gates are added, and a pod
  that carries mcad's gate all the same (dispatched before a downgrade, or a template that names it) is ungated
  without a pin, so nothing is ever left gated by a mode that does not pin.
- Memory: one entry per gated or pinned-unbound pod, dropped when it binds, ends or goes; the refused-pod and
  avoided-node records are bounded (``MAX_REFUSED_PODS``, ``MAX_AVOIDED_NODES`` per AppWrapper).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.api.views import NodeView, PodView, Unschedulable
from mcad.errors import ApiError
from mcad.k8s import events
from mcad.k8s.informer import Store
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.writes import Writes
from mcad.loop.active import Active
from mcad.loop.decisions import Decisions
from mcad.loop.ownership import Ownership
from mcad.loop.queued import Queued
from mcad.loop.tools import cycle_after
from mcad.loop.ungate import ungate_patch, without_pin
from mcad.model import placement
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.keys import DISPATCH, Key, PodCounts, PodEvent
from mcad.model.ownership import Verdict
from mcad.model.retry import equal_jitter

log = structlog.get_logger("mcad.loop.pinning")

PLACEMENT_MODES: Final = ("binding", "advisory")
# Re-plans of one dispatch (pins its nodes refused) before the whole AppWrapper is requeued instead.
MAX_REPLANS: Final = 5
# Controllers that re-create a deleted pod without counting it as a failure: a refused pin of theirs is re-planned by
# deleting the pod. A Job (and most batch operators) would count the deleted pod against its backoffLimit, so the
# AppWrapper of any other pod is requeued instead, its whole gang planned again.
RECREATING_OWNERS: Final = frozenset({"ReplicaSet", "StatefulSet", "RayCluster"})
# Failed ungate patches of one pod before it is released without a pin.
UNGATE_ATTEMPTS: Final = 6
UNGATE_RETRY_BASE_SECONDS: Final = 0.25
UNGATE_RETRY_CAP_SECONDS: Final = 8.0
# A pod pinned beyond its plan that is still not bound this long after (no scheduler takes it: a schedulerName
# nobody serves, a scheduler down) gives back the room promised to it. The kube-scheduler binds a placeable pod in
# well under a second; a refusal it reports is handled at once (re-planned), so this catches only the silent cases.
EXTRA_BIND_SECONDS: Final = 120.0
# Pods already told (by an Event) that mcad does not place them; nodes one AppWrapper's pods avoid.
MAX_REFUSED_PODS: Final = 10_000
MAX_AVOIDED_NODES: Final = 64
# Ungate patches go ahead of the namespace's other writes in the write pool (AppWrapper priorities are int32): a
# pin completes a gang already dispatched, whose room is held until its pods bind, where a dispatch starts another.
UNGATE_WRITE_PRIORITY: Final = 2**31


@dataclass(frozen=True, slots=True)
class Ungated:
    """Outcome of one ungate patch: ``node`` "" when the gate was removed without a pin; ``waited``: from the
    informer first receiving the pod gated to the patch's answer (None when it failed)."""

    uid: str
    appwrapper: str
    node: str
    error: ApiError | None = None
    waited: float | None = None


class PodWriter(Protocol):
    def patch_json(self, api_version: str, kind: str, namespace: str, name: str,
                   operations: list[dict[str, Any]]) -> Mapping[str, Any]: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None: ...


class PinMetrics(Protocol):
    def pin(self, outcome: str) -> None: ...

    def ungate_latency(self, seconds: float) -> None: ...


class Where(Protocol):
    """Which API server a pod is in and what it calls its nodes: this cluster's (``Here``), or in hub mode the
    worker's (``mcad.hub.sites.WorkerPods``), whose nodes the hub's ledger names ``worker/node``."""

    def writer(self, pod: PodView) -> PodWriter:
        """The client of the pod's API server (may raise ApiError: a worker not connected)."""
        ...

    def local_node(self, node: str) -> str:
        """A node as the pod's API server names it."""
        ...

    def nodes_for(self, key: str, snapshot: Snapshot) -> Sequence[NodeView]:
        """The nodes an AppWrapper's pods may be on (its worker's, in hub mode)."""
        ...


class Here:
    """One cluster: the controller's own API server, nodes by their names."""

    def __init__(self, writer: PodWriter) -> None:
        self._writer = writer

    def writer(self, pod: PodView) -> PodWriter:
        return self._writer

    def local_node(self, node: str) -> str:
        return node

    def nodes_for(self, key: str, snapshot: Snapshot) -> Sequence[NodeView]:
        return snapshot.nodes


class Pinning:
    def __init__(self, *, binding: bool, accountant: Accountant, pods: Store[PodView], where: Where,
                 writes: Writes, queue: WorkQueue[Key], queued: Queued, active: Active, decisions: Decisions,
                 appwrappers: Store[AppWrapperView], recorder: events.EventSink,
                 metrics: PinMetrics, ownership: Ownership, monotonic: Callable[[], float] = time.monotonic,
                 draw: Callable[[], float] = random.random,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.binding = binding
        self._accountant = accountant
        self._plans = accountant.plans  # the slots it pins pods to; the accountant keeps them in step with the pods
        self._pods = pods
        self._where = where
        self._writes = writes
        self._queue = queue
        self._queued = queued
        self._active = active
        self._decisions = decisions
        self._appwrappers = appwrappers
        self._ownership = ownership
        self._recorder = recorder
        self._metrics = metrics
        self._monotonic = monotonic
        self._draw = draw  # jitter of the ungate retries
        self._timer = timer  # the loop's clock (which tests step), for when a pod beyond its plan must have bound
        self._in_flight: dict[str, float] = {}  # uid -> when its ungate was submitted
        # Ungated by a patch that landed, while the informer may still show it gated: never ungated twice.
        self._ungated: set[str] = set()
        self._first_seen: dict[str, float] = {}  # uid -> when the informer first received it gated
        self._failures: dict[str, int] = {}  # uid -> failed ungate patches
        # AppWrapper not dispatched now -> its gated pods seen meanwhile (looked at again when it is dispatched).
        self._early: dict[str, set[str]] = {}
        self._extras: dict[str, str] = {}  # gated pod beyond its plan -> its AppWrapper
        self._why_waiting: dict[str, Unschedulable] = {}  # such a pod that fits nowhere now -> why
        self._replans: dict[str, int] = {}  # AppWrapper -> re-plans of its current dispatch
        self._avoid: dict[str, set[str]] = {}  # AppWrapper -> nodes that refused its pods
        self._refused: OrderedDict[str, None] = OrderedDict()  # pods told they are not placed
        self._stuck: dict[str, str] = {}  # pinned pods the scheduler refused, no other node free -> AppWrapper
        self._extra_pins: dict[str, float] = {}  # pods pinned beyond their plans, not bound yet -> when pinned

    # -- pods -----------------------------------------------------------------------------------------------------

    def observe(self, pod: PodView) -> None:
        """A pod changed (already in the accountant)."""
        uid = pod.uid
        if pod.pin is None or pod.deleting or pod.appwrapper is None:
            # Hub mode: a pod in a worker its AppWrapper is not placed in is no longer its (a leftover, deleted).
            self._settle(uid)
            return
        if pod.pin.gated:
            if uid not in self._ungated:
                self._gated(pod)
            return
        self._ungated.discard(uid)
        if self.binding:
            self._check_pin(pod)

    def forget(self, uid: str, appwrapper: str | None = None) -> None:
        """A pod is gone (the accountant freed its slot); ``appwrapper``: the one it was labelled for."""
        self._settle(uid)
        self._refused.pop(uid, None)
        waiting = self._early.get(appwrapper or "")
        if waiting is not None:
            waiting.discard(uid)
            if not waiting:
                del self._early[appwrapper or ""]

    def _settle(self, uid: str) -> None:
        """It no longer waits for mcad: bound, ended, being deleted or gone."""
        self._ungated.discard(uid)
        self._stuck.pop(uid, None)
        self._extra_pins.pop(uid, None)
        self._first_seen.pop(uid, None)
        self._failures.pop(uid, None)
        key = self._extras.pop(uid, None)
        if key is not None and self._why_waiting.pop(uid, None) is not None:
            self._queue.add(PodCounts(key))

    def _gated(self, pod: PodView) -> None:
        uid, key = pod.uid, pod.appwrapper
        assert pod.pin is not None and key is not None
        # When the informer first received it gated (its creationTimestamp has whole seconds only).
        seen = pod.pin.seen or self._monotonic()
        self._first_seen[uid] = min(self._first_seen.get(uid, seen), seen)
        if uid in self._in_flight or uid in self._extras:
            return
        if not self.binding:
            self._ungate(pod, "")
            return
        aw = self._queued.dispatched_now(key)
        log.debug("gated pod", pod=pod.name, appwrapper=key, dispatched=aw is not None)
        if aw is None:
            if self._appwrappers.get(key) is not None:
                # Being dispatched (its pods came before the outcome), queued, or requeued and draining: looked at
                # again when it is dispatched (a pod of an earlier dispatch is being deleted by then).
                self._early.setdefault(key, set()).add(uid)
            else:
                self._refuse(pod, f"no AppWrapper {key} exists, so mcad does not place it")
            return
        judged = self._ownership.judgement(pod)
        if judged.verdict is Verdict.UNKNOWN:
            return  # an informer in its owner chain has not synced: its AppWrapper is woken, and its pods looked at
        if not judged.owned:
            if judged.settled:
                self._refuse(pod, f"{judged.why}, so mcad does not place it")
            return  # else its owner may not have reached its informer yet: looked at again when it does
        node = self._plans.pin(key, uid, pod.requests, self._eligible(pod))
        if node is not None:
            self._ungate(pod, node)
            return
        # Beyond the plan, or no slot of it holds the pod on a node it may use (gone, cordoned, or its constraints):
        # placed by fit in the next cycle, before the queue. It accounts for one open slot of the plan, whose room
        # then goes back to the cluster instead of staying promised to a pod that will never come.
        self._plans.drop_open_slot(key, self._unusable(pod.requests))
        self._extras[uid] = key
        self._queue.add(DISPATCH)

    def _unusable(self, requests: ResourceVector) -> Callable[[str], bool]:
        """Whether a node can take no pod of ``requests`` now: gone, not Ready, cordoned, or sick for it."""
        def unusable(name: str) -> bool:
            node = self._accountant.ledger.node(name)
            return (node is None or not node.ready or node.unschedulable
                    or placement.keeps_off(node, requests) is not None)
        return unusable

    def _eligible(self, pod: PodView) -> Callable[[str], bool]:
        assert pod.pin is not None
        group = pod.pin.constraints
        avoid = self._avoid.get(pod.appwrapper or "", set())

        def eligible(name: str) -> bool:
            node = self._accountant.ledger.node(name)
            return node is not None and name not in avoid and placement.eligible(group, node)
        return eligible

    def _refuse(self, pod: PodView, why: str) -> None:
        if pod.uid in self._refused:
            return
        self._refused[pod.uid] = None
        while len(self._refused) > MAX_REFUSED_PODS:
            self._refused.popitem(last=False)
        log.warning("gated pod not placed", pod=f"{pod.namespace}/{pod.name}", reason=why)
        self._metrics.pin("refused")
        self._recorder.record(events.ObjectRef("v1", "Pod", pod.namespace, pod.name, pod.uid),
                              events.REASON_TYPES[events.PLACEMENT_REFUSED], events.PLACEMENT_REFUSED, why)

    def dispatched(self, aw: AppWrapperView) -> None:
        """Its objects exist: the gated pods that came while they were being created are placed now."""
        key = aw.key
        self._replans.pop(key, None)
        self._avoid.pop(key, None)
        for uid in self._early.pop(key, ()):
            self._queue.add(PodEvent(uid))

    def undispatched(self, key: str) -> None:
        """It holds no plan any more (finished, requeued, deleted): its waiting pods wait for nothing here."""
        self._early.pop(key, None)
        self._replans.pop(key, None)
        self._avoid.pop(key, None)
        for uid in [uid for uid, owner in self._extras.items() if owner == key]:
            del self._extras[uid]
            self._why_waiting.pop(uid, None)

    # -- pods beyond the plan -------------------------------------------------------------------------------------

    def place_extras(self, snapshot: Snapshot, reserved: Mapping[str, Collection[str]]) -> None:
        """At the start of a dispatch cycle: pack each pod beyond its plan alone on the snapshot's room, on nodes
        no other AppWrapper's reservation holds (``reserved``: AppWrapper -> nodes), and pin it there; the room is
        taken from the snapshot so the queue after it cannot promise it again. Pinned pods the scheduler refused
        are looked at again too: another node may have room by now."""
        for uid in list(self._stuck):
            pod = self._pods.get(uid)
            if pod is None or pod.pin is None or pod.node_name:
                self._stuck.pop(uid, None)
            else:
                self._check_pin(pod)
        self._release_unbound_extras()
        if not self._extras or snapshot.room is None:
            return
        for uid, key in list(self._extras.items()):
            pod = self._pods.get(uid)
            aw = self._queued.dispatched_now(key)
            if pod is None or pod.pin is None or not pod.pin.gated or pod.deleting or aw is None:
                log.debug("extra pod no longer waits", uid=uid, appwrapper=key, dispatched=aw is not None)
                del self._extras[uid]
                self._why_waiting.pop(uid, None)
                continue
            over = self._accountant.beyond_demand(key, pod.requests)
            if over:
                # Its bound pods, its plan and this pod would hold more than the AppWrapper asked for (a rolling
                # update's surge, or a pod someone else made): it waits until some of them are gone.
                self._wait(key, uid, f"waits: with it, AppWrapper {key.split('/', 1)[-1]}'s pods would hold more "
                                     f"than its demand ({over.format()} over)")
                continue
            held = {node for holder, nodes in reserved.items() if holder != key for node in nodes}
            avoid = self._avoid.get(key, set())
            nodes = [node for node in self._accountant.home_nodes(aw, self._where.nodes_for(key, snapshot))
                     if node.name not in held]
            owner = pod.pin.owner
            # Named by its controller in the message: "1 pod of Job train (cpu 1) fits on no node: ...".
            group = dataclasses.replace(pod.pin.constraints, label=f"{owner.kind} {owner.name}" if owner else "")
            # Nodes that refused its AppWrapper's pods come last: used only when no other node has room.
            packing = placement.pack((group,), [n for n in nodes if n.name not in avoid], snapshot.room)
            if not packing.fits and avoid:
                packing = placement.pack((group,), nodes, snapshot.room)
            if not packing.fits:
                why = f"waits for room: {packing.why}"
                if held:
                    why += f" (nodes reserved for other AppWrappers not counted: {len(held)})"
                self._wait(key, uid, why)
                continue
            node = packing.placement[0][0]
            del self._extras[uid]
            if self._why_waiting.pop(uid, None) is not None:
                self._queue.add(PodCounts(key))
            self._plans.pin_extra(key, uid, node, pod.requests)
            snapshot.take(pod.requests, packing.placement)
            self._metrics.pin("extra")
            self._extra_pins[uid] = self._timer()
            cycle_after(self._queue, self._timer(), EXTRA_BIND_SECONDS)  # its bind, or its room back then
            self._ungate(pod, node)

    def _release_unbound_extras(self) -> None:
        """Pods pinned beyond their plans ``EXTRA_BIND_SECONDS`` ago and still not bound: their room is no longer
        promised (the pod keeps its pin: Kubernetes lets an ungated pod's node selection be changed no more)."""
        now = self._timer()
        for uid, since in list(self._extra_pins.items()):
            if now - since < EXTRA_BIND_SECONDS:
                continue
            del self._extra_pins[uid]
            pod = self._pods.get(uid)
            if pod is None or pod.node_name or pod.terminal:
                continue
            node = self._plans.unpin(uid)
            if node is None:
                continue
            why = (f"pinned to node {node} beyond its AppWrapper's plan {now - since:.0f} s ago and not bound since "
                   f"(no scheduler took it): the room held for it is released")
            log.warning("pod beyond its plan never bound", pod=f"{pod.namespace}/{pod.name}", node=node)
            self._metrics.pin("unbound")
            self._recorder.record(events.ObjectRef("v1", "Pod", pod.namespace, pod.name, pod.uid),
                                  events.REASON_TYPES[events.PLACEMENT_REPLANNED], events.PLACEMENT_REPLANNED, why)

    def _wait(self, key: str, uid: str, why: str) -> None:
        """A pod beyond its plan stays gated for now: ``why`` goes to its AppWrapper's status when it changes."""
        before = self._why_waiting.get(uid)
        if before is None or before.message != why:
            self._why_waiting[uid] = Unschedulable(why, "")
            self._queue.add(PodCounts(key))

    def placing(self) -> bool:
        """Some pods beyond their plans wait to be placed, or pinned ones refused by the scheduler to be placed
        elsewhere: a dispatch cycle is due when room frees."""
        return bool(self._extras or self._stuck)

    def waiting(self, key: str) -> list[tuple[str, Unschedulable]]:
        """(pod name, why) of its gated pods beyond the plan that fit nowhere now."""
        out = []
        for uid, why in self._why_waiting.items():
            if self._extras.get(uid) == key:
                pod = self._pods.get(uid)
                if pod is not None:
                    out.append((pod.name, why))
        return out

    # -- pins that do not hold ------------------------------------------------------------------------------------

    def node_changed(self, name: str) -> None:
        """A node changed or went: the pods pinned there and not bound yet are looked at again."""
        if not self.binding:
            return
        for uid, (_key, node) in self._plans.pins().items():
            if node == name:
                self._queue.add(PodEvent(uid))

    def _check_pin(self, pod: PodView) -> None:
        assert pod.pin is not None
        node_name = self._plans.pinned_node(pod.uid)
        if node_name is None or pod.uid in self._in_flight:
            return  # not pinned by this process (or its patch is not back): the scheduler places it as before
        node = self._accountant.ledger.node(node_name)
        if node is None:
            why = f"node {node_name} is gone"
        elif not node.ready:
            why = f"node {node_name} is not Ready"
        elif (verdict := placement.keeps_off(node, pod.requests)) is not None:
            # It turned sick after the plan was made (a health checker labelled it): its pods go elsewhere.
            why = f"node {node_name} is {verdict.describe()}"
        elif node.unschedulable and not placement.eligible(pod.pin.constraints, node):
            why = f"node {node_name} was cordoned"
        elif pod.unschedulable is not None:
            # What mcad does not model (a node's pod count, inter-pod anti-affinity, host ports): re-planned only
            # if another node can take it now; else it keeps its pin (the scheduler tries again as that node
            # changes) and its AppWrapper's pendingpodconditions carry the scheduler's verdict. Looked at again at
            # every dispatch cycle meanwhile.
            if not self._fits_elsewhere(pod, node_name):
                self._stuck[pod.uid] = pod.appwrapper or ""
                return
            why = f"the scheduler refused it there: {pod.unschedulable.message}"
        else:
            return
        self._stuck.pop(pod.uid, None)
        self._replan(pod, node_name, why)

    def _fits_elsewhere(self, pod: PodView, refusing: str) -> bool:
        """Whether another node has room for the pod now, judged on its constraints less mcad's own pin."""
        assert pod.pin is not None and pod.appwrapper is not None
        snapshot = self._accountant.snapshot(by_nodes=True)
        aw = self._queued.dispatched_now(pod.appwrapper)
        nodes = self._where.nodes_for(pod.appwrapper, snapshot)
        others = [node for node in (self._accountant.home_nodes(aw, nodes) if aw is not None else nodes)
                  if node.name != refusing]
        unpinned = without_pin(pod.pin.constraints, self._where.local_node(refusing))
        return placement.pack((unpinned,), others, snapshot.room or {}).fits

    def _replan(self, pod: PodView, node: str, why: str) -> None:
        key = pod.appwrapper
        assert key is not None and pod.pin is not None
        aw = self._queued.dispatched_now(key)
        self._plans.unpin(pod.uid, drop_slot=True)
        if aw is None:
            return
        avoid = self._avoid.setdefault(key, set())
        if len(avoid) < MAX_AVOIDED_NODES:
            avoid.add(node)
        replans = self._replans[key] = self._replans.get(key, 0) + 1
        self._metrics.pin("replanned")
        owner = pod.pin.owner
        recreated = owner is not None and owner.kind in RECREATING_OWNERS
        message = f"pod {pod.name} was pinned to node {node}, but {why}"
        log.warning("pin refused", appwrapper=key, pod=pod.name, node=node, reason=why, replans=replans)
        if not recreated or replans > MAX_REPLANS:
            if owner is None or owner.kind == "AppWrapper":
                cause = "it is a wrapped Pod, which nothing else re-creates"
            elif not recreated:
                cause = f"{owner.kind} {owner.name} would count a deleted pod as a failed one"
            else:
                cause = f"its pins were refused {replans} times in this dispatch"
            self._active.requeue_keeping_count(aw, "PlacementRefused",
                                             f"{message}; the AppWrapper is requeued to be placed afresh ({cause})")
            return
        self._decisions.event(aw, events.PLACEMENT_REPLANNED,
                         f"{message}; the pod is deleted so {owner.kind} {owner.name} re-creates it, and mcad "
                         f"places the new pod elsewhere" if owner is not None else message)
        self._writes.submit(f"pod/{pod.uid}", lambda: self._delete(pod), tenant=pod.namespace)

    def _delete(self, pod: PodView) -> None:
        try:
            self._where.writer(pod).delete("v1", "Pod", pod.namespace, pod.name, uid=pod.uid)
        except ApiError as err:
            if err.status != 404:
                raise

    # -- the ungate write -----------------------------------------------------------------------------------------

    def _ungate(self, pod: PodView, node: str) -> None:
        assert pod.pin is not None and pod.appwrapper is not None
        ops = ungate_patch(pod.uid, pod.pin, self._where.local_node(node) if node else "")
        uid, key, namespace, name = pod.uid, pod.appwrapper, pod.namespace, pod.name
        # The job times the wait, not the loop when it takes the outcome: by then the pod may have been seen bound
        # and settled, its first-seen time dropped.
        seen = self._first_seen.get(uid, self._monotonic())

        def job() -> Ungated:
            try:
                self._where.writer(pod).patch_json("v1", "Pod", namespace, name, ops)
            except ApiError as err:
                return Ungated(uid, key, node, err)
            return Ungated(uid, key, node, waited=self._monotonic() - seen)
        self._in_flight[uid] = self._monotonic()
        self._writes.submit(f"pod/{uid}", job, tenant=namespace, priority=UNGATE_WRITE_PRIORITY)

    def done(self, outcome: Ungated) -> None:
        """An ungate patch came back."""
        uid = outcome.uid
        self._in_flight.pop(uid, None)
        if outcome.error is None:
            self._ungated.add(uid)
            self._first_seen.pop(uid, None)
            if outcome.waited is not None:
                self._metrics.ungate_latency(outcome.waited)
            self._failures.pop(uid, None)
            self._metrics.pin("pinned" if outcome.node else "released")
            return
        err = outcome.error
        self._plans.unpin(uid)
        if err.status == 404:
            self._settle(uid)
            return
        attempts = self._failures[uid] = self._failures.get(uid, 0) + 1
        pod = self._pods.get(uid)
        if pod is None or pod.pin is None or not pod.pin.gated:
            self._failures.pop(uid, None)
            return
        if attempts >= UNGATE_ATTEMPTS:
            # Never leave it gated for ever: the scheduler places it as it would without mcad, and the AppWrapper
            # is told its pod is not where its plan said.
            log.error("ungate patch keeps failing; releasing the pod without a pin", pod=f"{pod.namespace}/{pod.name}",
                      error=err.message, attempts=attempts)
            aw = self._queued.dispatched_now(outcome.appwrapper)
            if aw is not None:
                self._decisions.event(aw, events.PLACEMENT_REPLANNED,
                                 f"pod {pod.name} could not be pinned ({err.reason or err.status}: {err.message}); "
                                 f"it is released for the scheduler to place")
            self._failures.pop(uid, None)
            self._ungate(pod, "") if outcome.node else None
            return
        # Its own count rather than mcad.model.retry.Backoff: every kind of failure counts here (a pod must not stay
        # gated through an outage either), where Backoff never gives up on UNAVAILABLE. Jittered all the same: a
        # gang's pods fail together and must not retry together.
        delay = equal_jitter(min(UNGATE_RETRY_BASE_SECONDS * 2 ** (attempts - 1), UNGATE_RETRY_CAP_SECONDS),
                             self._draw)
        log.info("ungate patch failed; trying again", pod=f"{pod.namespace}/{pod.name}", status=err.status,
                 error=err.message, delay_s=delay)
        self._queue.add_after(PodEvent(uid), delay)

    # -- for metrics and /debug -----------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Gated pods by what they wait for: ungating (patch under way), room (beyond the plan, fit nowhere now),
        placing (beyond the plan, not tried yet), dispatch (their AppWrapper is not dispatched now: its objects are
        being created, or it is queued or draining)."""
        room = sum(1 for uid in self._extras if uid in self._why_waiting)
        return {"ungating": len(self._in_flight), "room": room, "placing": len(self._extras) - room,
                "dispatch": sum(len(uids) for uids in self._early.values())}
