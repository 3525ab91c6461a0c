"""Dispatch order in both queueing modes without reservations, one controller per mode: priority first, then age.
Best-effort FIFO (--reservations 0) lets a smaller later AppWrapper pass one that does not fit; --strict-fifo
holds it back and says so, yet an AppWrapper that could never fit, or one deleted while it waits at the head,
holds nothing back. The default, reservations, is test_reservations.py's."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import (
    LOGS,
    AppWrappers,
    Controller,
    appwrapper,
    blocked_on,
    deployment_item,
    free_cpu_millis,
    running_controller,
)

BEST_EFFORT = "best-effort"
STRICT_FIFO = "strict-fifo"
CONTROLLER_ARGS = {BEST_EFFORT: ("--reservations=0",), STRICT_FIFO: ("--strict-fifo",)}

# A scenario about what only --strict-fifo promises runs under it alone.
strict_fifo_only = pytest.mark.parametrize("mode", [STRICT_FIFO], indirect=True)


@pytest.fixture(scope="module", params=list(CONTROLLER_ARGS))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def controller(mode: str, controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    # Module-scoped and parametrized: pytest runs every test of one mode, stops that controller, then starts the
    # other, so the two never dispatch side by side.
    with running_controller(controller_kubeconfig, LOGS / f"test_ordering-{mode}.log", *CONTROLLER_ARGS[mode]) as ctl:
        yield ctl


def test_higher_priority_dispatches_first_when_capacity_frees(controller: Controller, aws: AppWrappers,
                                                              core: k8s.CoreV1Api) -> None:
    share = f"{free_cpu_millis(core) * 60 // 100}m"
    aws.create(appwrapper("blocker", deployment_item("blocker", 1, share)))
    aws.wait_state("blocker", "Running")
    aws.create(appwrapper("low", deployment_item("low", 1, share), priority=1))
    aws.create(appwrapper("high", deployment_item("high", 1, share), priority=10))
    aws.wait_state("low", "Pending")
    aws.wait_state("high", "Pending")

    aws.delete("blocker")
    aws.wait_state("high", "Running")
    low = aws.wait_state("low", "Pending")
    assert blocked_on(low["message"], "cpu")
    assert not aws.exists("apps/v1", "Deployment", "low")


def test_a_smaller_later_appwrapper_passes_a_blocked_one_unless_strict_fifo(
        mode: str, controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("blocker", deployment_item("blocker", 1, f"{free * 60 // 100}m")))
    aws.wait_state("blocker", "Running")
    aws.create(appwrapper("big", deployment_item("big", 1, f"{free * 60 // 100}m")))
    aws.wait_state("big", "Pending")
    aws.create(appwrapper("small", deployment_item("small", 1, f"{free * 20 // 100}m")))
    if mode == BEST_EFFORT:
        aws.wait_state("small", "Running")
        assert aws.status("big")["state"] == "Pending"
    else:
        small = aws.wait_state("small", "Pending")
        assert small["message"].startswith("waiting behind earlier AppWrappers (strict FIFO)")
        assert not aws.exists("apps/v1", "Deployment", "small")

    aws.delete("blocker")
    aws.wait_state("big", "Running")
    aws.wait_state("small", "Running")


@strict_fifo_only
def test_an_appwrapper_that_cannot_fit_the_empty_cluster_does_not_hold_the_queue(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    aws.create(appwrapper("huge", deployment_item("huge", 1, "100000")))  # 100,000 cpu: more than every node
    huge = aws.wait_state("huge", "Pending")
    assert "cannot fit even the empty cluster, so it does not hold the queue (strict FIFO)" in huge["message"]
    aws.create(appwrapper("after", deployment_item("after", 1, "10m")))
    aws.wait_state("after", "Running")


@strict_fifo_only
def test_deleting_a_blocked_head_dispatches_what_waited_behind_it(controller: Controller, aws: AppWrappers,
                                                                   core: k8s.CoreV1Api) -> None:
    # Created within the same second, AppWrappers of equal priority go by name: "a-head" first.
    free = free_cpu_millis(core)
    aws.create(appwrapper("filler", deployment_item("filler", 1, f"{free * 7 // 10}m")))
    aws.wait_state("filler", "Running")
    aws.create(appwrapper("a-head", deployment_item("a-head", 1, f"{free * 5 // 10}m")))  # fits once filler goes
    aws.wait_state("a-head", "Pending")
    aws.create(appwrapper("b-behind", deployment_item("b-behind", 1, f"{free * 2 // 10}m")))  # fits now, held
    assert aws.wait_state("b-behind", "Pending")["message"].startswith("waiting behind earlier AppWrappers")
    aws.delete("a-head")  # no other change follows: the deletion alone must bring a dispatch cycle
    aws.wait_state("b-behind", "Running", timeout=15)
