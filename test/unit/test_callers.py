"""Who may call the webhooks and what any caller can cost: token buckets and caches driven by a fake clock, the
caller check over real TLS (client certificates, a shared token), admission's SubjectAccessReviews bounded per
source, and /metrics' TokenReviews of unknown tokens bounded. The API server's side is in
test/e2e/test_webhook_callers.py."""

from __future__ import annotations

import datetime
import http.client
import json
import os
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mcad.admission import callers, certs
from mcad.admission import review as admission_review
from mcad.admission.facts import Decision, FactUnavailable, Resource, asked_for
from mcad.admission.kubefacts import KubeFacts
from mcad.admission.request import AdmissionRequest, Outcome, UserInfo
from mcad.admission.server import WebhookServer, max_body_bytes
from mcad.metrics import Metrics, Sources
from mcad.serve.endpointauth import Gate, ReviewUnavailable, Unauthenticated
from test.unit.test_webhook_server import review_body

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------------------------------- token buckets


def test_a_token_bucket_gives_its_burst_then_its_rate() -> None:
    clock = Clock()
    bucket = callers.TokenBucket(2.0, 5, clock)
    assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]
    clock.now += 1.0
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    clock.now += 3600  # never more than the burst, however long it rested
    assert sum(bucket.take() for _ in range(10)) == 5


def test_sources_are_bounded_apart_and_together() -> None:
    clock = Clock()
    buckets = callers.SourceBuckets(per_source=1.0, burst=3, total=10.0, total_burst=5, clock=clock)
    assert [buckets.take("10.0.0.1") for _ in range(4)] == [None, None, None, "source"]
    # Another source has its own bucket, until the total runs out.
    assert [buckets.take("10.0.0.2") for _ in range(3)] == [None, None, "total"]
    clock.now += 1.0  # one more each, and ten more in all
    assert buckets.take("10.0.0.1") is None
    assert buckets.take("10.0.0.1") == "source"


def test_a_refusal_by_the_total_takes_nothing_from_the_source() -> None:
    clock = Clock()
    buckets = callers.SourceBuckets(per_source=0.0, burst=2, total=0.0, total_burst=1, clock=clock)
    assert buckets.take("a") is None
    assert buckets.take("b") == "total"
    buckets.total = callers.TokenBucket(0.0, 5, clock)
    assert [buckets.take("b") for _ in range(3)] == [None, None, "source"]  # b still had both of its tokens


def test_tracked_sources_are_bounded_least_recently_used_first() -> None:
    clock = Clock()
    buckets = callers.SourceBuckets(per_source=0.0, burst=1, total=1000.0, total_burst=1000, max_sources=2,
                                    clock=clock)
    assert buckets.take("a") is None and buckets.take("b") is None
    assert buckets.take("a") == "source"  # a is now the most recently used
    assert buckets.take("c") is None  # b is forgotten
    assert buckets.tracked() == 2
    assert buckets.take("a") == "source"
    assert buckets.take("b") is None  # a fresh bucket: the total bounds what forgetting costs


def test_the_api_servers_addresses_have_a_total_no_other_source_can_spend() -> None:
    clock = Clock()
    buckets = callers.SourceBuckets(per_source=1.0, burst=5, total=1.0, total_burst=6, clock=clock,
                                    api_servers=callers.SourceNetworks(["10.0.0.10/32", "fd00::/64"]))
    # Three forging sources empty the shared total between them.
    forged = [buckets.take(source) for source in ("10.1.0.1", "10.1.0.2", "10.1.0.3") for _ in range(3)]
    assert forged.count(None) == 6 and set(forged[6:]) == {"total"}
    # The API server (IPv4, IPv4-mapped on a dual-stack socket, IPv6) still has its own.
    assert buckets.take("10.0.0.10") is None
    assert buckets.take("::ffff:10.0.0.10") is None
    assert buckets.take("fd00::7") is None
    # Its total is as large as the shared one, and bounded all the same.
    assert [buckets.take("10.0.0.10") for _ in range(4)] == [None, None, None, "api_server_total"]
    assert buckets.take("fd00::8") == "api_server_total"
    assert buckets.take("10.1.0.4") == "total"  # and the shared one got nothing back from it
    clock.now += 1.0  # one more in each total
    assert buckets.take("10.0.0.10") is None and buckets.take("10.1.0.4") is None
    # The control: without the API server's addresses, it is one more source of the shared total.
    plain = callers.SourceBuckets(per_source=1.0, burst=5, total=1.0, total_burst=6, clock=clock)
    for source in ("10.1.0.1", "10.1.0.2", "10.1.0.3"):
        for _ in range(3):
            plain.take(source)
    assert plain.take("10.0.0.10") == "total"


def test_source_networks_parse_addresses_and_cidrs_and_refuse_anything_else() -> None:
    networks = callers.SourceNetworks(["10.0.0.10", "192.168.1.7/24", " fd00::/8 "])
    assert "10.0.0.10" in networks and "10.0.0.11" not in networks
    assert "192.168.1.200" in networks  # host bits are ignored, as a NetworkPolicy ipBlock does
    assert "fd12::1" in networks and "fe80::1" not in networks
    assert "not-an-address" not in networks and "" not in networks
    assert str(networks) == "10.0.0.10/32,192.168.1.0/24,fd00::/8"
    assert not callers.SourceNetworks() and "10.0.0.10" not in callers.SourceNetworks()
    with pytest.raises(ValueError, match=r"'10\.0\.0\.300/32' is not an IP address or CIDR"):
        callers.SourceNetworks(["10.0.0.300/32"])


# ---------------------------------------------------------------------------------------------- refusal log


def test_refusals_are_logged_once_per_source_per_interval_and_a_bounded_number_in_all() -> None:
    clock = Clock()
    refusal_log = callers.RefusalLog(interval=60.0, lines=3, clock=clock)
    assert refusal_log.should_log("a") == (True, 0)
    assert refusal_log.should_log("a") == (False, 0)
    assert refusal_log.should_log("b") == (True, 1)  # says how many went unlogged before it
    assert refusal_log.should_log("c") == (True, 0)
    assert refusal_log.should_log("d") == (False, 0)  # three lines this interval already
    assert refusal_log.should_log("e") == (False, 0)
    clock.now += 60.0
    assert refusal_log.should_log("a") == (True, 2)


class Lines:
    """What a ``RefusalSummary`` logs, as (event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def __call__(self, event: str, **fields: object) -> None:
        self.lines.append((event, fields))

    def events(self) -> list[str]:
        return [event for event, _ in self.lines]


def test_refused_reviews_are_logged_once_per_source_per_interval_with_a_count() -> None:
    clock, lines = Clock(), Lines()
    summary = callers.RefusalSummary(interval=60.0, max_sources=8, clock=clock, emit=lines)
    summary.note("10.1.0.1", "user 'x' may not create configmaps", user="x")
    assert lines.lines == [("admission refused", {"user": "x", "source": "10.1.0.1",
                                                  "reason": "user 'x' may not create configmaps"})]
    for i in range(500):
        summary.note("10.1.0.1", f"reason {i}")
        clock.now += 0.0625  # 31.25 s of them
    summary.flush()
    assert len(lines.lines) == 1  # nothing more within the interval
    clock.now += 28.0
    summary.flush()
    assert len(lines.lines) == 1
    clock.now += 1.0
    summary.flush()
    assert lines.events()[1:] == ["refused 500 reviews from 10.1.0.1 in the last 60 s: reason 0"]
    assert lines.lines[1][1] == {"source": "10.1.0.1", "refused": 500}
    # Still refused: counted from the start of the next interval, never a full line per refusal again.
    summary.note("10.1.0.1", "again")
    summary.note("10.1.0.1", "and again")
    clock.now += 60.0
    summary.flush()
    assert lines.events()[2:] == ["refused 2 reviews from 10.1.0.1 in the last 60 s: again"]
    # An interval without refusals forgets the source: the next refusal is logged in full.
    clock.now += 60.0
    summary.flush()
    assert summary.tracked() == 0 and len(lines.lines) == 3
    summary.note("10.1.0.1", "after a quiet minute")
    assert lines.lines[3] == ("admission refused", {"source": "10.1.0.1", "reason": "after a quiet minute"})


def test_a_single_refusal_is_one_line_and_sources_are_summarized_apart() -> None:
    clock, lines = Clock(), Lines()
    summary = callers.RefusalSummary(interval=60.0, max_sources=8, clock=clock, emit=lines)
    summary.note("10.1.0.1", "a")
    clock.now += 30.0
    summary.note("10.1.0.2", "b")
    summary.note("10.1.0.2", "b2")
    clock.now += 30.0
    summary.note("10.1.0.2", "b3")  # closes 10.1.0.1's window (nothing counted: no second line)
    assert lines.events() == ["admission refused", "admission refused"]
    clock.now += 30.0
    summary.flush()
    assert lines.events()[2:] == ["refused 2 reviews from 10.1.0.2 in the last 60 s: b2"]


def test_sources_beyond_the_bound_are_counted_under_one_line() -> None:
    clock, lines = Clock(), Lines()
    summary = callers.RefusalSummary(interval=60.0, max_sources=3, clock=clock, emit=lines)
    for i in range(1000):  # a thousand addresses, three times each
        for _ in range(3):
            summary.note(f"10.2.{i // 250}.{i % 250}", f"from {i}")
    assert summary.tracked() == 3
    assert lines.events() == ["admission refused"] * 3
    clock.now += 60.0
    summary.flush()
    summary_lines = lines.events()[3:]
    assert summary_lines[:3] == [f"refused 2 reviews from 10.2.0.{i} in the last 60 s: from {i}" for i in range(3)]
    assert summary_lines[3:] == ["refused 2991 reviews from 3+ other sources in the last 60 s (over the 3 sources "
                                 "tracked at once): from 3"]
    assert len(lines.lines) == 7  # 3000 refusals from 1000 addresses in a minute: seven lines


# ---------------------------------------------------------------------------------------------- token file


def test_the_token_file_is_reread_when_it_changes_at_most_once_per_recheck(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "token"
    path.write_text("first\n")
    token = callers.WatchedFile(str(path), recheck=1.0, clock=clock)
    assert token.current() == b"first"
    path.write_text("second-token\n")
    assert token.current() == b"first"  # not checked again yet
    clock.now += 1.0
    assert token.current() == b"second-token"
    path.write_text("")
    clock.now += 1.0
    assert token.current() is None  # an empty file holds no token: nothing matches it
    path.unlink()
    clock.now += 1.0
    assert token.current() is None


def test_a_secret_volume_update_swaps_a_symlink_and_is_seen(tmp_path: Path) -> None:
    clock = Clock()
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "token").write_text("old")
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "token").write_text("new")
    os.symlink("v1", tmp_path / "data")
    os.symlink("data/token", tmp_path / "token")
    token = callers.WatchedFile(str(tmp_path / "token"), recheck=1.0, clock=clock)
    assert token.current() == b"old"
    os.symlink("v2", tmp_path / "data.tmp")
    os.replace(tmp_path / "data.tmp", tmp_path / "data")
    clock.now += 1.0
    assert token.current() == b"new"


# ---------------------------------------------------------------------------------------------- caller check


def test_the_token_check_compares_the_whole_bearer(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("s3cret")
    refusals = callers.CallerRefusals()
    check = callers.CallerCheck(token=callers.WatchedFile(str(path)), refusals=refusals)
    assert check({"Authorization": "Bearer s3cret"}, None, "10.0.0.1") is None
    assert check({"Authorization": "Bearer s3cre"}, None, "10.0.0.1") == \
        "the bearer token is not the webhook client token"
    assert check({"Authorization": "Basic s3cret"}, None, "10.0.0.1") == "no bearer token"
    assert check({}, None, "10.0.0.1") == "no bearer token"
    assert refusals.snapshot() == {("webhook", "unauthenticated"): 3}


def test_a_check_needs_a_way_to_authenticate() -> None:
    with pytest.raises(ValueError):
        callers.CallerCheck()


# ---------------------------------------------------------------------------------------------- over real TLS


def _authority(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _client_cert(ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], name: str, tmp: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca[0].subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca[1], hashes.SHA256()))
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class Reviewed:
    def __init__(self) -> None:
        self.requests: list[AdmissionRequest] = []

    def __call__(self, request: AdmissionRequest) -> Outcome:
        self.requests.append(request)
        return Outcome.allow()


@pytest.fixture
def client_ca() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    return _authority("webhook-clients")


@pytest.fixture
def authenticated(client_ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
                  tmp_path: Path) -> Iterator[tuple[WebhookServer, certs.Material, Reviewed]]:
    """A webhook server that asks for client certificates of ``client_ca`` named kube-apiserver, or the token."""
    material = certs.issue(("127.0.0.1",), datetime.datetime.now(datetime.UTC))
    (tmp_path / "token").write_text("the-token\n")
    ca_pem = client_ca[0].public_bytes(serialization.Encoding.PEM)
    loaded = certs._Loaded(client_ca=lambda: ca_pem)
    loaded.load(material.cert, material.key)
    check = callers.CallerCheck(client_certificate=True, names=("kube-apiserver",),
                                token=callers.WatchedFile(str(tmp_path / "token")))
    reviewed = Reviewed()
    srv = WebhookServer("127.0.0.1:0", tls=loaded.context, mutate=reviewed, validate=reviewed,
                        max_body_bytes=max_body_bytes(1024), read_timeout=5.0, caller_check=check)
    srv.start()
    assert srv.listening.wait(5)
    yield srv, material, reviewed
    srv.stop()


def _post(srv: WebhookServer, material: certs.Material, tmp: Path, *, cert: tuple[str, str] | None = None,
          headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    (tmp / "server-ca.crt").write_bytes(material.ca_bundle)
    context = ssl.create_default_context(cafile=str(tmp / "server-ca.crt"))
    if cert is not None:
        context.load_cert_chain(*cert)
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=context, timeout=10)
    try:
        conn.request("POST", "/validate", body=json.dumps(review_body()).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_caller_without_credentials_is_refused_401_unreviewed(
        authenticated: tuple[WebhookServer, certs.Material, Reviewed], tmp_path: Path) -> None:
    srv, material, reviewed = authenticated
    status, answer = _post(srv, material, tmp_path)
    assert status == 401
    assert answer["error"] == ("the webhook's caller is not authenticated: no verified client certificate; "
                               "no bearer token")
    assert reviewed.requests == []


def test_the_api_servers_certificate_is_admitted_and_the_request_names_its_source(
        authenticated: tuple[WebhookServer, certs.Material, Reviewed],
        client_ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], tmp_path: Path) -> None:
    srv, material, reviewed = authenticated
    status, answer = _post(srv, material, tmp_path, cert=_client_cert(client_ca, "kube-apiserver", tmp_path))
    assert status == 200 and answer["response"]["allowed"] is True
    assert [r.source for r in reviewed.requests] == ["127.0.0.1"]


def test_another_client_of_the_same_ca_is_refused(
        authenticated: tuple[WebhookServer, certs.Material, Reviewed],
        client_ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], tmp_path: Path) -> None:
    srv, material, reviewed = authenticated
    status, answer = _post(srv, material, tmp_path, cert=_client_cert(client_ca, "someone-else", tmp_path))
    assert status == 401
    assert "the client certificate names someone-else, not an allowed webhook client" in answer["error"]
    assert reviewed.requests == []


def test_a_certificate_of_another_ca_fails_the_handshake(
        authenticated: tuple[WebhookServer, certs.Material, Reviewed], tmp_path: Path) -> None:
    srv, material, reviewed = authenticated
    forged = _client_cert(_authority("webhook-clients"), "kube-apiserver", tmp_path)  # same names, another key
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _post(srv, material, tmp_path, cert=forged)
    assert reviewed.requests == []


def test_the_shared_token_is_enough_without_a_certificate(
        authenticated: tuple[WebhookServer, certs.Material, Reviewed], tmp_path: Path) -> None:
    srv, material, reviewed = authenticated
    assert _post(srv, material, tmp_path, headers={"Authorization": "Bearer the-token"})[0] == 200
    assert _post(srv, material, tmp_path, headers={"Authorization": "Bearer not-the-token"})[0] == 401
    assert len(reviewed.requests) == 1


def test_no_client_ca_means_no_certificate_context_is_served() -> None:
    material = certs.issue(("127.0.0.1",), datetime.datetime.now(datetime.UTC))
    loaded = certs._Loaded(client_ca=lambda: None)
    with pytest.raises(ValueError, match="client CA"):
        loaded.load(material.cert, material.key)
    assert loaded.context() is None


# ---------------------------------------------------------------------------------------------- access reviews


class CountingFacts(KubeFacts):
    """KubeFacts whose API server answers every SubjectAccessReview "allowed" and counts them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(None, **kwargs)  # type: ignore[arg-type]
        self.sent = 0

    def _request(self, method: str, path: str, what: str, body: Any = None, query: Any = None) -> dict[str, Any]:
        self.sent += 1
        return {"status": {"allowed": True}}


def test_access_reviews_are_bounded_per_source_and_cache_hits_are_free() -> None:
    clock = Clock()
    refusals = callers.CallerRefusals()
    facts = CountingFacts(clock=clock, refusals=refusals, access_reviews=callers.SourceBuckets(
        per_source=1.0, burst=3, total=100.0, clock=clock))
    with asked_for("10.0.0.9"):
        for i in range(3):
            assert facts.may(UserInfo(f"forged-{i}"), "create", CONFIGMAPS, "team-a") == Decision(True)
        assert facts.may(UserInfo("forged-0"), "create", CONFIGMAPS, "team-a") == Decision(True)  # cached
        with pytest.raises(FactUnavailable, match=r"too many access reviews from 10\.0\.0\.9; retry"):
            facts.may(UserInfo("forged-3"), "create", CONFIGMAPS, "team-a")
    with asked_for("10.0.0.10"):  # the API server, say: its own bucket
        assert facts.may(UserInfo("alice"), "create", CONFIGMAPS, "team-a") == Decision(True)
    assert facts.sent == 4
    assert refusals.snapshot() == {("webhook", "access_reviews_source"): 1}
    clock.now += 1.0
    with asked_for("10.0.0.9"):
        assert facts.may(UserInfo("forged-3"), "create", CONFIGMAPS, "team-a") == Decision(True)


class Discovery(CountingFacts):
    def resource_for(self, api_version: str, kind: str) -> Resource | None:
        return CONFIGMAPS

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        return {"metadata": {"name": name}}


def test_a_review_over_the_bound_is_refused_with_the_reason_never_admitted() -> None:
    clock = Clock()
    facts = Discovery(clock=clock, access_reviews=callers.SourceBuckets(per_source=0.0, burst=1, total=100.0,
                                                                        clock=clock))
    _, validate = admission_review.build(facts, admission_review.AdmissionConfig(), clock=clock)
    body = review_body()
    body["request"]["object"]["spec"] = {"resources": {"GenericItems": [{"generictemplate": {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}}]}}
    first = validate(AdmissionRequest.parse(body, source="10.0.0.9"))
    assert first.allowed, first.message
    body["request"]["userInfo"]["username"] = "mallory"
    second = validate(AdmissionRequest.parse(body, source="10.0.0.9"))
    assert not second.allowed
    assert "too many access reviews from 10.0.0.9; retry" in second.message
    assert facts.sent == 1


# ---------------------------------------------------------------------------------------------- token reviews


class TokenReviews:
    def __init__(self) -> None:
        self.sent = 0

    def token_review(self, token: str, timeout: float) -> Mapping[str, Any]:
        self.sent += 1
        if token == "good":
            return {"status": {"authenticated": True, "user": {"username": "prometheus"}}}
        return {"status": {"error": "invalid"}}

    def access_review(self, spec: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
        return {"status": {"allowed": False}}


def test_unknown_tokens_cost_a_bounded_number_of_token_reviews() -> None:
    clock = Clock()
    reviews = TokenReviews()
    refusals = callers.CallerRefusals()
    gate = Gate(reviews, unknown_tokens=callers.TokenBucket(1.0, 5, clock), refusals=refusals, clock=clock)
    outcomes: list[str] = []
    for i in range(50):
        try:
            gate.authenticate(f"random-{i}")
        except Unauthenticated:
            outcomes.append("401")
        except ReviewUnavailable as err:
            assert str(err) == "too many unknown tokens; retry"
            outcomes.append("503")
    assert outcomes == ["401"] * 5 + ["503"] * 45
    assert reviews.sent == 5
    with pytest.raises(Unauthenticated):
        gate.authenticate("random-0")  # refused before: the negative cache answers
    assert reviews.sent == 5
    assert refusals.snapshot() == {("http", "unknown_tokens"): 45}


def test_a_token_accepted_before_is_reviewed_outside_the_bound() -> None:
    clock = Clock()
    reviews = TokenReviews()
    gate = Gate(reviews, unknown_tokens=callers.TokenBucket(1.0, 1, clock), clock=clock)
    assert gate.authenticate("good").username == "prometheus"
    with pytest.raises(ReviewUnavailable):
        gate.authenticate("random")  # the bucket is empty
    clock.now += 61  # the positive cache entry expired; the bucket refilled one, spent below
    with pytest.raises(Unauthenticated):
        gate.authenticate("random-2")
    assert gate.authenticate("good").username == "prometheus"  # reviewed again though the bucket is empty
    assert reviews.sent == 3


def test_refusals_are_exposed_on_metrics_with_every_series_from_the_start() -> None:
    refusals = callers.CallerRefusals()
    metrics = Metrics(Sources(caller_refusals=refusals.snapshot))
    assert metrics.value("mcad_caller_refusals_total", {"endpoint": "http", "reason": "unknown_tokens"}) == 0
    refusals.count("webhook", "unauthenticated")
    assert metrics.value("mcad_caller_refusals_total", {"endpoint": "webhook", "reason": "unauthenticated"}) == 1
