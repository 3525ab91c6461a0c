"""The seed tutorial on the installation: the chart's Deployment, reached through its Service by the API server's
webhooks, admits (as the requesting user), queues and dispatches; a tenant without the rights is refused.

The tutorial's AppWrappers (config/samples/aw-01.yaml and aw-02.yaml) are created as tenants holding only
namespaced rights: ``alice`` may create AppWrappers and nothing else, ``bob`` may also create Deployments. Their
pods land on the kwok node (8 cpu); the real node, where the controller runs, is tainted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from mcad.k8s import kube
from test.installed.conftest import Installation
from test.support import REPO, wait_until

SAMPLES = REPO / "config" / "samples"
AW = "/apis/workload.codeflare.dev/v1beta1"
APPWRAPPER_RIGHTS = [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
                      "verbs": ["create", "get", "list", "watch", "delete"]}]
DEPLOYMENT_RIGHTS = [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}]


def tenant(installation: Installation, namespace: str, name: str, rules: list[dict[str, Any]], tmp: Path) -> str:
    """A kubeconfig acting as ServiceAccount ``namespace/name`` bound to a Role of ``rules`` there."""
    conn = installation.conn
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kube.request_json(conn, "POST", f"{rbac}/roles", body={"metadata": {"name": name}, "rules": rules})
    kube.request_json(conn, "POST", f"{rbac}/rolebindings", body={
        "metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    return installation.token(namespace, name, tmp=tmp)


def kwok_pods(installation: Installation) -> list[str]:
    """Pods that hold room on the kwok node, in any namespace."""
    pods = installation.get("/api/v1/pods?fieldSelector=spec.nodeName=kwok-node-0")["items"]
    return [p["metadata"]["name"] for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]


def appwrapper(installation: Installation, namespace: str, name: str) -> dict[str, Any]:
    return installation.get(f"{AW}/namespaces/{namespace}/appwrappers/{name}")


def state(installation: Installation, namespace: str, name: str) -> str:
    return str((appwrapper(installation, namespace, name).get("status") or {}).get("state", ""))


def running_pods(installation: Installation, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = installation.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector=app={name}")["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"]


def test_the_tutorial_runs_through_the_installed_webhooks(installation: Installation, namespace: str,
                                                          tmp_path: Path) -> None:
    # The tutorial measures an empty 8-cpu node: whatever other tests left there must be gone first.
    wait_until(lambda: not kwok_pods(installation), 120, "the kwok node to be free of other tests' pods")
    alice = tenant(installation, namespace, "alice", APPWRAPPER_RIGHTS, tmp_path)
    bob = tenant(installation, namespace, "bob", APPWRAPPER_RIGHTS + DEPLOYMENT_RIGHTS, tmp_path)
    first, second = (yaml.safe_load((SAMPLES / f).read_text()) for f in ("aw-01.yaml", "aw-02.yaml"))
    first_name, second_name = first["metadata"]["name"], second["metadata"]["name"]

    def create(kubeconfig: str, body: dict[str, Any]) -> Any:
        return installation.kubectl("-n", namespace, "create", "-f", "-", kubeconfig=kubeconfig, check=False,
                                    input_text=json.dumps(body))

    # Alice may create AppWrappers but not Deployments: the validating webhook, asked through the Service, refuses
    # hers on her behalf (a SubjectAccessReview as alice), and nothing is created.
    refused = create(alice, first)
    assert refused.returncode != 0
    assert (f'denied the request: GenericItems[0] (Deployment {first_name}): user '
            f'"system:serviceaccount:{namespace}:alice" may not create deployments.apps in namespace {namespace}'
            in refused.stderr), refused.stderr
    assert installation.kubectl("-n", namespace, "get", "appwrappers", "-o", "name").stdout == ""

    # Bob may: the first AppWrapper (2 pods of 3500m) runs, its creator recorded by the mutating webhook.
    assert create(bob, first).returncode == 0
    wait_until(lambda: state(installation, namespace, first_name) == "Running", 60, f"{first_name} Running")
    wait_until(lambda: len(running_pods(installation, namespace, first_name)) == 2, 60, "its 2 pods Running")
    annotations = appwrapper(installation, namespace, first_name)["metadata"]["annotations"]
    assert annotations["workload.codeflare.dev/creator"] == f"system:serviceaccount:{namespace}:bob"

    # The second needs 1500m; 1 cpu is free: it waits, nothing of it is created, and its status says why.
    assert create(bob, second).returncode == 0
    wait_until(lambda: state(installation, namespace, second_name) == "Pending", 60, f"{second_name} Pending")
    described = installation.kubectl("-n", namespace, "describe", "appwrapper", second_name).stdout
    assert "Insufficient resources to dispatch AppWrapper." in described, described
    assert installation.kubectl("-n", namespace, "get", "deployments", "-o", "name").stdout.split() == [
        f"deployment.apps/{first_name}"]

    # Deleting the first frees its room, and the second is dispatched at once.
    installation.kubectl("-n", namespace, "delete", "appwrapper", first_name, kubeconfig=bob)
    wait_until(lambda: state(installation, namespace, second_name) == "Running", 60, f"{second_name} Running")
    wait_until(lambda: len(running_pods(installation, namespace, second_name)) == 2, 60, "its 2 pods Running")
