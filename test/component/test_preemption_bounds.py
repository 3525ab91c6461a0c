"""Preemption only for work that would then run, and its bounds, stepped with a fake clock: a preemptor whose own
quota is in error (an unknown node, more than a hard limit allows) or that the empty cluster could not take evicts
nobody and says why; one whose victims went and that still did not run waits out a backoff before it evicts again;
and no more victims go in a minute than the controller's bound, the preemptor saying that it waits on it."""

from __future__ import annotations

from typing import Any

from mcad.k8s.informer import Informer
from mcad.loop.tools import cycle_after
from mcad.model.quota import subtree_view
from test.component.harness import Harness, gang_aw, last_status, node, pod
from test.component.test_quota_dispatch import subtree
from test.fakes import FakeListerWatcher, wait_informed


def quota_informer(subtrees: list[dict[str, Any]]) -> Informer[Any]:
    lw = FakeListerWatcher()
    for obj in subtrees:
        lw.add(obj)
    return Informer("quotasubtrees", lw, transform=subtree_view)


def labelled(name: str, cpu: str, priority: int = 0, **labels: str) -> dict[str, Any]:
    raw = gang_aw(name, 1, {"cpu": cpu}, priority=priority)
    raw["metadata"]["labels"] = labels
    return raw


def add_aw(h: Harness, raw: dict[str, Any]) -> None:
    h.lw["aw"].add(raw)
    wait_informed(lambda: h.dispatcher.appwrappers.get(f"ns/{raw['metadata']['name']}"), 5, raw["metadata"]["name"])
    h.drain()


def run_pods(h: Harness, *names_cpu: tuple[str, str]) -> None:
    """The pods of dispatched AppWrappers start (one each, named <appwrapper>-0)."""
    for name, cpu in names_cpu:
        h.lw["pod"].add(pod(f"{name}-0", cpu, appwrapper=name))
    wait_informed(lambda: all(h.dispatcher.pods.get(f"uid-{n}-0") for n, _ in names_cpu), 5, "the pods")
    h.drain()


def states(h: Harness) -> dict[str, str]:
    return {name: st["state"] for name, st in h.writer.statuses if "state" in st}  # not the QuotaSubtrees' own


def two_running_and_a_preemptor(harness_factory: Any, preemptor: str, **options: Any) -> Harness:
    """low-a and low-b (2 cpu each) run on a 4-cpu node, dispatched a second apart; then ``preemptor`` (2 cpu,
    priority 10) arrives: it preempts the most recent one, low-b."""
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("low-a", 1, {"cpu": "2"})],
                        preemption=True, fit="aggregate", **options)
    h.drain()
    h.clock.advance(1)
    add_aw(h, gang_aw("low-b", 1, {"cpu": "2"}))
    run_pods(h, ("low-a", "2"), ("low-b", "2"))
    add_aw(h, gang_aw(preemptor, 1, {"cpu": "2"}, priority=10))
    return h


def test_a_preemptor_labelled_with_an_unknown_quota_node_evicts_nobody_and_says_why(harness_factory: Any) -> None:
    subtrees = quota_informer([subtree("root", "t", {"root": "8"}), subtree("kids", "t", {"gold": "8"}, "root")])
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[labelled("low", "4", t="gold")], preemption=True,
                        fit="aggregate", quota_subtrees=subtrees)
    h.drain()
    run_pods(h, ("low", "4"))
    assert states(h) == {"low": "Running"}

    add_aw(h, labelled("lost", "2", priority=10, t="platinum"))
    h.clock.advance(400)  # past any victim timeout: the old code evicted again at each
    h.drain()
    assert states(h) == {"low": "Running", "lost": "Pending"}
    assert h.dispatcher.preemptions == 0
    message = last_status(h, "lost")["message"]
    assert "quota tree t has no node 'platinum'" in message
    assert "it evicts nobody: its quota labels name a quota node that does not exist" in message


def test_a_preemptor_over_its_hard_quota_or_the_cluster_evicts_nobody(harness_factory: Any) -> None:
    subtrees = quota_informer([subtree("root", "t", {"root": "8"}),
                               subtree("kids", "t", {"gold": "2", "silver": "8"}, "root", hard=("gold",))])
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[labelled("low", "4", t="silver")], preemption=True,
                        fit="aggregate", quota_subtrees=subtrees)
    h.drain()
    run_pods(h, ("low", "4"))
    add_aw(h, labelled("greedy", "3", priority=10, t="gold"))
    add_aw(h, labelled("huge", "6", priority=10, t="silver"))
    h.clock.advance(400)
    h.drain()
    assert states(h)["low"] == "Running" and h.dispatcher.preemptions == 0
    assert "it evicts nobody: it asks more than quota node gold of tree t allows at all" in \
        last_status(h, "greedy")["message"]
    assert "it evicts nobody: it would not fit even the empty cluster" in last_status(h, "huge")["message"]


def test_a_preemptor_that_did_not_run_once_its_victims_went_backs_off(harness_factory: Any) -> None:
    h = two_running_and_a_preemptor(harness_factory, "high", preemption_backoff=60)
    assert states(h)["low-b"] == "Pending" and h.dispatcher.preemptions == 1, "the most recent one goes"

    # Its victim's pod goes, but a pod of no AppWrapper takes the room first: it still does not fit.
    h.lw["pod"].add(pod("intruder", "2"))
    h.lw["pod"].delete("ns/low-b-0")
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-b-0") is None and h.dispatcher.pods.get("uid-intruder"),
               5, "the pods to change")
    h.drain()
    assert states(h)["low-a"] == "Running" and h.dispatcher.preemptions == 1, "no second round at once"
    message = last_status(h, "high")["message"]
    assert "it evicted 1 round(s) of victims and still did not run, so it evicts nobody for 60 s more" in message

    h.clock.advance(59)
    h.drain()
    assert h.dispatcher.preemptions == 1
    h.clock.advance(1)  # the backoff is over: the cycle due then preempts again
    h.drain()
    assert h.dispatcher.preemptions == 2 and states(h)["low-a"] == "Pending"


def test_no_more_victims_than_the_bound_in_a_minute_and_the_preemptor_says_so(harness_factory: Any) -> None:
    h = two_running_and_a_preemptor(harness_factory, "high-1", max_evictions_per_minute=1)
    assert h.dispatcher.preemptions == 1
    h.lw["pod"].delete("ns/low-b-0")
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-b-0") is None, 5, "the victim's pod to go")
    h.drain()
    assert "high-1-cm" in h.writer.applied

    add_aw(h, gang_aw("high-2", 1, {"cpu": "2"}, priority=10))
    assert h.dispatcher.preemptions == 1 and states(h)["low-a"] == "Running"
    assert "the controller evicts at most 1 a minute (--preemption-max-evictions-per-minute); it may in 60 s" in \
        last_status(h, "high-2")["message"]
    h.clock.advance(60)
    h.drain()
    assert h.dispatcher.preemptions == 2 and states(h)["low-a"] == "Pending"


def test_quota_reclaim_counts_against_the_same_eviction_bound(harness_factory: Any) -> None:
    # silver borrows gold's unused 2 cpu (s1, s2); gold wants its own 2 back, but the bound allows no eviction yet.
    tree = [subtree("root", "t", {"root": "4"}), subtree("kids", "t", {"gold": "2", "silver": "2"}, parent="root")]
    later = labelled("s2", "2", t="silver")
    later["metadata"]["creationTimestamp"] = "2026-01-01T00:00:01Z"
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[labelled("s1", "2", t="silver"), later],
                        fit="aggregate", quota_subtrees=quota_informer(tree), max_evictions_per_minute=1)
    h.drain()
    assert states(h) == {"s1": "Running", "s2": "Running"}
    h.dispatcher.owners.evictions.budget.spend(1, h.clock.monotonic())  # as if a preemption had just evicted one
    h.clock.advance(1)
    add_aw(h, labelled("g", "2", t="gold"))
    assert states(h) == {"s1": "Running", "s2": "Running", "g": "Pending"}
    assert "reclaiming its quota: it would evict 1 AppWrapper(s), but the controller evicts at most 1 a minute" in \
        last_status(h, "g")["message"]
    h.clock.advance(59)
    h.drain()
    assert states(h)["s2"] == "Pending" and h.dispatcher.preemptions == 1, "reclaimed once the minute is over"


def test_the_victim_timeout_fires_though_another_owner_set_an_earlier_cycle_timer(harness_factory: Any) -> None:
    # The work queue keeps a key's earliest timer only: were every cycle timer one key, an earlier timer of another
    # owner would replace the preemptor's timeout, and once it fired the timeout would never come.
    h = two_running_and_a_preemptor(harness_factory, "high", victim_timeout=10)
    assert h.dispatcher.owners.preemptors.victims_of("ns/high") == frozenset({"ns/low-b"})
    cycle_after(h.dispatcher.queue, h.clock.monotonic(), 1)
    h.clock.advance(1)
    h.drain()
    assert h.dispatcher.owners.preemptors.abandoned("ns/high") == frozenset(), "still waiting for low-b's pod"
    h.clock.advance(9)
    h.drain()
    assert h.dispatcher.owners.preemptors.abandoned("ns/high") == frozenset({"ns/low-b"}), "gave up at the timeout"
