"""Who reaches the dashboard through the API server, against a real one: Kubernetes RBAC on ``services/proxy``
gates the page, both on the service proxy URL and through ``mcadctl dashboard``, and the controller then shows
each user what its own rights allow.

The controller runs on this machine's non-loopback address behind a stand-in Service (test/e2e/dashboard.py);
the users are ServiceAccounts of the test namespace, tenants there, one with get on ``services/proxy`` of that
Service and one without.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import GROUP, LOGS, PLURAL, VERSION, Controller, appwrapper, deployment_item, running_controller
from test.e2e.dashboard import (
    CONTENT_SECURITY_POLICY,
    NAME_ONLY_ROLE,
    SERVICE,
    controller_service,
    dashboard_user,
    host_ip,
    http_get,
    mcadctl_dashboard,
    service_proxy_get,
    user_kubeconfig,
)
from test.support import wait_until


@pytest.fixture(scope="module")
def controller(controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    """The module's controller, on this machine's non-loopback address (the API server proxies to no loopback)."""
    with running_controller(controller_kubeconfig, LOGS / "test_dashboard_access.log",
                            "--http-bind-address", f"{host_ip()}:0") as ctl:
        yield ctl


@pytest.fixture
def site(core: k8s.CoreV1Api, namespace: str, controller: Controller) -> str:
    """The test namespace, with the controller's Service in it; an AppWrapper there that waits forever."""
    controller_service(core, namespace, host_ip(), controller.port)
    return namespace


def waiting(custom: k8s.CustomObjectsApi, namespace: str, name: str = "waiting") -> str:
    """An AppWrapper of a thousand cpus: no test cluster has them, so it stays queued."""
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                           appwrapper(name, deployment_item(name, 2, "500")))
    return name


def queue_rows(body: bytes) -> set[tuple[str, str]]:
    doc: dict[str, Any] = json.loads(body)
    return {(row["namespace"], row["name"]) for row in doc["rows"]}


def test_a_user_with_services_proxy_gets_the_page_and_its_appwrappers(
        site: str, kubeconfig: str, custom: k8s.CustomObjectsApi, tmp_path: Path) -> None:
    name = waiting(custom, site)
    viewer = user_kubeconfig(kubeconfig, dashboard_user(kubeconfig, site, "viewer", service_proxy=True), tmp_path,
                             "viewer")

    # The service proxy URL, as `kubectl proxy` serves it.
    page = service_proxy_get(viewer, site, "/ui/")
    assert page.status == 200, page.text
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    wait_until(lambda: (site, name) in queue_rows(service_proxy_get(viewer, site, f"/ui/api/queue?namespace={site}")
                                                  .body), 30, "the AppWrapper in the queue, through the service proxy")

    # mcadctl dashboard, with the same user's kubeconfig (a token one: mcadctl shows the controller that token).
    with mcadctl_dashboard(viewer, site) as dashboard:
        assert f"Forwarding /ui to the Service {site}/{SERVICE}" in dashboard.output()
        assert not dashboard.stderr, dashboard.output()
        page = dashboard.get()
        assert page.status == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "set-cookie" not in page.headers
        for asset in ("app.js", "app.css"):
            assert dashboard.get(asset).status == 200, asset
        # /ui redirects relatively (ui/), so through the API server and mcadctl it lands on the page.
        bare = http_get(dashboard.url.rstrip("/"))
        assert bare.status == 200 and bare.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        queue = dashboard.get(f"api/queue?namespace={site}")
        assert queue.status == 200, queue.text
        assert (site, name) in queue_rows(queue.body)
        # Nothing but /ui goes through, even for the holder of the URL.
        assert dashboard.get("../../debug/queue").status == 404
    assert dashboard.proc.returncode == 0 and dashboard.stdout[-1].strip() == "stopped", dashboard.output()


def test_a_user_without_services_proxy_is_refused_by_the_api_server(
        site: str, kubeconfig: str, custom: k8s.CustomObjectsApi, tmp_path: Path) -> None:
    waiting(custom, site)
    # A tenant of the namespace: the controller would show it its AppWrappers, but the API server lets it not reach
    # the controller at all.
    tenant = user_kubeconfig(kubeconfig, dashboard_user(kubeconfig, site, "tenant", service_proxy=False), tmp_path,
                             "tenant")
    refused = service_proxy_get(tenant, site, "/ui/")
    assert refused.status == 403, refused.text
    status = json.loads(refused.body)
    assert status["kind"] == "Status" and 'cannot get resource "services/proxy"' in status["message"], status
    assert service_proxy_get(tenant, site, f"/ui/api/queue?namespace={site}").status == 403

    with mcadctl_dashboard(tenant, site) as dashboard:
        assert "your user needs get on services/proxy" in "".join(dashboard.stderr), dashboard.output()
        page = dashboard.get()
        assert page.status == 403, page.text
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert (f"your user needs get on services/proxy with the resource name {SERVICE}:http (RBAC sees the name as "
                f"the URL spells it) in namespace {site}") in page.text
        assert "cannot get resource &quot;services/proxy&quot;" in page.text  # the API server's words, escaped
        data = dashboard.get(f"api/queue?namespace={site}")
        assert data.status == 403 and "services/proxy" in json.loads(data.body)["error"]


def test_services_proxy_must_be_granted_under_the_name_the_url_spells(site: str, kubeconfig: str,
                                                                      tmp_path: Path) -> None:
    # The URL names the Service's port (mcad-controller:http), and that is the name RBAC checks resourceNames against.
    named = user_kubeconfig(kubeconfig, dashboard_user(kubeconfig, site, "named", service_proxy=True,
                                                       role=NAME_ONLY_ROLE), tmp_path, "named")
    refused = service_proxy_get(named, site, "/ui/")
    assert refused.status == 403, refused.text
    assert f'services \\"{SERVICE}:http\\" is forbidden' in refused.text
