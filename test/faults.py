"""Write failures injected into a real API server: a validating admission webhook served from the test process.

Contract:
- ``fault_injector(api, namespace, watched)`` is a context manager. On entry it starts an HTTPS server on a free
  loopback port (its own CA and serving certificate, made with openssl), registers a
  ValidatingWebhookConfiguration that sends every CREATE and UPDATE of the ``watched`` resources in ``namespace``
  (and only there: a namespaceSelector on the namespace's name) to that server, and returns once the API server
  calls it (a dry-run probe is refused by it). On exit the configuration is deleted, the API server is seen to stop
  calling it, and the server stops, whatever happened in the block.
- Every call is allowed unless a rule says otherwise: ``fail(resource, code=500)`` refuses every write of that
  resource until ``heal()``; ``refuse(resource, name, code, message)`` refuses the writes of one object for good.
  A refusal is an AdmissionReview answer with ``allowed: false`` and ``status.code``: the API server answers the
  client with that code and a message that says "admission webhook ... denied the request: <message>".
- ``seen(...)`` lists the calls it received (time, resource, operation, object name, user, field manager, and the
  code it answered, None when allowed): how tests count applies per object and requests per second. Dry-run
  requests are not calls of the system under test and are not listed.
- failurePolicy is Ignore: if the test process dies without cleaning up, the configuration left behind points at
  a closed port, the API server's call is refused at once and the write goes through, so the namespace (which the
  test fixtures delete anyway) does not stay unwritable. The cost: a write the injector is too slow to answer
  (timeoutSeconds) is let through although the rule says refuse; its call is still listed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes.client as k8s

from test.support import wait_until

FAULT_MESSAGE = "injected fault: the API server refuses this write"
PROBE_LABEL = "mcad.test/fault-probe"


@dataclass(frozen=True)
class Resource:
    """A resource as admission rules name it: API group and plural, with the subresource after a slash."""

    group: str
    resource: str

    @property
    def rule(self) -> dict[str, Any]:
        return {"apiGroups": [self.group], "apiVersions": ["*"], "resources": [self.resource],
                "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}


APPWRAPPER_STATUS = Resource("workload.codeflare.dev", "appwrappers/status")
JOBS = Resource("batch", "jobs")
DEPLOYMENTS = Resource("apps", "deployments")
CONFIGMAPS = Resource("", "configmaps")


@dataclass(frozen=True)
class Call:
    """One admission call: what the API server was asked to write, and what the injector answered."""

    at: float  # time.time() when it arrived
    resource: Resource
    operation: str
    name: str
    user: str
    field_manager: str
    code: int | None  # None: allowed


@dataclass(frozen=True)
class _Rule:
    resource: Resource
    name: str | None  # None: every object
    code: int
    message: str
    lasting: bool  # refuse() rules survive heal()


class FaultInjector:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._calls: list[Call] = []

    def fail(self, resource: Resource, *, code: int = 500, message: str = FAULT_MESSAGE) -> None:
        """Refuse every write of ``resource`` with ``code`` until ``heal()``."""
        with self._lock:
            self._rules.append(_Rule(resource, None, code, message, lasting=False))

    def heal(self) -> None:
        """Stop the refusals ``fail`` started (``refuse`` rules stay)."""
        with self._lock:
            self._rules = [r for r in self._rules if r.lasting]

    def refuse(self, resource: Resource, name: str, *, code: int, message: str) -> None:
        """Refuse every write of the object ``name`` of ``resource`` for good, with ``code``."""
        with self._lock:
            self._rules.append(_Rule(resource, name, code, message, lasting=True))

    def seen(self, resource: Resource | None = None, *, name: str | None = None, operation: str | None = None,
             field_manager: str | None = None, refused: bool | None = None, since: float = 0.0,
             until: float = float("inf")) -> list[Call]:
        """The calls received that match every filter given (``refused``: whether it answered with a code)."""
        with self._lock:
            calls = list(self._calls)
        return [c for c in calls
                if (resource is None or c.resource == resource) and (name is None or c.name == name)
                and (operation is None or c.operation == operation)
                and (field_manager is None or c.field_manager == field_manager)
                and (refused is None or (c.code is not None) == refused) and since <= c.at < until]

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The AdmissionResponse to one AdmissionRequest (recorded unless it is a dry run)."""
        kind = request.get("resource") or {}
        sub = request.get("subResource") or ""
        resource = Resource(kind.get("group", ""), kind.get("resource", "") + (f"/{sub}" if sub else ""))
        name = request.get("name") or ((request.get("object") or {}).get("metadata") or {}).get("name") or ""
        with self._lock:
            rule = next((r for r in reversed(self._rules)
                         if r.resource == resource and r.name in (None, name)), None)
            if not request.get("dryRun"):
                self._calls.append(Call(time.time(), resource, request.get("operation", ""), name,
                                        (request.get("userInfo") or {}).get("username", ""),
                                        (request.get("options") or {}).get("fieldManager", ""),
                                        rule.code if rule else None))
        if rule is None:
            return {"uid": request["uid"], "allowed": True}
        return {"uid": request["uid"], "allowed": False,
                "status": {"code": rule.code, "message": rule.message, "status": "Failure"}}


def _probe_answer(request: dict[str, Any], tag: str) -> dict[str, Any]:
    labels = ((request.get("object") or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(PROBE_LABEL) == tag:
        return {"uid": request["uid"], "allowed": False, "status": {"code": 400, "message": f"probe {tag}"}}
    return {"uid": request["uid"], "allowed": True}


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _serving_pki(directory: Path) -> tuple[bytes, ssl.SSLContext]:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it: the CA bundle and the server's context."""
    ca_key, ca_crt, key, csr, crt, ext = (directory / f for f in
                                          ("ca.key", "ca.crt", "tls.key", "tls.csr", "tls.crt", "tls.ext"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=mcad-test-faults-ca",
             "-keyout", str(ca_key), "-out", str(ca_crt))
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-days", "1", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-extfile", str(ext), "-out", str(crt))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(crt), str(key))
    return ca_crt.read_bytes(), context


def _server(injector: FaultInjector, tag: str, context: ssl.SSLContext) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses its connection instead of a handshake each

        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            request = review["request"]
            # The API server adds its timeout to the path: /probe?timeout=5s.
            probe = urllib.parse.urlsplit(self.path).path == "/probe"
            response = _probe_answer(request, tag) if probe else injector.answer(request)
            body = json.dumps({"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
                               "kind": "AdmissionReview", "response": response}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per write would drown the test output

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # The handshake happens in the handler's thread, at its first read: one slow client cannot hold up accept().
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    return server


def _configuration(name: str, namespace: str, watched: tuple[Resource, ...], port: int, ca: bytes,
                   tag: str) -> dict[str, Any]:
    def webhook(hook: str, path: str, rules: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"name": f"{hook}.{tag}.faults.mcad.test", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Ignore", "timeoutSeconds": 5, "rules": rules,
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}",
                                 "caBundle": base64.b64encode(ca).decode()}, **extra}

    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name, "labels": {"mcad.test/owned": "true"}},
            "webhooks": [
                webhook("faults", "/faults", [r.rule for r in watched]),
                # The probe: once the API server sends it a labelled dry-run ConfigMap, it has loaded this
                # configuration, the other webhook included.
                webhook("probe", "/probe", [CONFIGMAPS.rule], objectSelector={"matchLabels": {PROBE_LABEL: tag}}),
            ]}


def _probe_refused(core: k8s.CoreV1Api, namespace: str, tag: str) -> bool:
    """Whether the probe webhook refuses a dry-run ConfigMap (that is, whether the API server calls it)."""
    body = {"metadata": {"generateName": "fault-probe-", "labels": {PROBE_LABEL: tag}}}
    try:
        core.create_namespaced_config_map(namespace, body, dry_run="All")
    except k8s.exceptions.ApiException as err:
        if err.status == 400 and f"probe {tag}" in (err.body or ""):
            return True
        raise
    return False


@contextlib.contextmanager
def fault_injector(api: k8s.ApiClient, namespace: str, watched: tuple[Resource, ...]) -> Iterator[FaultInjector]:
    """An injector for the writes of ``watched`` in ``namespace``, registered for the block (see the module)."""
    tag = uuid.uuid4().hex[:8]
    name = f"mcad-test-faults-{tag}"
    injector = FaultInjector(namespace)
    admission = k8s.AdmissionregistrationV1Api(api)
    core = k8s.CoreV1Api(api)
    with tempfile.TemporaryDirectory(prefix="mcad-faults-") as directory:
        ca, context = _serving_pki(Path(directory))
        server = _server(injector, tag, context)
        thread = threading.Thread(target=server.serve_forever, name="fault-injector", daemon=True)
        thread.start()
        try:
            admission.create_validating_webhook_configuration(
                _configuration(name, namespace, watched, server.server_address[1], ca, tag))
            try:
                wait_until(lambda: _probe_refused(core, namespace, tag), 30,
                           f"the API server to call the fault injector {name}")
                yield injector
            finally:
                admission.delete_validating_webhook_configuration(name)
                wait_until(lambda: not _probe_refused(core, namespace, tag), 30,
                           f"the API server to stop calling the fault injector {name}")
        finally:
            server.shutdown()
            server.server_close()
