"""The chart's default certificate path on the installation: the controller keeps its own CA and serving certificate
in the Secret mcad-webhook-cert and patches the CA into the webhook configurations.

The Secret is given a serving certificate 10 days from expiry, signed by a CA that expires in 100 days: what an
installation holds after 80 days of a certificate issued near the end of its CA's life. Within a poll period the
replicas renew it, with a new CA (the old one would not outlive the new certificate), keep the old CAs in the
bundle, patch the bundle into both webhook configurations, and only then, once the API server can have learnt the
new CA, serve the new certificate. AppWrapper creates (dry runs: reviewed by the webhooks, stored nowhere) are
admitted throughout: a replica that served the new certificate before the API server trusted its CA would have
them refused.
"""

from __future__ import annotations

import base64
import datetime
import ssl
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from mcad.admission import certs
from mcad.k8s import kube
from test.e2e.conftest import appwrapper, deployment_item
from test.installed.conftest import NAMESPACE, RELEASE, Installation
from test.support import wait_until

SECRET = f"/api/v1/namespaces/{NAMESPACE}/secrets/{RELEASE}-webhook-cert"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


def pem_certs(bundle: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(bundle)


def served(address: str) -> x509.Certificate:
    """The certificate a replica's webhook port presents (not verified: it is what is compared)."""
    return x509.load_pem_x509_certificate(ssl.get_server_certificate((address, 9443), timeout=10).encode())


def near_expiry(hosts: list[str], now: datetime.datetime, served: bytes) -> certs.Material:
    """A serving certificate valid 10 more days, signed by a CA valid 100 more days; the bundle also holds
    ``served``, the CAs of the certificates the replicas serve now (as a Secret they had loaded would)."""
    authority = certs.new_authority(now - (certs.CA_LIFETIME - datetime.timedelta(days=100)))
    key = authority.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
    ca = certs.Material(ca_bundle=authority.cert.public_bytes(serialization.Encoding.PEM), ca_key=key, cert=b"",
                        key=b"")
    issued = certs.issue(hosts, now - (certs.CERT_LIFETIME - datetime.timedelta(days=10)), ca=ca)
    return certs.Material(issued.ca_bundle + served, issued.ca_key, issued.cert, issued.key)


def test_a_certificate_near_expiry_is_renewed_with_a_new_ca_and_admission_never_stops(
        installation: Installation, namespace: str) -> None:
    conn = installation.conn
    current = certs.Material.from_secret_data(kube.request_json(conn, "GET", SECRET)["data"])
    assert current is not None
    hosts = sorted(certs.hosts_of(x509.load_pem_x509_certificate(current.cert)))
    now = datetime.datetime.now(datetime.UTC)
    old = near_expiry(hosts, now, current.ca_bundle)
    old_ca = pem_certs(old.ca_bundle)[0]

    refused: list[str] = []
    admitted = [0]
    stop = threading.Event()

    def review_creates() -> None:
        body = appwrapper("dry-run", deployment_item("dry-run", 1, "10m"))
        path = f"/apis/workload.codeflare.dev/v1beta1/namespaces/{namespace}/appwrappers"
        while not stop.is_set():
            try:
                kube.request_json(conn, "POST", path, body=body, query=[("dryRun", "All")])
                admitted[0] += 1
            except kube.ApiError as err:
                refused.append(str(err))
            time.sleep(0.5)

    creator = threading.Thread(target=review_creates, daemon=True)
    creator.start()
    try:
        kube.request_json(conn, "PATCH", SECRET, body={"data": old.as_secret_data()},
                          content_type="application/merge-patch+json")

        def renewed() -> certs.Material | None:
            material = certs.Material.from_secret_data(kube.request_json(conn, "GET", SECRET)["data"])
            if material is None or material.cert == old.cert:
                return None
            return material

        # The chart's certPollSeconds is 30: every replica reads the Secret within that.
        new = wait_until(renewed, 90, "the replicas to renew the certificate in the Secret")
        new_cert = x509.load_pem_x509_certificate(new.cert)
        bundle = pem_certs(new.ca_bundle)
        assert bundle[0] != old_ca, "the CA was not rotated"
        assert old_ca in bundle[1:], "the old CA left the bundle while still valid"
        assert new_cert.not_valid_after_utc > now + datetime.timedelta(days=80)
        new_cert.verify_directly_issued_by(bundle[0])

        def bundles_patched() -> bool:
            return all(base64.b64decode(w["clientConfig"]["caBundle"]) == new.ca_bundle
                       for kind in certs.CONFIGURATION_KINDS
                       for w in installation.get(f"{ADMISSION}/{kind}/{RELEASE}")["webhooks"])

        wait_until(bundles_patched, 60, "the new CA bundle in both webhook configurations")
        addresses = [p["status"]["podIP"] for p in installation.ready_pods()]
        wait_until(lambda: all(served(a) == new_cert for a in addresses), 90,
                   f"both replicas ({', '.join(addresses)}) to serve the renewed certificate")
        settled = admitted[0]
        wait_until(lambda: admitted[0] >= settled + 3, 30, "creates admitted with the new certificate")
    finally:
        stop.set()
        creator.join(timeout=30)
    if refused:
        pytest.fail(f"{len(refused)} of {len(refused) + admitted[0]} dry-run creates refused during the renewal: "
                    f"{refused[:3]}")
