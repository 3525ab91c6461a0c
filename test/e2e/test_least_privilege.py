"""The controller runs as the Helm chart's ServiceAccount (see ``controller_kubeconfig``): what the chart does not
grant is refused, and the AppWrapper says so instead of the controller failing quietly."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from mcad import kube
from test import chart
from test.e2e.conftest import AppWrappers, Controller, appwrapper


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
    """Issue 15: it could list and watch every Secret in the cluster. Asked of the API server as the chart's
    ServiceAccount (SelfSubjectAccessReview), and tried."""
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
