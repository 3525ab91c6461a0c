"""``mcadctl ledger --topology``: the ledger document's room added up per domain of each topology level. Pure.

Contract:
- A level is a node label key, a domain of it the nodes sharing one value of that label (``mcad.model.topology``);
  the ledger document names, per node, its value of each configured level (``topology``) and the configured
  levels (``topologyLevels``, ``mcad.serve.debug``).
- ``domains(doc, levels)``: a JSON-ready document with the ledger's ``controller`` and ``generatedAt``, the
  ``resources`` counted (those of ``RESOURCES`` some node has allocatable, in that order) and, for each of
  ``levels`` in the order given, its ``domains`` sorted by value (in hub mode by worker cluster first: domains are
  per worker, ``mcad.hub.placement``) and ``none``, the nodes that carry no label of that level. Each entry has
  ``nodes`` (how many), ``schedulable`` (how many of them are Ready and schedulable) and ``capacity``, ``used``,
  ``planned`` and ``free``: the node rows' amounts added up over its schedulable nodes, as the ledger's totals
  count them (the room a dispatch can use).
- ``lines(document)``: the controller's line, then per level a line naming it and how many domains it has and how
  many nodes are in none, and a table DOMAIN NODES RESOURCE CAPACITY USED PLANNED FREE (CLUSTER first in hub mode),
  one row per domain and resource, the nodes in no domain last as ``(none)`` (no label value has parentheses);
  NODES is schedulable/all.
- The documents come from another process, maybe of another version: a missing field counts as nothing, an amount
  that does not parse is left out, and nothing here raises on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcad.api.resources import ResourceVector, canonical_entries, format_amount
from mcad.cli.render import controller_line, table

RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
NONE = "(none)"
_PARTS = ("capacity", "used", "planned", "free")


def domains(doc: Mapping[str, Any], levels: Sequence[str]) -> dict[str, Any]:
    """Each level's domains and their room (see the module docstring)."""
    nodes = [node for node in doc.get("nodes") or [] if isinstance(node, Mapping)]
    resources = [name for name in RESOURCES if any(name in _mapping(node.get("allocatable")) for node in nodes)]
    hub = any(node.get("cluster") for node in nodes)
    grouped = []
    for level in levels:
        found: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        outside: list[Mapping[str, Any]] = []
        for node in nodes:
            value = _mapping(node.get("topology")).get(level)
            if isinstance(value, str):
                found.setdefault((str(node.get("cluster") or "") if hub else "", value), []).append(node)
            else:
                outside.append(node)
        grouped.append({"level": level,
                        "domains": [{"cluster": cluster, "value": value, **_added(members, resources)}
                                    for (cluster, value), members in sorted(found.items())],
                        "none": _added(outside, resources)})
    return {"controller": doc.get("controller"), "generatedAt": doc.get("generatedAt"), "hub": hub,
            "resources": resources, "levels": grouped}


def lines(document: Mapping[str, Any]) -> list[str]:
    """The tables of a ``domains`` document (see the module docstring)."""
    hub = bool(document.get("hub"))
    resources = [str(name) for name in document.get("resources") or []]
    out = [controller_line(document)]
    for level in document.get("levels") or []:
        found = [d for d in level.get("domains") or [] if isinstance(d, Mapping)]
        none = _mapping(level.get("none"))
        outside = int(none.get("nodes") or 0)
        out += ["", f"LEVEL {level.get('level')}: {len(found)} domain(s); "
                    + (f"{outside} node(s) in none" if outside else "every node is in one")]
        entries = [(str(d.get("cluster") or "-"), str(d.get("value")), d) for d in found]
        if outside:
            entries.append(("-", NONE, none))
        if not entries:
            out.append("No nodes.")
            continue
        rows = []
        for cluster, value, entry in entries:
            for name in resources or ["cpu"]:
                row = [value, f"{entry.get('schedulable', 0)}/{entry.get('nodes', 0)}", name,
                       *(str(_mapping(entry.get(part)).get(name, "0")) for part in _PARTS)]
                rows.append([cluster, *row] if hub else row)
        headers = ["DOMAIN", "NODES", "RESOURCE", "CAPACITY", "USED", "PLANNED", "FREE"]
        out += table(["CLUSTER", *headers] if hub else headers, rows)
    out += ["", "(NODES: schedulable/all; CAPACITY, USED, PLANNED and FREE add up the schedulable nodes)"]
    return out


def _added(members: Sequence[Mapping[str, Any]], resources: Sequence[str]) -> dict[str, Any]:
    counted = [node for node in members if node.get("schedulable", True) and node.get("ready", True)]
    sums = {part: ResourceVector() for part in _PARTS}
    for node in counted:
        for part in _PARTS:
            given = _mapping(node.get("allocatable" if part == "capacity" else part))
            sums[part] = sums[part] + ResourceVector(
                {name: amount for name, _, amount in canonical_entries(given) if name in resources})
    return {"nodes": len(members), "schedulable": len(counted),
            **{part: {name: format_amount(name, sums[part].get(name)) for name in resources} for part in _PARTS}}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
