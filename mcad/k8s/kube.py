"""The one module that imports the official ``kubernetes`` client.
Over 600 lines because it is the one module that imports the ``kubernetes`` client and ``urllib3`` (the client rule
of ``test/unit/test_layers.py``): loading a connection's configuration, raw requests, list and watch streams and the
typed ``Client`` all handle that library's objects and exceptions, and splitting them would spread that import.

Contract: everything else in mcad talks to the API server through the functions and classes here, on raw
dicts, so the client library can be swapped or pinned in one place. Connection problems surface as
``KubeConnectError`` with a message a person can act on (which kubeconfig, which server, what failed), failed
requests as ``ApiError``; both are defined in ``mcad.errors`` so that callers catch them without importing
this module. Nothing here prints or exits. Each ``Connection`` counts its failed requests and the writes it sent
(``mcad.k8s.requestcounts``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import threading
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import cachetools
import kubernetes.client
import kubernetes.config
import structlog
import urllib3.exceptions
from kubernetes.config.config_exception import ConfigException

from mcad.api import deepjson, fastjson
from mcad.errors import TIMED_OUT

# The error types live in mcad.errors so that code deciding on a failure need not import the client; re-exported
# here (``as`` marks them public for mypy) because this module is where they are raised.
from mcad.errors import ApiError as ApiError
from mcad.errors import GoneError as GoneError
from mcad.errors import KubeConnectError as KubeConnectError
from mcad.errors import error_from_status as error_from_status
from mcad.k8s.requestcounts import ApiErrorCounts, ApiWriteCounts, resource_of

_log = structlog.get_logger("mcad.k8s.kube")
@dataclass(frozen=True)
class Connection:
    """A configured API client plus where its configuration came from (for messages), its error counts and the
    writes it sent."""

    api: kubernetes.client.ApiClient
    source: str
    server: str
    errors: ApiErrorCounts = field(default_factory=ApiErrorCounts, compare=False)
    writes: ApiWriteCounts = field(default_factory=ApiWriteCounts, compare=False)


def connect(kubeconfig: str | None = None, context: str | None = None, *, pool_size: int = 32) -> Connection:
    """Build an API client: an explicit kubeconfig, else $KUBECONFIG, else in-cluster, else ~/.kube/config."""
    explicit = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = kubernetes.client.Configuration()
    try:
        if explicit:
            if not os.path.exists(explicit.split(os.pathsep)[0]):
                raise KubeConnectError(f"kubeconfig {explicit!r} does not exist")
            kubernetes.config.load_kube_config(
                config_file=explicit, context=context, client_configuration=configuration
            )
            source = f"kubeconfig {explicit}"
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            source = "in-cluster service account"
        else:
            default = os.path.expanduser("~/.kube/config")
            if not os.path.exists(default):
                raise KubeConnectError(
                    "no Kubernetes configuration found: pass --kubeconfig, set KUBECONFIG, "
                    "or run inside a cluster (tip: `make cluster` writes .dev/kubeconfig)"
                )
            kubernetes.config.load_kube_config(
                config_file=default, context=context, client_configuration=configuration
            )
            source = f"kubeconfig {default}"
    except ConfigException as err:
        raise KubeConnectError(f"invalid Kubernetes configuration: {err}") from err
    # Background writers and the informers' long-lived watches share this pool; urllib3 would otherwise open and
    # throw away a connection for every request beyond the default size (5 per cpu).
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, pool_size)
    return Connection(kubernetes.client.ApiClient(configuration), source, configuration.host)


def adopt_credentials(conn: Connection, fresh: Connection) -> None:
    """Make ``conn`` send every later request with ``fresh``'s configuration (token, client certificate, CA).

    Everything built on ``conn`` (informers, writers, probes) shares its ``ApiClient``, so swapping the
    client's configuration and its connection pool in place reaches all of them without rebuilding informers
    or losing their caches. A request already under way finishes on the old pool, which is left to the garbage
    collector rather than closed: closing it would fail such a request for no reason.
    """
    if fresh.server != conn.server:
        raise ValueError(f"new credentials are for {fresh.server}, not {conn.server}")
    # The pool first: a request that reads the new configuration must not go out through the old TLS setup.
    conn.api.rest_client = fresh.api.rest_client
    conn.api.configuration = fresh.api.configuration


def bearer_token(conn: Connection) -> str | None:
    """The bearer token ``conn`` authenticates with, as the client resolves it for its next request (a
    kubeconfig's token or tokenFile, an exec plugin's token refreshed when it expired, the in-cluster account's);
    None when it authenticates otherwise (a client certificate)."""
    configuration = conn.api.configuration
    value = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization")
    if not value:
        return None
    scheme, _, token = str(value).strip().partition(" ")
    if not token:
        return scheme or None  # a key set without its "Bearer" prefix
    return token.strip() if scheme.lower() == "bearer" else None


def server_version(conn: Connection, timeout_seconds: float = 10.0) -> str:
    """GET /version; the cheapest proof that the server answers and accepts our credentials."""
    try:
        info = kubernetes.client.VersionApi(conn.api).get_code(_request_timeout=timeout_seconds)
    except kubernetes.client.exceptions.ApiException as err:
        raise KubeConnectError(
            f"API server {conn.server} refused the request ({err.status} {err.reason}); "
            f"check the credentials in {conn.source}"
        ) from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise KubeConnectError(
            f"cannot reach the API server {conn.server} (from {conn.source}): {err}"
        ) from err
    return str(info.git_version)


def _response_error(status: int, reason: str, data: bytes) -> ApiError:
    try:
        body = json.loads(data) if data else None
    except ValueError:
        body = None
    if isinstance(body, dict):
        return error_from_status(body, status, reason)
    text = data.decode("utf-8", errors="replace").strip()[:500] if data else ""
    cls = GoneError if status == 410 else ApiError
    return cls(status, reason or "", text or reason or "no message")


RawObject = dict[str, Any]
Query = list[tuple[str, str]]

_WATCH_CONNECT_TIMEOUT = 10.0
# A list page is read whole and parsed at once, so its size in bytes, not its item count, bounds the memory a
# list costs: 500 AppWrappers of 1 MiB would be 500 MiB of JSON, several times that parsed. ``list`` sets each
# page's limit to aim at this many bytes, growing it at most fourfold a page and never above ``page_size``. The
# first page asks for few items, since nothing is known yet of their size: a few requests more for a list of small
# objects, against a first page of 500 MiB for one of large ones.
PAGE_BYTES = 4 * 1024 * 1024
FIRST_PAGE_LIMIT = 8
# The server ends a watch after timeoutSeconds; allow it this long beyond that before calling the socket dead.
_WATCH_READ_GRACE = 30.0


class WatchStream:
    """The events of one watch response, parsed line by line as they arrive (an ``Iterator`` of raw dicts).

    Ends (``StopIteration``) when the server closes the stream, normally at ``timeoutSeconds``, or when the
    connection drops mid-stream: either way the caller re-watches from the last resourceVersion it saw, and a
    server that cannot be reached then fails that new request with ``ApiError(status=0)``. ``close()`` may be
    called from any thread, also while another thread is blocked in ``next()``: it shuts the socket down so
    that read returns at once and the iteration ends; the reading thread then releases the response.
    """

    def __init__(self, response: Any) -> None:
        self._response = response
        self._events = self._parse()
        self._lock = threading.Lock()
        self._closed = False  # close() was called
        self._reading = False  # a thread is inside next()
        self._finished = False  # the response was released or closed

    def __iter__(self) -> WatchStream:
        return self

    def __next__(self) -> dict[str, Any]:
        with self._lock:
            if self._closed or self._finished:
                self._finish_locked(clean=False)
                raise StopIteration
            self._reading = True
        try:
            return next(self._events)
        except StopIteration:
            self._finish(clean=True)
            raise
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as err:
            # AttributeError: urllib3 reading from a file object that a shutdown/close already dropped.
            if not self._closed:
                _log.info("watch stream broken", reason=type(err).__name__, error=str(err))
            self._finish(clean=False)
            raise StopIteration from None
        finally:
            with self._lock:
                self._reading = False
                if self._closed:
                    self._finish_locked(clean=False)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._reading:
                # Unblocks the read in progress in the other thread (urllib3 >= 2.3), which then finishes.
                # ValueError/RuntimeError: nothing to interrupt (already released, or the socket is gone).
                with contextlib.suppress(ValueError, RuntimeError, OSError):
                    self._response.shutdown()
            else:
                self._finish_locked(clean=False)

    def _finish(self, clean: bool) -> None:
        with self._lock:
            self._finish_locked(clean)

    def _finish_locked(self, clean: bool) -> None:
        if self._finished:
            return
        self._finished = True
        if clean and not self._closed:
            self._response.release_conn()  # the server ended the chunked body cleanly: the connection is reusable
        else:
            self._response.close()
        self._events.close()

    def _parse(self) -> Generator[dict[str, Any], None, None]:
        buffer = b""
        for chunk in self._response.stream(amt=None, decode_content=True):
            buffer += chunk
            if b"\n" not in chunk:
                continue  # a large object arriving in pieces: split once its line is complete
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield _event(line)
        if buffer.strip():  # a last line without its newline
            yield _event(buffer)


def _event(line: bytes) -> dict[str, Any]:
    event = deepjson.loads(line)
    if not isinstance(event, dict):
        raise ValueError("watch event is not a JSON object")
    return event


class ResourceClient:
    """list/watch one resource type as raw dicts (no model deserialization).

    ``group`` "" is the core group (``/api/v1/...``), anything else ``/apis/{group}/{version}/...``;
    ``namespace`` None means all namespaces. Every failure raises ``ApiError`` (``GoneError`` for 410), with
    status 0 when no response came (connection refused, timeout, TLS).

    Requests go through ``_open`` (the client's auth and encoding, the raw urllib3 response), so one code path
    serves any resource, core group included, and a watch streams line by line.
    """

    def __init__(
        self,
        conn: Connection,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        request_timeout: float = 60.0,
        page_bytes: int = PAGE_BYTES,
    ) -> None:
        self._conn = conn
        prefix = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        self._path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
        self._api_version = version if not group else f"{group}/{version}"
        self._selectors: list[tuple[str, str]] = []
        if label_selector:
            self._selectors.append(("labelSelector", label_selector))
        if field_selector:
            self._selectors.append(("fieldSelector", field_selector))
        self._page_size = page_size
        self._page_bytes = page_bytes
        self._request_timeout = request_timeout
        self.largest_page_bytes = 0
        """The largest list page read so far (for tests of the byte bound)."""

    @property
    def path(self) -> str:
        return self._path

    def list(self, resource_version: str = "", *,
             compact: Callable[[RawObject], Any] | None = None) -> tuple[list[Any], str]:
        """Every item, page by page (``limit``/``continue``), and the list's resourceVersion.

        ``compact``, when given, is applied to each item as its page arrives and its result is kept instead of the
        raw item, so a list of 10,000 pods never holds 10,000 raw pods at once (peak memory at restart).

        ``resource_version`` "" (the default, what informers use) asks for the latest state (a consistent
        read); another value asks for the list exactly at that version, which raises ``GoneError`` once the
        server no longer has it. Items get ``apiVersion`` and ``kind`` filled in from the list (the server
        leaves them out of the items of built-in lists), so listed and watched objects look alike. A 410 on a
        later page (the continue token expired) restarts the list from its first page once. Pages hold at most
        ``page_size`` items and aim at ``page_bytes`` of JSON (see ``PAGE_BYTES``): a page of large objects makes
        the next page's limit smaller, so a list of 1,000 AppWrappers of 1 MiB each never holds more than a few of
        them at once.
        """
        items: list[RawObject] = []
        token = ""
        restarted = False
        limit = min(self._page_size, FIRST_PAGE_LIMIT) if self._page_size > 0 else 0
        while True:
            query: Query = [*self._selectors]
            if limit > 0:
                query.append(("limit", str(limit)))
            if token:
                query.append(("continue", token))
            elif resource_version:
                query += [("resourceVersion", resource_version), ("resourceVersionMatch", "Exact")]
            try:
                page, size = self._get_page(query)
            except GoneError:
                if not token or restarted:
                    raise
                _log.info("list continue token expired", path=self._path, reason="restarting list")
                items, token, restarted = [], "", True
                continue
            self.largest_page_bytes = max(self.largest_page_bytes, size)
            limit = self._next_limit(limit, size, len(page.get("items") or ()))
            kind = str(page.get("kind") or "")
            item_kind = kind[: -len("List")] if kind.endswith("List") else ""
            for item in page.get("items") or []:
                item.setdefault("apiVersion", self._api_version)
                if item_kind:
                    item.setdefault("kind", item_kind)
                items.append(item if compact is None else compact(item))
            metadata = page.get("metadata") or {}
            token = str(metadata.get("continue") or "")
            if not token:
                return items, str(metadata.get("resourceVersion") or "")

    def watch(self, resource_version: str, timeout_seconds: int) -> WatchStream:
        """Watch from ``resource_version`` with bookmarks; the server ends the stream after ``timeout_seconds``.

        Yields raw events ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}``; an expired
        version usually arrives as an in-stream ERROR event whose object is a Status with code 410 (the watch
        cache answers 200 first), sometimes as ``GoneError`` here. Close the stream to drop the connection.
        """
        query = [*self._selectors, ("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(timeout_seconds))]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        response = self._send(query, (_WATCH_CONNECT_TIMEOUT, timeout_seconds + _WATCH_READ_GRACE))
        return WatchStream(response)

    def _next_limit(self, limit: int, size: int, count: int) -> int:
        """The next page's limit after a page of ``count`` items in ``size`` bytes: as many items of this page's
        average size as ``page_bytes`` holds, growing at most fourfold a page (later items may be larger), never
        above ``page_size`` (see ``PAGE_BYTES``)."""
        if limit <= 0 or count == 0:
            return limit
        fitting = max(1, self._page_bytes * count // max(size, 1))
        return min(self._page_size, limit * 4, fitting)

    def _get_page(self, query: Query) -> tuple[dict[str, Any], int]:
        """One list page, parsed, and its size in bytes."""
        return request_json_sized(self._conn, "GET", self._path, query=query, timeout=self._request_timeout)

    def _send(self, query: Query, timeout: float | tuple[float, float]) -> Any:
        """GET ``self._path`` with ``query``; return the unread urllib3 response of a 2xx answer."""
        return _open(self._conn, "GET", self._path, query=query, timeout=timeout)


# Characters that do not survive raw in a YAML stream: the ones YAML forbids (DEL, the C1 controls, lone
# surrogates, the byte-order mark, two non-characters) and the ones a YAML 1.1 decoder such as the API server's
# folds as line breaks inside a quoted string (NEL, LINE and PARAGRAPH SEPARATOR). json.dumps escapes the C0
# controls itself; these are escaped as \uXXXX, which JSON and YAML double-quoted strings read alike.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def yaml_safe_json(body: Any) -> bytes:
    """``body`` as UTF-8 JSON that a YAML decoder reads back unchanged (an apply-patch+yaml request body).

    JSON that escapes every non-ASCII character turns one outside the BMP into a pair of ``\\ud83d``-style
    surrogate escapes, which JSON allows and YAML refuses: the API server answered 400 to a
    ConfigMap value ``"ok 😀"``. Raw UTF-8 is valid in both, once the few characters YAML forbids raw are escaped.
    """
    text = fastjson.dumps_text(body)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def _open(conn: Connection, method: str, path: str, *, query: Query | None = None, body: Any = None,
          content_type: str = "application/json", timeout: float | tuple[float, float] = 30.0,
          headers: Mapping[str, str] | None = None) -> Any:
    """Send one request through the connection's auth; the unread urllib3 response of a 2xx answer.

    Sends what the client's ``param_serialize`` and ``call_api`` would (its default headers, the bearer token as
    its configuration resolves it for this request, query encoding, JSON bodies: ``mcad.api.fastjson.dumps``) through
    its own urllib3 pool (TLS, proxy, retries), without the generic steps our raw dicts do not need: the client
    copies every body and header value through its model sanitizer and wraps the answer, which cost more CPU than
    the request itself for the small status patches mcad sends most. Nothing is deserialized into models, any
    path works (the core group included), and a watch can be streamed line by line. Other content types
    (apply-patch) are sent as our own JSON text (``yaml_safe_json``).
    """
    api = conn.api
    # A mapping of parameters is as good as pairs to the client's generic path, which callers were written for.
    query = list(query.items()) if isinstance(query, Mapping) else query
    if method in _WRITE_METHODS:
        conn.writes.add(_verb(method, query), resource_of(path))
    configuration = api.configuration
    sent = {"Accept": "application/json", "Content-Type": content_type, **(headers or {})}
    # The client's order: its default headers (User-Agent) over the caller's, then its cookie, then auth.
    sent.update(api.default_headers)
    if api.cookie:
        sent["Cookie"] = api.cookie
    auth_query: Query = []
    # auth_settings() runs the configuration's refresh hook (an exec plugin's expired token, a token file read
    # again), as every request of the client does.
    auth = configuration.auth_settings().get("BearerToken")
    if auth:
        if auth["in"] == "header":
            sent[auth["key"]] = auth["value"]
        elif auth["in"] == "query":
            auth_query.append((auth["key"], auth["value"]))
    target = path
    if query or auth_query:
        target += "?" + api.parameters_to_url_query([*(query or []), *auth_query], None)
    if body is None or method not in _BODY_METHODS:
        encoded: bytes | str | None = None
    elif "json" in content_type:
        if content_type == "application/json-patch+json" and not isinstance(body, list):
            sent["Content-Type"] = "application/strategic-merge-patch+json"  # what the client does with it
        encoded = fastjson.dumps(body)
    else:
        encoded = yaml_safe_json(body)
    try:
        response = _send(api.rest_client.pool_manager, configuration.host, method, target, encoded, sent,
                         _timeout(timeout))
    except urllib3.exceptions.SSLError as err:  # the client's own wording for it
        conn.errors.add(_verb(method, query), 0)
        raise ApiError(0, f"SSLError\n{err}", f"{method} {path}: (0)\nReason: SSLError\n{err}\n") from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        conn.errors.add(_verb(method, query), 0)
        raise _no_answer(method, path, err, timeout) from err
    if 200 <= response.status < 300:
        return response
    conn.errors.add(_verb(method, query), response.status)
    try:
        data = response.read()
    except (urllib3.exceptions.HTTPError, OSError):
        data = b""
    finally:
        response.close()
    raise _response_error(response.status, str(response.reason or ""), data)


def _send(pool_manager: Any, host: str, method: str, target: str, body: bytes | str | None, headers: dict[str, str],
          timeout: urllib3.Timeout | None) -> Any:
    """Send through the client's pool: straight to the connection pool of the server's origin when the client uses a
    plain ``PoolManager`` (no proxy), sparing its parse of the whole URL on every request, else through the
    manager. A redirect (which the API server does not send) is sent again through the manager, which follows it
    as the client would."""
    if type(pool_manager) is urllib3.PoolManager:
        scheme, hostname, port, prefix = _origin(host)
        pool = pool_manager.connection_from_host(hostname, port=port, scheme=scheme)
        response = pool.urlopen(method, prefix + target, body=body, headers=headers, timeout=timeout,
                                preload_content=False, assert_same_host=False, redirect=False)
        if not response.get_redirect_location():
            return response
        response.drain_conn()
        response.release_conn()
    return pool_manager.request(method, host + target, body=body, headers=headers, timeout=timeout,
                                preload_content=False)


@functools.lru_cache(maxsize=64)
def _origin(host: str) -> tuple[str | None, str | None, int | None, str]:
    """Scheme, host name, port and path prefix of a configuration's ``host`` URL (a proxy in front of an API
    server may serve it under a path)."""
    url = urllib3.util.parse_url(host)
    return url.scheme, url.host, url.port, (url.path or "").rstrip("/")


# The methods whose body the client sends (it drops one given with GET or HEAD).
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "OPTIONS", "DELETE"})


def _timeout(timeout: float | tuple[float, float]) -> urllib3.Timeout | None:
    """The client's reading of ``_request_timeout``: a number bounds the whole request, a pair (connect, read)
    each wait; 0 is no bound of our own (the pool's default)."""
    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(total=timeout) if timeout else None


def _timed_out(err: Exception) -> bool:
    """A connect or read that waited out its timeout. urllib3 makes a refused connection (NewConnectionError) a
    subclass of its TimeoutError: that one had an answer, a refusal, and is not a timeout."""
    cause = getattr(err, "reason", None) if isinstance(err, urllib3.exceptions.MaxRetryError) else err
    return isinstance(cause, urllib3.exceptions.TimeoutError | TimeoutError) and \
        not isinstance(cause, urllib3.exceptions.NewConnectionError)


def _no_answer(method: str, path: str, err: Exception, timeout: float | tuple[float, float] | None) -> ApiError:
    """The ApiError (status 0) of a request that got no HTTP answer. One that was sent and then waited past its
    read timeout is ``TIMED_OUT`` (mcad.model.retry counts those in the end: the request may be the cause); one that
    could not be sent at all (refused, reset, unreachable) keeps the exception's name (the server is away)."""
    cause = getattr(err, "reason", None) if isinstance(err, urllib3.exceptions.MaxRetryError) else err
    if isinstance(cause, (urllib3.exceptions.ReadTimeoutError, TimeoutError)):
        read_timeout = timeout[-1] if isinstance(timeout, tuple) else timeout
        within = f" within {read_timeout:g} s" if read_timeout else ""
        return ApiError(0, TIMED_OUT, f"{method} {path}: no answer{within} ({cause})")
    return ApiError(0, type(err).__name__, f"{method} {path}: {err}")


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _verb(method: str, query: Query | None) -> str:
    """The Kubernetes verb of a request, as far as its method and query tell (our lists always page)."""
    if method != "GET":
        return _VERBS.get(method, method.lower())
    names = {name for name, _ in query or []}
    return "watch" if "watch" in names else "list" if "limit" in names else "get"


def request_once(conn: Connection, path: str, *, query: Query | None = None, timeout: float = 2.0) -> int:
    """One GET with no retry, for health probes: the HTTP status of a 2xx answer, else ``ApiError`` (0 when no
    answer came within ``timeout``). The client's pool otherwise retries a timed-out read three times, which
    would make "no answer in 2 s" take 8."""
    api = conn.api
    headers = {"Accept": "application/json"}
    method, url, headers, _, _ = api.param_serialize("GET", path, query_params=query or [], header_params=headers,
                                                     auth_settings=["BearerToken"])
    try:
        response = api.rest_client.pool_manager.request(method, url, headers=headers, retries=False,
                                                        timeout=urllib3.Timeout(total=timeout), preload_content=True)
    except (urllib3.exceptions.HTTPError, OSError) as err:
        conn.errors.add("list" if query else "get", 0)
        if _timed_out(err):
            raise ApiError(0, TIMED_OUT, f"GET {path}: no answer within {timeout:g} s") from err
        cause = getattr(err, "reason", None) or err  # urllib3 wraps the socket error, and repeats the URL
        raise ApiError(0, type(err).__name__, f"GET {path}: {cause}") from err
    if 200 <= response.status < 300:
        return int(response.status)
    conn.errors.add("list" if query else "get", response.status)
    raise _response_error(response.status, str(response.reason or ""), response.data or b"")


class Passthrough:
    """An answer to relay as it came, whatever its status: status, reason, the headers in order (a repeated header
    once per value) and the body as sent (a gzip body stays gzip), read in pieces. ``close`` gives the
    connection back (or drops it when the body was not read to its end)."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self.status = int(response.status)
        self.reason = str(response.reason or "")
        self.headers: list[tuple[str, str]] = list(response.headers.items())
        self._drained = False

    def read(self, amount: int) -> bytes:
        """Up to ``amount`` bytes of the body (b"" at its end); ``ApiError`` (status 0) when the answer breaks
        off or stalls past the read timeout."""
        try:
            data = bytes(self._response.read(amount, decode_content=False))
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise ApiError(0, type(err).__name__, f"reading the answer: {err}") from err
        self._drained = self._drained or not data
        return data

    def close(self) -> None:
        # A connection is reused only when its answer was read to the end; one cut short is closed first, since
        # the rest of that answer would otherwise be read as the start of the next one.
        if not self._drained:
            self._response.close()
        self._response.release_conn()


def open_passthrough(conn: Connection, method: str, path: str, *, query: Query | None = None,
                     headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> Passthrough:
    """Send one request with the connection's credentials and return the answer unread, whatever its status: for
    relaying an API server proxy's answer (``mcadctl dashboard``). No retry (the caller decides) and no redirect
    followed (a Location is the caller's to pass on). ``timeout`` bounds connecting and each wait for data; a
    failure to get an answer at all is ``ApiError`` with status 0."""
    api = conn.api
    sent = {"Accept": "*/*", **(headers or {})}
    method, url, sent, _, _ = api.param_serialize(method, path, query_params=query or [], header_params=sent,
                                                  auth_settings=["BearerToken"])
    try:
        response = api.rest_client.pool_manager.request(
            method, url, headers=sent, retries=False, redirect=False, preload_content=False,
            timeout=urllib3.Timeout(connect=timeout, read=timeout))
    except (urllib3.exceptions.HTTPError, OSError) as err:
        conn.errors.add(_verb(method, query), 0)
        cause = getattr(err, "reason", None) or err
        raise ApiError(0, type(err).__name__, f"{method} {path}: {cause}") from err
    if response.status >= 400:
        conn.errors.add(_verb(method, query), response.status)
    return Passthrough(response)


def request_json(conn: Connection, method: str, path: str, *, query: Query | None = None, body: Any = None,
                 content_type: str = "application/json", timeout: float = 30.0,
                 headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One request, JSON in and out; errors as ``ApiError``. ``headers`` are sent besides the connection's own."""
    return request_json_sized(conn, method, path, query=query, body=body, content_type=content_type,
                              timeout=timeout, headers=headers)[0]


def _json_object(method: str, path: str, data: bytes) -> dict[str, Any]:
    """An answer's body as a JSON object (empty: ``{}``); anything else is a ``BadResponse``."""
    try:
        parsed = deepjson.loads(data) if data else {}
    except ValueError as err:
        raise ApiError(0, "BadResponse", f"{method} {path}: response is not JSON: {err}") from err
    if not isinstance(parsed, dict):
        raise ApiError(0, "BadResponse", f"{method} {path}: response is not a JSON object")
    return parsed


def request_json_sized(conn: Connection, method: str, path: str, *, query: Query | None = None, body: Any = None,
                       content_type: str = "application/json", timeout: float = 30.0,
                       headers: Mapping[str, str] | None = None) -> tuple[dict[str, Any], int]:
    """``request_json``, and the size of the answer in bytes."""
    response = _open(conn, method, path, query=query, body=body, content_type=content_type, timeout=timeout,
                     headers=headers)
    try:
        data = response.read()
    except (urllib3.exceptions.HTTPError, OSError) as err:
        response.close()
        raise _no_answer(method, path, err, timeout) from err
    response.release_conn()
    return _json_object(method, path, data), len(data)


@dataclass(frozen=True)
class ApiResource:
    plural: str
    namespaced: bool


class Client:
    """Discovery and writes on raw dicts: create (POST), server-side apply, JSON patches, delete, and status writes
    (a uid-conditioned JSON patch for AppWrappers, ``replace_status``; a server-side apply, ``apply_status``, for
    QuotaSubtrees).

    Discovery answers are cached per group/version for ``discovery_ttl`` seconds; a kind missing from a cached
    answer is looked up once more right away, because a CRD installed a moment ago (say RayCluster) must not
    fail a dispatch for minutes.
    """

    def __init__(self, conn: Connection, *, discovery_ttl: float = 300.0, timeout: float = 30.0) -> None:
        self.conn = conn
        self._timeout = timeout
        self._discovery: cachetools.TTLCache[str, dict[str, ApiResource]] = cachetools.TTLCache(
            maxsize=512, ttl=discovery_ttl)
        self._lock = threading.Lock()

    def _group_version(self, api_version: str, *, refresh: bool = False) -> dict[str, ApiResource]:
        with self._lock:
            cached = None if refresh else self._discovery.get(api_version)
        if cached is not None:
            return cached
        path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        body = request_json(self.conn, "GET", path, timeout=self._timeout)
        kinds = {r["kind"]: ApiResource(r["name"], bool(r.get("namespaced")))
                 for r in body.get("resources") or [] if "/" not in str(r.get("name", ""))}
        with self._lock:
            self._discovery[api_version] = kinds
        return kinds

    def resource(self, api_version: str, kind: str) -> ApiResource:
        """Plural and scope of a kind; ``ApiError(404)`` when the server does not serve it."""
        found = self._group_version(api_version).get(kind)
        if found is None:
            found = self._group_version(api_version, refresh=True).get(kind)
        if found is None:
            raise ApiError(404, "NotFound", f"{api_version} does not serve kind {kind}")
        return found

    def is_namespaced(self, api_version: str, kind: str) -> bool:
        return self.resource(api_version, kind).namespaced

    def allowed(self, verb: str, api_version: str, kind: str, namespace: str = "") -> bool:
        """Whether this client may ``verb`` that kind (in ``namespace``; "" is every namespace), as its own RBAC
        says (a SelfSubjectAccessReview, which every authenticated client may make)."""
        group = api_version.rpartition("/")[0]
        attributes = {"verb": verb, "group": group, "resource": self.resource(api_version, kind).plural}
        if namespace:
            attributes["namespace"] = namespace
        review = request_json(self.conn, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                              body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                    "spec": {"resourceAttributes": attributes}}, timeout=self._timeout)
        return bool((review.get("status") or {}).get("allowed"))

    def object_path(self, api_version: str, kind: str, namespace: str, name: str) -> str:
        res = self.resource(api_version, kind)
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        scope = f"/namespaces/{namespace}" if res.namespaced else ""
        return f"{prefix}{scope}/{res.plural}/{name}"

    def apply(self, obj: Mapping[str, Any], *, field_manager: str, force: bool) -> dict[str, Any]:
        meta = obj["metadata"]
        path = self.object_path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        return self._apply(path, obj, field_manager, force)

    def create(self, obj: Mapping[str, Any], *, field_manager: str) -> dict[str, Any]:
        """POST ``obj`` into its namespace's collection: 409 AlreadyExists when its name is taken."""
        meta = obj["metadata"]
        path = self.object_path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        collection = path.rsplit("/", 1)[0]
        return request_json(self.conn, "POST", collection, query=[("fieldManager", field_manager)], body=dict(obj),
                            timeout=self._timeout)

    def apply_status(self, api_version: str, kind: str, namespace: str, name: str, new_status: Mapping[str, Any],
                     *, field_manager: str) -> dict[str, Any]:
        path = self.object_path(api_version, kind, namespace, name) + "/status"
        body = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace},
                "status": new_status}
        return self._apply(path, body, field_manager, True)

    def replace_status(self, api_version: str, kind: str, namespace: str, name: str, uid: str,
                       new_status: Mapping[str, Any], *, field_manager: str) -> dict[str, Any]:
        """Set the whole ``status`` of the object with this ``uid``; 422 when the object of that name has another uid
        (deleted and re-created since), 404 when there is none. A JSON patch whose ``test`` checks the uid, because
        the status subresource ignores metadata in the body, so a server-side apply cannot carry a precondition:
        a write meant for an AppWrapper that is gone would land on its namesake."""
        path = self.object_path(api_version, kind, namespace, name) + "/status"
        operations = [{"op": "test", "path": "/metadata/uid", "value": uid},
                      {"op": "add", "path": "/status", "value": new_status}]  # add: replaces, or creates if absent
        return request_json(self.conn, "PATCH", path, query=[("fieldManager", field_manager)], body=operations,
                            content_type="application/json-patch+json", timeout=self._timeout)

    def _apply(self, path: str, body: Mapping[str, Any], field_manager: str, force: bool) -> dict[str, Any]:
        query = [("fieldManager", field_manager)] + ([("force", "true")] if force else [])
        return request_json(self.conn, "PATCH", path, query=query, body=body,
                            content_type="application/apply-patch+yaml", timeout=self._timeout)

    def patch_json(self, api_version: str, kind: str, namespace: str, name: str,
                   operations: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch (RFC 6902): its ``test`` operations make it conditional (422 when one fails)."""
        return request_json(self.conn, "PATCH", self.object_path(api_version, kind, namespace, name),
                            body=operations, content_type="application/json-patch+json", timeout=self._timeout)

    def read(self, api_version: str, kind: str, namespace: str, name: str, *,
             not_older_than: str = "") -> dict[str, Any]:
        """GET one object. With ``not_older_than`` (a resourceVersion) the API server may answer from its watch
        cache with that version or a later one, which costs it no etcd read."""
        query = [("resourceVersion", not_older_than)] if not_older_than else []
        return request_json(self.conn, "GET", self.object_path(api_version, kind, namespace, name), query=query,
                            timeout=self._timeout)

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete that very pod (uid precondition) with grace period 0: the API server removes it at once, unless
        a finalizer holds it. Gone already is fine."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            request_json(self.conn, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body,
                         timeout=self._timeout)
        except ApiError as err:
            if err.status not in (404, 409):
                raise

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        """Delete with background propagation; gone already is fine.

        With ``uid``, only that very object is deleted (a uid precondition, one request). With ``owner_uid``
        instead, the object is read first and deleted, conditioned on its uid, only if its controller
        ownerReference has that uid; with ``label`` (key, value), only if it carries that label (objects in
        another cluster than their owner). Either way a namesake created since (by another AppWrapper of the
        same name, say) is left alone.
        """
        path = self.object_path(api_version, kind, namespace, name)
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        try:
            if uid:
                body["preconditions"] = {"uid": uid}
            elif owner_uid or label:
                current = request_json(self.conn, "GET", path, timeout=self._timeout)
                meta = current.get("metadata") or {}
                owners = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
                if owner_uid and (not owners or owners[0].get("uid") != owner_uid):
                    return
                if label and (meta.get("labels") or {}).get(label[0]) != label[1]:
                    return
                body["preconditions"] = {"uid": meta.get("uid")}
            request_json(self.conn, "DELETE", path, body=body, timeout=self._timeout)
        except ApiError as err:
            if err.status not in (404, 409):  # 409: the precondition failed, so it is not ours any more
                raise


def request_json_once(conn: Connection, method: str, path: str, *, query: Query | None = None, body: Any = None,
                      timeout: float = 2.0) -> dict[str, Any]:
    """One JSON request with no retry and a total time bound: the parsed answer of a 2xx, else ``ApiError`` (0
    when no answer came within ``timeout``). For callers that must answer within a deadline themselves (admission
    checks): the client's pool would otherwise retry a timed-out connect or GET read three times."""
    api = conn.api
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    method, url, headers, serialized, _ = api.param_serialize(method, path, query_params=query or [],
                                                              header_params=headers, body=body,
                                                              auth_settings=["BearerToken"])
    verb = _verb(method, query)
    try:
        response = api.rest_client.pool_manager.request(
            method, url, headers=headers, body=fastjson.dumps(serialized) if serialized is not None else None,
            retries=False, timeout=urllib3.Timeout(total=timeout), preload_content=True)
    except (urllib3.exceptions.HTTPError, OSError) as err:
        conn.errors.add(verb, 0)
        if _timed_out(err):
            raise ApiError(0, TIMED_OUT, f"{method} {path}: no answer within {timeout:g} s") from err
        cause = getattr(err, "reason", None) or err
        raise ApiError(0, type(err).__name__, f"{method} {path}: {cause}") from err
    data = response.data or b""
    if not 200 <= response.status < 300:
        conn.errors.add(verb, response.status)
        raise _response_error(response.status, str(response.reason or ""), data)
    return _json_object(method, path, data)
