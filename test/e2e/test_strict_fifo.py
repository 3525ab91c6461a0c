"""--strict-fifo: an AppWrapper that does not fit blocks every one behind it, and says so."""

from __future__ import annotations

import kubernetes.client as k8s

from test.e2e.conftest import AppWrappers, Controller, appwrapper, deployment_item, free_cpu_millis

CONTROLLER_ARGS = ("--strict-fifo",)


def test_a_blocked_appwrapper_holds_back_smaller_later_ones(controller: Controller, aws: AppWrappers,
                                                            core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("blocker", deployment_item("blocker", 1, f"{free * 60 // 100}m")))
    aws.wait_state("blocker", "Running")
    aws.create(appwrapper("big", deployment_item("big", 1, f"{free * 60 // 100}m")))
    aws.wait_state("big", "Pending")
    aws.create(appwrapper("small", deployment_item("small", 1, f"{free * 20 // 100}m")))
    small = aws.wait_state("small", "Pending")
    assert small["message"].startswith("waiting behind earlier AppWrappers (strict FIFO)")
    assert not aws.exists("apps/v1", "Deployment", "small")

    aws.delete("blocker")
    aws.wait_state("big", "Running")
    aws.wait_state("small", "Running")


def test_an_appwrapper_that_cannot_fit_the_empty_cluster_does_not_hold_the_queue(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    aws.create(appwrapper("huge", deployment_item("huge", 1, "100000")))  # 100,000 cpu: more than every node
    huge = aws.wait_state("huge", "Pending")
    assert "cannot fit even the empty cluster, so it does not hold the queue (strict FIFO)" in huge["message"]
    aws.create(appwrapper("after", deployment_item("after", 1, "10m")))
    aws.wait_state("after", "Running")


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
