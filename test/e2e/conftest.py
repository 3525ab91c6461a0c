"""Fixtures for end-to-end tests: the CRD installed, the real controller running as a separate process.

Admission goes through the real webhooks: the chart registers them against the API server by URL
(https://127.0.0.1:<session port>), and every controller started here with the chart's ServiceAccount serves
them on that port (several at once share it, as replicas behind a Service would). They review the namespaces
labelled ``mcad.test/webhook=mcad``, which ``namespace`` (hence ``aw_namespace``) creates: every e2e AppWrapper
is admitted by the controller, and while no controller runs, creates there are refused (failurePolicy Fail).
Namespaces of other tests (integration tests, benches) are not labelled, so AppWrappers they create with no
controller running are not refused. Modules with a cluster of their own and an admin controller (test_faults),
and MCAD_E2E_ADMIN=1, install no webhooks.

The controller is started once per module (``controller``) with the session's kubeconfig and stopped with
SIGTERM afterwards; its log is kept in .dev/e2e-logs/ and printed when a test fails. ``aw_namespace`` is a fresh
namespace whose AppWrappers and pods are all gone when the test ends, so the next test sees the capacity it
measures. Capacity is measured, never assumed (``free_cpu_millis``): the same tests run on a bigger cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
import yaml

from mcad.k8s import kube
from test import browser as chromium
from test import chart
from test.support import REPO, wait_until
from test.support import free_port as support_free_port

LEGACY_CRD = REPO / "config" / "crd" / "legacy" / "mcad.ibm.com_mcadappwrappers.yaml"

GROUP, VERSION, PLURAL = "workload.codeflare.dev", "v1beta1", "appwrappers"
LOGS = REPO / ".dev" / "e2e-logs"


# Set by ``controller_kubeconfig``: what a controller started with that kubeconfig (the chart's ServiceAccount) gets
# to serve the webhooks the chart registered. Other kubeconfigs (MCAD_E2E_ADMIN=1, modules with a cluster of their
# own) have no webhooks registered: their controllers run with --no-webhook.
WEBHOOK_ARGS: dict[str, tuple[str, ...]] = {}


# What the chart's Deployment sets in the controller's environment besides its flags.
CONTROLLER_ENV = {"PYTHONMALLOC": "malloc"}


def free_port() -> int:
    """A port on the address the cluster reaches this machine's controller at (``test.support.free_port``)."""
    return support_free_port(chart.webhook_host())


class Controller:
    # The bearer token ``get`` presents by default: an endpoint reader's (``endpoint_reader``), set for the session.
    token: str | None = None

    def __init__(self, kubeconfig: str, log: Path, *args: str) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self._start = 0
        self._admits = False

    def start(self, ready: bytes = b"dispatcher started") -> None:
        """Start the process and wait for ``ready`` in its log (a leader-election standby never dispatches:
        it logs "waiting for leadership")."""
        self.launch()
        self.wait_ready(ready)

    def launch(self) -> None:
        """Start the process without waiting (``wait_ready`` waits): to start several at once."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")  # noqa: SIM115 - the child process owns it
        # A restarted controller appends to its log: only what this process writes counts as ready.
        self._start = out.tell()
        # A free port for /metrics and friends, unless the test picks one: controllers run side by side.
        http = () if "--http-bind-address" in self.args else ("--http-bind-address", "127.0.0.1:0")
        # The session's webhooks, unless the test chose otherwise.
        webhook = () if any(a.startswith(("--webhook-bind-address", "--no-webhook")) for a in self.args) else (
            WEBHOOK_ARGS.get(self.kubeconfig) or ("--no-webhook",))
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mcad-controller"), "--kubeconfig", self.kubeconfig,
             "--log-format", "console", *http, *webhook, *self.args], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **CONTROLLER_ENV})
        out.close()
        # Ready to admit once its certificate is loaded (a first one may be issued now); a test that provides a
        # certificate directory fills it itself.
        self._admits = not {"--no-webhook", "--webhook-cert-dir"} & {*webhook, *self.args}

    def wait_ready(self, ready: bytes = b"dispatcher started") -> None:
        start = self._start
        wait_until(lambda: ready in self.log.read_bytes()[start:], 60, f"the controller to log {ready.decode()!r}")
        if self._admits:
            wait_until(lambda: b"webhook certificate loaded" in self.log.read_bytes()[start:], 60,
                       "the controller to load its webhook certificate")

    @property
    def port(self) -> int:
        """The port of its HTTP endpoint, as it last logged it (a restarted controller appends to its log)."""
        found = re.findall(rb"http server listening.*?port=(\d+)", self.log.read_bytes())
        assert found, "the controller has not logged its HTTP port"
        return int(found[-1])

    @property
    def host(self) -> str:
        """The address of its HTTP endpoint as a URL host, as it last logged it: loopback unless the test bound
        another (the API server's proxy reaches no loopback address)."""
        found = re.findall(rb"http server listening.*?address=(\S+)", self.log.read_bytes())
        assert found, "the controller has not logged its HTTP address"
        address = found[-1].decode()
        return f"[{address}]" if ":" in address else address  # IPv6, as a URL writes it

    def get(self, path: str, token: str | None = "") -> tuple[int, str]:
        """GET ``path`` from its HTTP endpoint: the status code and body, errors included. It presents ``token``
        (default: the session's endpoint reader's, which may read everything; None: no token at all)."""
        token = self.token if token == "" else token
        request = urllib.request.Request(f"http://{self.host}:{self.port}{path}",
                                         headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def webhook_port() -> int:
    """The port where the session's controllers serve the webhooks and the API server calls them."""
    return free_port()


@pytest.fixture(scope="session")
def controller_kubeconfig(kubeconfig: str, crd: None, tmp_path_factory: pytest.TempPathFactory,
                          webhook_port: int) -> str:
    """A kubeconfig acting as the Helm chart's ServiceAccount (installed here), which every e2e controller uses:
    the suite passing proves the chart's RBAC is enough. MCAD_E2E_ADMIN=1 runs the controller as admin instead."""
    if os.environ.get("MCAD_E2E_ADMIN") == "1":
        return kubeconfig
    path = chart.install(kubeconfig, tmp_path_factory.mktemp("chart"),
                         values={**chart.E2E_VALUES, **chart.webhook_values(webhook_port)})
    assert chart.who_am_i(path) == f"system:serviceaccount:{chart.NAMESPACE}:{chart.RELEASE}"
    WEBHOOK_ARGS[path] = chart.webhook_args(webhook_port)
    return path


@pytest.fixture
def namespace_labels(request: pytest.FixtureRequest) -> dict[str, str]:
    """The test's namespace goes through the webhooks of the release the module names (``WEBHOOK_RELEASE``,
    default the suite's), or of none (``WEBHOOK_RELEASE = None``, or the chart not installed)."""
    release = getattr(request.module, "WEBHOOK_RELEASE", chart.RELEASE)
    if release is None or os.environ.get("MCAD_E2E_ADMIN") == "1":
        return {}
    return {chart.WEBHOOK_LABEL: release}


def service_account_token(kubeconfig: str, namespace: str, name: str, *, cluster_roles: tuple[str, ...] = (),
                          roles: tuple[tuple[str, str], ...] = ()) -> str:
    """A TokenRequest token of the ServiceAccount ``namespace/name`` (created if missing), bound to
    ``cluster_roles`` everywhere and to each ``(cluster role, namespace)`` of ``roles`` in that namespace."""
    conn = kube.connect(kubeconfig)
    client = kube.Client(conn)
    manager = "mcad-e2e"
    client.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
                 field_manager=manager, force=True)
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    for role in cluster_roles:
        client.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                      "metadata": {"name": f"{namespace}-{name}-{role}"},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                      "subjects": subject}, field_manager=manager, force=True)
    for role, where in roles:
        client.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                      "metadata": {"name": f"{namespace}-{name}-{role}", "namespace": where},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                      "subjects": subject}, field_manager=manager, force=True)
    return str(kube.request_json(conn, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                 body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                       "spec": {"expirationSeconds": 6 * 3600}})["status"]["token"])


# The chart's ClusterRoles that read the controller's endpoints (templates/endpoint-access.yaml).
METRICS_READER = f"{chart.RELEASE}-metrics-reader"
DEBUG_VIEWER = f"{chart.RELEASE}-debug-viewer"


@pytest.fixture(scope="session", autouse=True)
def endpoint_reader(kubeconfig: str, controller_kubeconfig: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A token that may read all of every e2e controller's /metrics and /debug, through the chart's ClusterRoles:
    ``Controller.get`` presents it unless told otherwise."""
    if controller_kubeconfig == kubeconfig:  # MCAD_E2E_ADMIN=1: the chart is still what grants the readers
        chart.install(kubeconfig, tmp_path_factory.mktemp("chart"))
    token = service_account_token(kubeconfig, chart.NAMESPACE, "mcad-e2e-reader",
                                  cluster_roles=(METRICS_READER, DEBUG_VIEWER))
    Controller.token = token
    return token


@contextlib.contextmanager
def running_controller(kubeconfig: str, log: Path, *args: str) -> Iterator[Controller]:
    """A controller process with a fresh log, stopped (SIGTERM) on the way out."""
    log.unlink(missing_ok=True)
    ctl = Controller(kubeconfig, log, *args)
    try:
        ctl.start()  # inside: a controller that never gets ready is stopped too, not left running
        yield ctl
    finally:
        ctl.stop()


@pytest.fixture
def other_namespace(core: k8s.CoreV1Api) -> Iterator[str]:
    """A second tenant's namespace (``mcad-test-b-*``), deleted after the test."""
    name = f"mcad-test-b-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mcad.test/owned": "true"}}})
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def legacy_crd(api: k8s.ApiClient) -> None:
    """The legacy group's CRD (mcad.ibm.com, served with --legacy-api), installed and established."""
    ext = k8s.ApiextensionsV1Api(api)
    body = yaml.safe_load(LEGACY_CRD.read_text())
    ext.patch_custom_resource_definition(body["metadata"]["name"], body, field_manager="mcad-e2e", force=True,
                                         _content_type="application/apply-patch+yaml")
    wait_until(lambda: any(c.type == "Established" and c.status == "True" for c in
                           ext.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or []),
               30, "the legacy CRD to be established")


@pytest.fixture(scope="module")
def controller(request: pytest.FixtureRequest, controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    """One controller per module, with the module's ``CONTROLLER_ARGS`` (default none)."""
    log = LOGS / f"{request.module.__name__.rsplit('.', 1)[-1]}.log"
    with running_controller(controller_kubeconfig, log, *getattr(request.module, "CONTROLLER_ARGS", ())) as ctl:
        yield ctl


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    funcargs = getattr(item, "funcargs", {})
    ctl = funcargs.get("controller")
    if report.failed and isinstance(ctl, Controller):
        report.sections.append(("mcad-controller log (tail)", ctl.tail()))
    # A failed browser test leaves what its browser showed (this runs before the fixture closes the browser).
    for argname, value in funcargs.items():
        if report.failed and isinstance(value, chromium.Browser):
            saved = value.save_artifacts(chromium.ARTIFACTS, chromium.artifact_stem(item.nodeid, report.when, argname))
            report.sections.append((f"browser {argname!r}: screenshot, page source, console",
                                    "\n".join(str(path) for path in saved) or "nothing saved: the browser is gone"))
    return report


@pytest.fixture
def browser() -> Iterator[chromium.Browser]:
    """Headless chromium with a 1280x900 viewport (test/browser.py); a failed test leaves a screenshot."""
    with chromium.running(chromium.DESKTOP) as found:
        yield found


@pytest.fixture
def phone() -> Iterator[chromium.Browser]:
    """Headless chromium emulating a 390x844 phone (touch, its viewport meta honoured)."""
    with chromium.running(chromium.PHONE, mobile=True) as found:
        yield found


@pytest.fixture
def custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


@pytest.fixture
def aw_namespace(core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, namespace: str) -> Iterator[str]:
    yield namespace
    # Free the capacity before the next test measures it: AppWrappers go, and their pods with them.
    custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, 60, f"pods in {namespace} to go away")


def free_cpu_millis(core: k8s.CoreV1Api) -> int:
    """Allocatable cpu of Ready, schedulable nodes minus requests of their non-terminal pods."""
    from mcad.api.views import node_view, pod_view

    client = k8s.ApiClient()
    nodes = {n["metadata"]["name"]: node_view(n) for n in
             (client.sanitize_for_serialization(x) for x in core.list_node().items)}
    free = sum(n.allocatable.get("cpu") for n in nodes.values() if n.schedulable)
    for raw in core.list_pod_for_all_namespaces().items:
        pod = pod_view(client.sanitize_for_serialization(raw))
        if pod.node_name in nodes and nodes[pod.node_name].schedulable and not pod.terminal:
            free -= pod.requests.get("cpu")
    return free


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The current AppWrapper status condition of ``type_`` (its latest entry; earlier ones are history), if any."""
    return next((c for c in reversed(status.get("conditions") or []) if c["type"] == type_), None)


def conditions_of(status: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    """Every entry of ``type_`` in the status's condition log, oldest first."""
    return [c for c in status.get("conditions") or [] if c["type"] == type_]


def blocked_on(message: str, resource: str) -> bool:
    """Whether a Backoff message names ``resource`` as what is short, in either fit mode: "short of cpu ..."
    (--fit=aggregate) or "... too little cpu free ..." (--fit=nodes)."""
    return f"short of {resource}" in message or f"too little {resource} free" in message


def appwrapper(name: str, *items: dict[str, Any], priority: int | None = None,
               scheduling: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"GenericItems": list(items)}}
    if priority is not None:
        spec["priority"] = priority
    if scheduling:
        spec["schedulingSpec"] = scheduling
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AppWrapper", "metadata": {"name": name}, "spec": spec}


def deployment_item(name: str, replicas: int, cpu: str, memory: str = "64Mi", **item: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {"replicas": 1, **item, "generictemplate": {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "main", "image": "kicbase/echo-server:1.0",
                                     "resources": {"requests": {"cpu": cpu, "memory": memory},
                                                   "limits": {"cpu": cpu, "memory": memory}}}]}}}}}


def job_item(name: str, parallelism: int, cpu: str, *, duration: str = "1s", **item: Any) -> dict[str, Any]:
    return {"replicas": 1, **item, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": duration}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
                                                               "resources": {"requests": {"cpu": cpu}}}]}}}}}


class AppWrappers:
    """Create, read and wait on AppWrappers in one namespace."""

    def __init__(self, custom: k8s.CustomObjectsApi, core: k8s.CoreV1Api, namespace: str,
                 connection: kube.Connection) -> None:
        self.connection = connection
        self.client = kube.Client(connection)  # caches discovery across calls
        self.custom = custom
        self.core = core
        self.namespace = namespace

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)  # type: ignore[no-any-return]

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)  # type: ignore[no-any-return]

    def absent(self, name: str) -> bool:
        """Whether the API server has no AppWrapper ``name`` (deleted, its finalizers done)."""
        try:
            self.get(name)
        except k8s.ApiException as err:
            if err.status == 404:
                return True
            raise
        return False

    def uid(self, name: str) -> str:
        return str(self.get(name)["metadata"]["uid"])

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def exists(self, api_version: str, kind: str, name: str) -> bool:
        """Whether a wrapped object of any kind exists in the namespace."""
        path = self.client.object_path(api_version, kind, self.namespace, name)
        try:
            kube.request_json(self.connection, "GET", path)
        except kube.ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def wait_state(self, name: str, state: str, timeout: float = 60) -> dict[str, Any]:
        return wait_until(lambda: (s := self.status(name)).get("state") == state and s, timeout,
                          f"AppWrapper {name} state {state}")

    def pods(self, name: str, phase: str | None = None) -> list[Any]:
        pods = self.core.list_namespaced_pod(self.namespace,
                                             label_selector=f"workload.codeflare.dev/appwrapper={name}").items
        return [p for p in pods if phase is None or p.status.phase == phase]

    def wait_pods(self, name: str, count: int, phase: str = "Running", timeout: float = 60) -> list[Any]:
        def enough() -> list[Any] | None:
            pods = self.pods(name, phase)
            return pods if len(pods) >= count else None

        return wait_until(enough, timeout, f"{count} {phase} pods of {name}")


@pytest.fixture
def aws(custom: k8s.CustomObjectsApi, core: k8s.CoreV1Api, aw_namespace: str, kubeconfig: str) -> AppWrappers:
    return AppWrappers(custom, core, aw_namespace, kube.connect(kubeconfig))


# Pins pods to a node made by fake_node (each node gets its own value).
NODE_LABEL = "mcad.test/node"


@contextlib.contextmanager
def fake_node(core: k8s.CoreV1Api, *, labels: Mapping[str, str] | None = None,
              **resources: str) -> Iterator[dict[str, str]]:
    """A fake (kwok) node with exactly ``resources`` (and ``labels`` besides its own); yields the nodeSelector that
    pins pods to it."""
    tag = uuid.uuid4().hex[:6]
    name = f"mcad-test-node-{tag}"
    capacity = {"pods": "110", **{("nvidia.com/gpu" if k == "gpu" else k): v for k, v in resources.items()}}
    core.create_node({"metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                   "labels": {**(labels or {}), "mcad.test/owned": "true", NODE_LABEL: tag}},
                      "status": {"capacity": capacity, "allocatable": capacity}})
    try:
        wait_until(lambda: any(c.type == "Ready" and c.status == "True"
                               for c in core.read_node(name).status.conditions or []), 60, f"node {name} Ready")
        yield {NODE_LABEL: tag}
    finally:
        delete_fake_node(core, name)


def delete_fake_node(core: k8s.CoreV1Api, name: str) -> None:
    """Delete a test's fake node and force-delete the pods still bound to it.

    Once the node is gone kwok no longer finishes those pods' deletion, and the pod garbage collector removes such
    orphans only after a 40 s quarantine checked every 20 s: up to a minute during which the namespace a test
    leaves behind cannot empty, which overran the 60 s its teardown waits (a CI run failed so). Removing them at
    once is what that collector would do, without the wait."""
    core.delete_node(name)
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
        try:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        except k8s.ApiException as error:
            if error.status != 404:  # 404: gone already, its owner or the collector was faster
                raise


def pinned(item: dict[str, Any], selector: Mapping[str, str]) -> dict[str, Any]:
    """A GenericItem whose pods can only run on the node ``selector`` selects."""
    item["generictemplate"]["spec"]["template"]["spec"]["nodeSelector"] = dict(selector)
    return item
