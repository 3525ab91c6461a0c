"""Dispatch order: priority first, then age; best-effort FIFO lets a smaller later AppWrapper pass a blocked one."""

from __future__ import annotations

import kubernetes.client as k8s

from test.e2e.conftest import AppWrappers, Controller, appwrapper, blocked_on, deployment_item, free_cpu_millis


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


def test_best_effort_fifo_lets_a_later_small_appwrapper_pass(controller: Controller, aws: AppWrappers,
                                                             core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("blocker", deployment_item("blocker", 1, f"{free * 60 // 100}m")))
    aws.wait_state("blocker", "Running")
    aws.create(appwrapper("big", deployment_item("big", 1, f"{free * 60 // 100}m")))
    aws.wait_state("big", "Pending")
    aws.create(appwrapper("small", deployment_item("small", 1, f"{free * 20 // 100}m")))
    aws.wait_state("small", "Running")
    assert aws.status("big")["state"] == "Pending"
