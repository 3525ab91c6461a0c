"""Requests counted by the API client (``mcad.k8s.kube``), for metrics: failed ones and the writes sent.

Contract:
- ``RequestCounts``: counts by a key (a tuple of labels), safe across threads; ``snapshot()`` is a copy. One entry
  per distinct key: the keys are verbs, HTTP codes and resources, a handful each.
- ``ApiErrorCounts``: failed requests by Kubernetes verb and HTTP code (0: no response). ``ApiWriteCounts``: writes
  sent (create, update, patch, delete: whatever the answer) by verb and resource.
- ``resource_of(path)``: the resource a request path names, as the API server's own metrics do.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Generic, TypeVar

CountKey = TypeVar("CountKey", bound=tuple[Any, ...])


class RequestCounts(Generic[CountKey]):
    """Requests counted by a key (a tuple of labels), for metrics; safe across threads. One entry per distinct key:
    the keys are verbs, HTTP codes and resources, a handful each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[CountKey] = Counter()

    def add(self, *key: Any) -> None:
        with self._lock:
            self._counts[key] += 1  # type: ignore[index]

    def snapshot(self) -> dict[CountKey, int]:
        with self._lock:
            return dict(self._counts)


# Failed requests by Kubernetes verb and HTTP code (0: no response).
ApiErrorCounts = RequestCounts[tuple[str, int]]
# Writes sent (create, update, patch, delete: whatever the answer) by verb and resource as the API server names it
# (``configmaps``, ``appwrappers.workload.codeflare.dev/status``): where the controller's writes go, counted by the
# controller itself.
ApiWriteCounts = RequestCounts[tuple[str, str]]


def resource_of(path: str) -> str:
    """The resource a request path names, as the API server's own metrics do: ``configmaps``,
    ``appwrappers.workload.codeflare.dev/status``, ``namespaces``."""
    parts = [part for part in path.split("?", 1)[0].split("/") if part]
    core = parts[:1] == ["api"]
    group = "" if core or len(parts) < 2 else parts[1]
    rest = parts[2:] if core else parts[3:]
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]  # a namespaced object's path; "namespaces/<name>" alone is the namespace itself
    if not rest:
        return "unknown"
    name = f"{rest[0]}.{group}" if group else rest[0]
    return f"{name}/{rest[2]}" if len(rest) > 2 else name
