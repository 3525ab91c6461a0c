"""Reservations on a real cluster: a gang of 4 pods that needs 4 whole nodes is not starved by a stream
of small AppWrappers (and is, with --reservations 0: the test can fail), and backfill: a bounded AppWrapper uses the
reserved room it is sure to leave in time, an unbounded one waits, and the gang is not delayed.

The nodes are kwok nodes made for the test with an extended resource, ``mcad.test/slot``, that no other node has,
so what other tests left on the cluster's own nodes does not matter; pods are Job pods whose kwok completion delay
is their run time."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import LOGS, AppWrappers, Controller, appwrapper, fake_node, running_controller
from test.support import wait_until

SLOT = "mcad.test/slot"
ON, OFF = "reservations", "no-reservations"
CONTROLLER_ARGS = {ON: (), OFF: ("--reservations=0",)}
# What the control plane adds to a run time: the Job controller, the scheduler, kwok's stages, watches.
SLACK_SECONDS = 15


@pytest.fixture(scope="module", params=list(CONTROLLER_ARGS))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def controller(mode: str, controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    with running_controller(controller_kubeconfig, LOGS / f"test_reservations-{mode}.log",
                            *CONTROLLER_ARGS[mode]) as ctl:
        yield ctl


@contextlib.contextmanager
def slot_nodes(core: k8s.CoreV1Api, count: int) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            stack.enter_context(fake_node(core, cpu="8", memory="16Gi", **{SLOT: "4"}))
        yield


def slot_job(name: str, pods: int, slots: int, run_seconds: float) -> dict[str, Any]:
    """A Job of ``pods`` pods, each taking ``slots`` slots for ``run_seconds`` once Running."""
    requests = {"cpu": "10m", "memory": "16Mi", SLOT: str(slots)}
    return {"replicas": 1, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": f"{run_seconds:g}s"}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox", "resources": {"requests": requests, "limits": requests}}]}}}}}


def running_pods(aws: AppWrappers, name: str) -> int:
    return sum(1 for pod in aws.pods(name) if pod.status.phase == "Running")


def test_a_gang_is_not_starved_by_a_stream_of_small_ones(mode: str, controller: Controller, aws: AppWrappers,
                                                         core: k8s.CoreV1Api) -> None:
    rng = random.Random(17)
    with slot_nodes(core, 4):
        runs = [rng.uniform(6, 12) for _ in range(16)]
        for i, run in enumerate(runs):  # 16 one-slot AppWrappers fill the 16 slots
            aws.create(appwrapper(f"first-{i:02d}", slot_job(f"first-{i:02d}", 1, 1, run)))
        wait_until(lambda: sum(running_pods(aws, f"first-{i:02d}") for i in range(16)) == 16, 90,
                   "the 16 slots full")
        created = time.monotonic()
        aws.create(appwrapper("gang", slot_job("gang", 4, 4, 3600), priority=10))
        for i in range(48):  # a backlog of small ones behind it, enough to refill every slot three times over
            aws.create(appwrapper(f"next-{i:02d}", slot_job(f"next-{i:02d}", 1, 1, rng.uniform(8, 12))))
        deadline = max(runs) + SLACK_SECONDS  # every slot it needs is free by then, if nothing else took them
        if mode == ON:
            aws.wait_state("gang", "Running", timeout=deadline - (time.monotonic() - created))
            took = time.monotonic() - created
            assert took <= deadline, took
            assert not any(aws.exists("batch/v1", "Job", f"next-{i:02d}") for i in range(48)), \
                "no small one behind it took a slot it waited for"
            return
        # Without reservations the small ones behind take each freed slot: at the deadline the gang still waits.
        left = deadline - (time.monotonic() - created)
        with contextlib.suppress(AssertionError):
            aws.wait_state("gang", "Running", timeout=max(left, 1))
            raise AssertionError("the gang dispatched within the deadline without reservations: the test cannot fail")
        assert aws.status("gang")["state"] == "Pending"
        assert any(aws.exists("batch/v1", "Job", f"next-{i:02d}") for i in range(48))


@pytest.mark.parametrize("mode", [ON], indirect=True)  # backfill is about reservations
def test_backfill_uses_reserved_room_only_when_sure_to_leave_it_in_time(mode: str, controller: Controller,
                                                                        aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    namespace = aws.namespace
    with slot_nodes(core, 2):
        # 3 of the 4 slots of each node, held by AppWrappers that mcad ends after 30 s (their pods would run on).
        bound = {"dispatchDuration": {"limit": 30}}
        aws.create(appwrapper("x", slot_job("x", 1, 3, 3600), scheduling=bound))
        aws.create(appwrapper("y", slot_job("y", 1, 3, 3600), scheduling=bound))
        wait_until(lambda: running_pods(aws, "x") + running_pods(aws, "y") == 2, 60, "x and y Running")
        started = time.monotonic()
        aws.create(appwrapper("gang", slot_job("gang", 2, 4, 3600), priority=10))
        aws.wait_state("gang", "Pending")
        aws.create(appwrapper("unbounded", slot_job("unbounded", 1, 1, 5)))
        aws.create(appwrapper("too-long", slot_job("too-long", 1, 1, 5), scheduling={"dispatchDuration":
                                                                                        {"limit": 300}}))
        aws.create(appwrapper("short", slot_job("short", 1, 1, 3), scheduling={"dispatchDuration": {"limit": 10}}))
        aws.wait_state("short", "Running")
        for name in ("unbounded", "too-long"):
            wait_until(lambda name=name: f"waiting behind the reservation of {namespace}/gang on nodes"
                       in aws.status(name).get("message", ""), 30, f"{name} to wait behind the gang's reservation")
            assert not aws.exists("batch/v1", "Job", name)
        aws.wait_state("gang", "Running", timeout=30 + SLACK_SECONDS)
        assert time.monotonic() - started <= 30 + SLACK_SECONDS, "backfill did not delay it past x and y's end"
