"""Manifest preparation for dispatch: namespace rule, labels on object and nested pod templates, owner; stepwise
dispatch and deletion: one request per step, the undo after a failure too, the same results and messages."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest

from mcad import apply
from mcad.api.appwrapper import AppWrapperView, appwrapper_view
from mcad.apply import DispatchFailed, ItemError, manifest
from mcad.kube import ApiError


class Made(NamedTuple):
    """An AppWrapper's view (which keeps no templates) and its GenericItems as a dispatch reads them."""

    aw: AppWrapperView
    items: list[dict[str, Any]]


def view(*templates: dict[str, Any] | None, namespace: str = "team") -> Made:
    items = [{"generictemplate": t} if t is not None else {"replicas": 1} for t in templates]
    raw = {"metadata": {"name": "aw", "namespace": namespace, "uid": "u-1"},
           "spec": {"resources": {"GenericItems": items}}}
    return Made(appwrapper_view(raw), copy.deepcopy(items))


def manifest_at(made: Made, index: int, *, remote: bool = False) -> dict[str, Any]:
    return manifest(made.aw, index, made.items[index], remote=remote)


def raycluster() -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1alpha1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": {
        "headGroupSpec": {"template": {"metadata": {"labels": {}}, "spec": {"containers": [{"name": "h"}]}}},
        "workerGroupSpecs": [{"replicas": 1, "template": {"spec": {"containers": [{"name": "w"}]}}}]}}


def test_labels_reach_every_nested_pod_template_and_the_object() -> None:
    obj = manifest_at(view(raycluster()), 0)
    labels = {"workload.codeflare.dev/appwrapper": "aw", "appwrapper.mcad.ibm.com": "aw"}
    assert obj["metadata"]["labels"] == labels
    assert obj["spec"]["headGroupSpec"]["template"]["metadata"]["labels"] == labels
    assert obj["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"] == labels


def test_namespace_defaults_to_the_appwrappers_and_a_controller_owner_is_set() -> None:
    obj = manifest_at(view({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}), 0)
    assert obj["metadata"]["namespace"] == "team"
    assert obj["metadata"]["ownerReferences"] == [{
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper", "name": "aw", "uid": "u-1",
        "controller": True, "blockOwnerDeletion": True}]


def test_existing_labels_are_kept_and_the_template_is_not_mutated() -> None:
    template = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "labels": {"team": "a"}}}
    made = view(template)
    obj = manifest_at(made, 0)
    assert obj["metadata"]["labels"]["team"] == "a"
    assert made.items[0]["generictemplate"]["metadata"] == {"name": "cm", "labels": {"team": "a"}}


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
        manifest_at(view(template), 0)
    assert message in str(err.value)


class Writer:
    """Records every request (an in-memory stand-in: these tests count requests per step, which only a fake can
    show); ``refuse`` maps an object name to the ApiError its apply gets."""

    def __init__(self, refuse: Mapping[str, ApiError] | None = None) -> None:
        self.requests: list[tuple[str, str]] = []
        self.refuse = dict(refuse or {})

    def is_namespaced(self, api_version: str, kind: str) -> bool:
        return kind != "Namespace"

    def apply(self, obj: Mapping[str, Any], *, field_manager: str, force: bool) -> Mapping[str, Any]:
        name = obj["metadata"]["name"]
        self.requests.append(("apply", name))
        if name in self.refuse:
            raise self.refuse[name]
        return {"metadata": {"uid": f"uid-{name}"}}

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        self.requests.append(("delete", name))


def configmaps(count: int) -> Made:
    return view(*[{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm{i}"}} for i in range(count)])


def requests_per_step(writer: Writer, steps: Any) -> tuple[list[int], Any]:
    """Drive ``steps`` by hand: how many requests each step made, and what it returned (or raised)."""
    counts: list[int] = []
    while True:
        before = len(writer.requests)
        try:
            next(steps)
        except StopIteration as end:
            counts.append(len(writer.requests) - before)
            return counts, end.value
        except DispatchFailed as err:
            counts.append(len(writer.requests) - before)
            return counts, err
        counts.append(len(writer.requests) - before)


def test_a_stepwise_dispatch_applies_one_item_per_step_and_returns_the_uids() -> None:
    writer = Writer()
    counts, uids = requests_per_step(writer, apply.dispatch_steps(writer, *configmaps(4)))
    assert uids == ("uid-cm0", "uid-cm1", "uid-cm2", "uid-cm3")
    assert writer.requests == [("apply", f"cm{i}") for i in range(4)]
    assert max(counts) == 1


def test_a_refused_item_is_undone_one_delete_per_step_with_the_message_of_a_whole_dispatch() -> None:
    refusal = {"cm2": ApiError(422, "Invalid", "data: too long")}
    writer = Writer(refusal)
    counts, failure = requests_per_step(writer, apply.dispatch_steps(writer, *configmaps(4)))
    assert writer.requests == [("apply", "cm0"), ("apply", "cm1"), ("apply", "cm2"), ("delete", "cm1"),
                               ("delete", "cm0")]
    assert max(counts) == 1
    assert isinstance(failure, DispatchFailed) and not failure.transient
    whole = Writer(refusal)
    with pytest.raises(DispatchFailed) as err:
        apply.dispatch(whole, *configmaps(4))
    assert whole.requests == writer.requests
    assert err.value.message == failure.message == "GenericItems[2] (ConfigMap cm2): Invalid (422): data: too long"


def test_a_transient_refusal_is_undone_and_says_transient() -> None:
    writer = Writer({"cm1": ApiError(503, "ServiceUnavailable", "try later")})
    _, failure = requests_per_step(writer, apply.dispatch_steps(writer, *configmaps(3)))
    assert isinstance(failure, DispatchFailed) and failure.transient
    assert writer.requests == [("apply", "cm0"), ("apply", "cm1"), ("delete", "cm0")]


def test_an_invalid_item_anywhere_means_nothing_is_applied() -> None:
    writer = Writer()
    made = view({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm0"}},
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "x-"}})
    _, failure = requests_per_step(writer, apply.dispatch_steps(writer, *made))
    assert isinstance(failure, DispatchFailed) and "GenericItems[1]" in failure.message
    assert writer.requests == []


def test_a_cluster_scoped_item_is_refused_and_what_was_applied_undone() -> None:
    writer = Writer()
    made = view({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm0"}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    _, failure = requests_per_step(writer, apply.dispatch_steps(writer, *made))
    assert isinstance(failure, DispatchFailed) and "Namespace is cluster-scoped" in failure.message
    assert writer.requests == [("apply", "cm0"), ("delete", "cm0")]


def test_stepwise_deletion_deletes_one_item_per_step() -> None:
    writer = Writer()
    counts, _ = requests_per_step(writer, apply.delete_wrapped_steps(writer, configmaps(3).aw))
    assert counts == [1, 1, 1]
    remote = Writer()
    counts, _ = requests_per_step(remote, apply.delete_remote_steps(remote, configmaps(3).aw))
    assert counts == [1, 1, 1]
    assert writer.requests == remote.requests == [("delete", "cm0"), ("delete", "cm1"), ("delete", "cm2")]
