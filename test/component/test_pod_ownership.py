"""Pods count for an AppWrapper by their owner chain, uids checked, never by their label alone; and room promised to a
pod goes with it. Stepped against the simulated cluster of test_placement_sim (its Job controller makes each Job's
and Deployment's pods, its scheduler binds the ungated ones it is named for), with the informers over wrapped kinds
answering from what that cluster holds.

A tenant who may create pods in its namespace does, at random, what the last review did by hand: forges gated pods
carrying a dispatched AppWrapper's label (a controller of the right kind and name with a made-up uid, the real
controller's uid read from the API, the AppWrapper itself, no controller at all; ``schedulerName: nobody`` so no
scheduler binds them), deletes pods before they bind, completes pods (so a demand has room left), and moves labels
from one AppWrapper to another. At every quiet point: no pin is held for a pod that does not exist or is bound; no
room is planned for more pods than exist unbound; no AppWrapper's bound pods and planned room exceed its demand;
only pods its own objects made (or that name its real controller's uid) count for an AppWrapper; a forged
controller is never ungated.
"""

from __future__ import annotations

import copy
import itertools
import os
import random
from typing import Any

import pytest

from mcad.api.appwrapper import APPWRAPPER_LABEL
from mcad.api.resources import ZERO
from mcad.api.views import PLACEMENT_GATE
from mcad.api.wrappedview import NotSynced, WrappedView
from mcad.k8s import events
from mcad.loop.pinning import EXTRA_BIND_SECONDS
from test.component.test_placement_sim import Sim, SimWriter, job_aw


class SimObjects:
    """The informers over Jobs, Deployments and their ReplicaSets, as the simulated API server holds them."""

    def __init__(self) -> None:
        self.writer: SimWriter | None = None

    def ensure(self, api_version: str, kind: str, waiter: str | None = None) -> bool:
        return True

    def watches(self, api_version: str, kind: str, waiter: str | None = None, *, start: bool = True) -> bool:
        return True

    def lookup(self, api_version: str, kind: str, namespace: str, name: str) -> WrappedView | NotSynced | None:
        assert self.writer is not None
        jobs = self.writer.jobs
        if kind == "ReplicaSet" and name.endswith("-5d8f"):
            deployment = jobs.get(f"{namespace}/{name.removesuffix('-5d8f')}")
            if deployment is None or deployment["kind"] != "Deployment":
                return None
            key = f"{namespace}/{deployment['metadata']['name']}"
            return self._view(namespace, name, f"owner-uid-{key}", f"dep-uid-{key}",
                              ("apps/v1", "Deployment", deployment["metadata"]["name"]))
        made = jobs.get(f"{namespace}/{name}")
        if made is None or made["kind"] != kind:
            return None
        uid = f"owner-uid-{namespace}/{name}" if kind == "Job" else f"dep-uid-{namespace}/{name}"
        [owner] = made["metadata"]["ownerReferences"]  # mcad's, to the AppWrapper
        return self._view(namespace, name, uid, owner["uid"], ("", "", ""))

    @staticmethod
    def _view(namespace: str, name: str, uid: str, owner_uid: str, owner: tuple[str, str, str]) -> WrappedView:
        return WrappedView(namespace=namespace, name=name, uid=uid, owner_uid=owner_uid,
                           appwrapper=f"{namespace}/{name}", conditions=(), owner_api_version=owner[0],
                           owner_kind=owner[1], owner_name=owner[2])


class Tenant:
    """Pods made by hand in the AppWrappers' namespace."""

    def __init__(self, sim: Sim, rng: random.Random) -> None:
        self.sim, self.rng = sim, rng
        self.names = itertools.count()
        self.forged: dict[str, str] = {}  # pod name -> how its controller was forged
        # Pods whose controller is real (their Job's or ReplicaSet's uid), forged ones with the real uid included.
        self.real_controller: dict[str, str] = {}  # pod name -> the AppWrapper its controller belongs to
        self.relabelled: set[str] = set()  # AppWrappers one of whose pods now carries another's label

    def forge(self, target: str, how: str = "") -> None:
        """A gated pod labelled for ``target`` (an AppWrapper made of one Job or Deployment of that name)."""
        job = self.sim.writer.jobs.get(f"ns/{target}")
        if job is None:
            return
        how = how or self.rng.choice(("made-up uid", "real uid", "the AppWrapper", "no controller"))
        kind, api_version, owner_name = (("Job", "batch/v1", target) if job["kind"] == "Job"
                                         else ("ReplicaSet", "apps/v1", f"{target}-5d8f"))
        refs = {"made-up uid": [{"apiVersion": api_version, "kind": kind, "name": owner_name, "uid": "forged",
                                 "controller": True}],
                "real uid": [{"apiVersion": api_version, "kind": kind, "name": owner_name,
                              "uid": f"owner-uid-ns/{target}", "controller": True}],
                "the AppWrapper": [{"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                                    "name": target, "uid": f"uid-{target}", "controller": True}],
                "no controller": []}[how]
        name = f"forged-{next(self.names)}"
        self.forged[name] = how
        if how == "real uid":
            self.real_controller[name] = target
        self.sim.h.lw["pod"].add({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "ns", "uid": f"uid-{name}", "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {APPWRAPPER_LABEL: target, "job": "forged"}, "ownerReferences": refs},
            "spec": {"schedulerName": "nobody", "schedulingGates": [{"name": PLACEMENT_GATE}],
                     "containers": copy.deepcopy(job["spec"]["template"]["spec"]["containers"])},  # its template's
            "status": {"phase": "Pending"}})

    def delete_unbound(self) -> None:
        unbound = [p for p in self.sim.pods() if not p["spec"].get("nodeName")]
        if unbound:
            pod = self.rng.choice(unbound)
            self.sim.h.lw["pod"].delete(f"ns/{pod['metadata']['name']}")
            self.forged.pop(pod["metadata"]["name"], None)
            job = pod["metadata"]["labels"]["job"]
            if job in self.sim.writer.jobs:
                self.sim.writer.make_pod(job)  # its controller replaces it

    def finish_a_pod(self) -> None:
        """A real pod completes (its Job makes no other): its AppWrapper's demand has room for one pod again, which
        a forged pod naming the real controller may be pinned into, beyond the plan."""
        running = [p for p in self.sim.pods() if p["status"]["phase"] == "Running"]
        if running:
            pod = self.rng.choice(running)
            pod["status"] = {"phase": "Succeeded"}
            self.sim.h.lw["pod"].modify(pod)

    def relabel(self, live: list[str]) -> None:
        pods = self.sim.pods()
        if pods and live:
            pod = self.rng.choice(pods)
            self.relabelled.add(pod["metadata"]["labels"][APPWRAPPER_LABEL])
            pod["metadata"]["labels"][APPWRAPPER_LABEL] = self.rng.choice(live)
            self.sim.h.lw["pod"].modify(pod)


def real_owner(pod: dict[str, Any], tenant: Tenant) -> str | None:
    """The AppWrapper whose objects made ``pod`` (or whose controller's real uid it names), None for none."""
    name = pod["metadata"]["name"]
    if name in tenant.forged:
        return tenant.real_controller.get(name)
    job = pod["metadata"]["labels"]["job"]  # "ns/<AppWrapper>": the simulated controller that made it
    return job.split("/", 1)[1]


def check(sim: Sim, tenant: Tenant) -> None:
    d = sim.h.dispatcher
    acc = d.owners.accountant
    pods = {p["metadata"]["uid"]: p for p in sim.pods()}
    for uid, (key, node) in acc.plans.pins().items():
        assert uid in pods, f"room on {node} is promised to pod {uid} of {key}, which does not exist"
        assert not pods[uid]["spec"].get("nodeName"), f"pod {uid} is bound and still holds a pin"
    for name, room in acc.room().items():
        assert ZERO.fits_in(room), f"mcad promised more of {name} than it has: room {room}"
    for key in d.owners.accountant.ledger.reserved_keys():
        over = acc.beyond_demand(key, ZERO)
        assert over == ZERO, f"{key}'s bound pods and planned room exceed its demand by {over.format()}"
    # What is planned is room for pods that exist and are not bound yet, and for nothing else (an AppWrapper one of
    # whose pods was moved to another's label waits for it to come back, in a slot of its plan).
    for key in d.owners.accountant.ledger.reserved_keys():
        name = key.split("/", 1)[1]
        if name in tenant.relabelled:
            continue
        unbound = [p for p in sim.pods_of(name) if not p["spec"].get("nodeName")
                   and p["status"]["phase"] == "Pending" and real_owner(p, tenant) == name]
        planned = sum(count for _, count in acc.plans.planned_nodes(key))
        assert planned <= len(unbound), f"{key} plans {planned} pods, and {len(unbound)} exist unbound"
    for pod in pods.values():
        name, label = pod["metadata"]["name"], pod["metadata"]["labels"][APPWRAPPER_LABEL]
        counted_for = [key for key in (f"ns/{label}",) if any(p.uid == pod["metadata"]["uid"] for p in acc.pods(key))]
        owner = real_owner(pod, tenant)
        if counted_for:
            assert owner == label, f"{name} counts for {label}, but {owner or 'nothing'}'s objects made it"
        if tenant.forged.get(name) in ("made-up uid", "the AppWrapper", "no controller"):
            gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
            assert gates == [PLACEMENT_GATE], f"{name}, with a forged controller, was ungated"


def claim_room_a_pod_left(sim: Sim, tenant: Tenant) -> None:
    """AppWrapper aw0 (3 pods) runs, one of its pods completes, and the tenant makes a pod naming its Job's real uid:
    pinned beyond the plan, into the room the demand has left."""
    sim.add(job_aw("aw0", 3, 1, 0))
    sim.settle()
    tenant.finish_a_pod()
    sim.settle()
    tenant.forge("aw0", how="real uid")
    sim.settle()


@pytest.mark.parametrize("seed", range(int(os.environ.get("MCAD_SIM_SEEDS", "8"))))
def test_forged_deleted_and_relabelled_pods_never_hold_room_or_count(harness_factory: Any, seed: int) -> None:
    rng = random.Random(seed)
    objects = SimObjects()
    sim = Sim(harness_factory, nodes=4, wrapped=objects)
    objects.writer = sim.writer
    tenant = Tenant(sim, rng)
    names = itertools.count(1)
    live: list[str] = ["aw0"]
    # First what the review did by hand: one of a running AppWrapper's pods completes, and a pod naming its real
    # controller is pinned into the room its demand has left.
    claim_room_a_pod_left(sim, tenant)
    check(sim, tenant)
    for _step in range(60):
        action = rng.random()
        if action < 0.3 or not live:
            name = f"aw{next(names)}"
            sim.add(job_aw(name, rng.randint(1, 3), rng.randint(1, 2), 0, kind=rng.choice(("Job", "Deployment"))))
            live.append(name)
        elif action < 0.4:
            sim.delete(live.pop(rng.randrange(len(live))))
        elif action < 0.65:
            tenant.forge(rng.choice(live))
        elif action < 0.75:
            tenant.finish_a_pod()
        elif action < 0.9:
            tenant.delete_unbound()
        else:
            tenant.relabel(live)
        sim.settle()
        check(sim, tenant)
    d = sim.h.dispatcher
    refused = [message for _, reason, message in sim.events.recorded if reason == events.PLACEMENT_REFUSED]
    assert refused, "some forged pod was refused, with an Event"
    assert d.metrics.value("mcad_pod_pins_total", {"outcome": "extra"}), "some pod was pinned beyond its plan"
    assert sim.writer.applied, "the run dispatched something"
    # The tenant deletes every pod it made: no room stays promised to any of them.
    for name in list(tenant.forged):
        sim.h.lw["pod"].delete(f"ns/{name}")
    sim.settle()
    assert not [uid for uid in d.owners.accountant.plans.pins() if uid.startswith("uid-forged-")]
    check(sim, tenant)


def test_room_pinned_for_a_pod_no_scheduler_binds_is_given_back(harness_factory: Any) -> None:
    """A pod naming the real controller's uid, pinned into the room a completed pod left, with a schedulerName
    nobody serves: its room is promised for EXTRA_BIND_SECONDS, then given back, with an Event on the pod."""
    objects = SimObjects()
    sim = Sim(harness_factory, nodes=1, wrapped=objects)
    objects.writer = sim.writer
    tenant = Tenant(sim, random.Random(0))
    d = sim.h.dispatcher
    claim_room_a_pod_left(sim, tenant)
    [forged] = tenant.forged
    assert f"uid-{forged}" in d.owners.accountant.plans.pins(), "pinned beyond the plan, within the demand"
    sim.h.clock.advance(EXTRA_BIND_SECONDS - 1)
    sim.settle()
    assert f"uid-{forged}" in d.owners.accountant.plans.pins()
    sim.h.clock.advance(1)
    sim.settle()
    assert f"uid-{forged}" not in d.owners.accountant.plans.pins() and d.owners.accountant.plans.planned_by_node() == {}
    assert d.metrics.value("mcad_pod_pins_total", {"outcome": "unbound"}) == 1
    [(_, message)] = [(name, message) for name, reason, message in sim.events.recorded
                      if reason == events.PLACEMENT_REPLANNED and name == forged]
    assert "not bound since (no scheduler took it): the room held for it is released" in message
    check(sim, tenant)


def test_each_pin_beyond_a_plan_gives_its_room_back_at_its_own_time(harness_factory: Any) -> None:
    """Two pods pinned beyond the plan 60 s apart, then nothing happens: each pin's room is given back
    EXTRA_BIND_SECONDS after that pin. Had both timers shared one work-queue key, the queue would have kept the
    first one only and the second pin would hold its room until some unrelated event."""
    objects = SimObjects()
    sim = Sim(harness_factory, nodes=1, wrapped=objects)
    objects.writer = sim.writer
    tenant = Tenant(sim, random.Random(0))
    pins = sim.h.dispatcher.owners.accountant.plans.pins
    claim_room_a_pod_left(sim, tenant)
    sim.h.clock.advance(60)
    sim.settle()
    tenant.finish_a_pod()
    sim.settle()
    tenant.forge("aw0", how="real uid")
    sim.settle()
    first, second = (f"uid-{name}" for name in tenant.forged)
    assert {first, second} <= set(pins()), "both pinned beyond the plan, within the demand"
    sim.h.clock.advance(EXTRA_BIND_SECONDS - 60)
    sim.settle()
    assert first not in pins() and second in pins()
    sim.h.clock.advance(60)
    sim.settle()
    assert second not in pins(), "the second pin's room came back at its own time"
    check(sim, tenant)
