"""What a namespace's admin decides for the AppWrappers in it: the quota node it charges and the priority ceiling.

Placeholder of issue 15 (the rules land with it). Admission (``mcad.admission.review``) calls:
- ``admission_problems(aw, facts, default_ceiling)``: refusals (quota label naming a node the namespace is not
  bound to, priority above the namespace's ceiling or an unknown priorityClassName, declared demand below the
  demand inferred from the templates), each a message a person can act on;
- ``admission_patch(aw, facts)``: JSON patch operations that set the quota labels bound to the namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcad.admission.facts import Facts


def admission_problems(aw: Mapping[str, Any], facts: Facts, default_ceiling: int) -> list[str]:
    return []


def admission_patch(aw: Mapping[str, Any], facts: Facts) -> list[dict[str, Any]]:
    return []
