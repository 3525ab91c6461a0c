"""The JSON patch that ungates a pod mcad pins, and how to read a pinned pod's constraints without the pin. Pure.

Contract (``mcad.loop.pinning`` pins; this is the shape of what it writes):
- ``ungate_patch(uid, pin, node)`` removes mcad's scheduling gate (``PLACEMENT_GATE``) from a pod and, with a
  ``node``, requires that node by name (``metadata.name In [node]`` in its required node affinity). It first tests
  the pod's uid and its gates (and the node selector terms it narrows) as ``pin`` saw them, so a pod re-created
  under the name, or changed since, is refused by the API server instead of patched blind. A gated pod's required
  node affinity may be narrowed (Kubernetes >= 1.30: terms may gain requirements), never widened, so every existing
  term gets the node requirement; a pod without one gets a term of its own. Without a ``node`` it only ungates.
- ``without_pin(group, node)``: a pinned pod's constraints less the requirement ``ungate_patch`` added, so a pod
  pinned to a node that refused it can be judged against other nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mcad.api.podgroups import NodeRequirement, PodGroup
from mcad.api.views import NODE_NAME_FIELD, PLACEMENT_GATE, PinFacts

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_TERMS_PATH = f"/spec/affinity/nodeAffinity/{_REQUIRED}/nodeSelectorTerms"


def ungate_patch(uid: str, pin: PinFacts, node: str) -> list[dict[str, Any]]:
    """The JSON patch that removes mcad's gate from a pod and, with ``node``, requires that node by name.

    It first tests the pod's uid and its gates (and the node selector terms it narrows) as ``pin`` saw them, so a
    pod re-created under the name, or changed since, is refused by the API server instead of patched blind. A gated
    pod's required node affinity may be narrowed (Kubernetes >= 1.30: terms may gain requirements), so every
    existing term gets the node requirement; a pod without one gets a term of its own."""
    gates = [{"name": gate} for gate in pin.gates]
    rest = [gate for gate in gates if gate["name"] != PLACEMENT_GATE]
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/spec/schedulingGates", "value": gates},
        {"op": "replace", "path": "/spec/schedulingGates", "value": rest} if rest
        else {"op": "remove", "path": "/spec/schedulingGates"},
    ]
    if not node:
        return ops
    requirement = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
    only_term = {"nodeSelectorTerms": [{"matchFields": [requirement]}]}
    if pin.affinity_depth == 0:
        ops.append({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {_REQUIRED: only_term}}})
    elif pin.affinity_depth == 1:
        ops.append({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {_REQUIRED: only_term}})
    elif pin.affinity_depth == 2 or not pin.node_terms:
        ops.append({"op": "add", "path": f"/spec/affinity/nodeAffinity/{_REQUIRED}", "value": only_term})
    else:
        terms = [dict(term) if isinstance(term, Mapping) else {} for term in pin.node_terms]
        narrowed = [{**term, "matchFields": [*(term.get("matchFields") or []), requirement]} for term in terms]
        ops += [{"op": "test", "path": _TERMS_PATH, "value": list(pin.node_terms)},
                {"op": "replace", "path": _TERMS_PATH, "value": narrowed}]
    return ops


def without_pin(group: PodGroup, node: str) -> PodGroup:
    """A pinned pod's constraints less the requirement ``ungate_patch`` added (``metadata.name In [node]``)."""
    pin = NodeRequirement(NODE_NAME_FIELD, "In", (node,), field=True)
    terms = tuple(tuple(requirement for requirement in term if requirement != pin) for term in group.required_affinity)
    # A term that held only the pin was added whole by the patch: the pod had no required node affinity before.
    return dataclasses.replace(group, required_affinity=tuple(term for term in terms if term))
