"""Priority preemption (``--preemption``), end to end: who is evicted, what they are told, and no loops."""

from __future__ import annotations

from typing import Any

import kubernetes.client as k8s

from test.e2e.conftest import (
    AppWrappers,
    Controller,
    appwrapper,
    condition,
    conditions_of,
    deployment_item,
    free_cpu_millis,
    job_item,
)
from test.support import wait_until

# No cooldown: these tests preempt the same AppWrappers round after round (test_preemption_spares.py runs with it).
CONTROLLER_ARGS = ("--preemption", "--preemption-cooldown=0s")


def preemptions_logged(controller: Controller) -> int:
    return sum(1 for line in controller.log.read_text(errors="replace").splitlines() if " preempting " in line)


def prioritised(name: str, priority: int, *items: dict[str, Any]) -> dict[str, Any]:
    return appwrapper(name, *items, priority=priority)


def test_evicts_the_lowest_priority_losing_the_least_work(controller: Controller, aws: AppWrappers,
                                                          core: k8s.CoreV1Api) -> None:
    quarter = free_cpu_millis(core) // 4
    for name, priority in (("a", 1), ("b", 1), ("c", 2), ("d", 1)):
        aws.create(prioritised(name, priority, deployment_item(name, 1, f"{quarter}m")))
        aws.wait_state(name, "Running")
        aws.wait_pods(name, 1)
    before = preemptions_logged(controller)

    aws.create(prioritised("high", 10, deployment_item("high", 1, f"{2 * quarter}m")))
    aws.wait_state("high", "Running", timeout=60)
    aws.wait_pods("high", 1)
    for victim in ("b", "d"):  # priority 1, the two that ran least (of equal demand: the least work lost)
        status = aws.wait_state(victim, "Pending")
        preempted = condition(status, "PreemptCandidate")
        assert preempted["reason"] == "PreemptedByHigherPriority"
        assert preempted["message"].startswith(f"Preempted by AppWrapper {aws.namespace}/high (priority 10); chosen "
                                               f"for the least work lost: 2 AppWrapper(s), "), preempted
        assert not aws.exists("apps/v1", "Deployment", victim)
    for kept in ("a", "c"):
        status = aws.status(kept)
        assert status["state"] == "Running" and condition(status, "PreemptCandidate") is None, kept
    assert preemptions_logged(controller) == before + 1, "one decision, two victims"


def test_two_priorities_competing_for_a_full_cluster_do_not_loop(controller: Controller, aws: AppWrappers,
                                                                 core: k8s.CoreV1Api) -> None:
    half = free_cpu_millis(core) // 2
    for name in ("low-1", "low-2"):
        aws.create(prioritised(name, 1, deployment_item(name, 1, f"{half}m")))
        aws.wait_state(name, "Running")
    before = preemptions_logged(controller)
    rounds = 4
    for round_ in range(rounds):
        name = f"high-{round_}"
        aws.create(prioritised(name, 10, job_item(name, 1, f"{half}m", duration="1s", completionstatus="Complete")))
        aws.wait_state(name, "Completed", timeout=60)
        for low in ("low-1", "low-2"):  # the victim comes back once the high one is done
            aws.wait_state(low, "Running", timeout=60)
    assert preemptions_logged(controller) == before + rounds, "one preemption per high arrival, none back"
    for round_ in range(rounds):
        assert condition(aws.status(f"high-{round_}"), "PreemptCandidate") is None


def test_never_preempts_for_an_appwrapper_larger_than_the_cluster(controller: Controller, aws: AppWrappers,
                                                                  core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(prioritised("low", 1, deployment_item("low", 1, f"{free // 2}m")))
    aws.wait_state("low", "Running")
    before = preemptions_logged(controller)
    aws.create(prioritised("huge", 10, deployment_item("huge", 1, f"{free * 3}m")))
    status = aws.wait_state("huge", "Pending")
    assert "on no node" in status["message"]
    # Evidence that the decision was taken after huge arrived: a later, smaller AppWrapper is dispatched.
    aws.create(prioritised("small", 1, deployment_item("small", 1, "100m")))
    aws.wait_state("small", "Running")
    assert aws.status("low")["state"] == "Running"
    assert preemptions_logged(controller) == before


def test_a_victim_keeps_its_requeue_in_the_log_while_it_waits_again(controller: Controller, aws: AppWrappers,
                                                                    core: k8s.CoreV1Api) -> None:
    """Upstream keeps one condition entry per reason of a type: the victim's PreemptionTriggered Backoff stays in
    its status after the AppWrapperNotRunnable. Backoff it gets while the preemptor holds the room."""
    most = free_cpu_millis(core) * 3 // 4
    aws.create(prioritised("victim", 1, deployment_item("victim", 1, f"{most}m")))
    aws.wait_state("victim", "Running")
    aws.create(prioritised("preemptor", 10, deployment_item("preemptor", 1, f"{most}m")))
    aws.wait_state("preemptor", "Running", timeout=60)

    def waits_again() -> dict[str, Any] | None:
        status = aws.status("victim")
        backoff = condition(status, "Backoff") or {}
        return status if backoff.get("reason") == "AppWrapperNotRunnable." else None

    status = wait_until(waits_again, 60, "the victim's later Backoff")
    assert status["state"] == "Pending"
    backoffs = conditions_of(status, "Backoff")
    assert [c["reason"] for c in backoffs] == ["PreemptionTriggered", "AppWrapperNotRunnable."], backoffs
    assert backoffs[0]["message"].startswith(f"Preempted by AppWrapper {aws.namespace}/preemptor (priority 10); ")
    assert backoffs[0]["lastTransitionMicroTime"] < backoffs[1]["lastTransitionMicroTime"]
    assert condition(status, "PreemptCandidate")["reason"] == "PreemptedByHigherPriority"  # type: ignore[index]
    assert len(status["conditions"]) == len({(c["type"], c.get("reason")) for c in status["conditions"]})
