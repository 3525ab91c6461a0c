"""Quota trees with priority preemption (``--preemption``): a higher-priority AppWrapper may evict lower-priority
ones to get quota, counting only the quota the victims actually free on its path.

Like test_quota.py: trees per test under unique names in the test's namespace, pods pinned to a fake node.
"""

from __future__ import annotations

from typing import Any

from test.e2e import quota
from test.e2e.conftest import AppWrappers, Controller, condition
from test.e2e.quota import QuotaTrees, node, subtree
from test.support import wait_until

CONTROLLER_ARGS = ("--preemption",)


controller = quota.controller_fixture("test_quota_preemption", *CONTROLLER_ARGS)
on_node = quota.node_fixture("4")
trees = quota.trees


def aw(name: str, labels: dict[str, str], where: dict[str, str], cpu: str, *,
       priority: int | None = None) -> dict[str, Any]:
    return quota.aw(name, labels, where, cpu, memory="95Mi", priority=priority)


def preemptions_logged(controller: Controller) -> int:
    return sum(1 for line in controller.log.read_text(errors="replace").splitlines() if " preempting " in line)


def test_upstream_higher_priority_gold_preempts_lower_priority_gold(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    """test/e2e-kuttl/quota-forest steps 04-06: two 600m gold AppWrappers cannot both fit the 1075m root; the one
    of priority 1000 evicts the one of default priority, which comes back when it is gone."""
    context, service = quota.upstream_trees(trees)
    quota.wait_tree(controller, context, 5)
    quota.wait_tree(controller, service, 3)
    aws.create(aw("job-gold-lo-pri", {context: "gold", service: "gold"}, on_node, "600m"))
    aws.wait_state("job-gold-lo-pri", "Running")

    aws.create(aw("job-gold-hi-pri", {context: "gold", service: "gold"}, on_node, "600m", priority=1000))
    aws.wait_state("job-gold-hi-pri", "Running")
    status = aws.wait_state("job-gold-lo-pri", "Pending")
    preempted = condition(status, "PreemptCandidate")
    assert preempted is not None and preempted["reason"] == "PreemptedByHigherPriority", status.get("conditions")
    assert f"{aws.namespace}/job-gold-hi-pri" in preempted["message"]
    # First its message tells the preemption; then, once queued again, what it waits for: quota.
    wait_until(lambda: context in (aws.status("job-gold-lo-pri").get("message") or ""), 30,
               "job-gold-lo-pri to say it waits on the context tree's quota")

    aws.delete("job-gold-hi-pri")
    aws.wait_state("job-gold-lo-pri", "Running")


def test_priority_preemption_evicts_nobody_whose_quota_would_not_help(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    """A high-priority AppWrapper blocked by its own hard node gains nothing from evicting a low-priority sibling
    elsewhere in the tree: nobody is evicted, and it waits on its node."""
    tree = f"priority_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="2")),
                 subtree("teams", tree, node("hard", hard=True, cpu="500m"), node("soft", cpu="500m"),
                         parent="root"))
    quota.wait_tree(controller, tree, 3)
    aws.create(aw("soft-low", {tree: "soft"}, on_node, "500m", priority=0))
    aws.create(aw("hard-peer", {tree: "hard"}, on_node, "500m", priority=10))
    for name in ("soft-low", "hard-peer"):
        aws.wait_state(name, "Running")
    before = preemptions_logged(controller)

    aws.create(aw("hard-high", {tree: "hard"}, on_node, "200m", priority=10))
    status = aws.wait_state("hard-high", "Pending")
    assert tree in status["message"] and "hard" in status["message"], status["message"]
    # Evidence that a cycle ran after hard-high arrived: a later AppWrapper in the soft node is dispatched.
    aws.create(aw("soft-later", {tree: "soft"}, on_node, "100m", priority=0))
    aws.wait_state("soft-later", "Running")
    for name in ("soft-low", "hard-peer"):
        kept = aws.status(name)
        assert kept["state"] == "Running" and condition(kept, "PreemptCandidate") is None, name
    assert aws.status("hard-high")["state"] == "Pending"
    assert preemptions_logged(controller) == before
