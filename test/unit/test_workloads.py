"""Demand inference: pod requests by the Kubernetes formula, pod templates of known kinds, AppWrapper demand."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mcad.api.resources import ZERO, ResourceVector
from mcad.api.workloads import (
    PodSet,
    WorkloadError,
    appwrapper_demand,
    format_path,
    item_demand,
    pod_requests,
    pod_sets,
    understated,
)

GI = 2**30


def v(**amounts: int) -> ResourceVector:
    return ResourceVector({("nvidia.com/gpu" if k == "gpu" else k): a for k, a in amounts.items()})


def container(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
              **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "image": "busybox", "resources": resources, **extra}


def sidecar(requests: dict[str, Any]) -> dict[str, Any]:
    return container(requests, restartPolicy="Always")


def pod_spec(cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    return {"containers": [container({"cpu": cpu, "memory": memory})]}


def template(cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}}, "spec": pod_spec(cpu, memory)}


# -- pod_requests ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": [container({"cpu": "500m", "memory": "1Gi"})]}, v(cpu=500, memory=GI),
                     id="one container"),
        pytest.param({"containers": [container({"cpu": "500m"}), container({"cpu": "1", "nvidia.com/gpu": 1})]},
                     v(cpu=1500, gpu=1), id="containers add up"),
        pytest.param({"containers": [container(limits={"cpu": "2", "memory": "1Gi"})]}, v(cpu=2000, memory=GI),
                     id="limits only: request defaults to the limit"),
        pytest.param({"containers": [container({"cpu": "1"}, {"cpu": "4", "memory": "2Gi"})]},
                     v(cpu=1000, memory=2 * GI), id="request wins, limit fills the missing resource"),
        pytest.param({"containers": [container({"cpu": "0"}, {"cpu": "4"})]}, ZERO,
                     id="an explicit zero request stays zero"),
        pytest.param({"containers": [container({"example.com/foo": "3", "cpu": "1"})]},
                     ResourceVector({"example.com/foo": 3, "cpu": 1000}), id="unknown extended resources counted"),
        pytest.param({"containers": [container({"cpu": "1"})],
                      "initContainers": [container({"cpu": "3"}), container({"cpu": "2", "memory": "4Gi"})]},
                     v(cpu=3000, memory=4 * GI), id="init containers: max rule per resource"),
        pytest.param({"containers": [container({"cpu": "4"})], "initContainers": [container({"cpu": "3"})]},
                     v(cpu=4000), id="init container smaller than the containers"),
        pytest.param({"containers": [container({"cpu": "1"})],
                      "initContainers": [sidecar({"cpu": "500m"}), container({"cpu": "2"})]},
                     v(cpu=2500), id="sidecar before an init container runs alongside it"),
        pytest.param({"containers": [container({"cpu": "1"})],
                      "initContainers": [container({"cpu": "2"}), sidecar({"cpu": "500m"})]},
                     v(cpu=2000), id="sidecar after an init container does not"),
        pytest.param({"containers": [container({"cpu": "3"})],
                      "initContainers": [sidecar({"cpu": "500m"}), container({"cpu": "2"}), sidecar({"cpu": "1"})]},
                     v(cpu=4500), id="sidecars add to the regular containers"),
        pytest.param({"containers": [container({"cpu": "1"})], "initContainers": [sidecar({"cpu": "1"}),
                      sidecar({"cpu": "1"}), container({"cpu": "3"})]},
                     v(cpu=5000), id="init container plus all earlier sidecars beats the steady state"),
        pytest.param({"containers": [container({"cpu": "1"})], "overhead": {"cpu": "250m", "memory": "120Mi"}},
                     v(cpu=1250, memory=120 * 2**20), id="overhead is added"),
        pytest.param({"containers": [container({"cpu": "1"})], "initContainers": [container({"cpu": "2"})],
                      "overhead": {"cpu": "100m"}},
                     v(cpu=2100), id="overhead added after the max"),
        pytest.param({}, ZERO, id="empty spec"),
        pytest.param({"containers": "nope", "initContainers": 3}, ZERO, id="ill-typed lists read as absent"),
        pytest.param({"containers": [None, "x", {"resources": "y"}, {"resources": {"requests": 7}}]}, ZERO,
                     id="ill-typed containers read as absent"),
    ],
)
def test_pod_requests(spec: dict[str, Any], expected: ResourceVector) -> None:
    assert pod_requests(spec) == expected


def test_pod_requests_of_a_non_mapping_is_zero() -> None:
    assert pod_requests(None) == ZERO
    assert pod_requests("spec") == ZERO


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"containers": [container({"cpu": "lots"})]}, "containers[0].resources.requests.cpu"),
        ({"containers": [container(), container(limits={"memory": "2 GB"})]}, "containers[1].resources.limits.memory"),
        ({"initContainers": [container({"cpu": "-1"})]}, "initContainers[0].resources.requests.cpu"),
        ({"overhead": {"cpu": []}}, "overhead.cpu"),
    ],
)
def test_pod_requests_bad_quantity_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkloadError) as err:
        pod_requests(spec)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_pod_requests_lenient_skips_bad_quantities() -> None:
    spec = {"containers": [container({"cpu": "lots", "memory": "1Gi"}), container({"cpu": "-1"})]}
    assert pod_requests(spec, strict=False) == v(memory=GI)


# -- pod_sets -------------------------------------------------------------------------------------------------------


def replicated(kind: str, api_version: str = "apps/v1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"},
            "spec": {**spec, "template": template()}}


def job(**spec: Any) -> dict[str, Any]:
    return replicated("Job", "batch/v1", **spec)


def ray_cluster(*groups: dict[str, Any], api_version: str = "ray.io/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "RayCluster", "metadata": {"name": "rc"},
            "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template("2", "4Gi")},
                     "workerGroupSpecs": [{"groupName": f"g{i}", **g, "template": template()}
                                          for i, g in enumerate(groups)]}}


def pytorch_job(**roles: int | None) -> dict[str, Any]:
    specs = {role: ({} if n is None else {"replicas": n}) | {"template": template()} for role, n in roles.items()}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
            "spec": {"pytorchReplicaSpecs": specs}}


def counts(obj: dict[str, Any]) -> list[tuple[str, int]]:
    return [(format_path(s.path), s.replicas) for s in pod_sets(obj)]


T = "spec.template"


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(replicated("Deployment", replicas=3), [(T, 3)], id="Deployment"),
        pytest.param(replicated("Deployment"), [(T, 1)], id="Deployment default 1"),
        pytest.param(replicated("Deployment", replicas=None), [(T, 1)], id="Deployment null replicas"),
        pytest.param(replicated("Deployment", replicas=0), [(T, 0)], id="Deployment scaled to 0"),
        pytest.param(replicated("ReplicaSet", replicas=2), [(T, 2)], id="ReplicaSet"),
        pytest.param(replicated("StatefulSet", replicas=4), [(T, 4)], id="StatefulSet"),
        pytest.param(replicated("Deployment", "extensions/v1beta1", replicas=3), [], id="Deployment other group"),
        pytest.param(job(), [(T, 1)], id="Job default"),
        pytest.param(job(parallelism=4), [(T, 4)], id="Job parallelism"),
        pytest.param(job(parallelism=4, completions=2), [(T, 2)], id="Job fewer completions than parallelism"),
        pytest.param(job(parallelism=2, completions=10), [(T, 2)], id="Job more completions"),
        pytest.param(job(completions=5), [(T, 1)], id="Job completions only"),
        pytest.param(job(parallelism=3, suspend=True), [(T, 3)], id="Job suspended still counts"),
        pytest.param(job(parallelism=0), [(T, 0)], id="Job parallelism 0"),
        pytest.param(ray_cluster({"replicas": 3}),
                     [("spec.headGroupSpec.template", 1), ("spec.workerGroupSpecs[0].template", 3)],
                     id="RayCluster head and workers"),
        pytest.param(ray_cluster({"minReplicas": 2}, {}),
                     [("spec.headGroupSpec.template", 1), ("spec.workerGroupSpecs[0].template", 2),
                      ("spec.workerGroupSpecs[1].template", 1)], id="RayCluster minReplicas, default 1"),
        pytest.param(ray_cluster({"replicas": 2, "numOfHosts": 4}),
                     [("spec.headGroupSpec.template", 1), ("spec.workerGroupSpecs[0].template", 8)],
                     id="RayCluster multi-host"),
        pytest.param(ray_cluster({"replicas": 1, "minReplicas": 3, "maxReplicas": 5}),
                     [("spec.headGroupSpec.template", 1), ("spec.workerGroupSpecs[0].template", 3)],
                     id="RayCluster replicas below min -> min"),
        pytest.param(ray_cluster({"replicas": 9, "minReplicas": 1, "maxReplicas": 5}),
                     [("spec.headGroupSpec.template", 1), ("spec.workerGroupSpecs[0].template", 5)],
                     id="RayCluster replicas above max -> max"),
        pytest.param(ray_cluster({"replicas": 2}, api_version="ray.io/v1alpha1"),
                     [("spec.headGroupSpec.template", 1), ("spec.workerGroupSpecs[0].template", 2)],
                     id="RayCluster any version"),
        pytest.param(pytorch_job(Master=1, Worker=3),
                     [("spec.pytorchReplicaSpecs.Master.template", 1), ("spec.pytorchReplicaSpecs.Worker.template", 3)],
                     id="PyTorchJob"),
        pytest.param(pytorch_job(Worker=None), [("spec.pytorchReplicaSpecs.Worker.template", 1)],
                     id="PyTorchJob default replicas"),
        pytest.param({"apiVersion": "v1", "kind": "ConfigMap", "data": {}}, [], id="ConfigMap"),
        pytest.param({"apiVersion": "example.com/v1", "kind": "Pod", "spec": pod_spec()}, [], id="Pod other group"),
        pytest.param({"kind": "Deployment"}, [], id="no apiVersion"),
        pytest.param({"apiVersion": "apps/v1", "kind": "Deployment", "spec": "x"}, [], id="ill-typed spec"),
        pytest.param({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}}, [],
                     id="no template"),
        pytest.param({"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {"workerGroupSpecs": [1, None]}}, [],
                     id="RayCluster odd shapes"),
    ],
)
def test_pod_sets(obj: dict[str, Any], expected: list[tuple[str, int]]) -> None:
    assert counts(obj) == expected


def test_pod_set_of_a_bare_pod_is_the_pod_itself() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod_spec()}
    assert pod_sets(pod) == [PodSet((), 1, pod)]


def test_pod_set_template_is_the_dict_at_its_path() -> None:
    obj = ray_cluster({"replicas": 2})
    for pod_set in pod_sets(obj):
        node: Any = obj
        for step in pod_set.path:
            node = node[step]
        assert node is pod_set.template


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (replicated("Deployment", replicas=-1), "spec.replicas"),
        (replicated("StatefulSet", replicas="3"), "spec.replicas"),
        (replicated("ReplicaSet", replicas=2.0), "spec.replicas"),
        (replicated("Deployment", replicas=True), "spec.replicas"),
        (job(parallelism=-2), "spec.parallelism"),
        (job(completions="all"), "spec.completions"),
        (ray_cluster({"replicas": 1}, {"replicas": -1}), "spec.workerGroupSpecs[1].replicas"),
        (ray_cluster({"numOfHosts": "2"}), "spec.workerGroupSpecs[0].numOfHosts"),
        (ray_cluster({"minReplicas": 1.5}), "spec.workerGroupSpecs[0].minReplicas"),
        (pytorch_job(Worker=-3), "spec.pytorchReplicaSpecs.Worker.replicas"),
    ],
)
def test_pod_sets_reports_impossible_counts(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkloadError, match="must be a non-negative integer") as err:
        pod_sets(obj)
    assert err.value.field == field


# -- item and AppWrapper demand -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template_obj", "expected"),
    [
        pytest.param(replicated("Deployment", replicas=3), v(cpu=3000, memory=3 * GI), id="Deployment"),
        pytest.param(job(parallelism=4, completions=2), v(cpu=2000, memory=2 * GI), id="Job"),
        pytest.param(ray_cluster({"replicas": 2, "numOfHosts": 2}), v(cpu=2000 + 4000, memory=4 * GI + 4 * GI),
                     id="RayCluster head 2cpu/4Gi + 4 workers"),
        pytest.param(pytorch_job(Master=1, Worker=3), v(cpu=4000, memory=4 * GI), id="PyTorchJob"),
        pytest.param({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod_spec("250m")},
                     v(cpu=250, memory=GI), id="Pod"),
        pytest.param(replicated("Deployment", replicas=0), ZERO, id="scaled to zero"),
        pytest.param({"apiVersion": "v1", "kind": "ConfigMap"}, ZERO, id="unknown kind"),
        pytest.param({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"template": template()}}, ZERO,
                     id="unknown CRD with a template"),
    ],
)
def test_item_demand_from_template(template_obj: dict[str, Any], expected: ResourceVector) -> None:
    assert item_demand({"replicas": 1, "generictemplate": template_obj}) == expected


def test_item_demand_without_template_is_zero() -> None:
    assert item_demand({}) == ZERO
    assert item_demand({"generictemplate": "x"}) == ZERO


def test_custompodresources_declaring_more_than_the_templates_are_the_demand() -> None:
    item = {
        "custompodresources": [
            {"replicas": 2, "requests": {"cpu": "500m", "memory": "1Gi"}},
            {"replicas": 1, "requests": {"cpu": "1", "nvidia.com/gpu": 1}, "limits": {"cpu": "2"}},
        ],
        "generictemplate": replicated("Deployment", replicas=1),  # 1 cpu, 1Gi
    }
    assert item_demand(item) == v(cpu=2000, memory=2 * GI, gpu=1)
    assert understated(item) is None


def test_custompodresources_below_the_templates_are_raised_to_them_per_resource() -> None:
    """A tenant's understatement: 1 pod x 1m in front of 100 pods of 1 cpu is charged what the 100 pods ask;
    what it declares beyond the templates (a GPU) still counts."""
    item = {
        "custompodresources": [{"replicas": 1, "requests": {"cpu": "1m", "nvidia.com/gpu": 1}}],
        "generictemplate": replicated("Deployment", replicas=100),
    }
    assert item_demand(item) == v(cpu=100_000, memory=100 * GI, gpu=1)
    # Understated in what it names (cpu); memory it leaves out is charged all the same, not held against it.
    assert understated(item) == (v(cpu=1, gpu=1), v(cpu=100_000))
    cpu_only = {"custompodresources": [{"replicas": 100, "requests": {"cpu": "1"}}],
                "generictemplate": replicated("Deployment", replicas=100)}
    assert item_demand(cpu_only) == v(cpu=100_000, memory=100 * GI)
    assert understated(cpu_only) is None


def test_custompodresources_of_a_kind_without_known_templates_are_the_demand() -> None:
    item = {"custompodresources": [{"replicas": 3, "requests": {"cpu": "2"}}],
            "generictemplate": {"apiVersion": "example.com/v1", "kind": "Trainer", "metadata": {"name": "t"}}}
    assert item_demand(item) == v(cpu=6000)
    assert understated(item) is None


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        pytest.param({"replicas": 2, "requests": {"cpu": "0"}, "limits": {"cpu": "1"}}, v(cpu=2000),
                     id="zero request falls back to the limit"),
        pytest.param({"replicas": 1, "requests": {}, "limits": {"memory": "1Gi"}}, v(memory=GI),
                     id="missing request falls back to the limit"),
        pytest.param({"replicas": 1, "requests": {"cpu": "1"}, "limits": {"cpu": "3"}}, v(cpu=1000),
                     id="request wins over limit"),
        pytest.param({"replicas": 0, "requests": {"cpu": "1"}}, ZERO, id="zero replicas"),
        pytest.param({"replicas": 3, "requests": {"example.com/foo": "2"}}, ResourceVector({"example.com/foo": 6}),
                     id="extended resource"),
    ],
)
def test_custompodresources_entry(entry: dict[str, Any], expected: ResourceVector) -> None:
    assert item_demand({"custompodresources": [entry]}) == expected


def test_empty_custompodresources_fall_back_to_the_template() -> None:
    item = {"custompodresources": [], "generictemplate": replicated("Deployment", replicas=2)}
    assert item_demand(item) == v(cpu=2000, memory=2 * GI)


AW_RAYCLUSTER = """
apiVersion: workload.codeflare.dev/v1beta1
kind: AppWrapper
metadata:
  name: raycluster-complete
  namespace: default
spec:
  resources:
    GenericItems:
    - replicas: 1
      custompodresources:
      - replicas: 1
        limits:
          cpu: 1
          memory: 2G
          nvidia.com/gpu: 0
        requests:
          cpu: 1
          memory: 2G
          nvidia.com/gpu: 0
      - replicas: 1
        limits:
          cpu: 2
          memory: 2G
          nvidia.com/gpu: 0
        requests:
          cpu: 2
          memory: 2G
          nvidia.com/gpu: 0
      generictemplate:
        apiVersion: ray.io/v1alpha1
        kind: RayCluster
        metadata:
          labels:
            controller-tools.k8s.io: "1.0"
          name: raycluster-complete
        spec:
          rayVersion: '2.5.0'
          headGroupSpec:
            serviceType: ClusterIP
            rayStartParams:
              dashboard-host: '0.0.0.0'
            template:
              metadata:
                labels: {}
              spec:
                containers:
                - name: ray-head
                  image: quay.io/project-codeflare/ray:2.5.0-py38-cu116
                  ports:
                  - containerPort: 6379
                    name: gcs
                  - containerPort: 8265
                    name: dashboard
                  - containerPort: 10001
                    name: client
                  lifecycle:
                    preStop:
                      exec:
                        command: ["/bin/sh","-c","ray stop"]
                  volumeMounts:
                    - mountPath: /tmp/ray
                      name: ray-logs
                  resources:
                    limits:
                      cpu: "1"
                      memory: "2G"
                    requests:
                      cpu: "1"
                      memory: "2G"
                volumes:
                  - name: ray-logs
                    emptyDir: {}
          workerGroupSpecs:
          - replicas: 1
            minReplicas: 1
            maxReplicas: 1
            groupName: small-group
            rayStartParams: {}
            template:
              spec:
                containers:
                - name: ray-worker
                  image: quay.io/project-codeflare/ray:2.5.0-py38-cu116
                  lifecycle:
                    preStop:
                      exec:
                        command: ["/bin/sh","-c","ray stop"]
                  volumeMounts:
                    - mountPath: /tmp/ray
                      name: ray-logs
                  resources:
                    limits:
                      cpu: "2"
                      memory: "2G"
                    requests:
                      cpu: "2"
                      memory: "2G"
                volumes:
                  - name: ray-logs
                    emptyDir: {}
"""


def test_upstream_aw_raycluster_demands_3_cpu_and_4G() -> None:
    aw = yaml.safe_load(AW_RAYCLUSTER)
    assert appwrapper_demand(aw["spec"]) == v(cpu=3000, memory=4 * 10**9)
    assert appwrapper_demand(aw["spec"]).format() == "cpu=3 memory=4G"
    # The same demand is inferred from the RayCluster itself once custompodresources are dropped.
    del aw["spec"]["resources"]["GenericItems"][0]["custompodresources"]
    assert appwrapper_demand(aw["spec"]) == v(cpu=3000, memory=4 * 10**9)


def test_appwrapper_demand_sums_items() -> None:
    spec = {"resources": {"GenericItems": [
        {"generictemplate": replicated("Deployment", replicas=2)},
        {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap"}},
        {"custompodresources": [{"replicas": 1, "requests": {"nvidia.com/gpu": 2}}]},
    ]}}
    assert appwrapper_demand(spec) == v(cpu=2000, memory=2 * GI, gpu=2)


@pytest.mark.parametrize("spec", [{}, {"resources": {}}, {"resources": {"GenericItems": None}}, {"resources": 5}])
def test_appwrapper_demand_of_no_items_is_zero(spec: dict[str, Any]) -> None:
    assert appwrapper_demand(spec) == ZERO


@pytest.mark.parametrize(
    ("items", "message"),
    [
        pytest.param([{"generictemplate": replicated("Deployment")},
                      {"custompodresources": [{"replicas": 1, "requests": {"cpu": "1"}},
                                              {"replicas": 1, "requests": {"cpu": "lots"}}]}],
                     "spec.resources.GenericItems[1].custompodresources[1].requests.cpu: invalid quantity 'lots'",
                     id="bad custom request"),
        pytest.param([{"custompodresources": [{"replicas": 1, "requests": {}, "limits": {"memory": "1 GB"}}]}],
                     "spec.resources.GenericItems[0].custompodresources[0].limits.memory: invalid quantity '1 GB'",
                     id="bad custom limit"),
        pytest.param([{"custompodresources": [{"requests": {"cpu": "1"}}]}],
                     "spec.resources.GenericItems[0].custompodresources[0].replicas: required",
                     id="custom replicas missing"),
        pytest.param([{"custompodresources": [{"replicas": -1, "requests": {"cpu": "1"}}]}],
                     "spec.resources.GenericItems[0].custompodresources[0].replicas: must be a non-negative integer",
                     id="custom replicas negative"),
        pytest.param([{"custompodresources": [{"replicas": 1, "requests": ["cpu"]}]}],
                     "spec.resources.GenericItems[0].custompodresources[0].requests: must be a map of quantities",
                     id="custom requests not a map"),
        pytest.param([{"custompodresources": ["x"]}],
                     "spec.resources.GenericItems[0].custompodresources[0]: must be an object",
                     id="custom entry not an object"),
        pytest.param([{}, {"generictemplate": ray_cluster({"replicas": 1})},
                      {"generictemplate": {**ray_cluster(), "spec": {"workerGroupSpecs": [
                          {"replicas": 1, "template": {"spec": {"containers": [container({"memory": "2 Gi"})]}}}]}}}],
                     "spec.resources.GenericItems[2].generictemplate.spec.workerGroupSpecs[0].template.spec"
                     ".containers[0].resources.requests.memory: invalid quantity '2 Gi'",
                     id="bad template quantity"),
        pytest.param([{"generictemplate": job(parallelism="4")}],
                     "spec.resources.GenericItems[0].generictemplate.spec.parallelism: must be a non-negative integer",
                     id="bad template count"),
        pytest.param([{"generictemplate": {"apiVersion": "v1", "kind": "Pod",
                                           "spec": {"containers": [container({"cpu": "-2"})]}}}],
                     "spec.resources.GenericItems[0].generictemplate.spec.containers[0].resources.requests.cpu: "
                     "negative quantity '-2'", id="negative pod request"),
        pytest.param(["item"], "spec.resources.GenericItems[0]: must be an object", id="item not an object"),
    ],
)
def test_appwrapper_demand_errors_name_item_and_field(items: list[Any], message: str) -> None:
    with pytest.raises(WorkloadError) as err:
        appwrapper_demand({"resources": {"GenericItems": items}})
    assert str(err.value).startswith(message)
    assert isinstance(err.value, ValueError)


def test_format_path() -> None:
    assert format_path(()) == ""
    assert format_path(("spec", "template")) == "spec.template"
    assert format_path(("spec", "workerGroupSpecs", 0, "template")) == "spec.workerGroupSpecs[0].template"
