"""``mcadctl dashboard``: the controller's ``/ui`` on a local port, reached through the API server like
``kubectl proxy``, with the user's own credentials.

Contract:
- ``DashboardProxy`` listens on a loopback address (port 0: a free one) and serves the dashboard at
  ``http://127.0.0.1:PORT/<capability>/ui/``, where the capability is 32 random hex digits chosen at start. The
  user's credentials stand behind that port, so a request is checked, in this order, before anything is sent on:
  1. its Host header names this listener (``localhost``, ``127.0.0.1`` or ``[::1]`` with its port), else 403: a
     web page whose DNS name an attacker re-points at 127.0.0.1 (DNS rebinding) sends its own name;
  2. its path starts with the capability, else 404: other users of this machine can connect to a loopback port,
     but do not know the URL;
  3. it is a GET or HEAD, else 405;
  4. the rest of its path is ``/ui`` or ``/ui/...`` made of plain segments (no ``..``, no escapes), else 404.
  Only then is it forwarded; ``/<capability>`` and ``/<capability>/`` redirect to ``/<capability>/ui/``.
- Forwarding: a GET (a HEAD is sent as a GET and its body dropped) through the API server with the kubeconfig's
  credentials, which the API server authenticates and authorizes (get on ``services/proxy``, or ``pods/proxy``
  for the leader's pod: operators only, the chart's debug-client Role grants none).
  The controller checks the user's bearer token on its data routes; the API server drops ``Authorization`` when
  proxying, so the token goes in ``X-Mcad-Authorization`` (as ``mcad.cli.reach`` does for ``/debug``): the one the
  browser sends itself (the page's token form), else ``token()`` (``--token``, else the kubeconfig's). Of the
  browser's request only the query and a few harmless headers (``FORWARDED_HEADERS``) pass on: no cookies.
- Route: the leader's Service ``<name>-leader`` (it selects the leader's pod alone), else the Service's ``http``
  port (``mcad.cli.reach``). A route the API server cannot or will not proxy through falls back to the Service,
  and so does a standby answering through the leader's Service (its pod still labelled during a handover); a
  standby's 503 naming the leader is followed once to the leader's pod; when that cannot be done (no
  ``pods/proxy``), the Service is asked again, up to ``SERVICE_TRIES`` times in all, since the API server picks a
  replica behind it per request. The route that worked is kept for the next request; once the API server has
  refused ``pods/proxy``, pod routes are not tried again.
- Answers pass through with their status and headers (the controller's Content-Security-Policy included) but
  without ``Set-Cookie`` and hop-by-hop headers, bodies streamed as they come; a ``Location`` into the proxied path
  is mapped back under the capability. What the API server itself answers with an error (a ``Status`` object:
  401, 403 for a user without ``services/proxy``, 503 with no endpoints) becomes a readable page naming what is
  missing, with the same status (under ``/ui/api/`` a JSON ``{"error": ...}``, 401 there as 502: the page's token
  form could not cure the kubeconfig's credentials); no answer at all from the API server is a 502.
- Bounds: at most ``max_connections`` connections at once (one more is answered 503 at once and closed); a browser
  has ``CLIENT_TIMEOUT`` seconds per read or write; each wait for the API server is bounded by ``where.timeout``;
  error bodies are read into memory only up to ``ERROR_BODY_LIMIT``, everything else is streamed.
"""

from __future__ import annotations

import contextlib
import hmac
import html
import json
import re
import secrets
import socketserver
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from mcad.cli import reach
from mcad.errors import ApiError
from mcad.k8s import kube
from mcad.serve.boundedserver import BoundedServer

LOOPBACK_ADDRESSES = ("127.0.0.1", "::1", "localhost")
ALLOWED_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]")
DEFAULT_MAX_CONNECTIONS = 32
# How often one request may go to the Service while standbys answer it (each replica is behind it).
SERVICE_TRIES = reach.SERVICE_TRIES
CLIENT_TIMEOUT = 30.0
ERROR_BODY_LIMIT = 64 * 1024
CHUNK = 64 * 1024
FORWARDED_HEADERS = ("Accept", "Accept-Language", "Cache-Control", "If-Modified-Since", "If-None-Match",
                     reach.PROXY_HEADER)
DROPPED_HEADERS = frozenset({"set-cookie", "set-cookie2", "connection", "keep-alive", "proxy-authenticate",
                             "proxy-authorization", "proxy-connection", "te", "trailer", "transfer-encoding",
                             "upgrade"})
# Path segments of /ui routes: what the controller's routes are made of; nothing to escape, nothing to resolve.
_UI_PATH = re.compile(r"/ui(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?")
# Our own pages (refusals) load nothing and may be framed by no one.
_OWN_PAGE_HEADERS = (("Content-Security-Policy", "default-src 'none'; base-uri 'none'; form-action 'none'; "
                      "frame-ancestors 'none'"),
                     ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                     ("Cache-Control", "no-store"))


@dataclass(frozen=True)
class Route:
    """Where requests go: the API server's proxy path (up to ``/proxy``), and what it is, for messages."""

    base: str
    what: str
    pod: str = ""  # the pod, for a route to one


@dataclass
class Answer:
    """What goes back to the browser: the first bytes of the body in ``head`` (all of it when ``rest`` is None),
    the remainder still to stream from ``rest``."""

    status: int
    headers: list[tuple[str, str]]
    head: bytes = b""
    rest: kube.Passthrough | None = None
    route: Route | None = None  # the route it came by

    def chunks(self) -> Iterator[bytes]:
        if self.head:
            yield self.head
        if self.rest is not None:
            while data := self.rest.read(CHUNK):
                yield data

    def close(self) -> None:
        if self.rest is not None:
            self.rest.close()


@dataclass
class Refusal:
    """The API server did not deliver the request: its status (0: no answer) and what it said."""

    status: int
    message: str
    route: Route


class Forwarder:
    """Sends /ui requests to the controller through the API server and keeps the route that worked."""

    def __init__(self, conn: kube.Connection, where: reach.Where, token: Callable[[], str | None],
                 notify: Callable[[str], None] = lambda _line: None) -> None:
        self.conn = conn
        self.where = where
        self._token = token
        self._notify = notify
        self.service = Route(reach.service_proxy_base(where.namespace, where.name),
                             f"the Service {where.namespace}/{where.name}")
        leader = reach.leader_service_name(where.name)
        self.leader = Route(reach.service_proxy_base(where.namespace, leader),
                            f"the leader's Service {where.namespace}/{leader}")
        self._lock = threading.Lock()
        self._route = self.leader
        self._pods_refused = False
        self._last_note = ""

    @property
    def route(self) -> Route:
        with self._lock:
            return self._route

    def locate(self) -> Route:
        """Start at the leader's Service. ``reach.DebugUnavailable`` when the API server cannot be reached or
        refuses the credentials (checked by reading the Lease, which the user may not be allowed: no matter)."""
        try:
            reach.lease_holder(self.conn, self.where)
        except ApiError as err:
            if err.status == 0:
                raise reach.DebugUnavailable(f"cannot reach the API server {self.conn.server} (from "
                                             f"{self.conn.source}): {err.message}") from err
            if err.status == 401:
                raise reach.DebugUnavailable(f"the API server {self.conn.server} does not accept the credentials "
                                             f"in {self.conn.source} (401 Unauthorized)") from err
        with self._lock:
            self._route = self.leader
        return self.leader

    def forward(self, path: str, query: list[tuple[str, str]], headers: dict[str, str]) -> Answer | Refusal:
        """The controller's answer to GET ``path`` (a /ui path), or why the API server did not deliver it."""
        route = self.route
        answer = self._try(route, path, query, headers)
        if isinstance(answer, Refusal) and route.pod:
            if answer.status == 403:
                self._pods_refused = True
            self._note(f"{route.what} is not reachable ({answer.message}); trying {self.service.what}")
            route = self.service
            answer = self._try(route, path, query, headers)
        elif route == self.leader and (isinstance(answer, Refusal) or _standby(answer)):
            # No such Service (an older chart, no leader election), no endpoint (a handover), not allowed, or the
            # old leader's pod still labelled: the Service of every replica, for good.
            why = answer.message if isinstance(answer, Refusal) else "a standby answered"
            if isinstance(answer, Answer):
                answer.close()
            self._note(f"{route.what} is not reachable ({why}); trying {self.service.what}")
            route = self.service
            answer = self._try(route, path, query, headers)
        leader = _standby_names(answer)
        if leader and leader != route.pod and not self._pods_refused:
            assert isinstance(answer, Answer)
            leader_route = self._pod_route(leader, "named by a standby")
            followed = self._try(leader_route, path, query, headers)
            if isinstance(followed, Refusal):
                if followed.status == 403:
                    self._pods_refused = True
                self._note(f"{route.what} is a standby and the leader's pod cannot be reached ({followed.message})")
            else:
                answer.close()
                answer, route = followed, leader_route
        tries = 1
        while route == self.service and isinstance(answer, Answer) and _standby(answer) and tries < SERVICE_TRIES:
            # The Service has every replica behind it and the API server picks one per request: ask again.
            again = self._try(route, path, query, headers)
            tries += 1
            if isinstance(again, Refusal):
                break
            answer.close()
            answer = again
        if isinstance(answer, Answer):
            with self._lock:
                changed, self._route = self._route != route, route
            if changed:
                self._note(f"now forwarding to {route.what}")
        return answer

    def _pod_route(self, pod: str, how: str) -> Route:
        where = self.where
        return Route(reach.pod_proxy_base(where.namespace, pod, where.port),
                     f"the leader's pod {where.namespace}/{pod} ({how})", pod)

    def _try(self, route: Route, path: str, query: list[tuple[str, str]],
             headers: dict[str, str]) -> Answer | Refusal:
        sent = {name: value for name, value in headers.items() if name != reach.PROXY_HEADER}
        token = headers.get(reach.PROXY_HEADER) or (f"Bearer {t}" if (t := self._token()) else "")
        if token:
            sent[reach.PROXY_HEADER] = token
        try:
            upstream = kube.open_passthrough(self.conn, "GET", route.base + path, query=query, headers=sent,
                                             timeout=self.where.timeout)
        except ApiError as err:
            return Refusal(0, err.message, route)
        answer = Answer(upstream.status, upstream.headers, rest=upstream, route=route)
        if upstream.status < 400 or "json" not in _header(upstream.headers, "content-type"):
            return answer
        try:
            answer.head = _read_up_to(upstream, ERROR_BODY_LIMIT + 1)
        except ApiError as err:
            upstream.close()
            return Refusal(0, err.message, route)
        if len(answer.head) <= ERROR_BODY_LIMIT:
            upstream.close()
            answer.rest = None
            body = reach.json_object(answer.head)
            if body is not None and body.get("kind") == "Status":  # the API server's own, not the controller's
                return Refusal(upstream.status, str(body.get("message") or body.get("reason") or "no message"),
                               route)
        return answer

    def _note(self, line: str) -> None:
        if line != self._last_note:  # a browser polling every second would repeat it as often
            self._last_note = line
            self._notify(line)

    def explain(self, refusal: Refusal) -> str:
        """A refusal in words a person can act on: what was refused, and which right is missing."""
        where, server = self.where, self.conn.server
        if refusal.status == 0:
            return f"cannot reach the API server {server} (from {self.conn.source}): {refusal.message}"
        if refusal.status == 401:
            return (f"the API server {server} does not accept the credentials in {self.conn.source} (401 "
                    f"Unauthorized: {refusal.message}); log in again, then reload this page")
        if refusal.status == 403:
            return (f"the API server {server} refused to forward this request to {refusal.route.what}: "
                    f"{refusal.message}. The dashboard is reached through the API server's proxy: your user needs "
                    f"get on services/proxy with the resource name {where.name}:http (RBAC sees the name as the URL "
                    f"spells it) in namespace {where.namespace} (the chart's debug-client Role grants it)")
        return (f"the API server {server} could not reach the controller through {refusal.route.what} "
                f"({refusal.status}: {refusal.message}); is the controller running, and are "
                f"--controller-namespace and --controller-name right?")


class DashboardProxy:
    """The local listener (see the module contract); ``start`` serves in a thread, ``serve`` in this one."""

    def __init__(self, forwarder: Forwarder, *, address: str = "127.0.0.1", port: int = 0,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, capability: str | None = None) -> None:
        if address not in LOOPBACK_ADDRESSES:
            raise ValueError(f"the dashboard proxy listens only on loopback ({', '.join(LOOPBACK_ADDRESSES)}), "
                             f"not {address}")
        self.forwarder = forwarder
        self.capability = capability or secrets.token_hex(16)
        self._server = _Server((("127.0.0.1" if address == "localhost" else address), port), max_connections, self)
        self.port = int(self._server.server_address[1])
        host = "[::1]" if address == "::1" else "127.0.0.1"
        self.allowed_hosts = frozenset(f"{name}:{self.port}" for name in ALLOWED_HOST_NAMES)
        self.url = f"http://{host}:{self.port}/{self.capability}/ui/"
        self._thread: threading.Thread | None = None

    def serve(self, poll_interval: float = 0.5) -> None:
        """Serve until ``stop`` (from another thread; it waits up to ``poll_interval``) or KeyboardInterrupt."""
        self._server.serve_forever(poll_interval=poll_interval)

    def start(self) -> None:
        """Serve in a thread until ``stop``."""
        self._thread = threading.Thread(target=self.serve, args=(0.05,), name="dashboard-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()


class _Server(BoundedServer):
    """A thread per connection, at most ``max_connections`` of them."""

    def __init__(self, address: tuple[str, int], max_connections: int, proxy: DashboardProxy) -> None:
        self.proxy = proxy
        super().__init__(address, _Handler, slots=max_connections)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host's name up in DNS, which may hang; the name is never used here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def turn_away(self, request: Any, client_address: Any) -> None:
        # Answered at once rather than queued: a slow client must not make the others wait without end.
        with contextlib.suppress(OSError):
            request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                            b"Retry-After: 1\r\nConnection: close\r\n\r\ntoo many connections at once\n")
        super().turn_away(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = CLIENT_TIMEOUT  # per read and write on the browser's connection
    server_version = "mcadctl-dashboard"
    error_content_type = "text/plain; charset=utf-8"
    error_message_format = "%(code)d %(message)s\n"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def __getattr__(self, name: str) -> Any:
        # Every other method (POST, PUT, DELETE, OPTIONS, CONNECT, ...) goes through the same checks, to 405.
        if name.startswith("do_"):
            return lambda: self._serve(name[3:])
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: the default prints every request line, capability included, on stderr."""

    def _serve(self, method: str) -> None:
        proxy = self.server.proxy
        host = (self.headers.get("Host") or "").strip().lower()
        if host not in proxy.allowed_hosts:
            self._plain(403, f"this proxy answers only requests addressed to 127.0.0.1:{proxy.port} or "
                             f"localhost:{proxy.port}, not to {host or 'no host'!r}\n")
            return
        target = self.path
        path, _, query = target.partition("?")
        prefix = f"/{proxy.capability}"
        head, rest = path[:len(prefix)], path[len(prefix):]
        # In constant time, and as bytes: http.server decodes the request line as Latin-1, and compare_digest
        # refuses a str that is not ASCII.
        if not (target.startswith("/") and hmac.compare_digest(head.encode("latin-1"), prefix.encode())
                and rest[:1] in ("", "/")):
            self._plain(404, "not found\n")
            return
        if method not in ("GET", "HEAD"):
            self._plain(405, "the dashboard is read-only: GET and HEAD only\n", (("Allow", "GET, HEAD"),))
            return
        if rest in ("", "/"):
            self._send(Answer(302, [("Location", f"{prefix}/ui/"), ("Content-Length", "0")]), method)
            return
        if not _UI_PATH.fullmatch(rest):
            self._plain(404, "not found: only /ui is forwarded to the controller\n")
            return
        headers = {name: value for name in FORWARDED_HEADERS if (value := self.headers.get(name))}
        result = proxy.forwarder.forward(rest, urllib.parse.parse_qsl(query, keep_blank_values=True), headers)
        if isinstance(result, Refusal):
            self._send(_refusal_answer(result, proxy.forwarder.explain(result), rest.startswith("/ui/api/")),
                       method)
            return
        result.headers = _passed_headers(result.headers, result.route, proxy.forwarder.conn.server, prefix)
        self._send(result, method)

    def _plain(self, status: int, text: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        body = text.encode()
        self._send(Answer(status, [("Content-Type", "text/plain; charset=utf-8"), *_OWN_PAGE_HEADERS, *extra,
                                   ("Content-Length", str(len(body)))], body), "GET")

    def _send(self, answer: Answer, method: str) -> None:
        try:
            self.send_response_only(answer.status)
            for name, value in answer.headers:
                self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            if method != "HEAD":
                for chunk in answer.chunks():
                    self.wfile.write(chunk)
        except (OSError, ApiError):
            # The browser went away, or the answer broke off: the connection closes, and there is no one to tell.
            self.close_connection = True
        finally:
            answer.close()


def _passed_headers(headers: list[tuple[str, str]], route: Route | None, server: str,
                    prefix: str) -> list[tuple[str, str]]:
    """The upstream headers the browser gets: no cookies, no hop-by-hop headers, Locations mapped back here."""
    passed = []
    for name, value in headers:
        lowered = name.lower()
        if lowered in DROPPED_HEADERS:
            continue
        if lowered == "location" and route is not None:
            # The API server rewrites a Location that is an absolute path into its own proxy path.
            for base in (server.rstrip("/") + route.base, route.base):
                if value == base or value.startswith(base + "/"):
                    value = prefix + value[len(base):]
                    break
        passed.append((name, value))
    return passed


def _refusal_answer(refusal: Refusal, message: str, api: bool) -> Answer:
    status = refusal.status or 502
    if api:
        body = json.dumps({"error": message}).encode()
        return Answer(502 if status == 401 else status,
                      [("Content-Type", "application/json"), *_OWN_PAGE_HEADERS, ("Content-Length", str(len(body)))],
                      body)
    title = {401: "credentials not accepted", 403: "access refused"}.get(status, "controller not reachable")
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>mcad dashboard: {title}</title>'
            f'</head>\n<body><h1>mcad dashboard: {title}</h1>\n<p id="refusal">{html.escape(message)}</p>\n'
            f'<p>Status {status} {html.escape(_phrase(status))}, from mcadctl dashboard.</p></body></html>\n')
    body = page.encode()
    return Answer(status, [("Content-Type", "text/html; charset=utf-8"), *_OWN_PAGE_HEADERS,
                           ("Content-Length", str(len(body)))], body)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _standby(answer: Answer | Refusal) -> dict[str, Any] | None:
    """A standby's 503 answer (``{"error": "not the leader", "leader": ...}``), else None."""
    if not isinstance(answer, Answer) or answer.status != 503 or answer.rest is not None:
        return None
    body = reach.json_object(answer.head)
    return body if body is not None and "leader" in body else None


def _standby_names(answer: Answer | Refusal) -> str:
    """The leader's pod a standby's 503 names ("" for any other answer, or while it knows none)."""
    body = _standby(answer)
    return reach.pod_of_holder(str(body.get("leader") or "")) if body else ""


def _header(headers: list[tuple[str, str]], name: str) -> str:
    return next((value for key, value in headers if key.lower() == name), "").lower()


def _read_up_to(upstream: kube.Passthrough, limit: int) -> bytes:
    data = b""
    while len(data) < limit and (piece := upstream.read(min(CHUNK, limit - len(data)))):
        data += piece
    return data


