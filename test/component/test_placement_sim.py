"""Placement that binds, stepped against a simulated cluster: a Job controller that makes the pods of each Job from
its template (gates included) and re-creates the ones that fail or are deleted, and a scheduler that honours
scheduling gates and required node affinity by name, refuses a node without room or cordoned (PodScheduled False,
Unschedulable), and otherwise spreads pods onto the emptiest node, as the kube-scheduler's default scoring does.

Seeded random runs (arrivals, deletions, pod failures, cordons, some of them between a pin and its bind) check the
invariants of placement that binds (--placement=binding) at every quiet point: every bound pod of an AppWrapper was
pinned by mcad and is on the node of its pin; no node's bound requests exceed its allocatable, nor does mcad promise
more than a node has; no pod is left pinned where the scheduler refuses it; every pod re-planned has an Event; and every
gated pod of a dispatched AppWrapper is either placed or says what it waits for.
"""

from __future__ import annotations

import copy
import itertools
import os
import random
from collections.abc import Mapping
from typing import Any

import pytest

from mcad.api.resources import ResourceVector
from mcad.api.views import NODE_NAME_FIELD, PLACEMENT_GATE
from mcad.api.workloads import pod_requests
from mcad.k8s import events
from mcad.k8s.kube import ApiError
from mcad.serve.debug import Reports
from test.component.harness import Harness, RecordingWriter, last_status, node
from test.fakes import apply_json_patch, wait_informed


class RecordedEvents:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []  # (object name, reason, message)

    def record(self, ref: events.ObjectRef, type_: events.EventType, reason: str, message: str) -> None:
        self.recorded.append((ref.name, reason, message))


class SimWriter(RecordingWriter):
    """The API server's side of writes: wrapped Jobs make pods, pod patches and deletes land on the pod store."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: Any = None  # the pods' FakeListerWatcher, set by the simulation
        self.jobs: dict[str, dict[str, Any]] = {}  # namespace/name -> the Job or Deployment as created
        self.names = itertools.count()
        self.deleted_by_mcad: list[str] = []

    def create(self, obj: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        out = super().create(obj, field_manager=field_manager)
        if obj["kind"] in ("Job", "Deployment"):
            meta = obj["metadata"]
            self.jobs[f"{meta['namespace']}/{meta['name']}"] = copy.deepcopy(dict(obj))
            for _ in range(obj["spec"].get("parallelism") or obj["spec"].get("replicas") or 1):
                self.make_pod(f"{meta['namespace']}/{meta['name']}")
        return out

    def make_pod(self, job_key: str) -> None:
        job = self.jobs[job_key]
        template = job["spec"]["template"]
        n = next(self.names)
        name = f"{job['metadata']['name']}-{n}"
        # A Deployment's pods are its ReplicaSet's, named after it.
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"]} if job["kind"] == "Job" \
            else {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{job['metadata']['name']}-5d8f"}
        self.pods.add({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": job["metadata"]["namespace"], "uid": f"pod-uid-{n}",
            "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {**template["metadata"]["labels"], "job": job_key},
            "ownerReferences": [{**owner, "uid": f"owner-uid-{job_key}", "controller": True}]},
            "spec": copy.deepcopy(template["spec"]), "status": {"phase": "Pending"}})

    def patch_json(self, api_version: str, kind: str, namespace: str, name: str,
                   operations: list[dict[str, Any]]) -> Mapping[str, Any]:
        assert (api_version, kind) == ("v1", "Pod"), "mcad patches pods only"
        current = self.pods.get(f"{namespace}/{name}")
        if current is None:
            raise ApiError(404, "NotFound", f"pods {name} not found")
        try:
            patched = apply_json_patch(current, operations)
        except ValueError as err:
            raise ApiError(422, "Invalid", str(err)) from err
        return self.pods.modify(patched)  # type: ignore[no-any-return]

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        key = f"{namespace}/{name}"
        if kind == "Pod":
            current = self.pods.get(key)
            if current is None or (uid and current["metadata"]["uid"] != uid):
                return
            self.deleted_by_mcad.append(name)
            self.pods.delete(key)
            job = current["metadata"]["labels"]["job"]
            if job in self.jobs:
                self.make_pod(job)  # its controller replaces it
        elif kind in ("Job", "Deployment") and self.jobs.pop(key, None) is not None:
            for pod in self.pods.items():  # the garbage collector
                if pod["metadata"]["labels"]["job"] == key:
                    self.pods.delete(f"{namespace}/{pod['metadata']['name']}")


def job_aw(name: str, pods: int, cpu: int, priority: int, *, kind: str = "Job") -> dict[str, Any]:
    """An AppWrapper of one Job (or, ``kind="Deployment"``, one Deployment) of ``pods`` pods of ``cpu`` each."""
    pod_spec = {"containers": [{"name": "c", "resources": {"requests": {"cpu": str(cpu)}}}]}
    if kind == "Job":
        workload = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                    "spec": {"parallelism": pods, "completions": pods,
                             "template": {"spec": {"restartPolicy": "Never", **pod_spec}}}}
    else:
        workload = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                    "spec": {"replicas": pods, "template": {"spec": pod_spec}}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"priority": priority, "resources": {"GenericItems": [{"generictemplate": workload}]}},
            "status": {}}


def pinned_node(raw: Mapping[str, Any]) -> str | None:
    terms = (((raw["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for field in term.get("matchFields") or []:
            if field["key"] == NODE_NAME_FIELD and field["operator"] == "In":
                return str(field["values"][0])
    return None


class Sim:
    def __init__(self, harness_factory: Any, *, nodes: int = 4, cpu: str = "4", **options: Any) -> None:
        self.events = RecordedEvents()
        self.writer = SimWriter()
        # What the dispatcher's handlers have been told (the informers call handlers after updating their store,
        # in the order added: this one runs after the dispatcher's), so a quiet point is one where they have.
        self.handled: dict[str, dict[str, str]] = {"pod": {}, "node": {}}

        def watch_handlers(h: Harness) -> None:
            for kind, store in (("pod", h.dispatcher.pods), ("node", h.dispatcher.nodes)):
                store.add_handler(lambda _t, old, new, kind=kind: self._handled(kind, old, new))

        self.h: Harness = harness_factory(nodes=[node(f"n{i}", cpu) for i in range(nodes)], pods=[], aws=[],
                                          writer=self.writer, recorder=self.events, before_start=watch_handlers,
                                          **options)
        self.writer.pods = self.h.lw["pod"]

    def _handled(self, kind: str, old: Any, new: Any) -> None:
        view = new if new is not None else old
        key = view.uid if kind == "pod" else view.name
        if new is None:
            self.handled[kind].pop(key, None)
        else:
            self.handled[kind][key] = new.resource_version

    # -- the simulated cluster ------------------------------------------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        return self.h.lw["pod"].items()

    def pods_of(self, appwrapper: str) -> list[dict[str, Any]]:
        return [p for p in self.pods()
                if (p["metadata"].get("labels") or {}).get("workload.codeflare.dev/appwrapper") == appwrapper]

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {o["metadata"]["name"]: o for o in self.h.lw["node"]._objects.values()}

    def used(self) -> dict[str, ResourceVector]:
        used: dict[str, ResourceVector] = {name: ResourceVector() for name in self.nodes()}
        for pod in self.pods():
            where = pod["spec"].get("nodeName")
            if where and pod["status"]["phase"] not in ("Succeeded", "Failed"):
                used[where] = used[where] + pod_requests(pod["spec"], strict=False)
        return used

    def schedule(self, only: str = "") -> bool:
        """One pass of the scheduler over the pods it may place (those whose name starts with ``only``); True if it
        bound any or marked any refused."""
        changed = False
        for pod in sorted(self.pods(), key=lambda p: p["metadata"]["name"]):
            spec = pod["spec"]
            if (not pod["metadata"]["name"].startswith(only) or spec.get("nodeName") or spec.get("schedulingGates")
                    or pod["status"]["phase"] != "Pending"
                    or spec.get("schedulerName", "default-scheduler") != "default-scheduler"):  # another's to place
                continue
            used, nodes = self.used(), self.nodes()
            requests = pod_requests(pod["spec"], strict=False)
            pin = pinned_node(pod)
            candidates = [pin] if pin else sorted(nodes)
            fitting = [n for n in candidates if n in nodes and not (nodes[n].get("spec") or {}).get("unschedulable")
                       and requests.fits_in(node_allocatable(nodes[n]) - used[n])]
            if not fitting:
                conditions = pod["status"].get("conditions") or []
                if not any(c.get("reason") == "Unschedulable" for c in conditions):
                    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                                    "reason": "Unschedulable", "message": "0/4 nodes are available"}]
                    self.h.lw["pod"].modify(pod)
                    changed = True
                continue
            target = fitting[0] if pin else max(fitting, key=lambda n: (node_allocatable(nodes[n]) - used[n]).get(
                "cpu"))
            pod["spec"]["nodeName"] = target
            pod["status"] = {"phase": "Running"}
            self.h.lw["pod"].modify(pod)
            changed = True
        return changed

    def sync(self) -> None:
        """Wait until the informers show what the fake API server holds, then run the loop dry."""
        h = self.h
        for kind in ("pod", "node"):
            key = "uid" if kind == "pod" else "name"
            wait_informed(lambda kind=kind, key=key: self.handled[kind] == {
                o["metadata"][key]: o["metadata"]["resourceVersion"] for o in h.lw[kind].items()}, 5,
                f"the {kind} informer's handlers to catch up")
        aws = h.lw["aw"]
        wait_informed(lambda: len(h.dispatcher.appwrappers) == len(aws._objects), 5, "the AppWrapper informer")
        h.drain()

    def settle(self, *, schedule: bool = True) -> None:
        """Sync and schedule until nothing changes: no write of mcad's and no bind or refusal of the scheduler."""
        for _ in range(50):
            before = self.state()
            self.sync()
            scheduled = schedule and self.schedule()
            if not scheduled and self.state() == before:
                return
        raise AssertionError("the simulation did not settle in 50 rounds")

    def state(self) -> tuple[str, ...]:
        """The fake API server's resourceVersions: any write moves one."""
        return tuple(lw.resource_version for lw in self.h.lw.values())

    # -- actions --------------------------------------------------------------------------------------------------

    def add(self, raw: dict[str, Any]) -> None:
        self.h.lw["aw"].add(raw)

    def delete(self, name: str) -> None:
        self.h.lw["aw"].delete(f"ns/{name}")

    def fail_a_pod(self, rng: random.Random) -> None:
        running = [p for p in self.pods() if p["status"]["phase"] == "Running"]
        if running:
            pod = rng.choice(running)
            pod["status"] = {"phase": "Failed"}
            self.h.lw["pod"].modify(pod)
            job = pod["metadata"]["labels"]["job"]
            if job in self.writer.jobs:
                self.writer.make_pod(job)

    def cordon(self, name: str, on: bool) -> None:
        raw = copy.deepcopy(self.nodes()[name])
        raw["spec"] = {**raw.get("spec", {}), "unschedulable": on}
        self.h.lw["node"].modify(raw)

    # -- invariants -----------------------------------------------------------------------------------------------

    def check(self) -> None:
        d = self.h.dispatcher
        nodes = self.nodes()
        for name, used in self.used().items():
            assert used.fits_in(node_allocatable(nodes[name])), f"node {name} over-committed: {used}"
        for name, room in d.owners.accountant.room().items():
            assert ResourceVector().fits_in(room), f"mcad promised more of {name} than it has: room {room}"
        replanned = {message.split()[1] for _, reason, message in self.events.recorded
                     if reason == events.PLACEMENT_REPLANNED}
        for pod in self.pods():
            meta, spec = pod["metadata"], pod["spec"]
            gates = [g["name"] for g in spec.get("schedulingGates") or []]
            if spec.get("nodeName"):
                assert pinned_node(pod) == spec["nodeName"], f"{meta['name']} bound to a node mcad did not pin"
                continue
            if pod["status"]["phase"] != "Pending":
                continue
            refused = any(c.get("reason") == "Unschedulable" for c in pod["status"].get("conditions") or [])
            assert not (refused and not gates), f"{meta['name']} left pinned where the scheduler refuses it"
            aw = d.owners.queued.dispatched_now(f"ns/{meta['labels']['workload.codeflare.dev/appwrapper']}")
            if PLACEMENT_GATE in gates and aw is not None:
                waiting = dict(d.owners.pinning.waiting(aw.key)) if d.owners.pinning is not None else {}
                assert meta["name"] in waiting, f"{meta['name']} is gated with nothing said of why"
                owner = meta["ownerReferences"][0]
                assert waiting[meta["name"]].message.startswith(
                    f"waits for room: 1 pod of {owner['kind']} {owner['name']} ("), waiting
        for name in self.writer.deleted_by_mcad:
            assert name in replanned, f"{name} was deleted by mcad without a PlacementReplanned Event"


def node_allocatable(raw: Mapping[str, Any]) -> ResourceVector:
    from mcad.api.views import node_view
    return node_view(raw).allocatable


@pytest.fixture
def sim_factory(harness_factory: Any) -> Any:
    return lambda **options: Sim(harness_factory, **options)


def test_the_tight_gang_is_placed_as_planned_and_the_spread_one_is_not(sim_factory: Any) -> None:
    """Two 4-cpu nodes, an AppWrapper of 2 x 2 cpu, then one of 3 cpu: only 2 + 2 | 3 packs them."""
    for placement, whole in (("binding", True), ("advisory", False)):
        sim = sim_factory(nodes=2, placement=placement)
        big = job_aw("big", 1, 3, 0)
        sim.add(job_aw("pair", 2, 2, 5))  # first in the queue: its pods come first
        sim.add(big)
        sim.settle(schedule=False)
        assert sorted(sim.writer.applied) == ["big", "pair"]
        ledger = {n["name"]: n for n in Reports(sim.h.dispatcher.view, lambda: {}).ledger()["nodes"]}
        if whole:  # pinned and not bound yet: the ledger (mcadctl ledger, the heat map) says where
            assert (ledger["n0"]["pinned"], ledger["n1"]["pinned"]) == (2, 1)
            assert ledger["n0"]["planned"] == {"cpu": "4"} and ledger["n1"]["planned"] == {"cpu": "3"}
        else:
            assert (ledger["n0"]["pinned"], ledger["n1"]["pinned"]) == (0, 0)
        # The scheduler meets the pair's pods first, then the big one's.
        sim.schedule(only="pair")
        sim.settle()
        bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in sim.pods()}
        assert all(bound.values()) is whole, (placement, bound)
        if whole:
            sim.check()


@pytest.mark.parametrize("seed", range(int(os.environ.get("MCAD_SIM_SEEDS", "8"))))
def test_random_runs_keep_every_pod_where_mcad_pinned_it(sim_factory: Any, seed: int) -> None:
    rng = random.Random(seed)
    sim = sim_factory(nodes=4)
    d = sim.h.dispatcher
    counts: dict[str, float] = {}
    names = itertools.count()
    live: list[str] = []
    cordoned: set[str] = set()
    for _step in range(40):
        action = rng.random()
        if action < 0.45 or not live:
            name = f"aw{next(names)}"
            sim.add(job_aw(name, rng.randint(1, 3), rng.randint(1, 3), rng.choice((0, 0, 5)),
                           kind=rng.choice(("Job", "Deployment"))))
            live.append(name)
        elif action < 0.65:
            sim.delete(live.pop(rng.randrange(len(live))))
        elif action < 0.8:
            sim.fail_a_pod(rng)
        elif cordoned and rng.random() < 0.4:
            sim.cordon(target := rng.choice(sorted(cordoned)), False)
            cordoned.discard(target)
        else:
            # A cordon between a pin and its bind: a new AppWrapper is dispatched and its pods pinned, and before
            # the scheduler runs, a node one of them is pinned to is cordoned.
            name = f"aw{next(names)}"
            sim.add(job_aw(name, rng.randint(1, 3), rng.randint(1, 3), 0, kind=rng.choice(("Job", "Deployment"))))
            live.append(name)
            sim.sync()
            pinned = sorted({node for _, node in sim.h.dispatcher.owners.accountant.plans.pins().values()} - cordoned)
            target = rng.choice(pinned or sorted(set(sim.nodes()) - cordoned) or sorted(sim.nodes()))
            replanned = d.metrics.value("mcad_pod_pins_total", {"outcome": "replanned"}) or 0
            sim.cordon(target, True)
            cordoned.add(target)
            sim.settle()
            if pinned:  # a pod pinned there and not bound yet: its pin was re-planned
                assert (d.metrics.value("mcad_pod_pins_total", {"outcome": "replanned"}) or 0) > replanned
        sim.settle()
        sim.check()
    counts = {o: d.metrics.value("mcad_pod_pins_total", {"outcome": o}) or 0 for o in ("pinned", "extra")}
    assert sim.writer.applied, "the run dispatched something"
    assert counts["pinned"] and counts["extra"], f"pods were pinned, some beyond their plan: {counts}"


def test_gated_pods_no_dispatched_appwrapper_made_are_never_placed(sim_factory: Any) -> None:
    """A pod carrying the gate and the label of a queued AppWrapper waits for its dispatch (no Event: it may be one
    of its own, come early) and is forgotten when deleted; one of no AppWrapper is refused with an Event."""
    sim = sim_factory(nodes=1)
    sim.add(job_aw("big", 2, 3, 0))  # 6 cpu on one 4-cpu node: stays queued
    sim.settle()
    assert sim.writer.applied == []

    def own_pod(name: str, appwrapper: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {
                "workload.codeflare.dev/appwrapper": appwrapper}},
            "spec": {"schedulingGates": [{"name": PLACEMENT_GATE}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Pending"}}

    sim.h.lw["pod"].add(own_pod("early", "big"))
    sim.h.lw["pod"].add(own_pod("stray", "ghost"))
    sim.settle()
    pinning = sim.h.dispatcher.owners.pinning
    assert pinning.counts()["dispatch"] == 1
    refused = [(name, message) for name, reason, message in sim.events.recorded if reason == events.PLACEMENT_REFUSED]
    assert refused == [("stray", "no AppWrapper ns/ghost exists, so mcad does not place it")]
    sim.h.lw["pod"].delete("ns/early")
    sim.settle()
    assert pinning.counts()["dispatch"] == 0, "a deleted pod is not remembered"
    for pod in sim.pods():
        assert [g["name"] for g in pod["spec"]["schedulingGates"]] == [PLACEMENT_GATE], "still gated"


def test_a_pin_the_scheduler_refuses_is_kept_until_another_node_can_take_the_pod(sim_factory: Any) -> None:
    """The scheduler refuses a pinned pod for what mcad does not model (here a node's pod count): with no other
    node free, the pin stays and the AppWrapper's pendingpodconditions carry the scheduler's verdict; once another
    node has room, the pod is re-planned there (deleted, re-created by its Job, placed again) with an Event."""
    sim = sim_factory(nodes=2)
    sim.h.lw["pod"].add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog", "namespace": "other",
                                                                          "uid": "uid-hog"},
                         "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
                             "requests": {"cpu": "4"}}}]}, "status": {"phase": "Running"}})
    sim.add(job_aw("a", 1, 1, 0, kind="Deployment"))
    sim.settle(schedule=False)
    [pod] = sim.pods_of("a")
    assert pinned_node(pod) == "n0"
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/2 nodes are available: 1 Too many pods."}]
    sim.h.lw["pod"].modify(pod)
    sim.settle(schedule=False)
    sim.h.clock.advance(6)  # pod counts are written at most every 5 s
    sim.settle(schedule=False)
    assert sim.writer.deleted_by_mcad == [], "no other node has room: the pin stays"
    [entry] = last_status(sim.h, "a")["pendingpodconditions"]
    assert entry["conditions"][0]["message"] == "0/2 nodes are available: 1 Too many pods."
    sim.h.lw["pod"].delete("other/hog")
    sim.settle()
    assert sim.writer.deleted_by_mcad == [pod["metadata"]["name"]]
    [moved] = sim.pods_of("a")
    assert moved["spec"]["nodeName"] == "n1" and pinned_node(moved) == "n1"
    assert any(reason == events.PLACEMENT_REPLANNED and "1 Too many pods" in message
               for _, reason, message in sim.events.recorded)


def test_a_refused_pin_of_a_job_requeues_its_appwrapper_instead_of_deleting_the_pod(sim_factory: Any) -> None:
    """A Job counts a deleted pod as a failed one (backoffLimit), so a Job's pod whose pinned node was cordoned
    before it bound is not deleted: its AppWrapper is requeued, and dispatched again onto the node left."""
    sim = sim_factory(nodes=2)
    sim.add(job_aw("a", 1, 1, 0))
    sim.settle(schedule=False)
    [pod] = sim.pods_of("a")
    sim.cordon(pinned_node(pod) or "", True)
    sim.settle()
    assert sim.writer.deleted_by_mcad == [], "the Job's pod was not deleted by a re-plan"
    requeued = [message for _, reason, message in sim.events.recorded if reason == events.REQUEUED]
    assert any("Job a would count a deleted pod as a failed one" in m for m in requeued), sim.events.recorded
    [again] = sim.pods_of("a")
    assert again["spec"]["nodeName"] != pinned_node(pod) and pinned_node(again) == again["spec"]["nodeName"]
