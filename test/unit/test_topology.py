"""Topology-aware placement (``mcad.model.topology``) and the asks it reads (``mcad.api.topologyasks``): a required
level puts the gang in the domain it fits best; a preferred one falls back up the configured hierarchy, then packs
into as few domains as it can; Kueue's pod-set annotations ask the same of one pod set; a gang no domain holds is
told which domains have the most room."""

from __future__ import annotations

from typing import Any

import pytest

from mcad.api.appwrapper import AppWrapperView, appwrapper_view
from mcad.api.topologyasks import (
    PODSET_PREFERRED,
    PODSET_REQUIRED,
    TOPOLOGY_PREFERRED,
    TOPOLOGY_REQUIRED,
    label_key_error,
    level,
)
from mcad.api.views import NodeView, node_view
from mcad.model import topology, topologyasked
from mcad.model.placement import GPU
from mcad.model.topology import Hierarchy
from test.unit.nodes_and_pods import raw_node

BLOCK, RACK = "example.com/block", "example.com/rack"


def racked(name: str, cpu: str, rack: str | None, block: str | None = None) -> NodeView:
    raw = raw_node(name, cpu)
    labels = {key: value for key, value in ((RACK, rack), (BLOCK, block)) if value is not None}
    raw["metadata"]["labels"] = labels
    return node_view(raw)


def template(cpu: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {"app": "x"}}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}


def job_aw(pods: int, cpu: str, annotations: dict[str, str] | None = None) -> AppWrapperView:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"parallelism": pods, "completions": pods, "template": template(cpu)}}
    return wrapped(job, annotations)


def raycluster_aw(workers: int, worker_cpu: str, worker_asks: dict[str, str]) -> AppWrapperView:
    ray = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
           "spec": {"headGroupSpec": {"template": template("2")},
                    "workerGroupSpecs": [{"replicas": workers, "minReplicas": workers, "maxReplicas": workers,
                                          "groupName": "w", "template": template(worker_cpu, worker_asks)}]}}
    return wrapped(ray)


def wrapped(item: dict[str, Any], annotations: dict[str, str] | None = None) -> AppWrapperView:
    meta: dict[str, Any] = {"name": "aw", "namespace": "ns", "uid": "u", "generation": 1}
    if annotations:
        meta["annotations"] = annotations
    return appwrapper_view({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper", "metadata": meta,
                            "spec": {"resources": {"GenericItems": [{"generictemplate": item}]}}})


def nodes_of(placed: topology.Placed) -> set[str]:
    assert placed.packing.fits, placed.packing.why
    return {node for node, _, _ in placed.packing.placement}


def rack_of(nodes: list[NodeView], names: set[str], level_key: str = RACK) -> set[str | None]:
    labels = {node.name: node.labels.get(level_key) for node in nodes}
    return {labels[name] for name in names}


TWO_BLOCKS = [racked("a0", "4", "rack-a", "block-1"), racked("a1", "4", "rack-a", "block-1"),
              racked("b0", "4", "rack-b", "block-1"), racked("b1", "4", "rack-b", "block-1"),
              racked("c0", "8", "rack-c", "block-2"), racked("c1", "8", "rack-c", "block-2"),
              racked("d0", "2", "rack-d", "block-2")]


def test_required_takes_the_domain_it_fits_best_and_keeps_large_ones_whole() -> None:
    placed = topology.place(job_aw(2, "3", {TOPOLOGY_REQUIRED: RACK}), TWO_BLOCKS, {})
    assert placed.domain == "rack-a" and nodes_of(placed) == {"a0", "a1"}  # 8 cpu, 2 left; rack-c would leave 10
    big = topology.place(job_aw(2, "7", {TOPOLOGY_REQUIRED: RACK}), TWO_BLOCKS, {})
    assert big.domain == "rack-c" and nodes_of(big) == {"c0", "c1"}


def test_required_that_no_domain_holds_names_the_roomiest_domains() -> None:
    placed = topology.place(job_aw(5, "4", {TOPOLOGY_REQUIRED: RACK}), TWO_BLOCKS, {})
    assert not placed.packing.fits
    assert placed.packing.why == ("needs 5 pod(s) of cpu 4 in one example.com/rack: rack-c has room for 4, rack-a "
                                  "for 2, rack-b for 2; 1 other domain(s) have less")
    assert placed.packing.about == frozenset({f"topology:{RACK}"})
    nowhere = topology.place(job_aw(1, "1", {TOPOLOGY_REQUIRED: "example.com/zone"}), TWO_BLOCKS, {})
    assert nowhere.packing.why == "needs 1 pod(s) in one example.com/zone, and no node has that label"


class CountingIndex(topology.Index):
    """The plain index, counting how often each domain's free room is summed, and knowing each domain's
    allocatable room as a snapshot's index does."""

    def __init__(self) -> None:
        self.summed = 0

    def free(self, nodes: Any, level: str, resource: str, room: Any) -> dict[str, int]:
        self.summed += 1
        return super().free(nodes, level, resource, room)

    def most(self, nodes: Any, level: str, resource: str) -> dict[str, int]:
        return {value: topology.free_room(members, {}, resource) for value, members in self.domains(nodes, level)}


def test_a_gang_no_domain_could_ever_hold_costs_no_survey_of_free_room_and_is_worded_when_read() -> None:
    index = CountingIndex()
    pod = template("1")
    pod["spec"]["containers"][0]["resources"]["requests"][GPU] = "1"
    gpus = wrapped({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                    "spec": {"parallelism": 1, "completions": 1, "template": pod}}, {TOPOLOGY_REQUIRED: RACK})
    placed = topology.place(gpus, TWO_BLOCKS, {}, index=index)
    assert not placed.packing.fits and index.summed == 0, "no rack has any GPU: nothing to sum"
    assert placed.packing.about == frozenset({f"topology:{RACK}"})
    assert placed.packing.why.startswith(f"needs 1 pod(s) of cpu 1, {GPU} 1 in one {RACK}: "), placed.packing.why
    # 5 x 4 cpu: more than any rack's allocatable (rack-c has 16) either; 2 x 3 cpu is judged on free room.
    assert not topology.place(job_aw(5, "4", {TOPOLOGY_REQUIRED: RACK}), TWO_BLOCKS, {}, index=index).packing.fits
    assert index.summed == 0
    assert topology.place(job_aw(2, "3", {TOPOLOGY_REQUIRED: RACK}), TWO_BLOCKS, {}, index=index).packing.fits
    assert index.summed == 1


def test_preferred_falls_back_up_the_hierarchy_then_packs_into_few_domains() -> None:
    hierarchy = Hierarchy((BLOCK, RACK))
    # 4 x 4 cpu: only rack-c (two 8-cpu nodes) holds them all.
    one_rack = topology.place(job_aw(4, "4", {TOPOLOGY_PREFERRED: RACK}), TWO_BLOCKS, {}, hierarchy)
    assert rack_of(TWO_BLOCKS, nodes_of(one_rack)) == {"rack-c"}
    # 6 x 4 cpu: no rack holds it, block-1 (16 cpu over 4 nodes: 4 pods) neither, block-2 (18 cpu: 4 pods) neither;
    # so every node, the roomiest block's roomiest rack first: rack-c (4 pods), then block-1's racks.
    spread = topology.place(job_aw(6, "4", {TOPOLOGY_PREFERRED: RACK}), TWO_BLOCKS, {}, hierarchy)
    used = nodes_of(spread)
    assert {"c0", "c1"} <= used and len(rack_of(TWO_BLOCKS, used)) == 2, used
    # 5 x 2 cpu fits no rack but one block: block-1 (8 pods) rather than across blocks.
    block = topology.place(job_aw(5, "2", {TOPOLOGY_PREFERRED: RACK}), [*TWO_BLOCKS[:4], *TWO_BLOCKS[6:]],
                           {}, hierarchy)
    assert rack_of(TWO_BLOCKS, nodes_of(block), BLOCK) == {"block-1"}


def test_a_preferred_level_outside_the_hierarchy_is_one_domain_else_anywhere() -> None:
    assert Hierarchy((BLOCK, RACK)).fallbacks(RACK) == (RACK, BLOCK)
    assert Hierarchy((BLOCK, RACK)).fallbacks("example.com/zone") == ("example.com/zone",)
    assert topology.NO_HIERARCHY.fallbacks(RACK) == (RACK,)
    spread = topology.place(job_aw(6, "4", {TOPOLOGY_PREFERRED: RACK}), TWO_BLOCKS, {})
    assert len(nodes_of(spread)) >= 3


def test_kueue_pod_set_annotations_ask_for_that_pod_set_alone() -> None:
    # The workers must share a rack; the head goes anywhere (here onto the rack no worker needs).
    aw = raycluster_aw(3, "4", {PODSET_REQUIRED: RACK})
    assert topology.asks(aw) and [g.topology_required for g in aw.gang] == ["", RACK]
    placed = topology.place(aw, TWO_BLOCKS, {})
    workers = {node for node, requests, _ in placed.packing.placement if requests.get("cpu") == 4000}
    assert placed.packing.fits and rack_of(TWO_BLOCKS, workers) == {"rack-c"}
    # A pod set preferring a level that no domain holds still runs, spread.
    spread = topology.place(raycluster_aw(5, "4", {PODSET_PREFERRED: RACK}), TWO_BLOCKS, {})
    assert spread.packing.fits
    # Required of a pod set that no rack can hold: it waits, saying which pod set.
    refused = topology.place(raycluster_aw(5, "4", {PODSET_REQUIRED: RACK}), TWO_BLOCKS, {})
    assert not refused.packing.fits and "needs 5 pod(s) of cpu 4 in one example.com/rack" in refused.packing.why


def test_room_already_taken_is_respected_and_not_changed() -> None:
    room = {"c0": racked("c0", "0", None).allocatable, "c1": racked("c1", "0", None).allocatable}
    before = dict(room)
    placed = topology.place(job_aw(2, "3", {TOPOLOGY_REQUIRED: RACK}), TWO_BLOCKS, room)
    assert placed.domain == "rack-a" and room == before
    nodes_without_labels = [racked("x", "64", None)]
    assert not topology.place(job_aw(1, "1", {TOPOLOGY_REQUIRED: RACK}), nodes_without_labels, {}).packing.fits


@pytest.mark.parametrize(("key", "error"), [
    ("example.com/rack", ""),
    ("kubernetes.io/hostname", ""),
    ("rack", ""),
    ("", "it is empty"),
    ("example.com/", "the name part after the last '/' is empty"),
    ("Example.com/rack", "its prefix must be a DNS subdomain"),
    ("/rack", "its prefix must be a DNS subdomain of 1 to 253 characters"),
    ("example.com/-rack", "its name part must be letters"),
    ("example.com/" + "r" * 64, "its name part is 64 characters long (at most 63)"),
    ("a b", "its name part must be letters"),
])
def test_label_keys(key: str, error: str) -> None:
    assert label_key_error(key).startswith(error) if error else label_key_error(key) == ""


def test_annotation_values_are_read_whole_and_bounded() -> None:
    assert level("  example.com/rack ") == "example.com/rack"
    assert level(7) == "" and level("") == "" and level("  ") == ""
    assert level("x" * 400) == "x" * 318, "too long for a label key: a level no node has, never no ask"
    aw = job_aw(1, "1", {TOPOLOGY_REQUIRED: RACK, TOPOLOGY_PREFERRED: BLOCK})
    assert (aw.topology_required, aw.topology_preferred) == (RACK, BLOCK)
    assert topologyasked.asked(aw) == ((RACK, "required"), (BLOCK, "preferred"))
    assert not topology.asks(job_aw(1, "1"))


def test_a_snapshots_domain_room_follows_what_the_pass_takes_and_its_copies_keep_their_own() -> None:
    from mcad.api.resources import ResourceVector
    from mcad.model.accounting import Snapshot
    from mcad.model.fit import SnapshotIndex

    room = {node.name: node.allocatable for node in TWO_BLOCKS}
    snapshot = Snapshot(free=ResourceVector(), capacity=ResourceVector(), room=room, nodes=TWO_BLOCKS, quota=None,
                        consumed=lambda _key: ResourceVector())
    index = SnapshotIndex(snapshot)
    assert index.free(TWO_BLOCKS, RACK, "cpu", room) == {"rack-a": 8000, "rack-b": 8000, "rack-c": 16000,
                                                          "rack-d": 2000}
    trial = snapshot.copy()
    cpu3 = ResourceVector({"cpu": 3000})
    snapshot.take(cpu3, [("a0", cpu3, 1)])
    assert index.free(TWO_BLOCKS, RACK, "cpu", snapshot.room)["rack-a"] == 5000
    trial.give(cpu3, [("c0", cpu3, 1)])  # a copy's room changes apart from the pass's
    assert SnapshotIndex(trial).free(TWO_BLOCKS, RACK, "cpu", trial.room)["rack-c"] == 19000
    assert index.free(TWO_BLOCKS, RACK, "cpu", snapshot.room) == {"rack-a": 5000, "rack-b": 8000, "rack-c": 16000,
                                                                   "rack-d": 2000}
    assert index.free(TWO_BLOCKS, RACK, "cpu", snapshot.room) == topology.PLAIN.free(TWO_BLOCKS, RACK, "cpu",
                                                                                      snapshot.room)
