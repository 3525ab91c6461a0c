"""The webhook certificate's keeper against a real API server: the Secret, the race between replicas, caBundle."""

from __future__ import annotations

import base64
import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from cryptography import x509

from mcad.admission import certs
from mcad.k8s import kube

HOSTS = ("mcad-controller.mcad-system.svc", "127.0.0.1")


@pytest.fixture
def conn(kubeconfig: str) -> kube.Connection:
    return kube.connect(kubeconfig)


@pytest.fixture
def secret(conn: kube.Connection, namespace: str) -> str:
    kube.request_json(conn, "POST", f"/api/v1/namespaces/{namespace}/secrets",
                      body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "webhook-cert"},
                            "type": "Opaque"})
    return "webhook-cert"


@pytest.fixture
def configuration(conn: kube.Connection) -> Iterator[str]:
    """Both kinds of webhook configuration, two webhooks each, reviewing nothing (no namespace has the label)."""
    name = f"mcad-test-{uuid.uuid4().hex[:8]}"
    hooks = [{"name": f"{i}.{name}.mcad.test", "clientConfig": {"url": "https://127.0.0.1:1/x"},
              "rules": [{"apiGroups": ["workload.codeflare.dev"], "apiVersions": ["v1beta1"],
                         "operations": ["CREATE"], "resources": ["appwrappers"]}],
              "namespaceSelector": {"matchLabels": {"mcad.test/never": "x"}},
              "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore"}
             for i in ("a", "b")]
    for kind in certs.CONFIGURATION_KINDS:
        kube.request_json(conn, "POST", f"{certs.ADMISSION_API}/{kind}",
                          body={"metadata": {"name": name}, "webhooks": hooks})
    yield name
    for kind in certs.CONFIGURATION_KINDS:
        kube.request_json(conn, "DELETE", f"{certs.ADMISSION_API}/{kind}/{name}")


def keeper(conn: kube.Connection, namespace: str, secret: str, configuration: str = "absent",
           now: datetime.datetime | None = None) -> certs.SecretCertificates:
    return certs.SecretCertificates(conn, namespace=namespace, secret=secret, hosts=HOSTS,
                                    configuration=configuration,
                                    clock=(lambda: now) if now else lambda: datetime.datetime.now(datetime.UTC))


def stored(conn: kube.Connection, namespace: str, secret: str) -> certs.Material | None:
    return certs.Material.from_secret_data(
        kube.request_json(conn, "GET", f"/api/v1/namespaces/{namespace}/secrets/{secret}").get("data"))


def bundles(conn: kube.Connection, name: str) -> list[str]:
    return [hook["clientConfig"].get("caBundle", "") for kind in certs.CONFIGURATION_KINDS
            for hook in kube.request_json(conn, "GET", f"{certs.ADMISSION_API}/{kind}/{name}")["webhooks"]]


def test_an_empty_secret_gets_a_certificate_that_is_then_kept(conn: kube.Connection, namespace: str,
                                                              secret: str) -> None:
    first = keeper(conn, namespace, secret).sync()
    assert stored(conn, namespace, secret) == first
    assert certs.renewal_reason(first, HOSTS, datetime.datetime.now(datetime.UTC)) is None
    again = keeper(conn, namespace, secret)
    assert again.sync() == first, "a good certificate is not replaced"
    assert again.loaded.is_set() and again.context() is not None


def test_the_replica_that_loses_the_race_loads_the_winners_certificate(conn: kube.Connection, namespace: str,
                                                                       secret: str) -> None:
    winner = keeper(conn, namespace, secret)

    class Late(certs.SecretCertificates):
        reads = 0

        def _read(self) -> tuple[certs.Material | None, dict[str, Any] | None]:
            read = super()._read()
            Late.reads += 1
            if Late.reads == 1:
                winner.sync()  # the other replica writes between this one's read and its write
            return read

    loser = Late(conn, namespace=namespace, secret=secret, hosts=HOSTS, configuration="absent")
    with structlog.testing.capture_logs() as logs:
        served = loser.sync()
    assert "webhook certificate written by another replica; reading it" in [e["event"] for e in logs]
    assert Late.reads == 2
    assert served == stored(conn, namespace, secret)
    assert served.fingerprint == winner.sync().fingerprint


def test_a_certificate_near_expiry_is_renewed_under_the_same_ca(conn: kube.Connection, namespace: str,
                                                                secret: str) -> None:
    first = keeper(conn, namespace, secret).sync()
    later = datetime.datetime.now(datetime.UTC) + certs.CERT_LIFETIME - certs.RENEWAL_MARGIN + datetime.timedelta(1)
    renewed = keeper(conn, namespace, secret, now=later).sync()
    assert renewed.cert != first.cert and renewed.ca_bundle == first.ca_bundle
    assert stored(conn, namespace, secret) == renewed


def test_the_ca_bundle_is_patched_into_every_webhook_and_restored_after_a_reset(
        conn: kube.Connection, namespace: str, secret: str, configuration: str) -> None:
    keep = keeper(conn, namespace, secret, configuration)
    material = keep.sync()
    wanted = base64.b64encode(material.ca_bundle).decode()
    assert bundles(conn, configuration) == [wanted] * 4
    assert keep.patch_bundles(material.ca_bundle) == 0, "nothing to do when it is right"
    kube.request_json(conn, "PATCH", f"{certs.ADMISSION_API}/validatingwebhookconfigurations/{configuration}",
                      content_type="application/json-patch+json",
                      body=[{"op": "remove", "path": "/webhooks/1/clientConfig/caBundle"}])
    assert keep.patch_bundles(material.ca_bundle) == 1
    assert bundles(conn, configuration) == [wanted] * 4


def test_with_the_creator_policy_only_the_validating_configuration_is_patched(
        conn: kube.Connection, namespace: str, secret: str, configuration: str) -> None:
    """--webhook-creator=policy: a MutatingWebhookConfiguration of that name is none of the controller's business
    (the chart renders none; one left from an earlier install keeps what it has)."""
    keep = certs.SecretCertificates(conn, namespace=namespace, secret=secret, hosts=HOSTS,
                                    configuration=configuration, kinds=certs.CONFIGURATION_KINDS[:1])
    material = keep.sync()
    wanted = base64.b64encode(material.ca_bundle).decode()
    assert bundles(conn, configuration) == [wanted, wanted, "", ""]


def test_a_certificate_of_a_new_ca_is_served_only_once_the_ca_has_been_in_the_configurations_a_while(
        conn: kube.Connection, namespace: str, secret: str, configuration: str) -> None:
    """The API server learns the new bundle from its watch: serving the new CA's certificate at once would have it
    refuse every review until then. The old certificate, still valid, is served meanwhile."""
    now = datetime.datetime.now(datetime.UTC)
    clock = [now]
    keep = certs.SecretCertificates(conn, namespace=namespace, secret=secret, hosts=HOSTS,
                                    configuration=configuration, clock=lambda: clock[0], propagation_seconds=10)
    keep.sync()
    initial = keep.context()
    assert initial is not None, "nothing was served yet: the first certificate is loaded at once"
    # A renewal under the same CA, long trusted, is served at once.
    clock[0] = now + certs.CA_LIFETIME - datetime.timedelta(days=150)
    first = keep.sync()
    served = keep.context()
    assert served is not initial and keep._held is None
    assert x509.load_pem_x509_certificate(first.cert).not_valid_after_utc > clock[0]
    # 61 days later that certificate is within the margin of its end, and its CA too near its own: a new CA.
    clock[0] += datetime.timedelta(days=61)
    rotated = keep.sync()
    assert rotated.ca_bundle != first.ca_bundle
    wanted = base64.b64encode(rotated.ca_bundle).decode()
    assert bundles(conn, configuration) == [wanted] * 4, "the bundle is patched before anything else"
    assert keep.context() is served, "the new certificate waits"
    assert keep._held == datetime.timedelta(seconds=10)
    clock[0] += datetime.timedelta(seconds=9)
    keep.sync()
    assert keep.context() is served
    clock[0] += datetime.timedelta(seconds=1)
    keep.sync()
    assert keep.context() is not served and keep._held is None
    # Another replica that reads the Secret later waits its own while, from when it first sees the CA.
    other = certs.SecretCertificates(conn, namespace=namespace, secret=secret, hosts=HOSTS,
                                     configuration=configuration, clock=lambda: clock[0], propagation_seconds=10)
    other.sync()
    assert other.context() is not None, "a replica serving nothing yet loads at once"


def test_without_webhook_configurations_a_new_ca_is_served_at_once(conn: kube.Connection, namespace: str,
                                                                   secret: str) -> None:
    now = datetime.datetime.now(datetime.UTC)
    clock = [now]
    keep = certs.SecretCertificates(conn, namespace=namespace, secret=secret, hosts=HOSTS, configuration="absent",
                                    clock=lambda: clock[0], propagation_seconds=10)
    keep.sync()
    served = keep.context()
    clock[0] = now + certs.CA_LIFETIME - certs.CERT_LIFETIME
    keep.sync()
    assert keep.context() is not served, "nobody calls through a configuration that does not exist"


def test_a_secret_replaced_by_someone_else_keeps_the_served_certificates_ca_trusted_until_the_switch(
        conn: kube.Connection, namespace: str, secret: str, configuration: str) -> None:
    """Material of a CA nobody serves, written over the Secret (a restore from a backup, a hand edit): the CA of the
    certificate still served stays in the configurations until the new one is loaded, then leaves them."""
    now = datetime.datetime.now(datetime.UTC)
    clock = [now]
    keep = certs.SecretCertificates(conn, namespace=namespace, secret=secret, hosts=HOSTS,
                                    configuration=configuration, clock=lambda: clock[0], propagation_seconds=10)
    served = keep.sync()
    foreign = certs.issue(HOSTS, now)
    kube.request_json(conn, "PATCH", f"/api/v1/namespaces/{namespace}/secrets/{secret}",
                      body={"data": foreign.as_secret_data()}, content_type="application/merge-patch+json")
    context = keep.context()
    assert keep.sync() == foreign
    assert keep.context() is context, "held while the API server learns the foreign CA"
    both = base64.b64encode(foreign.ca_bundle + served.ca_bundle).decode()
    assert bundles(conn, configuration) == [both] * 4
    clock[0] += datetime.timedelta(seconds=10)
    keep.sync()
    assert keep.context() is not context
    keep.sync()
    assert bundles(conn, configuration) == [base64.b64encode(foreign.ca_bundle).decode()] * 4
