"""Fair sharing on the local cluster, the controller started with ``--fair-sharing``: two namespaces of one priority
share a 2-cpu node. team-a queues four hour-long 1-cpu AppWrappers and two run; team-b then queues two. The
controller is stopped and started again (as a rollout or a change of leader would): the usage it saved in its
ConfigMap comes back, and when team-a's running ones end, team-b's two go next though team-a's were queued first.

Who writes what: the ConfigMap is in the controller's own namespace, where tenants have no rights (the test grants
the controller what the chart's Role grants there); the tenants only create AppWrappers in their namespaces.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test.e2e.conftest import LOGS, AppWrappers, appwrapper, fake_node, job_item, pinned, running_controller
from test.support import wait_until

CONFIGMAP = "mcad-fair-share"
NAMESPACE = "mcad-system"  # the controller's own (no $POD_NAMESPACE, not in a pod): its webhook certificate's too


@pytest.fixture
def fair_share_rights(api: k8s.ApiClient, core: k8s.CoreV1Api) -> Iterator[str]:
    """What the chart grants with scheduling.fairSharing, given here to the session's controller (its own namespace,
    mcad-system): create of ConfigMaps and get/patch of the one it saves usage in. Removed afterwards, with it."""
    rbac = k8s.RbacAuthorizationV1Api(api)
    role = {"metadata": {"name": "mcad-test-fair-share"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIGMAP], "verbs": ["get", "patch"]}]}
    binding = {"metadata": {"name": "mcad-test-fair-share"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mcad-test-fair-share"},
               "subjects": [{"kind": "ServiceAccount", "name": "mcad", "namespace": NAMESPACE}]}
    rbac.create_namespaced_role(NAMESPACE, role)
    rbac.create_namespaced_role_binding(NAMESPACE, binding)
    try:
        yield NAMESPACE
    finally:
        rbac.delete_namespaced_role_binding("mcad-test-fair-share", NAMESPACE)
        rbac.delete_namespaced_role("mcad-test-fair-share", NAMESPACE)
        try:
            core.delete_namespaced_config_map(CONFIGMAP, NAMESPACE)
        except k8s.ApiException as err:
            if err.status != 404:
                raise


def job(name: str, node: dict[str, str]) -> dict[str, Any]:
    return pinned(job_item(name, 1, "1", duration="1h"), node)


def test_the_tenant_that_used_less_goes_first_and_usage_outlives_a_restart(
        controller_kubeconfig: str, aws: AppWrappers, other_namespace: str, fair_share_rights: str,
        core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, kubeconfig: str) -> None:
    team_b = AppWrappers(custom, core, other_namespace, kube.connect(kubeconfig))
    log = LOGS / "test_fair_sharing.log"
    with fake_node(core, cpu="2", memory="8Gi") as node:
        with running_controller(controller_kubeconfig, log, "--fair-sharing"):
            for i in range(4):
                aws.create(appwrapper(f"a{i}", job(f"a{i}", node)))
            aws.wait_state("a0", "Running")
            aws.wait_state("a1", "Running")
            for i in range(2):
                team_b.create(appwrapper(f"b{i}", job(f"b{i}", node)))
            wait_until(lambda: aws.status("a2").get("state") == "Pending"
                       and team_b.status("b0").get("state") == "Pending", 30, "a2 and b0 pending")
        # Stopped: the usage was saved on the way out.
        saved = json.loads(core.read_namespaced_config_map(CONFIGMAP, fair_share_rights).data["usage.json"])
        assert saved["tenants"].get(f"namespace:{aws.namespace}", 0) > 0, saved
        assert f"namespace:{other_namespace}" not in saved["tenants"], "team-b ran nothing"
        with running_controller(controller_kubeconfig, log, "--fair-sharing") as ctl:
            wait_until(lambda: b"fair-share usage restored" in ctl.log.read_bytes(), 30, "the usage read back")
            aws.delete("a0")
            aws.delete("a1")
            team_b.wait_state("b0", "Running")
            team_b.wait_state("b1", "Running")
            assert [aws.status(f"a{i}").get("state") for i in (2, 3)] == ["Pending", "Pending"]
