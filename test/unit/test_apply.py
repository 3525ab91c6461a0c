"""Manifest preparation for dispatch: namespace rule, labels on object and nested pod templates, owner; stepwise
dispatch and deletion: one request per step, the undo after a failure too, the same results and messages."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest

from mcad.api.appwrapper import (
    APPWRAPPER_LABEL,
    APPWRAPPER_UID_LABEL,
    AppWrapperView,
    appwrapper_view,
    field_manager,
)
from mcad.k8s import apply
from mcad.k8s.apply import DispatchFailed, ItemError, manifest
from mcad.k8s.kube import ApiError


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
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": None}, "metadata must be an object"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "labels": ["a"]}},
     "metadata.labels must be a map of strings"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "ownerReferences": ["x"]}},
     "metadata.ownerReferences must be a list of objects"),
    ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
      "spec": {"template": {"metadata": "x", "spec": {}}}}, "spec.template.metadata must be an object"),
    ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
      "spec": {"template": {"metadata": {"labels": "a=b"}, "spec": {}}}},
     "spec.template.metadata.labels must be a map of strings"),
    ({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": {
        "headGroupSpec": {"template": {"spec": {}}},
        "workerGroupSpecs": [{"replicas": 1, "template": {"spec": {"schedulingGates": 3}}}]}},
     "spec.workerGroupSpecs[0].template.spec.schedulingGates must be a list"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"schedulingGates": {"a": 1}}},
     "GenericItems[0] (Pod p): spec.schedulingGates must be a list"),
])
def test_items_that_cannot_be_dispatched_are_named_with_the_cause(template: dict[str, Any] | None,
                                                                   message: str) -> None:
    # Before check_item, the malformed shapes among these raised TypeError or AttributeError out of manifest (a
    # "could not check" refusal in admission, no clear cause at dispatch).
    with pytest.raises(ItemError) as err:
        manifest_at(view(template), 0)
    assert message in str(err.value)
    with pytest.raises(ItemError) as checked:
        apply.check_item("team", 0, view(template).items[0])
    assert str(checked.value) == str(err.value)


def test_check_item_passes_what_manifest_builds_and_copies_nothing() -> None:
    made = view(raycluster(), {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": None},
                               "spec": {"schedulingGates": [{"name": "theirs"}]}},
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                 "spec": {"template": {"metadata": None, "spec": {}}}})
    before = copy.deepcopy(made.items)
    for index, item in enumerate(made.items):
        apply.check_item("team", index, item)
        obj = manifest(made.aw, index, item, gate=True)
        assert obj["metadata"]["labels"][APPWRAPPER_LABEL] == "aw"
    assert made.items == before
    job = manifest(made.aw, 2, made.items[2])
    assert job["spec"]["template"]["metadata"]["labels"][APPWRAPPER_LABEL] == "aw"


class Writer:
    """An in-memory stand-in that records every request (these tests count requests per step, which only a fake
    can show); ``refuse`` maps an object name to the ApiError its create gets; ``existing`` holds objects by name
    (the e2e tests in test/e2e/test_takeover.py show the same rules on a real API server)."""

    def __init__(self, refuse: Mapping[str, ApiError] | None = None,
                 existing: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.requests: list[tuple[str, str]] = []
        self.refuse = dict(refuse or {})
        self.objects: dict[str, dict[str, Any]] = copy.deepcopy(dict(existing or {}))
        self.managers: list[str] = []
        self.deleted_uids: list[str] = []

    def is_namespaced(self, api_version: str, kind: str) -> bool:
        return kind != "Namespace"

    def create(self, obj: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        name = obj["metadata"]["name"]
        self.requests.append(("create", name))
        self.managers.append(field_manager)
        if name in self.refuse:
            raise self.refuse[name]
        if name in self.objects:
            raise ApiError(409, "AlreadyExists", f"configmaps {name!r} already exists")
        stored = copy.deepcopy(dict(obj))
        stored["metadata"]["uid"] = f"uid-{name}"
        self.objects[name] = stored
        return stored

    def read(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any]:
        self.requests.append(("read", name))
        if name not in self.objects:
            raise ApiError(404, "NotFound", f"configmaps {name!r} not found")
        return copy.deepcopy(self.objects[name])

    def apply(self, obj: Mapping[str, Any], *, field_manager: str, force: bool) -> Mapping[str, Any]:
        name = obj["metadata"]["name"]
        self.requests.append(("apply", name))
        self.managers.append(field_manager)
        current = self.objects.get(name)
        wanted = obj["metadata"].get("uid")
        if current is not None and wanted and current["metadata"]["uid"] != wanted:
            raise ApiError(422, "Invalid", f'metadata.uid: Invalid value: "{wanted}": field is immutable')
        self.objects[name] = copy.deepcopy(dict(obj))
        return self.objects[name]

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        self.requests.append(("delete", name))
        self.deleted_uids.append(uid)
        current = self.objects.get(name)
        if current is not None and (not uid or current["metadata"]["uid"] == uid):
            del self.objects[name]


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
    assert writer.requests == [("create", f"cm{i}") for i in range(4)]
    assert max(counts) == 1


@pytest.mark.parametrize("items", [1, 3])
def test_every_step_of_a_dispatch_makes_a_request(items: int) -> None:
    # A step without a request would only send the dispatch to the back of the write pool's queue.
    writer = Writer()
    counts, _ = requests_per_step(writer, apply.dispatch_steps(writer, *configmaps(items)))
    assert counts == [1] * items


def test_a_refused_item_is_undone_one_delete_per_step_with_the_message_of_a_whole_dispatch() -> None:
    refusal = {"cm2": ApiError(422, "Invalid", "data: too long")}
    writer = Writer(refusal)
    counts, failure = requests_per_step(writer, apply.dispatch_steps(writer, *configmaps(4)))
    assert writer.requests == [("create", "cm0"), ("create", "cm1"), ("create", "cm2"), ("delete", "cm1"),
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
    assert writer.requests == [("create", "cm0"), ("create", "cm1"), ("delete", "cm0")]


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
    assert writer.requests == [("create", "cm0"), ("delete", "cm0")]


def test_stepwise_deletion_deletes_one_item_per_step() -> None:
    writer = Writer()
    counts, _ = requests_per_step(writer, apply.delete_wrapped_steps(writer, configmaps(3).aw))
    assert counts == [1, 1, 1]
    remote = Writer()
    counts, _ = requests_per_step(remote, apply.delete_remote_steps(remote, configmaps(3).aw))
    assert counts == [1, 1, 1]
    assert writer.requests == remote.requests == [("delete", "cm0"), ("delete", "cm1"), ("delete", "cm2")]


def test_once_the_appwrapper_is_gone_what_makes_no_pods_is_left_to_the_garbage_collector() -> None:
    writer = Writer()
    made = view({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm0"}},
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job0"}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc0"}},
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod0"}})
    requests_per_step(writer, apply.delete_wrapped_steps(writer, made.aw, owner_gone=True))
    assert writer.requests == [("delete", "job0"), ("delete", "pod0")], "pods free capacity only once gone"
    still = Writer()
    requests_per_step(still, apply.delete_wrapped_steps(still, made.aw))
    assert still.requests == [("delete", "cm0"), ("delete", "job0"), ("delete", "svc0"), ("delete", "pod0")], \
        "a reset or requeue (the AppWrapper stays) deletes everything itself"


def owned_by(owner_uid: str, name: str = "aw", **meta: Any) -> dict[str, Any]:
    """An existing ConfigMap whose controller is the AppWrapper ``name`` of ``owner_uid``."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": meta.pop("cm", "cm1"), "namespace": "team", "uid": meta.pop("uid", "theirs"),
                         "ownerReferences": [{"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                                              "name": name, "uid": owner_uid, "controller": True}], **meta},
            "data": {"a": "1"}}


def test_an_existing_object_of_someone_else_fails_the_dispatch_untouched_and_what_was_created_is_undone() -> None:
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1", "uid": "theirs"},
              "data": {"password": "s3cret"}}
    writer = Writer(existing={"cm1": theirs})
    counts, failure = requests_per_step(writer, apply.dispatch_steps(writer, *configmaps(3)))
    assert isinstance(failure, DispatchFailed) and not failure.transient
    assert failure.message.startswith(
        "GenericItems[1] (ConfigMap cm1) exists and is not controlled by this AppWrapper"), failure.message
    assert writer.requests == [("create", "cm0"), ("create", "cm1"), ("read", "cm1"), ("delete", "cm0")]
    assert writer.deleted_uids == ["uid-cm0"], "the undo deletes only the very object it created"
    assert writer.objects == {"cm1": theirs}
    assert max(counts) == 1


@pytest.mark.parametrize("owner", [
    {"name": "other-aw", "uid": "u-2"},  # another AppWrapper's
    {"name": "aw", "uid": "u-2", "kind": "Deployment"},  # a Deployment's of the same name
])
def test_an_object_controlled_by_another_owner_is_not_taken_over(owner: dict[str, Any]) -> None:
    existing = owned_by(owner["uid"], owner["name"])
    if "kind" in owner:
        existing["metadata"]["ownerReferences"][0].update(kind=owner["kind"], apiVersion="apps/v1")
    writer = Writer(existing={"cm1": existing})
    with pytest.raises(DispatchFailed) as err:
        apply.dispatch(writer, *configmaps(2))
    assert "exists and is not controlled by this AppWrapper" in err.value.message and not err.value.transient
    assert writer.objects["cm1"] == existing


def test_an_object_this_appwrapper_controls_is_kept_and_brought_up_to_date_on_that_object_only() -> None:
    mine = owned_by("u-1", uid="mine")
    writer = Writer(existing={"cm1": mine})
    counts, uids = requests_per_step(writer, apply.dispatch_steps(writer, *configmaps(2)))
    assert counts == [1, 1, 1, 1], "the create, the read and the apply of cm1 are three steps"
    assert uids == ("uid-cm0", "mine")
    assert writer.requests == [("create", "cm0"), ("create", "cm1"), ("read", "cm1"), ("apply", "cm1")]
    assert writer.objects["cm1"]["metadata"]["uid"] == "mine", "applied with its uid as a precondition"
    assert set(writer.managers) == {field_manager("u-1")}


def test_an_object_replaced_between_the_check_and_the_apply_is_not_written() -> None:
    class Replacing(Writer):
        def read(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any]:
            found = super().read(api_version, kind, namespace, name)
            self.objects[name] = {**owned_by("someone"), "metadata": {"name": name, "uid": "new-one"}}
            return found

    writer = Replacing(existing={"cm1": owned_by("u-1", uid="mine")})
    with pytest.raises(DispatchFailed) as err:
        apply.dispatch(writer, *configmaps(2))
    assert err.value.transient, "the next attempt sees the new object, and refuses it for good if it is not ours"
    assert writer.objects["cm1"]["metadata"]["uid"] == "new-one"
    assert "cm0" not in writer.objects


def test_a_taken_name_the_controller_may_not_read_fails_saying_so_and_is_left_alone() -> None:
    """The chart grants Secrets create and delete only; whose a taken name is cannot be told then."""
    class Unreadable(Writer):
        def read(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any]:
            self.requests.append(("read", name))
            raise ApiError(403, "Forbidden", f'configmaps "{name}" is forbidden: cannot get resource "configmaps"')

    existing = owned_by("u-1", uid="maybe-mine")
    writer = Unreadable(existing={"cm1": existing})
    with pytest.raises(DispatchFailed) as err:
        apply.dispatch(writer, *configmaps(2))
    assert not err.value.transient
    assert err.value.message.startswith("GenericItems[1] (ConfigMap cm1) exists, and the controller may not read it "
                                        "to tell whether it is this AppWrapper's (no get on ConfigMap objects"), \
        err.value.message
    assert writer.objects["cm1"] == existing and "cm0" not in writer.objects


def test_a_leftover_of_a_deleted_namesake_or_an_object_being_deleted_is_waited_for() -> None:
    for existing in (owned_by("u-old"), owned_by("u-1", deletionTimestamp="2026-01-01T00:00:00Z")):
        writer = Writer(existing={"cm1": existing})
        with pytest.raises(DispatchFailed) as err:
            apply.dispatch(writer, *configmaps(2))
        assert err.value.transient, err.value.message
        assert writer.objects["cm1"] == existing and "cm0" not in writer.objects


def test_a_name_taken_then_freed_is_tried_again() -> None:
    class Vanishing(Writer):
        def read(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any]:
            self.objects.pop(name, None)
            return super().read(api_version, kind, namespace, name)

    writer = Vanishing(existing={"cm0": owned_by("x", cm="cm0")})
    with pytest.raises(DispatchFailed) as err:
        apply.dispatch(writer, *configmaps(1))
    assert err.value.transient


def test_in_a_worker_cluster_the_uid_label_says_whose_an_object_is() -> None:
    made = configmaps(1)

    def labelled(uid: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "cm0", "uid": "there", "labels": {APPWRAPPER_LABEL: "aw", APPWRAPPER_UID_LABEL: uid}}}

    kept = Writer(existing={"cm0": labelled("u-1")})
    assert apply.dispatch(kept, *made, remote=True) == ("there",)
    waiting = Writer(existing={"cm0": labelled("u-old")})
    with pytest.raises(DispatchFailed) as err:
        apply.dispatch(waiting, *made, remote=True)
    assert err.value.transient
    unlabelled = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm0", "uid": "there"}}
    refused = Writer(existing={"cm0": unlabelled})
    with pytest.raises(DispatchFailed) as err:
        apply.dispatch(refused, *made, remote=True)
    assert not err.value.transient and "not controlled by this AppWrapper" in err.value.message
    assert refused.objects == {"cm0": unlabelled}


def test_each_appwrapper_has_a_field_manager_of_its_own_within_the_limit() -> None:
    assert field_manager("u-1") != field_manager("u-2")
    assert len(field_manager("0" * 300)) == 128
