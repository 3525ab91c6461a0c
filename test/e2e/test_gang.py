"""The gang guarantee under contention: never more dispatched than fits, nobody starved, FIFO among equals."""

from __future__ import annotations

from typing import Any

import kubernetes.client as k8s

from test.e2e.conftest import AppWrappers, Controller, appwrapper, deployment_item, free_cpu_millis
from test.support import wait_until

GANGS = 20


def unschedulable(pods: list[Any]) -> list[str]:
    """Pods the scheduler refused; a pod held by a scheduling gate (mcad's, until it is pinned) is not one."""
    return [p.metadata.name for p in pods for c in (p.status.conditions or [])
            if c.type == "PodScheduled" and c.status == "False" and c.reason != "SchedulingGated"]


def test_twenty_gangs_of_a_third_each_never_overcommit_and_all_run(controller: Controller, aws: AppWrappers,
                                                                   core: k8s.CoreV1Api) -> None:
    third = free_cpu_millis(core) // 3
    names = [f"gang-{i:02d}" for i in range(GANGS)]
    for name in names:
        aws.create(appwrapper(name, deployment_item(name, 1, f"{third}m")))

    ran: list[str] = []
    dispatched_at: dict[str, str] = {}
    while len(ran) < GANGS:
        def newly_running() -> list[str] | None:
            running = [n for n in names if n not in ran and aws.status(n).get("state") == "Running"]
            return running or None

        running = sorted(wait_until(newly_running, 60, f"the next gangs to run (ran so far: {len(ran)})"))
        # At most three thirds fit; the pods of everything dispatched fit too, so none is left unschedulable.
        dispatched = [n for n in names if n not in ran and aws.status(n).get("state") == "Running"]
        assert len(dispatched) <= 3, dispatched
        pods = aws.core.list_namespaced_pod(aws.namespace).items
        assert not unschedulable(pods), unschedulable(pods)
        for name in running:
            dispatched_at[name] = aws.status(name)["controllerfirstdispatchtimestamp"]
            aws.wait_pods(name, 1)
            aws.delete(name)
        ran.extend(running)
    # Statuses of gangs dispatched in one cycle land concurrently; the decision time is stamped in each.
    assert sorted(names, key=lambda n: dispatched_at[n]) == names, "equal gangs run in creation (then name) order"
