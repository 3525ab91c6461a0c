"""What a namespace's admin decides for the AppWrappers in it: the quota nodes it charges, the priority ceiling and
its fair-share weight.

All are read from the Namespace, which is cluster-scoped: a tenant with rights only inside its namespaces cannot
change them. The AppWrapper's own quota label and priority number are not trusted: its creator may be a tenant.

Contract:
- Quota binding: a Namespace label ``quota.codeflare.dev/<tree>: <node>`` binds the namespace to node ``<node>`` of
  quota tree ``<tree>``. Every AppWrapper in that namespace is charged there in that tree, whatever its own label
  ``<tree>`` says and whether or not it has one (``charged_labels``: its labels with each bound tree's label
  replaced by the bound node). In trees its namespace is not bound to, its own labels decide as before
  (``mcad.model.quota``: the label ``<tree>: <node>``, else the tree's ``default`` node, else not charged there).
- Priority: ``spec.priorityClassName`` names a Kubernetes PriorityClass whose value is the AppWrapper's priority
  (``spec.priority`` is then ignored by the controller, as the API server does for pods); without it
  ``spec.priority`` is. Either is capped at the namespace's ceiling: the annotation
  ``mcad.codeflare.dev/max-priority`` (an integer), else the controller's ``--default-max-priority``
  (``DEFAULT_MAX_PRIORITY``). ``effective_priority`` gives the capped value, and, when the class does not exist,
  why the AppWrapper must wait. An annotation that is not an integer counts as absent (the default applies).
- Fair-share weight (``--fair-sharing``, for the namespace as a tenant: ``mcad.model.fairweight``): the label
  ``mcad.codeflare.dev/fair-share-weight``; one that is not a weight counts as absent (weight 1). ``problem`` says
  what of the Namespace was ignored, for the controller's log.
- Admission (``mcad.admission.review`` calls these with its ``Facts``, which answer ``NamespaceFacts``, the two
  questions asked here: a Namespace object by name, a PriorityClass's value by name; each message names the field
  and the value a person can change):
  ``admission_problems(aw, facts, default_ceiling)`` refuses a quota label naming another node than the one its
  namespace is bound to, an unknown ``priorityClassName``, a ``spec.priority`` that differs from the value of the
  ``priorityClassName`` given with it, a priority (or class value) above the ceiling, the same for every pod
  template inside the items (``mcad.api.workloads.pod_sets``: a Pod, the templates of Deployments, Jobs,
  RayCluster head and worker groups, PyTorchJob replicas...): a ``priorityClassName`` that does not exist or whose
  value is above the ceiling, a ``priority`` above it (the pods would run, and preempt, at that priority whatever
  the AppWrapper's own is), and an item whose
  ``custompodresources`` declare less than its templates ask in a resource they name (naming the item and both
  figures; a resource they leave out is charged at the templates' figure, see ``mcad.api.workloads``);
  ``admission_patch(aw, facts)`` is the JSON patch that adds the bound quota labels an AppWrapper lacks (it never
  replaces a label it has: a forged one is refused, visibly, by ``admission_problems``).
- The controller applies the same rules to what it dispatches (``mcad.k8s.tenantstore``): bound labels and the capped
  priority, whether admission ran or not (a webhook can be bypassed or down: defence in depth). It caps where
  admission refuses.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from mcad.api.raw import as_list, as_mapping
from mcad.api.resources import ResourceVector, format_amount
from mcad.api.validation import INT32_MAX, INT32_MIN, describe_item
from mcad.api.workloads import WorkloadError, format_path, pod_sets, understated
from mcad.model.fairweight import DEFAULT_WEIGHT, WEIGHT_LABEL, parse_weight
from mcad.model.quota import BINDING_PREFIX

MAX_PRIORITY_ANNOTATION: Final = "mcad.codeflare.dev/max-priority"
# Above the priorities batch users give each other (upstream's examples and tests use 1 to 1000), below every
# PriorityClass a platform would use for preemption: Kubernetes' documentation examples start at 1,000,000, Kueue's
# at 10,000, and the system classes at 2,000,000,000. A team that needs more is granted it by its namespace's
# annotation.
DEFAULT_MAX_PRIORITY: Final = 1000


@dataclass(frozen=True, slots=True)
class NamespacePolicy:
    """What the admin set on one Namespace: tree -> bound node, its priority ceiling (None: the default) and its
    fair-share weight."""

    name: str
    bindings: Mapping[str, str] = field(default_factory=dict)
    max_priority: int | None = None
    problem: str = ""  # what could not be read (its default applies); "; " between several
    fair_share_weight: float = DEFAULT_WEIGHT

    def ceiling(self, default: int) -> int:
        return default if self.max_priority is None else self.max_priority


UNKNOWN_NAMESPACE: Final = NamespacePolicy("")


def namespace_policy(raw: Mapping[str, Any]) -> NamespacePolicy:
    """The policy of one Namespace object (never raises)."""
    meta = as_mapping(raw.get("metadata"))
    name = str(meta.get("name") or "")
    bindings = {key[len(BINDING_PREFIX):]: value for key, value in as_mapping(meta.get("labels")).items()
                if isinstance(key, str) and key.startswith(BINDING_PREFIX) and len(key) > len(BINDING_PREFIX)
                and isinstance(value, str) and value}
    annotation = as_mapping(meta.get("annotations")).get(MAX_PRIORITY_ANNOTATION)
    max_priority, problems = None, []
    if annotation is not None:
        text = str(annotation).strip()
        # ASCII digits only: int() also reads other scripts' digits, which no other reader would take for a number.
        if re.fullmatch(r"[+-]?[0-9]{1,20}", text):
            max_priority = min(max(int(text), INT32_MIN), INT32_MAX)
        else:
            problems.append(f"namespace {name}: annotation {MAX_PRIORITY_ANNOTATION}={annotation!r} is not an "
                            f"integer; the default ceiling applies")
    weight, weight_problem = parse_weight(as_mapping(meta.get("labels")).get(WEIGHT_LABEL),
                                          f"namespace {name}: label {WEIGHT_LABEL}")
    if weight_problem:
        problems.append(weight_problem)
    return NamespacePolicy(name, bindings, max_priority, "; ".join(problems), weight)


def charged_labels(labels: Mapping[str, str], policy: NamespacePolicy) -> Mapping[str, str]:
    """The labels quota charging reads: ``labels`` with each bound tree's label set to the bound node (``labels``
    itself when they agree already)."""
    if all(labels.get(tree) == node for tree, node in policy.bindings.items()):
        return labels
    return {**labels, **policy.bindings}


def effective_priority(priority: int, class_name: str, class_value: int | None, ceiling: int) -> tuple[int, str]:
    """The priority the controller orders and preempts by, and why it must wait ("" when it need not): the
    class's value when ``class_name`` is set (``class_value`` None: no such class), else ``priority``; capped."""
    if class_name:
        if class_value is None:
            return min(priority, ceiling), (f"spec.priorityClassName {class_name!r}: there is no PriorityClass of "
                                            f"that name; it waits until there is one")
        return min(class_value, ceiling), ""
    return min(priority, ceiling), ""


# -- admission -------------------------------------------------------------------------------------------------------


class NamespaceFacts(Protocol):
    """What the admission rules here ask the cluster (``mcad.admission.facts.Facts`` answers it, bounded in time,
    raising its ``FactUnavailable`` when it cannot: the reviewer then refuses, saying so)."""

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        """The Namespace object, or None if it does not exist."""
        ...

    def priority_class(self, name: str) -> int | None:
        """The value of the PriorityClass, or None if there is none of that name."""
        ...


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def admission_problems(aw: Mapping[str, Any], facts: NamespaceFacts, default_ceiling: int) -> list[str]:
    meta, spec = as_mapping(aw.get("metadata")), as_mapping(aw.get("spec"))
    namespace = str(meta.get("namespace") or "")
    raw_namespace = facts.namespace(namespace) if namespace else None
    policy = namespace_policy(raw_namespace) if raw_namespace is not None else UNKNOWN_NAMESPACE
    problems: list[str] = []
    labels = as_mapping(meta.get("labels"))
    for tree, node in sorted(policy.bindings.items()):
        given = labels.get(tree)
        if given is not None and given != node:
            problems.append(f"metadata.labels.{tree}: {given!r} names quota node {given} of tree {tree}, but the "
                            f"cluster admin binds namespace {namespace} to node {node} (namespace label "
                            f"{BINDING_PREFIX}{tree}); remove the label or set it to {node!r}")
    ceiling = policy.ceiling(default_ceiling)
    where = (f"namespace {namespace}'s annotation {MAX_PRIORITY_ANNOTATION}" if policy.max_priority is not None
             else "the controller's --default-max-priority")
    class_name = spec.get("priorityClassName")
    priority = _int(spec.get("priority"))
    if isinstance(class_name, str) and class_name:
        value = facts.priority_class(class_name)
        if value is None:
            problems.append(f"spec.priorityClassName: there is no PriorityClass {class_name!r}")
        else:
            if priority is not None and priority != value:
                problems.append(f"spec.priority {priority} differs from the value {value} of PriorityClass "
                                f"{class_name!r} (spec.priorityClassName): give one of them")
            if value > ceiling:
                problems.append(f"spec.priorityClassName: PriorityClass {class_name!r} has value {value}, above "
                                f"the ceiling {ceiling} of namespace {namespace} (set by {where})")
    elif priority is not None and priority > ceiling:
        problems.append(f"spec.priority {priority} is above the ceiling {ceiling} of namespace {namespace} (set by "
                        f"{where})")
    for i, item in enumerate(as_list(as_mapping(spec.get("resources")).get("GenericItems"))):
        if not isinstance(item, Mapping):
            continue
        problems += _pod_priority_problems(i, item, facts, ceiling, namespace, where)
        try:
            short = understated(item)
        except WorkloadError:
            continue  # what cannot be counted is refused by the shape checks, with the field to blame
        if short is not None:
            declared, inferred = short
            problems.append(f"{describe_item(i, item)}: custompodresources declare {_figure(declared, inferred)}, "
                            f"less than its templates ask, {_figure(inferred, inferred)}; declare at least what "
                            f"the templates ask, or leave custompodresources out")
    return problems


def _pod_priority_problems(index: int, item: Mapping[str, Any], facts: NamespaceFacts, ceiling: int, namespace: str,
                           where: str) -> list[str]:
    """The priority the pods of an item would get, held to the namespace's ceiling like the AppWrapper's own."""
    template = item.get("generictemplate")
    if not isinstance(template, Mapping):
        return []
    try:
        sets = pod_sets(template)
    except WorkloadError:
        return []  # a bad replica count: the shape checks name it
    problems: list[str] = []
    for pod_set in sets:
        spec = as_mapping(pod_set.template.get("spec"))
        at = f"{describe_item(index, item)}: generictemplate.{format_path((*pod_set.path, 'spec'))}"
        class_name = spec.get("priorityClassName")
        if isinstance(class_name, str) and class_name:
            value = facts.priority_class(class_name)
            if value is None:
                problems.append(f"{at}.priorityClassName: there is no PriorityClass {class_name!r}")
            elif value > ceiling:
                problems.append(f"{at}.priorityClassName: PriorityClass {class_name!r} has value {value}, above the "
                                f"ceiling {ceiling} of namespace {namespace} (set by {where}): its pods would run, "
                                f"and preempt, at that priority")
        priority = _int(spec.get("priority"))
        if priority is not None and priority > ceiling:
            problems.append(f"{at}.priority {priority} is above the ceiling {ceiling} of namespace {namespace} (set "
                            f"by {where})")
    return problems


def _figure(vector: ResourceVector, names: ResourceVector) -> str:
    """``vector`` in the resources of ``names`` (those the templates ask for), 0 where it has none."""
    return ", ".join(f"{name} {format_amount(name, vector.get(name))}" for name in sorted(names.keys()))


def admission_patch(aw: Mapping[str, Any], facts: NamespaceFacts) -> list[dict[str, Any]]:
    meta = as_mapping(aw.get("metadata"))
    namespace = str(meta.get("namespace") or "")
    raw_namespace = facts.namespace(namespace) if namespace else None
    if raw_namespace is None:
        return []
    bindings = namespace_policy(raw_namespace).bindings
    labels = meta.get("labels")
    if not isinstance(labels, Mapping):
        return [{"op": "add", "path": "/metadata/labels", "value": dict(sorted(bindings.items()))}] if bindings else []
    return [{"op": "add", "path": f"/metadata/labels/{_pointer(tree)}", "value": node}
            for tree, node in sorted(bindings.items()) if tree not in labels]


def _pointer(token: str) -> str:
    """One JSON pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")
