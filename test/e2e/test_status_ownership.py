"""Status belongs to the controller, through the real webhooks and a real API server.

The attack: a tenant holding ``appwrappers/status`` patch (aggregated edit roles often grant it) sets its Running
AppWrapper's state to Completed; were its quota charge released, 2 cpu would run in a 1-cpu hard quota node, and that
would survive a controller restart. Here carol holds her AppWrapper rights plus ``appwrappers/status`` update and patch:
her status patch is refused at admission, and her patch of the main resource cannot reach status (the CRD's status
subresource). The same forged state written past admission (as the controller's own identity, which the webhook lets
through: what a bypassed or absent webhook amounts to) releases nothing while the AppWrapper's pod runs: a second
AppWrapper that would exceed the hard quota node stays queued, before and after a controller restart, and runs once the
first is deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test.e2e import quota
from test.e2e.conftest import AppWrappers, Controller
from test.e2e.quota import QuotaTrees, node, subtree
from test.e2e.test_admission import APPWRAPPER_RIGHTS, account, kubectl, token_kubeconfig
from test.support import wait_until

STATUS_RIGHTS = [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers/status"],
                  "verbs": ["get", "update", "patch"]}]
REFUSED = ('may not write the status of AppWrappers: only the mcad controller does (status records what it '
           'decided: the state, when it dispatched, how often it requeued)')


controller = quota.controller_fixture("test_status_ownership")
on_node = quota.node_fixture("4")
trees = quota.trees


@pytest.fixture
def carol(kubeconfig: str, aws: AppWrappers, controller: Controller, tmp_path: Path) -> str:
    """A tenant's kubeconfig: AppWrapper rights and appwrappers/status update and patch, nothing else."""
    admin = kube.connect(kubeconfig)
    account(admin, aws.namespace, "carol", APPWRAPPER_RIGHTS + STATUS_RIGHTS)
    path = token_kubeconfig(kubeconfig, admin, aws.namespace, "carol", tmp_path / "carol")
    wait_until(lambda: kubectl(path, "auth", None, "can-i", "patch", "appwrappers", "--subresource=status")
               .stdout.strip() == "yes", 30, "carol's Role to count")
    return path


def status_not_decided_events(core: k8s.CoreV1Api, namespace: str, name: str) -> list[Any]:
    return [e for e in core.list_namespaced_event(namespace).items
            if e.reason == "StatusNotDecided" and e.involved_object.name == name]


def test_a_tenant_cannot_write_status_and_a_forged_final_state_keeps_its_charge_across_a_restart(
        controller: Controller, controller_kubeconfig: str, core: k8s.CoreV1Api, on_node: dict[str, str],
        trees: QuotaTrees, aws: AppWrappers, carol: str) -> None:
    tree = f"status_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="2")),
                 subtree("teams", tree, node("team", hard=True, cpu="1"), parent="root"))
    quota.wait_tree(controller, tree, 2)
    aws.create(quota.aw("first", {tree: "team"}, on_node, "600m"))
    aws.wait_state("first", "Running")
    aws.wait_pods("first", 1)

    # The tenant's own status write: refused by the webhook, whatever RBAC grants.
    proc = kubectl(carol, "patch", None, "appwrapper", "first", "--subresource=status", "--type=merge",
                   "-p", '{"status": {"state": "Completed"}}')
    assert proc.returncode != 0
    assert f'user "system:serviceaccount:{aws.namespace}:carol" {REFUSED}' in proc.stderr, proc.stderr
    # Through the main resource, status is not hers to change either: the API server drops it (status subresource).
    proc = kubectl(carol, "patch", None, "appwrapper", "first", "--type=merge",
                   "-p", '{"status": {"state": "Completed"}}')
    assert proc.returncode == 0, proc.stderr
    assert aws.status("first")["state"] == "Running"

    # Past admission (the identity the webhook lets through; a webhook bypassed or down is the same): the forged
    # state lands, and the controller says it did not decide it.
    as_controller = kube.connect(controller_kubeconfig)
    kube.request_json(as_controller, "PATCH",
                      f"/apis/workload.codeflare.dev/v1beta1/namespaces/{aws.namespace}/appwrappers/first/status",
                      body={"status": {"state": "Completed"}}, content_type="application/merge-patch+json")
    wait_until(lambda: status_not_decided_events(core, aws.namespace, "first"), 30,
               "a StatusNotDecided Event on first")
    [event] = status_not_decided_events(core, aws.namespace, "first")
    assert event.type == "Warning" and event.message.startswith(
        "status.state Completed was not decided by mcad while 1 of its pods still run"), event.message

    # 600m is still charged at team's hard 1 cpu: 600m more does not fit.
    aws.create(quota.aw("second", {tree: "team"}, on_node, "600m"))
    blocked_on_team(aws, tree)
    team = quota.node_doc(controller, tree, "team")
    assert team is not None and team["used"].get("cpu") == "600m", team

    controller.stop()
    controller.start()
    # After the restart the controller remembers nothing it decided: the running pod is what keeps the charge.
    wait_until(lambda: (doc := quota.node_doc(controller, tree, "team")) and doc["used"].get("cpu") == "600m", 30,
               "the restarted controller to charge first's 600m at team")
    assert aws.status("first")["state"] == "Completed"
    blocked_on_team(aws, tree)
    assert not aws.pods("second"), "second must not run past team's hard 1 cpu"

    # The charge was first's: deleting it lets second run.
    aws.delete("first")
    aws.wait_state("second", "Running", timeout=90)


def blocked_on_team(aws: AppWrappers, tree: str) -> None:
    try:
        wait_until(lambda: (s := aws.status("second")).get("state") == "Pending"
                   and f"node team of tree {tree}" in (s.get("message") or ""), 30,
                   "second to wait on quota node team")
    except AssertionError as err:
        raise AssertionError(f"{err}; its status: {aws.status('second')!r}") from None
