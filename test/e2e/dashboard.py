"""Reaching a test controller's dashboard the ways a cluster's users do: the API server's service proxy, and
``mcadctl dashboard`` (shared by the dashboard's e2e tests, HTTP-level and browser).

The API server refuses to proxy to loopback addresses, so the controller listens on an address of this machine
that is not loopback (``host_ip``), and stands in for a pod of the chart: ``controller_service`` creates, in a
test namespace, a Pod that is never scheduled whose status.podIP is that address, the selector-less Service
``mcad-controller`` (port ``http``, as the chart names them) and Endpoints naming that Pod (the service proxy goes
only to an address that belongs to a Pod). There is no Lease of that name there, so mcadctl takes the Service.

Users are ServiceAccounts with TokenRequest tokens: ``dashboard_user`` grants get on ``services/proxy`` of that
Service (the right that gates the dashboard) or not, plus the AppWrapper rights of a tenant in its namespace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes.client as k8s

from mcad.cli import reach
from mcad.k8s import kube
from test.e2e.conftest import GROUP, PLURAL, service_account_token
from test.support import load_hack_module, token_kubeconfig, wait_until

SERVICE = "mcad-controller"  # the chart's Service (and Lease) name for release "mcad"
# What the controller sends with every /ui answer (docs/dashboard.md's security headers), spelled out rather than
# imported so that a change to mcad.serve.dashboard's policy fails these tests.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SERVICE_PORT = 8080
VIEWER_ROLE = "mcad-e2e-dashboard-viewer"  # services/proxy of SERVICE, and a tenant's AppWrapper rights
TENANT_ROLE = "mcad-e2e-dashboard-tenant"  # only a tenant's AppWrapper rights: no services/proxy
NAME_ONLY_ROLE = "mcad-e2e-dashboard-name-only"  # services/proxy naming the Service but not its port: not enough
MCADCTL = Path(sys.executable).parent / "mcadctl"


def host_ip() -> str:
    """An IPv4 address of this machine that is not loopback (``hack/hostip.py``), which the API server will proxy to."""
    address = str(load_hack_module("hostip").host_ip())
    if not address:
        raise AssertionError("this machine has no IPv4 address but loopback ones: the API server's proxy (which the "
                             "dashboard tests go through) refuses to reach loopback addresses")
    return address


def controller_service(core: k8s.CoreV1Api, namespace: str, ip: str, port: int, name: str = SERVICE) -> None:
    """The Service ``name`` (port ``http``) in ``namespace`` with Endpoints to a stand-in Pod whose IP is ``ip``, for
    a controller listening at ``ip``:``port``."""
    pod = f"{name}-0"
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": pod},
        "spec": {"schedulerName": "none", "containers": [{"name": "controller", "image": "mcad"}]}})
    core.patch_namespaced_pod_status(pod, namespace, {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}})
    core.create_namespaced_service(namespace, {
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": port}]}})
    core.create_namespaced_endpoints(namespace, {
        "metadata": {"name": name},
        "subsets": [{"addresses": [{"ip": ip, "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace}}],
                     "ports": [{"name": "http", "port": port}]}]})


def dashboard_roles(kubeconfig: str, service: str = SERVICE) -> None:
    """The ClusterRoles ``dashboard_user`` binds (in a namespace, with a RoleBinding)."""
    client = kube.Client(kube.connect(kubeconfig))
    tenant = {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "create", "delete"]}
    # The service proxy URL names the Service's port ("<service>:http"), and RBAC matches resourceNames against the
    # name as the URL spells it: the Service's name alone is not enough (test_dashboard_access shows it). The
    # chart's Role lists both, and so does this.
    proxy = {"apiGroups": [""], "resources": ["services/proxy"], "resourceNames": [service, f"{service}:http"],
             "verbs": ["get"]}
    name_only = {**proxy, "resourceNames": [service]}
    for name, rules in ((VIEWER_ROLE, [tenant, proxy]), (TENANT_ROLE, [tenant]), (NAME_ONLY_ROLE, [tenant, name_only])):
        client.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": name}, "rules": rules}, field_manager="mcad-e2e", force=True)


def dashboard_user(kubeconfig: str, namespace: str, name: str, *, service_proxy: bool, role: str = "") -> str:
    """A ServiceAccount ``namespace/name`` with a tenant's AppWrapper rights in ``namespace`` and, with
    ``service_proxy``, get on ``services/proxy`` of the Service there (``role``: one of this module's roles
    instead); its token."""
    dashboard_roles(kubeconfig)
    role = role or (VIEWER_ROLE if service_proxy else TENANT_ROLE)
    return service_account_token(kubeconfig, namespace, name, roles=((role, namespace),))


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def user_kubeconfig(admin_kubeconfig: str, token: str, directory: Path, name: str) -> str:
    """A kubeconfig for the test cluster carrying only ``token`` (what a user of the dashboard has)."""
    return token_kubeconfig(admin_kubeconfig, token, directory / f"{name}.kubeconfig", user=name)


def service_proxy_get(kubeconfig: str, namespace: str, path: str, service: str = SERVICE) -> Reply:
    """GET ``path`` (``/ui/...``) of the controller through the API server's service proxy as the user of
    ``kubeconfig`` (a token kubeconfig), whose token is also shown to the controller (``X-Mcad-Authorization``,
    since the proxy drops ``Authorization``)."""
    path, _, query = path.partition("?")
    conn = kube.connect(kubeconfig)
    token = kube.bearer_token(conn)
    assert token, f"{kubeconfig} holds no bearer token"
    answer = kube.open_passthrough(
        conn, "GET", reach.service_proxy_base(namespace, service) + path,
        query=urllib.parse.parse_qsl(query), headers={"X-Mcad-Authorization": f"Bearer {token}"}, timeout=10)
    try:
        return Reply(answer.status, {k.lower(): v for k, v in answer.headers}, _read_all(answer))
    finally:
        answer.close()


def _read_all(answer: kube.Passthrough) -> bytes:
    data = b""
    while piece := answer.read(65536):
        data += piece
    return data


def http_get(url: str, headers: dict[str, str] | None = None) -> Reply:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read())


@dataclass
class Dashboard:
    """A running ``mcadctl dashboard``: its URL (``.../ui/``) and what it printed."""

    proc: subprocess.Popen[str]
    url: str = ""
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    def get(self, relative: str = "") -> Reply:
        """GET ``relative`` to the dashboard's URL (``api/queue?limit=5``)."""
        return http_get(self.url + relative)

    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)


@contextlib.contextmanager
def mcadctl_dashboard(kubeconfig: str, namespace: str, *args: str, service: str = SERVICE,
                      global_args: tuple[str, ...] = ()) -> Iterator[Dashboard]:
    """``mcadctl dashboard`` as a process, with ``kubeconfig`` (a user's) and ``global_args`` (``--token``,
    ``--port``), the controller looked for in ``namespace``; yielded once it printed its URL and probed the page,
    stopped with SIGINT (Ctrl-C) afterwards."""
    env = {k: v for k, v in os.environ.items() if k not in ("MCAD_TOKEN", "KUBECONFIG")}
    proc = subprocess.Popen(
        [str(MCADCTL), "--kubeconfig", kubeconfig, "--controller-namespace", namespace, "--controller-name", service,
         *global_args, "dashboard", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    running = Dashboard(proc)
    readers = [threading.Thread(target=lambda s=stream, into=into: into.extend(iter(s.readline, "")), daemon=True)
               for stream, into in ((proc.stdout, running.stdout), (proc.stderr, running.stderr))]
    for reader in readers:
        reader.start()

    def url() -> str:
        assert proc.poll() is None, f"mcadctl dashboard exited {proc.returncode}: {running.output()}"
        return next((line.split(" ", 1)[1].strip() for line in running.stdout if line.startswith("Dashboard: ")), "")

    try:
        running.url = wait_until(url, 30, "mcadctl dashboard to print its URL")
        wait_until(lambda: any(line.startswith("Forwarding /ui") for line in running.stdout), 30,
                   "mcadctl dashboard to be ready")
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for reader in readers:
            reader.join(timeout=5)
