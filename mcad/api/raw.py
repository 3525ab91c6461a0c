"""Reading raw API objects (parsed JSON) defensively: a field of the wrong type reads as empty, never raises.

Views, workload parsing, placement and quota parsing all read user-written objects whose fields may hold anything;
these three accessors are the one way they do it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""
