"""Topology-required gangs: every pod of an AppWrapper in one domain of a node label (a rack, a block, a zone).

Contract:
- ``required_level(aw)`` is the node label key of the AppWrapper annotation
  ``mcad.codeflare.dev/topology-required`` (``AppWrapperView.topology_required``; "" when it has none): all its pods
  must go on nodes that share one value of that label (one domain). A node without the label is in no domain and
  never takes such a gang's pods.
- ``domains(nodes, level)``: the nodes of each domain, by the label's value in sorted order (so ties are broken
  the same way every time).
- ``place(aw, nodes, room, level)``: the gang packed (``mcad.model.placement.pack``) into each domain alone; among
  the domains where the whole gang fits, the one it leaves the least free room in (best fit: large domains stay
  whole for large gangs), measured in the gang's scarcest resource (GPUs, else cpu, else memory), then the domain's
  value. When none fits, a ``Packing`` that says so: the level, how many domains there are, and why the first of
  them (by value) could not take the gang.
- Pure: reads the views and the room it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.api.views import NodeView
from mcad.model import placement


def required_level(aw: AppWrapperView) -> str:
    return aw.topology_required


def domains(nodes: Sequence[NodeView], level: str) -> list[tuple[str, list[NodeView]]]:
    """(label value, its nodes) for each domain of ``level``, by value; nodes without the label are left out."""
    found: dict[str, list[NodeView]] = {}
    for node in nodes:
        value = node.labels.get(level)
        if value is not None:
            found.setdefault(value, []).append(node)
    return sorted(found.items())


def place(aw: AppWrapperView, nodes: Sequence[NodeView], room: Mapping[str, ResourceVector],
          level: str) -> tuple[str, placement.Packing]:
    """(the domain chosen, the gang's packing there); ("", a Packing that does not fit) when no domain takes it."""
    scarcest = scarcest_resource(aw.demand)
    best: tuple[float, str, placement.Packing] | None = None
    first_refusal: tuple[str, placement.Packing] | None = None  # the first domain that could not, for why
    every = domains(nodes, level)
    for value, members in every:
        packing = placement.pack(aw.gang, members, room)
        if packing.fits:
            free = sum(room.get(node.name, node.allocatable).get(scarcest) for node in members)
            left = free - aw.demand.get(scarcest)
            if best is None or (left, value) < (best[0], best[1]):
                best = (left, value, packing)
        elif first_refusal is None:
            first_refusal = (value, packing)
    if best is not None:
        return best[1], best[2]
    pods = sum(group.count for group in aw.gang)
    if not every:
        why = f"its {pods} pod(s) must share one {level} and no node has that label"
    else:
        where = f" ({first_refusal[0]}: {first_refusal[1].why})" if first_refusal and first_refusal[1].why else ""
        why = f"its {pods} pod(s) must share one {level}, and none of the {len(every)} fits them all{where}"
    return "", placement.Packing(False, why=why, about=frozenset({f"topology:{level}"}))


def scarcest_resource(demand: ResourceVector) -> str:
    """The resource a gang is placed by: GPUs if it asks for any, else cpu, else memory."""
    for name in (placement.GPU, "cpu", "memory"):
        if demand.get(name) > 0:
            return name
    return "cpu"
