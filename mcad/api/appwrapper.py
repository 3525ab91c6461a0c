"""The AppWrapper as the dispatcher sees it: constants of the API, and a view parsed once per informer event.

Contract: ``appwrapper_view(raw, limits, judgements)`` never raises, whatever ``raw`` holds. An AppWrapper the
controller must refuse gets ``demand_error`` set (despite its name, every reason to refuse: a bound of
``mcad.api.validation`` broken, judged with ``limits``, or a demand that cannot be computed, such as a bad
quantity or an impossible replica count), so the dispatcher can fail that one AppWrapper with a clear message
and keep serving the others. Its ``scheduling`` values are clamped into the ranges validation allows (timers
then stay finite and never fire in a loop), even for an AppWrapper that was dispatched before its values were
refused. With ``judgements`` (one per API server: an informer's), the spec's verdict is remembered per uid and
generation. Views are immutable; the raw ``items`` and ``status`` they carry are the informer's objects and must
not be mutated.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mcad.api.clusterscheduling import ANYWHERE, ClusterScheduling, cluster_scheduling
from mcad.api.raw import as_mapping
from mcad.api.resources import ResourceVector
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
class AppWrapperView:
    key: str
    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int
    priority: int
    created: str
    items: tuple[Mapping[str, Any], ...]
    demand: ResourceVector
    # Why the controller refuses it (see the module docstring), or None.
    demand_error: str | None
    status: Mapping[str, Any]
    deleting: bool
    scheduling: SchedulingSpec = SchedulingSpec()
    # Its group/version: status writes and owner references go back to the API it came from.
    api_version: str = API_VERSION
    # Its labels (string values only): a label whose key names a quota tree says where it is charged.
    labels: Mapping[str, str] = field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    # Hub mode: the worker clusters it may go to.
    clusters: ClusterScheduling = ANYWHERE

    @property
    def target_cluster(self) -> str:
        """Hub mode: the worker its objects were created in ("" when none, or not in hub mode)."""
        return str(self.status.get("targetClusterName") or "")

    @property
    def state(self) -> str:
        return str(self.status.get("state") or "")

    @property
    def dispatched(self) -> bool:
        """Its objects exist (or are being created): capacity stays reserved until it completes or goes."""
        return bool(self.status.get("canrun")) and self.state in ACTIVE_STATES

    @property
    def queued(self) -> bool:
        return not self.deleting and self.state in (State.NEW, State.PENDING) and not self.status.get("canrun")

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
        return SchedulingSpec()
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


class Judgements:
    """What an AppWrapper's spec implies (its demand, and why it is refused), remembered per (uid, generation,
    limits) for the objects of one API server (an informer's ``transform``). Most informer events are status
    writes, which leave metadata.generation alone, and judging a large spec is costly (1 MiB: ~5 ms, mostly
    measuring it), so each spec is judged once. Bounded (least recently used out); an object without a uid or a
    generation is judged every time. Safe to share between threads."""

    def __init__(self, size: int = 8192) -> None:
        self._size = size
        self._seen: OrderedDict[tuple[str, int, Limits], tuple[ResourceVector, str | None]] = OrderedDict()
        self._lock = threading.Lock()  # the informers of both API groups transform on their own threads

    def __len__(self) -> int:
        return len(self._seen)

    def __call__(self, raw: Mapping[str, Any], items: tuple[Mapping[str, Any], ...],
                 limits: Limits) -> tuple[ResourceVector, str | None]:
        meta = as_mapping(raw.get("metadata"))
        uid, generation = meta.get("uid"), meta.get("generation")
        key = None
        if isinstance(uid, str) and uid and isinstance(generation, int) and generation > 0:
            key = (uid, generation, limits)
            with self._lock:
                if (known := self._seen.get(key)) is not None:
                    self._seen.move_to_end(key)
                    return known
        judged = _judge(raw, items, limits)
        if key is not None:
            with self._lock:
                self._seen[key] = judged
                if len(self._seen) > self._size:
                    self._seen.popitem(last=False)
        return judged


def _judge(raw: Mapping[str, Any], items: tuple[Mapping[str, Any], ...],
           limits: Limits) -> tuple[ResourceVector, str | None]:
    reasons: list[str] = []
    demand = ResourceVector()
    if (refused := refusal(raw, limits)) is not None:
        reasons.append(refused)
    if not items:
        reasons.append("spec.resources.GenericItems is empty: there is nothing to dispatch")
    else:
        try:
            demand = appwrapper_demand(as_mapping(raw.get("spec")))
        except WorkloadError as err:
            reasons.append(str(err))
    return demand, "; ".join(reasons) or None


def appwrapper_view(raw: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS,
                    judgements: Judgements | None = None) -> AppWrapperView:
    meta = as_mapping(raw.get("metadata"))
    spec = as_mapping(raw.get("spec"))
    items_raw = as_mapping(spec.get("resources")).get("GenericItems")
    items = tuple(i for i in items_raw if isinstance(i, Mapping)) if isinstance(items_raw, list) else ()
    demand, demand_error = (judgements if judgements is not None else _judge)(raw, items, limits)
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    return AppWrapperView(
        key=f"{namespace}/{name}",
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        generation=_int(meta.get("generation")),
        priority=_clamped(spec.get("priority"), 0, INT32_MIN, INT32_MAX),
        created=str(meta.get("creationTimestamp") or ""),
        items=items,
        demand=demand,
        demand_error=demand_error,
        status=as_mapping(raw.get("status")),
        deleting=bool(meta.get("deletionTimestamp")),
        scheduling=_scheduling(spec),
        api_version=str(raw.get("apiVersion") or API_VERSION),
        labels={str(k): v for k, v in (meta.get("labels") or {}).items() if isinstance(v, str)}
        if isinstance(meta.get("labels"), Mapping) else {},
        finalizers=tuple(f for f in meta.get("finalizers") or () if isinstance(f, str))
        if isinstance(meta.get("finalizers"), list) else (),
        clusters=cluster_scheduling(spec["schedulingSpec"])
        if isinstance(spec.get("schedulingSpec"), Mapping) else ANYWHERE,
    )
