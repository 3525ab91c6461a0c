"""The webhook's HTTPS endpoint: TLS with the controller's CA, AdmissionReviews in and out, bounds on bodies."""

from __future__ import annotations

import datetime
import http.client
import json
import ssl
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from mcad.admission import callers, certs
from mcad.admission.facts import WouldAsk, only_at_hand
from mcad.admission.request import AdmissionRequest, Outcome
from mcad.admission.server import WebhookServer, max_body_bytes
from test.support import wait_until

HOSTS = ("127.0.0.1",)


def review_body(uid: str = "u-1", name: str = "aw") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "operation": "CREATE", "namespace": "team-a", "name": name,
        "kind": {"group": "workload.codeflare.dev", "version": "v1beta1", "kind": "AppWrapper"},
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                   "metadata": {"name": name, "namespace": "team-a"}, "spec": {}}}}


def mutate(request: AdmissionRequest) -> Outcome:
    return Outcome.allow(patch=[{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}])


def validate(request: AdmissionRequest) -> Outcome:
    if request.name == "boom":
        raise RuntimeError("a bug")
    if request.name == "bad":
        return Outcome.deny("item 0 (Pod p): alice may not create pods in team-a")
    return Outcome.allow()


class Loaded:
    def __init__(self, material: certs.Material | None) -> None:
        self.context = certs.server_context(material.cert, material.key) if material else None


@pytest.fixture
def material() -> certs.Material:
    return certs.issue(HOSTS, datetime.datetime.now(datetime.UTC))


@pytest.fixture
def tls(material: certs.Material) -> Loaded:
    return Loaded(material)


@pytest.fixture
def server(tls: Loaded) -> Iterator[WebhookServer]:
    srv = WebhookServer("127.0.0.1:0", tls=lambda: tls.context, mutate=mutate, validate=validate,
                        max_body_bytes=max_body_bytes(1024), read_timeout=2.0)
    srv.start()
    assert srv.listening.wait(5)
    yield srv
    srv.stop()


def client(server: WebhookServer, ca: bytes, tmp_path: Path) -> http.client.HTTPSConnection:
    bundle = tmp_path / "ca.crt"
    bundle.write_bytes(ca)
    context = ssl.create_default_context(cafile=str(bundle))
    return http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)


def post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_validate_and_mutate_answer_over_tls_verified_with_the_ca(server: WebhookServer, material: certs.Material,
                                                                 tmp_path: Path) -> None:
    conn = client(server, material.ca_bundle, tmp_path)
    status, answer = post(conn, "/validate", json.dumps(review_body("u-1")).encode())
    assert status == 200
    assert answer["response"] == {"uid": "u-1", "allowed": True}
    status, answer = post(conn, "/mutate", json.dumps(review_body("u-2")).encode())  # same connection, reused
    assert status == 200 and answer["response"]["patchType"] == "JSONPatch"


def test_no_session_ticket_is_issued(server: WebhookServer, material: certs.Material, tmp_path: Path) -> None:
    """No client of the webhook resumes a session (the API server keeps no session cache): tickets would be work
    for nothing on every new connection."""
    conn = client(server, material.ca_bundle, tmp_path)
    assert post(conn, "/validate", json.dumps(review_body("u-1")).encode())[0] == 200
    assert post(conn, "/validate", json.dumps(review_body("u-2")).encode())[0] == 200  # tickets would be read by now
    assert isinstance(conn.sock, ssl.SSLSocket) and conn.sock.version() == "TLSv1.3"
    session = conn.sock.session
    assert session is None or not session.has_ticket


def test_a_client_that_does_not_trust_the_ca_fails_the_handshake(server: WebhookServer, tmp_path: Path) -> None:
    other = certs.issue(HOSTS, datetime.datetime.now(datetime.UTC))
    conn = client(server, other.ca_bundle, tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        post(conn, "/validate", b"{}")


def test_garbage_is_400_with_a_message(server: WebhookServer, material: certs.Material, tmp_path: Path) -> None:
    status, answer = post(client(server, material.ca_bundle, tmp_path), "/validate", b"not json")
    assert status == 400 and "not an admission.k8s.io/v1 AdmissionReview" in answer["error"]
    status, answer = post(client(server, material.ca_bundle, tmp_path), "/validate", b'{"kind": "Pod"}')
    assert status == 400 and "request.uid is missing" in answer["error"]


def test_oversize_body_is_413_unread(server: WebhookServer, material: certs.Material, tmp_path: Path) -> None:
    conn = client(server, material.ca_bundle, tmp_path)
    conn.putrequest("POST", "/validate")
    conn.putheader("Content-Length", str(max_body_bytes(1024) + 1))
    conn.endheaders()  # the body is never sent: the answer comes before it
    response = conn.getresponse()
    assert response.status == 413 and "over the bound" in json.loads(response.read())["error"]


def test_a_refusal_is_answered_and_logged(server: WebhookServer, material: certs.Material, tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        status, answer = post(client(server, material.ca_bundle, tmp_path), "/validate",
                              json.dumps(review_body(name="bad")).encode())
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"] == "item 0 (Pod p): alice may not create pods in team-a"
    refused = [e for e in logs if e["event"] == "admission refused"]
    assert refused == [{"event": "admission refused", "log_level": "info", "webhook": "validate",
                        "appwrapper": "team-a/bad", "user": "alice", "operation": "CREATE", "source": "127.0.0.1",
                        "reason": "item 0 (Pod p): alice may not create pods in team-a"}]


def test_refusals_from_the_api_servers_addresses_are_logged_each_and_from_elsewhere_counted(
        tls: Loaded, material: certs.Material, tmp_path: Path) -> None:
    """Anyone on the pod network can send reviews that are refused; only the API server's refusals are a line
    each. The attacker's client binds 127.0.0.2, the API server's (as in the local cluster) is 127.0.0.1."""
    clock = SteppedClock()
    lines: list[tuple[str, dict[str, Any]]] = []
    summary = callers.RefusalSummary(interval=60.0, clock=clock, emit=lambda event, **f: lines.append((event, f)))
    srv = WebhookServer("127.0.0.1:0", tls=lambda: tls.context, mutate=mutate, validate=validate,
                        max_body_bytes=max_body_bytes(1024), read_timeout=2.0, refusal_summary=summary,
                        api_servers=callers.SourceNetworks(["127.0.0.1/32"]))
    srv.start()
    try:
        assert srv.listening.wait(5)
        bad = json.dumps(review_body(name="bad")).encode()
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                assert post(client(srv, material.ca_bundle, tmp_path), "/validate", bad)[0] == 200
        assert [(e["event"], e["source"]) for e in logs if "refused" in e["event"]] == [
            ("admission refused", "127.0.0.1")] * 3
        assert lines == []
        forger = client(srv, material.ca_bundle, tmp_path)
        forger.source_address = ("127.0.0.2", 0)
        with structlog.testing.capture_logs() as logs:
            for _ in range(50):
                status, answer = post(forger, "/validate", bad)
                assert status == 200 and answer["response"]["allowed"] is False
        assert [e for e in logs if "refused" in e["event"]] == []
        assert [(event, f["source"]) for event, f in lines] == [("admission refused", "127.0.0.2")]
        clock.now += 60.0
        srv.door.sweep()  # the front door's periodic sweep flushes the counts
        assert [event for event, _ in lines[1:]] == [
            "refused 49 reviews from 127.0.0.2 in the last 60 s: item 0 (Pod p): alice may not create pods in team-a"]
    finally:
        srv.stop()


def test_a_reviewer_that_raises_refuses(server: WebhookServer, material: certs.Material, tmp_path: Path) -> None:
    status, answer = post(client(server, material.ca_bundle, tmp_path), "/validate",
                          json.dumps(review_body(name="boom")).encode())
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert "internal error" in answer["response"]["status"]["message"]
    assert answer["response"]["status"]["code"] == 500


def test_unknown_path_is_404(server: WebhookServer, material: certs.Material, tmp_path: Path) -> None:
    status, _ = post(client(server, material.ca_bundle, tmp_path), "/other", b"{}")
    assert status == 404


def test_no_certificate_yet_closes_connections_and_a_new_one_serves_the_next(
        server: WebhookServer, tls: Loaded, material: certs.Material, tmp_path: Path) -> None:
    tls.context = None
    with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
        post(client(server, material.ca_bundle, tmp_path), "/validate", b"{}")
    fresh = certs.issue(HOSTS, datetime.datetime.now(datetime.UTC))
    tls.context = certs.server_context(fresh.cert, fresh.key)
    status, _ = post(client(server, fresh.ca_bundle, tmp_path), "/validate", json.dumps(review_body()).encode())
    assert status == 200


class SteppedClock:
    """The front door's clock for the deadline tests: it moves only when told, and the test then sweeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stepped() -> Iterator[tuple[WebhookServer, SteppedClock]]:
    """A webhook server with a 2 s read timeout and a 10 s idle timeout whose deadlines are checked only when the
    test calls ``door.sweep()``, on a clock the test steps: what these tests show holds on a slow machine."""
    clock = SteppedClock()
    material = certs.issue(HOSTS, datetime.datetime.now(datetime.UTC))
    context = certs.server_context(material.cert, material.key)
    srv = WebhookServer("127.0.0.1:0", tls=lambda: context, mutate=mutate, validate=validate,
                        max_body_bytes=max_body_bytes(1024), read_timeout=2.0, idle_timeout=10.0, clock=clock,
                        sweep_seconds=None)
    srv.start()
    assert srv.listening.wait(10)
    srv.material = material  # type: ignore[attr-defined]
    yield srv, clock
    srv.stop()


def step(srv: WebhookServer, clock: SteppedClock, seconds: float) -> None:
    clock.now += seconds
    srv.door.sweep()


def closed(sock: Any) -> bool:
    """The server closed the connection (an end of stream, or TLS torn down under it); a read that times out
    (10 s, a bound on a hang only) means it is still open."""
    sock.settimeout(10)
    try:
        return bool(sock.recv(1) == b"")
    except (ConnectionError, ssl.SSLError):
        return True


def phases_are(srv: WebhookServer, phases: dict[str, int], what: str) -> None:
    wait_until(lambda: srv.door.registry.phases() == phases, 10, what)


def test_a_silent_client_is_cut_off_by_the_read_timeout(stepped: tuple[WebhookServer, SteppedClock],
                                                        tmp_path: Path) -> None:
    srv, clock = stepped
    conn = client(srv, srv.material.ca_bundle, tmp_path)  # type: ignore[attr-defined]
    conn.connect()
    conn.putrequest("POST", "/validate")
    conn.putheader("Content-Length", "100")
    conn.endheaders()  # and never the body
    phases_are(srv, {"body": 1}, "the server to wait for the body")
    step(srv, clock, 1.9)
    assert srv.door.stats.closed == {}, "within the read timeout"
    step(srv, clock, 0.2)
    assert closed(conn.sock)  # by the server: 2.1 s without the body
    assert srv.door.stats.closed == {"body_timeout": 1}


def test_a_client_trickling_its_headers_is_cut_off_by_the_request_deadline(
        stepped: tuple[WebhookServer, SteppedClock], tmp_path: Path) -> None:
    srv, clock = stepped
    conn = client(srv, srv.material.ca_bundle, tmp_path)  # type: ignore[attr-defined]
    conn.connect()
    # One byte every half second: every single read is well inside the 2 s read timeout, the request is not.
    conn.sock.sendall(b"P")
    phases_are(srv, {"header": 1}, "the head to be under way")
    for byte in b"OST":
        step(srv, clock, 0.5)
        conn.sock.sendall(bytes([byte]))
    assert srv.door.stats.closed == {}, "1.5 s after its first byte"
    step(srv, clock, 0.6)  # 2.1 s after its first byte, though its last byte came 0.6 s ago
    assert closed(conn.sock)
    assert srv.door.stats.closed == {"header_timeout": 1}


def test_a_kept_alive_connection_outlives_the_read_timeout_while_idle_and_is_closed_after_the_idle_timeout(
        stepped: tuple[WebhookServer, SteppedClock], tmp_path: Path) -> None:
    """The API server keeps idle connections 90 s and does not retry a POST on one the server closed meanwhile:
    an idle connection must stay open past the per-request read bound (here 2 s), until the idle timeout (10 s)."""
    srv, clock = stepped
    conn = client(srv, srv.material.ca_bundle, tmp_path)  # type: ignore[attr-defined]
    assert post(conn, "/validate", json.dumps(review_body("u-1")).encode())[0] == 200
    sock = conn.sock
    phases_are(srv, {"idle": 1}, "the connection to be idle")
    step(srv, clock, 9.9)  # idle, five read timeouts long: what must not close the connection
    assert post(conn, "/validate", json.dumps(review_body("u-2")).encode())[0] == 200
    assert conn.sock is sock, "the connection was closed while idle and opened again"
    phases_are(srv, {"idle": 1}, "the connection to be idle again")
    step(srv, clock, 9.9)
    assert srv.door.stats.closed == {}, "its idle time counts from its last request"
    step(srv, clock, 0.2)
    assert closed(sock)  # by the server, once idle for its idle timeout
    assert srv.door.stats.closed == {"idle_timeout": 1}


def test_a_caller_check_refuses_with_401_before_the_body_and_sees_headers_certificate_and_address(
        tls: Loaded, material: certs.Material, tmp_path: Path) -> None:
    seen: list[tuple[str | None, bytes | None, str]] = []
    reviewed: list[AdmissionRequest] = []

    def check(headers: Mapping[str, str], cert: bytes | None, peer: str) -> str | None:
        seen.append((headers.get("authorization"), cert, peer))
        return None if headers.get("Authorization") == "Bearer api-server" else "not the API server"

    def record(request: AdmissionRequest) -> Outcome:
        reviewed.append(request)
        return Outcome.allow()
    srv = WebhookServer("127.0.0.1:0", tls=lambda: tls.context, mutate=record, validate=record,
                        max_body_bytes=max_body_bytes(1024), caller_check=check)
    srv.start()
    try:
        conn = client(srv, material.ca_bundle, tmp_path)
        conn.putrequest("POST", "/validate")
        conn.putheader("Content-Length", "100")
        conn.putheader("Authorization", "Bearer forged")
        conn.endheaders()  # and never the body: the refusal comes first
        response = conn.getresponse()
        assert response.status == 401 and json.loads(response.read()) == {
            "error": "the webhook's caller is not authenticated: not the API server"}
        assert seen == [("Bearer forged", None, "127.0.0.1")]
        assert reviewed == []
        conn = client(srv, material.ca_bundle, tmp_path)
        conn.request("POST", "/validate", body=json.dumps(review_body("u-9")).encode(),
                     headers={"Authorization": "Bearer api-server"})
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["response"]["allowed"] is True
        assert [(r.uid, r.source) for r in reviewed] == [("u-9", "127.0.0.1")], "the reviewer knows the source"
    finally:
        srv.stop()


def test_a_review_that_finds_no_worker_is_refused_with_an_admission_review_naming_the_reason(
        tls: Loaded, material: certs.Material, tmp_path: Path) -> None:
    release = threading.Event()

    def slow(request: AdmissionRequest) -> Outcome:
        assert release.wait(30)
        return Outcome.allow()
    # Never judged on the event loop (quick_body_bytes=0): this reviewer blocks, as only a worker may.
    srv = WebhookServer("127.0.0.1:0", tls=lambda: tls.context, mutate=slow, validate=slow,
                        max_body_bytes=max_body_bytes(1024), workers=1, worker_wait=0.5, quick_body_bytes=0)
    srv.start()
    try:
        first = client(srv, material.ca_bundle, tmp_path)
        first.request("POST", "/validate", body=json.dumps(review_body("u-1")).encode())
        wait_until(lambda: srv.stats.in_flight == 1, 10, "the only worker to be taken")
        status, answer = post(client(srv, material.ca_bundle, tmp_path), "/validate",
                              json.dumps(review_body("u-2")).encode())
        assert status == 200 and answer["response"]["uid"] == "u-2" and not answer["response"]["allowed"]
        assert answer["response"]["status"]["code"] == 503
        assert "the webhook is busy" in answer["response"]["status"]["message"]
        release.set()
        assert first.getresponse().status == 200
    finally:
        release.set()
        srv.stop()


def test_a_review_with_its_facts_at_hand_is_answered_on_the_loop_and_one_that_must_ask_in_a_worker(
        tls: Loaded, material: certs.Material, tmp_path: Path) -> None:
    """The one worker is held by a review that asks the API server (here: waits for ``asked``); a review whose facts
    are at hand is answered meanwhile, so without a worker; the first is answered once its question is."""
    asked = threading.Event()
    judged_where: list[tuple[str, bool]] = []

    def validate(request: AdmissionRequest) -> Outcome:
        judged_where.append((request.uid, only_at_hand()))
        if request.name == "needs-a-question":
            if only_at_hand():
                raise WouldAsk("whether alice may create deployments.apps")
            assert asked.wait(30)
            return Outcome.deny("alice may not create deployments.apps")
        return Outcome.allow()
    srv = WebhookServer("127.0.0.1:0", tls=lambda: tls.context, mutate=mutate, validate=validate,
                        max_body_bytes=max_body_bytes(1024), workers=1, worker_wait=30)
    srv.start()
    try:
        asking = client(srv, material.ca_bundle, tmp_path)
        asking.request("POST", "/validate", body=json.dumps(review_body("u-1", "needs-a-question")).encode())
        wait_until(lambda: len(judged_where) == 2, 10, "the only worker to be judging the question")
        status, answer = post(client(srv, material.ca_bundle, tmp_path), "/validate",
                              json.dumps(review_body("u-2", "at-hand")).encode())
        assert (status, answer["response"]) == (200, {"uid": "u-2", "allowed": True})
        assert srv.stats.in_flight == 1, "answered while the only worker was still held"
        asked.set()
        response = asking.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200 and answer["response"]["uid"] == "u-1"
        assert not answer["response"]["allowed"]
        assert answer["response"]["status"]["message"] == "alice may not create deployments.apps"
        # u-1 was tried at hand first, then judged again in the worker; u-2 only at hand.
        assert judged_where == [("u-1", True), ("u-1", False), ("u-2", True)]
    finally:
        asked.set()
        srv.stop()


def client_certificate(tmp_path: Path) -> tuple[bytes, Path, Path]:
    """A client CA (PEM) and a client certificate and key it signed (files), for clientAuth."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(minutes=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "client.crt", tmp_path / "client.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file


def test_a_context_that_asks_for_client_certificates_hands_the_certificate_to_the_caller_check(
        material: certs.Material, tmp_path: Path) -> None:
    client_ca, cert_file, key_file = client_certificate(tmp_path)
    context = certs.server_context(material.cert, material.key)
    context.verify_mode = ssl.CERT_OPTIONAL
    context.load_verify_locations(cadata=client_ca.decode())
    seen: list[bytes | None] = []

    def check(headers: Mapping[str, str], cert: bytes | None, peer: str) -> str | None:
        seen.append(cert)
        return None if cert else "no client certificate"
    srv = WebhookServer("127.0.0.1:0", tls=lambda: context, mutate=mutate, validate=validate,
                        max_body_bytes=max_body_bytes(1024), caller_check=check)
    srv.start()
    try:
        status, answer = post(client(srv, material.ca_bundle, tmp_path), "/validate",
                              json.dumps(review_body()).encode())
        assert (status, answer) == (401, {"error": "the webhook's caller is not authenticated: no client certificate"})
        conn = client(srv, material.ca_bundle, tmp_path)
        conn._context.load_cert_chain(str(cert_file), str(key_file))  # type: ignore[attr-defined]
        assert post(conn, "/validate", json.dumps(review_body()).encode())[0] == 200
        expected = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
        assert seen == [None, expected]
    finally:
        srv.stop()
