"""The quota forest without a cluster: upstream's QuotaSubtree YAML, charges by label, borrowing and hard limits,
reclaim victims, trees changing under running AppWrappers, and a randomized check that usage is always exactly
the sum of the charged demands."""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml

from mcad.api.resources import ResourceVector
from mcad.model.quota import Forest, QuotaLedger, subtree_view

# Upstream's kuttl trees (test/e2e-kuttl/install-quota-subtree.yaml), in the current group.
UPSTREAM = """
apiVersion: quota.codeflare.dev/v1alpha1
kind: QuotaSubtree
metadata: {name: context-root, namespace: kube-system, labels: {tree: quota_context}}
spec:
  children:
    - name: context-root
      quotas: {requests: {cpu: 1075m, memory: 1045Mi}}
---
apiVersion: quota.codeflare.dev/v1alpha1
kind: QuotaSubtree
metadata: {name: service-root, namespace: kube-system, labels: {tree: quota_service}}
spec:
  children:
    - name: service-root
      quotas: {requests: {cpu: 1075m, memory: 1045Mi}}
---
apiVersion: quota.codeflare.dev/v1alpha1
kind: QuotaSubtree
metadata: {name: context-root-children, namespace: kube-system, labels: {tree: quota_context}}
spec:
  parent: context-root
  children:
    - {name: gold, quotas: {requests: {cpu: 1075m, memory: 450Mi}}}
    - {name: silver, quotas: {hardLimit: false, requests: {cpu: 1075m, memory: 400Mi}}}
    - {name: bronze, quotas: {hardLimit: true, requests: {cpu: 900m, memory: 300Mi}}}
    - {name: default, quotas: {hardLimit: false, requests: {cpu: 0m, memory: 0Mi}}}
---
apiVersion: quota.codeflare.dev/v1alpha1
kind: QuotaSubtree
metadata: {name: service-root-children, namespace: kube-system, labels: {tree: quota_service}}
spec:
  parent: service-root
  children:
    - {name: gold, quotas: {requests: {cpu: 1075m, memory: 1045Mi}}}
    - {name: default, quotas: {hardLimit: false, requests: {cpu: 0m, memory: 0Mi}}}
"""


def forest(text: str = UPSTREAM) -> Forest:
    return Forest.build(subtree_view(doc) for doc in yaml.safe_load_all(text))


def cpu(millis: int, memory_mi: int = 0) -> ResourceVector:
    return ResourceVector({"cpu": millis, "memory": memory_mi * 2**20})


def ledger() -> QuotaLedger:
    return QuotaLedger(forest())


def test_upstream_trees_parse_into_a_forest() -> None:
    f = forest()
    assert sorted(f.trees) == ["quota_context", "quota_service"]
    context = f.trees["quota_context"]
    assert context.ordered() == ["context-root", "gold", "silver", "bronze", "default"]
    assert context.resources == {"cpu", "memory"}
    assert context.nodes["bronze"].hard and not context.nodes["silver"].hard
    assert context.nodes["gold"].limit == cpu(1075, 450)
    assert context.nodes["gold"].defined_by == "kube-system/context-root-children"
    assert not context.errors


def test_charges_follow_labels_then_default_nodes_and_name_unknown_nodes() -> None:
    f = forest()
    assert f.charges({"quota_context": "gold"}) == (
        (("quota_context", "gold"), ("quota_service", "default")), None)
    assert f.charges({}) == ((("quota_context", "default"), ("quota_service", "default")), None)
    assert f.charges({"app": "x"})[0] == (("quota_context", "default"), ("quota_service", "default"))
    charges, error = f.charges({"quota_context": "context-root2"})
    assert charges == () and error is not None and "quota_context" in error and "context-root2" in error
    no_default = forest(UPSTREAM.replace("    - {name: default, quotas: {hardLimit: false, requests: {cpu: 0m, "
                                         "memory: 0Mi}}}\n", ""))
    assert no_default.charges({}) == ((), None), "a tree without a default node is ignored, not required"


def test_a_soft_node_borrows_through_its_parent_and_a_hard_one_never() -> None:
    q = ledger()
    silver = (("quota_context", "silver"),)
    assert q.check(silver, cpu(500, 600)).fits, "600Mi is over silver's 400Mi, but the root has 1045Mi"
    q.charge("ns/s1", {"quota_context": "silver"}, cpu(500, 600))
    assert q.borrowed("quota_context", "silver") == ResourceVector({"memory": 200 * 2**20})
    bronze = (("quota_context", "bronze"),)
    assert q.check(bronze, cpu(400, 100)).fits
    q.charge("ns/b1", {"quota_context": "bronze"}, cpu(400, 100))
    refused = q.check(bronze, cpu(400, 100))
    assert not refused.fits and "bronze" in refused.why, "hard: 800m of 900m used, 400m more is refused"
    assert refused.why == ("quota: node context-root of tree quota_context is full: cpu needs 400m, 175m of 1075m "
                           "left (charged at bronze)")


def test_the_root_bounds_every_child_together() -> None:
    q = ledger()
    q.charge("ns/gold-lo", {"quota_context": "gold"}, cpu(600))
    verdict = q.check((("quota_context", "gold"),), cpu(600))
    assert not verdict.fits and verdict.about == {"quota quota_context/context-root"}


def test_reclaim_takes_back_from_borrowers_lowest_priority_and_newest_first() -> None:
    q = ledger()
    # silver borrows (3 x 300m = 900m cpu, within silver's 1075m, but memory 3 x 200Mi = 600Mi > 400Mi).
    for i in range(3):
        q.charge(f"ns/s{i}", {"quota_context": "silver"}, cpu(300, 200))
    ranks = {"ns/s0": (5, 0), "ns/s1": (1, -1), "ns/s2": (1, -2)}  # s2 is the most recent of the lowest priority
    gold = (("quota_context", "gold"),)
    demand = cpu(200, 400)  # within gold's 450Mi; the root's 1045Mi is taken by silver's borrowing
    assert not q.check(gold, demand).fits
    victims = q.reclaim_victims(gold, demand, rank=lambda k: ranks[k], fits_after=lambda _l, _v: True)
    assert victims == ["ns/s2"]
    assert q.is_charged("ns/s2"), "choosing victims changes nothing"


def test_no_reclaim_for_one_that_would_itself_borrow_or_when_nobody_borrows() -> None:
    q = ledger()
    q.charge("ns/g", {"quota_context": "gold"}, cpu(1000, 400))
    gold = (("quota_context", "gold"),)
    assert q.reclaim_victims(gold, cpu(200, 100), rank=lambda k: (0,), fits_after=lambda _l, _v: True) is None
    silver = (("quota_context", "silver"),)
    assert q.reclaim_victims(silver, cpu(100, 500), rank=lambda k: (0,), fits_after=lambda _l, _v: True) is None


def test_reclaim_for_cluster_capacity_asks_the_caller() -> None:
    q = ledger()
    q.charge("ns/d1", {}, cpu(500))  # the default node (0 cpu) borrows 500m
    q.charge("ns/d2", {}, cpu(500))
    gold = (("quota_context", "gold"),)
    assert q.check(gold, cpu(50)).fits, "quota is fine: the root has 75m left"
    seen: list[list[str]] = []

    def capacity_after(_ledger: QuotaLedger, victims: list[str]) -> bool:
        seen.append(list(victims))
        return len(victims) >= 1  # the cluster is full until one borrower's pods go

    victims = q.reclaim_victims(gold, cpu(50), rank=lambda k: (0, k), fits_after=capacity_after)
    assert victims == ["ns/d1"] and seen[0] == []


def test_tree_errors_are_reported_and_the_rest_works() -> None:
    text = UPSTREAM + """
---
apiVersion: quota.codeflare.dev/v1alpha1
kind: QuotaSubtree
metadata: {name: broken, namespace: kube-system, labels: {tree: quota_context}}
spec:
  parent: nowhere
  children:
    - {name: orphan, quotas: {requests: {cpu: 1}}}
    - {name: gold, quotas: {requests: {cpu: 1}}}
    - {quotas: {requests: {cpu: 1}}}
---
apiVersion: quota.codeflare.dev/v1alpha1
kind: QuotaSubtree
metadata: {name: nolabel, namespace: kube-system}
spec: {children: [{name: x}]}
"""
    f = forest(text)
    errors = f.trees["quota_context"].errors
    assert any("a child has no name" in e for e in errors)
    assert any("gold is defined by both" in e for e in errors)
    assert any("orphan" in e and "nowhere" in e for e in errors)
    assert "orphan" not in f.trees["quota_context"].nodes
    assert f.trees["quota_context"].nodes["gold"].defined_by == "kube-system/context-root-children"


def test_a_tree_added_or_removed_recharges_running_appwrappers() -> None:
    q = QuotaLedger(forest(UPSTREAM.split("---")[0] + "---" + UPSTREAM.split("---")[2]))  # quota_context only
    q.charge("ns/a", {"quota_context": "gold", "quota_service": "gold"}, cpu(100))
    assert q.consumer("ns/a").charges == (("quota_context", "gold"),)  # type: ignore[union-attr]
    q.set_forest(forest())
    assert q.consumer("ns/a").charges == (("quota_context", "gold"), ("quota_service", "gold"))  # type: ignore[union-attr]
    assert q.usage("quota_service", "service-root") == cpu(100)
    q.set_forest(Forest())
    assert q.usage("quota_context", "gold") == ResourceVector() and q.is_charged("ns/a")


def expected_usage(q: QuotaLedger) -> dict[tuple[str, str], ResourceVector]:
    out: dict[tuple[str, str], ResourceVector] = {}
    for key in q.charged_keys():
        consumer = q.consumer(key)
        assert consumer is not None
        for tree, node in consumer.charges:
            for name in q.forest.trees[tree].path(node):
                out[(tree, name)] = out.get((tree, name), ResourceVector()) + consumer.demand
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("seed", range(20))
def test_usage_is_always_the_sum_of_charged_demands(seed: int) -> None:
    rng = random.Random(seed)
    forests = [forest(), Forest(), forest(UPSTREAM.split("---")[0] + "---" + UPSTREAM.split("---")[2])]
    q = QuotaLedger(forests[0])
    label_choices: list[dict[str, Any]] = [{}, {"quota_context": "gold"}, {"quota_context": "silver"},
                                           {"quota_context": "bronze", "quota_service": "gold"}, {"x": "y"}]
    for step in range(300):
        action = rng.random()
        key = f"ns/aw{rng.randrange(30)}"
        if action < 0.5:
            q.charge(key, rng.choice(label_choices), cpu(rng.randrange(1, 500), rng.randrange(0, 300)))
        elif action < 0.9:
            q.release(key)
        elif action < 0.95:
            q.set_forest(rng.choice(forests))
        else:  # a restart: a fresh ledger charged again from what is dispatched
            fresh = QuotaLedger(q.forest)
            for k in q.charged_keys():
                c = q.consumer(k)
                assert c is not None
                fresh.charge(k, c.labels, c.demand)
            q = fresh
        actual = {(t, n): q.usage(t, n) for t, tree in q.forest.trees.items() for n in tree.nodes if q.usage(t, n)}
        assert actual == expected_usage(q), f"seed {seed}, step {step}"


def test_a_borrower_charged_at_the_reclaimers_node_in_another_tree_is_reclaimed() -> None:
    """Upstream's borrowing case: my-job-1 borrows in quota_context (silver) and is charged at gold in
    quota_service; my-job-2 (gold in both) is within its own quota only once my-job-1 is gone from both trees."""
    q = ledger()
    q.charge("ns/my-job-1", {"quota_context": "silver", "quota_service": "gold"}, cpu(1000, 600))
    mine = (("quota_context", "gold"), ("quota_service", "gold"))
    demand = cpu(500, 300)
    assert q.borrows_at_own_node(mine, demand), "with my-job-1 still charged at service/gold"
    victims = q.reclaim_victims(mine, demand, rank=lambda k: (0, k), fits_after=lambda _l, _v: True)
    assert victims == ["ns/my-job-1"]


def reference_borrowers(q: QuotaLedger, charges: tuple[tuple[str, str], ...], skip: set[str]) -> list[str]:
    """``borrowers`` as the rule reads: those charged off the path of ``charges``' node, under a node over its
    limit that is not on that path."""
    out: set[str] = set()
    for tree_name, node in charges:
        tree = q.forest.trees[tree_name]
        mine = set(tree.path(node))
        for key in q.charged_keys():
            consumer = q.consumer(key)
            assert consumer is not None
            for t, name in consumer.charges:
                if t == tree_name and name not in mine and key not in skip and any(
                        q.borrowed(t, n) for n in tree.path(name) if n not in mine):
                    out.add(key)
    return sorted(out)


def reference_reclaim(q: QuotaLedger, charges: tuple[tuple[str, str], ...], demand: ResourceVector,
                      rank: Any, fits_after: Any) -> list[str] | None:
    """The reclaim rule written plainly: the lowest-ranked borrower now, one at a time, on a fresh copy each time;
    then each victim not needed after all given back, the most valuable first."""
    def enough(ledger: QuotaLedger, victims: list[str]) -> bool:
        return (ledger.check(charges, demand).fits and not ledger.borrows_at_own_node(charges, demand)
                and fits_after(ledger, victims))

    trial, chosen = q.copy(), []
    while not enough(trial, chosen):
        candidates = reference_borrowers(trial, charges, set(chosen))
        if not candidates:
            return None
        chosen.append(min(candidates, key=rank))
        trial.release(chosen[-1])
    for victim in sorted(chosen, key=rank, reverse=True):
        rest = [v for v in chosen if v != victim]
        again = q.copy()
        for v in rest:
            again.release(v)
        if enough(again, rest):
            chosen = rest
    return chosen


@pytest.mark.parametrize("seed", range(40))
def test_reclaim_chooses_as_the_rule_written_plainly_does(seed: int) -> None:
    rng = random.Random(seed)
    q = ledger()
    labels: list[dict[str, str]] = [{}, {"quota_context": "silver"}, {"quota_context": "bronze"},
                                    {"quota_context": "silver", "quota_service": "gold"}, {"quota_context": "gold"}]
    for i in range(rng.randrange(5, 40)):
        q.charge(f"ns/aw{i}", rng.choice(labels), cpu(rng.randrange(10, 300), rng.randrange(0, 200)))
    ranks = {key: (rng.randrange(3), rng.random(), key) for key in q.charged_keys()}
    needed = rng.randrange(0, 4)  # the cluster is full until this many victims' pods go

    def fits_after(_ledger: QuotaLedger, victims: list[str]) -> bool:
        return len(victims) >= needed

    for charges in ((("quota_context", "gold"),), (("quota_context", "gold"), ("quota_service", "gold"))):
        for demand in (cpu(rng.randrange(10, 600), rng.randrange(0, 400)), cpu(50)):
            assert sorted(q.borrowers(charges)) == reference_borrowers(q, charges, set())
            assert (q.reclaim_victims(charges, demand, rank=lambda k: ranks[k], fits_after=fits_after)
                    == reference_reclaim(q, charges, demand, lambda k: ranks[k], fits_after)), (seed, charges)
