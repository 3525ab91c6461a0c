"""The KubeRay operator of hack/kuberay.py serves the seed's ray.io/v1alpha1 RayCluster on the local cluster.

The seed demo wraps upstream MCAD's ``aw-raycluster.yaml`` verbatim, whose RayCluster is ``ray.io/v1alpha1``:
the pinned KubeRay release must still serve that version, and its operator, running out of cluster, must turn
such a RayCluster into a head pod and a worker pod that kwok runs.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import kubernetes.client as k8s
import yaml

from test.support import REPO, wait_until

NAME = "raycluster-complete"


# The generictemplate of upstream MCAD's aw-raycluster.yaml, the seed demo's input.
SEED_RAYCLUSTER: dict[str, Any] = yaml.safe_load(
    (REPO / "config" / "samples" / "aw-raycluster.yaml").read_text())["spec"]["resources"]["GenericItems"][0][
    "generictemplate"]


def test_raycluster_crd_serves_v1alpha1_and_v1(kuberay_operator: None, api: k8s.ApiClient) -> None:
    crd = k8s.ApiextensionsV1Api(api).read_custom_resource_definition("rayclusters.ray.io")
    versions = {v.name: (v.served, v.storage) for v in crd.spec.versions}
    assert versions == {"v1": (True, True), "v1alpha1": (True, False)}


def test_v1alpha1_raycluster_gets_running_head_and_worker(kuberay_operator: None, namespace: str,
                                                         api: k8s.ApiClient, core: k8s.CoreV1Api) -> None:
    custom = k8s.CustomObjectsApi(api)
    custom.create_namespaced_custom_object("ray.io", "v1alpha1", namespace, "rayclusters",
                                           copy.deepcopy(SEED_RAYCLUSTER))

    def running(node_type: str) -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={NAME},"
                                                                  f"ray.io/node-type={node_type}").items
        return next((p for p in pods if p.status.phase == "Running"), None)

    def explain() -> str:
        # Most likely cause of a timeout: a shared cluster whose node (8 cpu) other workloads have filled.
        lines = []
        for p in core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={NAME}").items:
            sched = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
            lines.append(f"{p.metadata.name}: {p.status.phase} on {p.spec.node_name}"
                         + (f" ({sched.reason}: {sched.message})" if sched and sched.status != "True" else ""))
        return "; ".join(lines) or "no pods"

    try:
        head = wait_until(lambda: running("head"), 90, "a Running head pod")
        worker = wait_until(lambda: running("worker"), 90, "a Running worker pod")
    except AssertionError as err:
        raise AssertionError(f"{err}; the RayCluster's pods: {explain()}") from None

    for pod, cpu, group in ((head, "1", "headgroup"), (worker, "2", "small-group")):
        assert pod.spec.node_name and pod.status.pod_ip, "kwok binds and runs the pod and assigns its IP"
        with contextlib.suppress(k8s.exceptions.ApiException):  # a concurrent test may delete its own node
            assert core.read_node(pod.spec.node_name).metadata.annotations.get("kwok.x-k8s.io/node") == "fake"
        assert pod.metadata.labels["ray.io/group"] == group
        ray = next(c for c in pod.spec.containers if c.name.startswith("ray-"))
        assert ray.resources.requests == {"cpu": cpu, "memory": "2G"}
        owner = pod.metadata.owner_references[0]
        assert (owner.kind, owner.name) == ("RayCluster", NAME)

    # The same object is served as ray.io/v1 (the storage version), with the operator's status on it.
    def ready() -> Any:
        obj = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", NAME)
        status = obj.get("status", {})
        return obj if status.get("state") == "ready" else None

    obj = wait_until(ready, 60, "RayCluster status.state == ready")
    assert obj["apiVersion"] == "ray.io/v1"
    assert obj["status"]["availableWorkerReplicas"] == 1
