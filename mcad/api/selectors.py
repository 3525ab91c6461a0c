"""Kubernetes label requirements: the one rule by which ``In``, ``NotIn``, ``Exists`` and ``DoesNotExist`` match a
label, shared by node affinity (``mcad.model.placement``) and clusterSelector (``mcad.api.clusterscheduling``).

Contract: ``label_matches(operator, values, value)`` takes the label's value, ``None`` when the label is absent.
An absent label is in no set, so ``NotIn`` and ``DoesNotExist`` match it. Any other operator matches nothing
(callers that know more, such as node affinity's ``Gt``/``Lt``, handle it before).
"""

from __future__ import annotations

from collections.abc import Collection

LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def label_matches(operator: str, values: Collection[str], value: str | None) -> bool:
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    return False
