"""mcadctl against the installation, through the API server only (the leader's Service proxy), as an operator and as
a tenant would run it: ``queue``, ``explain`` and ``dashboard``.

The operator holds the chart's debug-viewer ClusterRole and debug-client Role; the tenant holds list on AppWrappers
in its own namespace and the debug-client Role: mcadctl shows it its own AppWrapper and not another namespace's.
Someone without the debug-client Role is refused by the API server, and mcadctl says which right is missing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcad.k8s import kube
from test.e2e.conftest import appwrapper, deployment_item
from test.installed.conftest import NAMESPACE, RELEASE, Installation, http_get
from test.support import wait_until

MCADCTL = Path(sys.executable).parent / "mcadctl"
AW = "/apis/workload.codeflare.dev/v1beta1"


def bind_role(installation: Installation, namespace: str, account: str, role: str, where: str) -> None:
    """A RoleBinding in ``where`` of the Role ``role`` to ServiceAccount ``namespace/account``."""
    kube.request_json(installation.conn, "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{where}/rolebindings",
                      body={"metadata": {"generateName": f"{account}-"},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})


def lists(queue: str, namespace: str, name: str) -> bool:
    """Whether ``mcadctl queue``'s table has a row for ``namespace``/``name``."""
    return re.search(rf"^\S+\s+{re.escape(namespace)}\s+{re.escape(name)}\s", queue, re.MULTILINE) is not None


def mcadctl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MCADCTL), "--kubeconfig", kubeconfig, *args], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.fixture
def waiting(installation: Installation, namespace: str) -> str:
    """An AppWrapper in ``namespace`` that fits on no node (100 cpu): it waits, and explain says why."""
    body = appwrapper("too-big", deployment_item("too-big", 1, "100"))
    kube.request_json(installation.conn, "POST", f"{AW}/namespaces/{namespace}/appwrappers", body=body)
    return "too-big"


@pytest.fixture
def operator(installation: Installation, tmp_path: Path) -> str:
    kubeconfig = installation.token(NAMESPACE, "e2e-operator", cluster_roles=(f"{RELEASE}-debug-viewer",),
                                    tmp=tmp_path)
    bind_role(installation, NAMESPACE, "e2e-operator", f"{RELEASE}-debug-client", NAMESPACE)
    return kubeconfig


def test_queue_and_explain_through_the_api_server(installation: Installation, namespace: str, waiting: str,
                                                  operator: str) -> None:
    def listed() -> str | None:
        proc = mcadctl(operator, "queue")
        return proc.stdout if proc.returncode == 0 and lists(proc.stdout, namespace, waiting) else None

    wait_until(listed, 60, "mcadctl queue to list the waiting AppWrapper")
    explained = mcadctl(operator, "explain", f"{namespace}/{waiting}")
    assert explained.returncode == 0, explained.stderr
    assert f"{namespace}/{waiting}" in explained.stdout
    assert "fits on no node" in explained.stdout, explained.stdout


def test_a_tenant_sees_its_own_namespace_only(installation: Installation, namespace: str, waiting: str,
                                              other_namespace: str, tmp_path: Path) -> None:
    kube.request_json(installation.conn, "POST", f"{AW}/namespaces/{other_namespace}/appwrappers",
                      body=appwrapper("theirs", deployment_item("theirs", 1, "100")))
    kube.request_json(installation.conn, "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
                      body={"metadata": {"name": "list-appwrappers"}, "rules": [{
                          "apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"], "verbs": ["list"]}]})
    tenant = installation.token(namespace, "tenant", tmp=tmp_path)
    bind_role(installation, namespace, "tenant", "list-appwrappers", namespace)
    # Without the route (the debug-client Role), the API server refuses, and mcadctl names the missing right.
    refused = mcadctl(tenant, "queue")
    assert refused.returncode != 0
    assert "services/proxy" in refused.stderr, refused.stderr
    bind_role(installation, namespace, "tenant", f"{RELEASE}-debug-client", NAMESPACE)

    def listed() -> str | None:
        proc = mcadctl(tenant, "queue")
        return proc.stdout if proc.returncode == 0 and lists(proc.stdout, namespace, waiting) else None

    queue = wait_until(listed, 60, "the tenant's mcadctl queue to list its AppWrapper")
    assert other_namespace not in queue, queue


@pytest.fixture
def dashboard(operator: str) -> Iterator[str]:
    """``mcadctl dashboard`` running as the operator: the URL it prints."""
    proc = subprocess.Popen([str(MCADCTL), "--kubeconfig", operator, "dashboard"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = wait_until(lambda: (out := proc.stdout.readline()).startswith("Dashboard: ") and out, 30,
                          "mcadctl dashboard to print its URL")
        yield line.split(" ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_dashboard_through_the_api_server(installation: Installation, namespace: str, waiting: str,
                                              dashboard: str) -> None:
    status, page = http_get(dashboard)
    assert status == 200 and "<html" in page.lower(), (status, page[:200])

    def queued() -> dict | None:
        status, body = http_get(dashboard + "api/queue")
        if status != 200:
            return None
        view = json.loads(body)
        rows = [(row.get("namespace"), row.get("name")) for row in view.get("rows", [])]
        return view if (namespace, waiting) in rows else None

    wait_until(queued, 60, "the dashboard's queue view to list the waiting AppWrapper")
