"""The dashboard behind the API server's service proxy when the Service sends the page to a standby replica: in a
real browser, the page follows the standby's answer to the leader's pod (through the pod proxy) and shows the
leader's data, saying so.

Two controllers compete for the chart's Lease: the leader, and a standby that alone is behind the Service (as a standby
can be when a Service balances between replicas). Every replica serves on the same port (the standby names only
the leader, and the page takes the port from it), so they listen on two addresses of this machine: the leader on
its IPv4 address and the standby on its IPv6 one, each behind a stand-in Pod of that IP (test/e2e/dashboard.py).
Its own module: the module controller of test_dashboard.py must not dispatch beside this leader.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client as k8s
import pytest
from selenium.webdriver.common.keys import Keys

from mcad.k8s import kube
from test import chart
from test.browser import Browser
from test.e2e.conftest import LOGS, AppWrappers, Controller, appwrapper, deployment_item, service_account_token
from test.e2e.dashboard import SERVICE, controller_service, dashboard_user, host_ip
from test.e2e.dashboard_page import as_user, proxy_url, wait_row

FOLLOWER_ROLE = "mcad-e2e-dashboard-follower"


def host_ipv6() -> str:
    """A global or unique-local IPv6 address of this machine (not loopback, not link-local)."""
    for line in Path("/proc/net/if_inet6").read_text().splitlines():
        raw, _, _, scope, _, device = line.split()
        if device != "lo" and scope == "00":  # global scope
            return str(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw)))
    raise AssertionError("this machine has no global IPv6 address: the standby needs an address of its own")


def port_free_on_both(v4: str, v6: str) -> int:
    for _ in range(20):
        with socket.socket() as sock:
            sock.bind((v4, 0))
            port = int(sock.getsockname()[1])
            with contextlib.suppress(OSError), socket.socket(socket.AF_INET6) as other:
                other.bind((v6, port))
                return port
    raise AssertionError(f"no port free on both {v4} and {v6}")


def stand_in_pod(core: k8s.CoreV1Api, namespace: str, name: str, ip: str) -> None:
    core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": {
        "schedulerName": "none", "containers": [{"name": "controller", "image": "mcad"}]}})
    core.patch_namespaced_pod_status(name, namespace, {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}})


@pytest.fixture
def replicas(controller_kubeconfig: str, core: k8s.CoreV1Api, aws: AppWrappers,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Controller, Controller]]:
    """The leader (pod leader-0) and a standby (the Service's only endpoint), competing in the test namespace."""
    namespace, v4, v6 = aws.namespace, host_ip(), host_ipv6()
    port = port_free_on_both(v4, v6)
    standby_pod = f"{SERVICE}-0"  # the stand-in Pod controller_service makes
    stand_in_pod(core, namespace, "leader-0", v4)
    controller_service(core, namespace, v6, port)
    # The chart's Lease (its Role covers that one): the page finds the leader's pod in the Service's namespace.
    election = ("--leader-elect", "--leader-elect-namespace", chart.NAMESPACE)
    leader = Controller(controller_kubeconfig, LOGS / "test_dashboard_standby-leader.log",
                        "--http-bind-address", f"{v4}:{port}", *election)
    standby = Controller(controller_kubeconfig, LOGS / "test_dashboard_standby-standby.log",
                         "--http-bind-address", f"[{v6}]:{port}", *election)
    for ctl in (leader, standby):
        ctl.log.unlink(missing_ok=True)
    try:
        monkeypatch.setenv("POD_NAME", "leader-0")
        leader.start()
        monkeypatch.setenv("POD_NAME", standby_pod)
        standby.start(ready=b"waiting for leadership")
        yield leader, standby
    finally:
        standby.stop()
        leader.stop()
        for pod in ("leader-0", standby_pod):  # on no node: nothing else would ever finish them
            with contextlib.suppress(k8s.exceptions.ApiException):
                core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)


def follower_token(kubeconfig: str, namespace: str) -> str:
    """A user of ``namespace`` with get on services/proxy and pods/proxy there (an operator's rights: the chart's
    debug-client Role grants no pods/proxy; with it, the page follows a standby's answer through the pod proxy)."""
    kube.Client(kube.connect(kubeconfig)).apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": FOLLOWER_ROLE},
        "rules": [{"apiGroups": [""], "resources": ["services/proxy", "pods/proxy"], "verbs": ["get"]},
                  {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
                   "verbs": ["get", "list", "watch"]}]}, field_manager="mcad-e2e", force=True)
    return service_account_token(kubeconfig, namespace, "follower", roles=((FOLLOWER_ROLE, namespace),))


def test_the_page_follows_a_standby_to_the_leader(browser: Browser, replicas: tuple[Controller, Controller],
                                                  aws: AppWrappers, kubeconfig: str, api: k8s.ApiClient) -> None:
    aws.create(appwrapper("waiting", deployment_item("waiting", 1, "100000")))
    token = follower_token(kubeconfig, aws.namespace)
    as_user(browser, token)
    browser.get(proxy_url(api, aws.namespace))  # served by the standby: the page holds no data
    browser.visible("form#login input#token", "the sign-in form, from the standby").send_keys(token, Keys.ENTER)
    wait_row(browser, f"{aws.namespace}/waiting", "the leader's queue, reached through its pod", state="Queued")
    browser.wait(lambda _: "following the leader, pod leader-0" in browser.find("#status").text,
                 "the status line to say whose data it shows")
    assert browser.csp_violations() == []


def test_without_pods_proxy_the_page_asks_the_service_again_and_names_the_leader(
        browser: Browser, replicas: tuple[Controller, Controller], aws: AppWrappers, kubeconfig: str,
        api: k8s.ApiClient) -> None:
    """The chart's debug-client Role grants no pods/proxy. A page refused the leader's pod goes back to
    the Service for good, asks it again (each request may land on another replica), and, with only the standby
    behind it here, says which pod leads instead of showing the API server's refusal."""
    token = dashboard_user(kubeconfig, aws.namespace, "no-pods", service_proxy=True)
    as_user(browser, token)
    browser.get(proxy_url(api, aws.namespace))
    browser.visible("form#login input#token", "the sign-in form, from the standby").send_keys(token, Keys.ENTER)
    browser.wait(lambda _: browser.find("#status").text == "this replica is a standby; the leader is pod leader-0",
                 "the status line to name the leader")
    pods = [url for url in browser.requests() if "/pods/" in url]
    service = f"/services/{SERVICE}:http/proxy/ui/api/"
    asked = len([url for url in browser.requests() if service in url])
    browser.wait(lambda _: len([url for url in browser.requests() if service in url]) >= asked + 16,
                 "the page's next polls, through the Service")
    assert [url for url in browser.requests() if "/pods/" in url] == pods, "the pod route is not tried again"
    assert len(pods) <= 2, pods  # the first poll's views, sent before the refusal came back
    assert "refused" not in browser.find("#status").text
    assert browser.csp_violations() == []
