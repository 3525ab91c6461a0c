"""The front door of the controller's two ports: one asyncio event loop holds every connection, a bounded pool of
worker threads answers the requests (``mcad.admission.server`` and ``mcad.serve.server`` are its services).

Contract:
- ``FrontDoor(service, address, limits, tls=...)`` binds at once (``OSError`` if it cannot) and serves from
  ``start()`` to ``stop()`` on a thread of its own running one event loop: an idle or slow connection costs a few
  kilobytes and no thread, so thousands are held cheaply.
- Every phase of a connection has a deadline (``Limits``): the TLS handshake (``handshake_timeout``), a kept-alive
  connection waiting for its next request (``idle_timeout``; a fresh connection waits as long for its first), the
  request head from its first byte (``header_timeout``, at most ``max_header_bytes``: else 431), the body from the
  end of the head (``body_timeout``, its wait for a lane included) and the answer's write (``write_timeout``). A
  connection past its deadline is closed; the work a worker has started is never cut (its own bounds apply).
- At most ``max_connections`` connections at once. One more closes the longest-idle kept-alive connection (a
  fresh one waiting for its first request counts as idle), else the oldest still sending its head or handshake;
  when every connection has a request in the workers' hands the new one is closed at once.
- Requests run in at most ``workers`` threads (the services' code blocks on the API server); a request that waits
  for a worker longer than ``worker_wait`` gets the service's ``busy`` answer (503). Whatever the connection count,
  no more than ``workers`` requests (and ``big_lane`` big ones, in threads of their own) are in progress.
- Bodies: longer than ``max_body_bytes``: 413 and closed, unread. Bodies over ``big_body_bytes`` are read and
  handled in the big lane (``big_lane`` at once), the others in the small lane (``small_lane`` at once): a body is
  read only once its lane admits it (it waits in the socket meanwhile, under its deadline), and it holds its lane
  until its answer is computed, so bodies in memory stay within ``small_lane x big_body_bytes + big_lane x
  max_body_bytes`` (and what parsing them makes), and small requests never wait behind big ones. Lanes and
  workers are handed out in turns by source address: one client's many requests wait behind each other, not in
  front of every other client's. After big bodies, memory is handed back to the system (glibc's ``malloc_trim``;
  ``gc`` too once the lane is empty), at most once a second. Allocations over 128 KiB are always mapped
  (``mallopt``), so a body's bytes go back when freed; run the process with ``PYTHONMALLOC=malloc`` (the image and
  the chart do) so that parsed JSON goes back too: Python's own allocator keeps every 1 MiB arena that a single
  live object still uses.
- The service sees the request in phases: ``early(head)`` on the event loop, must not block (health, 404, 411...);
  ``precheck(head)`` (optional) in a worker before the body is read: an answer there is sent and the connection
  closed, unread; ``quick(head, body)`` (optional) on the event loop for a body of at most ``quick_body_bytes``,
  must not block: its answer is sent without a worker (the two thread hand-offs a worker costs are most of a
  short request's cost in a busy process), None hands the request on; ``handle(head, body)`` in a worker (one
  that raises, there or in ``quick``: 500, one log line). An answer to a request
  whose body was not read closes the connection. ``Head`` carries the peer's address and, over TLS, its
  certificate (DER) if it sent one.
- The service's optional ``tick()`` runs on the event loop at every sweep of the deadlines (must not block).
- ``drain()`` before ``stop()``: every answer from then on closes its connection (``Connection: close``).
- ``stats`` counts open connections, requests in progress and every connection closed or request refused by the
  door, by reason (``mcad.metrics`` exports them as ``mcad_http_*``); a warning when a connection or a request is
  refused for want of room (at most one per event every ``WARN_INTERVAL_SECONDS``, counting those left out), one
  line per other refusal and per client gone away at debug (a scanner or a flood must not fill the log: the
  counters tell).
- ``open_files_limit()`` raises the process's soft RLIMIT_NOFILE to its hard limit; ``connection_cap`` sizes the
  default ``max_connections`` from it.
- Its parts without I/O: requests parsed and answers rendered (``mcad.serve.http1``: ``Head``, ``Response``), the
  connections held and who goes at the cap (``mcad.serve.doorbook.Registry``), turns at the lanes and workers by
  source (``mcad.serve.doorbook.Slots``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import resource
import socket
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from mcad.serve.doorbook import Busy, Conn, Phase, Registry, Slots
from mcad.serve.http1 import BadRequest, Head, Response, parse_head, render

TlsSource = Callable[[], ssl.SSLContext | None]
# asyncio's TLS layer gives every connection a read buffer of SSLProtocol.max_size (256 KiB, zero-filled, so
# resident at once): 500 idle TLS connections would hold 125 MiB. A TLS record carries at most 16 KiB, what one
# read takes. (A class attribute of the stdlib: nothing else in the controller uses asyncio's TLS.)
TLS_READ_BUFFER = 16 * 1024
asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER  # type: ignore[attr-defined]

# File descriptors kept for everything but served connections (API server connections, informers, log files).
RESERVED_FDS = 512
DEFAULT_MAX_CONNECTIONS = 2048
# How often deadlines are checked: a deadline is met within this much.
SWEEP_SECONDS = 0.2
TRIM_INTERVAL_SECONDS = 1.0
WARN_INTERVAL_SECONDS = 10.0
# How long a closed connection may take to flush its last answer.
CLOSE_GRACE_SECONDS = 2.0


def open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (when allowed); the soft limit in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return int(soft)


def connection_cap(open_files: int, ports: int = 2, ceiling: int = DEFAULT_MAX_CONNECTIONS) -> int:
    """Connections one port may hold when ``ports`` share ``open_files`` descriptors (at least 64)."""
    return max(64, min(ceiling, (open_files - RESERVED_FDS) // ports))


@dataclass(frozen=True)
class Limits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    handshake_timeout: float = 10.0
    idle_timeout: float = 120.0
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    write_timeout: float = 30.0
    max_header_bytes: int = 32 * 1024
    max_body_bytes: int = 0
    workers: int = 8
    worker_wait: float = 5.0
    big_body_bytes: int = 256 * 1024
    big_lane: int = 2
    small_lane: int = 64
    # Bodies up to this size are offered to the service's ``quick`` on the event loop (0: never): what it costs
    # there holds up every other connection of the port, so only small ones.
    quick_body_bytes: int = 0


class Service(Protocol):
    name: str  # "webhook", "http": log lines and metric labels

    def early(self, head: Head) -> Response | None:
        """On the event loop, never blocking: an answer now, or None to go on."""

    def handle(self, head: Head, body: bytes) -> Response:
        """In a worker thread."""

    # Optional: ``quick(head, body) -> Response | None``, on the event loop (see the contract).
    # Optional: ``tick()``, on the event loop at every sweep (``sweep_seconds``), must not block: periodic chores.

    def busy(self, head: Head, body: bytes | None, reason: str) -> Response:
        """The answer when no worker took the request in time."""


@dataclass
class Stats:
    """What ``mcad.metrics`` exports for one port (read from any thread; written on the event loop)."""

    name: str
    cap: int = 0
    open: int = 0
    # Every connection accepted (before the cap's verdict): with ``requests``, how often a client opens a fresh one,
    # each a TLS handshake on the webhook port.
    accepted: int = 0
    in_flight: int = 0
    requests: int = 0
    closed: dict[str, int] = field(default_factory=dict)  # by reason: timeouts by phase, evicted, refused
    rejected: dict[str, int] = field(default_factory=dict)  # by reason: busy, too_large, bad_request, ...

    def close(self, reason: str) -> None:
        self.closed[reason] = self.closed.get(reason, 0) + 1

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


def _libc_trim() -> Callable[[], None]:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return lambda: None
    return lambda: trim(0)


_malloc_trim = _libc_trim()
_M_MMAP_THRESHOLD = -3


def _fix_mmap_threshold() -> None:
    """Allocations over 128 KiB (a body's bytes, its decoded text) are mapped and unmapped by glibc, so they go back
    to the system when freed. By default glibc raises that threshold after the first such free, and bodies then
    land on the heap, whose memory a process keeps."""
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError):
        if name:
            ctypes.CDLL(name).mallopt(_M_MMAP_THRESHOLD, 128 * 1024)


class FrontDoor:
    def __init__(self, service: Service, address: tuple[str, int], limits: Limits, *, tls: TlsSource | None = None,
                 share_port: bool = False, clock: Callable[[], float] = time.monotonic,
                 sweep_seconds: float | None = SWEEP_SECONDS, server_header: str = "mcad") -> None:
        """``sweep_seconds`` None: deadlines are checked only when ``sweep()`` is called (tests with a clock)."""
        self.service = service
        # A logger of its own, bound at first use: the configuration then in force is the one it writes with.
        self.log = structlog.get_logger("mcad.serve.frontdoor")
        self.limits = limits
        self.tls = tls
        self.clock = clock
        self.sweep_seconds = sweep_seconds
        self.server_header = server_header
        self.stats = Stats(service.name, cap=limits.max_connections)
        self.registry = Registry(limits.max_connections, clock)
        quick = getattr(service, "quick", None)
        self._quick: Callable[[Head, bytes], Response | None] | None = \
            quick if callable(quick) and limits.quick_body_bytes > 0 else None
        self.workers = Slots(limits.workers, clock)
        self.small_lane = Slots(limits.small_lane, clock)
        self.big_lane = Slots(limits.big_lane, clock)
        self.listening = threading.Event()
        # Set by drain(): every answer from then on closes its connection (read on the event loop).
        self.draining = False
        self._pool = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix=f"{service.name}-worker")
        # Big bodies' requests, and handing memory back (one more thread: a trim never waits for a big review).
        self._big_pool = ThreadPoolExecutor(max_workers=limits.big_lane + 1, thread_name_prefix=f"{service.name}-big")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_trim = float("-inf")
        self._warned: dict[str, tuple[float, int]] = {}
        self._trim_pending = False
        self.sock = self._bind(address, share_port)

    @staticmethod
    def _bind(address: tuple[str, int], share_port: bool) -> socket.socket:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if share_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            sock.listen(1024)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    # -- lifecycle (any thread) -----------------------------------------------------------------------------------

    def start(self) -> None:
        _fix_mmap_threshold()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=self.service.name, daemon=True)
        self._thread.start()
        ready.wait(30)

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._open())
            ready.set()
            loop.run_forever()
        finally:
            ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._connection, sock=self.sock,
                                                  limit=self.limits.max_header_bytes)
        if self.sweep_seconds is not None:
            self._spawn(self._sweeper(self.sweep_seconds))
        self.listening.set()

    def drain(self) -> None:
        """The server is about to stop: every answer from now on says ``Connection: close`` and closes its
        connection, so a kept-alive client sends its next request over a new connection (to another replica, once
        the Service has dropped this one) instead of on one that ``stop`` will close under it."""
        self.draining = True

    def stop(self) -> None:
        self.listening.clear()
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._big_pool.shutdown(wait=False, cancel_futures=True)
        self.sock.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def sweep(self) -> None:
        """Check every deadline now (from any thread; ``sweep_seconds`` does it periodically)."""
        loop = self._loop
        if loop is None:
            return
        done = threading.Event()

        def run() -> None:
            self._sweep()
            done.set()
        loop.call_soon_threadsafe(run)
        done.wait(10)

    # -- on the event loop ----------------------------------------------------------------------------------------

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _warn(self, event: str, **fields: Any) -> None:
        """A warning at most once per WARN_INTERVAL_SECONDS per event (a flood must not flood the log too), with
        how many were left out since; the metrics count every one."""
        now = self.clock()
        last, left_out = self._warned.get(event, (float("-inf"), 0))
        if now - last < WARN_INTERVAL_SECONDS:
            self._warned[event] = (last, left_out + 1)
            return
        self._warned[event] = (now, 0)
        self.log.warning(event, **fields, left_out=left_out)

    async def _sweeper(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            self._sweep()

    def _sweep(self) -> None:
        for conn in self.registry.expired():
            self.stats.close(f"{conn.phase.value}_timeout")
            self.log.debug(f"{self.service.name} connection closed", client=conn.peer,
                           reason=f"{conn.phase.value} timeout")
            conn.abort()
        expired = self.workers.expire()
        for _ in range(expired):
            self.stats.reject("busy")
        tick = getattr(self.service, "tick", None)
        if tick is not None:
            tick()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        peer_address = writer.get_extra_info("peername")
        peer = str(peer_address[0]) if isinstance(peer_address, tuple) and peer_address else str(peer_address)
        transport = writer.transport

        def abort() -> None:
            transport.abort()
            if not task.done():
                task.cancel()
        conn = Conn(peer, abort)
        self.stats.accepted += 1
        admitted, victim = self.registry.add(conn, self.limits.handshake_timeout)
        if victim is not None:
            self.stats.close("evicted")
            victim.abort()
        if not admitted:
            self.stats.close("refused")
            self._warn(f"{self.service.name} connection refused: every connection has a request in progress",
                       client=peer, cap=self.registry.cap)
            transport.abort()
            return
        self.stats.open += 1
        try:
            await self._serve(conn, reader, writer)
        except asyncio.CancelledError:
            pass  # its deadline passed, it was evicted, or the server stops: closed below
        except (ConnectionError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError, OSError) as err:
            self.stats.close("client_gone")
            self.log.debug(f"{self.service.name} client went away", client=peer, reason=type(err).__name__)
        except Exception as err:  # never a traceback in the middle of another thread's log line
            self.stats.close("error")
            self.log.error(f"{self.service.name} request failed", client=peer, reason=type(err).__name__,
                           error=str(err))
        finally:
            self.stats.open -= 1
            self.registry.remove(conn)
            with contextlib.suppress(Exception):
                writer.close()  # the answer written goes out (and TLS says goodbye)
            # ... within a bound: a client that never reads it or never answers the goodbye is cut off.
            asyncio.get_running_loop().call_later(CLOSE_GRACE_SECONDS, transport.abort)

    async def _serve(self, conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        registry, limits = self.registry, self.limits
        cert = None
        if self.tls is not None:
            context = self.tls()
            if context is None:
                self.stats.close("no_certificate")
                return
            await writer.start_tls(context, ssl_handshake_timeout=limits.handshake_timeout + 1)
            ssl_object = writer.get_extra_info("ssl_object")
            cert = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        while True:
            registry.enter(conn, Phase.IDLE, limits.idle_timeout)
            first = await reader.read(1)
            if not first:
                return  # the client closed its idle connection
            registry.enter(conn, Phase.HEAD, limits.header_timeout)
            try:
                raw = first + await reader.readuntil(b"\r\n\r\n")
                head = parse_head(raw, conn.peer, cert)
            except asyncio.LimitOverrunError:
                await self._refuse(conn, writer, 431, "request head too large", "header_too_large")
                return
            except BadRequest as err:
                await self._refuse(conn, writer, err.status, str(err), "bad_request")
                return
            self.stats.requests += 1
            response = self.service.early(head)
            if response is None and head.content_length > limits.max_body_bytes:
                response = Response(413, f"a body of {head.content_length} bytes is over the bound of "
                                         f"{limits.max_body_bytes}\n".encode(), close=True)
            if response is not None:
                if response.status == 413:
                    self.stats.reject("too_large")
                if head.content_length:
                    response.close = True  # its body is unread: the rest of the stream is not a request
                if not await self._answer(conn, writer, head, response):
                    return
                continue
            response = await self._work(conn, reader, head)
            if response is None:
                return
            if not await self._answer(conn, writer, head, response):
                return

    async def _work(self, conn: Conn, reader: asyncio.StreamReader, head: Head) -> Response | None:
        """The answer to a request whose head passed ``early``: precheck, body read in its lane, handled."""
        limits = self.limits
        precheck = getattr(self.service, "precheck", None)
        if precheck is not None:
            self.registry.enter(conn, Phase.WORK, None)
            refusal = await self._in_worker(lambda: precheck(head), head, None)
            if refusal is not None:
                if refusal.status != 503:
                    self.stats.reject("unauthorized")
                refusal.close = True  # the body stays unread
                return refusal
        if head.content_length == 0:  # nothing to hold in memory: no lane
            self.registry.enter(conn, Phase.WORK, None)
            return await self._in_worker(lambda: self.service.handle(head, b""), head, b"")
        big = head.content_length > limits.big_body_bytes
        lane = self.big_lane if big else self.small_lane
        self.registry.enter(conn, Phase.BODY, limits.body_timeout)
        await lane.acquire(source=head.peer)

        def release() -> None:
            lane.release()
            if big:
                self._after_big_body()
        handed = False
        try:
            body = await self._read_body(reader, head.content_length)
            self.registry.enter(conn, Phase.WORK, None)
            if self._quick is not None and not big and len(body) <= limits.quick_body_bytes:
                response = self._answer_quickly(head, body)
                if response is not None:
                    return response
            handed = True  # from here the lane is given back when the worker is done with the body
            return await self._in_worker(lambda: self.service.handle(head, body), head, body, on_done=release,
                                         big=big)
        finally:
            if not handed:
                release()

    def _answer_quickly(self, head: Head, body: bytes) -> Response | None:
        assert self._quick is not None
        try:
            return self._quick(head, body)
        except Exception as err:  # as a worker's handler: one log line and a 500, never a dropped connection
            self.log.error(f"{self.service.name} handler failed", client=head.peer, path=head.path,
                           reason=type(err).__name__, error=str(err)[:500])
            return Response(500, f"internal error ({type(err).__name__})\n".encode(), close=True)

    async def _read_body(self, reader: asyncio.StreamReader, size: int) -> bytes:
        chunks = []
        left = size
        while left > 0:
            chunk = await reader.read(min(left, 256 * 1024))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", left)
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    async def _in_worker(self, call: Callable[[], Response | None], head: Head, body: bytes | None, *,
                         on_done: Callable[[], None] | None = None, big: bool = False) -> Response | None:
        """``call()`` in a worker once one is free within ``worker_wait``, else the service's busy answer. The
        worker slot (and ``on_done``) are given back when the call ends, even if this waiter is cancelled. ``big``:
        in the big lane's own threads instead (the lane bounds them), so that the memory a big body's parsing takes
        is reused by the next big body in the same threads' malloc arenas, and never waits for or takes a worker."""
        if not big:
            try:
                await self.workers.acquire(self.clock() + self.limits.worker_wait, head.peer)
            except Busy:
                if on_done is not None:
                    on_done()
                self._warn(f"{self.service.name} request refused: every worker busy", client=head.peer,
                           workers=self.workers.size, waited=self.limits.worker_wait)
                return self.service.busy(head, body, f"every one of the {self.workers.size} workers was busy for "
                                                     f"{self.limits.worker_wait:g} s")
            except asyncio.CancelledError:
                if on_done is not None:
                    on_done()
                raise
        loop = asyncio.get_running_loop()
        self.stats.in_flight += 1
        future: Future[Response | None] = (self._big_pool if big else self._pool).submit(call)

        def finished(_: Future[Response | None]) -> None:
            def back() -> None:
                self.stats.in_flight -= 1
                if not big:
                    self.workers.release()
                if on_done is not None:
                    on_done()
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server has stopped
                loop.call_soon_threadsafe(back)
        future.add_done_callback(finished)
        try:
            return await asyncio.wrap_future(future)
        except Exception as err:  # a handler's bug: one log line and a 500, never a dropped connection
            self.log.error(f"{self.service.name} handler failed", client=head.peer, path=head.path,
                      reason=type(err).__name__, error=str(err)[:500])
            return Response(500, f"internal error ({type(err).__name__})\n".encode(), close=True)

    def _after_big_body(self) -> None:
        """Hand memory back after a big body, at most once per TRIM_INTERVAL_SECONDS: what glibc holds free while
        big bodies keep coming, and once the lane is empty the garbage collector's too."""
        if self._trim_pending:
            return
        wait = self._last_trim + TRIM_INTERVAL_SECONDS - self.clock()
        self._trim_pending = True
        loop = asyncio.get_running_loop()

        def trim() -> None:
            self._trim_pending = False
            self._last_trim = self.clock()
            self._big_pool.submit(_give_memory_back, not self.big_lane.used)
        if wait > 0:
            loop.call_later(wait, trim)
        else:
            trim()

    async def _answer(self, conn: Conn, writer: asyncio.StreamWriter, head: Head, response: Response) -> bool:
        """Send ``response``; whether the connection stays open for another request."""
        keep = head.keep_alive and not response.close and not self.draining
        self.registry.enter(conn, Phase.WRITE, self.limits.write_timeout)
        writer.write(render(response, head.method == "HEAD", close=not keep, server=self.server_header))
        await writer.drain()
        # The request line as http.server logged it: "POST /validate?timeout=10s HTTP/1.1" 200
        self.log.debug(f"{self.service.name} request", client=conn.peer,
                  request=f'"{head.method} {head.target} {head.version}" {response.status}')
        return keep

    async def _refuse(self, conn: Conn, writer: asyncio.StreamWriter, status: int, message: str, reason: str) -> None:
        self.stats.reject(reason)
        self.log.debug(f"{self.service.name} request refused", client=conn.peer, status=status, reason=message)
        self.registry.enter(conn, Phase.WRITE, self.limits.write_timeout)
        writer.write(render(Response(status, message.encode() + b"\n"), False, close=True, server=self.server_header))
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()


def _give_memory_back(collect: bool) -> None:
    if collect:
        gc.collect()
    _malloc_trim()
