"""The controller runs as the Helm chart's ServiceAccount (see ``controller_kubeconfig``): what the chart does not
grant is refused, and the AppWrapper says so instead of the controller failing quietly."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test import chart
from test.e2e.conftest import AppWrappers, Controller, appwrapper
from test.support import wait_until


@pytest.mark.skipif(os.environ.get("MCAD_E2E_ADMIN") == "1", reason="the controller runs as admin on request")
def test_a_kind_the_chart_does_not_grant_fails_with_forbidden(controller: Controller, aws: AppWrappers,
                                                              controller_kubeconfig: str) -> None:
    assert chart.who_am_i(controller_kubeconfig) == f"system:serviceaccount:{chart.NAMESPACE}:{chart.RELEASE}"
    policy = {"replicas": 1, "generictemplate": {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}}
    status = aws.wait_state("denied", "Failed") if aws.create(appwrapper("denied", policy)) else {}
    assert "GenericItems[0] (NetworkPolicy deny): Forbidden (403)" in status["message"], status["message"]
    assert not aws.exists("networking.k8s.io/v1", "NetworkPolicy", "deny")


def as_controller(controller_kubeconfig: str) -> kube.Client:
    return kube.Client(kube.connect(controller_kubeconfig))


@pytest.mark.skipif(os.environ.get("MCAD_E2E_ADMIN") == "1", reason="the controller runs as admin on request")
def test_the_controller_can_neither_list_nor_watch_secrets(controller_kubeconfig: str, aws: AppWrappers) -> None:
    """It may not list or watch Secrets (a controller that could would see every one in the cluster). Asked of
    the API server as the chart's ServiceAccount (SelfSubjectAccessReview), and tried."""
    client = as_controller(controller_kubeconfig)
    for verb in ("list", "watch"):
        assert not client.allowed(verb, "v1", "Secret"), f"{verb} Secrets in every namespace"
        assert not client.allowed(verb, "v1", "Secret", aws.namespace), f"{verb} Secrets in {aws.namespace}"
    for path in ("/api/v1/secrets", f"/api/v1/namespaces/{aws.namespace}/secrets"):
        with pytest.raises(kube.ApiError) as refused:
            kube.request_json(client.conn, "GET", path, query=[("limit", "1")])
        assert refused.value.status == 403, refused.value
    # What it needs stays: watching Jobs for completion, creating what AppWrappers wrap.
    assert client.allowed("watch", "batch/v1", "Job")
    assert client.allowed("create", "v1", "Secret", aws.namespace)


@pytest.mark.skipif(os.environ.get("MCAD_E2E_ADMIN") == "1", reason="the controller runs as admin on request")
def test_the_controller_reads_no_secret_outside_its_own(controller_kubeconfig: str, aws: AppWrappers,
                                                        core: k8s.CoreV1Api) -> None:
    """It may not get a tenant's Secret (a wrapped kinds' rule bound cluster-wide would allow it). Neither get
    nor patch (whose answer is the object) is allowed on a Secret of a tenant or of kube-system; tried too."""
    core.create_namespaced_secret(aws.namespace, {"metadata": {"name": "tenant-db"},
                                                  "stringData": {"password": "tenant-secret"}})
    client = as_controller(controller_kubeconfig)
    for namespace in (aws.namespace, "kube-system"):
        for verb in ("get", "patch", "update", "list"):
            assert not client.allowed(verb, "v1", "Secret", namespace), f"{verb} Secrets in {namespace}"
    path = f"/api/v1/namespaces/{aws.namespace}/secrets/tenant-db"
    for method, body in (("GET", None), ("PATCH", [{"op": "test", "path": "/metadata/name", "value": "tenant-db"}])):
        with pytest.raises(kube.ApiError) as refused:
            kube.request_json(client.conn, method, path, body=body, content_type="application/json-patch+json")
        assert refused.value.status == 403, refused.value
    # Its own: the webhook certificate, by name, and no other Secret of its namespace.
    assert not client.allowed("get", "v1", "Secret", chart.NAMESPACE)
    kube.request_json(client.conn, "GET", f"/api/v1/namespaces/{chart.NAMESPACE}/secrets/{chart.RELEASE}-webhook-cert")


def test_an_appwrapper_still_wraps_a_secret_and_takes_it_away(controller: Controller, aws: AppWrappers) -> None:
    """Create and delete are all a wrapped Secret needs."""
    item = {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"},
                                               "stringData": {"token": "for-the-job"}}}
    aws.create(appwrapper("with-secret", item))
    aws.wait_state("with-secret", "Running", timeout=30)
    assert aws.exists("v1", "Secret", "token")
    aws.delete("with-secret")
    wait_until(lambda: not aws.exists("v1", "Secret", "token"), 30, "the wrapped Secret deleted with its AppWrapper")


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "kube-node-lease", chart.NAMESPACE])
def test_an_appwrapper_in_a_protected_namespace_fails_and_creates_nothing(
        controller: Controller, aws: AppWrappers, namespace: str) -> None:
    """The controller refuses the kube-* namespaces and its own (where its credentials and Lease live) whatever
    admission let through; its RBAC alone would let it write there (see the rbac.namespaces option below)."""
    protected = AppWrappers(aws.custom, aws.core, namespace, aws.connection)
    name = f"protected-{uuid.uuid4().hex[:8]}"
    item = {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                               "data": {"planted": "yes"}}}
    protected.create(appwrapper(name, item))
    try:
        status = protected.wait_state(name, "Failed", timeout=30)
        failed = status["conditions"][-1]
        assert failed["reason"] == "ProtectedNamespace", status
        assert f"namespace {namespace} is protected" in failed["message"], status
        assert not protected.exists("v1", "ConfigMap", name)
    finally:
        protected.delete(name)


@pytest.mark.skipif(os.environ.get("MCAD_E2E_ADMIN") == "1", reason="the controller runs as admin on request")
def test_write_rights_bound_per_namespace_refuse_kube_system(kubeconfig: str, aws: AppWrappers,
                                                             tmp_path: Path) -> None:
    """rbac.namespaces: the chart binds writing the wrapped kinds in the listed namespaces only, so the API server
    itself refuses the rest, kube-system included. A second release, as its ServiceAccount."""
    release = "mcad-scoped"
    values = {**chart.E2E_VALUES, "rbac": {**chart.E2E_VALUES["rbac"], "namespaces": [aws.namespace]}}  # type: ignore[dict-item]
    scoped = chart.install(kubeconfig, tmp_path, release=release, namespace=release, values=values)
    try:
        client = as_controller(scoped)
        assert client.allowed("create", "apps/v1", "Deployment", aws.namespace)
        assert client.allowed("delete", "v1", "ConfigMap", aws.namespace)
        for namespace in ("kube-system", "default"):
            for verb in ("create", "patch", "delete", "get"):
                assert not client.allowed(verb, "apps/v1", "Deployment", namespace), (verb, namespace)
        assert not client.allowed("list", "v1", "Secret")
        planted = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": f"planted-{uuid.uuid4().hex[:8]}", "namespace": "kube-system"}}
        with pytest.raises(kube.ApiError) as refused:
            client.create(planted, field_manager="mcad-e2e")
        assert refused.value.status == 403, refused.value
    finally:
        chart.helm("uninstall", release, "--namespace", release, "--wait", kubeconfig=kubeconfig)
        aws.core.delete_namespace(release)
