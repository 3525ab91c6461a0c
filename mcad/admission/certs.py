"""The webhook's serving certificate: issued and rotated by the controller itself, or read from a directory.

Contract:
- ``issue(hosts, now, ca=None)`` returns ``Material``: a serving certificate for ``hosts`` (DNS names and IP
  addresses) signed by ``ca`` (a new self-signed CA when None or when that CA would expire before the new
  certificate). ``Material.ca_bundle`` holds the current CA and, after a CA rotation, every CA of the previous
  bundle still valid, so replicas still serving an older certificate stay trusted until they reload.
- ``renewal_reason(material, hosts, now)`` says why the material must be replaced (unreadable, key and
  certificate do not match, not signed by the bundle, a host missing from the SANs, within the renewal margin of
  expiry), or None when it is good.
- ``SecretCertificates`` keeps the material in one Secret of the controller's namespace and every replica runs it:
  on start and every ``poll_seconds`` it reads the Secret, replaces the material if ``renewal_reason`` says so
  (an update with the resourceVersion it read: of replicas racing, one wins and the others re-read and load the
  winner's), patches the CA bundle into every webhook of the named Validating/MutatingWebhookConfiguration
  (``kinds``: the validating one only when a MutatingAdmissionPolicy records the creator) whose caBundle differs
  (someone resetting it is undone at the next poll; while the certificate served is not of that bundle, its CA is
  added), and then loads the certificate into the TLS context when it changed. A certificate whose CA this replica
  has seen in the configurations for less than ``propagation_seconds`` is not served yet while the one being
  served stays valid that long: the API server reads the configurations through a watch, and until it has the new
  bundle it would refuse the new certificate (every create then fails, failurePolicy being Fail). The next poll
  then comes after the rest of that wait. Needs get/update on that Secret and get/patch on the two configurations,
  nothing else (a missing Secret is created, which needs create: the chart creates it empty instead).
- ``DirectoryCertificates`` reads ``tls.crt``/``tls.key`` from a directory (cert-manager's Secret mounted) on start
  and every poll, reloading when they change; it neither issues nor patches anything.
- Both give ``context()``: the current server ``ssl.SSLContext``, or None until a certificate is loaded. Given
  ``client_ca`` (a callable returning the PEM bundle), the context requests client certificates verified against
  it (``mcad.admission.callers``); a changed bundle is loaded at the next poll, and none is never served without
  it.
  No failure is raised out of ``run``: each is logged with its reason and retried at the next poll.

Lifetimes. The serving certificate lives 90 days and is renewed when 30 days are left: short enough that a leaked
key is useful for a bounded time, while a controller that cannot reach the API server for weeks (or a standby
whose polls fail) still serves a valid certificate for a month. The CA lives 3 years; it is replaced when it would
expire before a certificate issued now (90 days) plus the margin, so every issued certificate ends before its CA,
and the bundle keeps the old CA until it expires, so a CA rotation never breaks replicas that have not reloaded.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mcad.admission.callers import client_tls_context
from mcad.errors import ApiError
from mcad.k8s import kube

log = structlog.get_logger("mcad.admission.certs")

CERT_LIFETIME = datetime.timedelta(days=90)
RENEWAL_MARGIN = datetime.timedelta(days=30)
CA_LIFETIME = datetime.timedelta(days=3 * 365)
# Clocks of the API server and of the controller may differ a little: a certificate is valid from a bit earlier.
BACKDATE = datetime.timedelta(minutes=5)
DEFAULT_POLL_SECONDS = 30.0
# How long a CA must have been in the webhook configurations before a certificate it signed is served: the API
# server learns a changed configuration from its watch, normally within a second.
DEFAULT_PROPAGATION_SECONDS = 10.0
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
CONFIGURATION_KINDS = ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")
SECRET_KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")


def service_hosts(service: str, namespace: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The names the API server uses to reach the Service, then the admin's extra names and addresses."""
    hosts = [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]
    hosts += [h.strip() for h in extra if h.strip() and h.strip() not in hosts]
    return tuple(hosts)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Material:
    """What the Secret holds: PEM bytes of the CA bundle and key, and the serving certificate and key."""

    ca_bundle: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def as_secret_data(self) -> dict[str, str]:
        return {k: base64.b64encode(v).decode() for k, v in
                zip(SECRET_KEYS, (self.ca_bundle, self.ca_key, self.cert, self.key), strict=True)}

    @classmethod
    def from_secret_data(cls, data: Any) -> Material | None:
        """None when any key is missing (the chart creates the Secret empty)."""
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) and data[k] for k in SECRET_KEYS):
            return None
        try:
            values = [base64.b64decode(data[k], validate=True) for k in SECRET_KEYS]
        except ValueError:
            return None
        return cls(*values)

    def authority(self) -> Authority | None:
        """The current CA (the first of the bundle) with its key, if both parse and match."""
        try:
            cert = x509.load_pem_x509_certificate(self.ca_bundle)
            key = serialization.load_pem_private_key(self.ca_key, None)
        except (ValueError, TypeError, UnsupportedAlgorithm):  # garbage, an encrypted key, an unknown algorithm
            return None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            return None
        return Authority(cert, key)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.ca_bundle + self.cert + self.key).hexdigest()[:16]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mcad"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_authority(now: datetime.datetime) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"mcad-webhook-ca-{now:%Y%m%d%H%M%S}")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Authority(cert, key)


def issue(hosts: Sequence[str], now: datetime.datetime, ca: Material | None = None) -> Material:
    """A serving certificate for ``hosts``, signed by ``ca``'s authority when it outlives the new certificate by the
    renewal margin, else by a new CA (the old one then stays in the bundle while valid)."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host")
    authority = ca.authority() if ca is not None else None
    previous: list[bytes] = []
    if authority is None or authority.cert.not_valid_after_utc < now + CERT_LIFETIME + RENEWAL_MARGIN:
        if ca is not None and authority is not None:
            previous = [_pem_cert(c) for c in _still_valid(ca.ca_bundle, now)]
        authority = new_authority(now)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(authority.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + CERT_LIFETIME)
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
                           critical=False)
            .sign(authority.key, hashes.SHA256()))
    return Material(ca_bundle=_pem_cert(authority.cert) + b"".join(previous), ca_key=_pem_key(authority.key),
                    cert=_pem_cert(cert), key=_pem_key(key))


def _still_valid(bundle: bytes, now: datetime.datetime) -> list[x509.Certificate]:
    """The certificates of a PEM bundle not expired at ``now``, in order, each once (unreadable: none)."""
    try:
        found = x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return []
    kept: list[x509.Certificate] = []
    for cert in found:
        if cert.not_valid_after_utc > now and cert not in kept:
            kept.append(cert)
    return kept


def issuer_of(material: Material) -> x509.Certificate | None:
    """The CA of ``material``'s bundle that signed its serving certificate, or None."""
    try:
        cert = x509.load_pem_x509_certificate(material.cert)
        bundle = x509.load_pem_x509_certificates(material.ca_bundle)
    except ValueError:
        return None
    for ca in bundle:
        try:
            cert.verify_directly_issued_by(ca)
        except (InvalidSignature, ValueError, TypeError):
            continue
        return ca
    return None


def hosts_of(cert: x509.Certificate) -> set[str]:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n.value) for n in names if isinstance(n, x509.DNSName | x509.IPAddress)}


def _canonical(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def renewal_reason(material: Material | None, hosts: Sequence[str], now: datetime.datetime) -> str | None:
    """Why ``material`` must be replaced to serve ``hosts`` at ``now``, or None when it may stay."""
    if material is None:
        return "no certificate yet"
    authority = material.authority()
    if authority is None:
        return "the CA certificate or key is unreadable or they do not match"
    try:
        cert = x509.load_pem_x509_certificate(material.cert)
        key = serialization.load_pem_private_key(material.key, None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return "the serving certificate or key is unreadable"
    if key.public_key() != cert.public_key():
        return "the serving key does not match the certificate"
    try:
        cert.verify_directly_issued_by(authority.cert)
    except (InvalidSignature, ValueError, TypeError) as err:
        return f"the serving certificate is not signed by the CA ({type(err).__name__})"
    missing = {_canonical(h) for h in hosts} - {_canonical(h) for h in hosts_of(cert)}
    if missing:
        return f"hosts missing from the certificate: {', '.join(sorted(missing))}"
    if cert.not_valid_before_utc > now + BACKDATE:
        return "the serving certificate is not valid yet"
    if cert.not_valid_after_utc - now < RENEWAL_MARGIN:
        return f"the serving certificate expires at {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    if authority.cert.not_valid_after_utc < cert.not_valid_after_utc:
        return "the CA expires before the serving certificate"
    return None


def server_context(cert: bytes, key: bytes) -> ssl.SSLContext:
    """A TLS server context (1.2 or later, issuing no session tickets) serving ``cert`` with ``key``. ``ssl`` loads
    keys only from files: they go through an anonymous memory file where Linux has one (nothing on disk; the root
    filesystem is read-only in the chart), else a private temporary file removed at once."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # No session tickets: the API server's webhook client (client-go's transport) keeps no session cache, so it never
    # resumes a session, and making and sending the two tickets OpenSSL issues after each TLS 1.3 handshake cost
    # about 0.3 ms of the webhook's CPU per new connection (a fresh connection for ~1 call in 6 under load).
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    pem = cert + (b"" if cert.endswith(b"\n") else b"\n") + key
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("mcad-webhook-cert")
        try:
            os.write(fd, pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return context
    with tempfile.NamedTemporaryFile("wb", prefix="mcad-webhook-", suffix=".pem") as f:
        f.write(pem)
        f.flush()
        context.load_cert_chain(f.name)
    return context


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


ClientCa = Callable[[], bytes | None]


class _Loaded:
    """The current TLS context and what it was made from; read by the server's accepting thread. With
    ``client_ca`` (webhook client authentication), the context requests a client certificate verified against
    the bundle it returns; a changed bundle makes a new context at the next poll, as a changed certificate does."""

    def __init__(self, client_ca: ClientCa | None = None) -> None:
        self._context: ssl.SSLContext | None = None
        self._source = ""
        self._client_ca = client_ca
        self.loaded = threading.Event()

    def context(self) -> ssl.SSLContext | None:
        return self._context

    def load(self, cert: bytes, key: bytes) -> bool:
        client_ca = self._client_ca() if self._client_ca is not None else None
        if self._client_ca is not None and client_ca is None:
            # Never serve without asking for client certificates when they are required: the previous context
            # (if any) stays, and the failure is logged by the caller's poll.
            raise ValueError("the webhook client CA bundle is missing or empty")
        fingerprint = hashlib.sha256(cert + key + (client_ca or b"")).hexdigest()[:16]
        if fingerprint == self._source:
            return False
        context = server_context(cert, key)
        if client_ca is not None:
            client_tls_context(context, client_ca)
        self._context = context
        self._source = fingerprint
        self.loaded.set()
        return True


class SecretCertificates(_Loaded):
    """The controller's own CA and serving certificate, kept in a Secret (see the module's contract)."""

    def __init__(self, conn: kube.Connection, *, namespace: str, secret: str, hosts: Sequence[str],
                 configuration: str, poll_seconds: float = DEFAULT_POLL_SECONDS,
                 clock: Callable[[], datetime.datetime] = _now, client_ca: ClientCa | None = None,
                 kinds: Sequence[str] = CONFIGURATION_KINDS,
                 propagation_seconds: float = DEFAULT_PROPAGATION_SECONDS) -> None:
        super().__init__(client_ca)
        self.conn = conn
        self.namespace = namespace
        self.secret = secret
        self.hosts = tuple(hosts)
        self.configuration = configuration
        self.kinds = tuple(kinds)  # the configurations patched: without the mutating one when a policy mutates
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.propagation = datetime.timedelta(seconds=propagation_seconds)
        self._warned: set[str] = set()  # missing configurations, said once each
        # When this replica first saw each CA (by its DER) in the configurations it patches.
        self._trusted_since: dict[bytes, datetime.datetime] = {}
        self._configured = False  # whether any of the configurations exists (else nobody calls through them)
        self._served_until: datetime.datetime | None = None  # expiry of the certificate being served
        self._served_issuer: x509.Certificate | None = None  # the CA that signed it
        self._held: datetime.timedelta | None = None  # how long a new certificate still waits, after a sync

    @property
    def _path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sync()
            except Exception as err:  # whatever the Secret holds, the thread lives on and tries at the next poll
                log.warning("webhook certificate sync failed", secret=f"{self.namespace}/{self.secret}",
                            reason=f"{type(err).__name__}: {str(err)[:500]}")
            held = self._held.total_seconds() if self._held is not None else self.poll_seconds
            stop.wait(min(self.poll_seconds, max(held, 0.1)))

    def sync(self) -> Material:
        """One round: converge the Secret, load it, patch the bundle. Returns the material now served."""
        for _ in range(5):  # a lost race re-reads; five in a row means something else keeps writing
            material, secret = self._read()
            reason = renewal_reason(material, self.hosts, self.clock())
            if reason is None and material is not None:
                break
            fresh = issue(self.hosts, self.clock(), material)
            if self._write(secret, fresh):
                log.info("webhook certificate issued", secret=f"{self.namespace}/{self.secret}", reason=reason,
                         hosts=",".join(self.hosts))
                material = fresh
                break
        else:
            raise ValueError("the webhook Secret kept changing under five attempts to renew it")
        assert material is not None
        # The bundle first: a certificate goes out only once the API server can have learnt its CA.
        self.patch_bundles(self._bundle_while_serving(material))
        self._held = self._hold_for(material)
        if self._held is not None:
            log.info("webhook certificate waits for the API server to trust its CA",
                     secret=f"{self.namespace}/{self.secret}", fingerprint=material.fingerprint,
                     seconds=round(self._held.total_seconds(), 1))
        elif self.load(material.cert, material.key):
            self._served_until = x509.load_pem_x509_certificate(material.cert).not_valid_after_utc
            self._served_issuer = issuer_of(material)
            log.info("webhook certificate loaded", secret=f"{self.namespace}/{self.secret}",
                     fingerprint=material.fingerprint)
        return material

    def _bundle_while_serving(self, material: Material) -> bytes:
        """``material``'s bundle, and the CA of the certificate this replica serves now when the bundle lacks it
        (the Secret was replaced by someone else, not renewed from what is served): until the new certificate is
        loaded, the one served must stay trusted. The next poll after the switch patches the bundle alone."""
        served = self._served_issuer
        if served is None or served.not_valid_after_utc <= self.clock():
            return material.ca_bundle
        try:
            if served in x509.load_pem_x509_certificates(material.ca_bundle):
                return material.ca_bundle
        except ValueError:
            pass
        return material.ca_bundle + served.public_bytes(serialization.Encoding.PEM)

    def _hold_for(self, material: Material) -> datetime.timedelta | None:
        """How much longer ``material``'s certificate must wait before it is served, or None: serve it now."""
        now = self.clock()
        issuer = issuer_of(material)
        if issuer is None or not self._configured:
            return None
        key = issuer.public_bytes(serialization.Encoding.DER)
        # Patched (or found) just now: every CA of the bundle is in the configurations from now on; CAs that left
        # the bundle are forgotten.
        current = [ca.public_bytes(serialization.Encoding.DER) for ca in _still_valid(material.ca_bundle, now)]
        self._trusted_since = {der: self._trusted_since.get(der, now) for der in current}
        self._trusted_since.setdefault(key, now)
        remaining = self.propagation - (now - self._trusted_since[key])
        if remaining <= datetime.timedelta(0) or self.context() is None:
            return None  # trusted long enough, or nothing is served yet (readiness waits for a certificate)
        if self._served_until is not None and self._served_until <= now + remaining:
            return None  # the one being served would expire first
        return remaining

    def _read(self) -> tuple[Material | None, dict[str, Any] | None]:
        try:
            secret = kube.request_json(self.conn, "GET", self._path, timeout=10)
        except ApiError as err:
            if err.status == 404:
                return None, None
            raise
        return Material.from_secret_data(secret.get("data")), secret

    def _write(self, secret: dict[str, Any] | None, material: Material) -> bool:
        """Update the Secret read (resourceVersion precondition) or create it; False when another replica won."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                "data": material.as_secret_data()}
        try:
            if secret is None:
                body["metadata"] = {"name": self.secret, "namespace": self.namespace}
                kube.request_json(self.conn, "POST", f"/api/v1/namespaces/{self.namespace}/secrets", body=body,
                                  timeout=10)
            else:
                body["metadata"] = secret["metadata"]  # carries resourceVersion: the update is conditional
                body["type"] = secret.get("type") or "Opaque"
                kube.request_json(self.conn, "PUT", self._path, body=body, timeout=10)
        except ApiError as err:
            if err.status == 409:
                log.info("webhook certificate written by another replica; reading it",
                         secret=f"{self.namespace}/{self.secret}")
                return False
            raise
        return True

    def patch_bundles(self, bundle: bytes) -> int:
        """Set ``caBundle`` of every webhook of both configurations to ``bundle``; returns how many changed."""
        wanted = base64.b64encode(bundle).decode()
        changed = 0
        self._configured = False
        for kind in self.kinds:
            path = f"{ADMISSION_API}/{kind}/{self.configuration}"
            try:
                config = kube.request_json(self.conn, "GET", path, timeout=10)
            except ApiError as err:
                if err.status != 404:
                    raise
                if kind not in self._warned:
                    self._warned.add(kind)
                    log.warning("webhook configuration not found; nothing to patch", kind=kind,
                                name=self.configuration)
                continue
            self._warned.discard(kind)
            self._configured = True
            ops: list[dict[str, Any]] = []
            for i, hook in enumerate(config.get("webhooks") or []):
                if (hook.get("clientConfig") or {}).get("caBundle") != wanted:
                    # The test op makes a concurrent reorder of the webhooks fail the patch instead of misplacing it.
                    ops += [{"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")},
                            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted}]
            if ops:
                kube.request_json(self.conn, "PATCH", path, body=ops, content_type="application/json-patch+json",
                                  timeout=10)
                changed += len(ops) // 2
                log.info("webhook CA bundle patched", kind=kind, name=self.configuration, webhooks=len(ops) // 2)
        return changed


class DirectoryCertificates(_Loaded):
    """``tls.crt`` and ``tls.key`` of a directory (cert-manager), reloaded when they change."""

    def __init__(self, directory: str, *, poll_seconds: float = DEFAULT_POLL_SECONDS,
                 client_ca: ClientCa | None = None) -> None:
        super().__init__(client_ca)
        self.directory = Path(directory)
        self.poll_seconds = poll_seconds

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sync()
            except Exception as err:  # a missing or half-written file: tried again at the next poll
                log.warning("webhook certificate not loaded", directory=str(self.directory),
                            reason=f"{type(err).__name__}: {str(err)[:500]}")
            stop.wait(self.poll_seconds)

    def sync(self) -> None:
        cert = (self.directory / "tls.crt").read_bytes()
        key = (self.directory / "tls.key").read_bytes()
        if self.load(cert, key):
            log.info("webhook certificate loaded", directory=str(self.directory))
