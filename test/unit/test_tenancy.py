"""The namespace admin's rules (mcad.model.tenancy): quota bindings, the priority ceiling, and what admission
refuses."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from mcad.admission.facts import Decision, Resource
from mcad.admission.request import UserInfo
from mcad.model.tenancy import (
    DEFAULT_MAX_PRIORITY,
    admission_patch,
    admission_problems,
    charged_labels,
    effective_priority,
    namespace_policy,
)


def namespace(name: str, labels: Mapping[str, str] | None = None,
              annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})}}


class Facts:
    def __init__(self, namespaces: Sequence[dict[str, Any]] = (), classes: Mapping[str, int] | None = None) -> None:
        self.namespaces = {n["metadata"]["name"]: n for n in namespaces}
        self.classes = dict(classes or {})

    def resource_for(self, api_version: str, kind: str) -> Resource | None:
        raise AssertionError("not asked")

    def may(self, user: UserInfo, verb: str, resource: Resource, namespace: str, name: str = "") -> Decision:
        raise AssertionError("not asked")

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        return self.namespaces.get(name)

    def priority_class(self, name: str) -> int | None:
        return self.classes.get(name)


def deployment(name: str, replicas: int, cpu: str, **item: Any) -> dict[str, Any]:
    return {**item, "generictemplate": {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}}}}


def appwrapper(ns: str = "team-a", labels: Mapping[str, str] | None = None, items: list[Any] | None = None,
               **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "job", "namespace": ns}
    if labels is not None:
        meta["labels"] = dict(labels)
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper", "metadata": meta,
            "spec": {**spec, "resources": {"GenericItems": items if items is not None else
                                           [deployment("web", 1, "100m")]}}}


TEAM_A = namespace("team-a", labels={"quota.codeflare.dev/tenants": "team-a", "other": "x"})


# -- namespace policy ---------------------------------------------------------------------------------------------


def test_a_namespace_label_binds_a_tree_and_an_annotation_sets_the_ceiling() -> None:
    policy = namespace_policy(namespace("team-a", labels={"quota.codeflare.dev/tenants": "team-a",
                                                          "quota.codeflare.dev/": "ignored", "tenants": "no"},
                                        annotations={"mcad.codeflare.dev/max-priority": " 50000 "}))
    assert dict(policy.bindings) == {"tenants": "team-a"}
    assert policy.ceiling(DEFAULT_MAX_PRIORITY) == 50000


@pytest.mark.parametrize("annotation", ["lots", "1e6", ""])
def test_an_unreadable_ceiling_is_the_default_and_says_so(annotation: str) -> None:
    policy = namespace_policy(namespace("ns", annotations={"mcad.codeflare.dev/max-priority": annotation}))
    assert policy.ceiling(1000) == 1000
    assert "is not an integer" in policy.problem


def test_a_ceiling_beyond_int32_is_int32() -> None:
    policy = namespace_policy(namespace("ns", annotations={"mcad.codeflare.dev/max-priority": str(2**40)}))
    assert policy.ceiling(1000) == 2**31 - 1


def test_a_bound_tree_charges_the_bound_node_whatever_the_label() -> None:
    policy = namespace_policy(TEAM_A)
    assert charged_labels({"tenants": "team-b", "t2": "x"}, policy) == {"tenants": "team-a", "t2": "x"}
    assert charged_labels({}, policy) == {"tenants": "team-a"}, "no label: charged all the same"
    same = {"tenants": "team-a"}
    assert charged_labels(same, policy) is same
    unbound = {"tenants": "team-b"}
    assert charged_labels(unbound, namespace_policy(namespace("free"))) is unbound, "unbound: the label decides"


def test_the_priority_is_the_class_value_or_the_number_capped_at_the_ceiling() -> None:
    assert effective_priority(2**31 - 1, "", None, 1000) == (1000, "")
    assert effective_priority(10, "", None, 1000) == (10, "")
    assert effective_priority(-5, "", None, 1000) == (-5, "")
    assert effective_priority(7, "high", 100_000, 1000) == (1000, ""), "a class is capped too"
    assert effective_priority(7, "low", 10, 1000) == (10, ""), "the class wins over spec.priority"
    value, held = effective_priority(7, "nope", None, 1000)
    assert value == 7 and "'nope'" in held and "no PriorityClass" in held


# -- admission ----------------------------------------------------------------------------------------------------


def test_admission_refuses_a_label_naming_another_node_and_names_both() -> None:
    [problem] = admission_problems(appwrapper(labels={"tenants": "team-b"}), Facts([TEAM_A]), 1000)
    assert problem.startswith("metadata.labels.tenants: 'team-b' names quota node team-b of tree tenants, but the "
                              "cluster admin binds namespace team-a to node team-a")
    assert admission_problems(appwrapper(labels={"tenants": "team-a"}), Facts([TEAM_A]), 1000) == []
    assert admission_problems(appwrapper(), Facts([TEAM_A]), 1000) == []
    assert admission_problems(appwrapper("free", labels={"tenants": "team-b"}), Facts([namespace("free")]),
                              1000) == [], "not bound: today's label behaviour"


def test_admission_adds_the_bound_labels_and_never_replaces_one() -> None:
    facts = Facts([namespace("team-a", labels={"quota.codeflare.dev/tenants": "team-a",
                                               "quota.codeflare.dev/a~b": "n"})])
    assert admission_patch(appwrapper(), facts) == [
        {"op": "add", "path": "/metadata/labels", "value": {"a~b": "n", "tenants": "team-a"}}]
    assert admission_patch(appwrapper(labels={"x": "y"}), facts) == [
        {"op": "add", "path": "/metadata/labels/a~0b", "value": "n"},
        {"op": "add", "path": "/metadata/labels/tenants", "value": "team-a"}]
    assert admission_patch(appwrapper(labels={"tenants": "team-b", "a~b": "n"}), facts) == []
    assert admission_patch(appwrapper("free"), Facts([namespace("free")])) == []
    assert admission_patch(appwrapper("gone"), Facts()) == []


def test_admission_refuses_a_priority_above_the_ceiling() -> None:
    facts = Facts([namespace("team-a"), namespace("vip", annotations={"mcad.codeflare.dev/max-priority": "50000"})])
    [problem] = admission_problems(appwrapper(priority=2**31 - 1), facts, 1000)
    assert problem == ("spec.priority 2147483647 is above the ceiling 1000 of namespace team-a (set by the "
                       "controller's --default-max-priority)")
    assert admission_problems(appwrapper(priority=1000), facts, 1000) == []
    assert admission_problems(appwrapper("vip", priority=50000), facts, 1000) == []
    [problem] = admission_problems(appwrapper("vip", priority=50001), facts, 1000)
    assert "ceiling 50000 of namespace vip (set by namespace vip's annotation mcad.codeflare.dev/max-priority)" \
        in problem


def test_admission_resolves_priority_class_names() -> None:
    facts = Facts([namespace("team-a")], classes={"low": 10, "system-node-critical": 2000001000})
    assert admission_problems(appwrapper(priorityClassName="low"), facts, 1000) == []
    assert admission_problems(appwrapper(priorityClassName="low", priority=10), facts, 1000) == []
    assert admission_problems(appwrapper(priorityClassName="nope"), facts, 1000) == [
        "spec.priorityClassName: there is no PriorityClass 'nope'"]
    assert admission_problems(appwrapper(priorityClassName="low", priority=5), facts, 1000) == [
        "spec.priority 5 differs from the value 10 of PriorityClass 'low' (spec.priorityClassName): give one of them"]
    [problem] = admission_problems(appwrapper(priorityClassName="system-node-critical"), facts, 1000)
    assert problem.startswith("spec.priorityClassName: PriorityClass 'system-node-critical' has value 2000001000, "
                              "above the ceiling 1000 of namespace team-a")


def test_admission_refuses_custompodresources_below_the_templates_naming_both_figures() -> None:
    """A tenant's understatement: 1 pod x 1m in front of 6 pods of 3 cpu."""
    understated = deployment("web", 6, "3", custompodresources=[{"replicas": 1, "requests": {"cpu": "1m"}}])
    enough = deployment("ok", 2, "1", custompodresources=[{"replicas": 2, "requests": {"cpu": "1", "memory": "1Gi"}}])
    [problem] = admission_problems(appwrapper(items=[enough, understated]), Facts([namespace("team-a")]), 1000)
    assert problem == ("GenericItems[1] (Deployment web): custompodresources declare cpu 1m, less than its "
                       "templates ask, cpu 18; declare at least what the templates ask, or leave "
                       "custompodresources out")


def test_admission_leaves_uncountable_items_to_the_shape_checks() -> None:
    bad = deployment("web", 1, "lots", custompodresources=[{"replicas": 1, "requests": {"cpu": "1m"}}])
    assert admission_problems(appwrapper(items=[bad, "junk"]), Facts([namespace("team-a")]), 1000) == []


def with_pod_priority(template: dict[str, Any], path: Sequence[Any], **fields: Any) -> dict[str, Any]:
    target = template
    for step in path:
        target = target[step]
    target.update(fields)
    return template


def ray_cluster() -> dict[str, Any]:
    pod = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    return {"generictemplate": {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "ray"}, "spec": {
        "headGroupSpec": {"template": {"spec": dict(pod)}},
        "workerGroupSpecs": [{"groupName": "w", "replicas": 2, "template": {"spec": dict(pod)}}]}}}


def bare_pod() -> dict[str, Any]:
    return {"generictemplate": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                "spec": {"containers": [{"name": "c"}]}}}


@pytest.mark.parametrize(("item", "path", "where"), [
    (bare_pod(), ("generictemplate", "spec"), "GenericItems[0] (Pod p): generictemplate.spec"),
    (deployment("web", 1, "1"), ("generictemplate", "spec", "template", "spec"),
     "GenericItems[0] (Deployment web): generictemplate.spec.template.spec"),
    (ray_cluster(), ("generictemplate", "spec", "headGroupSpec", "template", "spec"),
     "GenericItems[0] (RayCluster ray): generictemplate.spec.headGroupSpec.template.spec"),
    (ray_cluster(), ("generictemplate", "spec", "workerGroupSpecs", 0, "template", "spec"),
     "GenericItems[0] (RayCluster ray): generictemplate.spec.workerGroupSpecs[0].template.spec"),
], ids=["pod", "deployment", "ray-head", "ray-worker"])
def test_admission_holds_every_pod_templates_priority_to_the_ceiling(item: dict[str, Any], path: Sequence[Any],
                                                                     where: str) -> None:
    """A pod-level priorityClassName inside a template is capped too (else pods get priority 1,000,000)."""
    facts = Facts([namespace("team-a")], classes={"low": 10, "high": 1_000_000})
    ok = with_pod_priority(copy.deepcopy(item), path, priorityClassName="low")
    assert admission_problems(appwrapper(items=[ok]), facts, 1000) == []
    high = with_pod_priority(copy.deepcopy(item), path, priorityClassName="high")
    assert admission_problems(appwrapper(items=[high]), facts, 1000) == [
        f"{where}.priorityClassName: PriorityClass 'high' has value 1000000, above the ceiling 1000 of namespace "
        f"team-a (set by the controller's --default-max-priority): its pods would run, and preempt, at that priority"]
    unknown = with_pod_priority(copy.deepcopy(item), path, priorityClassName="nope")
    assert admission_problems(appwrapper(items=[unknown]), facts, 1000) == [
        f"{where}.priorityClassName: there is no PriorityClass 'nope'"]
    number = with_pod_priority(copy.deepcopy(item), path, priority=1_000_000)
    assert admission_problems(appwrapper(items=[number]), facts, 1000) == [
        f"{where}.priority 1000000 is above the ceiling 1000 of namespace team-a (set by the controller's "
        f"--default-max-priority)"]
    vip = [namespace("team-a", annotations={"mcad.codeflare.dev/max-priority": "1000000"})]
    assert admission_problems(appwrapper(items=[high]), Facts(vip, classes={"high": 1_000_000}), 1000) == []
