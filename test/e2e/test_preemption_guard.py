"""Preemption only for work that would then run, end to end with ``--preemption``: a tenant
holding only AppWrapper rights (and the right to create what they wrap) submits, at its namespace's priority
ceiling, an AppWrapper that could never run as it is; lower-priority work of three namespaces keeps running and the
preemptor's status says why it evicts nobody. The victim timeout is short (5 s) so a controller that evicts
anyway (within 130 ms, and again at every victim timeout) would show it within the window the test watches.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import events, kube
from test.e2e import quota
from test.e2e.conftest import AppWrappers, Controller, condition
from test.e2e.quota import QuotaTrees, node, subtree, waits_saying
from test.e2e.test_admission import APPWRAPPER_RIGHTS, account, kubectl, token_kubeconfig
from test.support import wait_until

VICTIM_TIMEOUT = 5
CONTROLLER_ARGS = ("--preemption", "--preemption-victim-timeout", str(VICTIM_TIMEOUT))
CEILING = 1000  # the controller's --default-max-priority: the highest priority a tenant may give


controller = quota.controller_fixture("test_preemption_guard", *CONTROLLER_ARGS)
on_node = quota.node_fixture("2")
trees = quota.trees


@pytest.fixture
def victims(core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, kubeconfig: str,
            aws: AppWrappers) -> Iterator[list[AppWrappers]]:
    """The test's namespace and two more: lower-priority work runs in each."""
    with quota.other_namespace(core, custom, kubeconfig) as second, \
            quota.other_namespace(core, custom, kubeconfig) as third:
        yield [aws, second, third]


@pytest.fixture
def tenant(kubeconfig: str, aws: AppWrappers, tmp_path: Path) -> str:
    """A kubeconfig of carol: AppWrappers in the test's namespace, and creating the Deployments they wrap."""
    admin = kube.connect(kubeconfig)
    account(admin, aws.namespace, "carol",
            [*APPWRAPPER_RIGHTS, {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}])
    path = token_kubeconfig(kubeconfig, admin, aws.namespace, "carol", tmp_path / "carol")
    wait_until(lambda: kubectl(path, "auth", None, "can-i", "create", "deployments.apps").stdout.strip() == "yes",
               30, "carol's Role to count")
    return path


def submit(tenant: str, aws: AppWrappers, body: dict[str, Any]) -> None:
    body["metadata"]["namespace"] = aws.namespace
    proc = kubectl(tenant, "create", body)
    assert proc.returncode == 0, proc.stderr


def preemptions_logged(controller: Controller) -> int:
    return sum(1 for line in controller.log.read_text(errors="replace").splitlines() if " preempting " in line)



def assert_untouched(core: k8s.CoreV1Api, running: list[tuple[AppWrappers, str]]) -> None:
    """Each still Running, never a preemption candidate, no Preempted Event about it."""
    for where, name in running:
        status = where.status(name)
        assert status["state"] == "Running" and condition(status, "PreemptCandidate") is None, (name, status)
        told = core.list_namespaced_event(where.namespace, field_selector=f"involvedObject.name={name}").items
        assert not [e.message for e in told if e.reason == events.PREEMPTED], (name, [e.message for e in told])


def nudge(aws: AppWrappers, on_node: dict[str, str], name: str) -> None:
    """Evidence that a later dispatch cycle ran: a small AppWrapper is dispatched."""
    aws.create(quota.aw(name, {}, on_node, "50m"))
    aws.wait_state(name, "Running")


def _evictions_metric(controller: Controller) -> float:
    """The controller's count of AppWrappers it evicted for a higher priority."""
    code, text = controller.get("/metrics")
    assert code == 200, (code, text)
    return quota.sample(text, "mcad_dispatch_decisions_total", decision="preempted") or 0.0


def _seconds_pending(aws: AppWrappers, name: str) -> float:
    """Seconds since ``name``'s Backoff was written, by the API server's clock (the condition's time)."""
    backoff = condition(aws.status(name), "Backoff") or {}
    stamp = backoff.get("lastTransitionMicroTime") or backoff.get("lastUpdateMicroTime")
    if not stamp:
        return 0.0
    return (datetime.now(UTC) - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()


def test_a_preemptor_labelled_with_an_unknown_quota_node_evicts_nobody(
        controller: Controller, core: k8s.CoreV1Api, on_node: dict[str, str], trees: QuotaTrees,
        victims: list[AppWrappers], tenant: str) -> None:
    aws = victims[0]
    tree = f"guard_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="4")))  # the namespace is bound to no tree
    quota.wait_tree(controller, tree, 1)
    running = []
    for i, where in enumerate(victims):
        where.create(quota.aw(f"low-{i}", {}, on_node, "500m", priority=0))
        running.append((where, f"low-{i}"))
    for where, name in running:
        where.wait_state(name, "Running")
    before = preemptions_logged(controller)

    # 1500m of the node's 2 cpu are taken: 1200m fits only if the low ones go. Its label names no node of the tree.
    submit(tenant, aws, quota.aw("lost", {tree: "no-such-node"}, on_node, "1200m", priority=CEILING))
    status = waits_saying(aws, "lost", "it evicts nobody: its quota labels name a quota node that does not exist")
    assert f"quota tree {tree} has no node 'no-such-node'" in status["message"], status["message"]
    assert status["systempriority"] == CEILING
    assert_untouched(core, running)
    # The old code evicted in the very cycle that now writes this message, then a new round at each victim
    # timeout: a later cycle, past one, finds everyone still running.
    evicted_before = _evictions_metric(controller)
    nudge(aws, on_node, "nudge")
    wait_until(lambda: _seconds_pending(aws, "lost") > VICTIM_TIMEOUT + 1, VICTIM_TIMEOUT * 6,
               "a victim timeout to pass")
    nudge(aws, on_node, "nudge-later")
    assert_untouched(core, running)
    assert preemptions_logged(controller) == before
    assert _evictions_metric(controller) == evicted_before
    assert aws.status("lost")["state"] == "Pending"


def test_a_preemptor_that_would_not_fit_once_its_victims_go_evicts_nobody(
        controller: Controller, core: k8s.CoreV1Api, on_node: dict[str, str], trees: QuotaTrees,
        victims: list[AppWrappers], tenant: str) -> None:
    aws = victims[0]
    tree = f"hard_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="4")),
                 subtree("teams", tree, node("small", hard=True, cpu="1"), parent="root"))
    quota.wait_tree(controller, tree, 2)
    aws.create(quota.aw("peer", {}, on_node, "1000m", priority=CEILING))  # its equal: never a victim
    victims[1].create(quota.aw("low", {}, on_node, "500m", priority=0))
    running = [(aws, "peer"), (victims[1], "low")]
    for where, name in running:
        where.wait_state(name, "Running")
    before = preemptions_logged(controller)

    # With low gone 1000m would be free: too little for 1500m.
    submit(tenant, aws, quota.aw("too-big-now", {}, on_node, "1500m", priority=CEILING))
    waits_saying(aws, "too-big-now",
                 "it evicts nobody: it would not fit even with every lower-priority AppWrapper gone")
    # More than the node it is pinned to has.
    submit(tenant, aws, quota.aw("too-big-ever", {}, on_node, "3", priority=CEILING))
    waits_saying(aws, "too-big-ever", "it evicts nobody: it would not fit even the empty cluster")
    # More than its hard quota node allows at all (the cluster would have room once low goes).
    submit(tenant, aws, quota.aw("over-quota", {tree: "small"}, on_node, "1200m", priority=CEILING))
    waits_saying(aws, "over-quota", f"it evicts nobody: it asks more than quota node small of tree {tree} allows")
    assert_untouched(core, running)
    assert preemptions_logged(controller) == before
