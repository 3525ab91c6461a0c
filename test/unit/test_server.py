"""The HTTP endpoint: who gets an answer (401, 403, 404, 503 by the access rules of mcad.serve.server, over a gate whose
API calls are stand-ins; the real reviews run in test/e2e/test_endpoint_access.py), what a tenant's queue holds,
and error handling: a client that leaves before its answer costs one log line, no traceback."""

from __future__ import annotations

import json
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from mcad.admission.request import UserInfo
from mcad.metrics import Metrics
from mcad.serve.endpointauth import Attributes, Gate
from mcad.serve.queuereport import MAX_QUEUE_PAGE
from mcad.serve.server import DebugEndpoints, Server
from mcad.serve.snapshots import Snapshots
from test.support import wait_until
from test.unit.test_endpointauth import Reviews
from test.unit.test_snapshots import FakeReports, Loop


class SlowDebug:
    """Answers /debug/* only once ``release`` is set: a dispatcher busy with a long cycle."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()
        self.answered = threading.Event()

    def answer(self, path: str, query: Any, **_access: Any) -> tuple[int, dict[str, Any]]:
        self.asked.set()
        self.release.wait(10)
        return 200, {"queue": ["x" * 100] * 2000}  # larger than a socket buffer takes in one write


def test_a_client_gone_before_its_answer_is_counted_and_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    debug = SlowDebug()
    http = Server("127.0.0.1:0", metrics=Metrics(), live=lambda: (True, ""), ready=lambda: (True, ""),
                  debug=debug, insecure=True)  # type: ignore[arg-type]
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
            # Counted (mcad_http_connections_closed_total{reason="client_gone"}), and at most a debug line: anyone
            # could fill the log with them. (Whether the debug line shows depends on the log level configured.)
            wait_until(lambda: http.door.stats.closed.get("client_gone", 0) == 1, 5,
                       "the connection to be counted as gone")
        assert not [e for e in logs if e["event"] == "http client went away" and e["log_level"] != "debug"], logs
        assert not [e for e in logs if e["log_level"] == "error"], logs
    finally:
        http.stop()
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err


ALICE = UserInfo("system:serviceaccount:team-a:alice", uid="u-1", groups=("system:serviceaccounts",))
ADMIN = UserInfo("admin", uid="u-0", groups=("ops",))


class QueueReports(FakeReports):
    def queue_deferred(self) -> Any:
        return self.queue

    def queue(self) -> dict[str, Any]:
        row = {"state": "Queued", "priority": 0, "demand": {"cpu": "1"}}
        running = {**row, "state": "Running"}
        return {"queued": [{"namespace": "team-a", "name": "a1", "position": 2, **row},
                           {"namespace": "team-b", "name": "b1", "position": 1, **row}],
                "dispatched": [{"namespace": "team-b", "name": "b2", **running},
                               {"namespace": "team-a", "name": "a2", **running}],
                "resetting": [{"namespace": "team-b", "name": "b3", **row, "state": "Resetting"},
                              {"namespace": "team-a", "name": "a3", **row, "state": "Resetting"}],
                "controller": {}, "generatedAt": None,
                "reservations": [{"appwrapper": "team-b/b1", "nodes": ["n1"], "amount": "cpu=4", "startsBy": None},
                                 {"appwrapper": "team-a/a1", "nodes": ["n2"], "amount": "cpu=2", "startsBy": None}]}


def grant(reviews: Reviews, user: UserInfo, attributes: Attributes) -> None:
    reviews.grants.append({**user.as_json(), **attributes.as_json()})


def list_in(namespace: str) -> Attributes:
    return Attributes(verb="list", group="workload.codeflare.dev", resource="appwrappers", namespace=namespace)


@pytest.fixture
def served() -> Iterator[tuple[Server, Reviews]]:
    reviews = Reviews()
    reviews.tokens["alice"] = {"username": ALICE.username, "uid": "u-1", "groups": ["system:serviceaccounts"]}
    reviews.tokens["admin"] = {"username": "admin", "uid": "u-0", "groups": ["ops"]}
    reviews.tokens.pop("good")
    grant(reviews, ALICE, list_in("team-a"))
    grant(reviews, ADMIN, list_in(""))
    for path in ("/metrics", "/debug/ledger"):
        grant(reviews, ADMIN, Attributes(verb="get", path=path))
    loop = Loop()
    snaps = Snapshots(loop.call, QueueReports(), lambda: {"team-a", "team-b", "team-c"},  # type: ignore[arg-type]
                      interval=0.01)
    debug = DebugEndpoints(snaps, running=lambda: True)
    http = Server("127.0.0.1:0", metrics=Metrics(), live=lambda: (True, ""), ready=lambda: (True, ""), debug=debug,
                  gate=Gate(reviews))
    http.start()
    try:
        yield http, reviews
    finally:
        http.stop()


def get(http: Server, path: str, token: str | None = None, header: str = "Authorization") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{http.port}{path}",
                                     headers={header: f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_health_is_open_and_everything_else_needs_a_token(served: tuple[Server, Reviews]) -> None:
    http, reviews = served
    assert get(http, "/healthz") == (200, "ok\n")
    assert get(http, "/readyz") == (200, "ok\n")
    for path in ("/metrics", "/debug/queue", "/debug/ledger", "/debug/explain?namespace=team-a&name=a1"):
        code, body = get(http, path)
        assert code == 401 and "no bearer token" in body, (path, body)
        assert get(http, path, "forged")[0] == 401
    assert reviews.access_reviews == []


def test_rights_missing_are_403_naming_the_right(served: tuple[Server, Reviews]) -> None:
    http, _ = served
    code, body = get(http, "/metrics", "alice")
    assert code == 403 and body.startswith(f"{ALICE.username} may not get /metrics"), body
    code, body = get(http, "/debug/ledger", "alice")
    assert code == 403 and "may not get /debug/ledger" in json.loads(body)["error"]
    assert get(http, "/metrics", "admin")[0] == 200
    assert get(http, "/debug/ledger", "admin")[0] == 200
    # Through the API server's proxy, which drops Authorization, the token comes in the other header.
    assert get(http, "/metrics", "admin", header="X-Mcad-Authorization")[0] == 200


def test_a_tenant_sees_only_its_namespaces_and_explain_does_not_leak(served: tuple[Server, Reviews]) -> None:
    http, reviews = served
    code, body = get(http, "/debug/queue", "alice")
    assert code == 200, body
    doc = json.loads(body)
    assert [(aw["name"], aw["position"]) for aw in doc["queued"]] == [("a1", 2)]  # positions stay global
    assert [aw["name"] for aw in doc["dispatched"]] == ["a2"]
    assert [aw["name"] for aw in doc["resetting"]] == ["a3"], "team-b's AppWrapper in its retry pause hidden"
    assert [held["appwrapper"] for held in doc["reservations"]] == ["team-a/a1"], "team-b's holder and nodes hidden"
    admin = json.loads(get(http, "/debug/queue", "admin")[1])
    assert len(admin["queued"]) == 2 and len(admin["dispatched"]) == 2 and len(admin["reservations"]) == 2
    assert len(admin["resetting"]) == 2
    assert get(http, "/debug/explain?namespace=team-a&name=a1", "alice")[0] == 200
    hidden = get(http, "/debug/explain?namespace=team-b&name=b1", "alice")
    absent = get(http, "/debug/explain?namespace=team-a&name=absent", "alice")
    assert hidden[0] == absent[0] == 404
    assert json.loads(hidden[1])["error"] == "AppWrapper team-b/b1 not found"
    assert get(http, "/debug/explain?namespace=team-b&name=b1", "admin")[0] == 200
    # Cached: asking again reviews nothing more.
    before = len(reviews.access_reviews)
    get(http, "/debug/queue", "alice")
    assert len(reviews.access_reviews) == before


def test_someone_who_may_list_appwrappers_nowhere_gets_403(served: tuple[Server, Reviews]) -> None:
    http, reviews = served
    reviews.tokens["carol"] = {"username": "carol", "groups": []}
    code, body = get(http, "/debug/queue", "carol")
    assert code == 403 and "carol may not list appwrappers.workload.codeflare.dev" in body
    # May list them only in a namespace with no queued or dispatched AppWrapper: an empty queue, not a 403.
    reviews.tokens["dave"] = {"username": "dave", "groups": []}
    grant(reviews, UserInfo("dave"), list_in("team-c"))
    code, body = get(http, "/debug/queue", "dave")
    assert code == 200 and json.loads(body)["queued"] == []


def test_a_review_that_fails_is_503_never_an_open_door(served: tuple[Server, Reviews]) -> None:
    from mcad.k8s import kube

    http, reviews = served
    reviews.fail = kube.ApiError(503, "ServiceUnavailable", "etcd is down")
    assert get(http, "/metrics", "admin")[0] == 503
    assert get(http, "/debug/queue", "alice")[0] == 503


def test_at_the_connection_bound_a_new_client_is_served_and_the_longest_idle_one_closed() -> None:
    http = Server("127.0.0.1:0", metrics=Metrics(), live=lambda: (True, ""), ready=lambda: (True, ""),
                  insecure=True, max_connections=2)
    http.start()
    idle = [socket.create_connection(("127.0.0.1", http.port), timeout=10) for _ in range(2)]
    try:
        wait_until(lambda: http.door.stats.open == 2, 10, "both idle clients to be held")
        # A third client is answered: the oldest idle connection makes room, the other one stays.
        with urllib.request.urlopen(f"http://127.0.0.1:{http.port}/healthz", timeout=5) as answer:
            assert answer.status == 200
        assert idle[0].recv(1) == b"", "the longest-idle connection was closed"
        idle[1].setblocking(False)
        with pytest.raises(BlockingIOError):
            idle[1].recv(1)  # still open, nothing to read
        assert http.door.stats.closed.get("evicted") == 1
    finally:
        for sock in idle:
            sock.close()
        http.stop()


def test_the_dashboard_page_is_open_and_its_views_need_the_rights_of_debug(served: tuple[Server, Reviews]) -> None:
    http, _ = served
    request = urllib.request.Request(f"http://127.0.0.1:{http.port}/ui/")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200 and "script-src 'self'" in response.headers["Content-Security-Policy"]
        assert b"<title>mcad dashboard</title>" in response.read()
    head = urllib.request.Request(f"http://127.0.0.1:{http.port}/ui/app.js", method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as response:
        assert response.status == 200 and response.read() == b"" and int(response.headers["Content-Length"]) > 1000
    code, body = get(http, "/ui/api/queue")
    assert code == 401 and "no bearer token" in body
    assert get(http, "/ui/api/queue", "forged")[0] == 401
    # A tenant: its namespace only, through the proxy's header as the page sends it.
    code, body = get(http, "/ui/api/queue", "alice", header="X-Mcad-Authorization")
    assert code == 200, body
    doc = json.loads(body)
    # Queued in dispatch order, then those in their retry pause, then dispatched: team-b's left out.
    assert [(row["name"], row["position"]) for row in doc["rows"]] == [("a1", 2), ("a3", None), ("a2", None)]
    assert doc["namespaces"] == ["team-a"] and [held["appwrapper"] for held in doc["reservations"]] == ["team-a/a1"]
    code, body = get(http, "/ui/api/nodes", "alice")
    assert code == 403 and "may not get /debug/ledger" in json.loads(body)["error"]
    code, body = get(http, "/ui/api/summary", "alice")
    assert code == 403 and "may not get /metrics" in json.loads(body)["error"]
    hidden = get(http, "/ui/api/explain?namespace=team-b&name=b1", "alice")
    assert hidden == (404, '{"error":"AppWrapper team-b/b1 not found"}\n')
    admin = json.loads(get(http, "/ui/api/queue?state=Running", "admin")[1])
    assert [row["name"] for row in admin["rows"]] == ["b2", "a2"]
    assert admin["counts"] == {"Queued": 2, "Resetting": 2, "Running": 2}


def test_an_ipv6_bind_address_is_served_over_ipv6() -> None:
    # parse_bind_address documents [::1]:8080; the server must then listen on an IPv6 socket.
    http = Server("[::1]:0", metrics=Metrics(), live=lambda: (True, ""), ready=lambda: (True, ""), insecure=True)
    http.start()
    try:
        with urllib.request.urlopen(f"http://[::1]:{http.port}/healthz", timeout=5) as answer:
            assert answer.status == 200
    finally:
        http.stop()


def test_one_namespace_of_the_queue_is_served_to_whoever_may_list_there(served: tuple[Server, Reviews]) -> None:
    """?namespace=NS: NS's rows (positions global) and reservations alone; a tenant may ask for its own namespace
    only, and a name that is no namespace's is refused before any access review."""
    http, reviews = served
    code, body = get(http, "/debug/queue?namespace=team-a", "alice")
    assert code == 200, body
    doc = json.loads(body)
    assert [(aw["name"], aw["position"]) for aw in doc["queued"]] == [("a1", 2)]
    assert [aw["name"] for aw in doc["dispatched"] + doc["resetting"]] == ["a2", "a3"]
    assert [held["appwrapper"] for held in doc["reservations"]] == ["team-a/a1"]
    code, body = get(http, "/debug/queue?namespace=team-b", "alice")
    assert code == 403 and json.loads(body)["error"] == (
        f"{ALICE.username} may not list appwrappers.workload.codeflare.dev in namespace team-b")
    admin = json.loads(get(http, "/debug/queue?namespace=team-b", "admin")[1])
    assert [aw["name"] for aw in admin["queued"] + admin["dispatched"] + admin["resetting"]] == ["b1", "b2", "b3"]
    assert [held["appwrapper"] for held in admin["reservations"]] == ["team-b/b1"]
    before = len(reviews.access_reviews)
    for junk in ("Team_B%2F..", "team-a%0A"):
        code, body = get(http, f"/debug/queue?namespace={junk}", "alice")
        assert code == 400 and "is not a namespace name" in json.loads(body)["error"], junk
    assert len(reviews.access_reviews) == before


def test_a_page_of_the_queue_cuts_the_queued_rows_as_the_reader_sees_them(served: tuple[Server, Reviews]) -> None:
    """?limit=N&offset=M: N queued rows from place M among those the caller may see, every resetting and dispatched
    one, and the queued total; with ?namespace= too; a limit of 0, above MAX_QUEUE_PAGE or not a number: 400."""
    http, _ = served
    code, body = get(http, "/debug/queue?limit=1&offset=1", "admin")
    assert code == 200, body
    doc = json.loads(body)
    assert [aw["name"] for aw in doc["queued"]] == ["b1"]
    assert doc["page"] == {"offset": 1, "limit": 1, "queuedTotal": 2}
    assert sorted(aw["name"] for aw in doc["dispatched"] + doc["resetting"]) == ["a2", "a3", "b2", "b3"]
    alice = json.loads(get(http, "/debug/queue?limit=5", "alice")[1])
    assert [aw["name"] for aw in alice["queued"]] == ["a1"] and alice["page"]["queuedTotal"] == 1
    assert [held["appwrapper"] for held in alice["reservations"]] == ["team-a/a1"]
    assert sorted(aw["name"] for aw in alice["dispatched"] + alice["resetting"]) == ["a2", "a3"]
    only = json.loads(get(http, "/debug/queue?namespace=team-b&limit=5&offset=0", "admin")[1])
    assert [aw["name"] for aw in only["queued"]] == ["b1"] and only["page"]["queuedTotal"] == 1
    assert get(http, "/debug/queue?namespace=team-b&limit=5", "alice")[0] == 403
    for query in ("limit=0", f"limit={MAX_QUEUE_PAGE + 1}", "limit=x", "limit=%C2%B2", "limit=5&offset=-1",
                  "offset=3"):
        code, body = get(http, f"/debug/queue?{query}", "admin")
        assert code == 400 and "limit must be a whole number" in json.loads(body)["error"], query
