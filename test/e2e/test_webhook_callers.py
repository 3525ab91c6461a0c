"""The webhook knows who calls, and an unauthenticated caller's cost is bounded: against the real API server.

With webhook client authentication on (``--webhook-client-ca`` with ``--webhook-client-name``, or
``--webhook-token-file``), the real API server, started by hack/localcluster.py with an admission configuration
that gives it a client certificate and a token for the webhook host 127.0.0.1:<reserved port>, is admitted: a
tenant's AppWrapper create succeeds. A forged AdmissionReview sent straight to the webhook port without those
credentials (or with another client certificate of the same CA) is refused 401 and issues no SubjectAccessReview.
The webhooks are a second release of the chart (``mcad-callers``) registered by URL at that port, for this module's
namespaces only.

With authentication off, a flood of forged reviews with fresh users raises the API server's SubjectAccessReview
count (``apiserver_request_total``) by at most the configured bound, and random bearer tokens on /metrics cause at
most the configured number of TokenReviews.

With authentication off and the API server's address given (``--api-server-cidrs 127.0.0.1/32``: the local API
server calls the webhook from there), forged reviews from three other loopback addresses (127.0.0.2-4, the
attacker's sockets bound to them) use up the shared SubjectAccessReview total, and a tenant's create through the
API server is still admitted; without the address (the control), the same flood gets that create refused "too
many access reviews from all sources at once". Either way the refused forged reviews are a bounded number of log
lines: one in full and one counted line per source per minute.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import http.client
import json
import os
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.admission import certs
from mcad.k8s import kube
from test import chart
from test.apiserver import request_totals
from test.e2e.conftest import LOGS, AppWrappers, Controller, free_port, running_controller
from test.e2e.test_admission import account, kubectl, token_kubeconfig
from test.escalations import APPWRAPPER_RIGHTS
from test.support import REPO, wait_until

RELEASE = "mcad-callers"
WEBHOOK_RELEASE = RELEASE  # this module's namespaces go through this release's webhooks (conftest)
# The flood's bounds: small, so a flood of a few seconds is far over them.
REVIEWS_PER_SECOND, REVIEWS_BURST = 1, 10
TOKENS_PER_SECOND, TOKENS_BURST = 1, 5


def client_credentials() -> dict[str, Any]:
    """What hack/localcluster.py gave the API server for the webhook at 127.0.0.1:<port> (state.json)."""
    if os.environ.get("MCAD_TEST_KUBECONFIG") or os.environ.get("KUBECONFIG"):
        pytest.skip("the API server's webhook client credentials are set up by hack/localcluster.py only")
    state = json.loads((REPO / ".dev" / "clusters" / "mcad" / "state.json").read_text())
    found = state.get("webhook_client")
    assert found, ("the local cluster was started without webhook client credentials (an older "
                   "hack/localcluster.py?): run `hack/local-cluster.sh down` and run the tests again")
    return dict(found)


@pytest.fixture(scope="module")
def credentials() -> dict[str, Any]:
    return client_credentials()


@pytest.fixture(scope="module")
def release_kubeconfig(kubeconfig: str, crd: None, credentials: dict[str, Any],
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chart installed again as ``mcad-callers`` (in its own namespace), its webhooks registered at the port the
    API server has credentials for; a kubeconfig acting as its ServiceAccount."""
    admin = kube.connect(kubeconfig)
    wait_until(lambda: namespace_gone(admin), 120, f"namespace {RELEASE} of an earlier run to be deleted")
    values = {**chart.E2E_VALUES, **chart.webhook_values(credentials["port"], RELEASE)}
    path = chart.install(kubeconfig, tmp_path_factory.mktemp("callers-chart"), release=RELEASE, namespace=RELEASE,
                         values=values)
    try:
        yield path
    finally:
        chart.helm("uninstall", RELEASE, "--namespace", RELEASE, "--wait", kubeconfig=kubeconfig)
        kube.request_json(admin, "DELETE", f"/api/v1/namespaces/{RELEASE}")
        wait_until(lambda: namespace_gone(admin), 120, f"namespace {RELEASE} to be deleted")


def namespace_gone(admin: kube.Connection) -> bool:
    """Whether the release's namespace is gone (one still terminating refuses the next install)."""
    try:
        kube.request_json(admin, "GET", f"/api/v1/namespaces/{RELEASE}")
    except kube.ApiError as err:
        if err.status == 404:
            return True
        raise
    return False


@contextlib.contextmanager
def authenticated_controller(release_kubeconfig: str, credentials: dict[str, Any], name: str,
                             *auth: str) -> Iterator[Controller]:
    args = (*chart.webhook_args(credentials["port"], RELEASE), "--webhook-cert-namespace", RELEASE, *auth)
    with running_controller(release_kubeconfig, LOGS / f"test_webhook_callers-{name}.log", *args) as ctl:
        yield ctl


def insecure_context() -> ssl.SSLContext:
    """An attacker's client: it does not care whom it talks to."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def forged_review(namespace: str, user: str, item_kind: str = "ConfigMap") -> dict[str, Any]:
    """What the issue's oracle sent: any user, any namespace, asking whether that user may create a kind."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "operation": "CREATE", "namespace": namespace, "name": "forged",
        "kind": {"group": "workload.codeflare.dev", "version": "v1beta1", "kind": "AppWrapper"},
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                   "metadata": {"name": "forged", "namespace": namespace},
                   "spec": {"resources": {"GenericItems": [{"generictemplate": {
                       "apiVersion": "v1", "kind": item_kind, "metadata": {"name": "cm"}}}]}}}}}


def post_review(port: int, body: dict[str, Any], *, context: ssl.SSLContext | None = None,
                headers: dict[str, str] | None = None, source: str | None = None) -> tuple[int, dict[str, Any]]:
    """``source``: the local address the attacker's socket binds (another loopback address than the API
    server's 127.0.0.1)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context or insecure_context(), timeout=30,
                                       source_address=(source, 0) if source else None)
    try:
        conn.request("POST", "/validate", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def access_reviews(api: k8s.ApiClient) -> float:
    return request_totals(api).count(resource="subjectaccessreviews", verb="POST")


def token_reviews(api: k8s.ApiClient) -> float:
    return request_totals(api).count(resource="tokenreviews", verb="POST")


class Tenant:
    """A ServiceAccount of the test's namespace holding AppWrapper rights and, if ``configmaps``, the right to
    create ConfigMaps (so an AppWrapper of a ConfigMap is theirs to create)."""

    def __init__(self, kubeconfig: str, namespace: str, name: str, tmp: Path, *, configmaps: bool) -> None:
        admin = kube.connect(kubeconfig)
        rules = APPWRAPPER_RIGHTS + ([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]
                                     if configmaps else [])
        account(admin, namespace, name, rules)
        self.user = f"system:serviceaccount:{namespace}:{name}"
        self.kubeconfig = token_kubeconfig(kubeconfig, admin, namespace, name, tmp / name)


def configmap_appwrapper(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"resources": {"GenericItems": [{"generictemplate": {
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}}]}}}


def waited(check: Callable[[], bool], what: str, seen: list[str]) -> None:
    """``wait_until`` 60 s, failing with the last kubectl error seen."""
    try:
        wait_until(check, 60, what)
    except AssertionError as err:
        raise AssertionError(f"{err}; kubectl said last: {seen[-1:]}") from None


def create_as(tenant: Tenant, namespace: str, name: str) -> None:
    """The tenant's ``kubectl create`` of an AppWrapper, retried only while the API server cannot call the webhook
    yet (the CA bundle is patched in within a poll of the controller's certificate loop)."""
    seen: list[str] = []

    def created() -> bool:
        proc = kubectl(tenant.kubeconfig, "create", configmap_appwrapper(namespace, name))
        if proc.returncode == 0:
            return True
        seen.append(proc.stderr)
        assert "failed calling webhook" in proc.stderr, proc.stderr  # anything else is the answer
        return False

    waited(created, f"the tenant's create of {name} through the webhooks", seen)


def assert_api_server_admitted_and_forgery_refused(ctl: Controller, aws: AppWrappers, kubeconfig: str,
                                                   credentials: dict[str, Any], api: k8s.ApiClient,
                                                   tmp_path: Path) -> None:
    carol = Tenant(kubeconfig, aws.namespace, "carol", tmp_path, configmaps=True)
    create_as(carol, aws.namespace, "by-carol")
    aws.wait_state("by-carol", "Running")
    created = aws.get("by-carol")
    assert created["metadata"]["annotations"]["workload.codeflare.dev/creator"] == carol.user  # mutated by us
    # The validating webhook still judges: a tenant without the right to create ConfigMaps is refused.
    alice = Tenant(kubeconfig, aws.namespace, "alice", tmp_path, configmaps=False)
    proc = kubectl(alice.kubeconfig, "create", configmap_appwrapper(aws.namespace, "by-alice"))
    assert proc.returncode != 0
    assert f'user "{alice.user}" may not create configmaps in namespace {aws.namespace}' in proc.stderr, proc.stderr

    before = access_reviews(api)
    status, answer = post_review(credentials["port"], forged_review(aws.namespace, f"oracle-{uuid.uuid4().hex}"))
    assert status == 401, answer
    assert answer["error"].startswith("the webhook's caller is not authenticated"), answer
    assert access_reviews(api) == before  # refused before a single question was asked
    assert b"webhook caller refused" in ctl.log.read_bytes()


def test_with_client_certificates_the_api_server_is_admitted_and_a_forged_review_refused_unreviewed(
        release_kubeconfig: str, credentials: dict[str, Any], aws: AppWrappers, kubeconfig: str,
        api: k8s.ApiClient, tmp_path: Path) -> None:
    with authenticated_controller(release_kubeconfig, credentials, "certificate",
                                  "--webhook-client-ca", credentials["ca"],
                                  "--webhook-client-name", credentials["name"]) as ctl:
        assert_api_server_admitted_and_forgery_refused(ctl, aws, kubeconfig, credentials, api, tmp_path)
        # The cluster CA signs the admin's client certificate too: it is not the API server's name.
        admin_cert = Path(credentials["ca"]).parent
        context = insecure_context()
        context.load_cert_chain(str(admin_cert / "admin.crt"), str(admin_cert / "admin.key"))
        before = access_reviews(api)
        status, answer = post_review(credentials["port"], forged_review(aws.namespace, "oracle"), context=context)
        assert status == 401, answer
        assert "names mcad-dev-admin, not an allowed webhook client" in answer["error"], answer
        assert access_reviews(api) == before


def test_with_a_shared_token_the_api_server_is_admitted_and_a_forged_review_refused_unreviewed(
        release_kubeconfig: str, credentials: dict[str, Any], aws: AppWrappers, kubeconfig: str,
        api: k8s.ApiClient, tmp_path: Path) -> None:
    with authenticated_controller(release_kubeconfig, credentials, "token",
                                  "--webhook-token-file", credentials["token_file"]) as ctl:
        assert_api_server_admitted_and_forgery_refused(ctl, aws, kubeconfig, credentials, api, tmp_path)
        before = access_reviews(api)
        status, answer = post_review(credentials["port"], forged_review(aws.namespace, "oracle"),
                                     headers={"Authorization": "Bearer guessed"})
        assert status == 401 and "not the webhook client token" in answer["error"], answer
        assert access_reviews(api) == before


def test_a_webhook_expecting_another_client_refuses_the_api_server_and_the_create_fails_closed(
        release_kubeconfig: str, credentials: dict[str, Any], aws: AppWrappers, kubeconfig: str,
        tmp_path: Path) -> None:
    """The control: the API server's certificate is what got it in above, not something else letting all through."""
    with authenticated_controller(release_kubeconfig, credentials, "other-name",
                                  "--webhook-client-ca", credentials["ca"], "--webhook-client-name", "not-the-api"):
        carol = Tenant(kubeconfig, aws.namespace, "carol", tmp_path, configmaps=True)
        seen: list[str] = []

        def refused_by_us() -> bool:
            proc = kubectl(carol.kubeconfig, "create", configmap_appwrapper(aws.namespace, "by-carol"))
            assert proc.returncode != 0, "admitted though the webhook accepts no such client"
            seen.append(proc.stderr)
            return "the server has asked for the client to provide credentials" in proc.stderr  # a 401, in Go

        waited(refused_by_us, "the create to fail on the webhook's 401", seen)
        assert "failed calling webhook" in seen[-1], seen[-1]
        with pytest.raises(k8s.exceptions.ApiException, match="Not Found"):
            aws.get("by-carol")


# ---------------------------------------------------------------------------------------------- bounded cost


@pytest.fixture(scope="module")
def bounded(controller_kubeconfig: str, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    """A controller with authentication off and small bounds, its webhook on a port of its own (registered
    nowhere: only forged reviews reach it), serving a certificate it was given."""
    cert_dir = tmp_path_factory.mktemp("bounded-cert")
    material = certs.issue(("127.0.0.1",), datetime.datetime.now(datetime.UTC))
    (cert_dir / "tls.crt").write_bytes(material.cert)
    (cert_dir / "tls.key").write_bytes(material.key)
    port = free_port()
    args = ("--webhook-bind-address", f"127.0.0.1:{port}", "--webhook-cert-dir", str(cert_dir),
            "--webhook-access-reviews-per-second", str(REVIEWS_PER_SECOND),
            "--webhook-access-reviews-burst", str(REVIEWS_BURST),
            "--unknown-tokens-per-second", str(TOKENS_PER_SECOND), "--unknown-tokens-burst", str(TOKENS_BURST))
    with running_controller(controller_kubeconfig, LOGS / "test_webhook_callers-bounded.log", *args) as ctl:
        ctl.webhook_port = port  # type: ignore[attr-defined]

        def answers() -> bool:
            try:
                return post_review(port, {})[0] == 400
            except OSError:
                return False

        wait_until(answers, 30, "the bounded controller's webhook to answer")
        yield ctl


def test_a_flood_of_forged_reviews_raises_access_reviews_by_at_most_the_bound(
        bounded: Controller, namespace: str, api: k8s.ApiClient) -> None:
    port = bounded.webhook_port  # type: ignore[attr-defined]
    before = access_reviews(api)
    started = time.monotonic()

    def forge(i: int) -> tuple[int, dict[str, Any]]:
        return post_review(port, forged_review(namespace, f"oracle-{i}-{uuid.uuid4().hex[:6]}"))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(forge, range(120)))
    elapsed = time.monotonic() - started
    sent = access_reviews(api) - before
    assert all(status == 200 for status, _ in answers), answers[:3]
    refused = [a["response"]["status"]["message"] for _, a in answers
               if "too many access reviews from 127.0.0.1; retry" in a["response"].get("status", {}).get("message",
                                                                                                       "")]
    assert refused, answers[:3]
    assert not any(a["response"]["allowed"] for _, a in answers if "too many" in json.dumps(a))  # never admitted
    bound = REVIEWS_BURST + REVIEWS_PER_SECOND * elapsed
    print(f"flood: {len(answers)} forged reviews in {elapsed:.2f} s, {sent:g} SubjectAccessReviews (bound "
          f"{bound:.1f}), {len(refused)} refused over the bound")
    assert 0 < sent <= bound, f"{sent} SubjectAccessReviews in {elapsed:.1f} s; the bound is {bound:.1f}"
    status, text = bounded.get("/metrics")
    assert status == 200, text
    assert f'mcad_caller_refusals_total{{endpoint="webhook",reason="access_reviews_source"}} {len(refused)}.0' in text


def test_random_bearer_tokens_on_metrics_cause_at_most_the_bounded_number_of_token_reviews(
        bounded: Controller, api: k8s.ApiClient) -> None:
    before = token_reviews(api)
    started = time.monotonic()

    def scrape(i: int) -> int:
        return bounded.get("/metrics", token=f"random-{i}-{uuid.uuid4().hex}")[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(scrape, range(100)))
    elapsed = time.monotonic() - started
    sent = token_reviews(api) - before
    assert set(statuses) <= {401, 503}, statuses
    assert statuses.count(503) > 0, statuses
    bound = TOKENS_BURST + TOKENS_PER_SECOND * elapsed
    print(f"tokens: {len(statuses)} random tokens in {elapsed:.2f} s, {sent:g} TokenReviews (bound {bound:.1f}), "
          f"{statuses.count(503)} answered 503 unreviewed")
    assert 0 < sent <= bound, f"{sent} TokenReviews in {elapsed:.1f} s; the bound is {bound:.1f}"
    assert statuses.count(401) == sent  # every token reviewed was refused by the API server; the rest never asked
    status, body = bounded.get("/metrics", token=f"random-{uuid.uuid4().hex}")
    assert status in (401, 503)
    if status == 503:
        assert "too many unknown tokens; retry" in body, body


# ------------------------------------------------------------------------------- the API server's own budget

# Small bounds, so that three forging addresses use up the shared total within a second.
TIGHT = ("--webhook-access-reviews-per-second", "0.1", "--webhook-access-reviews-burst", "5",
         "--webhook-access-reviews-total", "0.1")
ATTACKERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
# How long each flood goes on (the load, the same in both tests).
FLOOD_SECONDS = 20.0


class Flood:
    """Forged reviews with fresh users, sent back to back from each attacker address until ``stop``."""

    def __init__(self, port: int, namespace: str) -> None:
        self.port, self.namespace = port, namespace
        self.stop = threading.Event()
        self.sent = 0
        self.admitted = 0
        self.over_total = 0
        self._lock = threading.Lock()

    def run(self, source: str) -> None:
        while not self.stop.is_set():
            status, answer = post_review(self.port, forged_review(self.namespace, f"oracle-{uuid.uuid4().hex}"),
                                         source=source)
            assert status == 200, answer
            response = answer.get("response") or {}
            with self._lock:
                self.sent += 1
                self.admitted += bool(response.get("allowed"))
                self.over_total += "from all sources at once" in json.dumps(response)


@contextlib.contextmanager
def flooding(port: int, namespace: str) -> Iterator[Flood]:
    flood = Flood(port, namespace)
    with concurrent.futures.ThreadPoolExecutor(len(ATTACKERS)) as pool:
        running = [pool.submit(flood.run, source) for source in ATTACKERS]
        try:
            wait_until(lambda: flood.over_total > 0 or any(f.done() for f in running), 60,
                       "the forged reviews to use up the shared SubjectAccessReview total")
            for f in running:
                if f.done():
                    f.result()  # an attacker that failed says why
            yield flood
        finally:
            flood.stop.set()
    for f in running:
        f.result()


def refusal_lines(log: bytes) -> list[bytes]:
    """The log lines of the attackers' refused reviews: in full (``source=``) or counted (``reviews from``). Other
    refusals are not counted: this module's other controller writes AppWrapper status too, which these webhooks
    refuse (through the API server)."""
    marks = [mark for address in ATTACKERS
             for mark in (f"source={address}".encode(), f" reviews from {address} ".encode())]
    return [line for line in log.splitlines() if any(mark in line for mark in marks)]


def test_forged_reviews_from_elsewhere_cannot_spend_the_api_servers_access_reviews(
        release_kubeconfig: str, credentials: dict[str, Any], aws: AppWrappers, kubeconfig: str,
        tmp_path: Path) -> None:
    with authenticated_controller(release_kubeconfig, credentials, "api-server-cidrs", *TIGHT,
                                  "--api-server-cidrs", "127.0.0.1/32") as ctl:
        create_as(Tenant(kubeconfig, aws.namespace, "warm-up", tmp_path, configmaps=True), aws.namespace,
                  "warm-up")  # the webhooks are served (CA bundle patched in) before the flood starts
        start = len(ctl.log.read_bytes())
        started = time.monotonic()
        with flooding(credentials["port"], aws.namespace) as flood:
            for name in ("dave", "frank"):
                # A tenant the webhook has never seen (no cached answer): its create costs a SubjectAccessReview.
                tenant = Tenant(kubeconfig, aws.namespace, f"{name}-{uuid.uuid4().hex[:6]}", tmp_path,
                                configmaps=True)
                over_total_before = flood.over_total
                proc = kubectl(tenant.kubeconfig, "create", configmap_appwrapper(aws.namespace, f"by-{name}"))
                assert proc.returncode == 0, proc.stderr  # admitted under the flood
                created = aws.get(f"by-{name}")
                assert created["metadata"]["annotations"]["workload.codeflare.dev/creator"] == tenant.user
                assert flood.over_total > over_total_before  # the shared total was being refused meanwhile
                # The flood's length (its load, not a wait for something to happen).
                flood.stop.wait(max(0.0, started + FLOOD_SECONDS - time.monotonic()))
        elapsed = time.monotonic() - started
        assert flood.admitted == 0
        lines = refusal_lines(ctl.log.read_bytes()[start:])
        bound = len(ATTACKERS) * (2 + int(elapsed // 60))  # one in full, then one counted line per minute
        print(f"api-server-cidrs: {flood.sent} forged reviews from {len(ATTACKERS)} addresses in {elapsed:.1f} s "
              f"({flood.over_total} refused over the shared total), the tenant's create admitted; "
              f"{len(lines)} refusal log lines (bound {bound})")
        assert 0 < len(lines) <= bound, lines[:10]


def test_without_the_api_servers_address_the_same_flood_gets_a_tenants_create_refused(
        release_kubeconfig: str, credentials: dict[str, Any], aws: AppWrappers, kubeconfig: str,
        tmp_path: Path) -> None:
    """The control: what the flood does when no address is known to be the API server's."""
    with authenticated_controller(release_kubeconfig, credentials, "no-api-server-cidrs", *TIGHT) as ctl:
        create_as(Tenant(kubeconfig, aws.namespace, "warm-up", tmp_path, configmaps=True), aws.namespace,
                  "warm-up")
        start = len(ctl.log.read_bytes())
        started = time.monotonic()
        with flooding(credentials["port"], aws.namespace) as flood:
            erin = Tenant(kubeconfig, aws.namespace, f"erin-{uuid.uuid4().hex[:6]}", tmp_path, configmaps=True)
            proc = kubectl(erin.kubeconfig, "create", configmap_appwrapper(aws.namespace, "by-erin"))
            flood.stop.wait(max(0.0, started + FLOOD_SECONDS - time.monotonic()))  # as long as the other's
        elapsed = time.monotonic() - started
        assert proc.returncode != 0, "admitted: the flood did not reach the shared total"
        assert "too many access reviews from all sources at once (this one from 127.0.0.1); retry" in proc.stderr, \
            proc.stderr
        lines = refusal_lines(ctl.log.read_bytes()[start:])
        bound = len(ATTACKERS) * (2 + int(elapsed // 60))
        print(f"no api-server-cidrs: {flood.sent} forged reviews in {elapsed:.1f} s, the tenant's create refused; "
              f"{len(lines)} refusal log lines (bound {bound})")
        assert 0 < len(lines) <= bound, lines[:10]
