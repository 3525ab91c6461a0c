"""Two controller processes with --leader-elect: only the leader dispatches, a standby takes over a killed or
stopped leader in bounded time, a replaced leader exits, and no AppWrapper is ever dispatched twice.

Both processes run as the chart's ServiceAccount (``controller_kubeconfig``), so passing proves the chart's
Role on the Lease is enough. Takeover times are read from the standby's own log timestamps ("became leader")
against the wall time the leader was signalled (same machine, same clock).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test import chart
from test.e2e.conftest import (
    DEBUG_VIEWER,
    LOGS,
    METRICS_READER,
    AppWrappers,
    Controller,
    appwrapper,
    deployment_item,
    service_account_token,
)
from test.e2e.dashboard import host_ip
from test.support import token_kubeconfig, wait_until

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5
ARGS = ("--leader-elect", "--leader-elect-namespace", chart.NAMESPACE,
        "--leader-elect-lease-duration", str(LEASE_DURATION), "--leader-elect-renew-deadline", str(RENEW_DEADLINE),
        "--leader-elect-retry-period", str(RETRY_PERIOD))
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{chart.NAMESPACE}/leases/{chart.LEASE}"
# Process scheduling and request latency on a busy 2-core machine, on top of the protocol's bounds.
SLACK = 0.5


def events(log: Path, event: str) -> list[tuple[datetime, list[str]]]:
    """The lines of a console-format controller log whose event is exactly ``event``: (timestamp, key=value
    tokens)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        stamp, _, rest = line.partition(" [")
        _level, _, message = rest.partition("] ")
        if message == event or message.startswith(event + " "):
            try:
                found.append((datetime.fromisoformat(stamp), message[len(event):].split()))
            except ValueError:
                continue
    return found


def dispatched(log: Path) -> list[str]:
    """The AppWrappers (``ns/name``) a controller's log says it dispatched, once per dispatch."""
    return [token.removeprefix("appwrapper=") for _, tokens in events(log, "dispatched") for token in tokens
            if token.startswith("appwrapper=")]


def became_leader_at(ctl: Controller, timeout: float) -> float:
    """Wait for "became leader" in ``ctl``'s log; its wall time (epoch seconds)."""
    return wait_until(lambda: (found := events(ctl.log, "became leader")) and found[-1][0].timestamp(), timeout,
                      f"{ctl.log.name} to become leader")


@pytest.fixture
def admin(kubeconfig: str) -> kube.Connection:
    return kube.connect(kubeconfig)


@contextlib.contextmanager
def leader_and_standby(controller_kubeconfig: str, admin: kube.Connection, stem: str = "test_leader_election",
                       leader_args: tuple[str, ...] = (), args: tuple[str, ...] = ()
                       ) -> Iterator[tuple[Controller, Controller]]:
    """Controller ``a`` started first (it leads, with ``leader_args`` too), then ``b`` (a standby), both with
    ``args``, on a Lease no earlier test holds; both stopped on the way out. Logs: .dev/e2e-logs/<stem>-a.log and
    -b.log."""
    try:
        kube.request_json(admin, "DELETE", LEASE_PATH)
    except kube.ApiError as err:
        if err.status != 404:
            raise
    a = Controller(controller_kubeconfig, LOGS / f"{stem}-a.log", *ARGS, *args, *leader_args)
    b = Controller(controller_kubeconfig, LOGS / f"{stem}-b.log", *ARGS, *args)
    for ctl in (a, b):
        ctl.log.unlink(missing_ok=True)
    try:
        a.start()
        b.start(ready=b"waiting for leadership")
        yield a, b
    finally:
        b.stop()
        a.stop()


@pytest.fixture
def pair(controller_kubeconfig: str, crd: None, admin: kube.Connection) -> Iterator[tuple[Controller, Controller]]:
    with leader_and_standby(controller_kubeconfig, admin) as both:
        yield both


def deployment_uid(aws: AppWrappers, name: str) -> str:
    return str(k8s.AppsV1Api(aws.custom.api_client).read_namespaced_deployment(name, aws.namespace).metadata.uid)


def test_only_the_leader_dispatches_and_a_standby_takes_over_a_killed_leader(
        pair: tuple[Controller, Controller], aws: AppWrappers) -> None:
    a, b = pair
    first = [f"le-a-{i}" for i in range(3)]
    for name in first:
        aws.create(appwrapper(name, deployment_item(name, 1, "100m")))
    for name in first:
        aws.wait_state(name, "Running")
    assert sorted(dispatched(a.log)) == sorted(f"{aws.namespace}/{n}" for n in first)
    assert dispatched(b.log) == [] and not events(b.log, "dispatcher started")
    stamps = {n: aws.status(n)["controllerfirstdispatchtimestamp"] for n in first}
    uids = {n: deployment_uid(aws, n) for n in first}

    killed_at = time.time()
    a.stop(signal.SIGKILL)
    took = became_leader_at(b, LEASE_DURATION + RETRY_PERIOD + 10) - killed_at
    print(f"standby took over {took:.2f} s after SIGKILL of the leader "
          f"(lease {LEASE_DURATION} s, retry {RETRY_PERIOD} s)")
    # Not before the killed leader's claim lapsed (its last renewal was at most a retry period before the kill),
    # and no later than a lease duration plus one poll.
    assert LEASE_DURATION - RETRY_PERIOD - 0.1 <= took <= LEASE_DURATION + RETRY_PERIOD + SLACK, took

    second = [f"le-b-{i}" for i in range(3)]
    for name in second:
        aws.create(appwrapper(name, deployment_item(name, 1, "100m")))
    for name in second:
        aws.wait_state(name, "Running")
    assert sorted(dispatched(b.log)) == sorted(f"{aws.namespace}/{n}" for n in second)
    every = dispatched(a.log) + dispatched(b.log)
    assert sorted(every) == sorted(f"{aws.namespace}/{n}" for n in first + second), "dispatched twice or never"
    for name in first:
        assert aws.status(name)["controllerfirstdispatchtimestamp"] == stamps[name], f"{name} dispatched again"
        assert deployment_uid(aws, name) == uids[name], f"{name}'s Deployment was re-created"


def test_sigterm_of_the_leader_hands_over_at_once(pair: tuple[Controller, Controller], aws: AppWrappers) -> None:
    a, b = pair
    stopped_at = time.time()
    a.stop(signal.SIGTERM)
    assert a.proc is not None and a.proc.returncode == 0
    assert events(a.log, "released leadership")
    took = became_leader_at(b, 10) - stopped_at
    print(f"standby took over {took:.2f} s after SIGTERM of the leader (retry {RETRY_PERIOD} s)")
    assert took <= RETRY_PERIOD + SLACK, took
    aws.create(appwrapper("le-after-handover", deployment_item("le-after-handover", 1, "100m")))
    aws.wait_state("le-after-handover", "Running")
    assert dispatched(b.log) == [f"{aws.namespace}/le-after-handover"]
    assert dispatched(a.log) == []


def webhook_answer(port: int) -> bytes:
    """The raw answer of a controller's webhook port to a POST that is not an AdmissionReview (400)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
        return answer


def test_sigterm_hands_over_at_once_then_drains_the_webhooks_until_a_second_signal(
        controller_kubeconfig: str, crd: None, admin: kube.Connection) -> None:
    """The Service keeps sending reviews to a terminating pod until the endpoint change spreads: its webhooks
    answer on (each answer closing its connection) after leadership has gone to the standby, /readyz fails, and the
    process exits at the end of --webhook-drain-seconds, or at a second signal."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    own_port = (*chart.webhook_args(port), "--webhook-drain-seconds", "60")
    with leader_and_standby(controller_kubeconfig, admin, "test_leader_election-drain", own_port) as (a, b):
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        became_leader_at(b, 10)
        wait_until(lambda: events(a.log, "draining the webhooks"), 30, "the old leader to drain its webhooks")
        answer = webhook_answer(port)
        assert answer.startswith(b"HTTP/1.1 400 ") and b"\r\nConnection: close\r\n" in answer, answer
        status, body = a.get("/readyz", token=None)
        assert status == 503 and "shutting down" in body, (status, body)
        assert a.proc.poll() is None, "still draining"
        a.proc.send_signal(signal.SIGTERM)
        assert a.proc.wait(timeout=30) == 0


def test_a_leader_whose_lease_is_taken_exits_at_once_with_an_error(pair: tuple[Controller, Controller],
                                                                   admin: kube.Connection) -> None:
    a, b = pair
    lease = kube.request_json(admin, "GET", LEASE_PATH)
    assert str(lease["spec"]["holderIdentity"]).rsplit("_", 1)[0]  # <hostname>_<random>
    lease["spec"]["holderIdentity"] = "someone-else"
    taken_at = time.monotonic()
    kube.request_json(admin, "PUT", LEASE_PATH, body=lease)
    assert a.proc is not None
    assert a.proc.wait(timeout=RETRY_PERIOD + SLACK + 10) == 1
    assert time.monotonic() - taken_at <= RETRY_PERIOD + SLACK + 1  # process exit included
    assert events(a.log, "lost leadership")
    # The standby respects the new holder's claim until it lapses, then leads.
    assert not events(b.log, "became leader")
    became_leader_at(b, LEASE_DURATION + RETRY_PERIOD + 10)


LEADER_LABEL = "mcad.codeflare.dev/leader"  # mcad.k8s.leaderpod.LEADER_LABEL, spelled out: the chart's Service uses it


def leader_label(admin: kube.Connection, pod: str) -> str | None:
    found = kube.request_json(admin, "GET", f"/api/v1/namespaces/{chart.NAMESPACE}/pods/{pod}")
    return ((found.get("metadata") or {}).get("labels") or {}).get(LEADER_LABEL)


def test_the_leader_labels_its_own_pod_for_the_leader_service_and_hands_the_label_over(
        controller_kubeconfig: str, crd: None, admin: kube.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's Service <name>-leader selects the pod labelled by the leader, so users reach it with
    services/proxy and no pods/proxy. As the chart's ServiceAccount (its Role may patch pods of its namespace): the
    leader labels its pod, a standby removes a label its pod kept from an earlier container, and on SIGTERM the
    label moves to the new leader's pod."""
    try:
        kube.request_json(admin, "DELETE", LEASE_PATH)
    except kube.ApiError as err:
        if err.status != 404:
            raise
    pods = ("mcad-leader-label-a", "mcad-leader-label-b")
    for pod in pods:  # stand-ins of the controller's pods, never scheduled
        kube.request_json(admin, "POST", f"/api/v1/namespaces/{chart.NAMESPACE}/pods", body={
            "metadata": {"name": pod, "labels": {LEADER_LABEL: "true"} if pod.endswith("-b") else {}},
            "spec": {"schedulerName": "none", "containers": [{"name": "controller", "image": "mcad"}]}})
    args = (*ARGS, "--leader-elect-label-pod")
    a = Controller(controller_kubeconfig, LOGS / "test_leader_election-label-a.log", *args)
    b = Controller(controller_kubeconfig, LOGS / "test_leader_election-label-b.log", *args)
    monkeypatch.setenv("POD_NAMESPACE", chart.NAMESPACE)
    try:
        monkeypatch.setenv("POD_NAME", pods[0])
        a.start()
        monkeypatch.setenv("POD_NAME", pods[1])
        b.start(ready=b"waiting for leadership")
        wait_until(lambda: (leader_label(admin, pods[0]), leader_label(admin, pods[1])) == ("true", None), 15,
                   "the leader's pod labelled and the standby's stale label removed")
        a.stop(signal.SIGTERM)
        wait_until(lambda: (leader_label(admin, pods[0]), leader_label(admin, pods[1])) == (None, "true"), 15,
                   "the label moved to the new leader's pod")
        assert b"cannot write the leader label" not in a.log.read_bytes() + b.log.read_bytes()
    finally:
        b.stop()
        a.stop()
        for pod in pods:
            try:
                kube.request_json(admin, "DELETE", f"/api/v1/namespaces/{chart.NAMESPACE}/pods/{pod}",
                                  body={"gracePeriodSeconds": 0})
            except kube.ApiError as err:
                if err.status != 404:
                    raise


def test_leader_elect_label_pod_needs_a_pod_name(controller_kubeconfig: str, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    ctl = Controller(controller_kubeconfig, tmp_path / "no-pod.log", *ARGS, "--leader-elect-label-pod")
    ctl.launch()
    assert ctl.proc is not None and ctl.proc.wait(timeout=60) == 2
    assert b"--leader-elect-label-pod needs --leader-elect and $POD_NAME" in ctl.log.read_bytes()


def test_a_debug_client_reaches_the_leader_through_the_charts_leader_service(
        controller_kubeconfig: str, kubeconfig: str, crd: None, admin: kube.Connection,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The whole route to the leader without pods/proxy, with the chart's own objects: the controller (as the chart's
    ServiceAccount) leads and labels its pod; the chart's Service mcad-controller-leader selects that pod (the endpoints
    controller fills it in); a user bound only to the chart's Role mcad-debug-client (and the reader ClusterRoles) runs
    mcadctl through the API server and reaches that controller, and may not proxy to the pod itself. The pod is a
    stand-in at this machine's address, bound to a Node object of its own (the endpoints controller skips pods of
    unknown nodes), with the port the chart's Service targets (named http)."""
    try:
        kube.request_json(admin, "DELETE", LEASE_PATH)
    except kube.ApiError as err:
        if err.status != 404:
            raise
    ip, pod, node = host_ip(), "mcad-controller-standin", f"mcad-leader-svc-{uuid.uuid4().hex[:6]}"
    with socket.socket() as sock:
        sock.bind((ip, 0))
        port = int(sock.getsockname()[1])
    pods = f"/api/v1/namespaces/{chart.NAMESPACE}/pods"
    selector = {"app.kubernetes.io/name": "mcad", "app.kubernetes.io/instance": chart.RELEASE,
                "app.kubernetes.io/component": "controller"}
    kube.request_json(admin, "POST", "/api/v1/nodes", body={"metadata": {"name": node}})
    kube.request_json(admin, "POST", pods, body={
        "metadata": {"name": pod, "labels": selector},
        "spec": {"nodeName": node, "containers": [{"name": "controller", "image": "mcad",
                                                   "ports": [{"name": "http", "containerPort": port}]}]}})
    kube.request_json(admin, "PATCH", f"{pods}/{pod}/status", content_type="application/merge-patch+json", body={
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    monkeypatch.setenv("POD_NAME", pod)
    monkeypatch.setenv("POD_NAMESPACE", chart.NAMESPACE)
    ctl = Controller(controller_kubeconfig, LOGS / "test_leader_election-leader-service.log", *ARGS,
                     "--leader-elect-label-pod", "--http-bind-address", f"{ip}:{port}")
    ctl.log.unlink(missing_ok=True)
    try:
        ctl.start()
        endpoints = f"/api/v1/namespaces/{chart.NAMESPACE}/endpoints/{chart.LEASE}-leader"

        def leader_endpoint() -> bool:
            try:
                subsets = kube.request_json(admin, "GET", endpoints).get("subsets") or []
            except kube.ApiError:
                return False
            return any(a.get("ip") == ip for s in subsets for a in s.get("addresses") or [])

        wait_until(leader_endpoint, 30, "the chart's leader Service to select the labelled pod")
        token = service_account_token(kubeconfig, chart.NAMESPACE, "debug-client-e2e",
                                      cluster_roles=(DEBUG_VIEWER, METRICS_READER))
        kube.Client(admin).apply({  # the chart's Role itself, bound as the README says
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "debug-client-e2e", "namespace": chart.NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": f"{chart.RELEASE}-debug-client"},
            "subjects": [{"kind": "ServiceAccount", "name": "debug-client-e2e", "namespace": chart.NAMESPACE}]},
            field_manager="mcad-e2e", force=True)
        user = token_kubeconfig(kubeconfig, token, tmp_path / "debug-client.kubeconfig", user="debug-client")
        result = subprocess.run([str(Path(sys.executable).parent / "mcadctl"), "--kubeconfig", user,
                                 "--controller-namespace", chart.NAMESPACE, "ledger", "-o", "json"],
                                capture_output=True, text=True, timeout=60, check=False,
                                env={k: v for k, v in os.environ.items() if k != "MCAD_TOKEN"})
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["controller"]["identity"].startswith(f"{pod}_")
        with pytest.raises(kube.ApiError) as refused:
            kube.request_json(kube.connect(user), "GET", f"{pods}/{pod}:{port}/proxy/healthz")
        assert refused.value.status == 403, refused.value
    finally:
        ctl.stop()
        for path in (f"{pods}/{pod}", f"/api/v1/nodes/{node}"):
            try:
                kube.request_json(admin, "DELETE", path, body={"gracePeriodSeconds": 0})
            except kube.ApiError as err:
                if err.status != 404:
                    raise
