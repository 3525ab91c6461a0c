"""What the objects an AppWrapper wraps will ask of the cluster: pod templates of known kinds and their requests.

Contract:
- ``pod_requests(pod_spec)`` is the Kubernetes effective request of one pod (what the scheduler reserves):
  ``max(Σ containers + Σ sidecars, max over ordinary init containers i of (init_i + Σ sidecars declared before i))
  + overhead``, where a sidecar is an init container with ``restartPolicy: Always``. A container's request for a
  resource falls back to its limit when the request is absent, as the API server defaults it on pod creation.
- ``pod_sets(obj)`` lists the pod templates inside an object of a known kind with how many pods each yields:
  Pod (v1), Deployment / ReplicaSet / StatefulSet (apps), Job (batch, min(parallelism, completions); suspended
  Jobs still count, the AppWrapper may resume them), RayCluster (ray.io: head * 1, plus each worker group *
  (replicas, else minReplicas, else 1; clamped to [minReplicas, maxReplicas] as KubeRay does) * numOfHosts) and
  PyTorchJob (kubeflow.org: each replica spec * replicas, default 1). Unknown kinds yield ``[]``.
  A ``PodSet.path`` locates the template dict inside the object (``()`` for a bare Pod: the object itself), so
  the controller can stamp its labels on every nested template.
- ``item_demand(item)`` is the demand of one AppWrapper GenericItem: per resource, the larger of what its
  ``custompodresources`` declare (Σ replicas * requests, a missing or zero request falling back to the limit, as
  upstream MCAD does; nothing when the list is absent or empty) and what its templates ask (``inferred_demand``:
  Σ replicas * pod_requests over ``pod_sets(generictemplate)``; nothing for kinds without known templates). A
  tenant cannot make its pods cheaper by declaring less than they ask (AppWrapper v1beta2 refuses the same at
  admission): ``understated(item)`` gives ``(declared, inferred)`` when the declaration is below the
  templates in some resource, else None. ``appwrapper_demand(spec)`` sums the items.
  ``custom_pod_resources(entry)`` is one such entry as ``(replicas, requests of one pod)``.

Odd shapes in wrapped templates (a missing or ill-typed field) are treated as absent, never raised: the API
server, not the demand inference, is the judge of a wrapped object. What would make the count wrong is reported
as a ``WorkloadError`` (a ``ValueError``) whose message starts with the path of the offending field: replica
counts that are negative or not integers, quantities that do not parse or are negative, malformed
``custompodresources`` (the AppWrapper's own declared demand, which must not be silently under-counted).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from mcad.api.raw import as_list, as_mapping
from mcad.api.resources import ZERO, ResourceVector, to_canonical

Path = tuple[str | int, ...]

_SIDECAR_RESTART_POLICY: Final = "Always"


class WorkloadError(ValueError):
    """A wrapped object or custompodresources entry that cannot be counted; ``field`` is the path to blame."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem

    def within(self, prefix: str) -> WorkloadError:
        """The same error with its field path prefixed by the path of the enclosing object."""
        return WorkloadError(join_path(prefix, self.field), self.problem)


@dataclass(frozen=True, slots=True)
class PodSet:
    """``replicas`` pods made from ``template`` (a dict with ``metadata`` and ``spec``) found at ``path`` in obj."""

    path: Path
    replicas: int
    template: Mapping[str, Any]


def format_path(path: Path) -> str:
    """``("spec", "workerGroupSpecs", 0, "template")`` -> ``spec.workerGroupSpecs[0].template``."""
    out = ""
    for part in path:
        out = f"{out}[{part}]" if isinstance(part, int) else join_path(out, part)
    return out


def join_path(prefix: str, field: str) -> str:
    if not prefix:
        return field
    if not field:
        return prefix
    return f"{prefix}{field}" if field.startswith("[") else f"{prefix}.{field}"


# -- pod requests ---------------------------------------------------------------------------------------------------


def pod_requests(pod_spec: Any, *, strict: bool = True) -> ResourceVector:
    """The effective request of one pod with this spec (see the module docstring).

    With ``strict`` a quantity that does not parse or is negative raises ``WorkloadError`` naming its field
    (relative to the pod spec, e.g. ``containers[0].resources.requests.cpu``); without it such an entry is
    skipped, which is what the informers want for pods the API server already validated.
    """
    if not isinstance(pod_spec, Mapping):
        return ZERO
    total: dict[str, int] = {}
    for i, container in enumerate(as_list(pod_spec.get("containers"))):
        _add_into(total, _container_requests(container, f"containers[{i}]", strict))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, container in enumerate(as_list(pod_spec.get("initContainers"))):
        requests = _container_requests(container, f"initContainers[{i}]", strict)
        if isinstance(container, Mapping) and container.get("restartPolicy") == _SIDECAR_RESTART_POLICY:
            # A sidecar keeps running next to the regular containers and every later init container.
            _add_into(total, requests)
            _add_into(sidecars, requests)
        else:
            # An ordinary init container runs alone, alongside only the sidecars started before it.
            running = dict(sidecars)
            _add_into(running, requests)
            _max_into(init_peak, running)
    _max_into(total, init_peak)
    overhead = pod_spec.get("overhead")
    if isinstance(overhead, Mapping):
        _add_into(total, _quantities(overhead, "overhead", strict))
    return ResourceVector(total)


def _container_requests(container: Any, where: str, strict: bool) -> dict[str, int]:
    if not isinstance(container, Mapping):
        return {}
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return {}
    out: dict[str, int] = {}
    limits = resources.get("limits")
    if isinstance(limits, Mapping):
        # The API server defaults each absent request to the limit; requests below overwrite these.
        out.update(_quantities(limits, f"{where}.resources.limits", strict))
    requests = resources.get("requests")
    if isinstance(requests, Mapping):
        out.update(_quantities(requests, f"{where}.resources.requests", strict))
    return out


def _quantities(values: Mapping[Any, Any], where: str, strict: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in values.items():
        if not isinstance(name, str):
            continue
        try:
            amount = to_canonical(name, value)
        except ValueError:
            if strict:
                raise WorkloadError(f"{where}.{name}", f"invalid quantity {value!r}") from None
            continue
        if amount < 0:
            if strict:
                raise WorkloadError(f"{where}.{name}", f"negative quantity {value!r}")
            continue
        out[name] = amount
    return out


def _add_into(acc: dict[str, int], more: Mapping[str, int]) -> None:
    for name, amount in more.items():
        acc[name] = acc.get(name, 0) + amount


def _max_into(acc: dict[str, int], other: Mapping[str, int]) -> None:
    for name, amount in other.items():
        if amount > acc.get(name, 0):
            acc[name] = amount


# -- pod templates of known kinds -----------------------------------------------------------------------------------


def pod_sets(obj: Mapping[str, Any]) -> list[PodSet]:
    """The pod templates inside ``obj`` and how many pods each yields; ``[]`` for kinds without known templates."""
    if not isinstance(obj, Mapping):
        return []
    kind = obj.get("kind")
    api_version = obj.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        return []
    group = api_version.rpartition("/")[0]  # "apps/v1" -> "apps", "v1" -> ""
    handler = _KINDS.get((group, kind))
    return handler(obj) if handler is not None else []


def _pod(obj: Mapping[str, Any]) -> list[PodSet]:
    return [PodSet((), 1, obj)]


def _replicated(obj: Mapping[str, Any]) -> list[PodSet]:
    spec = as_mapping(obj.get("spec"))
    replicas = _count(spec, "replicas", "spec", default=1)
    return _template_at(spec, ("spec",), replicas)


def _job(obj: Mapping[str, Any]) -> list[PodSet]:
    spec = as_mapping(obj.get("spec"))
    pods = _count(spec, "parallelism", "spec", default=1)
    completions = _optional_count(spec, "completions", "spec")
    if completions is not None:
        pods = min(pods, completions)  # never more pods at once than completions still wanted
    return _template_at(spec, ("spec",), pods)


def _ray_cluster(obj: Mapping[str, Any]) -> list[PodSet]:
    spec = as_mapping(obj.get("spec"))
    out = _template_at(as_mapping(spec.get("headGroupSpec")), ("spec", "headGroupSpec"), 1)
    for i, group in enumerate(as_list(spec.get("workerGroupSpecs"))):
        if not isinstance(group, Mapping):
            continue
        where = f"spec.workerGroupSpecs[{i}]"
        replicas = _optional_count(group, "replicas", where)
        low = _optional_count(group, "minReplicas", where)
        high = _optional_count(group, "maxReplicas", where)
        if replicas is None:
            replicas = low if low is not None else 1
        # KubeRay's GetWorkerGroupDesiredReplicas: replicas below minReplicas get min, above maxReplicas get max.
        if low is not None and replicas < low:
            replicas = low
        elif high is not None and replicas > high:
            replicas = high
        hosts = _count(group, "numOfHosts", where, default=1)  # multi-host groups: one pod per host per replica
        out += _template_at(group, ("spec", "workerGroupSpecs", i), replicas * hosts)
    return out


def _pytorch_job(obj: Mapping[str, Any]) -> list[PodSet]:
    spec = as_mapping(obj.get("spec"))
    out: list[PodSet] = []
    for role, replica_spec in as_mapping(spec.get("pytorchReplicaSpecs")).items():
        if not isinstance(role, str) or not isinstance(replica_spec, Mapping):
            continue
        replicas = _count(replica_spec, "replicas", f"spec.pytorchReplicaSpecs.{role}", default=1)
        out += _template_at(replica_spec, ("spec", "pytorchReplicaSpecs", role), replicas)
    return out


_KINDS: Final[dict[tuple[str, str], Callable[[Mapping[str, Any]], list[PodSet]]]] = {
    ("", "Pod"): _pod,
    ("apps", "Deployment"): _replicated,
    ("apps", "ReplicaSet"): _replicated,
    ("apps", "StatefulSet"): _replicated,
    ("batch", "Job"): _job,
    ("ray.io", "RayCluster"): _ray_cluster,
    ("kubeflow.org", "PyTorchJob"): _pytorch_job,
}


# Kinds that never make pods: once their AppWrapper is gone the garbage collector deletes them (ownerReference), and
# deleting them ourselves would free no capacity sooner (mcad.k8s.apply.delete_wrapped_steps).
POD_FREE_KINDS: Final[frozenset[tuple[str, str]]] = frozenset({
    ("", "ConfigMap"), ("", "Secret"), ("", "Service"), ("", "ServiceAccount"), ("", "PersistentVolumeClaim"),
    ("", "Endpoints"), ("networking.k8s.io", "Ingress"), ("networking.k8s.io", "NetworkPolicy"),
    ("policy", "PodDisruptionBudget"), ("discovery.k8s.io", "EndpointSlice"),
})


def makes_no_pods(api_version: str, kind: str) -> bool:
    """``kind`` (of ``api_version``'s group) is one that never makes pods."""
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    return (group, kind) in POD_FREE_KINDS


def _template_at(parent: Mapping[str, Any], parent_path: Path, replicas: int) -> list[PodSet]:
    template = parent.get("template")
    if not isinstance(template, Mapping):
        return []
    return [PodSet((*parent_path, "template"), replicas, template)]


def _count(parent: Mapping[str, Any], key: str, where: str, default: int) -> int:
    """A non-negative int field; ``default`` when absent or null; ``WorkloadError`` when anything else."""
    value = _optional_count(parent, key, where)
    return default if value is None else value


def _optional_count(parent: Mapping[str, Any], key: str, where: str) -> int | None:
    value = parent.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkloadError(join_path(where, key), f"must be a non-negative integer, got {value!r}")
    return value


# -- AppWrapper demand ----------------------------------------------------------------------------------------------


def item_demand(item: Mapping[str, Any]) -> ResourceVector:
    """Resource demand of one GenericItem; ``WorkloadError`` fields are relative to the item."""
    declared = declared_demand(item)
    inferred = inferred_demand(item)
    return inferred if declared is None else declared.max(inferred)


def declared_demand(item: Mapping[str, Any]) -> ResourceVector | None:
    """What the item's ``custompodresources`` declare, None when it declares nothing (absent or empty list)."""
    custom = item.get("custompodresources")
    if isinstance(custom, list) and custom:
        return _custom_demand(custom)
    return None


def inferred_demand(item: Mapping[str, Any]) -> ResourceVector:
    """What the pods of the item's ``generictemplate`` ask (zero for kinds whose pods mcad cannot infer)."""
    template = item.get("generictemplate")
    if not isinstance(template, Mapping):
        return ZERO
    try:
        sets = pod_sets(template)
    except WorkloadError as err:
        raise err.within("generictemplate") from None
    total = ZERO
    for pod_set in sets:
        if pod_set.replicas == 0:
            continue
        try:
            requests = pod_requests(pod_set.template.get("spec"))
        except WorkloadError as err:
            raise err.within(join_path("generictemplate", format_path((*pod_set.path, "spec")))) from None
        total += requests.scale(pod_set.replicas)
    return total


def understated(item: Mapping[str, Any]) -> tuple[ResourceVector, ResourceVector] | None:
    """``(declared, inferred)`` when ``custompodresources`` declare less than the templates ask in some resource
    they name, else None (nothing declared, or enough); both vectors hold only the resources the declaration
    names. A resource the declaration leaves out is not understated, only undeclared: it is charged at what the
    templates ask all the same (``item_demand`` takes the larger per resource), and upstream's own cases declare
    cpu alone in front of templates that also ask memory. ``WorkloadError`` as ``item_demand``."""
    declared = declared_demand(item)
    if declared is None:
        return None
    named = set(declared.keys())
    inferred = ResourceVector((name, amount) for name, amount in inferred_demand(item).items() if name in named)
    return None if inferred.fits_in(declared) else (declared, inferred)


def _custom_demand(entries: list[Any]) -> ResourceVector:
    total = ZERO
    for j, entry in enumerate(entries):
        replicas, requests = custom_pod_resources(entry, f"custompodresources[{j}]")
        total += requests.scale(replicas)
    return total


def custom_pod_resources(entry: Any, where: str = "") -> tuple[int, ResourceVector]:
    """``(replicas, requests of one pod)`` of one ``custompodresources`` entry; ``WorkloadError`` when malformed.

    ``where`` is the entry's path, prefixed to the field a ``WorkloadError`` names.
    """
    if not isinstance(entry, Mapping):
        raise WorkloadError(where, f"must be an object, got {entry!r}")
    replicas = _optional_count(entry, "replicas", where)
    if replicas is None:
        raise WorkloadError(join_path(where, "replicas"), "required")
    requests = _quantity_map(entry, "requests", where)
    limits = _quantity_map(entry, "limits", where)
    # Upstream MCAD: a zero (or missing) request falls back to the limit, per resource.
    per_pod = {name: requests.get(name) or limits.get(name, 0) for name in requests.keys() | limits.keys()}
    return replicas, ResourceVector(per_pod)


def _quantity_map(entry: Mapping[str, Any], key: str, where: str) -> dict[str, int]:
    values = entry.get(key)
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise WorkloadError(join_path(where, key), f"must be a map of quantities, got {values!r}")
    return _quantities(values, join_path(where, key), strict=True)


def appwrapper_demand(spec: Mapping[str, Any]) -> ResourceVector:
    """Σ ``item_demand`` over ``spec.resources.GenericItems``; ``WorkloadError`` fields start at ``spec.``."""
    resources = as_mapping(spec.get("resources")) if isinstance(spec, Mapping) else {}
    total = ZERO
    for i, item in enumerate(as_list(resources.get("GenericItems"))):
        where = f"spec.resources.GenericItems[{i}]"
        if not isinstance(item, Mapping):
            raise WorkloadError(where, f"must be an object, got {type(item).__name__}")
        try:
            total += item_demand(item)
        except WorkloadError as err:
            raise err.within(where) from None
    return total
