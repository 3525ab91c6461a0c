"""The seed RayCluster demo: upstream MCAD's aw-raycluster.yaml and aw-raycluster-1.yaml, verbatim, with the
real KubeRay operator. The first RayCluster gets its head and worker pods; the second waits as an AppWrapper
only: no RayCluster object, no pods. Deleting the first lets the second run.

The seed's KinD node had room for one of them; here the free cpu is first filled down to 4 cores (each
RayCluster needs 3), so exactly one fits whatever the size of the test cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest
import yaml

from test.e2e.conftest import (
    GROUP,
    PLURAL,
    VERSION,
    AppWrappers,
    Controller,
    appwrapper,
    blocked_on,
    deployment_item,
    free_cpu_millis,
)
from test.e2e.test_placement import pinned_node
from test.support import REPO, wait_until

SAMPLES = REPO / "config" / "samples"


@pytest.fixture
def default_aws(custom: k8s.CustomObjectsApi, core: k8s.CoreV1Api, kubeconfig: str) -> Iterator[AppWrappers]:
    from mcad.k8s import kube
    aws = AppWrappers(custom, core, "default", kube.connect(kubeconfig))
    yield aws
    for name in ("raycluster-complete", "raycluster-complete-1"):
        try:
            aws.delete(name)
        except k8s.exceptions.ApiException as err:
            if err.status != 404:
                raise
    wait_until(lambda: not [p for n in ("raycluster-complete", "raycluster-complete-1") for p in aws.pods(n)],
               90, "the RayCluster pods to go away")


def raycluster_pods(aws: AppWrappers, name: str) -> list[Any]:
    return [p for p in aws.core.list_namespaced_pod(aws.namespace, label_selector=f"ray.io/cluster={name}").items
            if p.status.phase == "Running"]


def test_second_raycluster_is_queued_without_pods_until_the_first_goes(
        kuberay_operator: None, controller: Controller, aws: AppWrappers, default_aws: AppWrappers,
        core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi) -> None:
    filler = free_cpu_millis(core) - 4000
    assert filler >= 0, "the test cluster needs at least 4 free cpu"
    if filler:
        aws.create(appwrapper("filler", deployment_item("filler", 1, f"{filler}m")))
        aws.wait_pods("filler", 1)

    first = yaml.safe_load((SAMPLES / "aw-raycluster.yaml").read_text())
    second = yaml.safe_load((SAMPLES / "aw-raycluster-1.yaml").read_text())
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, first)
    running = default_aws.wait_state("raycluster-complete", "Running")
    assert [c["type"] for c in running["conditions"]][:4] == ["Init", "Queueing", "HeadOfLine", "Dispatched"]
    def both_running() -> list[Any] | None:
        pods = raycluster_pods(default_aws, "raycluster-complete")
        return pods if len(pods) == 2 else None

    head_and_worker = wait_until(both_running, 90, "head and worker pods Running")
    assert sorted(p.metadata.labels["ray.io/node-type"] for p in head_and_worker) == ["head", "worker"]
    for pod in head_and_worker:  # mcad's label reached the pods through the RayCluster's templates
        assert pod.metadata.labels["workload.codeflare.dev/appwrapper"] == "raycluster-complete"
        # And its gate: KubeRay made the pods gated, mcad pinned each one to the node of its plan (placement binding).
        assert pinned_node(pod) == pod.spec.node_name, (pod.metadata.name, pod.spec.affinity)
        assert not pod.spec.scheduling_gates

    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, second)
    queued = default_aws.wait_state("raycluster-complete-1", "Pending")
    message = queued["conditions"][-1]["message"]
    assert message.startswith("Insufficient resources to dispatch AppWrapper. ")
    assert blocked_on(message, "cpu")
    assert not default_aws.exists("ray.io/v1alpha1", "RayCluster", "raycluster-complete-1")
    assert default_aws.pods("raycluster-complete-1") == []

    default_aws.delete("raycluster-complete")
    default_aws.wait_state("raycluster-complete-1", "Running")
    wait_until(lambda: len(raycluster_pods(default_aws, "raycluster-complete-1")) == 2, 90,
               "the second RayCluster's head and worker Running")
