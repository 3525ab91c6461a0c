"""config/rbac/worker.yaml, applied to a real API server, lets the hub do in a worker what hub mode does there and
nothing more: read nodes and pods, create (never delete) namespaces, manage the wrapped kinds, watch only those that
report completion; no Secrets, and no write at all in kube-system or mcad-system (an admission policy).

The test acts as the worker identity the way docs/multi-cluster.md says an operator mints it: the
token of the Secret mcad-system/mcad-worker-token, in a kubeconfig beside the worker's server and CA.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcad.k8s import kube
from test.support import REPO, wait_until
from test.worker_identity import token_kubeconfig

WORKER_RBAC = REPO / "config" / "rbac" / "worker.yaml"
ACCOUNT = "system:serviceaccount:mcad-system:mcad-worker"
WRAPPED = [("", "pods"), ("", "services"), ("", "configmaps"), ("apps", "deployments"), ("apps", "statefulsets"),
           ("batch", "jobs"), ("ray.io", "rayclusters"), ("kubeflow.org", "pytorchjobs")]
# Watched for completion (and pods for the ledger); the others are written, never listed.
WATCHED = [("", "pods"), ("apps", "deployments"), ("apps", "statefulsets"), ("batch", "jobs"),
           ("ray.io", "rayclusters"), ("kubeflow.org", "pytorchjobs")]
MANAGE = ["get", "create", "patch", "delete"]


def kubectl(kubeconfig: str, *args: str) -> str:
    binary = shutil.which("kubectl") or str(REPO / ".dev" / "bin" / "kubectl")
    proc = subprocess.run([binary, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@pytest.fixture
def applied(kubeconfig: str) -> Iterator[kube.Connection]:
    """worker.yaml applied for real; afterwards everything it made is deleted except the namespace mcad-system,
    which other tests of the same cluster may use."""
    kubectl(kubeconfig, "apply", "-f", str(WORKER_RBAC))
    try:
        yield kube.connect(kubeconfig)
    finally:
        kubectl(kubeconfig, "delete", "--ignore-not-found", "clusterrolebinding/mcad-worker", "clusterrole/mcad-worker",
                "validatingadmissionpolicybinding/mcad-worker-protected-namespaces",
                "validatingadmissionpolicy/mcad-worker-protected-namespaces")
        kubectl(kubeconfig, "delete", "--ignore-not-found", "-n", "mcad-system", "secret/mcad-worker-token",
                "serviceaccount/mcad-worker")


def allowed(admin: kube.Connection, verb: str, group: str, resource: str, namespace: str = "") -> bool:
    review = kube.request_json(admin, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": ACCOUNT, "groups": ["system:serviceaccounts", "system:serviceaccounts:mcad-system"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                        "namespace": namespace}}})
    return bool(review["status"].get("allowed"))


def test_worker_rbac_grants_what_hub_mode_does_in_a_worker(applied: kube.Connection) -> None:
    admin = applied
    for group, resource in WRAPPED:
        # The wrapped kinds are granted whether or not their CRD (ray.io, kubeflow.org) is installed yet.
        assert [verb for verb in MANAGE if not allowed(admin, verb, group, resource, "team-a")] == [], resource
        watched = (group, resource) in WATCHED
        assert allowed(admin, "list", group, resource) == watched == allowed(admin, "watch", group, resource), resource
        assert not allowed(admin, "update", group, resource, "team-a"), resource
    assert all(allowed(admin, verb, "", "nodes") for verb in ("get", "list", "watch"))
    assert allowed(admin, "list", "", "pods")  # every namespace: the ledger counts all pods
    assert allowed(admin, "create", "", "namespaces") and allowed(admin, "get", "", "namespaces")
    refused = [("delete", "", "namespaces"), ("get", "", "secrets"), ("list", "", "secrets"),
               ("patch", "", "nodes"), ("list", "workload.codeflare.dev", "appwrappers"),
               ("deletecollection", "", "pods"), ("create", "rbac.authorization.k8s.io", "clusterroles")]
    assert [r for r in refused if allowed(admin, *r)] == []


def refused_write(worker: kube.Connection, obj: dict[str, Any], admin: kube.Connection) -> bool:
    """Whether creating ``obj`` is refused by the admission policy. The API server loads a new policy within a
    second or so: a create that got through before is deleted again, and the caller asks again until a deadline.
    The policy may load between that create and its delete, which it then refuses too: the admin deletes it."""
    path = f"/api/v1/namespaces/{obj['metadata']['namespace']}/configmaps"
    try:
        kube.request_json(worker, "POST", path, body=obj)
    except kube.ApiError as err:
        assert err.status == 403 and "may not write in kube-system or mcad-system" in err.message, err
        return True
    try:
        kube.request_json(worker, "DELETE", f"{path}/{obj['metadata']['name']}")
    except kube.ApiError as err:
        assert err.status == 403 and "may not write in kube-system or mcad-system" in err.message, err
        kube.request_json(admin, "DELETE", f"{path}/{obj['metadata']['name']}")
    return False


def test_the_minted_token_works_as_the_hub_uses_it(applied: kube.Connection, kubeconfig: str,
                                                   tmp_path: Path) -> None:
    admin = applied
    worker = kube.connect(str(token_kubeconfig(kubeconfig, admin, tmp_path / "east.kubeconfig")))
    assert kube.request_json(worker, "GET", "/api/v1/nodes")["items"]
    namespace = f"hubcli-{uuid.uuid4().hex[:8]}"
    try:
        # What the hub does for an AppWrapper whose namespace the worker lacks: create it, then apply its objects.
        kube.request_json(worker, "POST", "/api/v1/namespaces",
                          body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        config_map: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": "wrapped", "namespace": namespace,
                                                   "labels": {"workload.codeflare.dev/appwrapper": "job-a"}},
                                      "data": {"k": "v"}}
        path = f"/api/v1/namespaces/{namespace}/configmaps/wrapped"
        kube.request_json(worker, "PATCH", path, query=[("fieldManager", "mcad")], body=config_map,
                          content_type="application/apply-patch+yaml")
        assert kube.request_json(worker, "GET", path)["data"] == {"k": "v"}
        kube.request_json(worker, "DELETE", path)
        with pytest.raises(kube.ApiError) as denied:
            kube.request_json(worker, "GET", "/api/v1/namespaces/kube-system/secrets")
        assert denied.value.status == 403
        with pytest.raises(kube.ApiError) as denied:
            kube.request_json(worker, "DELETE", f"/api/v1/namespaces/{namespace}")
        assert denied.value.status == 403
        # RBAC grants the wrapped kinds everywhere; the admission policy refuses the protected namespaces.
        kube.request_json(worker, "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=config_map)
        for protected in ("kube-system", "mcad-system"):
            planted = {**config_map, "metadata": {"name": f"planted-{uuid.uuid4().hex[:8]}", "namespace": protected}}
            wait_until(lambda planted=planted: refused_write(worker, planted, admin), 30,
                       f"the admission policy to refuse writes in {protected}")
    finally:
        try:
            kube.request_json(admin, "DELETE", f"/api/v1/namespaces/{namespace}")
        except kube.ApiError as err:
            if err.status != 404:
                raise
