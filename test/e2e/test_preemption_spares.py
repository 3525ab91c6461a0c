"""Priority preemption that does not thrash, end to end (``--preemption`` with the default cooldown, 10m): a victim
younger than its ``mcad.codeflare.dev/min-runtime`` is spared and an older one goes instead, told why; once that
one runs again it is spared for the cooldown, so the next preemptor evicts nobody and says whom it spares. A
minimum run time above the ceiling (1h) is refused at admission, asked by a tenant with its own token."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.api.minruntime import MIN_RUNTIME
from mcad.k8s import kube
from test.e2e.conftest import AppWrappers, Controller, appwrapper, condition, deployment_item, free_cpu_millis, job_item
from test.e2e.test_admission import account, kubectl, token_kubeconfig
from test.e2e.test_preemption import preemptions_logged
from test.escalations import APPWRAPPER_RIGHTS
from test.support import wait_until

CONTROLLER_ARGS = ("--preemption",)


def with_min_runtime(body: dict[str, Any], value: str) -> dict[str, Any]:
    body.setdefault("metadata", {})["annotations"] = {MIN_RUNTIME: value}
    return body


def test_a_young_victim_is_spared_and_one_preempted_before_is_spared_for_the_cooldown(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    half = free_cpu_millis(core) // 2
    aws.create(appwrapper("old", deployment_item("old", 1, f"{half}m"), priority=1))
    aws.wait_state("old", "Running")
    aws.wait_pods("old", 1)
    aws.create(with_min_runtime(appwrapper("young", deployment_item("young", 1, f"{half}m"), priority=1), "1h"))
    aws.wait_state("young", "Running")
    aws.wait_pods("young", 1)
    before = preemptions_logged(controller)

    # young has run the least (it would go), but not its hour: old goes instead, told by whom and why.
    aws.create(appwrapper("high-1", job_item("high-1", 1, f"{half}m", duration="1s", completionstatus="Complete"),
                          priority=10))
    preempted = condition(aws.wait_state("old", "Pending"), "PreemptCandidate")
    assert preempted is not None and preempted["reason"] == "PreemptedByHigherPriority"
    assert preempted["message"].startswith(
        f"Preempted by AppWrapper {aws.namespace}/high-1 (priority 10); chosen for the least work lost: 1 "
        f"AppWrapper(s), "), preempted
    assert aws.status("young")["state"] == "Running"
    aws.wait_state("high-1", "Completed", timeout=60)
    aws.wait_state("old", "Running", timeout=60)  # it comes back once high-1 is done
    aws.wait_pods("old", 1)

    # old was preempted and runs again: spared for 10 minutes; young still has most of its hour. Nobody goes.
    aws.create(appwrapper("high-2", job_item("high-2", 1, f"{half}m", duration="1s", completionstatus="Complete"),
                          priority=10))

    def told_it_spares() -> str | None:
        message = str(aws.status("high-2").get("message", ""))
        return message if "it evicts nobody for now" in message else None

    message = wait_until(told_it_spares, 30, "high-2 to say whom it spares")
    assert "spares 1 AppWrapper(s) that ran less than their minimum run time" in message or \
        "preempted before and dispatched again less than the preemption cooldown ago" in message, message
    assert aws.status("old")["state"] == "Running" and aws.status("young")["state"] == "Running"
    assert aws.status("high-2")["state"] == "Pending"
    assert preemptions_logged(controller) == before + 1, "one preemption, for high-1 only"
    aws.delete("high-2")


def test_a_minimum_run_time_above_the_ceiling_is_refused_at_admission(controller: Controller, aws: AppWrappers,
                                                                        kubeconfig: str, tmp_path: Path) -> None:
    """Asked by a tenant, with its own token: it holds rights on AppWrappers in its namespace (and to create the
    Deployments they wrap), nothing that could lift the ceiling."""
    admin = kube.connect(kubeconfig)
    account(admin, aws.namespace, "alice", [*APPWRAPPER_RIGHTS, {"apiGroups": ["apps"], "resources": ["deployments"],
                                                                 "verbs": ["create"]}])
    alice = token_kubeconfig(kubeconfig, admin, aws.namespace, "alice", tmp_path / "alice")
    wait_until(lambda: kubectl(alice, "auth", None, "can-i", "create", "deployments.apps").stdout.strip() == "yes",
               30, "alice's Role to count")

    def create(name: str, min_runtime: str) -> subprocess.CompletedProcess[str]:
        body = with_min_runtime(appwrapper(name, deployment_item(name, 1, "10m"), priority=1), min_runtime)
        body["metadata"]["namespace"] = aws.namespace
        return kubectl(alice, "create", body)

    refused = create("greedy", "2h")
    assert refused.returncode != 0
    assert "mcad.codeflare.dev/min-runtime: '2h' exceeds the cluster's ceiling of 1h" in refused.stderr, refused.stderr
    with pytest.raises(k8s.ApiException, match="Not Found"):
        aws.get("greedy")
    fine = create("fine", "1h")
    assert fine.returncode == 0, fine.stderr
    assert aws.get("fine")["metadata"]["annotations"][MIN_RUNTIME] == "1h"
