"""The bounds the controller enforces (mcad.api.validation), each with the message a user reads in status, and the
CRD declaring the same numbers."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from mcad.api.appwrapper import appwrapper_view, reuse_spec
from mcad.api.validation import (
    DEFAULT_MAX_BYTES,
    INT32_MAX,
    INT32_MIN,
    MAX_DISPATCH_LIMIT_SECONDS,
    MAX_ITEMS_CEILING,
    MAX_NAME_LENGTH,
    MAX_REPORTED,
    MAX_REQUEUE_SECONDS,
    Limits,
    problems,
    refusal,
)
from test.support import REPO

CRDS = [REPO / "config" / "crd" / "workload.codeflare.dev_appwrappers.yaml",
        REPO / "config" / "crd" / "legacy" / "mcad.ibm.com_mcadappwrappers.yaml"]


def cm(name: str, api_version: str = "v1", kind: str = "ConfigMap", **data: str) -> dict[str, Any]:
    return {"generictemplate": {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "data": data}}


def pod(name: str, **requests: str) -> dict[str, Any]:
    return {"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": requests}}]}}}


def aw(*items: dict[str, Any], name: str = "aw", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"resources": {"GenericItems": list(items)}, **spec}}


def test_a_plain_appwrapper_has_no_problem() -> None:
    assert problems(aw(cm("a"), pod("p", cpu="1", memory="1Gi"), name="x" * MAX_NAME_LENGTH, priority=INT32_MIN,
                       schedulingSpec={"minAvailable": 0, "requeuing": {"timeInSeconds": 1, "maxTimeInSeconds": 0,
                                                                        "maxNumRequeuings": 0},
                                       "dispatchDuration": {"limit": 0}})) == []
    assert refusal(aw(cm("a"))) is None


def test_a_name_longer_than_a_label_value_is_refused() -> None:
    assert problems(aw(cm("a"), name="n" * 64)) == [
        "metadata.name is 64 characters long; at most 63 are allowed, because it becomes the value of the label "
        "workload.codeflare.dev/appwrapper on every wrapped object"]


def test_items_naming_the_same_object_are_refused_whatever_the_version() -> None:
    deployment = {"generictemplate": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}}
    older = {"generictemplate": {"apiVersion": "apps/v1beta2", "kind": "Deployment", "metadata": {"name": "web"}}}
    assert problems(aw(cm("same"), deployment, cm("same", kind="Secret"), older, cm("same"))) == [
        "GenericItems[3] (Deployment web) names the same object as GenericItems[1] (same API group, kind and "
        "name): one would overwrite the other and its demand would count twice",
        "GenericItems[4] (ConfigMap same) names the same object as GenericItems[0] (same API group, kind and "
        "name): one would overwrite the other and its demand would count twice",
    ]


def test_same_name_in_another_group_or_kind_or_without_a_name_is_no_duplicate() -> None:
    nameless = {"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"}}}
    assert problems(aw(cm("x"), cm("x", kind="Secret"), cm("x", api_version="example.com/v1"), nameless,
                       nameless)) == []


@pytest.mark.parametrize(("item", "message"), [
    (pod("big", cpu="1e100"),
     "GenericItems[0] (Pod big): generictemplate.spec.containers[0].resources.requests.cpu is '1e100', more than "
     "Kubernetes can count (at most 9223372036854775807m)"),
    (pod("cores", cpu="9223372036854776"),  # cores: in millicores that is past 2^63-1
     "GenericItems[0] (Pod cores): generictemplate.spec.containers[0].resources.requests.cpu is "
     "'9223372036854776', more than Kubernetes can count (at most 9223372036854775807m)"),
    (pod("mem", memory="8Ei"),
     "GenericItems[0] (Pod mem): generictemplate.spec.containers[0].resources.requests.memory is '8Ei', more than "
     "Kubernetes can count (at most 9223372036854775807)"),
    ({"custompodresources": [{"replicas": 1, "requests": {"cpu": "1"}},
                             {"replicas": 1, "requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": 10**19}}],
      **cm("declared")},
     "GenericItems[0] (ConfigMap declared): custompodresources[1].limits.nvidia.com/gpu is 10000000000000000000, "
     "more than Kubernetes can count (at most 9223372036854775807)"),
    ({"generictemplate": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {
        "template": {"spec": {"initContainers": [{"name": "i", "resources": {"limits": {"cpu": "1e30"}}}],
                              "containers": [], "overhead": {"memory": "1e30"}}}}}},
     "GenericItems[0] (Job j): generictemplate.spec.template.spec.initContainers[0].resources.limits.cpu is "
     "'1e30', more than Kubernetes can count (at most 9223372036854775807m); GenericItems[0] (Job j): "
     "generictemplate.spec.template.spec.overhead.memory is '1e30', more than Kubernetes can count (at most "
     "9223372036854775807)"),
])
def test_quantities_beyond_what_kubernetes_counts_are_refused(item: dict[str, Any], message: str) -> None:
    assert refusal(aw(item)) == message


def test_the_largest_quantities_kubernetes_counts_pass() -> None:
    assert problems(aw(pod("p", cpu="9223372036854775807m", memory="9223372036854775807"),
                       pod("q", cpu="9223372036854775", memory="7Ei"))) == []


def test_a_quantity_that_does_not_parse_is_left_to_the_demand_computation() -> None:
    assert problems(aw(pod("p", cpu="lots"))) == []
    assert "invalid quantity 'lots'" in (appwrapper_view(aw(pod("p", cpu="lots"))).demand_error or "")


def test_too_many_items_and_too_many_bytes_are_refused_with_the_flag_named() -> None:
    limits = Limits(max_items=2, max_bytes=2048)
    assert problems(aw(cm("a"), cm("b")), limits) == []
    assert problems(aw(cm("a"), cm("b"), cm("c")), limits) == [
        "spec.resources.GenericItems has 3 items; at most 2 are allowed (--max-items)"]
    big = aw(cm("a", k="x" * 2048))
    size = len(json.dumps(big["spec"], separators=(",", ":")))
    assert problems(big, limits) == [f"spec is 0.00 MiB ({size} bytes of JSON); at most 0.00 MiB (2048 bytes) is "
                                     f"allowed (--max-appwrapper-bytes)"]


def test_the_size_counts_utf8_bytes_not_characters() -> None:
    limits = Limits(max_bytes=1000)
    assert problems(aw(cm("a", k="é" * 300)), limits) == []  # 600 bytes
    assert problems(aw(cm("a", k="é" * 600)), limits) != []  # 1200 bytes


def test_the_default_limits_admit_a_one_mib_appwrapper_of_500_items() -> None:
    items = [cm(f"cm-{i}", k="x" * ((1 << 20) // 500 - 100)) for i in range(500)]
    assert problems(aw(*items)) == []
    assert DEFAULT_MAX_BYTES > 1 << 20


@pytest.mark.parametrize(("spec", "message"), [
    ({"priority": INT32_MAX + 1}, "spec.priority is 2147483648; it must be between -2147483648 and 2147483647"),
    ({"priority": INT32_MIN - 1}, "spec.priority is -2147483649; it must be between -2147483648 and 2147483647"),
    ({"priority": "high"}, "spec.priority must be an integer, got 'high'"),
    ({"schedulingSpec": {"minAvailable": -1}},
     "spec.schedulingSpec.minAvailable is -1; it must be between 0 and 2147483647"),
    ({"schedulingSpec": {"requeuing": {"timeInSeconds": 0}}},
     "spec.schedulingSpec.requeuing.timeInSeconds is 0; it must be between 1 and 604800"),
    ({"schedulingSpec": {"requeuing": {"timeInSeconds": -5}}},
     "spec.schedulingSpec.requeuing.timeInSeconds is -5; it must be between 1 and 604800"),
    ({"schedulingSpec": {"requeuing": {"timeInSeconds": 10**12}}},
     "spec.schedulingSpec.requeuing.timeInSeconds is 1000000000000; it must be between 1 and 604800"),
    ({"schedulingSpec": {"requeuing": {"maxTimeInSeconds": 10**12}}},
     "spec.schedulingSpec.requeuing.maxTimeInSeconds is 1000000000000; it must be between 0 and 604800"),
    ({"schedulingSpec": {"requeuing": {"maxNumRequeuings": -1}}},
     "spec.schedulingSpec.requeuing.maxNumRequeuings is -1; it must be between 0 and 2147483647"),
    ({"schedulingSpec": {"dispatchDuration": {"limit": 10**12}}},
     "spec.schedulingSpec.dispatchDuration.limit is 1000000000000; it must be between 0 and 31536000"),
    ({"schedulingSpec": {"dispatchDuration": {"limit": -1}}},
     "spec.schedulingSpec.dispatchDuration.limit is -1; it must be between 0 and 31536000"),
    ({"schedulingSpec": {"requeuing": {"timeInSeconds": 1.5}}},
     "spec.schedulingSpec.requeuing.timeInSeconds must be an integer, got 1.5"),
])
def test_values_of_old_objects_out_of_range_are_refused(spec: dict[str, Any], message: str) -> None:
    assert problems(aw(cm("a"), **spec)) == [message]


def test_seed_003_misplaced_fields_are_named_with_where_they_belong() -> None:
    """The seed's RayCluster tutorial puts an item's fields directly under spec.resources."""
    seed = {"metadata": {"name": "raycluster-glue", "namespace": "team"}, "spec": {"resources": {
        "custompodresources": [{"replicas": 2, "requests": {"cpu": "3"}}],
        "generictemplate": {"kind": "RayCluster", "spec": {}}}}}
    view = appwrapper_view(seed)
    assert view.demand_error == (
        "spec.resources.generictemplate is misplaced: generictemplate belongs inside an item, as "
        "spec.resources.GenericItems[].generictemplate; spec.resources.custompodresources is misplaced: "
        "custompodresources belongs inside an item, as spec.resources.GenericItems[].custompodresources; "
        "spec.resources.GenericItems is empty: there is nothing to dispatch")


def test_one_message_names_at_most_a_few_problems_and_counts_the_rest() -> None:
    message = refusal(aw(*[cm("same")] * (MAX_REPORTED + 3)))
    assert message is not None
    assert message.count("names the same object") == MAX_REPORTED
    assert message.endswith("; and 2 more problems")


@pytest.mark.parametrize("raw", [
    {}, {"spec": None}, {"spec": []}, {"metadata": "x", "spec": {"resources": "x"}},
    {"spec": {"resources": {"GenericItems": "x"}, "schedulingSpec": ["x"]}},
    {"spec": {"resources": {"GenericItems": [None, 3, "x", [], {"generictemplate": "x"},
                                             {"generictemplate": {"kind": 3, "metadata": []}},
                                             {"custompodresources": [None, {"requests": "x"}]},
                                             {"generictemplate": {"apiVersion": "v1", "kind": "Pod",
                                                                  "spec": {"containers": [None, {"resources": 3}],
                                                                           "overhead": {1: "x"}}}},
                                             {"generictemplate": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                                  "spec": {"replicas": -1}}}]},
              "schedulingSpec": {"requeuing": None, "dispatchDuration": 7}, "priority": None}},
])
def test_junk_never_raises(raw: dict[str, Any]) -> None:
    problems(raw)
    appwrapper_view(raw)


def test_a_view_refuses_with_the_limits_it_is_given() -> None:
    raw = aw(cm("a"), cm("b"))
    assert appwrapper_view(raw).demand_error is None
    assert appwrapper_view(raw, Limits(max_items=1)).demand_error == (
        "spec.resources.GenericItems has 2 items; at most 1 are allowed (--max-items)")


def _schema(path: Any) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    [version] = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", CRDS, ids=lambda p: p.name)
def test_status_is_a_subresource_so_writes_of_the_appwrapper_cannot_change_it(path: Any) -> None:
    """Only writes of appwrappers/status change status (and admission lets only the controller make them)."""
    [version] = yaml.safe_load(path.read_text())["spec"]["versions"]
    assert version["subresources"]["status"] == {}


@pytest.mark.parametrize("path", CRDS, ids=lambda p: p.name)
def test_the_crds_declare_the_bounds_the_controller_enforces(path: Any) -> None:
    root = _schema(path)
    assert root["properties"]["metadata"]["properties"]["name"]["maxLength"] == MAX_NAME_LENGTH
    spec = root["properties"]["spec"]["properties"]
    assert (spec["priority"]["minimum"], spec["priority"]["maximum"]) == (INT32_MIN, INT32_MAX)
    resources = spec["resources"]
    assert resources["properties"]["GenericItems"]["maxItems"] == MAX_ITEMS_CEILING
    # At least one item, and no item fields directly under resources: rules, so all three are named at once.
    assert [r["rule"] for r in resources["x-kubernetes-validations"]] == [
        "has(self.GenericItems) && size(self.GenericItems) > 0", "!has(self.generictemplate)",
        "!has(self.custompodresources)"]
    scheduling = spec["schedulingSpec"]["properties"]
    requeuing = scheduling["requeuing"]["properties"]

    def bounds(field: dict[str, Any]) -> tuple[int, int]:
        return field["minimum"], field["maximum"]

    assert bounds(scheduling["minAvailable"]) == (0, INT32_MAX)
    assert bounds(requeuing["timeInSeconds"]) == (1, MAX_REQUEUE_SECONDS)
    assert bounds(requeuing["maxTimeInSeconds"]) == (0, MAX_REQUEUE_SECONDS)
    assert bounds(requeuing["maxNumRequeuings"]) == (0, INT32_MAX)
    assert bounds(scheduling["dispatchDuration"]["properties"]["limit"]) == (0, MAX_DISPATCH_LIMIT_SECONDS)


def test_a_spec_is_judged_again_when_its_generation_changes_and_reused_while_it_does_not() -> None:
    raw = {**aw(cm("a")), "metadata": {"name": "aw", "namespace": "team", "uid": "u-judged", "generation": 1}}
    stored = appwrapper_view(raw)
    assert stored.demand_error is None
    edited = {**aw(cm("a"), cm("a")), "metadata": {**raw["metadata"], "generation": 2}}
    assert reuse_spec(stored, edited) is None, "a new generation is judged anew"
    judged = appwrapper_view(edited)
    assert "names the same object as GenericItems[0]" in (judged.demand_error or "")
    # A status write keeps the generation: the judgement is reused (the very same Spec), and stays right.
    status_write = reuse_spec(judged, {**edited, "status": {"state": "Failed"}})
    assert status_write is not None and status_write.spec is judged.spec and status_write.status.state == "Failed"


def test_a_spec_is_reused_only_for_the_same_object_with_a_generation() -> None:
    raw = {**aw(cm("a")), "metadata": {"name": "aw", "namespace": "team", "uid": "u-1", "generation": 1}}
    stored = appwrapper_view(raw)
    assert reuse_spec(stored, {**raw, "metadata": {**raw["metadata"], "uid": "u-2"}}) is None, "re-created"
    assert reuse_spec(stored, {**raw, "metadata": {**raw["metadata"], "generation": None}}) is None
    nameless = appwrapper_view(aw(cm("a")))  # no uid, no generation: nothing to recognise it by
    assert reuse_spec(nameless, aw(cm("a"))) is None


# -- scheduler names ----------------------------------------------------------------------------------------------


def _pod_item(scheduler: object) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}}


def _job_item(scheduler: str) -> dict[str, Any]:
    return {"generictemplate": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {
        "template": {"spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "i"}]}}}}}


def _with_items(*items: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "aw"}, "spec": {"resources": {"GenericItems": list(items)}}}


@pytest.mark.parametrize("scheduler", [None, "", "default-scheduler"])
def test_the_default_scheduler_is_always_allowed(scheduler: object) -> None:
    assert problems(_with_items(_pod_item(scheduler))) == []


def test_another_scheduler_is_refused_naming_the_template_and_the_names_allowed() -> None:
    assert problems(_with_items(_pod_item("nobody"), _job_item("volcano"))) == [
        "GenericItems[0] (Pod p): generictemplate.spec.schedulerName 'nobody' is not a scheduler the cluster admin "
        "allows (default-scheduler; --allowed-scheduler-names): mcad reserves room for pods as the default scheduler "
        "places them, and pods another scheduler places, or none, could hold that room without ever starting",
        "GenericItems[1] (Job j): generictemplate.spec.template.spec.schedulerName 'volcano' is not a scheduler the "
        "cluster admin allows (default-scheduler; --allowed-scheduler-names): mcad reserves room for pods as the "
        "default scheduler places them, and pods another scheduler places, or none, could hold that room without "
        "ever starting"]


def test_the_schedulers_the_admin_allows_are_allowed() -> None:
    limits = Limits(scheduler_names=frozenset({"volcano"}))
    assert problems(_with_items(_job_item("volcano")), limits) == []
    found = problems(_with_items(_pod_item("nobody")), limits)
    assert len(found) == 1 and "(default-scheduler, volcano; --allowed-scheduler-names)" in found[0]
    assert problems(_with_items(_pod_item(["not", "a", "name"])), limits)[0].startswith(
        "GenericItems[0] (Pod p): generictemplate.spec.schedulerName ['not', 'a', 'name'] is not a scheduler")


# -- nesting --------------------------------------------------------------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    """An AppWrapper whose ConfigMap item holds a value nested so that the whole object is ``depth`` deep."""
    inner: Any = "leaf"
    for level in range(depth - 6):  # the AppWrapper, spec, resources, GenericItems, the item, generictemplate
        inner = [inner] if level % 2 else {"k": inner}
    return _with_items({"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                                            "data": inner}})


def test_nesting_up_to_the_limit_is_allowed_and_deeper_is_refused_naming_the_limit() -> None:
    from mcad.api.validation import MAX_NESTING_DEPTH, nesting_depth
    assert nesting_depth(_nested(MAX_NESTING_DEPTH)) == MAX_NESTING_DEPTH
    assert problems(_nested(MAX_NESTING_DEPTH)) == []
    assert problems(_nested(MAX_NESTING_DEPTH + 1)) == [
        f"the AppWrapper nests objects and arrays more than {MAX_NESTING_DEPTH} levels deep; at most "
        f"{MAX_NESTING_DEPTH} are allowed"]


def test_an_object_nested_near_pythons_recursion_limit_is_refused_by_admission_and_failed_by_the_controller() -> None:
    deep = _nested(900)
    deep["metadata"]["namespace"] = "ns"
    assert refusal(deep) is not None and "levels deep" in str(refusal(deep))
    view = appwrapper_view(deep)
    assert view.demand_error is not None and "more than 100 levels deep" in view.demand_error
