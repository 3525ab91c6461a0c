"""The pods an AppWrapper will create, as groups of identical pods with their node constraints. Pure.

Contract:
- ``gang(items)`` lists the pods an AppWrapper's GenericItems will create as ``PodGroup``s of identical pods.
  An item with a non-empty ``custompodresources`` list that declares at least what its templates ask (in every
  resource; always so for kinds without known templates) yields one group per entry (``replicas`` pods of the
  entry's requests, a zero or missing request falling back to the limit, as ``item_demand`` counts them); those
  pods carry the node constraints of the item's ``generictemplate`` when it has exactly one pod set, else none.
  Any other item, including one whose declaration is below its templates (the pods that will really exist are
  the templates': a 1-pod declaration in front of a 6-pod Deployment is placed as 6 pods), yields one group per
  ``pod_sets(generictemplate)`` entry: its replicas, ``pod_requests`` of the
  template's spec and the spec's constraints (``nodeSelector``, ``tolerations``, and
  ``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``). Groups of 0 pods are left out;
  pods without requests are kept (they still need an eligible node). Never raises: what makes the demand
  uncountable is ``AppWrapperView.demand_error``'s business, so such an item or entry is skipped here, and an
  ill-typed constraint field reads as absent.
- ``Toleration.tolerates`` and ``NodeRequirement.matches`` are Kubernetes' own matching rules; ``mcad.model.placement``
  packs the groups onto nodes with them. They read a taint and a node through ``MatchedTaint`` and ``MatchedNode``
  (what ``mcad.api.views.Taint`` and ``NodeView`` have), not those types: ``mcad.api.views`` imports this module.

Computed once per AppWrapper event (``appwrapper_view``), so the controller keeps these groups, not the templates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from mcad.api import topologyasks
from mcad.api.raw import as_list, as_mapping, as_str
from mcad.api.resources import ResourceVector
from mcad.api.selectors import label_matches
from mcad.api.workloads import PodSet, WorkloadError, custom_pod_resources, pod_requests, pod_sets

# -- constraints ----------------------------------------------------------------------------------------------------


class MatchedTaint(Protocol):
    """What a toleration is matched against: a node's taint (``mcad.api.views.Taint``)."""

    @property
    def key(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def effect(self) -> str: ...


class MatchedNode(Protocol):
    """What a node requirement is matched against: a node's name and labels (``mcad.api.views.NodeView``)."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class Toleration:
    """One entry of a pod's ``tolerations``, with Kubernetes' matching rules."""

    key: str = ""  # empty (with Exists): every key
    operator: str = "Equal"  # "Equal" or "Exists"; any other operator tolerates nothing
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: MatchedTaint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator == "Equal" and self.value == taint.value


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One ``matchExpressions`` (or, with ``field``, ``matchFields``) entry of a node selector term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt; any other matches no node
    values: tuple[str, ...] = ()
    field: bool = False  # the key names a node field (only metadata.name exists), not a label

    def matches(self, node: MatchedNode) -> bool:
        if self.field:
            # Kubernetes allows only metadata.name with In/NotIn here.
            if self.key != "metadata.name":
                return False
            if self.operator == "In":
                return node.name in self.values
            return self.operator == "NotIn" and node.name not in self.values
        value = node.labels.get(self.key)
        op = self.operator
        if op in ("Gt", "Lt"):  # node affinity only
            if value is None or len(self.values) != 1:
                return False
            try:
                have, bound = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > bound if op == "Gt" else have < bound
        return label_matches(op, self.values, value)


# Requirements ANDed; an empty term matches no node, as in Kubernetes.
NodeSelectorTerm = tuple[NodeRequirement, ...]


@dataclass(frozen=True, slots=True)
class PodGroup:
    """``count`` identical pods, each requesting ``requests``, with the node constraints of their spec.

    ``required_affinity`` holds the terms of requiredDuringSchedulingIgnoredDuringExecution, ORed; ``()``
    means no such constraint. ``label`` names the pods for people, e.g. ``"RayCluster rc worker group gpu"``.
    ``topology_required`` / ``topology_preferred``: the levels its template's Kueue pod-set annotations ask of
    this group alone (``mcad.api.topologyasks``; "" when none).
    """

    count: int
    requests: ResourceVector
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    required_affinity: tuple[NodeSelectorTerm, ...] = ()
    label: str = ""
    topology_required: str = ""
    topology_preferred: str = ""


# -- the pods of an AppWrapper --------------------------------------------------------------------------------------


def gang(items: Iterable[Mapping[str, Any]]) -> list[PodGroup]:
    """The pods the GenericItems will create, one group per pod template or custompodresources entry."""
    groups: list[PodGroup] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        template = item.get("generictemplate")
        template = template if isinstance(template, Mapping) else {}
        base = _item_label(template, i)
        try:
            sets = pod_sets(template)
        except WorkloadError:  # a replica count that cannot be counted: demand_error reports it
            sets = []
        custom = item.get("custompodresources")
        if isinstance(custom, list) and custom:
            declared: list[tuple[int, int, ResourceVector]] = []
            for j, entry in enumerate(custom):
                try:
                    replicas, requests = custom_pod_resources(entry)
                except WorkloadError:
                    continue
                declared.append((j, replicas, requests))
            total = ResourceVector()
            for _, replicas, requests in declared:
                total += requests.scale(replicas)
            if _inferred(sets).fits_in(total):
                # Entries are not tied to templates; with one template there is no doubt whose constraints apply.
                constraints = (pod_constraints(as_mapping(sets[0].template.get("spec"))) if len(sets) == 1
                               else _NO_CONSTRAINTS)
                groups.extend(PodGroup(replicas, requests, *constraints, label=f"{base} custompodresources[{j}]")
                              for j, replicas, requests in declared if replicas > 0)
                continue
        for pod_set in sets:
            if pod_set.replicas == 0:
                continue
            spec = as_mapping(pod_set.template.get("spec"))
            asks = as_mapping(as_mapping(pod_set.template.get("metadata")).get("annotations"))
            groups.append(PodGroup(pod_set.replicas, pod_requests(spec, strict=False), *pod_constraints(spec),
                                   label=_pod_set_label(base, template, pod_set),
                                   topology_required=topologyasks.level(asks.get(topologyasks.PODSET_REQUIRED)),
                                   topology_preferred=topologyasks.level(asks.get(topologyasks.PODSET_PREFERRED))))
    return groups


def _inferred(sets: Iterable[PodSet]) -> ResourceVector:
    total = ResourceVector()
    for pod_set in sets:
        total += pod_requests(as_mapping(pod_set.template.get("spec")), strict=False).scale(pod_set.replicas)
    return total


_Constraints = tuple[tuple[tuple[str, str], ...], tuple[Toleration, ...], tuple[NodeSelectorTerm, ...]]
_NO_CONSTRAINTS: Final[_Constraints] = ((), (), ())


def pod_constraints(spec: Mapping[str, Any]) -> _Constraints:
    """nodeSelector, tolerations and required node affinity terms of a pod spec, ill-typed parts read as absent."""
    selector = tuple(sorted((k, v) for k, v in as_mapping(spec.get("nodeSelector")).items()
                            if isinstance(k, str) and isinstance(v, str)))
    tolerations = tuple(
        Toleration(as_str(t.get("key")), as_str(t.get("operator")) or "Equal", as_str(t.get("value")),
                   as_str(t.get("effect")))
        for t in as_list(spec.get("tolerations"))
        if isinstance(t, Mapping)
    )
    required = as_mapping(as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    terms = tuple(
        (*_requirements(term.get("matchExpressions"), field=False), *_requirements(term.get("matchFields"), field=True))
        for term in as_list(required.get("nodeSelectorTerms"))
        if isinstance(term, Mapping)
    )
    return selector, tolerations, terms


def _requirements(entries: Any, *, field: bool) -> list[NodeRequirement]:
    out: list[NodeRequirement] = []
    for entry in as_list(entries):
        if not isinstance(entry, Mapping):
            continue
        values = tuple(v for v in as_list(entry.get("values")) if isinstance(v, str))
        out.append(NodeRequirement(as_str(entry.get("key")), as_str(entry.get("operator")), values, field))
    return out


def _item_label(template: Mapping[str, Any], index: int) -> str:
    kind = template.get("kind")
    name = as_mapping(template.get("metadata")).get("name")
    if isinstance(kind, str) and kind and isinstance(name, str) and name:
        return f"{kind} {name}"
    return f"GenericItems[{index}]"


def _pod_set_label(base: str, obj: Mapping[str, Any], pod_set: PodSet) -> str:
    """``base`` plus what tells this template apart from the object's others (a role, a worker group)."""
    path = pod_set.path
    if len(path) >= 3 and path[:2] == ("spec", "headGroupSpec"):
        return f"{base} head"
    if len(path) >= 4 and path[:2] == ("spec", "workerGroupSpecs") and isinstance(path[2], int):
        name = as_mapping(as_list(as_mapping(obj.get("spec")).get("workerGroupSpecs"))[path[2]]).get("groupName")
        return f"{base} worker group {name if isinstance(name, str) and name else path[2]}"
    if len(path) >= 4 and path[:2] == ("spec", "pytorchReplicaSpecs"):
        return f"{base} {path[2]}"
    return base
