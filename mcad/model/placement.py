"""Fragmentation-aware fit: can every pod of an AppWrapper land on some node, not just in the cluster's total?

Contract:
- ``pack(groups, nodes, free)`` places the pods of ``mcad.api.podgroups.gang`` first-fit decreasing: groups in
  decreasing order of per-pod size (``nvidia.com/gpu``, then cpu, then memory, then the other resources by name;
  ties keep the given order),
  each pod on the first eligible node, by name, with room for it. A node is eligible for a group when it is
  Ready, not cordoned (unless the pods tolerate ``node.kubernetes.io/unschedulable:NoSchedule``, as the
  scheduler allows), every NoSchedule/NoExecute taint of it is tolerated, and it matches the nodeSelector and
  the required node affinity, and no node-health rule keeps the group's pods off it (``NodeView.health``: a
  NoSchedule or NoExecute verdict for a resource the group requests, ``mcad.model.nodehealth``). Nodes with a
  PreferNoSchedule verdict for the group come after all the others, so they take its pods only when the others
  have no room left (a gang that fits only with them still fits). Room is ``free[node.name]``, or the node's
  allocatable when ``free`` has no entry for it (a node nothing is known to run on); it is compared per
  resource, extended resources like any other, and a resource a pod does not request never blocks it. Pod
  counts (the ``pods`` resource), host ports, volumes, inter-pod affinity and topology spread are not modelled.
- ``Packing.fits`` says whether every pod was placed. When it is, ``placement`` lists ``(node, requests of one
  pod, how many pods)``; when not, ``placement`` is empty, ``why`` explains in one line why the first group
  that ran out of nodes could not be placed (how many of its pods are left over and, per reason, how many nodes
  turned them away), and ``about`` names those reasons (``"nodes:<resource>"``, ``"nodes:not-ready"``,
  ``"nodes:unschedulable"``, ``"nodes:taint"``, ``"nodes:nodeSelector"``, ``"nodes:affinity"``,
  ``"nodes:health"``, ``"nodes:none"``) without amounts or counts, so a caller can keep a status message whose
  ``about`` is unchanged instead of rewriting it on every change of amounts. Sick nodes are named with the label
  that keeps the pods off ("node gpu-3 is labelled autopilot.ibm.com/gpuhealth=TESTING (no nvidia.com/gpu pods)").
- ``health_verdict(node, requests)``: what the node's health marks say of a pod of ``requests`` (None: healthy);
  ``keeps_off(node, requests)``: that verdict when it is NoSchedule or NoExecute; ``prefers_not(node, requests)``:
  whether it is PreferNoSchedule.

Cost: identical pods are placed in bulk (as many on a node as its tightest resource allows, which is exactly
where placing them one by one would put them), so ``pack`` does O(groups x nodes) eligibility and room checks,
plus sorting the nodes, however many pods the groups hold; a node without health marks costs one test more. It runs
in the dispatcher's loop over 1,000 nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from mcad.api.nodemarks import Effect, Verdict
from mcad.api.podgroups import PodGroup
from mcad.api.resources import ResourceVector, format_amount
from mcad.api.views import NodeView, Taint
from mcad.model.nodehealth import verdict_for

GPU: Final = "nvidia.com/gpu"
# The scheduler's NodeUnschedulable filter lets a pod onto a cordoned node when it tolerates this taint.
_CORDON_TAINT: Final = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
# How many distinct untolerated taints a reason spells out before summarising the rest.
_TAINTS_SHOWN: Final = 3


# -- packing --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Packing:
    fits: bool
    placement: tuple[tuple[str, ResourceVector, int], ...] = ()  # (node, requests of one pod, pods); when fits
    # When not fits: why, or what words it when read (a message that surveys every domain costs more than the
    # decision; a status is rewritten only when ``about`` changes, so most are never read).
    reason: str | Callable[[], str] = ""
    about: frozenset[str] = frozenset()  # when not fits

    @property
    def why(self) -> str:
        return self.reason if isinstance(self.reason, str) else self.reason()

    def explain(self) -> str:
        return self.why


def pack(groups: Iterable[PodGroup], nodes: Iterable[NodeView], free: Mapping[str, ResourceVector], *,
         in_given_order: bool = False) -> Packing:
    """Place every pod of ``groups`` first-fit decreasing on ``nodes`` with ``free`` room (see the module docs);
    ``in_given_order``: try the nodes in the order given instead of by name (a reservation prefers some)."""
    ordered_nodes = list(nodes) if in_given_order else sorted(nodes, key=lambda node: node.name)
    # Room left on the nodes pods have been placed on so far; the others still have what the caller gave.
    left: dict[str, ResourceVector] = {}
    placement: list[tuple[str, ResourceVector, int]] = []
    for group in sorted(groups, key=group_size, reverse=True):  # sort is stable with reverse: ties keep their order
        remaining = group.count
        if remaining <= 0:
            continue
        needs = _needs(group.requests)
        eligible = _Eligibility(group)
        # Nodes a PreferNoSchedule verdict asks the group's pods to avoid are set aside as they are met and tried
        # after all the others: no pass over the nodes up front, and nothing more for a node without marks.
        avoided: list[NodeView] = []
        for candidates in (ordered_nodes, avoided):
            for node in candidates:
                if node.health and candidates is not avoided and eligible.prefers_not(node):
                    avoided.append(node)
                    continue
                if not eligible(node):
                    continue
                room = left.get(node.name)
                if room is None:
                    room = free.get(node.name, node.allocatable)
                placed = _how_many_fit(needs, room, remaining)
                if placed == 0:
                    continue
                left[node.name] = room - group.requests.scale(placed)
                placement.append((node.name, group.requests, placed))
                remaining -= placed
                if remaining == 0:
                    break
            if remaining == 0:
                break
        if remaining:
            why, about = _explain(group, remaining, needs, eligible, ordered_nodes, left, free)
            return Packing(False, reason=why, about=about)
    return Packing(True, tuple(placement))


def room_for(group: PodGroup, nodes: Iterable[NodeView], free: Mapping[str, ResourceVector]) -> int:
    """How many pods of ``group`` (at most its count) the eligible ``nodes`` have room for, together."""
    needs = _needs(group.requests)
    eligibility = _Eligibility(group)
    total = 0
    for node in nodes:
        if total >= group.count:
            break
        if eligibility(node):
            total += _how_many_fit(needs, free.get(node.name, node.allocatable), group.count - total)
    return total


def describe_pod(requests: ResourceVector) -> str:
    """One pod's requests for people: 'nvidia.com/gpu 8, cpu 4'."""
    return _describe(_needs(requests))


def eligible(group: PodGroup, node: NodeView) -> bool:
    """Whether ``node`` may take pods of ``group``, judged on everything but room (the rules of ``pack``)."""
    return _Eligibility(group)(node)


def health_verdict(node: NodeView, requests: ResourceVector) -> Verdict | None:
    """What the node's health marks say of a pod of ``requests`` (None: it is healthy for it)."""
    return verdict_for(node.health, requests) if node.health else None


def keeps_off(node: NodeView, requests: ResourceVector) -> Verdict | None:
    """The health verdict that keeps pods of ``requests`` off ``node`` (NoSchedule, NoExecute), None if none does."""
    verdict = health_verdict(node, requests)
    return verdict if verdict is not None and verdict.effect.keeps_off else None


def prefers_not(node: NodeView, requests: ResourceVector) -> bool:
    """Whether a PreferNoSchedule health verdict asks pods of ``requests`` to avoid ``node``."""
    verdict = health_verdict(node, requests)
    return verdict is not None and verdict.effect is Effect.PREFER_NOT


def group_size(group: PodGroup) -> tuple[int, int, int, tuple[tuple[str, int], ...]]:
    requests = group.requests
    others = tuple(sorted((name, amount) for name, amount in requests.items() if name not in (GPU, "cpu", "memory")))
    return requests[GPU], requests["cpu"], requests["memory"], others


def _needs(requests: ResourceVector) -> tuple[tuple[str, int], ...]:
    """The resources a pod actually asks for (a zero or, in a hand-made group, negative amount never blocks).

    In a fixed order, GPUs first: a node short of several is reported as short of the first, and that must not
    depend on the order the pod spec listed its resources in.
    """
    return tuple(sorted(((name, amount) for name, amount in requests.items() if amount > 0),
                        key=lambda need: _resource_rank(need[0])))


def _resource_rank(name: str) -> tuple[bool, bool, bool, str]:
    return name != GPU, name != "cpu", name != "memory", name


def _how_many_fit(needs: Sequence[tuple[str, int]], room: ResourceVector, limit: int) -> int:
    """How many pods needing ``needs`` fit in ``room``, at most ``limit``."""
    fit = limit
    for name, amount in needs:
        fit = min(fit, room.get(name, 0) // amount)
        if fit <= 0:
            return 0
    return fit


class _Eligibility:
    """Whether a node may take the pods of one group, judged on everything but room; also says why not."""

    __slots__ = ("_affinity", "_requests", "_selector", "_tolerations", "tolerates_cordon")

    def __init__(self, group: PodGroup) -> None:
        self._requests = group.requests
        self._selector = group.node_selector
        self._tolerations = group.tolerations
        self._affinity = group.required_affinity
        self.tolerates_cordon = self.tolerated(_CORDON_TAINT)

    def __call__(self, node: NodeView) -> bool:
        return self.reason(node) is None

    def reason(self, node: NodeView) -> str | None:
        """The ``about`` tag of the first constraint the node fails, None when it is eligible."""
        if not node.ready:
            return "nodes:not-ready"
        if node.unschedulable and not self.tolerates_cordon:
            return "nodes:unschedulable"
        if node.taints and not all(self.tolerated(taint) for taint in node.taints):
            return "nodes:taint"
        if self._selector:
            labels = node.labels
            if not all(labels.get(key) == value for key, value in self._selector):
                return "nodes:nodeSelector"
        # Before the affinity: a pod mcad created carries a NotIn on the health labels (mcad.k8s.apply), and the
        # label is the better reason to give.
        if node.health and self.sickness(node) is not None:
            return "nodes:health"
        if self._affinity and not any(
            term and all(requirement.matches(node) for requirement in term) for term in self._affinity
        ):
            return "nodes:affinity"
        return None

    def prefers_not(self, node: NodeView) -> bool:
        """Whether a PreferNoSchedule verdict asks the group's pods to avoid ``node`` (used when nothing else fits)."""
        return prefers_not(node, self._requests)

    def sickness(self, node: NodeView) -> Verdict | None:
        """The health verdict that keeps the group's pods off ``node`` (NoSchedule, NoExecute), None if none does."""
        return keeps_off(node, self._requests)

    def tolerated(self, taint: Taint) -> bool:
        return any(toleration.tolerates(taint) for toleration in self._tolerations)


# The order reasons appear in ``why``: room first, since it is what usually frees up.
_REASON_ORDER: Final = ("nodes:not-ready", "nodes:unschedulable", "nodes:taint", "nodes:nodeSelector",
                        "nodes:affinity", "nodes:health")  # a node is counted under its first reason only


def _explain(group: PodGroup, remaining: int, needs: Sequence[tuple[str, int]], eligible: _Eligibility,
             nodes: Sequence[NodeView], left: Mapping[str, ResourceVector],
             free: Mapping[str, ResourceVector]) -> tuple[str, frozenset[str]]:
    """``why`` and ``about`` for the pods of ``group`` left over, judged against the room left after packing."""
    label = group.label or "the AppWrapper"
    if group.count == 1:
        head = f"1 pod of {label} ({_describe(needs)}) fits on no node: "
    else:
        each = f"{_describe(needs)} each" if needs else _describe(needs)
        head = f"{remaining} of {group.count} pods of {label} ({each}) fit on no node: "
    if not nodes:
        return head + "there are no nodes", frozenset({"nodes:none"})
    constraint_counts: Counter[str] = Counter()
    untolerated: set[str] = set()
    sick: dict[str, list[str]] = {}  # what keeps the pods off (the verdict's words) -> the nodes it keeps them off
    short_counts: Counter[str] = Counter()  # nodes without room, by the first resource they lack
    most_free: dict[str, int] = {}  # the most of that resource any of those nodes has
    for node in nodes:
        reason = eligible.reason(node)
        if reason is not None:
            constraint_counts[reason] += 1
            if reason == "nodes:taint":
                untolerated.update(str(t) for t in node.taints if not eligible.tolerated(t))
            elif reason == "nodes:health":
                verdict = eligible.sickness(node)
                assert verdict is not None
                sick.setdefault(verdict.describe(), []).append(node.name)
            continue
        room = left.get(node.name)
        if room is None:
            room = free.get(node.name, node.allocatable)
        for name, amount in needs:
            have = room.get(name, 0)
            if have < amount:
                short_counts[name] += 1
                most_free[name] = max(most_free.get(name, 0), have)
                break
    parts: list[str] = []
    for name in sorted(short_counts, key=_resource_rank):
        count, most = short_counts[name], max(most_free[name], 0)
        if count == 1:
            parts.append(f"1 node has too little {name} free ({format_amount(name, most)})")
        else:
            parts.append(f"{count} nodes have too little {name} free (at most {format_amount(name, most)} on one node)")
    for reason in _REASON_ORDER:
        count = constraint_counts[reason]
        if not count:
            continue
        nodes_text = "1 node" if count == 1 else f"{count} nodes"
        if reason == "nodes:not-ready":
            parts.append(f"{nodes_text} not ready")
        elif reason == "nodes:unschedulable":
            parts.append(f"{nodes_text} unschedulable")
        elif reason == "nodes:taint":
            shown = sorted(untolerated)
            listed = ", ".join(shown[:_TAINTS_SHOWN])
            if len(shown) > _TAINTS_SHOWN:
                listed += f" and {len(shown) - _TAINTS_SHOWN} more"
            parts.append(f"{nodes_text} with taints it does not tolerate ({listed})")
        elif reason == "nodes:nodeSelector":
            parts.append(f"{nodes_text} not matching its nodeSelector")
        elif reason == "nodes:health":
            parts.extend(_sick_nodes(names, why) for why, names in sorted(sick.items()))
        else:
            parts.append(f"{nodes_text} not matching its required node affinity")
    about = frozenset({*constraint_counts, *(f"nodes:{name}" for name in short_counts)})
    return head + ", ".join(parts), about


def _sick_nodes(names: Sequence[str], why: str) -> str:
    """'node gpu-3 is labelled ...', 'nodes gpu-3, gpu-4 and 2 more are labelled ...'."""
    if len(names) == 1:
        return f"node {names[0]} is {why}"
    listed = ", ".join(names[:_TAINTS_SHOWN])
    if len(names) > _TAINTS_SHOWN:
        listed += f" and {len(names) - _TAINTS_SHOWN} more"
    return f"nodes {listed} are {why}"


def _describe(needs: Sequence[tuple[str, int]]) -> str:
    if not needs:
        return "no resource requests"
    ordered = sorted(needs, key=lambda need: (need[0] != "cpu", need[0] != "memory", need[0]))
    return ", ".join(f"{name} {format_amount(name, amount)}" for name, amount in ordered)
