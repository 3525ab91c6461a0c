"""BoundedServer gives each slot back once, and Ctrl-C while a connection's thread starts still stops it."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from mcad.serve.boundedserver import BoundedServer


class Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_ctrl_c_while_the_thread_starts_stops_the_server_and_gives_the_slot_back_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = BoundedServer(("127.0.0.1", 0), Ok, slots=2)
    finished = threading.Event()
    real_start = threading.Thread.start

    def start_then_interrupted(thread: threading.Thread) -> None:
        real_start(thread)  # the connection's thread runs, and will give its slot back itself
        thread.join(5)
        finished.set()
        raise KeyboardInterrupt  # as SIGINT lands in Thread.start's wait for the thread to begin

    client = socket.create_connection(server.server_address)
    try:
        client.sendall(b"GET / HTTP/1.0\r\n\r\n")
        request, address = server.get_request()
        monkeypatch.setattr(threading.Thread, "start", start_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            server.process_request(request, address)
        monkeypatch.undo()
        assert finished.is_set()
        # Both slots are free again, and not one more: a third acquire fails.
        assert server._slots.acquire(blocking=False) and server._slots.acquire(blocking=False)
        assert not server._slots.acquire(blocking=False)
    finally:
        client.close()
        server.server_close()
