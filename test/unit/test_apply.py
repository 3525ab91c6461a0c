"""Manifest preparation for dispatch: namespace rule, labels on object and nested pod templates, owner."""

from __future__ import annotations

from typing import Any

import pytest

from mcad.api.appwrapper import appwrapper_view
from mcad.apply import ItemError, manifest


def view(*templates: dict[str, Any] | None, namespace: str = "team") -> Any:
    items = [{"generictemplate": t} if t is not None else {"replicas": 1} for t in templates]
    return appwrapper_view({"metadata": {"name": "aw", "namespace": namespace, "uid": "u-1"},
                            "spec": {"resources": {"GenericItems": items}}})


def raycluster() -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1alpha1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": {
        "headGroupSpec": {"template": {"metadata": {"labels": {}}, "spec": {"containers": [{"name": "h"}]}}},
        "workerGroupSpecs": [{"replicas": 1, "template": {"spec": {"containers": [{"name": "w"}]}}}]}}


def test_labels_reach_every_nested_pod_template_and_the_object() -> None:
    obj = manifest(view(raycluster()), 0)
    labels = {"workload.codeflare.dev/appwrapper": "aw", "appwrapper.mcad.ibm.com": "aw"}
    assert obj["metadata"]["labels"] == labels
    assert obj["spec"]["headGroupSpec"]["template"]["metadata"]["labels"] == labels
    assert obj["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"] == labels


def test_namespace_defaults_to_the_appwrappers_and_a_controller_owner_is_set() -> None:
    obj = manifest(view({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}), 0)
    assert obj["metadata"]["namespace"] == "team"
    assert obj["metadata"]["ownerReferences"] == [{
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper", "name": "aw", "uid": "u-1",
        "controller": True, "blockOwnerDeletion": True}]


def test_existing_labels_are_kept_and_the_template_is_not_mutated() -> None:
    template = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "labels": {"team": "a"}}}
    aw = view(template)
    obj = manifest(aw, 0)
    assert obj["metadata"]["labels"]["team"] == "a"
    assert aw.items[0]["generictemplate"]["metadata"] == {"name": "cm", "labels": {"team": "a"}}


@pytest.mark.parametrize(("template", "message"), [
    (None, "GenericItems[0] (? (no name)): generictemplate is missing"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"}}, "metadata.name is required"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "other"}},
     "metadata.namespace 'other' differs from the AppWrapper's namespace 'team'"),
    ({"kind": "ConfigMap", "metadata": {"name": "cm"}}, "generictemplate needs apiVersion and kind"),
])
def test_items_that_cannot_be_dispatched_are_named_with_the_cause(template: dict[str, Any] | None,
                                                                   message: str) -> None:
    with pytest.raises(ItemError) as err:
        manifest(view(template), 0)
    assert message in str(err.value)
