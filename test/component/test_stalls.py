"""No stalls, stepped with a fake clock: an AppWrapper leaving the queue starts a cycle, a preemptor waits for its
victims a bounded time, one that can never fit does not hold a strict FIFO queue, and whatever holds an
AppWrapper back is named in its status."""

from __future__ import annotations

from typing import Any

import pytest

from mcad.k8s.informer import Informer
from mcad.model.quota import subtree_view
from test.component.harness import Harness, aw, gang_aw, last_status, node, pod
from test.component.test_quota_dispatch import labelled, subtree
from test.fakes import FakeListerWatcher, wait_informed


def add(h: Harness, raw: dict[str, Any]) -> None:
    h.lw["aw"].add(raw)
    name = raw["metadata"]["name"]
    wait_informed(lambda: h.dispatcher.appwrappers.get(f"ns/{name}"), 5, f"the informer to see {name}")
    h.drain()


def delete(h: Harness, name: str) -> None:
    h.lw["aw"].delete(f"ns/{name}")
    wait_informed(lambda: h.dispatcher.appwrappers.get(f"ns/{name}") is None, 5, f"the informer to drop {name}")
    h.drain()


@pytest.mark.parametrize("fit", ["nodes", "aggregate"])
def test_deleting_a_blocked_strict_fifo_head_dispatches_what_waited_behind_it(harness_factory: Any,
                                                                              fit: str) -> None:
    # 4 cpu, 3 used by a pod that is not ours: the head (2 cpu) waits, and strict FIFO holds the 1-cpu one behind.
    h = harness_factory(nodes=[node("n0", "4")], pods=[pod("busy", "3")], aws=[aw("head", "2")], strict_fifo=True,
                        fit=fit)
    h.drain()
    h.clock.advance(1)
    add(h, aw("next", "1"))
    assert h.writer.applied == []
    delete(h, "head")  # no other event follows: the deletion alone must start a cycle
    assert h.writer.applied == ["next-cm"]


def test_deleting_a_waiting_preemptor_lets_what_it_held_go(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("low", 1, {"cpu": "3"})], preemption=True)
    h.drain()
    h.lw["pod"].add(pod("low-0", "3", appwrapper="low"))
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-0"), 5, "the pod")
    add(h, gang_aw("high", 1, {"cpu": "4"}, priority=5))
    assert last_status(h, "low")["state"] == "Pending", "preempted"
    add(h, gang_aw("small", 1, {"cpu": "1"}))
    assert "small-cm" not in h.writer.applied, "held: the preemptor waits for its victim's pod"
    held = last_status(h, "small")["message"]
    assert held.startswith("held behind ns/high, which is preempting"), f"the hold is named, not {held!r}"
    delete(h, "high")
    assert h.writer.applied[-1] == "small-cm"


@pytest.mark.parametrize("reservations", [0, 2])
def test_a_preemptor_stops_holding_the_queue_when_its_victims_do_not_go(harness_factory: Any,
                                                                          reservations: int) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[],
                        aws=[gang_aw("low", 1, {"cpu": "2"}), gang_aw("low2", 1, {"cpu": "1"})], preemption=True,
                        reservations=reservations)
    h.drain()
    for name, cpu in (("low", "2"), ("low2", "1")):
        h.lw["pod"].add(pod(f"{name}-0", cpu, appwrapper=name))
    wait_informed(lambda: h.dispatcher.pods.get("uid-low2-0"), 5, "the pods")
    h.drain()
    add(h, gang_aw("high", 1, {"cpu": "4"}, priority=5))
    assert last_status(h, "low")["state"] == "Pending" and last_status(h, "low2")["state"] == "Pending"
    # Both victims' pods are being deleted: one's grace period ends in 30 s, the other's in an hour.
    for name, cpu, grace in (("low", "2", "2024-01-01T00:00:30Z"), ("low2", "1", "2024-01-01T01:00:00Z")):
        dying = pod(f"{name}-0", cpu, appwrapper=name)
        dying["metadata"]["deletionTimestamp"] = grace
        h.lw["pod"].modify(dying)
    wait_informed(lambda: h.dispatcher.pods.get("uid-low2-0").deleting, 5, "the pods to be deleting")
    h.drain()
    add(h, gang_aw("small", 1, {"cpu": "2"}))
    assert "small-cm" not in h.writer.applied

    h.clock.advance(299)
    h.drain()
    assert h.writer.force_deleted == [] and "small-cm" not in h.writer.applied, "not before the timeout"
    h.clock.advance(1)  # no event: the timeout alone brings the cycle
    h.drain()
    assert h.writer.force_deleted == ["low-0"], "only the pod whose grace period is over"
    assert "small-cm" not in h.writer.applied, "the victims' pods still hold the node"
    message = last_status(h, "high")["message"]
    assert "did not finish terminating within 300 s (ns/low, ns/low2)" in message, message
    assert "no longer holds the queue" in message

    h.lw["pod"].delete("ns/low-0")  # the force deletion took effect
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-0") is None, 5, "low-0 to go")
    h.drain()
    assert h.dispatcher.preemptions == 2, "it evicts nobody else while its stuck victims' pods remain"
    # No longer held: what fits goes, in queue order (the requeued victim "low" first: same age, and its name).
    # With reservations on too: one that gave up on its victims holds no reservation (they may never go).
    assert h.writer.applied[-1] == "low-cm"
    assert "ns/high" not in h.dispatcher.owners.reservations.held


@pytest.mark.parametrize("fit", ["nodes", "aggregate"])
def test_strict_fifo_passes_an_appwrapper_that_cannot_fit_the_empty_cluster(harness_factory: Any, fit: str) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("huge", "16")], strict_fifo=True, fit=fit)
    h.drain()
    h.clock.advance(1)
    add(h, aw("next", "1"))
    assert h.writer.applied == ["next-cm"]
    message = last_status(h, "huge")["message"]
    assert "cannot fit even the empty cluster, so it does not hold the queue (strict FIFO)" in message, message
    assert last_status(h, "huge")["state"] == "Pending"


def test_strict_fifo_passes_an_appwrapper_that_names_a_quota_node_that_does_not_exist() -> None:
    lw = FakeListerWatcher()
    lw.add(subtree("root", "t", {"root": "8"}))
    informer: Informer[Any] = Informer("quotasubtrees", lw, transform=subtree_view)
    h = Harness(nodes=[node("n0", "8")], pods=[], aws=[labelled("typo", "1", t="nowhere")], fit="aggregate",
                quota_subtrees=informer, strict_fifo=True)
    try:
        h.drain()
        h.clock.advance(1)
        add(h, labelled("next", "1", t="root"))
        assert h.writer.applied == ["next-cm"]
        message = last_status(h, "typo")["message"]
        assert "nowhere" in message and "does not hold the queue" in message, message
    finally:
        h.stop()
