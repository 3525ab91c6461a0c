"""The AppWrapper as the dispatcher sees it: constants of the API, and a view parsed once per informer event.

Contract: ``appwrapper_view(raw, limits)`` never raises, whatever ``raw`` holds. An AppWrapper the
controller must refuse gets ``demand_error`` set (despite its name, every reason to refuse: a bound of
``mcad.api.validation`` broken, judged with ``limits``, or a demand that cannot be computed, such as a bad
quantity or an impossible replica count), so the dispatcher can fail that one AppWrapper with a clear message
and keep serving the others. Its ``scheduling`` values are clamped into the ranges validation allows (timers
then stay finite and never fire in a loop), even for an AppWrapper that was dispatched before its values were
refused. ``reuse_spec(stored, raw, limits)`` is the informer's ``reuse``: an event that keeps the uid and the
generation (a status write: most events) takes what the spec implies from the stored view instead of judging
the spec again (1 MiB: ~6 ms), at no memory cost.

A view keeps what decisions need and nothing of the templates (1,000 queued AppWrappers of 1 MiB must not
cost 1 GiB): the demand, the pods it will create (``gang``), each item's object and completion rule (``items``:
``ItemRef``), the scheduling values, and the status as a ``StatusView``. Whoever needs the templates, the
dispatch, reads the AppWrapper from the API server. Views are immutable.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from mcad.api import faulttolerance, minruntime, topologyasks
from mcad.api.clusterscheduling import ANYWHERE, ClusterScheduling, cluster_scheduling
from mcad.api.podgroups import PodGroup, gang
from mcad.api.raw import as_mapping
from mcad.api.resources import ResourceVector, shared
from mcad.api.statusview import StatusView, status_view
from mcad.api.validation import (
    DEFAULT_LIMITS,
    INT32_MAX,
    INT32_MIN,
    MAX_DISPATCH_LIMIT_SECONDS,
    MAX_REQUEUE_SECONDS,
    Limits,
    refusal,
)
from mcad.api.workloads import WorkloadError, appwrapper_demand

GROUP = "workload.codeflare.dev"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
# Pre-1.34 MCAD served the same AppWrapper under this group; mcad can serve it too (``--legacy-api``).
LEGACY_GROUP = "mcad.ibm.com"
LEGACY_API_VERSION = f"{LEGACY_GROUP}/{VERSION}"
# Not "appwrappers": kubectl resolves a resource name served by two groups to the alphabetically first group, so
# `kubectl get appwrappers` would list only legacy ones. YAML names the kind, which stays AppWrapper.
LEGACY_PLURAL = "mcadappwrappers"
KIND = "AppWrapper"
PLURAL = "appwrappers"
# Stamped on every wrapped object and every pod template in it. The second label is upstream MCAD's, kept so
# that tools and scripts written for MCAD find the pods.
APPWRAPPER_LABEL = "workload.codeflare.dev/appwrapper"
LEGACY_APPWRAPPER_LABEL = "appwrapper.mcad.ibm.com"
FIELD_MANAGER = "mcad-controller"


def field_manager(uid: str) -> str:
    """The field manager of the objects one AppWrapper wraps (by its uid): managedFields then say which AppWrapper
    set what, and no two AppWrappers ever share ownership of a field. Within the API server's 128 characters."""
    return f"{FIELD_MANAGER}-{uid}"[:128]


# Hub mode: on every object created in a worker, the uid of its AppWrapper in the hub. ownerReferences cannot
# cross clusters; this label is how a deletion makes sure it removes only that AppWrapper's objects.
APPWRAPPER_UID_LABEL = "workload.codeflare.dev/appwrapper-uid"
# Hub mode: held on an AppWrapper while it may have objects in a worker, so deleting it cannot leak them.
WORKER_CLEANUP_FINALIZER = "workload.codeflare.dev/worker-cleanup"


class State(StrEnum):
    """``status.state`` values, as upstream MCAD writes them."""

    NEW = ""
    PENDING = "Pending"
    RUNNING = "Running"
    RUNNING_HOLD_COMPLETION = "RunningHoldCompletion"
    COMPLETED = "Completed"
    FAILED = "Failed"


ACTIVE_STATES = frozenset({State.RUNNING, State.RUNNING_HOLD_COMPLETION})
FINAL_STATES = frozenset({State.COMPLETED, State.FAILED})


# requeuing.timeInSeconds when the stanza is absent: the CRD defaults it to 300 only inside a present stanza, and
# 0 (requeue at once) would evict every gang with minAvailable before its pods could start.
DEFAULT_REQUEUE_SECONDS = 300


@dataclass(frozen=True, slots=True)
class SchedulingSpec:
    """``spec.schedulingSpec``: what the lifecycle timers need (0 = not set)."""

    min_available: int = 0
    requeue_seconds: int = DEFAULT_REQUEUE_SECONDS
    requeue_max_seconds: int = 0
    growth: str = "exponential"
    max_requeuings: int = 0
    dispatch_limit_seconds: int = 0


@dataclass(frozen=True, slots=True)
class ItemRef:
    """One GenericItem as the controller keeps it between dispatches: the object it makes (to watch and delete
    it) and the condition types that complete it (``completionstatus``, lower-cased). Fields read "" when the
    template lacks them; such an AppWrapper is refused at its dispatch, which reads the template itself."""

    api_version: str
    kind: str
    name: str
    completion: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Spec:
    """What an AppWrapper's spec implies, parsed once per spec (see ``Judgements``) and shared by its views."""

    demand: ResourceVector
    # Why the controller refuses it (see the module docstring), or None.
    demand_error: str | None
    items: tuple[ItemRef, ...]
    gang: tuple[PodGroup, ...]
    priority: int = 0
    # spec.priorityClassName ("" when none): resolved, with the namespace's ceiling, by mcad.k8s.tenantstore.
    priority_class: str = ""
    scheduling: SchedulingSpec = SchedulingSpec()
    # Hub mode: the worker clusters it may go to.
    clusters: ClusterScheduling = ANYWHERE


_DEFAULT_SCHEDULING = SchedulingSpec()


@dataclass(frozen=True, slots=True)
class AppWrapperView:
    key: str
    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int
    created: str
    spec: Spec
    status: StatusView
    deleting: bool
    # Its group/version: status writes and owner references go back to the API it came from.
    api_version: str = API_VERSION
    # Its labels (string values only): a label whose key names a quota tree says where it is charged.
    labels: Mapping[str, str] = field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    # Its annotations as people are shown them (the dashboard's detail), bounded by ``shown_annotations``.
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Its fault tolerance annotations (``mcad.api.faulttolerance.kept``): what its policy is made of.
    fault_annotations: Mapping[str, str] = field(default_factory=dict)
    # The node label key all its pods must share one value of, and the one they should share as few values of as
    # can be ("" when none): ``mcad.api.topologyasks``, read from its annotations whole, never from the bounded
    # ``annotations`` shown to people.
    topology_required: str = ""
    topology_preferred: str = ""
    # Its minimum run time annotation as written (``mcad.api.minruntime.kept``; "" when unset): how long after its
    # dispatch priority preemption leaves it alone, read by ``minruntime.MinRuntime.seconds``.
    min_runtime: str = ""
    # Why it may not be dispatched whatever room there is ("" when nothing holds it): set by mcad.k8s.tenantstore,
    # e.g. a spec.priorityClassName naming no PriorityClass. It waits in the queue, saying so, and preempts nobody.
    held: str = ""

    @property
    def demand(self) -> ResourceVector:
        return self.spec.demand

    @property
    def demand_error(self) -> str | None:
        return self.spec.demand_error

    @property
    def items(self) -> tuple[ItemRef, ...]:
        return self.spec.items

    @property
    def gang(self) -> tuple[PodGroup, ...]:
        """The pods it will create (``mcad.api.podgroups.gang``)."""
        return self.spec.gang

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def scheduling(self) -> SchedulingSpec:
        return self.spec.scheduling

    @property
    def clusters(self) -> ClusterScheduling:
        return self.spec.clusters

    @property
    def target_cluster(self) -> str:
        """Hub mode: the worker its objects were created in ("" when none, or not in hub mode)."""
        return self.status.target_cluster

    def order(self) -> tuple[int, str, str]:
        """Dispatch order: higher priority first, then older, then by name (namespace/name) for a total order."""
        return (-self.priority, self.created, self.key)


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _clamped(value: Any, default: int, low: int, high: int) -> int:
    return min(max(_int(value, default), low), high)


def _scheduling(spec: Mapping[str, Any]) -> SchedulingSpec:
    scheduling = spec.get("schedulingSpec")
    if not isinstance(scheduling, Mapping):
        return _DEFAULT_SCHEDULING
    requeuing = scheduling.get("requeuing")
    requeuing = requeuing if isinstance(requeuing, Mapping) else {}
    deadline = scheduling.get("dispatchDuration")
    deadline = deadline if isinstance(deadline, Mapping) else {}
    growth = requeuing.get("growthType")
    # Values out of range are refused (validation); clamped here all the same, for an AppWrapper dispatched before.
    return SchedulingSpec(
        min_available=_clamped(scheduling.get("minAvailable"), 0, 0, INT32_MAX),
        requeue_seconds=_clamped(requeuing.get("timeInSeconds"), DEFAULT_REQUEUE_SECONDS, 1, MAX_REQUEUE_SECONDS),
        requeue_max_seconds=_clamped(requeuing.get("maxTimeInSeconds"), 0, 0, MAX_REQUEUE_SECONDS),
        growth=growth if isinstance(growth, str) and growth else "exponential",
        max_requeuings=_clamped(requeuing.get("maxNumRequeuings"), 0, 0, INT32_MAX),
        dispatch_limit_seconds=_clamped(deadline.get("limit"), 0, 0, MAX_DISPATCH_LIMIT_SECONDS),
    )


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _item_ref(item: Mapping[str, Any]) -> ItemRef:
    template = as_mapping(item.get("generictemplate"))
    raw_types = item.get("completionstatus")
    tokens = raw_types.split(",") if isinstance(raw_types, str) else []
    # API versions, kinds and completion rules repeat across thousands of AppWrappers: one copy of each.
    return ItemRef(sys.intern(_str(template.get("apiVersion"))), sys.intern(_str(template.get("kind"))),
                   _str(as_mapping(template.get("metadata")).get("name")),
                   _completion(frozenset(t.strip().lower() for t in tokens if t.strip())))


@functools.lru_cache(maxsize=256)
def _completion(types: frozenset[str]) -> frozenset[str]:
    return types


def _judge(raw: Mapping[str, Any], limits: Limits) -> Spec:
    spec = as_mapping(raw.get("spec"))
    items_raw = as_mapping(spec.get("resources")).get("GenericItems")
    items = tuple(i for i in items_raw if isinstance(i, Mapping)) if isinstance(items_raw, list) else ()
    reasons: list[str] = []
    demand = ResourceVector()
    if (refused := refusal(raw, limits)) is not None:
        reasons.append(refused)
    if not items:
        reasons.append("spec.resources.GenericItems is empty: there is nothing to dispatch")
    else:
        try:
            demand = appwrapper_demand(spec)
        except WorkloadError as err:
            reasons.append(str(err))
    return Spec(
        demand=shared(demand),
        demand_error="; ".join(reasons) or None,
        items=tuple(_item_ref(item) for item in items),
        gang=tuple(dataclasses.replace(group, requests=shared(group.requests)) for group in gang(items)),
        priority=_clamped(spec.get("priority"), 0, INT32_MIN, INT32_MAX),
        priority_class=sys.intern(_str(spec.get("priorityClassName"))),
        scheduling=_scheduling(spec),
        clusters=cluster_scheduling(spec["schedulingSpec"])
        if isinstance(spec.get("schedulingSpec"), Mapping) else ANYWHERE,
    )


_NO_LABELS: Mapping[str, str] = MappingProxyType({})
# What of an AppWrapper's annotations is kept for display: the informer keeps every view in memory, and an
# annotation can be as large as the object (kubectl's last-applied-configuration is the whole spec, left out).
SHOWN_ANNOTATIONS = 16
SHOWN_ANNOTATION_CHARS = 256
_NOT_SHOWN = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})


def shown_annotations(annotations: Mapping[str, Any]) -> Mapping[str, str]:
    """At most ``SHOWN_ANNOTATIONS`` string annotations (by key), values cut to ``SHOWN_ANNOTATION_CHARS``."""
    kept = {}
    for key in sorted(str(k) for k in annotations)[: SHOWN_ANNOTATIONS + len(_NOT_SHOWN)]:
        value = annotations.get(key)
        if key in _NOT_SHOWN or not isinstance(value, str):
            continue
        kept[key] = value if len(value) <= SHOWN_ANNOTATION_CHARS else value[: SHOWN_ANNOTATION_CHARS - 1] + "\u2026"
        if len(kept) == SHOWN_ANNOTATIONS:
            break
    return MappingProxyType(kept) if kept else _NO_LABELS


def appwrapper_view(raw: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS, *,
                    spec: Spec | None = None) -> AppWrapperView:
    """The view of ``raw``; ``spec``, when given, is what its spec implies, judged already (see ``reuse_spec``)."""
    meta = as_mapping(raw.get("metadata"))
    if spec is None:
        spec = _judge(raw, limits)
    namespace = sys.intern(str(meta.get("namespace") or ""))  # a few namespaces, each shared by many AppWrappers
    name = str(meta.get("name") or "")
    labels = {str(k): v for k, v in as_mapping(meta.get("labels")).items() if isinstance(v, str)}
    finalizers = meta.get("finalizers")
    annotations = as_mapping(meta.get("annotations"))
    return AppWrapperView(
        key=sys.intern(f"{namespace}/{name}"),  # the same string object as the informer's key for it
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        generation=_int(meta.get("generation")),
        # Second-grained: AppWrappers created together share one copy.
        created=sys.intern(str(meta.get("creationTimestamp") or "")),
        spec=spec,
        status=status_view(as_mapping(raw.get("status"))),
        deleting=bool(meta.get("deletionTimestamp")),
        api_version=sys.intern(str(raw.get("apiVersion") or API_VERSION)),
        labels=MappingProxyType(labels) if labels else _NO_LABELS,
        finalizers=tuple(f for f in finalizers if isinstance(f, str)) if isinstance(finalizers, list) else (),
        annotations=shown_annotations(annotations),
        fault_annotations=faulttolerance.kept(annotations),
        topology_required=topologyasks.level(annotations.get(topologyasks.TOPOLOGY_REQUIRED)),
        topology_preferred=topologyasks.level(annotations.get(topologyasks.TOPOLOGY_PREFERRED)),
        min_runtime=minruntime.kept(annotations),
    )


def reuse_spec(stored: AppWrapperView, raw: Mapping[str, Any],
               limits: Limits = DEFAULT_LIMITS) -> AppWrapperView | None:
    """The view of ``raw`` built with the ``Spec`` of ``stored`` when ``raw`` is the same spec (same uid and
    generation: the API server bumps the generation on every spec change), else None (judge it anew)."""
    meta = as_mapping(raw.get("metadata"))
    generation = meta.get("generation")
    if not (isinstance(generation, int) and generation > 0 and generation == stored.generation
            and meta.get("uid") == stored.uid and stored.uid):
        return None
    return appwrapper_view(raw, limits, spec=stored.spec)
