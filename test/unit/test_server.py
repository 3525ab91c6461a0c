"""The HTTP endpoint's error handling: a client that leaves before its answer costs one log line, no traceback."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import pytest
import structlog

from mcad.metrics import Metrics
from mcad.server import Server
from test.support import wait_until


class SlowDebug:
    """Answers /debug/* only once ``release`` is set: a dispatcher busy with a long cycle."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()
        self.answered = threading.Event()

    def answer(self, path: str, query: Any) -> tuple[int, dict[str, Any]]:
        self.asked.set()
        self.release.wait(10)
        return 200, {"queue": ["x" * 100] * 2000}  # larger than a socket buffer takes in one write


def test_a_client_gone_before_its_answer_is_one_info_line_and_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    debug = SlowDebug()
    http = Server("127.0.0.1:0", metrics=Metrics(), live=lambda: (True, ""), ready=lambda: (True, ""),
                  debug=debug)  # type: ignore[arg-type]
    http.start()
    try:
        with structlog.testing.capture_logs() as logs:
            client = socket.create_connection(("127.0.0.1", http.port), timeout=5)
            client.sendall(b"GET /debug/queue HTTP/1.1\r\nHost: x\r\n\r\n")
            assert debug.asked.wait(5)
            # Close with a reset (linger 0), as a client that timed out and died does: the answer cannot go out.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            debug.release.set()
            wait_until(lambda: any(e["event"] == "http client went away" for e in logs), 5,
                       "the failed answer to be logged")
        gone = [e for e in logs if e["event"] == "http client went away"]
        assert len(gone) == 1, logs
        assert gone[0]["log_level"] == "info"
        assert gone[0]["reason"] in ("BrokenPipeError", "ConnectionResetError")
        assert not [e for e in logs if e["log_level"] == "error"]
    finally:
        http.stop()
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err
