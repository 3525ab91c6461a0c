"""Faults keep a gang that requires a topology level in its domain: a pod whose node turns sick before it binds is
placed again on another node of the same rack, never in another rack (it waits when its rack has no room), and a
gang requeued by a fault goes back to the rack it ran in when it still fits there. Stepped against the simulated
cluster of test_placement_sim (nodes n0..; the kube-scheduler binds pods where mcad pinned them)."""

from __future__ import annotations

import copy
import itertools
import os
import random
from typing import Any

import pytest

from mcad.k8s import events
from mcad.model.nodehealth import AUTOPILOT_LABEL, GPU
from test.component.test_node_health import gpu_job, where
from test.component.test_placement_sim import Sim, job_aw, pinned_node, sim_factory  # noqa: F401

RACK = "topology.example.com/rack"


def label(sim: Sim, name: str, *, gpus: int | None = None, rack: str | None = None,
          health: str | None = None) -> None:
    raw = copy.deepcopy(sim.nodes()[name])
    if gpus is not None:
        raw["status"]["allocatable"][GPU] = str(gpus)
    labels = dict(raw["metadata"].get("labels") or {})
    if rack is not None:
        labels[RACK] = rack
    labels.pop(AUTOPILOT_LABEL, None)
    if health is not None:
        labels[AUTOPILOT_LABEL] = health
    raw["metadata"]["labels"] = labels
    sim.h.lw["node"].modify(raw)


def racked_sim(sim_factory: Any, racks: dict[str, tuple[str, int]]) -> Sim:  # noqa: F811
    """Nodes n0.. with (rack, GPUs) each."""
    sim: Sim = sim_factory(nodes=len(racks))
    for name, (rack, gpus) in racks.items():
        label(sim, name, gpus=gpus, rack=rack)
    sim.settle()
    return sim


def in_rack(raw: dict[str, Any]) -> dict[str, Any]:
    raw["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-required": RACK}
    return raw


def racks_of(sim: Sim, appwrapper: str) -> set[str]:
    """The racks of the nodes its live pods are bound or pinned to (pods placed nowhere yet, and pods that ended,
    left out)."""
    nodes = sim.nodes()
    placed = [pod["spec"].get("nodeName") or pinned_node(pod) for pod in sim.pods_of(appwrapper)
              if pod["status"]["phase"] in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp")]
    return {nodes[name]["metadata"]["labels"][RACK] for name in placed if name}


def test_a_pod_whose_node_turns_sick_is_placed_again_in_its_own_rack(sim_factory: Any) -> None:  # noqa: F811
    # rack-b (n0, n1: 4 GPUs each) sorts first by node name and has the most room; the gang fits rack-a best.
    sim = racked_sim(sim_factory, {"n0": ("rack-b", 4), "n1": ("rack-b", 4), "n2": ("rack-a", 2),
                                   "n3": ("rack-a", 2), "n4": ("rack-a", 2)})
    sim.add(in_rack(gpu_job("train", 2, gpus=2)))
    sim.settle(schedule=False)  # pinned, not bound yet
    assert sorted(pinned_node(p) or "" for p in sim.pods_of("train")) == ["n2", "n3"]
    label(sim, "n2", rack="rack-a", health="TESTING")
    sim.settle()
    assert where(sim, "train") == ["n3", "n4"], "placed again in rack-a, though rack-b has more room"
    replanned = [m for _, reason, m in sim.events.recorded if reason == events.PLACEMENT_REPLANNED]
    assert replanned, sim.events.recorded
    sim.check()


def test_a_pod_whose_rack_has_no_room_left_waits_rather_than_leave_it(sim_factory: Any) -> None:  # noqa: F811
    sim = racked_sim(sim_factory, {"n0": ("rack-b", 4), "n1": ("rack-b", 4), "n2": ("rack-a", 2),
                                   "n3": ("rack-a", 2)})
    sim.add(in_rack(gpu_job("train", 2, gpus=2)))
    sim.settle(schedule=False)
    assert sorted(pinned_node(p) or "" for p in sim.pods_of("train")) == ["n2", "n3"]
    label(sim, "n2", rack="rack-a", health="TESTING")
    sim.settle()
    assert racks_of(sim, "train") == {"rack-a"}, "no pod of the gang in rack-b"
    unplaced = [pod for pod in sim.pods_of("train") if not pod["spec"].get("nodeName") and not pinned_node(pod)]
    assert len(unplaced) == 1, "the replacement waits, gated, for room in rack-a"


def test_a_gang_requeued_by_a_fault_goes_back_to_its_rack(sim_factory: Any) -> None:  # noqa: F811
    # r-home: n0..n2 (2 GPUs each); r-alt: n3, n4 (2 each), where "filler" holds one GPU at first, so the gang
    # (2 pods x 2 GPUs, a Job) starts in r-home. The filler goes, and a node of r-home turns EVICT before the
    # gang's pod binds there: the Job's AppWrapper is requeued. Both racks now hold it with nothing left over; by
    # value r-alt would win the tie, but the gang goes back to r-home.
    sim = racked_sim(sim_factory, {"n0": ("r-home", 2), "n1": ("r-home", 2), "n2": ("r-home", 2),
                                   "n3": ("r-alt", 2), "n4": ("r-alt", 2)})
    filler = gpu_job("filler", 1, gpus=1)
    filler["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-required": RACK}
    sim.add(filler)
    sim.settle()
    assert racks_of(sim, "filler") == {"r-alt"}  # best fit: r-alt leaves 3 GPUs, r-home 5
    sim.add(in_rack(gpu_job("train", 2, gpus=2, kind="Job")))
    sim.settle(schedule=False)
    assert racks_of(sim, "train") == {"r-home"}
    first = sorted(pinned_node(p) or "" for p in sim.pods_of("train"))[0]
    sim.delete("filler")
    label(sim, first, rack="r-home", health="EVICT")
    sim.settle()
    requeued = [m for _, reason, m in sim.events.recorded if reason == events.REQUEUED]
    assert requeued, sim.events.recorded
    assert racks_of(sim, "train") == {"r-home"} and first not in where(sim, "train")


@pytest.mark.parametrize("seed", range(int(os.environ.get("MCAD_SIM_SEEDS", "8"))))
def test_random_runs_keep_every_required_gangs_bound_pods_in_one_rack(sim_factory: Any, seed: int) -> None:  # noqa: F811
    """Jobs and Deployments, most requiring a rack, arrive, are deleted, lose pods (re-created by their
    controllers) and meet cordons; at every quiet point each required gang's bound and pinned pods share one rack
    and no node is over-committed (``Sim.check``)."""
    rng = random.Random(seed)
    sim: Sim = sim_factory(nodes=6)
    for i in range(6):
        label(sim, f"n{i}", rack=f"rack-{i // 2}")  # three racks of two 4-cpu nodes
    sim.settle()
    names = itertools.count()
    live: list[str] = []
    required: set[str] = set()
    cordoned: set[str] = set()
    ran = False
    for _step in range(40):
        action = rng.random()
        if action < 0.5 or not live:
            name = f"aw{next(names)}"
            raw = job_aw(name, rng.randint(1, 4), rng.randint(1, 3), 0, kind=rng.choice(("Job", "Deployment")))
            if rng.random() < 0.7:
                required.add(name)
                raw = in_rack(raw)
            sim.add(raw)
            live.append(name)
        elif action < 0.7:
            sim.delete(live.pop(rng.randrange(len(live))))
        elif action < 0.9:
            sim.fail_a_pod(rng)
        else:
            target = f"n{rng.randrange(6)}"
            sim.cordon(target, target not in cordoned)
            cordoned ^= {target}
        sim.settle()
        sim.check()
        for name in live:
            if name in required:
                racks = racks_of(sim, name)
                assert len(racks) <= 1, (name, racks)
                ran = ran or bool(racks)
    assert ran, "some required gang ran"
