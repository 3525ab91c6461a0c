"""Quota and priority a tenant cannot forge, end to end (namespace quota bindings and priority ceilings), with the
controller alone: this module's namespaces are outside the webhooks (``WEBHOOK_RELEASE = None``), so these are the
controller's own defences, what holds when admission is bypassed. test_admission shows the same forgeries refused at
create.

Two tenant namespaces, bound by the admin (namespace labels quota.codeflare.dev/<tree>) to their own node of a
tree; pods pinned to a fake node of known size; --preemption on, as in the issue's report. What a tenant writes on
its AppWrapper (a label naming the other team's node, priority 2147483647) changes nothing beyond what its
namespace allows; what the admin writes on the namespace (a binding, a higher ceiling) does, at once.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test.e2e import quota
from test.e2e.conftest import AppWrappers, Controller, condition, fake_node, running_controller
from test.e2e.quota import QuotaTrees, node, subtree, waits_saying
from test.support import wait_until

CONTROLLER_ARGS = ("--preemption",)
WEBHOOK_RELEASE = None  # what the controller does with what admission would have refused
BINDING = "quota.codeflare.dev/"
CEILING = "mcad.codeflare.dev/max-priority"


@pytest.fixture(scope="module")
def controller(kubeconfig: str, controller_kubeconfig: str, crd: None, quota_crd: None) -> Iterator[Controller]:
    with running_controller(controller_kubeconfig, quota.controller_log("test_tenancy", kubeconfig),
                            *CONTROLLER_ARGS) as ctl:
        yield ctl


@pytest.fixture(scope="module")
def on_node(core: k8s.CoreV1Api) -> Iterator[dict[str, str]]:
    with fake_node(core, cpu="2", memory="16Gi") as selector:
        yield selector


@contextlib.contextmanager
def tenant_namespace(core: k8s.CoreV1Api) -> Iterator[str]:
    """A second tenant's namespace, outside the webhooks like the module's own (``WEBHOOK_RELEASE``)."""
    name = f"mcad-tenant-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mcad.test/owned": "true"}}})
    wait_until(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
               30, f"ServiceAccount default in {name}")
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def team_b(core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, kubeconfig: str) -> Iterator[AppWrappers]:
    """A second tenant, next to the test's own namespace (team A: ``aws``)."""
    with tenant_namespace(core) as name:
        found = AppWrappers(custom, core, name, kube.connect(kubeconfig))
        yield found
        custom.delete_collection_namespaced_custom_object("workload.codeflare.dev", "v1beta1", name, "appwrappers")
        wait_until(lambda: not core.list_namespaced_pod(name).items, 60, f"pods in {name} to go away")


trees = quota.trees


def admin_sets(core: k8s.CoreV1Api, namespace: str, *, labels: dict[str, str] | None = None,
               annotations: dict[str, str] | None = None) -> None:
    """What the cluster admin does: label or annotate a Namespace (tenants cannot: it is cluster-scoped)."""
    core.patch_namespace(namespace, {"metadata": {"labels": labels or {}, "annotations": annotations or {}}})


def runs(aws: AppWrappers, name: str) -> dict[str, Any]:
    try:
        return aws.wait_state(name, "Running")
    except AssertionError as err:
        raise AssertionError(f"{err}; its message: {aws.status(name).get('message')!r}") from None



def test_a_tenant_cannot_charge_another_namespaces_node(
        controller: Controller, core: k8s.CoreV1Api, on_node: dict[str, str], trees: QuotaTrees,
        aws: AppWrappers, team_b: AppWrappers) -> None:
    tree = f"tenants_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="2")),
                 subtree("teams", tree, node("team-a", hard=True, cpu="1"), node("team-b", hard=True, cpu="1"),
                         parent="root"))
    admin_sets(core, aws.namespace, labels={BINDING + tree: "team-a"})
    admin_sets(core, team_b.namespace, labels={BINDING + tree: "team-b"})
    quota.wait_tree(controller, tree, 3)

    # Team A names team B's node: charged at its own all the same.
    aws.create(quota.aw("forged", {tree: "team-b"}, on_node, "600m"))
    runs(aws, "forged")
    wait_until(lambda: (quota.node_doc(controller, tree, "team-a") or {}).get("used", {}).get("cpu") == "600m", 30,
               "team-a to be charged the forged AppWrapper")
    assert quota.node_doc(controller, tree, "team-b")["used"]["cpu"] == "0", "team-b pays nothing for it"
    # So team B's own work, which needs most of its node, runs: were team A charged by its own label, it would
    # wait on what team A used.
    team_b.create(quota.aw("own", {}, on_node, "800m"))
    runs(team_b, "own")
    # An unlabelled AppWrapper in a bound namespace is charged too: team-a has 400m left.
    aws.create(quota.aw("unlabelled", {}, on_node, "600m"))
    waits_saying(aws, "unlabelled", f"node team-a of tree {tree} is full")


def test_a_forged_priority_cannot_evict_another_tenants_work_until_the_admin_grants_more(
        controller: Controller, core: k8s.CoreV1Api, on_node: dict[str, str], aws: AppWrappers,
        team_b: AppWrappers) -> None:
    team_b.create(quota.aw("steady", {}, on_node, "1500m", priority=1000))
    runs(team_b, "steady")
    aws.create(quota.aw("forged", {}, on_node, "1500m", priority=2**31 - 1))
    status = waits_saying(aws, "forged", "cpu")
    assert status["systempriority"] == 1000, "capped at the default ceiling, no higher than team B's work"
    # Looked at again after the preemption check ran (a cycle per event): team B's work is untouched.
    aws.create(quota.aw("nudge", {}, on_node, "1"))
    waits_saying(aws, "nudge", "cpu")
    steady = team_b.status("steady")
    assert steady["state"] == "Running" and condition(steady, "PreemptCandidate") is None, steady
    assert " preempting " not in controller.log.read_text(errors="replace")

    # The admin gives team A a higher ceiling: the same AppWrapper is now worth 5000 and preempts.
    admin_sets(core, aws.namespace, annotations={CEILING: "5000"})
    runs(aws, "forged")
    evicted = team_b.wait_state("steady", "Pending")
    preempted = condition(evicted, "PreemptCandidate")
    # Team B is told the priority it lost to, not whose AppWrapper it was (another namespace: mcad.model.disclosure).
    assert preempted is not None, evicted
    assert "Preempted by an AppWrapper in another namespace (priority 5000)" in preempted["message"], preempted
    assert aws.namespace not in preempted["message"] and "forged" not in preempted["message"], preempted


def test_priority_class_name_sets_the_priority_and_an_unknown_one_waits(
        controller: Controller, api: k8s.ApiClient, on_node: dict[str, str], aws: AppWrappers,
        team_b: AppWrappers) -> None:
    scheduling = k8s.SchedulingV1Api(api)
    name = f"mcad-test-batch-{quota.suffix()}"
    team_b.create(quota.aw("low", {}, on_node, "1500m", priority=10))
    runs(team_b, "low")
    classy = quota.aw("classy", {}, on_node, "1500m")
    classy["spec"]["priorityClassName"] = name
    aws.create(classy)
    waits_saying(aws, "classy", f"spec.priorityClassName '{name}': there is no PriorityClass of that name")
    assert team_b.status("low")["state"] == "Running", "a held AppWrapper preempts nobody"

    scheduling.create_priority_class(k8s.V1PriorityClass(metadata=k8s.V1ObjectMeta(name=name), value=500))
    try:
        status = runs(aws, "classy")
        assert status["systempriority"] == 500
        preempted = condition(team_b.wait_state("low", "Pending"), "PreemptCandidate")
        assert preempted is not None and "(priority 500)" in preempted["message"], preempted
    finally:
        scheduling.delete_priority_class(name)
