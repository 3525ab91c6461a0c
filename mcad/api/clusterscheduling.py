"""Which worker clusters an AppWrapper may go to (hub mode): ``spec.schedulingSpec.clusterScheduling``.

Contract:
- ``cluster_scheduling(scheduling)`` parses the stanza (upstream MCAD's field names)::

      clusterScheduling:
        clusters: [{name: east}, {name: west}]     # any of these workers
        clusterSelector:                           # a metav1.LabelSelector over the workers' config labels
          matchLabels: {gpu: a100}
          matchExpressions: [{key: region, operator: In, values: [us-east, us-west]}]

  It never raises: what cannot be understood is kept as ``error`` (the AppWrapper then fits nowhere, and its
  Backoff message says why) instead of being read as "anywhere".
- ``ClusterScheduling.allows(name, labels)``: both parts must hold when both are given; an absent stanza allows
  every worker. A LabelSelector with neither part selects everything (as in Kubernetes).
- Operators are Kubernetes': In, NotIn, Exists, DoesNotExist (NotIn and DoesNotExist match a missing key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcad.api.raw import as_list, as_mapping
from mcad.api.selectors import LABEL_OPERATORS, label_matches


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return label_matches(self.operator, self.values, labels.get(self.key))

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{'!' if self.operator == 'DoesNotExist' else ''}{self.key}"
        return f"{self.key} {'in' if self.operator == 'In' else 'notin'} ({','.join(self.values)})"


@dataclass(frozen=True, slots=True)
class ClusterScheduling:
    clusters: tuple[str, ...] = ()
    selector: tuple[Requirement, ...] | None = None  # None: no clusterSelector given
    error: str = ""

    @property
    def constrained(self) -> bool:
        return bool(self.clusters) or self.selector is not None or bool(self.error)

    def allows(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.error:
            return False
        if self.clusters and name not in self.clusters:
            return False
        return self.selector is None or all(r.matches(labels) for r in self.selector)

    def describe(self) -> str:
        """For messages: what it asks for."""
        if self.error:
            return f"clusterScheduling is invalid: {self.error}"
        parts = []
        if self.clusters:
            parts.append(f"clusters {', '.join(self.clusters)}")
        if self.selector:
            parts.append(f"clusterSelector {', '.join(str(r) for r in self.selector)}")
        return " and ".join(parts) or "any cluster"


ANYWHERE = ClusterScheduling()


def cluster_scheduling(scheduling: Mapping[str, Any]) -> ClusterScheduling:
    raw = scheduling.get("clusterScheduling")
    if raw is None:
        return ANYWHERE
    if not isinstance(raw, Mapping):
        return ClusterScheduling(error="clusterScheduling must be an object")
    clusters = raw.get("clusters")
    if clusters is not None and not isinstance(clusters, list):
        return ClusterScheduling(error="clusters must be a list of {name: ...}")
    names = []
    for index, ref in enumerate(as_list(clusters)):
        name = as_mapping(ref).get("name")
        if not isinstance(name, str) or not name:
            return ClusterScheduling(error=f"clusters[{index}].name must be a non-empty string")
        names.append(name)
    selector_raw = raw.get("clusterSelector")
    if selector_raw is None:
        return ClusterScheduling(clusters=tuple(names))
    try:
        selector = _selector(selector_raw)
    except ValueError as err:
        return ClusterScheduling(clusters=tuple(names), error=f"clusterSelector: {err}")
    return ClusterScheduling(clusters=tuple(names), selector=selector)


def _selector(raw: Any) -> tuple[Requirement, ...]:
    if not isinstance(raw, Mapping):
        raise ValueError("must be an object with matchLabels and/or matchExpressions")
    match_labels, expressions = raw.get("matchLabels"), raw.get("matchExpressions")
    if match_labels is not None and not isinstance(match_labels, Mapping):
        raise ValueError("matchLabels must be an object of label: value")
    if expressions is not None and not isinstance(expressions, list):
        raise ValueError("matchExpressions must be a list")
    out = []
    for label, value in as_mapping(match_labels).items():
        if not isinstance(value, str):
            raise ValueError(f"matchLabels[{label}] must be a string")
        out.append(Requirement(str(label), "In", (value,)))
    for index, expr in enumerate(as_list(expressions)):
        fields = as_mapping(expr)
        key, operator = fields.get("key"), fields.get("operator")
        values = as_list(fields.get("values"))
        where = f"matchExpressions[{index}]"
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}.key must be a non-empty string")
        if operator not in LABEL_OPERATORS:
            raise ValueError(f"{where}.operator must be one of {', '.join(LABEL_OPERATORS)}, not {operator!r}")
        if not all(isinstance(v, str) for v in values):
            raise ValueError(f"{where}.values must be strings")
        if operator in ("In", "NotIn") and not values:
            raise ValueError(f"{where}: {operator} needs values")
        if operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"{where}: {operator} takes no values")
        out.append(Requirement(key, str(operator), tuple(str(v) for v in values)))
    return tuple(out)
