"""Placement that binds (--placement=binding, the default) against the kube-scheduler's own choices (advisory):
a tight gang runs whole on the nodes of its plan, a reservation holds against a stream of small AppWrappers, and
pods a tenant makes with mcad's gate and label are not placed.

A gang whose only packing is tight: two nodes, a Job of two pods and a bare Pod that together fill both nodes only
when the Job's pods share one node. mcad's plan (first-fit decreasing) finds that packing; the scheduler, left to
itself, spreads the Job's pods over both nodes and the last pod has nowhere to go. The bare Pod carries a
scheduling gate of the test's own (``test.mcad/hold``) that the test removes once the Job's pods are bound, so the
scheduler meets the pods in the same order in both modes: the Job's first.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test import escalations
from test.e2e.conftest import (
    LOGS,
    AppWrappers,
    Controller,
    appwrapper,
    delete_fake_node,
    fake_node,
    job_item,
    pinned,
    running_controller,
)
from test.e2e.test_admission import account, kubectl, token_kubeconfig
from test.support import wait_until

HOLD = "test.mcad/hold"
PAIR_LABEL = "mcad.test/pair"


@contextlib.contextmanager
def labelled_nodes(core: k8s.CoreV1Api, count: int, label: str, capacity: dict[str, str]) -> Iterator[
        tuple[list[str], str]]:
    """``count`` fake nodes of ``capacity`` (with 110 pods) sharing the label ``label`` with a value of their own;
    yields their names (sorted) and that value, which pods can select."""
    tag = uuid.uuid4().hex[:6]
    names = [f"mcad-test-{tag}-{i}" for i in range(count)]
    capacity = {"pods": "110", **capacity}
    for name in names:
        core.create_node({"metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                       "labels": {"mcad.test/owned": "true", label: tag}},
                          "status": {"capacity": capacity, "allocatable": capacity}})
    try:
        for name in names:
            wait_until(lambda name=name: any(c.type == "Ready" and c.status == "True"
                                             for c in core.read_node(name).status.conditions or []),
                       60, f"node {name} Ready")
        yield names, tag
    finally:
        for name in names:
            delete_fake_node(core, name)


@pytest.fixture
def node_pair(request: pytest.FixtureRequest, core: k8s.CoreV1Api, crd: None) -> Iterator[tuple[list[str], str]]:
    """Two fake nodes with the resources the test names (``request.param``), labelled as a pair."""
    with labelled_nodes(core, 2, PAIR_LABEL, {"memory": "64Gi", **request.param}) as pair:
        yield pair


def _spec(tag: str, requests: dict[str, str], *, hold: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {PAIR_LABEL: tag}, "containers": [{
        "name": "main", "image": "trainer", "resources": {"requests": requests, "limits": requests}}]}
    if hold:
        spec["schedulingGates"] = [{"name": HOLD}]
    return spec


def tight_gang(name: str, tag: str, small: dict[str, str], big: dict[str, str]) -> dict[str, Any]:
    """A Job of 2 pods of ``small`` and a bare Pod of ``big`` (held by the test's own gate)."""
    job = {"replicas": 1, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-job"},
        "spec": {"parallelism": 2, "completions": 2, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}},
            "spec": {"restartPolicy": "Never", **_spec(tag, small)}}}}}
    pod = {"replicas": 1, "generictemplate": {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-big"}, "spec": _spec(tag, big, hold=True)}}
    return appwrapper(name, job, pod)


def release_hold(core: k8s.CoreV1Api, namespace: str, name: str) -> None:
    """Remove the test's own gate from a pod (mcad's, if still there, stays)."""
    pod = core.read_namespaced_pod(name, namespace)
    gates = [{"name": g.name} for g in pod.spec.scheduling_gates or [] if g.name != HOLD]
    core.patch_namespaced_pod(name, namespace, [{"op": "replace", "path": "/spec/schedulingGates", "value": gates}])


def pinned_node(pod: Any) -> str | None:
    """The node a pod's required node affinity names by metadata.name, if any."""
    affinity = pod.spec.affinity
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution \
        if affinity and affinity.node_affinity else None
    for term in (required.node_selector_terms if required else []) or []:
        for field in term.match_fields or []:
            if field.key == "metadata.name" and field.operator == "In" and len(field.values) == 1:
                return str(field.values[0])
    return None


CPU = ({"cpu": "4"}, {"cpu": "2"}, {"cpu": "3"})
GPU = ({"cpu": "16", "nvidia.com/gpu": "8"}, {"cpu": "100m", "nvidia.com/gpu": "4"},
       {"cpu": "100m", "nvidia.com/gpu": "6"})


@pytest.mark.parametrize(("node_pair", "small", "big"), [CPU, GPU], ids=["cpu", "gpu"], indirect=["node_pair"])
def test_a_tight_gang_runs_whole_on_the_nodes_of_its_plan(
        node_pair: tuple[list[str], str], small: dict[str, str], big: dict[str, str], controller_kubeconfig: str,
        aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    (first, second), tag = node_pair
    with running_controller(controller_kubeconfig, LOGS / "test_placement.log"):
        aws.create(tight_gang("tight", tag, small, big))
        aws.wait_state("tight", "Running")
        job_pods = wait_until(lambda: [p for p in aws.pods("tight") if p.spec.node_name
                                       and p.metadata.name != "tight-big"] if len(
            [p for p in aws.pods("tight") if p.spec.node_name and p.metadata.name != "tight-big"]) == 2 else None,
            60, "the Job's two pods bound")
        # First-fit decreasing: the big pod on the first node, both Job pods on the second.
        assert sorted(p.spec.node_name for p in job_pods) == [second, second]
        assert all(pinned_node(p) == second for p in job_pods)
        big_pod = core.read_namespaced_pod("tight-big", aws.namespace)
        assert [g.name for g in big_pod.spec.scheduling_gates or []] == [HOLD], "mcad's gate is gone, the test's stays"
        assert pinned_node(big_pod) == first
        release_hold(core, aws.namespace, "tight-big")
        running = aws.wait_pods("tight", 3)
        assert {p.metadata.name: p.spec.node_name for p in running}["tight-big"] == first
        aws.delete("tight")
        wait_until(lambda: not aws.pods("tight"), 60, "the gang's pods to go")


@pytest.mark.parametrize(("node_pair", "small", "big"), [CPU, GPU], ids=["cpu", "gpu"], indirect=["node_pair"])
def test_with_advisory_placement_the_scheduler_spreads_the_gang_and_a_pod_stays_pending(
        node_pair: tuple[list[str], str], small: dict[str, str], big: dict[str, str], controller_kubeconfig: str,
        aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    (first, second), tag = node_pair
    with running_controller(controller_kubeconfig, LOGS / "test_placement.log", "--placement=advisory"):
        aws.create(tight_gang("loose", tag, small, big))
        aws.wait_state("loose", "Running")
        job_pods = wait_until(lambda: (bound := [p for p in aws.pods("loose") if p.spec.node_name]) and len(
            bound) == 2 and bound, 60, "the Job's two pods bound")
        assert sorted(p.spec.node_name for p in job_pods) == [first, second], "the scheduler spreads them"
        assert all(pinned_node(p) is None for p in job_pods)
        release_hold(core, aws.namespace, "loose-big")

        def refused() -> str | None:
            pod = core.read_namespaced_pod("loose-big", aws.namespace)
            return next((c.message for c in pod.status.conditions or []
                         if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

        assert "Insufficient" in wait_until(refused, 60, "the big pod to be unschedulable")
        aws.delete("loose")
        wait_until(lambda: not aws.pods("loose"), 60, "the gang's pods to go")


# -- reservations bind ----------------------------------------------------------------------------------------------

ROW_LABEL = "mcad.test/row"


def cpu_nodes(core: k8s.CoreV1Api, count: int) -> contextlib.AbstractContextManager[tuple[list[str], str]]:
    """``count`` fake 4-cpu nodes labelled as one row. Pods select the row, so what other tests leave on the
    cluster's own nodes does not matter. Capacity is cpu, not an extended resource, because the scheduler's scoring
    (least allocated) weighs cpu and memory only: with cpu it prefers the emptiest node, as it does for real
    workloads."""
    return labelled_nodes(core, count, ROW_LABEL, {"cpu": "4", "memory": "16Gi"})


def row_job(name: str, row: str, pods: int, cpu: int, run_seconds: float) -> dict[str, Any]:
    requests = {"cpu": str(cpu), "memory": "16Mi"}
    return {"replicas": 1, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": f"{run_seconds:g}s"}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {ROW_LABEL: row}, "containers": [{
                "name": "main", "image": "busybox", "resources": {"requests": requests, "limits": requests}}]}}}}}


def reserved_nodes(ctl: Controller, key: str) -> list[str] | None:
    status, body = ctl.get("/debug/queue")
    assert status == 200, body
    held = next((r for r in json.loads(body)["reservations"] if r["appwrapper"] == key), None)
    return list(held["nodes"]) if held else None


def filler_pods_on(aws: AppWrappers, core: k8s.CoreV1Api, nodes: set[str]) -> list[tuple[str, str]]:
    """(pod, node) of the namespace's running pods, other than the gang's, bound to one of ``nodes``."""
    return [(p.metadata.name, p.spec.node_name) for p in core.list_namespaced_pod(aws.namespace).items
            if p.spec.node_name in nodes and p.status.phase in ("Pending", "Running")
            and not p.metadata.name.startswith("gang-")]


@pytest.mark.parametrize("placement", ["binding", "advisory"])
def test_a_reservation_binds_against_a_stream_of_small_appwrappers(
        placement: str, controller_kubeconfig: str, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """Six 4-cpu nodes full of short 1-cpu AppWrappers; a priority-10 gang of 4 x 4 cpu reserves four of them, and
    a stream of 1-cpu AppWrappers keeps coming. mcad means the stream for the two nodes it did not reserve; with
    placement binding that is where their pods go, so the gang starts as soon as its nodes' last filler ends. Left
    to the scheduler (advisory), fillers land on the reserved nodes as they empty, since it prefers the emptiest."""
    run = 3.0
    rng = random.Random(25)
    with running_controller(controller_kubeconfig, LOGS / f"test_placement-{placement}.log",
                            f"--placement={placement}") as ctl, cpu_nodes(core, 6) as (nodes, row):
        for i in range(24):  # they end at different times, as a steady stream's would
            aws.create(appwrapper(f"fill-{i:02d}", row_job(f"fill-{i:02d}", row, 1, 1, rng.uniform(6, 12))))
        # At most 3 slots free: no node is empty, so the gang cannot start and reserves.
        wait_until(lambda: len(filler_pods_on(aws, core, set(nodes))) >= 21, 90, "the slots full")
        aws.create(appwrapper("gang", row_job("gang", row, 4, 4, 3600), priority=10))
        key = f"{aws.namespace}/gang"
        reserved = set(wait_until(lambda: reserved_nodes(ctl, key), 30, "the gang's reservation"))
        assert len(reserved) == 4
        stream_end = time.monotonic() + 20
        # Binding: watch on after the stream until the gang starts (a slow machine's fillers may outlast the stream).
        deadline = stream_end + (30 if placement == "binding" else 0)
        n = 0
        landed: set[tuple[str, str]] = set()  # stream pods seen on a reserved node while the gang waited
        busy_at = time.monotonic()  # when a filler was last seen on a reserved node
        dispatched_at = None
        while time.monotonic() < deadline:
            if time.monotonic() < stream_end:
                aws.create(appwrapper(f"next-{n:03d}", row_job(f"next-{n:03d}", row, 1, 1, run)))
                n += 1
            if aws.status("gang").get("state") == "Running":
                dispatched_at = time.monotonic()
                break
            on_reserved = filler_pods_on(aws, core, reserved)
            landed |= {(pod, node) for pod, node in on_reserved if pod.startswith("next-")}
            if on_reserved:
                busy_at = time.monotonic()
            time.sleep(0.25)  # the stream's pace (a load, not a wait for a condition)
        if placement == "advisory":
            assert landed, "the scheduler put no stream pod on the reserved nodes: the test shows nothing"
            return
        assert not landed, f"stream pods bound to the gang's reserved nodes: {sorted(landed)}"
        assert dispatched_at is not None, "the gang did not start within 30 s of the stream's end"
        # Its nodes' last filler ended within one pass of the loop after busy_at: the gang went within 2 s of that
        # (a pass is a create, two reads and 0.25 s).
        assert dispatched_at - busy_at <= 2 + 2, (dispatched_at - busy_at)
        aws.wait_pods("gang", 4)


# -- the gate and the labels give a tenant nothing -------------------------------------------------------------------

TENANT_RIGHTS = [*escalations.APPWRAPPER_RIGHTS,
                 {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "patch", "delete"]},
                 {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get"]}]


def gated_pod(name: str, appwrapper_name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"workload.codeflare.dev/appwrapper": appwrapper_name}}
    if owner is not None:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "schedulingGates": [{"name": "mcad.codeflare.dev/placement"}],
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}]}}


def test_a_tenants_own_gated_pod_is_not_placed_by_mcad(kubeconfig: str, controller_kubeconfig: str,
                                                         aws: AppWrappers, core: k8s.CoreV1Api,
                                                         tmp_path: Path) -> None:
    """As a user holding AppWrapper, Job and pod rights: pods that carry mcad's gate and the AppWrapper label,
    made by the user and not by an AppWrapper (of a dispatched one, claiming it as their controller; of one that
    does not exist), are left gated with a PlacementRefused Event that says why; the AppWrapper's own pod runs."""
    admin = kube.connect(kubeconfig)
    account(admin, aws.namespace, "carol", TENANT_RIGHTS)
    carol = token_kubeconfig(kubeconfig, admin, aws.namespace, "carol", tmp_path / "carol")
    with running_controller(controller_kubeconfig, LOGS / "test_placement.log"):
        proc = kubectl(carol, "create", {**appwrapper("mine", job_item("mine", 1, "10m", duration="1h")),
                                         "metadata": {"name": "mine", "namespace": aws.namespace}})
        assert proc.returncode == 0, proc.stderr
        aws.wait_pods("mine", 1)
        uid = aws.uid("mine")
        forged = gated_pod("forged", "mine", {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                                              "name": "mine", "uid": uid})
        for body in (gated_pod("loose", "mine"), forged, gated_pod("orphan", "no-such-appwrapper")):
            proc = kubectl(carol, "create", {**body, "metadata": {**body["metadata"], "namespace": aws.namespace}})
            assert proc.returncode == 0, proc.stderr

        def refusal(name: str) -> str | None:
            found = core.list_namespaced_event(aws.namespace, field_selector=f"involvedObject.name={name}").items
            return next((e.message for e in found if e.reason == "PlacementRefused"), None)

        assert "has no controller, so no AppWrapper made it" in wait_until(lambda: refusal("loose"), 30, "loose")
        assert "names AppWrapper mine" in wait_until(lambda: refusal("forged"), 30, "forged")
        assert f"no AppWrapper {aws.namespace}/no-such-appwrapper exists" in wait_until(
            lambda: refusal("orphan"), 30, "orphan")
        for name in ("loose", "forged", "orphan"):
            pod = core.read_namespaced_pod(name, aws.namespace)
            assert [g.name for g in pod.spec.scheduling_gates or []] == ["mcad.codeflare.dev/placement"]
            assert pod.spec.affinity is None and not pod.spec.node_name
        assert aws.pods("mine", "Running"), "the AppWrapper's own pod was placed"
        for name in ("loose", "orphan"):  # no AppWrapper's: they do not go with the namespace's AppWrappers
            core.delete_namespaced_pod(name, aws.namespace, grace_period_seconds=0)


def test_pods_a_tenant_makes_for_its_appwrapper_hold_no_room_and_do_not_count(
        kubeconfig: str, controller_kubeconfig: str, aws: AppWrappers, core: k8s.CoreV1Api, tmp_path: Path) -> None:
    """As a user holding AppWrapper, Job and pod rights, what the last review did by hand: gated pods labelled for
    the user's running AppWrapper, naming its Job as their controller (with the Job's uid, read from its pod: a
    made-up uid would have them deleted by the garbage collector, the owner not existing), with a schedulerName
    nobody serves; and a plain pod carrying the label that then fails. The claims wait, the AppWrapper's demand
    being used already, and hold no room: another AppWrapper that needs the rest of the node dispatches beside
    them. The stray pod neither counts in the AppWrapper's pods nor resets it when it fails."""
    admin = kube.connect(kubeconfig)
    account(admin, aws.namespace, "carol", TENANT_RIGHTS)
    carol = token_kubeconfig(kubeconfig, admin, aws.namespace, "carol", tmp_path / "carol")

    def as_carol(body: dict[str, Any]) -> None:
        proc = kubectl(carol, "create", {**body, "metadata": {**body["metadata"], "namespace": aws.namespace}})
        assert proc.returncode == 0, proc.stderr

    with fake_node(core, cpu="4", memory="16Gi") as on_node, \
            running_controller(controller_kubeconfig, LOGS / "test_placement.log"):
        as_carol(appwrapper("mine", pinned(job_item("mine", 1, "1", duration="1h"), on_node)))
        [own] = aws.wait_pods("mine", 1)
        [job] = [ref for ref in own.metadata.owner_references if ref.controller]
        forged = []
        for i in range(3):
            body = gated_pod(f"claims-{i}", "mine", {"apiVersion": "batch/v1", "kind": "Job", "name": job.name,
                                                     "uid": job.uid})
            body["spec"].update(schedulerName="nobody", nodeSelector=on_node)
            body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
            as_carol(body)
            forged.append(body["metadata"]["name"])
        stray = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "stray", "labels": {"workload.codeflare.dev/appwrapper": "mine"}},
            "spec": {"nodeSelector": on_node, "containers": [{"name": "main", "image": "busybox"}]}}
        as_carol(stray)

        def waits_beyond_demand() -> list[str]:
            return [p["podname"] for p in aws.status("mine").get("pendingpodconditions") or []
                    if "more than its demand" in p["conditions"][0]["message"]]

        assert sorted(wait_until(waits_beyond_demand, 30, "the claims to wait beyond the demand")) == [
            "claims-0", "claims-1", "claims-2"]
        # Room for three more cpu is not promised to them: another AppWrapper that needs it dispatches now.
        aws.create(appwrapper("beside", pinned(job_item("beside", 3, "1", duration="1h"), on_node)))
        aws.wait_pods("beside", 3)
        wait_until(lambda: core.read_namespaced_pod("stray", aws.namespace).status.phase == "Running", 60,
                   "the stray pod to run")
        core.patch_namespaced_pod_status("stray", aws.namespace, {"status": {"phase": "Failed"}})
        wait_until(lambda: aws.status("mine").get("failed") == 0 and aws.status("mine").get("running") == 1, 30,
                   "the AppWrapper's counts, its own pod only")
        status = aws.status("mine")
        assert status["state"] == "Running" and not status.get("resettingCount"), status
        for name in forged:
            pod = core.read_namespaced_pod(name, aws.namespace)
            assert [g.name for g in pod.spec.scheduling_gates or []] == ["mcad.codeflare.dev/placement"], name
            core.delete_namespaced_pod(name, aws.namespace, grace_period_seconds=0)
        core.delete_namespaced_pod("stray", aws.namespace, grace_period_seconds=0)
