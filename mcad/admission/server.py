"""The HTTPS endpoint of the admission webhooks, served by every replica (leader or standby).

Contract:
- ``POST /mutate`` and ``POST /validate`` take an ``admission.k8s.io/v1`` AdmissionReview, hand the parsed
  ``AdmissionRequest`` to the mutating or validating reviewer, and answer ``Outcome.response(uid)`` (200).
- A body that is not an AdmissionReview: 400 with the reason. A body longer than ``max_body_bytes``: 413, unread.
  No Content-Length: 411. Any other path: 404; any other method: 405.
- With ``caller_check`` (``mcad.admission.callers.CallerCheck``), each request's headers, the peer's verified TLS
  client certificate (DER, or None) and address are checked before anything else: a reason answers 401, unread.
  The request's ``source`` is the peer's address (admission bounds SubjectAccessReviews per source).
- A reviewer that raises refuses the request (allowed=false, "internal error ..."): nothing is admitted unchecked.
  Each refusal is one log line (appwrapper=ns/name, user, reason).
- TLS with the context ``tls()`` returns at the time of each connection, so a reloaded certificate serves the next
  connection; until there is one, connections are closed at once. The handshake and each request (headers and
  body, from its first byte) must arrive within ``read_timeout``, else the connection is closed; a kept-alive
  connection waits ``idle_timeout`` for its next request (longer than the API server's own idle timeout, so the
  client closes idle connections, never the server under a request in flight); at most ``max_connections``
  connections are served at once (more wait in the kernel's backlog, and one that waits over ``read_timeout`` for
  a slot is closed): a client that sends slowly or not at all holds a slot for a bounded time.
- ``listening`` is set once the socket is bound and served. Bind address as ``mcad.server.parse_bind_address``.
  ``share_port`` (SO_REUSEPORT) lets several processes of one user on one host serve the same port, the kernel
  spreading connections over them as a Service spreads them over pods: replicas run outside a cluster (tests).
"""

from __future__ import annotations

import contextlib
import heapq
import io
import itertools
import json
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, cast

import structlog

from mcad.admission.request import AdmissionRequest, Outcome, Reviewer
from mcad.boundedserver import BoundedServer
from mcad.server import parse_bind_address

log = structlog.get_logger("mcad.admission.server")

DEFAULT_BIND_ADDRESS = ":9443"
# The API server gives a webhook timeoutSeconds (10 in the chart) for the whole call; nothing here waits longer.
DEFAULT_READ_TIMEOUT = 10.0
# How long a kept-alive connection may wait for its next request. Longer than the API server's own idle timeout
# (Go's 90 s): the client must be the one to close an idle connection, or it may send a POST on one the server is
# closing, and a POST is not retried (the create fails with "broken pipe", failurePolicy Fail).
DEFAULT_IDLE_TIMEOUT = 120.0
# The API server keeps up to 25 idle connections to a webhook host, besides those in use.
DEFAULT_MAX_CONNECTIONS = 64
# Beyond the AppWrapper's own bound: an UPDATE carries the object twice (object and oldObject), each with its
# metadata, managedFields and possibly kubectl's last-applied copy of the spec, hence four times plus headroom.
BODY_OVERHEAD_BYTES = 256 * 1024


CallerCheck = Callable[[Mapping[str, str], bytes | None, str], str | None]


def max_body_bytes(max_appwrapper_bytes: int) -> int:
    """The largest AdmissionReview body accepted for AppWrappers bounded by ``max_appwrapper_bytes``."""
    return 4 * max_appwrapper_bytes + BODY_OVERHEAD_BYTES


TlsSource = Callable[[], ssl.SSLContext | None]


class _Deadlines:
    """Every connection's deadline, kept by one thread: ``arm(seconds, action)`` runs ``action`` (in that thread)
    unless ``disarm(token)`` comes first. A ``threading.Timer`` per request cost a thread start on every review,
    with its handoffs of the interpreter lock, which a busy controller made slow. Disarmed entries leave the heap
    when they reach its head, or all at once when they outnumber the live ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._live: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, action: Callable[[], None]) -> int:
        token = next(self._tokens)
        with self._cond:
            self._live.add(token)
            heapq.heappush(self._heap, (time.monotonic() + seconds, token, action))
            if len(self._heap) > 2 * len(self._live) + 64:
                self._heap = [entry for entry in self._heap if entry[1] in self._live]
                heapq.heapify(self._heap)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="webhook-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == token:
                self._cond.notify()
        return token

    def disarm(self, token: int | None) -> None:
        if token is not None:
            with self._cond:
                self._live.discard(token)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][1] not in self._live:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    when, token, action = self._heap[0]
                    wait = when - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(self._heap)
                        self._live.discard(token)
                        break
                    self._cond.wait(wait)
            action()


class _TlsServer(BoundedServer):
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], tls: TlsSource,
                 max_connections: int, read_timeout: float, share_port: bool) -> None:
        self.allow_reuse_port = share_port
        self.tls = tls
        self.read_timeout = read_timeout
        # A connection waits for a slot up to the read timeout: the API server's review waits, then fails open
        # or closed by the webhook's failurePolicy.
        super().__init__(address, handler, slots=max_connections, slot_wait=read_timeout)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        context = self.tls()
        if context is None:
            sock.close()
            raise OSError("no webhook certificate loaded yet")  # socketserver skips this connection
        sock.settimeout(self.read_timeout)
        # The handshake happens in the handler's thread (first read), under the read timeout, never here.
        return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def turn_away(self, request: Any, client_address: Any) -> None:
        log.warning("webhook connection refused: every slot busy", client=_client(client_address))
        super().turn_away(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # One log line, never a traceback on stderr in the middle of another thread's JSON line. Clients that go
        # away, time out or fail the TLS handshake (a probe, a scanner) are routine.
        err = sys.exc_info()[1]
        if isinstance(err, ConnectionError | TimeoutError | ssl.SSLError | socket.timeout):
            log.info("webhook client went away", client=_client(client_address), reason=type(err).__name__)
        else:
            log.error("webhook request failed", client=_client(client_address), reason=type(err).__name__,
                      error=str(err))


def _client(address: Any) -> str:
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


class WebhookServer:
    def __init__(self, bind_address: str, *, tls: TlsSource, mutate: Reviewer, validate: Reviewer,
                 max_body_bytes: int, read_timeout: float = DEFAULT_READ_TIMEOUT,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, share_port: bool = False,
                 caller_check: CallerCheck | None = None) -> None:
        host, port = parse_bind_address(bind_address)
        handler = _handler({"/mutate": ("mutate", mutate), "/validate": ("validate", validate)}, max_body_bytes,
                           read_timeout, idle_timeout, _Deadlines(), caller_check)
        self._httpd = _TlsServer((host, port), handler, tls, max_connections, read_timeout,
                                 share_port)
        self._thread = threading.Thread(target=self._serve, name="webhook", daemon=True)
        self.listening = threading.Event()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def _serve(self) -> None:
        self.listening.set()
        self._httpd.serve_forever()

    def start(self) -> None:
        self._thread.start()
        log.info("webhook server listening", address=self._httpd.server_address[0], port=self.port,
                 endpoints="/mutate /validate")

    def stop(self) -> None:
        self.listening.clear()
        self._httpd.shutdown()
        self._httpd.server_close()


def review(name: str, reviewer: Reviewer, body: bytes, source: str = "") -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON answer to one request body from ``source`` (the peer's address) (pure, apart from
    the reviewer and the log)."""
    try:
        request = AdmissionRequest.parse(json.loads(body), source=source)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        return 400, {"error": f"not an admission.k8s.io/v1 AdmissionReview: {err}"}
    try:
        outcome = reviewer(request)
    except Exception as err:  # a reviewer's bug must refuse, never admit or drop the connection
        log.error("admission reviewer failed", webhook=name, appwrapper=f"{request.namespace}/{request.name}",
                  reason=type(err).__name__, error=str(err)[:500])
        outcome = Outcome.deny(f"mcad admission: internal error in the {name} webhook ({type(err).__name__}); "
                               "the request was not admitted", code=500)
    if not outcome.allowed:
        log.info("admission refused", webhook=name, appwrapper=f"{request.namespace}/{request.name}",
                 user=request.user.username, operation=request.operation, reason=outcome.message)
    return 200, outcome.response(request.uid)


def _handler(routes: dict[str, tuple[str, Reviewer]], max_body: int, read_timeout: float, idle_timeout: float,
             deadlines: _Deadlines, caller_check: CallerCheck | None = None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "mcad-webhook"
        protocol_version = "HTTP/1.1"  # the API server reuses connections
        # Headers and body go out as separate writes: with Nagle's algorithm the body waited for the client's
        # delayed ACK, 40 ms a review on a kept-alive connection (p50 44 ms before, measured on this machine).
        disable_nagle_algorithm = True

        _deadline: int | None = None

        def setup(self) -> None:
            super().setup()
            # No per-read socket timeout: the deadlines below bound each phase of the connection instead.
            self.connection.settimeout(None)
            self._arm(read_timeout)
            self.connection.do_handshake()

        def handle_one_request(self) -> None:
            # A kept-alive connection may wait idle_timeout for its next request; once its first byte is in, the
            # request must arrive whole within the read timeout: a per-read timeout alone lets a client sending
            # one byte every few seconds hold a slot.
            self._arm(idle_timeout)
            try:
                # rfile is a BufferedReader (StreamRequestHandler's rbufsize is -1): peek waits for the first byte.
                if not cast(io.BufferedReader, self.rfile).peek(1):
                    self.close_connection = True
                    return
                self._arm(read_timeout)
                super().handle_one_request()
            finally:
                self._disarm()

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._deadline = deadlines.arm(seconds, self._cut)

        def _disarm(self) -> None:
            deadlines.disarm(self._deadline)
            self._deadline = None

        def _cut(self) -> None:
            # The plain socket's shutdown, not SSLSocket's (which drops its TLS state under the reading thread):
            # the blocked read then ends, and the connection with it.
            with contextlib.suppress(OSError):  # already closed
                socket.socket.shutdown(self.connection, socket.SHUT_RDWR)

        def do_POST(self) -> None:  # the name http.server dispatches to
            peer = _client(self.client_address)
            if caller_check is not None:
                # Before the body is read: an unauthenticated caller costs neither a parse nor a review.
                peer_certificate = cast(ssl.SSLSocket, self.connection).getpeercert(binary_form=True)
                refused = caller_check(cast(Mapping[str, str], self.headers), peer_certificate, peer)
                if refused is not None:
                    self._reply(401, {"error": f"the webhook's caller is not authenticated: {refused}"}, close=True)
                    return
            path = self.path.split("?", 1)[0]
            route = routes.get(path)
            if route is None:
                self._reply(404, {"error": f"no webhook at {path}; try /mutate or /validate"}, close=True)
                return
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self._reply(411, {"error": "Content-Length is required"}, close=True)
                return
            size = int(length)
            if size > max_body:
                self._reply(413, {"error": f"AdmissionReview of {size} bytes is over the bound of {max_body}"},
                            close=True)
                return
            body = self._read(size)
            if body is None:
                return
            self._disarm()  # the request is in; the review has its own bounds
            code, answer = review(route[0], route[1], body, peer)
            self._reply(code, answer, close=code != 200)

        def do_GET(self) -> None:
            self._reply(405, {"error": "the webhooks take POST"}, close=True)

        def _read(self, size: int) -> bytes | None:
            """The body (a slow sender is cut off by the request's deadline: the read then ends empty)."""
            chunks: list[bytes] = []
            left = size
            while left > 0:
                chunk = self.rfile.read1(min(left, 65536))
                if not chunk:
                    self.close_connection = True
                    return None
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)

        def _reply(self, code: int, answer: dict[str, Any], *, close: bool) -> None:
            body = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # the base class names it format
            log.debug("webhook request", client=self.address_string(), request=format % args)

    return Handler
