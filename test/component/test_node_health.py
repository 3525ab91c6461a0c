"""Sick nodes and placement that binds, stepped against the simulated cluster of test_placement_sim: GPU pods are
never pinned to a node Autopilot labels TESTING or EVICT (cpu-only pods still are), go to a WARN node only when the
others are full, and a pod pinned to a node that turns sick before it binds is placed elsewhere, with an Event
naming the label. Hub mode places gangs on its workers' nodes through the same fit, so the same holds there."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mcad.hub.placement import Policy
from mcad.k8s import events
from mcad.model.nodehealth import AUTOPILOT_LABEL, GPU, NO_RULES
from mcad.serve.debug import Reports
from test.component.harness import last_status, node
from test.component.test_hub_placement import gang, hub_harness  # noqa: F401
from test.component.test_placement_sim import Sim, job_aw, pinned_node, sim_factory  # noqa: F401


def gpu_job(name: str, pods: int, *, kind: str = "Deployment", gpus: int = 1) -> dict[str, Any]:
    raw = job_aw(name, pods, 1, 0, kind=kind)
    container = raw["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["template"]["spec"][
        "containers"][0]
    container["resources"]["requests"][GPU] = str(gpus)
    return raw


def set_node(sim: Sim, name: str, *, gpus: int | None = None, health: str | None = None) -> None:
    """Give a node GPUs and (None: no) Autopilot health label, as a device plugin and Autopilot would."""
    raw = copy.deepcopy(sim.nodes()[name])
    if gpus is not None:
        raw["status"]["allocatable"][GPU] = str(gpus)
    labels = dict(raw["metadata"].get("labels") or {})
    labels.pop(AUTOPILOT_LABEL, None)
    if health is not None:
        labels[AUTOPILOT_LABEL] = health
    raw["metadata"]["labels"] = labels
    sim.h.lw["node"].modify(raw)


def gpu_sim(sim_factory: Any, health: dict[str, str], nodes: int = 3) -> Sim:  # noqa: F811
    sim: Sim = sim_factory(nodes=nodes)
    for i in range(nodes):
        set_node(sim, f"n{i}", gpus=2, health=health.get(f"n{i}"))
    sim.settle()
    return sim


def where(sim: Sim, appwrapper: str) -> list[str]:
    return sorted(pod["spec"].get("nodeName") or f"unbound:{pinned_node(pod)}" for pod in sim.pods_of(appwrapper))


@pytest.mark.parametrize("health", ["TESTING", "EVICT"])
def test_gpu_pods_are_never_pinned_to_a_sick_node_cpu_pods_are(sim_factory: Any, health: str) -> None:  # noqa: F811
    sim = gpu_sim(sim_factory, {"n0": health, "n1": health})
    sim.add(gpu_job("train", 2))
    sim.add(job_aw("web", 4, 1, 0, kind="Deployment"))  # cpu only: the label says nothing of it
    sim.settle()
    assert where(sim, "train") == ["n2", "n2"]
    assert "n0" in where(sim, "web")
    sim.check()
    # /debug/ledger (mcadctl ledger --nodes, the dashboard) says what the rules say of each node.
    ledger = {n["name"]: n for n in Reports(sim.h.dispatcher.view, lambda: {}).ledger()["nodes"]}
    effect = "NoSchedule" if health == "TESTING" else "NoExecute"
    assert ledger["n0"]["health"] == [{"resource": GPU, "label": AUTOPILOT_LABEL, "value": health, "effect": effect}]
    assert ledger["n2"]["health"] == []
    # One more GPU pod fits nowhere: the AppWrapper waits, and says which node's label keeps it off.
    sim.add(gpu_job("more", 1))
    sim.settle()
    assert sim.pods_of("more") == []
    written = last_status(sim.h, "more")
    text = " ".join(str(c.get("message", "")) for c in written.get("conditions") or [])
    assert f"nodes n0, n1 are labelled {AUTOPILOT_LABEL}={health} (no {GPU} pods)" in text, written


def test_a_warn_node_is_used_only_when_the_others_are_full(sim_factory: Any) -> None:  # noqa: F811
    sim = gpu_sim(sim_factory, {"n0": "WARN"})
    sim.add(gpu_job("a", 4))
    sim.settle()
    assert where(sim, "a") == ["n1", "n1", "n2", "n2"]
    sim.add(gpu_job("b", 2))  # only the WARN node has room left: it fits there rather than not at all
    sim.settle()
    assert where(sim, "b") == ["n0", "n0"]
    sim.check()


def test_a_pin_to_a_node_that_turns_sick_before_the_pod_binds_is_moved(sim_factory: Any) -> None:  # noqa: F811
    sim = gpu_sim(sim_factory, {}, nodes=2)
    sim.add(gpu_job("a", 1))
    sim.settle(schedule=False)  # pinned, not bound yet
    [pod] = sim.pods_of("a")
    first = pinned_node(pod)
    assert first in ("n0", "n1") and not pod["spec"].get("nodeName")
    set_node(sim, first, health="TESTING")
    sim.settle()
    other = "n1" if first == "n0" else "n0"
    assert sim.writer.deleted_by_mcad == [pod["metadata"]["name"]]
    assert where(sim, "a") == [other]
    replanned = [m for _, reason, m in sim.events.recorded if reason == events.PLACEMENT_REPLANNED]
    assert any(f"node {first} is labelled {AUTOPILOT_LABEL}=TESTING (no {GPU} pods)" in m for m in replanned), \
        sim.events.recorded
    sim.check()


def test_a_jobs_pod_pinned_to_a_node_that_turns_sick_requeues_its_appwrapper(sim_factory: Any) -> None:  # noqa: F811
    sim = gpu_sim(sim_factory, {}, nodes=2)
    sim.add(gpu_job("a", 1, kind="Job"))
    sim.settle(schedule=False)
    [pod] = sim.pods_of("a")
    first = pinned_node(pod) or ""
    set_node(sim, first, health="EVICT")
    sim.settle()
    assert sim.writer.deleted_by_mcad == []
    requeued = [m for _, reason, m in sim.events.recorded if reason == events.REQUEUED]
    assert any(f"labelled {AUTOPILOT_LABEL}=EVICT" in m for m in requeued), sim.events.recorded
    assert where(sim, "a") == ["n1" if first == "n0" else "n0"]


def test_without_rules_labels_change_nothing(sim_factory: Any) -> None:  # noqa: F811
    sim: Sim = sim_factory(nodes=1, node_health=NO_RULES)
    set_node(sim, "n0", gpus=2, health="EVICT")
    sim.add(gpu_job("a", 2))
    sim.settle()
    assert where(sim, "a") == ["n0", "n0"]


def test_reservations_hold_no_sick_node_for_gpu_pods(sim_factory: Any) -> None:  # noqa: F811
    sim = gpu_sim(sim_factory, {"n0": "TESTING"})
    sim.add(gpu_job("a", 4))  # every healthy GPU
    sim.settle()
    sim.add(gpu_job("big", 2, gpus=2))
    sim.settle()
    held = sim.h.dispatcher.owners.reservations.held
    assert list(held) == ["ns/big"] and held["ns/big"].nodes == ("n1", "n2")
    # A gang that could run only with the sick node's GPUs would hold room for ever: it reserves nothing.
    sim.h.lw["aw"].delete("ns/big")
    sim.add(gpu_job("huge", 3, gpus=2))
    sim.settle()
    assert "ns/huge" not in sim.h.dispatcher.owners.reservations.held
    sim.add(job_aw("web", 1, 1, 0, kind="Deployment"))  # cpu only: the TESTING node takes it
    sim.settle()
    assert where(sim, "web") == ["n0"]


# -- hub mode: the workers' nodes go through the same accountant, so the same fit ----------------------------------


def test_hub_mode_places_gpu_gangs_only_on_healthy_worker_nodes(hub_harness: Any) -> None:  # noqa: F811
    def gpu_worker_node(name: str, health: str | None) -> dict[str, Any]:
        raw = node(name, "8")
        raw["status"]["allocatable"][GPU] = "4"
        if health is not None:
            raw["metadata"]["labels"] = {AUTOPILOT_LABEL: health}
        return raw

    def gpu_gang(name: str, pods: int) -> dict[str, Any]:
        raw = gang(name, pods, "1")
        raw["spec"]["resources"]["GenericItems"][0]["custompodresources"][0]["requests"][GPU] = "1"
        return raw

    h = hub_harness(workers=[("small", {}), ("big", {})], policy=Policy.FIRST,
                    nodes=[gpu_worker_node("small/n0", "TESTING"), gpu_worker_node("big/n0", None),
                           gpu_worker_node("big/n1", "EVICT")],
                    aws=[gpu_gang("a", 4), gang("web", 1, "1")])
    # "first" would pick small; its only GPU node is TESTING, so the GPU gang goes to big's healthy node. The
    # cpu-only one still goes to small.
    assert h.dispatcher.view.placed() == {"ns/a": "big", "ns/web": "small"}
    h.add_appwrapper(gpu_gang("b", 1))
    assert "ns/b" not in h.dispatcher.view.placed()
    message = " ".join(c.get("message", "") for c in h.last_status("b").get("conditions") or [])
    assert f"node small/n0 is labelled {AUTOPILOT_LABEL}=TESTING (no {GPU} pods)" in message, message
    assert f"node big/n1 is labelled {AUTOPILOT_LABEL}=EVICT (no {GPU} pods)" in message, message


def test_a_reservation_leaves_a_node_that_turns_warn_when_others_will_do(sim_factory: Any) -> None:  # noqa: F811
    sim = gpu_sim(sim_factory, {})
    sim.add(gpu_job("a", 6))  # every GPU, two per node
    sim.settle()
    sim.add(gpu_job("big", 2, gpus=2))
    sim.settle()
    held = sim.h.dispatcher.owners.reservations.held
    assert held["ns/big"].nodes == ("n0", "n1")
    set_node(sim, "n0", health="WARN")
    sim.settle()
    assert sim.h.dispatcher.owners.reservations.held["ns/big"].nodes == ("n1", "n2")
