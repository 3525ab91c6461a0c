"""A thin, thread-safe HTTP client for the benchmark's load process, and a watch that timestamps every event.

The load process must not be the bottleneck it measures, so this talks JSON over urllib3's connection pool
directly (no model classes, no deserialisation into objects): one pooled keep-alive connection per thread.
``Watch`` lists, then streams ``?watch=1&allowWatchBookmarks=true`` and hands each event to a callback together
with ``time.monotonic()`` taken the moment its line arrived, before any parsing. It relists on 410 Gone and
resumes from the last resourceVersion when a stream ends, so no event is missed over a long scenario.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
Obj = dict[str, Any]
Query = dict[str, str] | None


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.body = body


class Api:
    """JSON requests against one API server with the kubeconfig's client certificate."""

    def __init__(self, kubeconfig: str, pool_size: int = 32, timeout: float = 60.0,
                 impersonate: tuple[str, str] | None = None) -> None:
        """``impersonate=(user, group)``: ``request`` (and what uses it) as that user in that group (and
        system:authenticated), which the kubeconfig's admin may ask for: a webhook sees the tenant, not the admin."""
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        self.server = cfg.host.rstrip("/")
        self.timeout = timeout
        self.pool = urllib3.PoolManager(
            num_pools=2, maxsize=pool_size, block=True, cert_reqs="CERT_REQUIRED", ca_certs=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file, key_file=cfg.key_file, retries=False)
        self.headers = {"Impersonate-User": impersonate[0], "Impersonate-Group": impersonate[1]} if impersonate else {}

    def url(self, path: str, query: Query = None) -> str:
        return self.server + path + (("?" + urllib.parse.urlencode(query)) if query else "")

    def request(self, method: str, path: str, body: Any = None, *, query: Query = None,
                content_type: str = "application/json", ok: tuple[int, ...] = (200, 201, 202),
                timeout: float | None = None) -> Obj:
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        resp = self.pool.request(method, self.url(path, query), body=data,
                                 headers={"Content-Type": content_type, "Accept": "application/json",
                                          **self.headers},
                                 timeout=timeout or self.timeout)
        try:
            parsed = json.loads(resp.data) if resp.data else {}
        except ValueError:
            parsed = resp.data.decode(errors="replace")
        if resp.status not in ok:
            raise ApiError(method, path, resp.status, parsed)
        return parsed if isinstance(parsed, dict) else {}

    def post_encoded(self, path: str, data: bytes, ok: tuple[int, ...] = (200, 201, 202)) -> None:
        """POST a body already encoded as JSON, reading the answer only when it is a refusal: a load process that
        creates hundreds a second spends its CPU on its own requests, not on parsing what it does not need."""
        resp = self.pool.request("POST", self.url(path), body=data,
                                 headers={"Content-Type": "application/json", "Accept": "application/json",
                                          **self.headers},
                                 timeout=self.timeout, preload_content=False)
        try:
            if resp.status not in ok:
                raw = resp.read()
                try:
                    parsed: Any = json.loads(raw) if raw else {}
                except ValueError:
                    parsed = raw.decode(errors="replace")
                raise ApiError("POST", path, resp.status, parsed)
            resp.drain_conn()
        finally:
            resp.release_conn()

    def text(self, path: str) -> str:
        """A plain-text GET (e.g. the API server's /metrics)."""
        resp = self.pool.request("GET", self.url(path), headers={"Accept": "text/plain"}, timeout=self.timeout)
        if resp.status != 200:
            raise ApiError("GET", path, resp.status, resp.data.decode(errors="replace")[:300])
        return str(resp.data.decode(errors="replace"))

    def get(self, path: str, query: Query = None) -> Obj:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def apply(self, path: str, body: Obj, manager: str) -> Obj:
        """Server-side apply (force), as the controller writes what it dispatches."""
        return self.request("PATCH", path, body, query={"fieldManager": manager, "force": "true"},
                            content_type=APPLY)

    def delete(self, path: str, *, missing_ok: bool = True) -> None:
        ok = (200, 202, 404) if missing_ok else (200, 202)
        self.request("DELETE", path, {"propagationPolicy": "Background"}, ok=ok)

    def list_all(self, path: str, query: Query = None, page: int = 500) -> tuple[list[Obj], str]:
        """Every item (paged) and the list's resourceVersion."""
        items: list[Obj] = []
        q = dict(query or {})
        q["limit"] = str(page)
        while True:
            body = self.get(path, q)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion") or "")
            q["continue"] = meta["continue"]

    def stream(self, path: str, query: Query) -> urllib3.BaseHTTPResponse:
        return self.pool.request("GET", self.url(path, query), preload_content=False,
                                 headers={"Accept": "application/json"},
                                 timeout=urllib3.Timeout(connect=10, read=None))


Handler = Callable[[str, Obj, float], None]


class Watch:
    """LIST then WATCH ``path`` in a daemon thread; ``handler(type, object, monotonic_seen)`` for every event.

    Listed objects are reported as ``"ADDED"`` with the time of the list. The handler runs on the watch thread:
    it must be quick (record and return). ``synced`` is set after the first list has been reported.
    """

    def __init__(self, api: Api, path: str, handler: Handler, label_selector: str = "", name: str = "watch") -> None:
        self.api = api
        self.path = path
        self.handler = handler
        self.label_selector = label_selector
        self.synced = threading.Event()
        self.events = 0
        self.relists = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._resp: urllib3.BaseHTTPResponse | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, timeout: float = 60) -> Watch:
        self._thread.start()
        if not self.synced.wait(timeout):
            raise TimeoutError(f"watch on {self.path} did not list within {timeout:.0f} s: {self.error}")
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # best effort: the thread is a daemon anyway
                resp.shutdown()
        self._thread.join(timeout=5)

    def _query(self, **extra: str) -> dict[str, str]:
        q = dict(extra)
        if self.label_selector:
            q["labelSelector"] = self.label_selector
        return q

    def _run(self) -> None:
        rv = ""
        failures = 0
        while not self._stop.is_set():
            try:
                if not rv:
                    items, rv = self.api.list_all(self.path, self._query())
                    now = time.monotonic()
                    for item in items:
                        self.handler("ADDED", item, now)
                    self.synced.set()
                rv = self._stream(rv)
                failures = 0
            except Exception as err:
                if self._stop.is_set():
                    return
                self.error = err
                failures += 1
                time.sleep(min(0.1 * 2 ** failures, 2.0))

    def _stream(self, rv: str) -> str:
        """One watch request from ``rv``; returns where to resume ("" to relist)."""
        resp = self.api.stream(self.path, self._query(watch="1", allowWatchBookmarks="true", resourceVersion=rv,
                                                      timeoutSeconds="600"))
        self._resp = resp
        try:
            if resp.status != 200:
                if resp.status == 410:
                    self.relists += 1
                    return ""
                raise ApiError("WATCH", self.path, resp.status, resp.read()[:300])
            for line in _lines(resp):
                seen = time.monotonic()
                if self._stop.is_set():
                    return rv
                event = json.loads(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        self.relists += 1
                        return ""
                    raise ApiError("WATCH", self.path, int(obj.get("code") or 0), obj)
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if etype == "BOOKMARK":
                    continue
                self.events += 1
                self.handler(etype, obj, seen)
            return rv
        finally:
            self._resp = None
            resp.release_conn()


def _lines(resp: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """Complete lines of a streaming response, as each chunk arrives (a watch event is one line)."""
    buf = b""
    for chunk in resp.stream(65536, decode_content=True):
        buf += chunk
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            line, buf = buf[:i], buf[i + 1:]
            if line.strip():
                yield line
    if buf.strip():
        yield buf
