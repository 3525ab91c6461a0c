"""The controller runs as the Helm chart's ServiceAccount (see ``controller_kubeconfig``): what the chart does not
grant is refused, and the AppWrapper says so instead of the controller failing quietly."""

from __future__ import annotations

import os

import pytest

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
