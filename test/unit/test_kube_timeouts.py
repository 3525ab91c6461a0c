"""mcad.k8s.kube tells a request that went out and got no answer in time (``TIMED_OUT``, which mcad.model.retry gives
up on
in the end) from one that could not be sent at all (the API server is away: retried without a bound)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcad.errors import TIMED_OUT, ApiError
from mcad.k8s import kube
from mcad.model.retry import FailureKind, classify
from test.support import placeholder_kubeconfig


def _kubeconfig(directory: Path, port: int) -> str:
    return str(placeholder_kubeconfig(directory, f"http://127.0.0.1:{port}"))


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """Accepts connections and reads what is sent, never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_request_without_an_answer_in_time_is_timed_out(tmp_path: Path, method: str) -> None:
    with _silent_server() as port:
        conn = kube.connect(_kubeconfig(tmp_path, port))
        with pytest.raises(ApiError) as caught:
            kube.request_json(conn, method, "/api/v1/namespaces/default/configmaps", body={} if method == "POST"
                              else None, timeout=0.2)
    assert caught.value.status == 0 and caught.value.reason == TIMED_OUT, caught.value
    assert "no answer within 0.2 s" in caught.value.message
    assert classify(caught.value) is FailureKind.TIMEOUT


def test_a_request_that_cannot_be_sent_is_unavailable(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]
    conn = kube.connect(_kubeconfig(tmp_path, port))  # nothing listens there any more: refused
    with pytest.raises(ApiError) as caught:
        kube.request_json(conn, "POST", "/api/v1/namespaces/default/configmaps", body={}, timeout=2.0)
    assert caught.value.status == 0 and caught.value.reason != TIMED_OUT, caught.value
    assert classify(caught.value) is FailureKind.UNAVAILABLE


def test_the_one_shot_requests_do_not_call_a_refused_connection_a_timeout(tmp_path: Path) -> None:
    """request_once (worker probes) and request_json_once (admission facts) say "no answer within" only when the
    time ran out; urllib3 makes a refused connection a kind of its TimeoutError."""
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]
    conn = kube.connect(_kubeconfig(tmp_path, port))
    for call in (lambda: kube.request_once(conn, "/api/v1/nodes", timeout=2.0),
                 lambda: kube.request_json_once(conn, "GET", "/apis/apps/v1", timeout=2.0)):
        with pytest.raises(ApiError) as caught:
            call()
        assert caught.value.reason != TIMED_OUT and "no answer within" not in caught.value.message, caught.value
    with _silent_server() as silent:
        conn = kube.connect(_kubeconfig(tmp_path, silent))
        with pytest.raises(ApiError) as caught:
            kube.request_once(conn, "/api/v1/nodes", timeout=0.2)
    assert caught.value.reason == TIMED_OUT and "no answer within 0.2 s" in caught.value.message
