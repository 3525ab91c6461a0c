"""The webhook's certificates: what is issued (SANs, validity, chain) and when it must be replaced."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from mcad.admission import certs

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
HOSTS = certs.service_hosts("mcad-controller", "mcad-system", ["127.0.0.1", "webhook.example.com"])


def _cert(material: certs.Material) -> x509.Certificate:
    return x509.load_pem_x509_certificate(material.cert)


def test_service_hosts_name_the_service_then_the_extras() -> None:
    assert HOSTS == ("mcad-controller.mcad-system.svc", "mcad-controller.mcad-system.svc.cluster.local",
                     "127.0.0.1", "webhook.example.com")


def test_issued_certificate_has_the_sans_validity_and_chain() -> None:
    material = certs.issue(HOSTS, NOW)
    cert = _cert(material)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [HOSTS[0], HOSTS[1], "webhook.example.com"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert cert.not_valid_after_utc == NOW + certs.CERT_LIFETIME
    assert cert.not_valid_before_utc < NOW
    authority = material.authority()
    assert authority is not None
    cert.verify_directly_issued_by(authority.cert)
    assert authority.cert.not_valid_after_utc == NOW + certs.CA_LIFETIME
    assert certs.renewal_reason(material, HOSTS, NOW) is None
    assert certs.Material.from_secret_data(material.as_secret_data()) == material


def test_renewal_when_within_the_margin_of_expiry_and_not_before() -> None:
    material = certs.issue(HOSTS, NOW)
    expiry = NOW + certs.CERT_LIFETIME
    assert certs.renewal_reason(material, HOSTS, expiry - certs.RENEWAL_MARGIN - datetime.timedelta(hours=1)) is None
    reason = certs.renewal_reason(material, HOSTS, expiry - certs.RENEWAL_MARGIN + datetime.timedelta(hours=1))
    assert reason is not None and "expires" in reason


def test_renewal_keeps_the_ca_while_it_outlives_the_new_certificate() -> None:
    first = certs.issue(HOSTS, NOW)
    later = NOW + datetime.timedelta(days=70)
    renewed = certs.issue(HOSTS, later, first)
    assert renewed.ca_bundle == first.ca_bundle and renewed.cert != first.cert
    assert certs.renewal_reason(renewed, HOSTS, later) is None


def test_a_ca_near_its_end_is_replaced_and_kept_in_the_bundle_until_it_expires() -> None:
    first = certs.issue(HOSTS, NOW)
    late = NOW + certs.CA_LIFETIME - certs.CERT_LIFETIME  # less than a certificate's lifetime plus the margin left
    renewed = certs.issue(HOSTS, late, first)
    new_ca, old_ca = x509.load_pem_x509_certificates(renewed.ca_bundle)
    assert old_ca == first.authority().cert  # type: ignore[union-attr]
    assert new_ca.not_valid_after_utc == late + certs.CA_LIFETIME
    _cert(renewed).verify_directly_issued_by(new_ca)
    assert certs.renewal_reason(renewed, HOSTS, late) is None
    # An old CA already expired is not carried.
    expired = certs.issue(HOSTS, NOW + certs.CA_LIFETIME + datetime.timedelta(days=1), first)
    assert len(x509.load_pem_x509_certificates(expired.ca_bundle)) == 1


def test_a_rotation_keeps_every_ca_of_the_old_bundle_still_valid_once() -> None:
    """Replicas may still serve a certificate of any CA the old bundle held: all of them stay trusted, each once."""
    first, other = certs.issue(HOSTS, NOW), certs.issue(HOSTS, NOW)
    first_ca, other_ca = (x509.load_pem_x509_certificate(m.ca_bundle) for m in (first, other))
    held = certs.Material(first.ca_bundle + other.ca_bundle + first.ca_bundle, first.ca_key, first.cert, first.key)
    late = NOW + certs.CA_LIFETIME - certs.CERT_LIFETIME
    rotated = certs.issue(HOSTS, late, held)
    new_ca, *kept = x509.load_pem_x509_certificates(rotated.ca_bundle)
    assert kept == [first_ca, other_ca]
    assert certs.issuer_of(rotated) == new_ca
    assert certs.issuer_of(held) == first_ca
    assert certs.issuer_of(certs.Material(other.ca_bundle, other.ca_key, first.cert, first.key)) is None


def test_renewal_when_a_host_is_missing_or_the_material_is_inconsistent() -> None:
    material = certs.issue(HOSTS, NOW)
    reason = certs.renewal_reason(material, (*HOSTS, "10.0.0.9"), NOW)
    assert reason == "hosts missing from the certificate: 10.0.0.9"
    assert certs.renewal_reason(None, HOSTS, NOW) == "no certificate yet"
    other = certs.issue(HOSTS, NOW)
    swapped_key = certs.Material(material.ca_bundle, material.ca_key, material.cert, other.key)
    assert "does not match" in (certs.renewal_reason(swapped_key, HOSTS, NOW) or "")
    foreign = certs.Material(material.ca_bundle, material.ca_key, other.cert, other.key)
    assert "not signed by the CA" in (certs.renewal_reason(foreign, HOSTS, NOW) or "")
    garbage = certs.Material(b"x", material.ca_key, material.cert, material.key)
    assert "unreadable" in (certs.renewal_reason(garbage, HOSTS, NOW) or "")


def test_an_empty_or_partial_secret_holds_no_material() -> None:
    assert certs.Material.from_secret_data(None) is None
    assert certs.Material.from_secret_data({}) is None
    data = certs.issue(HOSTS, NOW).as_secret_data()
    del data["tls.key"]
    assert certs.Material.from_secret_data(data) is None
    assert certs.Material.from_secret_data({**data, "tls.key": "not base64!"}) is None


def test_the_server_context_loads_the_certificate() -> None:
    material = certs.issue(HOSTS, datetime.datetime.now(datetime.UTC))
    context = certs.server_context(material.cert, material.key)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_certificate_directory_is_loaded_and_reloaded_when_it_changes(tmp_path: Path) -> None:
    directory = certs.DirectoryCertificates(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        directory.sync()
    assert directory.context() is None and not directory.loaded.is_set()
    now = datetime.datetime.now(datetime.UTC)
    for round_ in range(2):
        material = certs.issue(HOSTS, now)
        (tmp_path / "tls.crt").write_bytes(material.cert)
        (tmp_path / "tls.key").write_bytes(material.key)
        before = directory.context()
        directory.sync()
        assert directory.loaded.is_set()
        assert directory.context() is not before, f"round {round_}: a changed certificate is loaded"
        same = directory.context()
        directory.sync()
        assert directory.context() is same, "an unchanged one is not reloaded"


def test_an_encrypted_key_is_unreadable_material_not_a_crash() -> None:
    from cryptography.hazmat.primitives import serialization

    material = certs.issue(HOSTS, NOW)
    key = serialization.load_pem_private_key(material.key, None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"secret"))
    assert certs.renewal_reason(certs.Material(material.ca_bundle, material.ca_key, material.cert, encrypted),
                                HOSTS, NOW) == "the serving certificate or key is unreadable"
    assert certs.renewal_reason(certs.Material(material.ca_bundle, encrypted, material.cert, material.key),
                                HOSTS, NOW) == "the CA certificate or key is unreadable or they do not match"
