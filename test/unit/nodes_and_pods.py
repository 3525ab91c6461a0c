"""Raw Node and Pod objects shaped as the API server sends them, and their views, for the view and ledger tests."""

from __future__ import annotations

from typing import Any

from mcad.api.resources import ResourceVector
from mcad.api.views import APPWRAPPER_LABEL, NodeView, PodView, node_view, pod_view

GI = 2**30


def v(**amounts: int) -> ResourceVector:
    return ResourceVector({("nvidia.com/gpu" if k == "gpu" else k): a for k, a in amounts.items()})


def raw_node(name: str, cpu: str = "4", memory: str = "16Gi", gpu: int = 0, *, ready: bool = True,
             unschedulable: bool | None = None, taints: list[dict[str, str]] | None = None,
             rv: str = "1") -> dict[str, Any]:
    allocatable: dict[str, Any] = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpu:
        allocatable["nvidia.com/gpu"] = str(gpu)
    spec: dict[str, Any] = {}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if taints is not None:
        spec["taints"] = taints
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": rv},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [{"type": "MemoryPressure", "status": "False"},
                           {"type": "Ready", "status": "True" if ready else "Unknown"}],
        },
    }


def node(name: str, cpu: str = "4", memory: str = "16Gi", gpu: int = 0, **kw: Any) -> NodeView:
    return node_view(raw_node(name, cpu, memory, gpu, **kw))


def raw_pod(uid: str, *, cpu: str = "1", memory: str = "1Gi", node_name: str | None = None,
            phase: str = "Pending", aw: str | None = None, namespace: str = "ns",
            deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"pod-{uid}", "namespace": namespace, "uid": uid, "resourceVersion": "7"}
    if aw is not None:
        meta["labels"] = {APPWRAPPER_LABEL: aw, "app": "x"}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def pod(uid: str, **kw: Any) -> PodView:
    return pod_view(raw_pod(uid, **kw))


def running(uid: str, node_name: str = "n1", phase: str = "Running", **kw: Any) -> PodView:
    """A pod bound to ``node_name`` (by default still running)."""
    return pod(uid, node_name=node_name, phase=phase, **kw)
