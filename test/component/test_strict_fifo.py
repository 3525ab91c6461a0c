"""Strict FIFO per quota node, stepped: an AppWrapper blocked by its own quota node holds back only the later
AppWrappers of that node (order there stays strict), other tenants' work dispatches at once; one blocked at a
shared parent node holds that node's subtree; one blocked by the cluster's room holds everything; one that could
never run holds nothing. /debug's dry run (``assess``) says the same."""

from __future__ import annotations

from typing import Any

from mcad.model.fifo import BEHIND_IN_DOMAIN, BEHIND_STRICT_FIFO
from test.component.harness import last_status, node
from test.component.test_preemption_bounds import labelled, quota_informer
from test.component.test_quota_dispatch import subtree

# Tree t: a soft root of 8 cpu; tenant a's node holds at most 2 (hard), tenant b's 4 (hard); c and d share a hard
# parent "shared" of 2, each soft at 2.
TREE = [subtree("root", "t", {"root": "8"}),
        subtree("tenants", "t", {"a": "2", "b": "4", "shared": "2"}, "root", hard=("a", "b", "shared")),
        subtree("pair", "t", {"c": "2", "d": "2"}, "shared")]


def harness(factory: Any, aws: list[dict[str, Any]], cpu: str = "8") -> Any:
    h = factory(nodes=[node("n0", cpu)], pods=[], aws=aws, strict_fifo=True, fit="aggregate",
                quota_subtrees=quota_informer(TREE))
    h.drain()
    return h


def assessed(h: Any) -> dict[str, str]:
    """The dry run's reasons (the harness steps the dispatcher on this thread, so it may be called here)."""
    return {a.key.removeprefix("ns/"): a.why for a in h.dispatcher.view.assess_queue()}


def test_a_tenant_over_its_own_quota_holds_only_its_own_node(harness_factory: Any) -> None:
    # Names give the dispatch order (same priority and creation time): a1, a2, a3, b1.
    h = harness(harness_factory, [labelled("a1", "1", t="a"), labelled("a2", "2", t="a"),
                                  labelled("a3", "1", t="a"), labelled("b1", "1", t="b")])
    applied = set(h.writer.applied)
    assert "a1-cm" in applied and "b1-cm" in applied, "tenant b's AppWrapper runs at once, room being free"
    assert "a2-cm" not in applied
    assert "a3-cm" not in applied, "a3 would fit a's quota, but a2 is ahead of it in a's node"
    assert last_status(h, "a2")["message"].startswith("quota: node a of tree t is full")
    assert last_status(h, "a3")["message"].startswith(BEHIND_IN_DOMAIN)
    assert assessed(h) == {"a2": last_status(h, "a2")["message"].split("; position")[0], "a3": BEHIND_IN_DOMAIN}


def test_one_blocked_at_a_shared_parent_holds_that_subtree_only(harness_factory: Any) -> None:
    h = harness(harness_factory, [labelled("c1", "1", t="c"), labelled("c2", "2", t="c"),
                                  labelled("d1", "1", t="d"), labelled("e1", "1", t="b")])
    applied = set(h.writer.applied)
    assert "c1-cm" in applied and "e1-cm" in applied
    assert "c2-cm" not in applied and "d1-cm" not in applied, "d1 would take the shared node's room c2 waits for"
    assert "node shared of tree t is full" in last_status(h, "c2")["message"]
    assert last_status(h, "d1")["message"].startswith(BEHIND_IN_DOMAIN)


def test_one_blocked_by_the_clusters_room_holds_everything(harness_factory: Any) -> None:
    h = harness(harness_factory, [labelled("a1", "1", t="a"), labelled("b1", "4", t="b"),
                                  labelled("c1", "1", t="c")], cpu="4")
    applied = set(h.writer.applied)
    assert applied == {"a1-cm"}, "b1 fits its quota, not the cluster: c1 (which would fit) waits behind it"
    assert "short of cpu" in last_status(h, "b1")["message"]
    assert last_status(h, "c1")["message"].startswith(BEHIND_STRICT_FIFO)
    assert assessed(h)["c1"] == BEHIND_STRICT_FIFO


def test_one_that_could_never_run_holds_nobody(harness_factory: Any) -> None:
    h = harness(harness_factory, [labelled("a1", "3", t="a"), labelled("a2", "1", t="a"),
                                  labelled("a3", "1", t="nowhere")])
    applied = set(h.writer.applied)
    assert "a2-cm" in applied, "a1 asks more than a's hard limit of 2: it could never run, so it holds nobody"
    assert "a1-cm" not in applied and "a3-cm" not in applied
    assert last_status(h, "a1")["message"].split("; position")[0].endswith(
        "it asks more than quota node a of tree t allows at all: cpu needs 3, 2 of 2 left (charged at a), so it "
        "does not hold the queue (strict FIFO)")
