"""Topology levels that admission would refuse, reaching the dispatcher anyway (stored before the webhook judged
them, or in a namespace it does not review): a required level that is not a label key names a label no node can
carry, so the gang waits, saying no node has it, and is never placed; nothing crashes, and other AppWrappers go
on."""

from __future__ import annotations

from typing import Any

import pytest

from mcad.api.topologyasks import PODSET_REQUIRED, TOPOLOGY_PREFERRED, TOPOLOGY_REQUIRED
from test.component.harness import aw, gang_aw, last_status, node

RACK = "topology.example.com/rack"


def racked(name: str, rack: str) -> dict[str, Any]:
    raw = node(name, "8")
    raw["metadata"]["labels"] = {RACK: rack}
    return raw


def annotated(raw: dict[str, Any], **annotations: str) -> dict[str, Any]:
    raw["metadata"]["annotations"] = annotations
    return raw


def job_aw(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    """An AppWrapper of one Job of 2 pods of 1 cpu, its pod template annotated (Kueue's pod set asks)."""
    raw = aw(name, "0")
    raw["spec"]["resources"]["GenericItems"] = [{"generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": 2, "template": {"metadata": {"annotations": annotations}, "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}]}}}}}]
    return raw


NOT_KEYS = ["rack!", "Topology.example.com/rack", f"{RACK}/", "a b"]


@pytest.mark.parametrize("level", NOT_KEYS)
def test_a_required_level_that_is_not_a_label_key_waits_saying_no_node_has_it(harness_factory: Any,
                                                                              level: str) -> None:
    h = harness_factory(nodes=[racked("a0", "rack-a"), racked("a1", "rack-a")], pods=[],
                        aws=[annotated(gang_aw("g", 2, {"cpu": "1"}), **{TOPOLOGY_REQUIRED: level}),
                             gang_aw("other", 1, {"cpu": "1"})])
    h.drain()
    assert "ns/g" not in h.dispatcher.owners.active.views
    told = h.dispatcher.view.assess_queue().of("ns/g")
    assert told is not None and not told.fits_now
    assert told.why.endswith(f" in one {level}, and no node has that label"), told.why
    # Its status says so too, and the AppWrapper without the ask is dispatched past it.
    conditions = last_status(h, "g").get("conditions", [])
    assert any("no node has that label" in str(c.get("message")) for c in conditions), conditions
    assert "ns/other" in h.dispatcher.owners.active.views


@pytest.mark.parametrize("level", NOT_KEYS)
def test_a_pod_sets_required_level_that_is_not_a_label_key_waits_too(harness_factory: Any, level: str) -> None:
    h = harness_factory(nodes=[racked("a0", "rack-a")], pods=[], aws=[job_aw("g", {PODSET_REQUIRED: level})])
    h.drain()
    assert "ns/g" not in h.dispatcher.owners.active.views
    told = h.dispatcher.view.assess_queue().of("ns/g")
    assert told is not None and "no node has that label" in told.why, told


def test_a_preferred_level_that_is_not_a_label_key_falls_back_to_the_whole_cluster(harness_factory: Any) -> None:
    # Preferred asks nothing it cannot have: with no node in a domain of it, the gang packs over every node.
    h = harness_factory(nodes=[racked("a0", "rack-a")], pods=[],
                        aws=[annotated(gang_aw("g", 2, {"cpu": "1"}), **{TOPOLOGY_PREFERRED: "rack!"})])
    h.drain()
    assert "ns/g" in h.dispatcher.owners.active.views
