"""Slim, immutable views of Nodes and Pods: what the informers store instead of raw dicts (their ``transform``).

Contract:
- ``node_view(raw)`` keeps a Node's name, allocatable resources (canonical ints), resourceVersion and one
  accounting verdict, ``schedulable``: the Ready condition is True, ``spec.unschedulable`` is not set, and no
  taint has effect NoSchedule or NoExecute (the aggregate ledger does not model tolerations: a tainted node's
  capacity is not counted, which errs on the side of not dispatching what may not be placeable).
  For per-node placement (``mcad.model.placement``) it also keeps the parts of that verdict and what a pod's
  constraints are matched against: ``ready`` (the Ready condition is True), ``unschedulable``
  (``spec.unschedulable`` is true), ``taints`` (only those with effect NoSchedule or NoExecute, in the node's
  order; PreferNoSchedule never keeps a pod off a node) and ``labels`` (a read-only mapping; labels whose key
  or value is not a string are dropped). Always ``schedulable == ready and not unschedulable and not taints``
  for a view ``node_view`` made. The defaults of these fields describe a Ready, uncordoned, untainted node
  without labels, so views constructed by hand with only the first four fields keep meaning what they did.
  ``health`` (what the node-health rules say of it: verdicts, ``mcad.api.nodemarks``, made by
  ``mcad.model.nodehealth.NodeHealth.marks``) is empty here: the rules are the controller's, so the accountant
  marks the views it keeps (``Accountant.observe_node``).
- ``pod_view(raw)`` keeps what the ledger and status need: identity, node, phase, effective requests
  (``pod_requests`` of the spec), the owning AppWrapper as ``"namespace/name"`` (from the
  ``workload.codeflare.dev/appwrapper`` label; pods belong to an AppWrapper in their own namespace), ``terminal``
  (phase Succeeded or Failed), ``deleting`` (deletionTimestamp set; such a pod still holds its resources) and
  ``grace_ends`` (that deletionTimestamp: when the kubelet would have killed it).
  ``unschedulable`` is the scheduler's verdict on a Pending pod it could not place (its ``PodScheduled``
  condition is False with reason ``Unschedulable``): the condition's message, cut to ``MAX_SCHEDULER_MESSAGE``
  characters, and its lastTransitionTime; None for every other pod, so scheduled pods carry nothing more.
  Pods a gang-scheduling plugin holds back while their pod group gathers are not unschedulable (upstream MCAD
  skips the coscheduling plugin's messages too): they wait for their siblings, not for room, and neither are
  pods held by a scheduling gate (the scheduler says ``SchedulingGated``, not ``Unschedulable``).
  ``pin`` (``PinFacts``) is kept only for a pod of an AppWrapper that is not bound and has not ended: what
  ``mcad.loop.pinning`` needs to place it (its scheduling gates, its node constraints, its controller, the node mcad
  pinned it to); None for every other pod, so bound pods cost nothing more.

Both transforms never raise on what the API server sends: missing or ill-typed fields read as absent, and a
quantity that does not parse is skipped (the API server validated it; this only guards the informer thread).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from mcad.api.appwrapper import APPWRAPPER_LABEL, APPWRAPPER_UID_LABEL
from mcad.api.nodemarks import Verdict
from mcad.api.podgroups import PodGroup, pod_constraints
from mcad.api.raw import as_list, as_mapping, as_str
from mcad.api.resources import ResourceVector, canonical_entries
from mcad.api.workloads import pod_requests

_TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
UNSCHEDULABLE: Final = "Unschedulable"  # the PodScheduled reason the scheduler gives when no node fits
# A scheduler message sums up every node's reason in one line, a few hundred characters even on large clusters;
# the cap bounds what one pod can make the controller keep and write.
MAX_SCHEDULER_MESSAGE: Final = 1024
# What the coscheduling plugin (scheduler-plugins) says of a pod it holds until its pod group gathers.
_GANG_WAIT_PHRASES: Final = ("optimistic rejection in postfilter", "cannot find enough sibling")
_BLOCKING_TAINT_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
# The scheduling gate mcad puts on every pod template it dispatches with --placement=binding; the pod waits
# (Pending, PodScheduled=False reason SchedulingGated) until mcad removes it and pins the pod to its node.
PLACEMENT_GATE: Final = "mcad.codeflare.dev/placement"
# How mcad pins a pod to a node: a required node affinity term on the node's name (matchFields, as the DaemonSet
# controller does: the kubernetes.io/hostname label need not equal the node's name).
NODE_NAME_FIELD: Final = "metadata.name"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        """As kubectl writes it: ``key=value:effect``, or ``key:effect`` without a value."""
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


def _no_labels() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    allocatable: ResourceVector
    schedulable: bool
    resource_version: str
    # node_view stores a read-only MappingProxyType (so a NodeView is not hashable): views are shared between
    # the informer cache and the dispatcher thread.
    labels: Mapping[str, str] = field(default_factory=_no_labels)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    cluster: str = ""  # hub mode: the worker it belongs to ("" in single-cluster mode)
    # What the node-health rules say of it (empty: healthy for every pod); set by the accountant, which has them.
    health: tuple[Verdict, ...] = ()


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """Why the scheduler could not place a Pending pod: its PodScheduled=False condition."""
    message: str
    since: str  # the condition's lastTransitionTime as the API server wrote it ("" if absent)


@dataclass(frozen=True, slots=True)
class Owner:
    """An object's controller ownerReference."""

    kind: str
    name: str
    uid: str
    api_version: str = ""


@dataclass(frozen=True, slots=True)
class PinFacts:
    """What placing an unbound pod of an AppWrapper needs (``mcad.loop.pinning``), read from its spec.

    ``constraints`` is the pod as a group of one (its requests, nodeSelector, tolerations, required node affinity),
    for ``mcad.model.placement``'s eligibility rules. ``node_terms`` is its required node affinity's nodeSelectorTerms
    as
    the API server has them (``None`` when there is no such field; which of ``affinity``, ``nodeAffinity`` and
    ``requiredDuringSchedulingIgnoredDuringExecution`` exist is ``affinity_depth``: 0 to 3), so the ungate patch
    can narrow them and test that nobody changed them meanwhile. ``pinned_to`` is the node every term pins the pod
    to by name (``metadata.name In [node]``), "" when it is not pinned."""

    gates: tuple[str, ...]
    constraints: PodGroup
    node_terms: tuple[Any, ...] | None
    affinity_depth: int
    owner: Owner | None
    pinned_to: str
    # In a worker cluster (hub mode) wrapped objects carry their AppWrapper's uid in a label, not an ownerReference.
    appwrapper_uid: str = ""
    # time.monotonic() when the informer made this view: how long a gated pod waited for its pin is measured from
    # the first one (the API server's creationTimestamp has whole seconds only).
    seen: float = field(default=0.0, compare=False)

    @property
    def gated(self) -> bool:
        """mcad's gate holds it."""
        return PLACEMENT_GATE in self.gates


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    namespace: str
    name: str
    node_name: str  # "" while unbound
    phase: str  # "" when the API server has not set one yet
    requests: ResourceVector
    appwrapper: str | None  # "namespace/name" of the owning AppWrapper, None for other pods
    terminal: bool
    resource_version: str
    deleting: bool
    cluster: str = ""  # hub mode: the worker it runs in ("" in single-cluster mode)
    unschedulable: Unschedulable | None = None  # only for a Pending pod the scheduler could not place
    # When its grace period ends (its deletionTimestamp, seconds since the epoch); 0 when it is not being deleted.
    grace_ends: float = 0.0
    pin: PinFacts | None = None  # only for an unbound, unfinished pod of an AppWrapper
    failure: PodFailure | None = None  # only for a Failed pod: what ended it
    # Only for a pod carrying the AppWrapper label: its controller ownerReference, the first link of the owner chain
    # that says whether its AppWrapper's objects made it (``mcad.model.ownership``); in a worker cluster (hub mode)
    # a wrapped bare Pod has none, and its AppWrapper's uid label says whose it is.
    controller: Owner | None = None
    appwrapper_uid: str = ""

    @property
    def gated(self) -> bool:
        """mcad's placement gate holds it (it waits for mcad to pin it to a node)."""
        return self.pin is not None and self.pin.gated


@dataclass(frozen=True, slots=True)
class PodFailure:
    """Why a pod is Failed: the first container (init containers first) that ended with a non-zero exit code, or
    (``exit_code`` None) the pod's own reason (Evicted, NodeLost, DeadlineExceeded); and the kind of its
    controller (a Job's failed pods are its controller's business until the Job itself fails)."""

    container: str
    exit_code: int | None
    reason: str
    controller_kind: str

    def describe(self) -> str:
        if self.exit_code is not None:
            why = f" ({self.reason})" if self.reason and self.reason != "Error" else ""
            return f"exited {self.exit_code}{why}" + (f" in container {self.container}" if self.container else "")
        return f"failed ({self.reason or 'no reason given'})"


# Container names and reasons are short in practice; a status written by someone else is cut to this.
_MAX_NAME = 128


def node_view(raw: Mapping[str, Any]) -> NodeView:
    meta = as_mapping(raw.get("metadata"))
    spec = as_mapping(raw.get("spec"))
    status = as_mapping(raw.get("status"))
    ready = any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in as_list(status.get("conditions"))
    )
    taints = tuple(
        Taint(as_str(t.get("key")), as_str(t.get("value")), as_str(t.get("effect")))
        for t in as_list(spec.get("taints"))
        if isinstance(t, Mapping) and as_str(t.get("effect")) in _BLOCKING_TAINT_EFFECTS
    )
    unschedulable = spec.get("unschedulable") is True
    labels = {k: v for k, v in as_mapping(meta.get("labels")).items() if isinstance(k, str) and isinstance(v, str)}
    return NodeView(
        name=as_str(meta.get("name")),
        allocatable=_lenient_vector(as_mapping(status.get("allocatable"))),
        schedulable=ready and not unschedulable and not taints,
        resource_version=as_str(meta.get("resourceVersion")),
        labels=MappingProxyType(labels),
        taints=taints,
        unschedulable=unschedulable,
        ready=ready,
    )


def pod_view(raw: Mapping[str, Any]) -> PodView:
    meta = as_mapping(raw.get("metadata"))
    spec = as_mapping(raw.get("spec"))
    status = as_mapping(raw.get("status"))
    namespace = as_str(meta.get("namespace"))
    owner = as_mapping(meta.get("labels")).get(APPWRAPPER_LABEL)
    phase = as_str(status.get("phase"))
    appwrapper = f"{namespace}/{owner}" if isinstance(owner, str) and owner else None
    node_name = as_str(spec.get("nodeName"))
    terminal = phase in _TERMINAL_PHASES
    requests = pod_requests(spec, strict=False)
    return PodView(
        uid=as_str(meta.get("uid")),
        namespace=namespace,
        name=as_str(meta.get("name")),
        node_name=node_name,
        phase=phase,
        requests=requests,
        appwrapper=appwrapper,
        terminal=terminal,
        resource_version=as_str(meta.get("resourceVersion")),
        deleting=meta.get("deletionTimestamp") is not None,
        unschedulable=_unschedulable(status) if phase == "Pending" else None,
        grace_ends=_epoch(meta.get("deletionTimestamp")),
        pin=_pin_facts(meta, spec, requests) if appwrapper and not node_name and not terminal else None,
        failure=_failure(meta, status) if appwrapper and phase == "Failed" else None,
        controller=controller_of(meta) if appwrapper else None,
        appwrapper_uid=as_str(as_mapping(meta.get("labels")).get(APPWRAPPER_UID_LABEL)) if appwrapper else "",
    )


def controller_of(meta: Mapping[str, Any]) -> Owner | None:
    """The controller ownerReference of an object's metadata (the first one marked ``controller: true``)."""
    for ref in as_list(meta.get("ownerReferences")):
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return Owner(as_str(ref.get("kind")), as_str(ref.get("name")), as_str(ref.get("uid")),
                         as_str(ref.get("apiVersion")))
    return None


def _failure(meta: Mapping[str, Any], status: Mapping[str, Any]) -> PodFailure:
    controller = ""
    for ref in as_list(meta.get("ownerReferences")):
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            controller = as_str(ref.get("kind"))
            break
    for field_ in ("initContainerStatuses", "containerStatuses"):
        for container in as_list(status.get(field_)):
            if not isinstance(container, Mapping):
                continue
            terminated = as_mapping(as_mapping(container.get("state")).get("terminated"))
            code = terminated.get("exitCode")
            if isinstance(code, int) and not isinstance(code, bool) and code != 0:
                return PodFailure(as_str(container.get("name"))[:_MAX_NAME], code,
                                  as_str(terminated.get("reason"))[:_MAX_NAME], controller)
    return PodFailure("", None, as_str(status.get("reason"))[:_MAX_NAME], controller)


def _pin_facts(meta: Mapping[str, Any], spec: Mapping[str, Any], requests: ResourceVector) -> PinFacts:
    gates = tuple(as_str(g.get("name")) for g in as_list(spec.get("schedulingGates")) if isinstance(g, Mapping))
    affinity = spec.get("affinity")
    depth, terms = 0, None
    if isinstance(affinity, Mapping):
        depth = 1
        node_affinity = affinity.get("nodeAffinity")
        if isinstance(node_affinity, Mapping):
            depth = 2
            required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
            if isinstance(required, Mapping):
                depth = 3
                raw_terms = required.get("nodeSelectorTerms")
                terms = tuple(raw_terms) if isinstance(raw_terms, list) else None
    return PinFacts(gates=gates, constraints=PodGroup(1, requests, *pod_constraints(spec)), node_terms=terms,
                    affinity_depth=depth, owner=controller_of(meta), pinned_to=_pinned_node(terms),
                    appwrapper_uid=as_str(as_mapping(meta.get("labels")).get(APPWRAPPER_UID_LABEL)),
                    seen=time.monotonic())


def _pinned_node(terms: tuple[Any, ...] | None) -> str:
    """The node every term requires by name (``metadata.name In [node]``), "" if they do not all pin one node."""
    if not terms:
        return ""
    pinned = ""
    for term in terms:
        fields = as_list(term.get("matchFields")) if isinstance(term, Mapping) else []
        names = {as_list(f.get("values"))[0] for f in fields
                 if isinstance(f, Mapping) and f.get("key") == NODE_NAME_FIELD and f.get("operator") == "In"
                 and len(as_list(f.get("values"))) == 1 and isinstance(as_list(f.get("values"))[0], str)}
        if len(names) != 1 or (pinned and names != {pinned}):
            return ""
        pinned = names.pop()
    return pinned


def _epoch(timestamp: Any) -> float:
    """An RFC 3339 time as seconds since the epoch; 0 when absent or unreadable."""
    if not isinstance(timestamp, str) or not timestamp:
        return 0.0
    try:
        return datetime.fromisoformat(timestamp).timestamp()
    except ValueError:
        return 0.0


def _unschedulable(status: Mapping[str, Any]) -> Unschedulable | None:
    for condition in as_list(status.get("conditions")):
        if (isinstance(condition, Mapping) and condition.get("type") == "PodScheduled"
                and condition.get("status") == "False" and condition.get("reason") == UNSCHEDULABLE):
            message = as_str(condition.get("message"))
            if _waits_for_its_gang(message):
                return None
            if len(message) > MAX_SCHEDULER_MESSAGE:
                message = message[:MAX_SCHEDULER_MESSAGE - 1] + "…"
            # The pods of one gang usually share one message: keep a single copy of it.
            return Unschedulable(sys.intern(message), as_str(condition.get("lastTransitionTime")))
    return None


def _waits_for_its_gang(message: str) -> bool:
    lowered = message.lower()
    # Older coscheduling releases: "pod with pgName: ... last failed in ... deny".
    return any(p in lowered for p in _GANG_WAIT_PHRASES) or ("pgname" in lowered and "deny" in lowered)


def _lenient_vector(quantities: Mapping[Any, Any]) -> ResourceVector:
    return ResourceVector({name: amount for name, _, amount in canonical_entries(quantities) if amount > 0})
