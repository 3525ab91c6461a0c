"""The controller's HTTP endpoint: metrics, health, and /debug reads of the dispatcher's state.

Contract:
- ``GET /metrics``: the Prometheus text format of ``Metrics``.
- ``GET /healthz`` (liveness): 200 while the process can do its job; 500 once the dispatcher thread has died (a
  restart is the cure). It does not depend on the API server: an unreachable API server must not get every
  replica killed.
- ``GET /readyz`` (readiness): 200 once the informers have synced, leader election has settled (this replica
  leads, or it knows which one does) and, with the admission webhooks on, their certificate is loaded and their
  server listens; 503 with the reason before that.
- ``GET /debug/queue``, ``/debug/ledger``, ``/debug/quota``, ``/debug/clusters``,
  ``/debug/explain?namespace=NS&name=NAME``: JSON documents of
  ``mcad.debug.Reports``, computed on the dispatcher thread (``Dispatcher.call``) so they see one consistent
  state. A replica that does not lead answers 503 ``{"error": "not the leader", "leader": <identity>}`` so a client
  can go to the leader; 404 for an unknown AppWrapper; 503 when the dispatcher does not answer in time.
- Requests are served by daemon threads; nothing here writes to the API server. Bind address ``host:port``
  (``:8080`` is every interface; port 0 picks a free one, see ``port``).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import structlog

from mcad.debug import Reports
from mcad.dispatcher import Dispatcher
from mcad.events import EventCounters
from mcad.metrics import CONTENT_TYPE, Metrics

log = structlog.get_logger("mcad.server")
Check = Callable[[], tuple[bool, str]]
# How long a /debug request may wait for the dispatcher thread (it may be in the middle of a long cycle).
DEBUG_TIMEOUT_SECONDS = 10.0


def parse_bind_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ``:8080`` binds every interface; ``[::1]:8080`` for IPv6."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bind address must be host:port, e.g. :8080 or 127.0.0.1:8080, not {address!r}")
    return host.strip("[]"), int(port)


class DebugEndpoints:
    """Answers /debug/* from a dispatcher: only on the leader, and only once it runs."""

    def __init__(self, dispatcher: Dispatcher, reports: Reports, *, leading: Callable[[], bool] = lambda: True,
                 leader: Callable[[], str | None] = lambda: None) -> None:
        self.dispatcher = dispatcher
        self.reports = reports
        self.leading = leading
        self.leader = leader

    def answer(self, path: str, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        if not self.leading():
            return 503, {"error": "not the leader", "leader": self.leader()}
        if not self.dispatcher.running.is_set():
            return 503, {"error": "not ready: the informers are still syncing"}
        if path == "/debug/queue":
            call: Callable[[], dict[str, Any] | None] = self.reports.queue
        elif path == "/debug/ledger":
            call = self.reports.ledger
        elif path == "/debug/quota":
            call = self.reports.quota
        elif path == "/debug/clusters":
            call = self.reports.clusters
        elif path == "/debug/explain":
            namespace, name = query.get("namespace", ""), query.get("name", "")
            if not namespace or not name:
                return 400, {"error": "explain needs ?namespace=NS&name=NAME"}

            def call() -> dict[str, Any] | None:
                return self.reports.explain(namespace, name)
        else:
            return 404, {"error": f"no such endpoint {path}; try /debug/queue, /debug/ledger, /debug/quota, "
                                  "/debug/clusters, /debug/explain"}
        try:
            document = self.dispatcher.call(call, DEBUG_TIMEOUT_SECONDS)
        except TimeoutError:
            return 503, {"error": f"the dispatcher did not answer within {DEBUG_TIMEOUT_SECONDS:.0f} s"}
        if document is None:
            return 404, {"error": f"AppWrapper {query.get('namespace')}/{query.get('name')} not found"}
        return 200, document


class _QuietServer(ThreadingHTTPServer):
    """A request that fails is one structured log line, never a traceback printed on stderr, where it would land
    in the middle of another thread's JSON log line. A client that went away before its answer (a /debug read
    given up during a long cycle, a scraper's timeout) is routine and logged at info."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) and client_address else str(client_address)
        if isinstance(err, ConnectionError | TimeoutError):
            log.info("http client went away", client=client, reason=type(err).__name__)
        else:
            log.error("http request failed", client=client, reason=type(err).__name__, error=str(err))


class Server:
    def __init__(self, bind_address: str, *, metrics: Metrics, live: Check, ready: Check,
                 debug: DebugEndpoints | None = None) -> None:
        host, port = parse_bind_address(bind_address)
        handler = _handler(metrics, live, ready, debug)
        self._httpd = _QuietServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("http server listening", address=self._httpd.server_address[0], port=self.port,
                 endpoints="/metrics /healthz /readyz /debug/{queue,ledger,quota,clusters,explain}")

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(metrics: Metrics, live: Check, ready: Check,
             debug: DebugEndpoints | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "mcad"

        def do_GET(self) -> None:  # the name http.server dispatches to
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            if path == "/metrics":
                self._send(200, metrics.render(), CONTENT_TYPE)
            elif path in ("/healthz", "/readyz"):
                ok, reason = (live if path == "/healthz" else ready)()
                self._send(200 if ok else (500 if path == "/healthz" else 503),
                           (reason or "ok").encode() + b"\n", "text/plain; charset=utf-8")
            elif path.startswith("/debug/") and debug is not None:
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                code, document = debug.answer(path, query)
                self._send(code, json.dumps(document, indent=1).encode() + b"\n", "application/json")
            else:
                self._send(404, b"not found: try /metrics, /healthz, /readyz, /debug/queue\n",
                           "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # the base class names it format
            log.debug("http request", client=self.address_string(), request=format % args)

    return Handler


def observe(dispatcher: Dispatcher, informers: list[Any], *, api_errors: Callable[[], Mapping[tuple[str, int], int]]
            | None = None, leading: Callable[[], bool] | None = None,
            events: Callable[[], EventCounters] | None = None) -> None:
    """Point the dispatcher's metrics at what a scrape reads (see ``mcad.metrics.Sources``)."""
    sources = dispatcher.metrics.sources
    ledger = dispatcher.ledger
    sources.capacity = lambda: (ledger.capacity(), ledger.in_use(), ledger.reserved(), ledger.free())
    sources.queue = dispatcher.queue_lengths

    def states() -> dict[str, int]:
        counts: dict[str, int] = {}
        # status_of: our own writes count before the watch brings them back (dict reads are atomic).
        for aw in dispatcher.appwrappers.list():
            state = dispatcher.status_of(aw).state
            counts[state] = counts.get(state, 0) + 1
        return counts

    def informer_states() -> dict[str, tuple[int, bool]]:
        every = list(informers) + (dispatcher.wrapped.informers() if dispatcher.wrapped is not None else []) + (
            dispatcher.hub.informers() if dispatcher.hub is not None else [])
        return {i.name: (int(i.relists), bool(i.has_synced())) for i in every}

    hub = dispatcher.hub
    if hub is not None:
        def clusters() -> list[tuple[str, str, bool, int]]:
            placed = dispatcher.placed_counts()
            return [(w.name, w.health.state.value, w.usable(), placed.get(w.name, 0)) for w in hub.workers]

        sources.clusters = clusters

    sources.appwrapper_states = states
    sources.quota = lambda: dispatcher.quota_samples
    sources.informers = informer_states
    sources.api_errors = api_errors
    sources.leader = leading
    sources.events = events
