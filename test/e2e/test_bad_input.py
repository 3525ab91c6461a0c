"""Bad input: refused at create where the schema can say so, otherwise one Failed AppWrapper with a message
that names the item and the cause, and nothing half-created. Other AppWrappers keep flowing."""

from __future__ import annotations

from typing import Any

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import AppWrappers, Controller, appwrapper, deployment_item


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
    ("empty-items", [], "spec.resources.GenericItems is empty"),
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
