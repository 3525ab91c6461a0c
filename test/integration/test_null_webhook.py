"""The bench's null webhook (test.perf.nullwebhook) answers as its contract says: built with go from the repo's
source, TLS with the CA it hands out, HTTP/1.1 only unless http2 (then HTTP/2 offered by ALPN), every review
allowed, the mutating path recording the creator whether or not the object has annotations, bad bodies refused, its
counts kept.

The bench's floor figure rests on this server doing nothing but that, so a server that failed to patch (the bench
would wait for the creator annotation until its timeout) or that offered HTTP/2 when it should not (an installation's
API server speaks HTTP/1.1 to a Service, with its handshakes; the floor would leave them out) fails here first."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest

from test.perf import nullwebhook
from test.perf.nullwebhook import HOST, NullWebhook, build


def review(annotations: dict[str, str] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "aw"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "0f1e2d3c-0000-4000-8000-000000000001", "userInfo": {"username": "alice"},
                        "object": {"metadata": metadata}}}


def post(server: NullWebhook, path: str, body: bytes) -> tuple[int, dict[str, Any] | str]:
    context = ssl.create_default_context(cadata=server.ca_bundle.decode())
    request = urllib.request.Request(f"https://{HOST}:{server.port}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def negotiated(server: NullWebhook) -> str | None:
    context = ssl.create_default_context(cadata=server.ca_bundle.decode())
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection((HOST, server.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=HOST) as tls:
        return tls.selected_alpn_protocol()


@pytest.fixture(scope="module")
def server() -> Any:
    with NullWebhook() as running:
        yield running


def test_the_build_is_cached_by_source(server: NullWebhook) -> None:
    first = build()
    assert first.is_file() and build() == first
    assert first.parent.name.startswith("nullwebhook-")


def test_validate_allows_with_the_requests_uid_and_nothing_else(server: NullWebhook) -> None:
    before = server.stats()["requests"]
    status, answer = post(server, "/validate", json.dumps(review(None)).encode())
    assert status == 200 and isinstance(answer, dict)
    assert answer["kind"] == "AdmissionReview" and answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["response"] == {"uid": "0f1e2d3c-0000-4000-8000-000000000001", "allowed": True}
    assert server.stats()["requests"] == before + 1


@pytest.mark.parametrize("annotations, patch", [
    (None, [{"op": "add", "path": "/metadata/annotations",
             "value": {"workload.codeflare.dev/creator": "alice"}}]),
    ({"team": "a"}, [{"op": "add", "path": "/metadata/annotations/workload.codeflare.dev~1creator",
                      "value": "alice"}]),
])
def test_mutate_records_the_requesting_user_as_creator(server: NullWebhook, annotations: dict[str, str] | None,
                                                       patch: list[dict[str, Any]]) -> None:
    status, answer = post(server, "/mutate", json.dumps(review(annotations)).encode())
    assert status == 200 and isinstance(answer, dict)
    assert answer["response"]["allowed"] is True and answer["response"]["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(answer["response"]["patch"])) == patch


def test_a_body_that_is_not_json_is_refused_and_not_counted(server: NullWebhook) -> None:
    before = server.stats()["requests"]
    status, answer = post(server, "/validate", b"{not json")
    assert status == 400, answer
    assert server.stats()["requests"] == before


def test_http2_is_offered_only_when_asked_for(server: NullWebhook) -> None:
    assert negotiated(server) in (None, "http/1.1")
    with NullWebhook(http2=True) as http2:
        assert negotiated(http2) == "h2"
        status, _ = post(http2, "/validate", json.dumps(review(None)).encode())
        assert status == 200
    connections = server.stats()["connections"]
    negotiated(server)
    assert server.stats()["connections"] >= connections + 1


def test_the_process_is_gone_after_stop() -> None:
    running = NullWebhook().start()
    port = running.port
    running.stop()
    with pytest.raises(OSError), socket.create_connection((HOST, port), timeout=2):
        pass


def test_a_server_that_exits_at_start_is_reported_and_cleaned_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its port already taken, the server exits: start() says so with the server's own words, at once rather than
    after its timeout, and leaves no directory behind."""
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        monkeypatch.setattr(nullwebhook, "free_port", lambda: taken.getsockname()[1])
        server = NullWebhook()
        with pytest.raises(nullwebhook.NullWebhookError, match="address already in use"):
            server.start()
        assert server._dir is None
