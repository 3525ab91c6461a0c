"""The HTTPS endpoint of the admission webhooks, served by every replica (leader or standby).

Contract:
- ``POST /mutate`` and ``POST /validate`` take an ``admission.k8s.io/v1`` AdmissionReview, hand the parsed
  ``AdmissionRequest`` (its ``source`` the caller's IP address) to the mutating or validating reviewer, and answer
  ``Outcome.response(uid)`` (200).
- A body that is not an AdmissionReview: 400 with the reason. A body longer than ``max_body_bytes``: 413, unread.
  No Content-Length: 411. Any other path: 404; any other method: 405.
- A reviewer that raises refuses the request (allowed=false, "internal error ..."): nothing is admitted unchecked.
  A refusal of a review from a caller known to be the API server (it passed ``caller_check``, or its address is in
  ``api_servers``) is one log line (appwrapper=ns/name, user, source, reason). From any other caller, which may be
  anyone who reaches the port, refusals go to ``refusal_summary`` (``callers.RefusalSummary``): the first from a
  source in an interval is that same line, the rest one counted line per source per interval, over a bounded
  number of sources; the front door's periodic sweep flushes it (``tick``).
- ``caller_check(headers, peer certificate DER or None, peer IP)``, when given, runs before the body is read: a
  reason returned is answered 401 ``{"error": reason}`` and the connection closed, the body unread.
- A request of at most ``quick_body_bytes`` is judged first on the front door's event loop with the facts at hand
  (``facts.at_hand_only``): in the common case (every SubjectAccessReview, discovery and Namespace answer cached)
  it is answered there, without a worker; one that needs to ask the API server goes to a worker and is judged
  again from the start there. The answer is the same either way.
- Served by ``mcad.serve.frontdoor`` (its contract holds: one event loop for every connection, a bounded worker pool, a
  big-body lane): TLS with the context ``tls()`` returns at the time of each connection, so a reloaded certificate
  serves the next connection; until there is one, connections are closed at once. The handshake, a request's head
  (from its first byte) and its body (from the end of the head) each have ``read_timeout``; a kept-alive
  connection waits ``idle_timeout`` for its next request (longer than the API server's own idle timeout, so the
  client closes idle connections, never the server under a request in flight); beyond ``max_connections`` the
  longest-idle connection is closed for a new one. A request that finds no worker within ``worker_wait`` is
  refused with an AdmissionReview the API server shows ("busy, retry"), or a 503 when its uid cannot be read.
- ``listening`` is set once the socket is bound and served. Bind address as ``mcad.serve.server.parse_bind_address``.
  ``share_port`` (SO_REUSEPORT) lets several processes of one user on one host serve the same port, the kernel
  spreading connections over them as a Service spreads them over pods: replicas run outside a cluster (tests).
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from mcad.admission.callers import RefusalSummary, SourceNetworks
from mcad.admission.facts import WouldAsk, at_hand_only
from mcad.admission.request import AdmissionRequest, Outcome, Reviewer
from mcad.api import deepjson
from mcad.serve import frontdoor
from mcad.serve.frontdoor import FrontDoor, Limits
from mcad.serve.http1 import Head, Response
from mcad.serve.server import parse_bind_address

log = structlog.get_logger("mcad.admission.server")

DEFAULT_BIND_ADDRESS = ":9443"
# The API server gives a webhook timeoutSeconds (10 in the chart) for the whole call; nothing here waits longer.
DEFAULT_READ_TIMEOUT = 10.0
# How long a kept-alive connection may wait for its next request. Longer than the API server's own idle timeout
# (Go's 90 s): the client must be the one to close an idle connection, or it may send a POST on one the server is
# closing, and a POST is not retried (the create fails with "broken pipe", failurePolicy Fail).
DEFAULT_IDLE_TIMEOUT = 120.0
# Reviews in progress at once: a review asks the API server (SubjectAccessReviews), so it mostly waits.
DEFAULT_WORKERS = 16
# How long a complete request may wait for a worker: well within the API server's 10 s for the whole call.
DEFAULT_WORKER_WAIT = 5.0
# Bodies over BIG_BODY_BYTES are read, parsed and reviewed one at a time, in turns by source: parsing one holds the
# interpreter lock throughout, so a second at once would add its memory (the body and its parsed JSON, ~10 times
# the body for many small objects) and no throughput.
BIG_BODY_BYTES = 256 * 1024
BIG_LANE = 1
# Judged on the event loop when the facts are at hand. The loop answers in arrival order, not in turns by source as
# the workers do, so what one such request may hold it for stays small: a review of 16 KiB (~35 Jobs) takes ~2 ms,
# a one-workload AppWrapper's (1-10 KiB) 0.1-1 ms. Anything bigger goes to the workers.
QUICK_BODY_BYTES = 16 * 1024
# Beyond the AppWrapper's own bound: an UPDATE carries the object twice (object and oldObject), each with its
# metadata, managedFields and possibly kubectl's last-applied copy of the spec, hence four times plus headroom.
BODY_OVERHEAD_BYTES = 256 * 1024
# The API server writes request.uid first (Go encodes struct fields in order): found without parsing the body.
_UID = re.compile(rb'^\s*\{\s*(?:"apiVersion"\s*:\s*"[^"]*"\s*,\s*|"kind"\s*:\s*"[^"]*"\s*,\s*)*"request"\s*:\s*'
                  rb'\{\s*"uid"\s*:\s*"([0-9A-Za-z-]{1,64})"')

CallerCheck = Callable[[Mapping[str, str], bytes | None, str], str | None]


def max_body_bytes(max_appwrapper_bytes: int) -> int:
    """The largest AdmissionReview body accepted for AppWrappers bounded by ``max_appwrapper_bytes``."""
    return 4 * max_appwrapper_bytes + BODY_OVERHEAD_BYTES


TlsSource = Callable[[], ssl.SSLContext | None]


def _json(status: int, answer: dict[str, Any], *, close: bool = False) -> Response:
    return Response(status, json.dumps(answer).encode(), "application/json", close=close)


class _Webhooks:
    """The webhooks as a front door service."""

    name = "webhook"

    def __init__(self, routes: dict[str, tuple[str, Reviewer]], max_body: int,
                 caller_check: CallerCheck | None, api_servers: SourceNetworks | None = None,
                 refusal_summary: RefusalSummary | None = None) -> None:
        self.routes = routes
        self.max_body = max_body
        self.caller_check = caller_check
        self.api_servers = api_servers or SourceNetworks()
        self.refusal_summary = refusal_summary or RefusalSummary()
        # Run by the front door in a worker before the body is read (None: nothing to check).
        self.precheck: Callable[[Head], Response | None] | None = self._check_caller if caller_check else None

    def early(self, head: Head) -> Response | None:
        if head.path not in self.routes:
            return _json(404, {"error": f"no webhook at {head.path}; try /mutate or /validate"}, close=True)
        if head.method != "POST":
            return _json(405, {"error": "the webhooks take POST"}, close=True)
        if "Content-Length" not in head.headers:
            return _json(411, {"error": "Content-Length is required"}, close=True)
        if head.content_length > self.max_body:
            return _json(413, {"error": f"AdmissionReview of {head.content_length} bytes is over the bound of "
                                        f"{self.max_body}"}, close=True)
        return None

    def _check_caller(self, head: Head) -> Response | None:
        assert self.caller_check is not None
        reason = self.caller_check(head.headers, head.peer_cert, head.peer)
        if reason is None:
            return None
        # No log line here: the caller check logs refusals at a bounded rate (an anonymous flood must not flood
        # the log either).
        return _json(401, {"error": f"the webhook's caller is not authenticated: {reason}"}, close=True)

    def handle(self, head: Head, body: bytes) -> Response:
        name, reviewer = self.routes[head.path]
        # With a caller check, every review that gets this far is the API server's.
        trusted = self.caller_check is not None or head.peer in self.api_servers
        code, answer = review(name, reviewer, body, source=head.peer,
                              refusals=None if trusted else self.refusal_summary)
        return _json(code, answer, close=code != 200)

    def tick(self) -> None:
        """On the front door's sweep: log the refusal counts whose interval is over."""
        self.refusal_summary.flush()

    def quick(self, head: Head, body: bytes) -> Response | None:
        """The answer judged with the facts at hand, or None when a fact must be asked for (then ``handle``)."""
        try:
            with at_hand_only():
                return self.handle(head, body)
        except WouldAsk:
            return None

    def busy(self, head: Head, body: bytes | None, reason: str) -> Response:
        message = f"mcad admission: the webhook is busy ({reason}); the request was not admitted, retry"
        found = _UID.match(body[:4096]) if body else None
        if found is None:
            return _json(503, {"error": message})
        return _json(200, Outcome.deny(message, code=503).response(found.group(1).decode()))


class WebhookServer:
    def __init__(self, bind_address: str, *, tls: TlsSource, mutate: Reviewer, validate: Reviewer,
                 max_body_bytes: int, read_timeout: float = DEFAULT_READ_TIMEOUT,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, max_connections: int | None = None,
                 share_port: bool = False, caller_check: CallerCheck | None = None,
                 workers: int = DEFAULT_WORKERS, worker_wait: float = DEFAULT_WORKER_WAIT,
                 big_body_bytes: int = BIG_BODY_BYTES, big_lane: int = BIG_LANE,
                 quick_body_bytes: int = QUICK_BODY_BYTES, clock: Callable[[], float] = time.monotonic,
                 sweep_seconds: float | None = frontdoor.SWEEP_SECONDS, api_servers: SourceNetworks | None = None,
                 refusal_summary: RefusalSummary | None = None) -> None:
        """``max_connections`` None: sized from the open files limit (``mcad.serve.frontdoor.connection_cap``).
        ``clock`` and ``sweep_seconds`` go to the front door: a test that steps its own clock passes None and calls
        ``door.sweep()`` to have the deadlines checked. ``refusal_summary`` defaults to one on ``clock``."""
        host, port = parse_bind_address(bind_address)
        cap = max_connections if max_connections is not None else frontdoor.connection_cap(
            frontdoor.open_files_limit())
        limits = Limits(max_connections=cap, handshake_timeout=read_timeout, idle_timeout=idle_timeout,
                        header_timeout=read_timeout, body_timeout=read_timeout, write_timeout=read_timeout,
                        max_body_bytes=max_body_bytes, workers=workers, worker_wait=worker_wait,
                        big_body_bytes=big_body_bytes, big_lane=big_lane, quick_body_bytes=quick_body_bytes)
        service = _Webhooks({"/mutate": ("mutate", mutate), "/validate": ("validate", validate)}, max_body_bytes,
                            caller_check, api_servers, refusal_summary or RefusalSummary(clock=clock))
        self.service = service
        self.door = FrontDoor(service, (host, port), limits, tls=tls, share_port=share_port,
                              server_header="mcad-webhook", clock=clock, sweep_seconds=sweep_seconds)

    @property
    def listening(self) -> threading.Event:
        return self.door.listening

    @property
    def port(self) -> int:
        return self.door.port

    @property
    def stats(self) -> frontdoor.Stats:
        return self.door.stats

    def start(self) -> None:
        self.door.start()
        log.info("webhook server listening", address=self.door.address[0], port=self.port,
                 endpoints="/mutate /validate", max_connections=self.door.limits.max_connections,
                 workers=self.door.limits.workers, caller_check=self.service.caller_check is not None,
                 api_servers=str(self.service.api_servers) or None)

    def drain(self) -> None:
        """From now on every answer closes its connection (``FrontDoor.drain``): the server is about to stop."""
        self.door.drain()

    def stop(self) -> None:
        self.door.stop()


def review(name: str, reviewer: Reviewer, body: bytes, *, source: str = "",
           refusals: RefusalSummary | None = None) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON answer to one request body (pure, apart from the reviewer and the log); ``source``
    is the caller's address, handed to the reviewer in ``AdmissionRequest.source``. A refusal is logged, one line
    each, or through ``refusals`` when given (a caller not known to be the API server)."""
    try:
        request = AdmissionRequest.parse(deepjson.loads(body), source=source)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        return 400, {"error": f"not an admission.k8s.io/v1 AdmissionReview: {err}"}
    try:
        outcome = reviewer(request)
    except WouldAsk:
        raise  # judged again where the question may be asked (``_Webhooks.quick``)
    except Exception as err:  # a reviewer's bug must refuse, never admit or drop the connection
        log.error("admission reviewer failed", webhook=name, appwrapper=f"{request.namespace}/{request.name}",
                  reason=type(err).__name__, error=str(err)[:500])
        outcome = Outcome.deny(f"mcad admission: internal error in the {name} webhook ({type(err).__name__}); "
                               "the request was not admitted", code=500)
    if not outcome.allowed:
        details = {"webhook": name, "appwrapper": f"{request.namespace}/{request.name}",
                   "user": request.user.username, "operation": request.operation}
        if refusals is not None:
            refusals.note(source, outcome.message, **details)
        else:
            log.info("admission refused", **details, source=source, reason=outcome.message)
    return 200, outcome.response(request.uid)
