"""Where a reader's AppWrappers stand among everyone's, told without naming what it may not see: what is ahead of
them in the queue and how its tenants' fair-share usage compares with the others'. Pure.

Contract:
- A reader's ``mine`` are the namespaces whose AppWrappers it may list; ``names`` those it may see named (None:
  every one, a reader with cluster-wide rights; else ``mine``). Of the rest it is told counts only: how many
  AppWrappers, how many namespaces or tenants, the counts per one of them (largest first, at most ``MAX_LISTED``,
  so the order names nobody) and a distribution of usage. Never a namespace's name, an AppWrapper's, or a quota
  node's that no AppWrapper of ``names`` was dispatched under (see docs/security.md).
- ``ahead(orders, mine, names, queued_in)``: for each namespace of ``mine`` that has queued AppWrappers (at most
  ``MAX_AHEAD``, those nearest the head first) its first queued AppWrapper, that one's position in the whole queue
  and the AppWrappers ahead of it: by namespace for those of ``names`` (``named``: the ``MAX_LISTED`` with the
  most), else ``others``: how many, in how many namespaces, and the count of each (anonymised, largest first).
  The unit is the namespace, the unit of AppWrapper rights. ``orders`` are the queue's in dispatch order
  (``mcad.model.pending.Order``, the key last), as positions count them. One walk of them up to the last of those
  first AppWrappers: O(that position + MAX_AHEAD x namespaces ahead), never the whole queue unless the reader's
  first one is last.
- ``FairUsage``: fair sharing's usage per tenant (share-seconds, decayed: ``mcad.model.fairshare``), its
  half-life, and per quota tenant (``quota:<tree>/<node>``) the namespaces whose AppWrappers were dispatched under
  it while it had usage. A ``namespace:<name>`` tenant is its namespace's.
- ``FairTable(usage)`` ranks the tenants once (O(tenants log tenants)); ``told(names)`` is what a reader is told in
  O(tenants): ``named``, the tenants it may see (a namespace tenant of ``names``, a quota tenant one of ``names``'s
  AppWrappers was dispatched under), each with its usage, its ``fraction`` of all tenants' usage and its ``rank``
  (1: the least used, which goes first among AppWrappers of equal priority); and ``others``: how many other
  tenants have usage and the least, median and most of their fractions. ``off()`` when fair sharing is off.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_AHEAD = 10  # namespaces of one reader whose first queued AppWrapper is described
MAX_LISTED = 20  # namespaces named, and counts of other namespaces listed (the largest); the rest are in the totals

Order = tuple[int, str, str]  # mcad.model.pending.Order: (-priority, creation time, namespace/name)
NAMESPACE_TENANT = "namespace:"


def _namespace(key: str) -> str:
    return key.partition("/")[0]


def _named(names: frozenset[str] | None, namespace: str) -> bool:
    return names is None or namespace in names


def ahead(orders: Sequence[Order], mine: Iterable[str], names: frozenset[str] | None,
          queued_in: Mapping[str, int]) -> list[dict[str, Any]]:
    """What is ahead of the first queued AppWrapper of each namespace of ``mine`` (see the module docstring)."""
    wanted = {namespace for namespace in mine if queued_in.get(namespace)}
    found: list[dict[str, Any]] = []
    seen: dict[str, int] = {}  # namespace -> its AppWrappers passed so far
    if not wanted:
        return found
    for index, order in enumerate(orders):
        key = order[2]
        namespace = _namespace(key)
        if namespace in wanted:
            wanted.discard(namespace)
            found.append(_ahead_of(key, index, seen, names))
            if not wanted or len(found) == MAX_AHEAD:
                break
        seen[namespace] = seen.get(namespace, 0) + 1
    return found


def _ahead_of(key: str, index: int, seen: Mapping[str, int], names: frozenset[str] | None) -> dict[str, Any]:
    shown = sorted(((n, namespace) for namespace, n in seen.items() if _named(names, namespace)),
                   key=lambda item: (-item[0], item[1]))
    named = dict(sorted((namespace, n) for n, namespace in shown[:MAX_LISTED]))
    counts = sorted([n for namespace, n in seen.items() if not _named(names, namespace)]
                    + [n for n, _ in shown[MAX_LISTED:]], reverse=True)
    namespace, _, name = key.partition("/")
    return {"namespace": namespace, "name": name, "position": index + 1, "ahead": index, "named": named,
            "others": {"appwrappers": sum(counts), "namespaces": len(counts), "counts": counts[:MAX_LISTED]}}


@dataclass(frozen=True)
class FairUsage:
    half_life: float
    usage: Mapping[str, float]  # tenant -> share-seconds now
    dispatched_from: Mapping[str, frozenset[str]] = field(default_factory=dict)  # quota tenant -> namespaces


def off() -> dict[str, Any]:
    return {"enabled": False}


class FairTable:
    """The tenants ranked once; what each reader is told (see the module docstring)."""

    def __init__(self, fair: FairUsage) -> None:
        self.fair = fair
        self.total = sum(fair.usage.values())
        ranked: list[tuple[str, float, int]] = []
        for index, (tenant, amount) in enumerate(sorted(fair.usage.items(), key=lambda item: (item[1], item[0]))):
            rank = index + 1 if not ranked or amount > ranked[-1][1] else ranked[-1][2]  # ties share a rank
            ranked.append((tenant, amount, rank))
        self.ranked = ranked

    def _fraction(self, amount: float) -> float:
        return round(amount / self.total, 4) if self.total > 0 else 0.0

    def _may_see(self, names: frozenset[str] | None, tenant: str) -> bool:
        if names is None:
            return True
        if tenant.startswith(NAMESPACE_TENANT):
            return tenant.removeprefix(NAMESPACE_TENANT) in names
        return not names.isdisjoint(self.fair.dispatched_from.get(tenant, ()))

    def told(self, names: frozenset[str] | None) -> dict[str, Any]:
        named, others = [], []
        for tenant, amount, rank in self.ranked:
            if self._may_see(names, tenant):
                named.append({"tenant": tenant, "usage": round(amount, 3), "fraction": self._fraction(amount),
                              "rank": rank})
            else:
                others.append(self._fraction(amount))
        return {"enabled": True, "halfLifeSeconds": self.fair.half_life, "tenants": len(self.ranked),
                "named": named,
                "others": {"tenants": len(others), "leastFraction": others[0] if others else None,
                           "medianFraction": round(statistics.median(others), 4) if others else None,
                           "mostFraction": others[-1] if others else None}}
