"""Fair-share weights: what the admin may write (mcad.model.fairweight), where each kind of tenant's is read
(a Namespace's label, a QuotaSubtree child's field), and how a weight scales a tenant's score in a pass."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcad.model.fairshare import ENTRY_SECONDS, FairPass
from mcad.model.fairweight import MAX_WEIGHT, MIN_WEIGHT, WEIGHT_FIELD, WEIGHT_LABEL, parse_weight
from mcad.model.quota import Forest, subtree_view
from mcad.model.tenancy import namespace_policy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("value", "expected"), [
    (None, 1.0), ("2", 2.0), (" 0.5 ", 0.5), (".25", 0.25), ("100", 100.0), ("0.01", 0.01), (3, 3.0), (1.5, 1.5),
])
def test_a_weight_the_admin_wrote_is_read(value: object, expected: float) -> None:
    assert parse_weight(value, "here") == (expected, "")


@pytest.mark.parametrize("value", [
    "0", "-1", "0.001", "101", "1e2", "inf", "nan", "two", "", "٣", "1.2.3", "1" * 30, 0, -2, 1000, 1e-9,
    math.inf, math.nan, True, [2], {"w": 2},
])
def test_what_is_not_a_weight_is_weight_one_and_says_why(value: object) -> None:
    weight, problem = parse_weight(value, "namespace x: label L")
    assert weight == 1.0
    assert problem.startswith(f"namespace x: label L={value!r} is not a fair-share weight (a number from 0.01 to "
                              f"100); weight 1 applies")


def namespace(name: str, labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}}


def test_a_namespace_weight_is_its_label() -> None:
    assert namespace_policy(namespace("team-a", {WEIGHT_LABEL: "2"})).fair_share_weight == 2.0
    assert namespace_policy(namespace("team-a")).fair_share_weight == 1.0
    # An annotation of that name is not where an admin sets it: one place, the one `kubectl get ns -L` lists.
    policy = namespace_policy(namespace("team-a", annotations={WEIGHT_LABEL: "2"}))
    assert policy.fair_share_weight == 1.0 and policy.problem == ""


def test_a_bad_namespace_weight_is_one_and_its_problem_joins_the_ceilings() -> None:
    policy = namespace_policy(namespace("team-a", {WEIGHT_LABEL: "500"},
                                        {"mcad.codeflare.dev/max-priority": "lots"}))
    assert policy.fair_share_weight == 1.0
    assert policy.problem == ("namespace team-a: annotation mcad.codeflare.dev/max-priority='lots' is not an "
                              "integer; the default ceiling applies; "
                              f"namespace team-a: label {WEIGHT_LABEL}='500' is not a fair-share weight (a number "
                              f"from 0.01 to 100); weight 1 applies")


def subtree(children: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "teams", "namespace": "kube-system", "labels": {"tree": "t"}},
            "spec": {"children": children}}


def test_a_quota_node_weight_is_its_child_field_and_a_bad_one_is_an_error_of_the_tree() -> None:
    view = subtree_view(subtree([
        {"name": "gold", WEIGHT_FIELD: 3, "quotas": {"requests": {"cpu": "4"}}},
        {"name": "silver", "quotas": {"requests": {"cpu": "4"}}},
        {"name": "bronze", WEIGHT_FIELD: "heavy", "quotas": {"requests": {"cpu": "4"}}},
    ]))
    assert {node.name: node.weight for node in view.nodes} == {"gold": 3.0, "silver": 1.0, "bronze": 1.0}
    assert view.errors == (f"QuotaSubtree kube-system/teams: node bronze: {WEIGHT_FIELD}='heavy' is not a fair-share "
                           f"weight (a number from 0.01 to 100); weight 1 applies",)
    tree = Forest.build([view]).trees["t"]
    assert tree.nodes["gold"].weight == 3.0 and "bronze" in tree.nodes, "a bad weight leaves the node's quota be"
    assert tree.errors == list(view.errors)


@pytest.mark.parametrize("path", ["config/crd/quota.codeflare.dev_quotasubtrees.yaml",
                                  "charts/mcad/crds/quota.codeflare.dev_quotasubtrees.yaml"])
def test_the_crd_bounds_the_field_as_the_controller_does(path: str) -> None:
    """The API server refuses what the controller would ignore, so an admin hears of it when applying."""
    crd = yaml.safe_load((REPO / path).read_text())
    for version in crd["spec"]["versions"]:
        child = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["children"]["items"]
        field = child["properties"][WEIGHT_FIELD]
        assert (field["type"], field["minimum"], field["maximum"]) == ("number", MIN_WEIGHT, MAX_WEIGHT)


# -- scores ----------------------------------------------------------------------------------------------------------


def test_a_score_is_usage_over_weight_and_a_pass_asks_each_weight_once() -> None:
    asked: list[str] = []
    weights = {"a": 2.0, "b": 1.0}

    def weight(tenant: str) -> float:
        asked.append(tenant)
        return weights.get(tenant, 1.0)

    fair = FairPass({"a": 10.0, "b": 6.0}, weight)
    assert fair.score("a") == 5.0 and fair.score("b") == 6.0, "a used more, but less than twice b: a goes first"
    weights["a"] = 1.0
    assert fair.score("a") == 5.0, "a weight changed during a pass counts from the next one"
    assert sorted(asked) == ["a", "b"]


def test_a_dispatch_adds_its_entry_over_the_weight_so_turns_follow_the_weights() -> None:
    fair = FairPass({}, {"a": 2.0, "b": 1.0}.__getitem__)
    order = []
    for _ in range(6):  # equal usage: each turn goes to the lowest score, each dispatch of the whole cluster
        tenant = min(("a", "b"), key=lambda t: (fair.score(t), t))
        order.append(tenant)
        fair.took(tenant, 1.0)
    assert order == ["a", "b", "a", "a", "b", "a"]
    assert fair.score("a") == pytest.approx(4 * ENTRY_SECONDS / 2) and fair.score("b") == 2 * ENTRY_SECONDS


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_a_weight_a_division_cannot_take_is_one(bad: float) -> None:
    assert FairPass({"a": 4.0}, lambda _t: bad).score("a") == 4.0
