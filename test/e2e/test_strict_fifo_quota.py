"""Strict FIFO per quota node, end to end with ``--strict-fifo``: tenant A's AppWrapper blocked
by A's own quota node holds back the later AppWrappers of A's node, not tenant B's, which runs at once; order within
A's node stays strict. Both tenants hold only AppWrapper rights (and the right to create what they wrap); the
admin binds each namespace to its node of a tree. (test_ordering shows a head waiting for the cluster's room still
holds everything.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from mcad.model.fifo import BEHIND_IN_DOMAIN
from test.e2e import quota
from test.e2e.conftest import AppWrappers, Controller
from test.e2e.quota import QuotaTrees, node, subtree, waits_saying
from test.e2e.test_admission import APPWRAPPER_RIGHTS, account, kubectl, token_kubeconfig
from test.support import wait_until

CONTROLLER_ARGS = ("--strict-fifo",)
BINDING = "quota.codeflare.dev/"


controller = quota.controller_fixture("test_strict_fifo_quota", *CONTROLLER_ARGS)
on_node = quota.node_fixture("4")
trees = quota.trees


@pytest.fixture
def team_b(core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, kubeconfig: str) -> Iterator[AppWrappers]:
    with quota.other_namespace(core, custom, kubeconfig) as found:
        yield found


def tenant(kubeconfig: str, namespace: str, name: str, tmp: Path) -> str:
    """A kubeconfig of ``name``: AppWrappers in ``namespace``, and creating the Deployments they wrap."""
    admin = kube.connect(kubeconfig)
    account(admin, namespace, name,
            [*APPWRAPPER_RIGHTS, {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}])
    path = token_kubeconfig(kubeconfig, admin, namespace, name, tmp / name)
    wait_until(lambda: kubectl(path, "auth", None, "can-i", "create", "deployments.apps").stdout.strip() == "yes",
               30, f"{name}'s Role to count")
    return path


def submit(kubeconfig: str, aws: AppWrappers, body: dict[str, Any]) -> None:
    body["metadata"]["namespace"] = aws.namespace
    proc = kubectl(kubeconfig, "create", body)
    assert proc.returncode == 0, proc.stderr



def test_a_tenant_over_its_own_quota_holds_only_its_own_node(
        controller: Controller, core: k8s.CoreV1Api, on_node: dict[str, str], trees: QuotaTrees,
        aws: AppWrappers, team_b: AppWrappers, tmp_path: Path, kubeconfig: str) -> None:
    tree = f"fifo_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="4")),
                 subtree("teams", tree, node("team-a", hard=True, cpu="1"), node("team-b", hard=True, cpu="2"),
                         parent="root"))
    core.patch_namespace(aws.namespace, {"metadata": {"labels": {BINDING + tree: "team-a"}}})
    core.patch_namespace(team_b.namespace, {"metadata": {"labels": {BINDING + tree: "team-b"}}})
    quota.wait_tree(controller, tree, 3)
    alice = tenant(kubeconfig, aws.namespace, "alice", tmp_path)
    bob = tenant(kubeconfig, team_b.namespace, "bob", tmp_path)

    submit(alice, aws, quota.aw("a-first", {}, on_node, "600m"))
    aws.wait_state("a-first", "Running")
    submit(alice, aws, quota.aw("a-blocked", {}, on_node, "800m"))  # 1400m > team-a's 1 cpu
    waits_saying(aws, "a-blocked", f"node team-a of tree {tree} is full")
    # Would fit team-a (900m) and the node, but a-blocked is ahead of it in team-a: strict order there.
    submit(alice, aws, quota.aw("a-later", {}, on_node, "300m"))
    # Tenant B's work, room being free in the node and in team-b, runs at once: A's head does not hold it.
    submit(bob, team_b, quota.aw("b-job", {}, on_node, "500m"))
    try:
        team_b.wait_state("b-job", "Running", timeout=30)
    except AssertionError as err:
        raise AssertionError(f"{err}; its status: {team_b.status('b-job')!r}") from None
    waits_saying(aws, "a-later", BEHIND_IN_DOMAIN)

    # A's head goes first once team-a has room; a-later then waits on team-a's quota itself (800m + 300m > 1 cpu).
    aws.delete("a-first")
    aws.wait_state("a-blocked", "Running")
    waits_saying(aws, "a-later", f"node team-a of tree {tree} is full")
