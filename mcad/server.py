"""The controller's HTTP endpoint: metrics, health, and /debug reads of the dispatcher's state.

Contract:
- ``GET /healthz`` (liveness): 200 while the process can do its job; 500 once the dispatcher thread has died (a
  restart is the cure). It does not depend on the API server: an unreachable API server must not get every
  replica killed. ``GET /readyz`` (readiness): 200 once the informers have synced and leader election has settled
  (this replica leads, or it knows which one does) and, with the admission webhooks on, their certificate is
  loaded and their server listens; 503 with the reason before that. Both are open to anyone.
- Everything else needs a bearer token (``Authorization``, or ``X-Mcad-Authorization`` through the API server's
  proxy, see ``mcad.endpointauth``), TokenReviewed and then SubjectAccessReviewed: no token or a token the API
  server does not accept -> 401; a right missing -> 403 naming it; a review that could not be made -> 503.
  - ``GET /metrics``: the Prometheus text format of ``Metrics``; needs ``get`` on the non-resource URL
    ``/metrics``.
  - ``GET /debug/ledger``, ``/debug/quota``, ``/debug/clusters``: cluster-wide capacity; each needs ``get`` on its
    own non-resource URL (``/debug/ledger`` ...).
  - ``GET /debug/queue``: only the AppWrappers of namespaces where the caller may ``list`` appwrappers
    (workload.codeflare.dev): one cluster-wide check, then one per namespace shown (positions stay those of the
    whole queue). 403 when it may list them in no namespace that holds any AppWrapper.
  - ``GET /debug/explain?namespace=NS&name=NAME``: 404 when the caller may not list appwrappers in NS, exactly as
    for an AppWrapper that does not exist (its existence is not leaked).
  With ``insecure=True`` (the controller's --insecure-debug-endpoints, for local debugging only) nothing is
  checked.
- /debug documents are those of ``mcad.debug.Reports``, read from a snapshot the dispatcher loop builds
  (``mcad.snapshots``): readers never touch dispatcher state, and however many poll, the loop spends at most one
  build per interval on them. 503 "busy, retry" when no snapshot came in time. A replica that does not lead
  answers 503 ``{"error": "not the leader", "leader": <identity>}`` so a client can go to the leader.
- Requests are served by daemon threads; nothing here writes to the API server (the reviews are creates of
  TokenReviews and SubjectAccessReviews, which store nothing). Bind address ``host:port`` (``:8080`` is every
  interface; port 0 picks a free one, see ``port``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import structlog

from mcad.admission.request import UserInfo
from mcad.api.appwrapper import GROUP, PLURAL
from mcad.boundedserver import BoundedServer
from mcad.dashboard import SECURITY_HEADERS, Answer, Dashboard, Refusal, Source
from mcad.debug import Reports
from mcad.dispatcher import Dispatcher
from mcad.endpointauth import Attributes, Gate, ReviewUnavailable, Unauthenticated, bearer_token
from mcad.events import EventCounters
from mcad.hub.connections import Hub
from mcad.metrics import CONTENT_TYPE, Metrics
from mcad.recentevents import RecentEvents
from mcad.snapshots import DEFAULT_INTERVAL_SECONDS, Busy, Part, Snapshot, Snapshots, encode

log = structlog.get_logger("mcad.server")
Check = Callable[[], tuple[bool, str]]
# How long a /debug request may wait for a snapshot (the dispatcher may be in the middle of a long cycle), and for
# the access reviews of one request.
DEBUG_TIMEOUT_SECONDS = 10.0
ACCESS_TIMEOUT_SECONDS = 10.0
# Connections served at once (scrapers, mcadctl, probes: a handful in practice), and how long one may take to send
# its request.
MAX_CONNECTIONS = 64
READ_TIMEOUT_SECONDS = 10.0
# The non-resource URLs the cluster-wide documents are authorized by (the chart's debug viewer ClusterRole).
CLUSTER_WIDE = ("/debug/ledger", "/debug/quota", "/debug/clusters")
_NO_TOKEN = ("no bearer token: send 'Authorization: Bearer <token>' (or, through the API server's proxy, "
             "'X-Mcad-Authorization: Bearer <token>'); mcadctl does this with your kubeconfig's token or --token")


def parse_bind_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ``:8080`` binds every interface; ``[::1]:8080`` for IPv6."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bind address must be host:port, e.g. :8080 or 127.0.0.1:8080, not {address!r}")
    return host.strip("[]"), int(port)


class Refused(Refusal):
    """A request that is not answered: its HTTP status, a short message, and what else the answer says (the
    ``document``). The dashboard's views raise it through as their own ``Refusal``."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(status, {"error": message, **extra})
        self.message = message


class Access:
    """Authentication and authorization of one request at a time, over a ``Gate``; ``gate=None`` allows all."""

    def __init__(self, gate: Gate | None) -> None:
        self.gate = gate

    def user(self, headers: Any) -> UserInfo | None:
        """The caller (None when access is not checked); ``Refused`` 401 or 503."""
        if self.gate is None:
            return None
        token = bearer_token(headers)
        if token is None:
            raise Refused(401, _NO_TOKEN)
        try:
            return self.gate.authenticate(token)
        except Unauthenticated as err:
            raise Refused(401, f"the bearer token was not accepted: {err}") from err
        except ReviewUnavailable as err:
            raise Refused(503, f"cannot check the bearer token now: {err}") from err

    def allowed(self, user: UserInfo | None, attributes: Attributes) -> bool:
        if self.gate is None or user is None:
            return True
        try:
            return self.gate.allowed(user, attributes)
        except ReviewUnavailable as err:
            raise Refused(503, f"cannot check access now: {err}") from err

    def require(self, user: UserInfo | None, path: str) -> None:
        attributes = Attributes(verb="get", path=path)
        if not self.allowed(user, attributes):
            raise Refused(403, f"{user.username if user else 'you'} may not {attributes.describe()} "
                               "(a ClusterRole with nonResourceURLs and verb get grants it)")

    def may_list(self, user: UserInfo | None, namespace: str) -> bool:
        """Whether ``user`` may list AppWrappers in ``namespace`` ("" : in every namespace)."""
        return self.allowed(user, Attributes(verb="list", group=GROUP, resource=PLURAL, namespace=namespace))

    def visible(self, user: UserInfo | None, shown: Iterable[str], known: Iterable[str]) -> frozenset[str] | None:
        """The namespaces of ``shown`` whose AppWrappers ``user`` may see (None: all). ``Refused`` 403 when it may
        list AppWrappers in no namespace of ``known`` either; 503 when the checks take too long."""
        if self.gate is None or user is None or self.may_list(user, ""):
            return None
        deadline = time.monotonic() + ACCESS_TIMEOUT_SECONDS
        visible = set()
        for namespace in sorted(set(shown)):
            self._in_time(deadline)
            if self.may_list(user, namespace):
                visible.add(namespace)
        if not visible:
            for namespace in sorted(set(known) - set(shown)):
                self._in_time(deadline)
                if self.may_list(user, namespace):
                    break
            else:
                raise Refused(403, f"{user.username} may not list appwrappers.{GROUP} in any namespace that "
                                   "holds AppWrappers")
        return frozenset(visible)

    @staticmethod
    def _in_time(deadline: float) -> None:
        # The answers so far are cached: a retry goes further.
        if time.monotonic() > deadline:
            raise Refused(503, "checking access to every namespace took too long; retry")


class DebugEndpoints:
    """Answers /debug/* from the dispatcher's snapshots: only on the leader, and only once it runs."""

    def __init__(self, snapshots: Snapshots, *, running: Callable[[], bool], leading: Callable[[], bool] =
                 lambda: True, leader: Callable[[], str | None] = lambda: None,
                 timeout: float = DEBUG_TIMEOUT_SECONDS) -> None:
        self.snapshots = snapshots
        self.running = running
        self.leading = leading
        self.leader = leader
        self.timeout = timeout

    def answer(self, path: str, query: Mapping[str, str], *, user: UserInfo | None = None,
               access: Access | None = None) -> tuple[int, dict[str, Any] | bytes]:
        """The status and the document: a dict, or the JSON of one that every reader shares."""
        access = access if access is not None else Access(None)
        try:
            return self._answer(path, query, user, access)
        except Refused as refused:
            return refused.status, refused.document

    def snapshot(self, parts: set[Part], *, fresh_within: float | None = None) -> Snapshot:
        """A snapshot holding ``parts`` (see ``Snapshots.read``); ``Refused`` 503 on a standby (naming the leader),
        before the informers synced, or when the loop is too busy to build one in time. No parts: only the
        checks."""
        if not self.leading():
            raise Refused(503, "not the leader", leader=self.leader())
        if not self.running():
            raise Refused(503, "not ready: the informers are still syncing")
        if not parts:
            return Snapshot(time.monotonic())
        try:
            return self.snapshots.read(parts, self.timeout, fresh_within=fresh_within)
        except Busy as err:
            raise Refused(503, f"busy, retry: {err}") from err

    def _answer(self, path: str, query: Mapping[str, str], user: UserInfo | None,
                access: Access) -> tuple[int, dict[str, Any] | bytes]:
        part: Part
        if path in CLUSTER_WIDE:
            part = path.removeprefix("/debug/")
            access.require(user, path)
        elif path == "/debug/queue":
            part = "queue"
        elif path == "/debug/explain":
            namespace, name = query.get("namespace", ""), query.get("name", "")
            if not namespace or not name:
                return 400, {"error": "explain needs ?namespace=NS&name=NAME"}
            part = ("explain", namespace, name)
            if not access.may_list(user, "") and not access.may_list(user, namespace):
                return self._unknown(namespace, name)  # the same answer as for one that does not exist
        else:
            return 404, {"error": f"no such endpoint {path}; try /debug/queue, /debug/ledger, /debug/quota, "
                                  "/debug/clusters, /debug/explain"}
        snapshot = self.snapshot({part})
        document = snapshot.documents[part]
        if isinstance(part, tuple) and document is None:
            return self._unknown(part[1], part[2])
        if part == "queue":
            reservations = document.get("reservations", [])
            shown = {aw["namespace"] for aw in document["queued"] + document["dispatched"]}
            shown |= {held["appwrapper"].partition("/")[0] for held in reservations}
            visible = access.visible(user, shown, snapshot.namespaces)
            if visible is not None:
                # Reservations name their holders and nodes: shown only for the namespaces the caller may list.
                return 200, {**document,
                             "queued": [aw for aw in document["queued"] if aw["namespace"] in visible],
                             "dispatched": [aw for aw in document["dispatched"] if aw["namespace"] in visible],
                             "reservations": [held for held in reservations
                                              if held["appwrapper"].partition("/")[0] in visible]}
        return 200, snapshot.encoded(part)

    @staticmethod
    def _unknown(namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        return 404, {"error": f"AppWrapper {namespace}/{name} not found"}


class DashboardSource(Source):
    """The dashboard's views read what /debug reads, with the same checks of the caller's rights (its ``Refused``
    is the views' ``Refusal``)."""

    def __init__(self, debug: DebugEndpoints, access: Access) -> None:
        self.debug = debug
        self.access = access

    def snapshot(self, parts: set[Part], user: UserInfo | None, *, fresh_within: float | None,
                 require: tuple[str, ...] = ()) -> Snapshot:
        for path in require:
            self.access.require(user, path)
        return self.debug.snapshot(parts, fresh_within=fresh_within)

    def visible_namespaces(self, user: UserInfo | None, shown: set[str],
                           known: frozenset[str]) -> frozenset[str] | None:
        return self.access.visible(user, shown, known)

    def may_list(self, user: UserInfo | None, namespace: str) -> bool:
        return self.access.may_list(user, namespace)


class _QuietServer(BoundedServer):
    """A request that fails is one structured log line, never a traceback printed on stderr, where it would land
    in the middle of another thread's JSON log line. A client that went away before its answer (a /debug read
    given up during a long cycle, a scraper's timeout) is routine and logged at info.

    At most ``MAX_CONNECTIONS`` connections are served at once (one thread each); a connection beyond that is
    closed at once, so a flood of clients costs threads and memory up to a bound, not without one."""

    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler, slots=MAX_CONNECTIONS)

    def turn_away(self, request: Any, client_address: Any) -> None:
        log.warning("http connection refused: every slot busy", slots=MAX_CONNECTIONS)
        super().turn_away(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) and client_address else str(client_address)
        if isinstance(err, ConnectionError | TimeoutError):
            log.info("http client went away", client=client, reason=type(err).__name__)
        else:
            log.error("http request failed", client=client, reason=type(err).__name__, error=str(err))


class Server:
    def __init__(self, bind_address: str, *, metrics: Metrics, live: Check, ready: Check,
                 debug: DebugEndpoints | None = None, gate: Gate | None = None, insecure: bool = False,
                 recent_events: RecentEvents | None = None,
                 summary: Callable[[], Mapping[str, Any]] | None = None) -> None:
        """``gate`` checks every request but health and the dashboard's static files; ``insecure`` (and no gate)
        checks none. With ``debug``, the dashboard is served at /ui (``recent_events`` and ``summary`` feed its
        detail and headline views)."""
        if gate is None and not insecure:
            raise ValueError("a Server needs a Gate to check access, or insecure=True")
        host, port = parse_bind_address(bind_address)
        access = Access(None if insecure else gate)
        dashboard = None if debug is None else Dashboard(DashboardSource(debug, access), events=recent_events,
                                                          summary=summary)
        handler = _handler(metrics, live, ready, debug, access, dashboard)
        self.insecure = insecure
        self._httpd = _QuietServer((host, port), handler)
        if dashboard is not None:
            dashboard.port = self.port
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("http server listening", address=self._httpd.server_address[0], port=self.port,
                 endpoints="/metrics /healthz /readyz /debug/{queue,ledger,quota,clusters,explain} /ui",
                 access="open to anyone" if self.insecure else "bearer token, TokenReview, SubjectAccessReview")

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(metrics: Metrics, live: Check, ready: Check, debug: DebugEndpoints | None,
             access: Access, dashboard: Dashboard | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "mcad"
        # Headers and body go out in separate writes: with Nagle's algorithm the body waits for the client's
        # delayed ACK (~40 ms per answer).
        disable_nagle_algorithm = True
        # A client that sends its request slower than this loses its connection (and its slot).
        timeout = READ_TIMEOUT_SECONDS

        def do_GET(self) -> None:  # the name http.server dispatches to
            url = urlsplit(self.path)
            if dashboard is not None and (url.path == "/ui" or url.path.startswith("/ui/")):
                self._dashboard(url.path, url.query)
                return
            path = url.path.rstrip("/") or "/"
            if path in ("/healthz", "/readyz"):
                ok, reason = (live if path == "/healthz" else ready)()
                self._send(200 if ok else (500 if path == "/healthz" else 503),
                           (reason or "ok").encode() + b"\n", "text/plain; charset=utf-8")
            elif path == "/metrics":
                try:
                    access.require(access.user(self.headers), "/metrics")
                except Refused as refused:
                    self._refuse(refused, json_body=False)
                    return
                self._send(200, metrics.render(), CONTENT_TYPE)
            elif path.startswith("/debug/") and debug is not None:
                try:
                    user = access.user(self.headers)
                except Refused as refused:
                    self._refuse(refused, json_body=True)
                    return
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                code, document = debug.answer(path, query, user=user, access=access)
                self._send(code, document if isinstance(document, bytes) else encode(document), "application/json")
            else:
                self._send(404, b"not found: try /metrics, /healthz, /readyz, /debug/queue\n",
                           "text/plain; charset=utf-8")

        # HEAD answers as GET would, without the body (a proxy or a link checker asks it of the page).
        do_HEAD = do_GET

        def _dashboard(self, path: str, raw_query: str) -> None:
            assert dashboard is not None
            if path.startswith("/ui/api/"):
                try:
                    user = access.user(self.headers)
                except Refused as refused:
                    self._refuse(refused, json_body=True)
                    return
                query = {k: v[-1] for k, v in parse_qs(raw_query).items()}
                answer = dashboard.view(path.removeprefix("/ui/api/"), query, user)
            else:
                page = dashboard.page(path)
                answer = page if page is not None else Answer(404, b"not found\n", "text/plain; charset=utf-8",
                                                              SECURITY_HEADERS)
            self._send(answer.status, answer.body, answer.content_type, answer.headers)

        def _refuse(self, refused: Refused, *, json_body: bool) -> None:
            if json_body:
                body, content_type = encode({"error": refused.message}), "application/json"
            else:
                body, content_type = refused.message.encode() + b"\n", "text/plain; charset=utf-8"
            headers = {"WWW-Authenticate": 'Bearer realm="mcad"'} if refused.status == 401 else {}
            self._send(refused.status, body, content_type, headers)

        def _send(self, code: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # the base class names it format
            log.debug("http request", client=self.address_string(), request=format % args)

    return Handler


def debug_endpoints(dispatcher: Dispatcher, reports: Reports, *, leading: Callable[[], bool] = lambda: True,
                    leader: Callable[[], str | None] = lambda: None,
                    interval: float | None = None) -> DebugEndpoints:
    """/debug over ``dispatcher``: snapshots built on its thread by ``reports`` (``mcad.debug.Reports``)."""
    def namespaces() -> set[str]:
        return {aw.namespace for aw in dispatcher.appwrappers.list()}

    snapshots = Snapshots(dispatcher.call, reports, namespaces,
                          interval=DEFAULT_INTERVAL_SECONDS if interval is None else interval)
    return DebugEndpoints(snapshots, running=dispatcher.running.is_set, leading=leading, leader=leader)


def observe(dispatcher: Dispatcher, informers: list[Any], *, api_errors: Callable[[], Mapping[tuple[str, int], int]]
            | None = None, leading: Callable[[], bool] | None = None,
            events: Callable[[], EventCounters] | None = None, hub: Hub | None = None) -> None:
    """Point the dispatcher's metrics at what a scrape reads (see ``mcad.metrics.Sources``); ``hub``: the worker
    clusters in hub mode."""
    sources = dispatcher.metrics.sources
    # What the loop published last (an immutable object, replaced whole): never its own maps, mid-change.
    sources.capacity = lambda: dispatcher.published.capacity
    sources.queue = lambda: dispatcher.published.queue
    sources.reservations = lambda: dispatcher.published.reservations
    sources.gated_pods = lambda: dispatcher.published.gated

    def states() -> dict[str, int]:
        # The informer's store (thread-safe), corrected by the loop's decisions it does not show yet.
        decided = dispatcher.published.decided
        counts: dict[str, int] = {}
        for aw in dispatcher.appwrappers.list():
            mine = decided.get(aw.key)
            state = mine[1] if mine is not None and mine[0] == aw.uid else aw.status.state
            counts[state] = counts.get(state, 0) + 1
        return counts

    sources.appwrapper_states = states

    def informer_states() -> dict[str, tuple[int, bool]]:
        every = list(informers) + (dispatcher.wrapped.informers() if dispatcher.wrapped is not None else []) + (
            hub.informers() if hub is not None else [])
        return {i.name: (int(i.relists), bool(i.has_synced())) for i in every}

    if hub is not None:
        workers = hub.workers

        def clusters() -> list[tuple[str, str, bool, int]]:
            placed = dispatcher.published.placed
            return [(w.name, w.health.state.value, w.usable(), placed.get(w.name, 0)) for w in workers]

        sources.clusters = clusters

    quota_status = dispatcher.quota_status
    # Without quota trees the families are still described, with no rows.
    sources.quota = (lambda: quota_status.samples) if quota_status is not None else tuple
    sources.informers = informer_states
    sources.api_errors = api_errors
    sources.leader = leading
    sources.events = events
