"""A gang that requires a topology level (``mcad.codeflare.dev/topology-required``) is dispatched only into one
domain of it, the one it fits best; one no domain can take waits and says why, and preemption evicts only where one
domain would then hold it. Nodes are labelled with ``topology.example.com/rack``; n-free has no rack label."""

from __future__ import annotations

import random
from typing import Any

import pytest

from test.component.harness import gang_aw, node, pod

RACK = "topology.example.com/rack"


def racked(name: str, cpu: str, rack: str | None) -> dict[str, Any]:
    raw = node(name, cpu)
    if rack is not None:
        raw["metadata"]["labels"] = {RACK: rack}
    return raw


def in_rack(raw: dict[str, Any], level: str = RACK) -> dict[str, Any]:
    raw["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-required": level}
    return raw


def plan_nodes(h: Any, key: str) -> set[str]:
    return {n for n, _ in h.dispatcher.owners.accountant.plans.planned_nodes(key)}


def test_the_gang_goes_whole_into_the_rack_it_fits_best(harness_factory: Any) -> None:
    # rack-a has 8 cpu free, rack-b 16: a 2 x 3-cpu gang fits both and takes rack-a, leaving rack-b whole.
    nodes = [racked("a0", "4", "rack-a"), racked("a1", "4", "rack-a"),
             racked("b0", "8", "rack-b"), racked("b1", "8", "rack-b")]
    h = harness_factory(nodes=nodes, pods=[], aws=[in_rack(gang_aw("g", 2, {"cpu": "3"}))])
    h.drain()
    assert plan_nodes(h, "ns/g") == {"a0", "a1"}
    # A 2 x 7-cpu gang fits only rack-b.
    h.lw["aw"].add(in_rack(gang_aw("big", 2, {"cpu": "7"})))
    h.drain()
    assert plan_nodes(h, "ns/big") == {"b0", "b1"}


def test_a_gang_that_fits_only_across_racks_waits_and_says_why(harness_factory: Any) -> None:
    nodes = [racked("a0", "4", "rack-a"), racked("b0", "4", "rack-b"), racked("n-free", "4", None)]
    h = harness_factory(nodes=nodes, pods=[], aws=[in_rack(gang_aw("g", 2, {"cpu": "3"}))])
    h.drain()
    assert "ns/g" not in h.dispatcher.owners.active.views
    told = h.dispatcher.view.assess_queue().of("ns/g")
    assert told is not None and not told.fits_now
    assert told.why == f"needs 2 pod(s) of cpu 3 in one {RACK}: rack-a has room for 1, rack-b for 1", told.why
    # Without the annotation the same gang spreads over two nodes at once.
    h.lw["aw"].add(gang_aw("spread", 2, {"cpu": "3"}))
    h.drain()
    assert len(plan_nodes(h, "ns/spread")) == 2


def test_a_level_no_node_carries_never_places_the_gang(harness_factory: Any) -> None:
    h = harness_factory(nodes=[racked("a0", "8", "rack-a")], pods=[],
                        aws=[in_rack(gang_aw("g", 1, {"cpu": "1"}), "topology.example.com/block")])
    h.drain()
    told = h.dispatcher.view.assess_queue().of("ns/g")
    assert told is not None and "no node has that label" in told.why
    assert "ns/g" not in h.dispatcher.owners.active.views


def test_preemption_evicts_only_where_one_rack_then_holds_the_gang(harness_factory: Any) -> None:
    # Two low-priority AppWrappers run, one per rack; a 2 x 4-cpu gang needs one rack whole: one victim, its rack.
    nodes = [racked("a0", "4", "rack-a"), racked("a1", "4", "rack-a"), racked("b0", "4", "rack-b"),
             racked("b1", "4", "rack-b")]
    h = harness_factory(nodes=nodes, pods=[], aws=[gang_aw("low-a", 1, {"cpu": "4"})], preemption=True)
    h.drain()
    h.lw["pod"].add(pod("low-a-0", "4", appwrapper="low-a", node_name="a0"))
    h.lw["aw"].add(gang_aw("low-b", 1, {"cpu": "4"}))
    h.drain()
    h.lw["pod"].add(pod("low-b-0", "4", appwrapper="low-b", node_name="b0"))
    h.lw["aw"].add(in_rack(gang_aw("gang", 2, {"cpu": "4"}, priority=5)))
    h.drain()
    victims = h.dispatcher.owners.preemptors.victims_of("ns/gang")
    assert len(victims) == 1, victims


@pytest.mark.parametrize("seed", range(6))
def test_every_dispatched_required_gang_lies_in_one_rack(harness_factory: Any, seed: int) -> None:
    rng = random.Random(seed)
    nodes = [racked(f"r{r}-n{n}", rng.choice(["4", "8"]), f"rack-{r}") for r in range(3) for n in range(3)]
    nodes.append(racked("loose", "16", None))
    aws = []
    for i in range(30):
        raw = gang_aw(f"g{i:02d}", rng.choice([1, 2, 3, 4]), {"cpu": rng.choice(["1", "2", "3"])})
        aws.append(in_rack(raw) if rng.random() < 0.6 else raw)
    h = harness_factory(nodes=nodes, pods=[], aws=aws)
    h.drain()
    rack_of = {raw["metadata"]["name"]: raw["metadata"].get("labels", {}).get(RACK) for raw in nodes}
    required = {raw["metadata"]["name"] for raw in aws if raw["metadata"].get("annotations")}
    dispatched = set(h.dispatcher.owners.active.views)
    assert dispatched, "some dispatched"
    for key in dispatched:
        name = key.partition("/")[2]
        racks = {rack_of[n] for n in plan_nodes(h, key)}
        if name in required:
            assert len(racks) == 1 and None not in racks, (key, racks)


def test_a_blocked_gang_reserves_the_rack_that_frees_first_and_backfill_keeps_off_it(harness_factory: Any) -> None:
    # rack-a is full (low-a's two pods), rack-b half full (low-b's one pod): a 2 x 4-cpu gang that needs one rack
    # waits and reserves rack-b, which lacks one pod's room where rack-a lacks two. A 4-cpu newcomer then does not
    # take b1, which would leave the gang waiting for both racks.
    nodes = [racked("a0", "4", "rack-a"), racked("a1", "4", "rack-a"), racked("b0", "4", "rack-b"),
             racked("b1", "4", "rack-b")]
    h = harness_factory(nodes=nodes, pods=[], aws=[gang_aw("low-a", 2, {"cpu": "4"})])
    h.drain()
    h.lw["pod"].add(pod("low-a-0", "4", appwrapper="low-a", node_name="a0"))
    h.lw["pod"].add(pod("low-a-1", "4", appwrapper="low-a", node_name="a1"))
    h.lw["aw"].add(gang_aw("low-b", 1, {"cpu": "4"}))
    h.drain()
    h.lw["pod"].add(pod("low-b-0", "4", appwrapper="low-b", node_name="b0"))
    h.lw["aw"].add(in_rack(gang_aw("gang", 2, {"cpu": "4"})))
    h.drain()
    [reservation] = h.dispatcher.owners.reservations.held.values()
    assert reservation.key == "ns/gang" and set(reservation.nodes) == {"b0", "b1"}, reservation
    h.lw["aw"].add(gang_aw("small", 1, {"cpu": "4"}))
    h.drain()
    assert "ns/small" not in h.dispatcher.owners.active.views, "backfill kept off the reserved rack"
    # low-b ends: the gang takes rack-b whole.
    h.lw["pod"].delete("ns/low-b-0")
    h.lw["aw"].delete("ns/low-b")
    h.drain()
    assert plan_nodes(h, "ns/gang") == {"b0", "b1"}


def three_racks_and_a_gang(harness_factory: Any, seconds_apart: float) -> Any:
    """rack-a is busy with work the preemptor may not evict; rack-b holds two low-priority AppWrappers (4 cpu each),
    rack-c one (8 cpu, dispatched first), each ``seconds_apart`` after the one before; then a 2 x 4-cpu gang that
    requires one rack arrives."""
    nodes = [racked("a0", "4", "rack-a"), racked("a1", "4", "rack-a"), racked("b0", "4", "rack-b"),
             racked("b1", "4", "rack-b"), racked("c0", "8", "rack-c")]
    h = harness_factory(nodes=nodes, pods=[], aws=[gang_aw("high-a", 2, {"cpu": "4"}, priority=10)],
                        preemption=True)
    h.drain()
    h.lw["pod"].add(pod("high-a-0", "4", appwrapper="high-a", node_name="a0"))
    h.lw["pod"].add(pod("high-a-1", "4", appwrapper="high-a", node_name="a1"))
    for name, node_name, cpu in (("low-c", "c0", "8"), ("low-b1", "b0", "4"), ("low-b2", "b1", "4")):
        h.clock.advance(seconds_apart)
        h.lw["aw"].add(gang_aw(name, 1, {"cpu": cpu}))
        h.drain()
        h.lw["pod"].add(pod(f"{name}-0", cpu, appwrapper=name, node_name=node_name))
    h.lw["aw"].add(in_rack(gang_aw("gang", 2, {"cpu": "4"}, priority=5)))
    h.drain()
    return h


def test_preemption_frees_the_rack_that_needs_the_fewest_victims(harness_factory: Any) -> None:
    # All dispatched at once: no work is lost anywhere. Taken in rank order (by name, as all else ties) the victims
    # free rack-b (two of them); one domain needs only one.
    h = three_racks_and_a_gang(harness_factory, seconds_apart=0)
    assert h.dispatcher.owners.preemptors.victims_of("ns/gang") == frozenset({"ns/low-c"})


def test_preemption_frees_the_rack_where_the_least_work_is_lost(harness_factory: Any) -> None:
    # A second apart: rack-c's one victim ran 2 s on 8 cpu (16 cpu-seconds), rack-b's two ran 1 s and 0 s on 4 cpu
    # each (4): rack-b loses less, though it takes two.
    h = three_racks_and_a_gang(harness_factory, seconds_apart=1)
    assert h.dispatcher.owners.preemptors.victims_of("ns/gang") == frozenset({"ns/low-b1", "ns/low-b2"})
