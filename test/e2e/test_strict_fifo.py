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
