"""The controller's HTTP endpoint: metrics, health, and /debug reads of the dispatcher's state.

Contract:
- ``GET /healthz`` (liveness): 200 while the process can do its job; 500 once the dispatcher thread has died (a
  restart is the cure). It does not depend on the API server: an unreachable API server must not get every
  replica killed. ``GET /readyz`` (readiness): 200 once the informers have synced and leader election has settled
  (this replica leads, or it knows which one does) and, with the admission webhooks on, their certificate is
  loaded and their server listens; 503 with the reason before that. Both are open to anyone.
- Everything else needs a bearer token (``Authorization``, or ``X-Mcad-Authorization`` through the API server's
  proxy, see ``mcad.serve.endpointauth``), TokenReviewed and then SubjectAccessReviewed: no token or a token the API
  server does not accept -> 401; a right missing -> 403 naming it; a review that could not be made -> 503.
  - ``GET /metrics``: the Prometheus text format of ``Metrics``; needs ``get`` on the non-resource URL
    ``/metrics``.
  - ``GET /debug/ledger``, ``/debug/quota``, ``/debug/clusters``: cluster-wide capacity; each needs ``get`` on its
    own non-resource URL (``/debug/ledger`` ...).
  - ``GET /debug/queue``: only the AppWrappers of namespaces where the caller may ``list`` appwrappers
    (workload.codeflare.dev): one cluster-wide check, then one per namespace shown (positions stay those of the
    whole queue). 403 when it may list them in no namespace that holds any AppWrapper. Such a reader is also told
    ``aheadOfYou`` and ``fairShare`` with other namespaces and tenants only counted, never named
    (``mcad.model.standing``); with cluster-wide rights, ``fairShare`` names every tenant. ``?namespace=NS``: NS's
    rows and reservations alone (only those are formatted: at 100,000 queued the whole document is tens of MB);
    403 unless the caller may list them in NS, 400 for a name that is not a namespace's. ``?limit=N&offset=M``:
    only N queued rows from place M on (N at most ``MAX_QUEUE_PAGE``; the resetting and dispatched ones all) and
    ``page`` with ``queuedTotal``, for either form; 400 for a value that is not a whole number or a limit of 0.
  - ``GET /debug/explain?namespace=NS&name=NAME``: 404 when the caller may not list appwrappers in NS, exactly as
    for an AppWrapper that does not exist (its existence is not leaked).
  With ``insecure=True`` (the controller's --insecure-debug-endpoints, for local debugging only) nothing is
  checked.
- /debug documents are those of ``mcad.serve.debug.Reports``, read from a snapshot the dispatcher loop builds
  (``mcad.serve.snapshots``): readers never touch dispatcher state, and however many poll, the loop spends at most one
  build per interval on them. 503 "busy, retry" when no snapshot came in time. A replica that does not lead
  answers 503 ``{"error": "not the leader", "leader": <identity>}`` so a client can go to the leader.
- Served by ``mcad.serve.frontdoor``: one event loop holds every connection, each request phase has its deadline, and
  ``/healthz`` and ``/readyz`` are answered on the event loop itself, never queued behind other requests; the rest
  runs in ``WORKERS`` threads (503 "busy, retry" after ``WORKER_WAIT_SECONDS`` without one). GET and HEAD only
  (else 405), no request body (413). Nothing here writes to the API server (the reviews are creates of
  TokenReviews and SubjectAccessReviews, which store nothing). Bind address ``host:port`` (``:8080`` is every
  interface; port 0 picks a free one, see ``port``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import structlog

from mcad.admission.request import UserInfo
from mcad.api.appwrapper import GROUP, PLURAL
from mcad.api.names import is_dns_label
from mcad.hub.connections import Hub
from mcad.k8s.events import EventCounters
from mcad.k8s.recentevents import RecentEvents
from mcad.loop.dispatcher import Dispatcher
from mcad.metrics import CONTENT_TYPE, Metrics
from mcad.serve import frontdoor
from mcad.serve.dashboard import SECURITY_HEADERS, Answer, Dashboard, Refusal, Source, whole_number
from mcad.serve.debug import Reports
from mcad.serve.endpointauth import Attributes, Gate, ReviewUnavailable, Unauthenticated, bearer_token
from mcad.serve.frontdoor import FrontDoor, Limits
from mcad.serve.http1 import Head, Response
from mcad.serve.queuereport import MAX_QUEUE_PAGE, as_report
from mcad.serve.snapshots import DEFAULT_INTERVAL_SECONDS, Busy, Part, Snapshot, Snapshots, encode

log = structlog.get_logger("mcad.serve.server")
Check = Callable[[], tuple[bool, str]]
# How long a /debug request may wait for a snapshot (the dispatcher may be in the middle of a long cycle), and for
# the access reviews of one request.
DEBUG_TIMEOUT_SECONDS = 10.0
ACCESS_TIMEOUT_SECONDS = 10.0
# How long a client may take to send its request (head, from its first byte), to read its answer, and to send its
# next request on a kept-alive connection. Connections held at once are bounded by the front door
# (``mcad.serve.frontdoor``, sized from the open files limit).
READ_TIMEOUT_SECONDS = 10.0
WRITE_TIMEOUT_SECONDS = 30.0
IDLE_TIMEOUT_SECONDS = 120.0
# Requests answered at once (/metrics, /debug, /ui: each may wait on a TokenReview or a snapshot), and how long a
# request may wait for one of them before it is answered 503.
WORKERS = 8
WORKER_WAIT_SECONDS = 5.0
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
        only = ""  # /debug/queue?namespace=: that namespace's rows alone
        page: tuple[int, int] | None = None  # /debug/queue?limit=&offset=: (offset, limit)
        if path in CLUSTER_WIDE:
            part = path.removeprefix("/debug/")
            access.require(user, path)
        elif path == "/debug/queue":
            part = "queue"
            only = query.get("namespace", "")
            if "limit" in query or "offset" in query:
                limit, offset = whole_number(query.get("limit", "")), whole_number(query.get("offset", "0"))
                if limit is None or offset is None or not 0 < limit <= MAX_QUEUE_PAGE:
                    return 400, {"error": f"limit must be a whole number from 1 to {MAX_QUEUE_PAGE} and offset a "
                                          "whole number"}
                page = (offset, limit)
            if only:
                if not is_dns_label(only):  # refused before it reaches an access review
                    return 400, {"error": f"{only[:80]!r} is not a namespace name"}
                if not access.may_list(user, "") and not access.may_list(user, only):
                    name = user.username if user else "you"
                    return 403, {"error": f"{name} may not list appwrappers.{GROUP} in namespace {only}"}
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
        if isinstance(part, tuple) and snapshot.documents[part] is None:
            return self._unknown(part[1], part[2])
        if part == "queue":
            report = as_report(snapshot.documents[part])
            all_named = False  # whether the rows' reader may see every namespace named (aheadOfYou, fairShare)
            if only:  # checked above: formats that namespace's rows alone
                visible: frozenset[str] | None = frozenset({only})
                all_named = access.may_list(user, "")  # answered above, from the cache
            else:
                shown = report.namespaces() | {held["appwrapper"].partition("/")[0] for held in report.reservations}
                visible = access.visible(user, shown, snapshot.namespaces)
            if page is not None:
                return 200, report.page_in(visible, *page, all_named=all_named)
            if visible is not None:
                return 200, report.document_in(visible, all_named=all_named)
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


class _Endpoints:
    """The HTTP routes as a front door service: health answered on the event loop, the rest in its workers."""

    name = "http"
    precheck = None

    def __init__(self, metrics: Metrics, live: Check, ready: Check, debug: DebugEndpoints | None, access: Access,
                 dashboard: Dashboard | None) -> None:
        self.metrics = metrics
        self.live = live
        self.ready = ready
        self.debug = debug
        self.access = access
        self.dashboard = dashboard

    def early(self, head: Head) -> Response | None:
        if head.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed: GET or HEAD\n", headers={"Allow": "GET, HEAD"}, close=True)
        path = head.path.rstrip("/") or "/"
        if path in ("/healthz", "/readyz"):
            # On the event loop, never queued behind other requests: both checks read flags, nothing blocks.
            ok, reason = (self.live if path == "/healthz" else self.ready)()
            return Response(200 if ok else (500 if path == "/healthz" else 503), (reason or "ok").encode() + b"\n")
        return None

    def busy(self, head: Head, body: bytes | None, reason: str) -> Response:
        return Response(503, f"busy, retry: {reason}\n".encode(), headers={"Retry-After": "1"})

    def handle(self, head: Head, body: bytes) -> Response:
        url = urlsplit(head.target)
        if self.dashboard is not None and (url.path == "/ui" or url.path.startswith("/ui/")):
            return self._dashboard(head.headers, url.path, url.query)
        path = url.path.rstrip("/") or "/"
        access = self.access
        if path == "/metrics":
            try:
                access.require(access.user(head.headers), "/metrics")
            except Refused as refused:
                return _refusal(refused, json_body=False)
            return Response(200, self.metrics.render(), CONTENT_TYPE)
        if path.startswith("/debug/") and self.debug is not None:
            try:
                user = access.user(head.headers)
            except Refused as refused:
                return _refusal(refused, json_body=True)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            code, document = self.debug.answer(path, query, user=user, access=access)
            return Response(code, document if isinstance(document, bytes) else encode(document), "application/json")
        return Response(404, b"not found: try /metrics, /healthz, /readyz, /debug/queue\n")

    def _dashboard(self, headers: Mapping[str, str], path: str, raw_query: str) -> Response:
        assert self.dashboard is not None
        if path.startswith("/ui/api/"):
            try:
                user = self.access.user(headers)
            except Refused as refused:
                return _refusal(refused, json_body=True)
            query = {k: v[-1] for k, v in parse_qs(raw_query).items()}
            answer = self.dashboard.view(path.removeprefix("/ui/api/"), query, user)
        else:
            page = self.dashboard.page(path)
            answer = page if page is not None else Answer(404, b"not found\n", "text/plain; charset=utf-8",
                                                          SECURITY_HEADERS)
        return Response(answer.status, answer.body, answer.content_type, dict(answer.headers or {}))


def _refusal(refused: Refused, *, json_body: bool) -> Response:
    if json_body:
        body, content_type = encode({"error": refused.message}), "application/json"
    else:
        body, content_type = refused.message.encode() + b"\n", "text/plain; charset=utf-8"
    headers = {"WWW-Authenticate": 'Bearer realm="mcad"'} if refused.status == 401 else {}
    return Response(refused.status, body, content_type, headers)


class Server:
    def __init__(self, bind_address: str, *, metrics: Metrics, live: Check, ready: Check,
                 debug: DebugEndpoints | None = None, gate: Gate | None = None, insecure: bool = False,
                 recent_events: RecentEvents | None = None,
                 summary: Callable[[], Mapping[str, Any]] | None = None, max_connections: int | None = None,
                 workers: int = WORKERS) -> None:
        """``gate`` checks every request but health and the dashboard's static files; ``insecure`` (and no gate)
        checks none. With ``debug``, the dashboard is served at /ui (``recent_events`` and ``summary`` feed its
        detail and headline views). ``max_connections`` None: sized from the open files limit."""
        if gate is None and not insecure:
            raise ValueError("a Server needs a Gate to check access, or insecure=True")
        host, port = parse_bind_address(bind_address)
        access = Access(None if insecure else gate)
        dashboard = None if debug is None else Dashboard(DashboardSource(debug, access), events=recent_events,
                                                          summary=summary)
        cap = max_connections if max_connections is not None else frontdoor.connection_cap(
            frontdoor.open_files_limit())
        limits = Limits(max_connections=cap, handshake_timeout=READ_TIMEOUT_SECONDS,
                        header_timeout=READ_TIMEOUT_SECONDS, body_timeout=READ_TIMEOUT_SECONDS,
                        idle_timeout=IDLE_TIMEOUT_SECONDS, write_timeout=WRITE_TIMEOUT_SECONDS, max_body_bytes=0,
                        workers=workers, worker_wait=WORKER_WAIT_SECONDS)
        self.insecure = insecure
        self.door = FrontDoor(_Endpoints(metrics, live, ready, debug, access, dashboard), (host, port), limits)
        metrics.serve(self.door.stats)
        if dashboard is not None:
            dashboard.port = self.port

    @property
    def port(self) -> int:
        return self.door.port

    def start(self) -> None:
        self.door.start()
        log.info("http server listening", address=self.door.address[0], port=self.port,
                 endpoints="/metrics /healthz /readyz /debug/{queue,ledger,quota,clusters,explain} /ui",
                 access="open to anyone" if self.insecure else "bearer token, TokenReview, SubjectAccessReview",
                 max_connections=self.door.limits.max_connections)

    def stop(self) -> None:
        self.door.stop()


def debug_endpoints(dispatcher: Dispatcher, reports: Reports, *, leading: Callable[[], bool] = lambda: True,
                    leader: Callable[[], str | None] = lambda: None,
                    interval: float | None = None) -> DebugEndpoints:
    """/debug over ``dispatcher``: snapshots built on its thread by ``reports`` (``mcad.serve.debug.Reports``)."""
    def namespaces() -> set[str]:
        # From the store's keys (namespace/name; thread-safe): no view is read or resolved.
        return {key.partition("/")[0] for key in dispatcher.appwrappers.keys()}  # noqa: SIM118 (a store, not a dict)

    snapshots = Snapshots(dispatcher.call, reports, namespaces,
                          interval=DEFAULT_INTERVAL_SECONDS if interval is None else interval)
    return DebugEndpoints(snapshots, running=dispatcher.running.is_set, leading=leading, leader=leader)


def observe(dispatcher: Dispatcher, informers: list[Any], *, api_errors: Callable[[], Mapping[tuple[str, int], int]]
            | None = None, api_writes: Callable[[], Mapping[tuple[str, str], int]] | None = None,
            leading: Callable[[], bool] | None = None,
            events: Callable[[], EventCounters] | None = None, hub: Hub | None = None) -> None:
    """Point the dispatcher's metrics at what a scrape reads (see ``mcad.metrics.Sources``); ``hub``: the worker
    clusters in hub mode."""
    sources = dispatcher.metrics.sources
    # What the loop published last (an immutable object, replaced whole): never its own maps, mid-change.
    sources.capacity = lambda: dispatcher.published.capacity
    sources.queue = lambda: dispatcher.published.queue
    sources.reservations = lambda: dispatcher.published.reservations
    sources.backoff_statuses_waiting = lambda: dispatcher.published.backoff_statuses_waiting
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

    # Without quota trees the families are still described, with no rows.
    sources.quota = dispatcher.view.quota_samples()
    sources.informers = informer_states
    sources.api_errors = api_errors
    sources.api_writes = api_writes
    sources.leader = leading
    sources.events = events
