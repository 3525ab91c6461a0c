"""The seed tutorial (MCAD's "Tutorial of Multi-Cluster Application Dispatcher Controller"), on a real cluster.

Sizes are scaled to the free cpu measured at the start, as the tutorial itself asks the reader to do.
"""

from __future__ import annotations

import kubernetes.client as k8s

from test.e2e.conftest import AppWrappers, Controller, appwrapper, blocked_on, deployment_item, free_cpu_millis
from test.support import wait_until


def condition_types(status: dict[str, object]) -> list[str]:
    return [c["type"] for c in status.get("conditions") or []]  # type: ignore[union-attr, index]


def test_second_appwrapper_waits_with_no_pods_until_the_first_is_deleted(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    first_cpu, second_cpu = f"{free * 40 // 100}m", f"{free * 15 // 100}m"  # 80% used, then 30% asked
    aws.create(appwrapper("0001-aw-generic-deployment-1", deployment_item("0001-aw-generic-deployment-1", 2,
                                                                          first_cpu, "256Mi")))
    aws.wait_state("0001-aw-generic-deployment-1", "Running")
    aws.wait_pods("0001-aw-generic-deployment-1", 2)

    aws.create(appwrapper("0002-aw-generic-deployment-2",
                          deployment_item("0002-aw-generic-deployment-2", 2, second_cpu, "256Mi"),
                          scheduling={"minAvailable": 2}))
    waiting = aws.wait_state("0002-aw-generic-deployment-2", "Pending")
    assert waiting["canrun"] is False
    assert waiting["queuejobstate"] == "Backoff"
    assert condition_types(waiting) == ["Init", "Queueing", "HeadOfLine", "Backoff"]
    backoff = waiting["conditions"][-1]
    assert backoff["reason"] == "AppWrapperNotRunnable."
    assert backoff["message"].startswith("Insufficient resources to dispatch AppWrapper. ")
    assert blocked_on(backoff["message"], "cpu")
    assert "controllerfirsttimestamp" in waiting
    # The decision is written, so nothing of the second gang may exist: not its Deployment, not a pod.
    assert not aws.exists("apps/v1", "Deployment", "0002-aw-generic-deployment-2")
    assert aws.pods("0002-aw-generic-deployment-2") == []

    aws.delete("0001-aw-generic-deployment-1")
    running = aws.wait_state("0002-aw-generic-deployment-2", "Running")
    assert running["canrun"] is True
    assert condition_types(running)[:5] == ["Init", "Queueing", "HeadOfLine", "Backoff", "Dispatched"]
    aws.wait_pods("0002-aw-generic-deployment-2", 2)


def test_pod_counts_and_running_condition_follow_the_pods(controller: Controller, aws: AppWrappers) -> None:
    aws.create(appwrapper("counted", deployment_item("counted", 3, "10m")))
    aws.wait_pods("counted", 3)

    def three_running() -> dict[str, object] | None:
        status = aws.status("counted")
        return status if status.get("running") == 3 else None

    status = wait_until(three_running, 30, "status.running == 3")
    assert status["queuejobstate"] == "Running"
    assert condition_types(status)[-1] == "Running"
    assert status["pending"] == 0
