"""Bad input: refused at create where the schema can say so, otherwise one Failed AppWrapper with a message
that names the item and the cause, and nothing half-created. Other AppWrappers keep flowing.

The controller runs with small --max-items and --max-appwrapper-bytes, so those bounds are reached with small
objects.

These are the controller's own checks at dispatch, for AppWrappers the admission webhook did not judge (stored
before it was registered, or created while it was bypassed): this module's namespaces are outside the webhooks'
namespaceSelector. test_admission.py checks that the webhook refuses the same at create, with the same messages."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest
import yaml

from mcad.k8s import kube
from test.apiserver import request_totals
from test.conftest import apply_crd
from test.e2e.conftest import GROUP, PLURAL, VERSION, AppWrappers, Controller, appwrapper, deployment_item
from test.support import REPO, wait_until

MAX_ITEMS = 4
MAX_BYTES = 65536
CONTROLLER_ARGS = ("--max-items", str(MAX_ITEMS), "--max-appwrapper-bytes", str(MAX_BYTES))
# Not through the webhooks: what is checked here is what the controller does without them.
WEBHOOK_RELEASE = None
LEGACY_CRD = REPO / "config" / "crd" / "legacy" / "mcad.ibm.com_mcadappwrappers.yaml"


def configmap_item(name: str, **extra: Any) -> dict[str, Any]:
    return {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **extra},
                                "data": {"k": "v"}}}


def pod_item(name: str | None, cpu: str = "10m", memory: str = "150Mi") -> dict[str, Any]:
    meta = {"name": name} if name else {"labels": {"app": "nameless"}}
    return {"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}}


def test_template_without_apiversion_is_refused_at_create(controller: Controller, aws: AppWrappers) -> None:
    body = appwrapper("no-apiversion", {"generictemplate": {"kind": "ConfigMap", "metadata": {"name": "x"}}})
    with pytest.raises(k8s.exceptions.ApiException) as refused:
        aws.create(body)
    assert refused.value.status == 422
    assert "generictemplate.apiVersion: Required value" in refused.value.body


@pytest.mark.parametrize(("case", "items", "message"), [
    ("unknown-kind", [{"generictemplate": {"apiVersion": "example.com/v1", "kind": "Widget",
                                           "metadata": {"name": "w"}}}],
     "GenericItems[0] (Widget w): the API server does not serve example.com/v1 Widget"),
    ("invalid-object", [{"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                             "spec": {"containers": [{"name": "Bad_Name", "image": "x"}]}}}],
     "GenericItems[0] (Pod p): Invalid (422)"),
    ("namespace-mismatch", [configmap_item("cm", namespace="kube-system")],
     "metadata.namespace 'kube-system' differs from the AppWrapper's namespace"),
    ("no-template", [{"replicas": 1}], "GenericItems[0] (? (no name)): generictemplate is missing"),
    ("nameless-pod", [pod_item(None)], "metadata.name is required"),
    ("bad-quantity", [{"custompodresources": [{"replicas": 1, "requests": {"cpu": "1"}, "limits": {}}],
                       "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "q"},
                                           "data": {}}},
                      {"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q2"},
                                           "spec": {"containers": [{"name": "c", "image": "x", "resources": {
                                               "requests": {"cpu": "-2"}}}]}}}],
     "GenericItems[1]"),
])
def test_bad_item_fails_the_appwrapper_with_a_clear_message(controller: Controller, aws: AppWrappers, case: str,
                                                            items: list[dict[str, Any]], message: str) -> None:
    aws.create(appwrapper(case, *items))
    status = aws.wait_state(case, "Failed")
    assert status["canrun"] is False
    failed = status["conditions"][-1]
    assert failed["type"] == "Failed"
    assert message in failed["message"], failed["message"]
    assert status["message"] == failed["message"]


def test_a_refused_item_undoes_the_items_already_created(controller: Controller, aws: AppWrappers) -> None:
    aws.create(appwrapper("half", configmap_item("half-first"),
                          {"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "half-pod"},
                                               "spec": {"containers": [{"name": "Bad_Name", "image": "x"}]}}}))
    status = aws.wait_state("half", "Failed")
    assert "GenericItems[1] (Pod half-pod)" in status["message"]
    assert not aws.exists("v1", "ConfigMap", "half-first"), "item 0 must be deleted when item 1 is refused"


def test_other_appwrappers_keep_flowing_around_failures(controller: Controller, aws: AppWrappers) -> None:
    aws.create(appwrapper("broken", {"generictemplate": {"apiVersion": "example.com/v1", "kind": "Widget",
                                                         "metadata": {"name": "w"}}}))
    aws.create(appwrapper("fine", deployment_item("fine", 2, "10m")))
    aws.create(appwrapper("pods", pod_item("pod-a"), pod_item("pod-b")))
    aws.wait_state("broken", "Failed")
    aws.wait_state("fine", "Running")
    aws.wait_pods("fine", 2)
    aws.wait_state("pods", "Running")
    aws.wait_pods("pods", 2)
    assert controller.proc is not None and controller.proc.poll() is None, "the controller must survive bad input"


# -- bounds the API server enforces (the CRD schema) ----------------------------------------------------------------

SEED_003 = """
apiVersion: workload.codeflare.dev/v1beta1
kind: AppWrapper
metadata:
  name: raycluster-glue
spec:
  resources:
    custompodresources:
      - replicas: 2
        requests: {cpu: "3", memory: "16G", nvidia.com/gpu: "1"}
        limits: {cpu: "3", memory: "16G", nvidia.com/gpu: "1"}
    generictemplate:
      kind: RayCluster
      spec:
        headGroupSpec:
          containers: [{image: "projectcodeflare/codeflare-glue:latest"}]
"""
MISPLACED = [
    "spec.resources.generictemplate: Forbidden: misplaced: generictemplate belongs inside an item, as "
    "spec.resources.GenericItems[].generictemplate",
    "spec.resources.custompodresources: Forbidden: misplaced: custompodresources belongs inside an item, as "
    "spec.resources.GenericItems[].custompodresources",
]
NO_ITEMS = ("spec.resources.GenericItems: Required value: at least one item is required: GenericItems lists the "
            "objects the AppWrapper wraps")


def scheduled(name: str, scheduling: dict[str, Any]) -> dict[str, Any]:
    return appwrapper(name, configmap_item("cm"), scheduling=scheduling)


def in_body(field: str, bound: str) -> str:
    return f"{field} in body should be {bound}"


@pytest.mark.parametrize(("body", "messages"), [
    (yaml.safe_load(SEED_003), [NO_ITEMS, *MISPLACED]),
    (appwrapper("n" * 64, configmap_item("cm")), ["metadata.name: Too long: may not be more than 63 bytes"]),
    (appwrapper("empty"), [NO_ITEMS]),
    ({"apiVersion": f"{GROUP}/{VERSION}", "kind": "AppWrapper", "metadata": {"name": "none"},
      "spec": {"resources": {}}}, [NO_ITEMS]),
    (appwrapper("many", *[configmap_item(f"cm-{i}") for i in range(1001)]),
     ["spec.resources.GenericItems: Too many: 1001: must have at most 1000 items"]),
    (appwrapper("prio", configmap_item("cm"), priority=2**31),
     [in_body("spec.priority", "less than or equal to 2147483647")]),
    (appwrapper("prio", configmap_item("cm"), priority=-(2**31) - 1),
     [in_body("spec.priority", "greater than or equal to -2147483648")]),
    (scheduled("min", {"minAvailable": -1}),
     [in_body("spec.schedulingSpec.minAvailable", "greater than or equal to 0")]),
    (scheduled("zero", {"requeuing": {"timeInSeconds": 0}}),
     [in_body("spec.schedulingSpec.requeuing.timeInSeconds", "greater than or equal to 1")]),
    (scheduled("ages", {"requeuing": {"timeInSeconds": 10**12, "maxTimeInSeconds": 10**12}}),
     [in_body("spec.schedulingSpec.requeuing.timeInSeconds", "less than or equal to 604800"),
      in_body("spec.schedulingSpec.requeuing.maxTimeInSeconds", "less than or equal to 604800")]),
    (scheduled("count", {"requeuing": {"maxNumRequeuings": -1}}),
     [in_body("spec.schedulingSpec.requeuing.maxNumRequeuings", "greater than or equal to 0")]),
    (scheduled("deadline", {"dispatchDuration": {"limit": 10**12}}),
     [in_body("spec.schedulingSpec.dispatchDuration.limit", "less than or equal to 31536000")]),
    (scheduled("past", {"dispatchDuration": {"limit": -1}}),
     [in_body("spec.schedulingSpec.dispatchDuration.limit", "greater than or equal to 0")]),
], ids=["seed-003", "long-name", "empty-items", "no-items", "1001-items", "priority-high", "priority-low",
        "min-available", "requeue-zero", "requeue-huge", "max-requeuings", "deadline-huge", "deadline-negative"])
def test_out_of_bounds_is_refused_at_create_with_the_cause(aws: AppWrappers, body: dict[str, Any],
                                                           messages: list[str]) -> None:
    """What the Python client (which sends no fieldValidation, so unknown fields would be pruned silently) sees."""
    with pytest.raises(k8s.exceptions.ApiException) as refused:
        aws.create(body)
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    for expected in messages:
        assert expected in message, message


def test_the_legacy_group_refuses_the_same(api: k8s.ApiClient, custom: k8s.CustomObjectsApi, namespace: str) -> None:
    apply_crd(api, LEGACY_CRD)
    long_name = appwrapper("g" * 64, configmap_item("cm"))
    # A schema error (the name) stops the API server before the rules: each case is refused on its own.
    for body, messages in [(yaml.safe_load(SEED_003), [NO_ITEMS, *MISPLACED]),
                           (long_name, ["metadata.name: Too long: may not be more than 63 bytes"])]:
        with pytest.raises(k8s.exceptions.ApiException) as refused:
            custom.create_namespaced_custom_object("mcad.ibm.com", VERSION, namespace, "mcadappwrappers",
                                                   {**body, "apiVersion": "mcad.ibm.com/v1beta1"})
        message = json.loads(refused.value.body)["message"]
        for expected in messages:
            assert expected in message, message


# -- bounds only the controller can check -------------------------------------------------------------------------


@pytest.fixture
def neighbour(core: k8s.CoreV1Api, namespace_labels: dict[str, str], custom: k8s.CustomObjectsApi,
              kubeconfig: str) -> Iterator[AppWrappers]:
    """AppWrappers in a second namespace: another tenant."""
    name = f"mcad-test-{uuid.uuid4().hex[:8]}"
    # Under the webhooks too, as every test namespace is (namespace_labels).
    core.create_namespace({"metadata": {"name": name, "labels": {"mcad.test/owned": "true", **namespace_labels}}})
    wait_until(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
               30, f"ServiceAccount default in {name}")
    try:
        yield AppWrappers(custom, core, name, kube.connect(kubeconfig))
    finally:
        custom.delete_collection_namespaced_custom_object(GROUP, VERSION, name, PLURAL)
        core.delete_namespace(name, propagation_policy="Background")


# How long a refused AppWrapper is watched for writes it should not cause (retries would show within it).
OBSERVE_SECONDS = 3.0


def big_configmap_item(name: str, size: int) -> dict[str, Any]:
    return {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                "data": {"blob": "x" * size}}}


@pytest.mark.parametrize(("case", "items", "message"), [
    ("duplicates", [configmap_item("same"), pod_item("p"), configmap_item("same")],
     "GenericItems[2] (ConfigMap same) names the same object as GenericItems[0] (same API group, kind and name)"),
    ("huge-cpu", [pod_item("huge", cpu="1e100")],
     "GenericItems[0] (Pod huge): generictemplate.spec.containers[0].resources.requests.cpu is '1e100', more than "
     "Kubernetes can count (at most 9223372036854775807m)"),
    ("huge-declared", [{"custompodresources": [{"replicas": 1, "requests": {"cpu": "1e100"}}],
                        **configmap_item("declared")}],
     "GenericItems[0] (ConfigMap declared): custompodresources[0].requests.cpu is '1e100', more than Kubernetes "
     "can count"),
    ("too-many", [configmap_item(f"cm-{i}") for i in range(MAX_ITEMS + 1)],
     f"spec.resources.GenericItems has {MAX_ITEMS + 1} items; at most {MAX_ITEMS} are allowed (--max-items)"),
    ("too-big", [big_configmap_item("big", MAX_BYTES)],
     f"at most 0.06 MiB ({MAX_BYTES} bytes) is allowed (--max-appwrapper-bytes)"),
], ids=lambda value: value if isinstance(value, str) and len(value) < 20 else "")
def test_what_only_the_controller_sees_fails_at_once_and_the_neighbour_runs(
        controller: Controller, aws: AppWrappers, neighbour: AppWrappers, api: k8s.ApiClient, case: str,
        items: list[dict[str, Any]], message: str) -> None:
    # The controller-manager creates a kube-root-ca.crt ConfigMap in every new namespace (and keeps trying, refused
    # with 403, in namespaces earlier tests are deleting): creates that are not the controller's. Wait for ours, and
    # count only the creates that succeeded below.
    for namespace in (aws.namespace, neighbour.namespace):
        wait_until(lambda namespace=namespace: aws.core.list_namespaced_config_map(
            namespace, field_selector="metadata.name=kube-root-ca.crt").items, 15, f"kube-root-ca.crt in {namespace}")
    before = request_totals(api)
    aws.create(appwrapper(case, *items))
    status = aws.wait_state(case, "Failed", timeout=10)
    # What it cost the API server, watched a little longer than it took: its Failed status, nothing retried.
    time.sleep(OBSERVE_SECONDS)  # a span of time in which nothing may happen: there is no event to wait for
    spent = request_totals(api) - before
    writes = (spent.count(resource="appwrappers", subresource="status", verb="PATCH")
              + sum(spent.count(resource=r, verb="APPLY") + spent.count(resource=r, verb="POST", code="201")
                    for r in ("configmaps", "pods")))
    assert writes <= 3, f"a refused AppWrapper cost {writes} writes: {dict(spent)}"
    failed = status["conditions"][-1]
    assert (failed["type"], failed["reason"]) == ("Failed", "InvalidSpec")
    assert message in failed["message"], failed["message"]
    assert status["message"] == failed["message"]
    assert not any(aws.exists(i["generictemplate"]["apiVersion"], i["generictemplate"]["kind"],
                              i["generictemplate"]["metadata"]["name"]) for i in items), "nothing may be created"
    neighbour.create(appwrapper("good", deployment_item("good", 1, "10m")))
    neighbour.wait_state("good", "Running", timeout=30)
    neighbour.wait_pods("good", 1)
    assert controller.proc is not None and controller.proc.poll() is None


def test_text_outside_the_bmp_is_dispatched_and_a_bad_quantity_of_it_fails_with_a_message(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """Apply bodies used to escape such characters as surrogate pairs, which the API server's YAML decoder
    refuses (400): the ConfigMap never got created, and the AppWrapper of a quantity "1😀" got no status."""
    aws.create(appwrapper("emoji", {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap",
                                                        "metadata": {"name": "emoji",
                                                                     "annotations": {"note": "ok \U0001f600"}},
                                                        "data": {"k": "ok \U0001f600 \u2028 \x85"}}}))
    aws.wait_state("emoji", "Running")
    assert core.read_namespaced_config_map("emoji", aws.namespace).data == {"k": "ok \U0001f600 \u2028 \x85"}
    aws.create(appwrapper("bad-emoji", {"generictemplate": {"apiVersion": "v1", "kind": "Pod",
                                                            "metadata": {"name": "p"}, "spec": {"containers": [
                                                                {"name": "c", "image": "x", "resources": {
                                                                    "requests": {"cpu": "1\U0001f600"}}}]}}}))
    failed = aws.wait_state("bad-emoji", "Failed", timeout=15)
    assert "1\U0001f600" in failed["message"], failed["message"]


def deep_appwrapper(name: str, namespace: str, depth: int) -> str:
    """An AppWrapper whose ConfigMap's data nests ``depth`` arrays, as JSON text (Python's encoder, like its
    decoder, recurses once per level and gives up near 1,000)."""
    text = json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": "AppWrapper",
                       "metadata": {"name": name, "namespace": namespace},
                       "spec": {"resources": {"GenericItems": [configmap_item(f"{name}-cm")]}}})
    return text.replace('{"k": "v"}', "[" * depth + '"leaf"' + "]" * depth)


def kubectl_text(kubeconfig: str, *args: str, text: str | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl") or str(REPO / ".dev" / "bin" / "kubectl")
    return subprocess.run([binary, "--kubeconfig", kubeconfig, *args], input=text, capture_output=True, text=True,
                          timeout=60, check=False)


def test_an_appwrapper_nested_3000_deep_fails_and_every_list_and_watch_goes_on(
        kubeconfig: str, controller: Controller, aws: AppWrappers, neighbour: AppWrappers) -> None:
    """The API server stores objects nested up to 10,000 deep; Python's JSON decoder gives up near 1,000. One such
    AppWrapper, created where admission does not look, used to break the controller's AppWrapper list and watch,
    for every tenant. It fails with a message that names the limit, and the next tenant's AppWrapper runs."""
    try:
        proc = kubectl_text(kubeconfig, "create", "-f", "-", text=deep_appwrapper("deep", aws.namespace, 3000))
        assert proc.returncode == 0, proc.stderr

        def state() -> str:
            got = kubectl_text(kubeconfig, "get", "appwrappers.workload.codeflare.dev", "deep", "-n", aws.namespace,
                               "-o", "jsonpath={.status.state} {.status.conditions[-1].reason}")
            return got.stdout if got.stdout.startswith("Failed") else ""

        assert wait_until(state, 30, "the deep AppWrapper to fail") == "Failed InvalidSpec"
        message = kubectl_text(kubeconfig, "get", "appwrappers.workload.codeflare.dev", "deep", "-n", aws.namespace,
                               "-o", "jsonpath={.status.message}").stdout
        assert "nests objects and arrays more than 100 levels deep; at most 100 are allowed" in message, message
        neighbour.create(appwrapper("after-deep", deployment_item("after-deep", 1, "10m")))
        neighbour.wait_pods("after-deep", 1)
        assert controller.proc is not None and controller.proc.poll() is None
        assert b"RecursionError" not in controller.log.read_bytes()
    finally:
        kubectl_text(kubeconfig, "delete", "appwrappers.workload.codeflare.dev", "deep", "-n", aws.namespace,
                     "--ignore-not-found", "--wait=false")
