"""Sick nodes: node labels that keep pods of a resource off a node, or away from it. Pure.

Contract:
- A ``Rule`` says: a node whose label ``label`` has the value ``value`` is, for pods that request ``resource``
  (``nvidia.com/gpu`` by default), ``PreferNoSchedule`` (used only when nothing else fits), ``NoSchedule`` (never
  planned, placed or pinned there) or ``NoExecute`` (as NoSchedule, and a running AppWrapper with such pods there is
  reset onto other nodes without counting a retry). The effects are named as taint effects, whose meaning they have.
- ``DEFAULT_RULES`` are Autopilot's health checks (IBM's GPU node health checker, label
  ``autopilot.ibm.com/gpuhealth``): WARN prefer-not, TESTING no-schedule, EVICT no-execute, for GPU pods.
- ``parse_rule("nvidia.com/gpu:autopilot.ibm.com/gpuhealth=EVICT:NoExecute")`` reads one rule as the controller's
  ``--node-health-rule`` flag writes it (ValueError saying what is wrong).
- ``NodeHealth(rules).verdict(labels, requests)``: the strongest rule that applies to a pod of ``requests`` on a
  node with ``labels`` (NoExecute over NoSchedule over PreferNoSchedule), or None. A pod that requests none of the
  rules' resources is never affected.
- ``NodeHealth.marks(labels)``: what the rules say of a node, for pods of any resource: one ``Verdict`` per rule
  whose label the node carries with the rule's value (empty for a healthy node, the common case). The accountant
  computes it once per node event and keeps it on the node's view (``NodeView.health``), so decisions over many
  pods read the node's marks, never the rules: ``verdict_for(marks, requests)`` is the strongest of them that
  applies to a pod of ``requests`` (the same answer as ``verdict``), and costs nothing for a healthy node.
- ``NodeHealth.keep_off(requests)``: the (label, values) pairs a pod of ``requests`` must avoid (its NoSchedule and
  NoExecute rules), for the node affinity ``mcad.k8s.apply`` gives such pods so the kube-scheduler avoids them too.
- A rule's ``Effect`` and the ``Verdict`` it gives a node live with the node's view (``mcad.api.nodemarks``):
  ``NodeView.health`` carries them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mcad.api.nodemarks import Effect, Verdict
from mcad.api.resources import ResourceVector

GPU = "nvidia.com/gpu"
AUTOPILOT_LABEL = "autopilot.ibm.com/gpuhealth"


@dataclass(frozen=True, slots=True)
class Rule:
    resource: str
    label: str
    value: str
    effect: Effect

    def __str__(self) -> str:
        return f"{self.resource}:{self.label}={self.value}:{self.effect}"


DEFAULT_RULES = (
    Rule(GPU, AUTOPILOT_LABEL, "WARN", Effect.PREFER_NOT),
    Rule(GPU, AUTOPILOT_LABEL, "TESTING", Effect.NO_SCHEDULE),
    Rule(GPU, AUTOPILOT_LABEL, "EVICT", Effect.NO_EXECUTE),
)

# A resource name, a label key (optionally prefixed) and a label value, as Kubernetes allows them.
_NAME = r"(?:[A-Za-z0-9.\-]+/)?[A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?)?"
_RULE = re.compile(rf"(?P<resource>{_NAME}):(?P<label>{_NAME})=(?P<value>{_VALUE}):(?P<effect>[A-Za-z]+)")


def parse_rule(text: str) -> Rule:
    match = _RULE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not RESOURCE:LABEL=VALUE:EFFECT "
                         f"(e.g. {GPU}:{AUTOPILOT_LABEL}=EVICT:NoExecute)")
    try:
        effect = Effect(match.group("effect"))
    except ValueError:
        raise ValueError(f"{text!r}: the effect must be one of {', '.join(e.value for e in Effect)}") from None
    return Rule(match.group("resource"), match.group("label"), match.group("value"), effect)


class NodeHealth:
    def __init__(self, rules: Iterable[Rule] = DEFAULT_RULES) -> None:
        self.rules = tuple(rules)

    def verdict(self, labels: Mapping[str, str], requests: ResourceVector) -> Verdict | None:
        return verdict_for(self.marks(labels), requests)

    def keep_off(self, requests: ResourceVector) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(label, values) of the NoSchedule and NoExecute rules that apply to a pod of ``requests``: it must not
        run on a node whose ``label`` has one of ``values``. Labels in their first rule's order."""
        found: dict[str, list[str]] = {}
        for rule in self.rules:
            if rule.effect.keeps_off and requests.get(rule.resource) > 0:
                values = found.setdefault(rule.label, [])
                if rule.value not in values:
                    values.append(rule.value)
        return tuple((label, tuple(values)) for label, values in found.items())

    def marks(self, labels: Mapping[str, str]) -> tuple[Verdict, ...]:
        """One verdict per rule whose label the node carries with the rule's value, in the rules' order."""
        if not self.rules:
            return ()
        return tuple(Verdict(rule.effect, rule.label, rule.value, rule.resource) for rule in self.rules
                     if labels.get(rule.label) == rule.value)


def verdict_for(marks: Iterable[Verdict], requests: ResourceVector) -> Verdict | None:
    """The strongest of a node's ``marks`` that applies to a pod of ``requests`` (None: the node is healthy for
    it); on a tie the first (the rules' order)."""
    found: Verdict | None = None
    for mark in marks:
        if requests.get(mark.resource) <= 0:
            continue
        if found is None or mark.effect.strength > found.effect.strength:
            found = mark
    return found


NO_RULES = NodeHealth(())
