"""The KubeRay operator of hack/kuberay.py serves the seed's ray.io/v1alpha1 RayCluster on the local cluster.

The seed demo wraps upstream MCAD's ``aw-raycluster.yaml`` verbatim, whose RayCluster is ``ray.io/v1alpha1``:
the pinned KubeRay release must still serve that version, and its operator, running out of cluster, must turn
such a RayCluster into a head pod and a worker pod that kwok runs.
"""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from test.support import REPO, wait_until

NAME = "raycluster-complete"


def kuberay(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "hack" / "kuberay.py"), "--kubeconfig", kubeconfig, *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def operator(kubeconfig: str) -> Iterator[None]:
    # Leave an operator that someone else started (on the shared default cluster) running afterwards.
    started_here = kuberay(kubeconfig, "status").returncode != 0
    proc = kuberay(kubeconfig, "up")
    assert proc.returncode == 0, f"hack/kuberay.py up failed:\n{proc.stderr}"
    try:
        yield
    finally:
        if started_here:
            kuberay(kubeconfig, "down")


def container(name: str, cpu: str, memory: str, ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": "quay.io/project-codeflare/ray:2.5.0-py38-cu116",
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
        "volumeMounts": [{"mountPath": "/tmp/ray", "name": "ray-logs"}],
        "resources": {"limits": {"cpu": cpu, "memory": memory}, "requests": {"cpu": cpu, "memory": memory}},
    }
    if ports:
        c["ports"] = ports
    return c


# The generictemplate of upstream MCAD's doc/usage/examples/kuberay/config/aw-raycluster.yaml.
SEED_RAYCLUSTER: dict[str, Any] = {
    "apiVersion": "ray.io/v1alpha1",
    "kind": "RayCluster",
    "metadata": {"labels": {"controller-tools.k8s.io": "1.0"}, "name": NAME},
    "spec": {
        "rayVersion": "2.5.0",
        "headGroupSpec": {
            "serviceType": "ClusterIP",
            "rayStartParams": {"dashboard-host": "0.0.0.0"},
            "template": {
                "metadata": {"labels": {}},
                "spec": {
                    "containers": [container("ray-head", "1", "2G", [
                        {"containerPort": 6379, "name": "gcs"},
                        {"containerPort": 8265, "name": "dashboard"},
                        {"containerPort": 10001, "name": "client"},
                    ])],
                    "volumes": [{"name": "ray-logs", "emptyDir": {}}],
                },
            },
        },
        "workerGroupSpecs": [{
            "replicas": 1,
            "minReplicas": 1,
            "maxReplicas": 1,
            "groupName": "small-group",
            "rayStartParams": {},
            "template": {
                "spec": {
                    "containers": [container("ray-worker", "2", "2G")],
                    "volumes": [{"name": "ray-logs", "emptyDir": {}}],
                },
            },
        }],
    },
}


def test_raycluster_crd_serves_v1alpha1_and_v1(operator: None, api: k8s.ApiClient) -> None:
    crd = k8s.ApiextensionsV1Api(api).read_custom_resource_definition("rayclusters.ray.io")
    versions = {v.name: (v.served, v.storage) for v in crd.spec.versions}
    assert versions == {"v1": (True, True), "v1alpha1": (True, False)}


def test_v1alpha1_raycluster_gets_running_head_and_worker(operator: None, namespace: str,
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
