"""Hub mode: ``spec.schedulingSpec.clusterScheduling`` parsed into the workers an AppWrapper may go to.

What is pinned here: an absent stanza means anywhere; names and a label selector each restrict, and both must hold;
anything that cannot be understood fits nowhere (never "anywhere") with a message naming the field; and
``appwrapper_view`` carries the parsed stanza, the finalizers and ``status.targetClusterName``.
"""

from __future__ import annotations

from typing import Any

import pytest

from mcad.api.appwrapper import appwrapper_view
from mcad.api.clusterscheduling import ANYWHERE, ClusterScheduling, Requirement, cluster_scheduling

# Three workers with the config labels a hub might give them.
WORKERS: dict[str, dict[str, str]] = {
    "east": {"region": "us-east", "gpu": "a100"},
    "west": {"region": "us-west"},
    "lab": {},
}


def allowed(scheduling: ClusterScheduling) -> list[str]:
    return [name for name, labels in WORKERS.items() if scheduling.allows(name, labels)]


def parse(stanza: Any) -> ClusterScheduling:
    return cluster_scheduling({"clusterScheduling": stanza})


def test_an_absent_stanza_allows_every_worker() -> None:
    parsed = cluster_scheduling({"minAvailable": 1})
    assert parsed is ANYWHERE
    assert not parsed.constrained
    assert allowed(parsed) == ["east", "west", "lab"]
    assert parsed.describe() == "any cluster"


def test_an_explicit_null_stanza_is_absent() -> None:
    assert parse(None) is ANYWHERE


def test_clusters_by_name_allow_only_those() -> None:
    parsed = parse({"clusters": [{"name": "west"}, {"name": "lab"}]})
    assert parsed.clusters == ("west", "lab")
    assert parsed.constrained and not parsed.error
    assert allowed(parsed) == ["west", "lab"]
    assert parsed.describe() == "clusters west, lab"


def test_match_labels_select_by_the_workers_config_labels() -> None:
    parsed = parse({"clusterSelector": {"matchLabels": {"gpu": "a100"}}})
    assert parsed.selector == (Requirement("gpu", "In", ("a100",)),)
    assert allowed(parsed) == ["east"]


@pytest.mark.parametrize(("expression", "expected"), [
    ({"key": "region", "operator": "In", "values": ["us-west", "eu"]}, ["west"]),
    # NotIn and DoesNotExist match a worker without the key, as in Kubernetes.
    ({"key": "region", "operator": "NotIn", "values": ["us-west"]}, ["east", "lab"]),
    ({"key": "region", "operator": "Exists"}, ["east", "west"]),
    ({"key": "region", "operator": "DoesNotExist"}, ["lab"]),
])
def test_match_expressions_use_the_kubernetes_operators(expression: dict[str, Any], expected: list[str]) -> None:
    parsed = parse({"clusterSelector": {"matchExpressions": [expression]}})
    assert not parsed.error
    assert allowed(parsed) == expected


def test_every_requirement_of_a_selector_must_hold() -> None:
    parsed = parse({"clusterSelector": {"matchLabels": {"region": "us-east"},
                                        "matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}})
    assert allowed(parsed) == [], "east has the region but also a gpu label"


def test_names_and_selector_must_both_hold() -> None:
    parsed = parse({"clusters": [{"name": "west"}, {"name": "lab"}],
                    "clusterSelector": {"matchExpressions": [{"key": "region", "operator": "Exists"}]}})
    assert allowed(parsed) == ["west"], "lab is named but has no region; east has one but is not named"
    assert parsed.describe() == "clusters west, lab and clusterSelector region"


def test_an_empty_selector_selects_every_worker_as_in_kubernetes() -> None:
    parsed = parse({"clusterSelector": {}})
    assert parsed.selector == ()
    assert allowed(parsed) == ["east", "west", "lab"]


def test_describe_spells_every_operator() -> None:
    parsed = parse({"clusterSelector": {"matchExpressions": [
        {"key": "a", "operator": "In", "values": ["x", "y"]},
        {"key": "b", "operator": "NotIn", "values": ["z"]},
        {"key": "c", "operator": "Exists"},
        {"key": "d", "operator": "DoesNotExist"}]}})
    assert parsed.describe() == "clusterSelector a in (x,y), b notin (z), c, !d"


@pytest.mark.parametrize(("stanza", "field"), [
    ("east", "clusterScheduling must be an object"),
    (["east"], "clusterScheduling must be an object"),
    ({"clusters": [{"name": "east"}, {}]}, "clusters[1].name"),
    ({"clusters": [{"name": ""}]}, "clusters[0].name"),
    ({"clusters": ["east"]}, "clusters[0].name"),
    ({"clusterSelector": "gpu=a100"}, "clusterSelector: must be an object"),
    ({"clusterSelector": {"matchExpressions": [{"key": "gpu", "operator": "Equals", "values": ["a"]}]}},
     "matchExpressions[0].operator"),
    ({"clusterSelector": {"matchExpressions": [{"key": "gpu", "operator": "In"}]}}, "matchExpressions[0]: In needs"),
    ({"clusterSelector": {"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": []}]}},
     "matchExpressions[0]: NotIn needs"),
    ({"clusterSelector": {"matchExpressions": [{"key": "gpu", "operator": "Exists", "values": ["a"]}]}},
     "matchExpressions[0]: Exists takes no values"),
    ({"clusterSelector": {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist", "values": ["a"]}]}},
     "matchExpressions[0]: DoesNotExist takes no values"),
    ({"clusterSelector": {"matchExpressions": [{"operator": "Exists"}]}}, "matchExpressions[0].key"),
    ({"clusterSelector": {"matchExpressions": [{"key": "zone", "operator": "In", "values": [1]}]}},
     "matchExpressions[0].values must be strings"),
    ({"clusterSelector": {"matchLabels": {"gpu": True}}}, "matchLabels[gpu] must be a string"),
])
def test_invalid_input_fits_nowhere_and_names_the_field(stanza: Any, field: str) -> None:
    parsed = parse(stanza)
    assert field in parsed.error
    assert parsed.constrained
    assert allowed(parsed) == [], "what cannot be understood must not read as 'anywhere'"
    assert parsed.describe() == f"clusterScheduling is invalid: {parsed.error}"


def test_the_second_invalid_expression_is_named_by_its_index() -> None:
    parsed = parse({"clusterSelector": {"matchExpressions": [
        {"key": "region", "operator": "Exists"}, {"key": "gpu", "operator": "in", "values": ["a"]}]}})
    assert "matchExpressions[1].operator" in parsed.error
    assert "'in'" in parsed.error, "the rejected operator is quoted, so a wrong case is visible"


# -- the AppWrapper view -----------------------------------------------------------------------------------------


def raw_appwrapper(**extra: Any) -> dict[str, Any]:
    scheduling = extra.pop("scheduling", None)
    spec: dict[str, Any] = {"resources": {"GenericItems": []}}
    if scheduling is not None:
        spec["schedulingSpec"] = scheduling
    return {"metadata": {"name": "a", "namespace": "ns", "uid": "u-a", **extra.pop("metadata", {})},
            "spec": spec, "status": extra.pop("status", {})}


def test_view_fills_clusters_finalizers_and_target_cluster() -> None:
    view = appwrapper_view(raw_appwrapper(
        scheduling={"minAvailable": 1, "clusterScheduling": {"clusters": [{"name": "west"}]}},
        metadata={"finalizers": ["workload.codeflare.dev/worker-cleanup", "other/keep"]},
        status={"targetClusterName": "west"}))
    assert view.clusters == ClusterScheduling(clusters=("west",))
    assert view.finalizers == ("workload.codeflare.dev/worker-cleanup", "other/keep")
    assert view.target_cluster == "west"


def test_view_defaults_are_anywhere_no_finalizers_and_no_target() -> None:
    view = appwrapper_view(raw_appwrapper())
    assert view.clusters is ANYWHERE
    assert view.finalizers == ()
    assert view.target_cluster == ""


def test_view_of_a_malformed_scheduling_spec_keeps_the_error() -> None:
    view = appwrapper_view(raw_appwrapper(scheduling={"clusterScheduling": {"clusters": [{"name": 7}]}}))
    assert "clusters[0].name" in view.clusters.error
    assert not view.clusters.allows("west", {})


def test_view_ignores_finalizers_that_are_not_strings_and_a_non_list() -> None:
    assert appwrapper_view(raw_appwrapper(metadata={"finalizers": ["a", 3, None]})).finalizers == ("a",)
    assert appwrapper_view(raw_appwrapper(metadata={"finalizers": "a"})).finalizers == ()


@pytest.mark.parametrize("stanza", [
    {"clusters": "east"},
    {"clusters": {"name": "east"}},
    {"clusterSelector": {"matchLabels": "gpu=a100"}},
    {"clusterSelector": {"matchExpressions": {"key": "gpu", "operator": "Exists"}}},
])
def test_a_field_of_the_wrong_shape_fits_nowhere_instead_of_anywhere(stanza: dict[str, Any]) -> None:
    parsed = cluster_scheduling({"clusterScheduling": stanza})
    assert parsed.error
    assert not parsed.allows("west", {})
