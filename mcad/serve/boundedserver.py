"""An HTTP server with a thread per connection and a bound on how many connections are served at once.

Contract: ``BoundedServer(address, handler, slots=N, slot_wait=S)`` serves a connection only while it holds one of
``N`` slots; a connection that finds none free within ``S`` seconds (0: at once) is handed to ``turn_away``
(which closes it; a subclass may answer first) and costs no thread. A flood of clients costs threads and memory
up to a bound, never without one. The slot is given back once when the connection's thread ends, however it ends,
or when its thread could not be started; a KeyboardInterrupt (Ctrl-C) arriving while the thread starts goes on to
stop the server.
An IPv6 address is served on an IPv6 socket.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class BoundedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, slots: int,
                 slot_wait: float = 0.0) -> None:
        self._slots = threading.BoundedSemaphore(slots)
        # Connections holding a slot, by id: whichever of the connection's thread and a failed start gives it back
        # first takes it out, so a slot is never given back twice (Ctrl-C during Thread.start, after the thread
        # began, used to raise "Semaphore released too many times" in place of the KeyboardInterrupt).
        self._holding: set[int] = set()
        self._holding_lock = threading.Lock()
        self.slot_wait = slot_wait
        # An IPv6 literal ("fd00::2", from "[fd00::2]:8080") needs an IPv6 socket: the default family is IPv4 only.
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def turn_away(self, request: Any, client_address: Any) -> None:
        """A connection that got no slot: closed (override to answer it first, or to log it)."""
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        got = (self._slots.acquire(timeout=self.slot_wait) if self.slot_wait > 0
               else self._slots.acquire(blocking=False))
        if not got:
            self.turn_away(request, client_address)
            return
        with self._holding_lock:
            self._holding.add(id(request))
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(request)

    def _give_back(self, request: Any) -> None:
        with self._holding_lock:
            held = id(request) in self._holding
            self._holding.discard(id(request))
        if held:
            self._slots.release()
