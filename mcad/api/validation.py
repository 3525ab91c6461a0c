"""The bounds an AppWrapper must keep, judged by the controller: what admission cannot refuse, and old objects.

The CRD schema (config/crd/) refuses most of these at create. The controller checks them again because an object
may have been stored before the schema said so (or under the legacy group mcad.ibm.com, or with a hand-edited
CRD), and because some bounds are out of the schema's reach: what is inside a ``generictemplate``, items that
name the same object, and the limits an operator sets with flags. An AppWrapper that breaks one is failed
(reason InvalidSpec) with the message ``refusal`` gives, before anything it wraps is created.

Contract:
- ``Limits(max_items, max_bytes, scheduler_names)``: the operator's bounds (``--max-items``,
  ``--max-appwrapper-bytes``, ``--allowed-scheduler-names``). Size is
  the length in bytes of ``spec`` as compact UTF-8 JSON: what the user wrote, independent of the
  ``managedFields`` or ``last-applied-configuration`` annotation a client adds to the object.
- ``problems(raw, limits)`` lists every bound ``raw`` (a parsed AppWrapper) breaks, in a fixed order: the size
  of ``spec``, ``metadata.name`` longer than ``MAX_NAME_LENGTH``, ``generictemplate``/``custompodresources``
  misplaced directly under ``spec.resources``, more items than ``limits.max_items``, ``spec.priority`` outside
  int32, the ``schedulingSpec`` values outside their ranges (below), then each item whose ``metadata.name`` (or
  ``generateName``, as a prefix) is not a DNS-1123 subdomain of at most ``MAX_OBJECT_NAME_LENGTH`` characters (the
  rule of most kinds, and of every custom resource; kinds with looser rules lose little, kinds with stricter ones
  are left to the API server, which names the item at dispatch), then each item that names the same object
  (API group, kind and name) as an earlier item, then each quantity (in ``custompodresources`` and in the
  containers, init containers, overhead and pod-level resources of the pod templates of known kinds) larger than
  ``MAX_QUANTITY`` in the unit Kubernetes counts them in. Each message names the field, or the item as
  ``GenericItems[i] (Kind name)``, and the cause. Pure, never raises on any JSON value; the work is linear in
  the size of ``raw``. Malformed quantities and replica counts are not its business: the demand computation
  (``mcad.api.workloads``) reports those. Then each pod template (of the known kinds) whose ``spec.schedulerName``
  is neither the default scheduler's (absent, empty or ``default-scheduler``) nor one of
  ``limits.scheduler_names``: mcad plans and reserves room on nodes as the default scheduler places pods, and holds
  it while the gang starts (and preempts others for it); pods that another scheduler places, or none (a name
  nothing serves), would keep that room, and what was evicted for it, while they never start.
- Nesting: an AppWrapper nested deeper than ``MAX_NESTING_DEPTH`` objects and arrays (counted from the AppWrapper
  itself; real wrapped objects need about 20) has that one problem, named with the limit, and nothing else is
  judged: the rules walk the object, and so does every JSON encoder that would send it on.
- ``refusal(raw, limits)``: the first ``MAX_REPORTED`` problems joined with ``"; "`` (and how many more there
  are), or None: one bounded status message.
- Ranges (the CRD declares the same numbers; test/unit/test_validation.py keeps them equal):
  ``priority`` and ``minAvailable``/``maxNumRequeuings`` (>= 0) are int32; ``requeuing.timeInSeconds`` is
  1..``MAX_REQUEUE_SECONDS`` (0 would dispatch and delete in a tight loop), ``requeuing.maxTimeInSeconds`` is
  0..``MAX_REQUEUE_SECONDS``, ``dispatchDuration.limit`` is 0..``MAX_DISPATCH_LIMIT_SECONDS``. A value of the
  wrong type counts as out of range.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from mcad.api.raw import as_list, as_mapping
from mcad.api.resources import canonical_entries
from mcad.api.workloads import PodSet, WorkloadError, format_path, pod_sets

# The AppWrapper's name is the value of the label workload.codeflare.dev/appwrapper on every wrapped object and
# pod, and label values are at most 63 characters.
MAX_NAME_LENGTH: Final = 63
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
# A week: a gang that needs longer than that to start its pods is better failed and looked at than evicted a
# week later. Also bounds every requeue wait, whatever growthType makes of it.
MAX_REQUEUE_SECONDS: Final = 7 * 24 * 3600
# A year: a dispatch deadline further away is no deadline.
MAX_DISPATCH_LIMIT_SECONDS: Final = 365 * 24 * 3600
# Kubernetes counts a quantity as a 64-bit integer in its smallest unit (millicores for cpu, bytes for memory,
# a count for devices): no quantity may exceed 2^63-1 of it. The API server stores larger ones, but the kubelet,
# the scheduler and this controller's ledger cannot count them: such an AppWrapper could never be placed.
MAX_QUANTITY: Final = 2**63 - 1
# The CRD's maxItems, which --max-items may lower but not raise.
MAX_ITEMS_CEILING: Final = 1000
DEFAULT_MAX_ITEMS: Final = 1000
# Admits AppWrappers of 1 MiB with room to spare; etcd refuses objects of about 1.5 MiB anyway, and a wrapped
# object that large plus its managedFields no longer fits in one etcd request when it is applied.
DEFAULT_MAX_BYTES: Final = 1_310_720  # 1.25 MiB
# A DNS-1123 subdomain: what Kubernetes requires of the names of most kinds (ConfigMaps, Deployments, Jobs, Pods,
# every custom resource).
MAX_OBJECT_NAME_LENGTH: Final = 253
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Objects and arrays inside one another, from the AppWrapper down: a wrapped object needs about 20 (a pod template's
# affinity terms in a Deployment in an item); recursive code (JSON encoders, validators) needs a bound well below
# Python's recursion limit.
MAX_NESTING_DEPTH: Final = 100
# Problems named in one status message; the rest are counted.
MAX_REPORTED: Final = 5
# Kept where users of upstream MCAD put them by mistake (the seed RayCluster tutorial): directly in resources.
MISPLACED_FIELDS: Final = ("generictemplate", "custompodresources")


# The kube-scheduler's name, which the API server writes into a pod that names none.
DEFAULT_SCHEDULER: Final = "default-scheduler"


@dataclass(frozen=True, slots=True)
class Limits:
    max_items: int = DEFAULT_MAX_ITEMS
    max_bytes: int = DEFAULT_MAX_BYTES
    # Schedulers besides the default one that the admin allows pod templates to name (--allowed-scheduler-names).
    scheduler_names: frozenset[str] = frozenset()

    def allows_scheduler(self, name: object) -> bool:
        return name is None or (isinstance(name, str) and (name in ("", DEFAULT_SCHEDULER)
                                                            or name in self.scheduler_names))


DEFAULT_LIMITS: Final = Limits()


def describe_item(index: int, item: Any) -> str:
    """``GenericItems[i] (Kind name)``, as dispatch errors name items; ``?`` and ``(no name)`` for what is missing."""
    template = as_mapping(as_mapping(item).get("generictemplate"))
    kind = template.get("kind")
    name = as_mapping(template.get("metadata")).get("name")
    return (f"GenericItems[{index}] ({kind if isinstance(kind, str) and kind else '?'} "
            f"{name if isinstance(name, str) and name else '(no name)'})")


def refusal(raw: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS) -> str | None:
    found = problems(raw, limits)
    if not found:
        return None
    message = "; ".join(found[:MAX_REPORTED])
    more = len(found) - MAX_REPORTED
    return f"{message}; and {more} more problem{'s' if more > 1 else ''}" if more > 0 else message


def nesting_depth(value: Any, limit: int = MAX_NESTING_DEPTH) -> int:
    """How deeply objects and arrays nest in ``value`` (a scalar: 0), counted without recursion up to ``limit`` + 1
    (deeper is not explored)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        stack.extend((child, depth + 1) for child in children if isinstance(child, (Mapping, list)))
    return deepest


def problems(raw: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS) -> list[str]:
    if nesting_depth(raw) > MAX_NESTING_DEPTH:
        return [f"the AppWrapper nests objects and arrays more than {MAX_NESTING_DEPTH} levels deep; at most "
                f"{MAX_NESTING_DEPTH} are allowed"]
    meta = as_mapping(raw.get("metadata"))
    spec = as_mapping(raw.get("spec"))
    resources = as_mapping(spec.get("resources"))
    items = as_list(resources.get("GenericItems"))
    out: list[str] = []
    size = _json_size(spec)
    if size > limits.max_bytes:
        out.append(f"spec is {_mib(size)} ({size} bytes of JSON); at most {_mib(limits.max_bytes)} "
                   f"({limits.max_bytes} bytes) is allowed (--max-appwrapper-bytes)")
    name = meta.get("name")
    if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        out.append(f"metadata.name is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed, because "
                   f"it becomes the value of the label workload.codeflare.dev/appwrapper on every wrapped object")
    for field in MISPLACED_FIELDS:
        if field in resources:
            out.append(f"spec.resources.{field} is misplaced: {field} belongs inside an item, as "
                       f"spec.resources.GenericItems[].{field}")
    if len(items) > limits.max_items:
        out.append(f"spec.resources.GenericItems has {len(items)} items; at most {limits.max_items} are allowed "
                   f"(--max-items)")
    out += _out_of_range(spec, "priority", "spec.priority", INT32_MIN, INT32_MAX)
    out += _scheduling_problems(as_mapping(spec.get("schedulingSpec")))
    for index, item in enumerate(items):
        out += (f"{describe_item(index, item)}: {problem}" for problem in _item_name_problems(item))
    out += _duplicates(items)
    for index, item in enumerate(items):
        out += (f"{describe_item(index, item)}: {problem}" for problem in _item_quantity_problems(item))
    for index, item in enumerate(items):
        out += (f"{describe_item(index, item)}: {problem}" for problem in _scheduler_problems(item, limits))
    return out


def _template_pod_sets(item: Mapping[str, Any]) -> list[PodSet]:
    """The pod templates of an item's generictemplate ([] when it has none, or a replica count is bad: the demand
    computation names that)."""
    template = item.get("generictemplate")
    if not isinstance(template, Mapping):
        return []
    try:
        return pod_sets(template)
    except WorkloadError:
        return []


def _scheduler_problems(item: Any, limits: Limits) -> Iterator[str]:
    allowed = ", ".join(sorted({DEFAULT_SCHEDULER, *limits.scheduler_names}))
    for pod_set in _template_pod_sets(as_mapping(item)):
        name = as_mapping(pod_set.template.get("spec")).get("schedulerName")
        if not limits.allows_scheduler(name):
            where = format_path(("generictemplate", *pod_set.path, "spec", "schedulerName"))
            yield (f"{where} {_short(name)} is not a scheduler the cluster admin allows ({allowed}; "
                   f"--allowed-scheduler-names): mcad reserves room for pods as the default scheduler places them, "
                   f"and pods another scheduler places, or none, could hold that room without ever starting")


def _json_size(value: Any) -> int:
    try:
        return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError, RecursionError):  # not what a JSON decoder gives: count it as too large
        return 1 << 62


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.2f} MiB"


def _out_of_range(parent: Mapping[str, Any], key: str, where: str, low: int, high: int) -> list[str]:
    if key not in parent or parent[key] is None:
        return []
    value = parent[key]
    if isinstance(value, bool) or not isinstance(value, int):
        return [f"{where} must be an integer, got {_short(value)}"]
    if not low <= value <= high:
        return [f"{where} is {value}; it must be between {low} and {high}"]
    return []


def _scheduling_problems(scheduling: Mapping[str, Any]) -> list[str]:
    where = "spec.schedulingSpec"
    requeuing = as_mapping(scheduling.get("requeuing"))
    deadline = as_mapping(scheduling.get("dispatchDuration"))
    return [
        *_out_of_range(scheduling, "minAvailable", f"{where}.minAvailable", 0, INT32_MAX),
        *_out_of_range(requeuing, "timeInSeconds", f"{where}.requeuing.timeInSeconds", 1, MAX_REQUEUE_SECONDS),
        *_out_of_range(requeuing, "maxTimeInSeconds", f"{where}.requeuing.maxTimeInSeconds", 0, MAX_REQUEUE_SECONDS),
        *_out_of_range(requeuing, "maxNumRequeuings", f"{where}.requeuing.maxNumRequeuings", 0, INT32_MAX),
        *_out_of_range(deadline, "limit", f"{where}.dispatchDuration.limit", 0, MAX_DISPATCH_LIMIT_SECONDS),
    ]


def _item_name_problems(item: Any) -> Iterator[str]:
    """The item's name as the API server will judge it when the item is created: refused now, not at dispatch."""
    meta = as_mapping(as_mapping(as_mapping(item).get("generictemplate")).get("metadata"))
    name = meta.get("name")
    if name is not None and name != "":
        if not isinstance(name, str):
            yield f"metadata.name must be a string, got {_short(name)}"
        elif len(name) > MAX_OBJECT_NAME_LENGTH or not _DNS_SUBDOMAIN.match(name):
            yield (f"metadata.name {_short(name)} is not a valid Kubernetes name (a DNS-1123 subdomain: at most "
                   f"{MAX_OBJECT_NAME_LENGTH} lowercase letters, digits, '-' and '.', starting and ending with a "
                   f"letter or digit)")
    prefix = meta.get("generateName")
    # A prefix is judged as the API server judges it: without the trailing dashes it usually ends with.
    if prefix is not None and prefix != "" and (
            not isinstance(prefix, str) or len(prefix) > MAX_OBJECT_NAME_LENGTH
            or not _DNS_SUBDOMAIN.match(prefix.rstrip("-"))):
        yield f"metadata.generateName {_short(prefix)} is not a valid Kubernetes name prefix (a DNS-1123 subdomain)"


def _duplicates(items: list[Any]) -> Iterator[str]:
    """Items naming the object of an earlier item: applying both would leave one object, counted twice."""
    first: dict[tuple[str, str, str], int] = {}
    for index, item in enumerate(items):
        template = as_mapping(as_mapping(item).get("generictemplate"))
        api_version, kind = template.get("apiVersion"), template.get("kind")
        name = as_mapping(template.get("metadata")).get("name")
        if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str) and name):
            continue  # a nameless or kindless item fails on its own
        # The version does not matter: apps/v1 and apps/v1beta2 Deployments of one name are one object.
        key = (api_version.rpartition("/")[0], kind, name)
        if key in first:
            yield (f"{describe_item(index, item)} names the same object as GenericItems[{first[key]}] (same API "
                   f"group, kind and name): one would overwrite the other and its demand would count twice")
        else:
            first[key] = index


def _item_quantity_problems(item: Any) -> Iterator[str]:
    item = as_mapping(item)
    for j, entry in enumerate(as_list(item.get("custompodresources"))):
        entry = as_mapping(entry)
        for key in ("requests", "limits"):
            yield from _too_large(as_mapping(entry.get(key)), f"custompodresources[{j}].{key}")
    for pod_set in _template_pod_sets(item):
        spec = as_mapping(pod_set.template.get("spec"))
        where = format_path(("generictemplate", *pod_set.path, "spec"))
        for group in ("initContainers", "containers"):
            for k, container in enumerate(as_list(spec.get(group))):
                resources = as_mapping(as_mapping(container).get("resources"))
                for key in ("requests", "limits"):
                    yield from _too_large(as_mapping(resources.get(key)), f"{where}.{group}[{k}].resources.{key}")
        yield from _too_large(as_mapping(spec.get("overhead")), f"{where}.overhead")
        resources = as_mapping(spec.get("resources"))  # pod-level resources (Kubernetes 1.32+)
        for key in ("requests", "limits"):
            yield from _too_large(as_mapping(resources.get(key)), f"{where}.resources.{key}")


def _too_large(quantities: Mapping[str, Any], where: str) -> Iterator[str]:
    # What does not parse is skipped: the demand computation names it.
    for name, value, amount in canonical_entries(quantities):
        if abs(amount) > MAX_QUANTITY:
            largest = f"{MAX_QUANTITY}m" if name == "cpu" else str(MAX_QUANTITY)
            yield f"{where}.{name} is {_short(value)}, more than Kubernetes can count (at most {largest})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
