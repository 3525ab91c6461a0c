"""``mcadctl dashboard``'s local proxy against a fake API server on loopback (plain HTTP, a token kubeconfig).

The fake answers the three things the proxy asks of an API server: the Lease, and the service and pod proxy paths,
behind which a fake controller serves /ui. Every request it gets is recorded, so a test can show that a refused
request never left the proxy. test/e2e/test_dashboard_access.py runs the same proxy against a real API server.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import webbrowser
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mcad.cli import dashboardproxy, mcadctl, reach
from mcad.cli.dashboardproxy import DashboardProxy, Forwarder
from mcad.k8s import kube
from test.support import unreachable_kubeconfig, wait_until

NS, NAME = "mcad-system", "mcad-controller"
SERVICE = f"/api/v1/namespaces/{NS}/services/{NAME}:http/proxy"
LEADER = f"/api/v1/namespaces/{NS}/services/{NAME}-leader:http/proxy"  # the chart's Service of the leader alone
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}"
CSP = "default-src 'none'; script-src 'self'"
USER_TOKEN = "user-token"

Reply = tuple[int, list[tuple[str, str]], bytes]


def pod_base(pod: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{pod}:8080/proxy"


def status(code: int, message: str, reason: str = "Forbidden") -> Reply:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "code": code}
    return code, [("Content-Type", "application/json")], json.dumps(body).encode()


def controller(name: str = "leader") -> Callable[[str, dict[str, str]], Reply]:
    """A controller's /ui routes: the page, a redirect, and a data route that says what it was sent."""

    def answer(rest: str, headers: dict[str, str]) -> Reply:
        path, _, query = rest.partition("?")
        if path == "/ui":
            return 302, [("Location", "ui/")], b""
        if path == "/ui/":
            return 200, [("Content-Type", "text/html; charset=utf-8"), ("Content-Security-Policy", CSP),
                         ("Set-Cookie", "session=stolen"), ("X-Content-Type-Options", "nosniff")], \
                f"<html>page of {name}</html>".encode()
        if path == "/ui/big.js":
            return 200, [("Content-Type", "text/javascript")], bytes(range(256)) * 8192  # 2 MiB
        if path == "/ui/api/queue":
            seen = {"controller": name, "query": query, "proxyAuthorization": headers.get("x-mcad-authorization"),
                    "cookie": headers.get("cookie"), "authorization": headers.get("authorization")}
            return 200, [("Content-Type", "application/json")], json.dumps(seen).encode()
        return 404, [("Content-Type", "application/json")], b'{"error": "no such page"}'

    return answer


def standby(leader: str) -> Callable[[str, dict[str, str]], Reply]:
    def answer(rest: str, headers: dict[str, str]) -> Reply:
        if rest.startswith("/ui/api/"):
            return 503, [("Content-Type", "application/json")], json.dumps(
                {"error": "not the leader", "leader": leader}).encode()
        return controller("standby")(rest, headers)

    return answer


@dataclass
class FakeApiServer:
    """Records every request; answers the Lease from ``lease_holder`` (None: 404) and the proxy paths from
    ``service`` and ``pods`` (a pod not in ``pods``: the API server's 503)."""

    lease_holder: str | None = None
    # The leader's Service; None: there is none (an older chart), which most tests here assume.
    leader: Callable[[str, dict[str, str]], Reply] | None = None
    service: Callable[[str, dict[str, str]], Reply] = field(default_factory=controller)
    pods: dict[str, Callable[[str, dict[str, str]], Reply]] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # what a hanging answer waits for
    port: int = 0

    def answer(self, method: str, target: str, headers: dict[str, str]) -> Reply:
        self.requests.append((method, target, headers))
        path = target.partition("?")[0]
        if path == LEASE:
            if self.lease_holder is None:
                return status(404, f'leases.coordination.k8s.io "{NAME}" not found', "NotFound")
            return 200, [("Content-Type", "application/json")], json.dumps(
                {"kind": "Lease", "spec": {"holderIdentity": self.lease_holder}}).encode()
        if target.startswith(LEADER + "/"):
            if self.leader is None:
                return status(404, f'services "{NAME}-leader" not found', "NotFound")
            return self.leader(target[len(LEADER):], headers)
        if target.startswith(SERVICE + "/"):
            return self.service(target[len(SERVICE):], headers)
        match = re.fullmatch(rf"/api/v1/namespaces/{NS}/pods/([^/:]+):8080/proxy(/.*)", target)
        if match:
            pod = self.pods.get(match.group(1))
            if pod is None:
                return status(503, f"pods \"{match.group(1)}\" not found", "ServiceUnavailable")
            return pod(match.group(2), headers)
        return status(404, "the server could not find the requested resource", "NotFound")

    def proxied(self) -> list[str]:
        """The targets of the proxy requests made so far (the Lease reads left out, and while there is no leader's
        Service the one request that finds it missing: the tests of that route look at ``requests``)."""
        return [target for _, target, _ in self.requests
                if "/proxy/" in target and (self.leader is not None or not target.startswith(LEADER + "/"))]


class _FakeHandler(BaseHTTPRequestHandler):
    server: _FakeServer

    def do_GET(self) -> None:
        code, headers, body = self.server.fake.answer(
            self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeApiServer


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    state = FakeApiServer()
    server = _FakeServer(("127.0.0.1", 0), _FakeHandler)
    server.fake = state
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.port = int(server.server_address[1])
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


def kubeconfig(directory: Path, port: int, user: str = f"token: {USER_TOKEN}") -> Path:
    path = directory / "kubeconfig"
    path.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{{user}}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return path


@dataclass
class Running:
    proxy: DashboardProxy
    notes: list[str]

    @property
    def prefix(self) -> str:
        return f"/{self.proxy.capability}"

    def get(self, path: str, *, method: str = "GET", host: str | None = "",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request to the proxy: ``host`` "" is the right Host header, None none at all."""
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy.port, timeout=10)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            if host is not None:
                conn.putheader("Host", host or f"127.0.0.1:{self.proxy.port}")
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            conn.endheaders()
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()


@contextlib.contextmanager
def run_proxy(fake: FakeApiServer, tmp_path: Path, *, timeout: float = 5.0, max_connections: int = 8,
              token: str | None = None) -> Iterator[Running]:
    conn = kube.connect(str(kubeconfig(tmp_path, fake.port)))
    where = reach.Where(namespace=NS, name=NAME, timeout=timeout, token=token)
    notes: list[str] = []
    forwarder = Forwarder(conn, where, lambda: where.token or kube.bearer_token(conn), notes.append)
    forwarder.locate()
    proxy = DashboardProxy(forwarder, max_connections=max_connections)
    proxy.start()
    try:
        yield Running(proxy, notes)
    finally:
        proxy.stop()


@pytest.fixture
def running(fake: FakeApiServer, tmp_path: Path) -> Iterator[Running]:
    with run_proxy(fake, tmp_path) as proxy:
        yield proxy


# -- what never leaves the proxy -------------------------------------------------------------------------------------


def test_the_url_holds_a_random_capability_and_paths_without_it_get_404(running: Running,
                                                                        fake: FakeApiServer) -> None:
    assert re.fullmatch(rf"http://127\.0\.0\.1:{running.proxy.port}/[0-9a-f]{{32}}/ui/", running.proxy.url)
    other = DashboardProxy(running.proxy.forwarder)
    try:
        assert other.capability != running.proxy.capability
    finally:
        other.stop()
    cap = running.proxy.capability
    for path in ("/", "/ui/", "/ui/api/queue", f"/{cap[:-1]}/ui/", f"/{cap}0/ui/", f"/{cap.upper()}/ui/",
                 f"/x{cap}/ui/", f"/ui/{cap}/ui/", f"http://127.0.0.1/{cap}/ui/", "*"):
        code, _, _ = running.get(path)
        assert code == 404, path
    assert fake.proxied() == []


def test_bytes_outside_ascii_in_the_path_are_a_plain_404(running: Running) -> None:
    for path in (b"/\xe9" + b"a" * 31 + b"/ui/", running.prefix.encode() + b"/ui/\xe9"):
        with socket.create_connection(("127.0.0.1", running.proxy.port), timeout=10) as raw:
            raw.sendall(b"GET " + path + b" HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n" % running.proxy.port)
            assert raw.recv(65536).startswith(b"HTTP/1.0 404 "), path


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1", "localhost:1",
                                  "127.0.0.2:{port}", "localhost.evil.example:{port}", "0.0.0.0:{port}", None])
def test_a_host_header_other_than_loopback_with_the_port_is_refused(running: Running, fake: FakeApiServer,
                                                                    host: str | None) -> None:
    # A page on evil.example whose DNS name now points at 127.0.0.1 sends Host: evil.example (DNS rebinding).
    given = None if host is None else host.format(port=running.proxy.port)
    code, _, body = running.get(f"{running.prefix}/ui/", host=given)
    assert code == 403, given
    assert b"answers only requests addressed to 127.0.0.1" in body
    assert fake.proxied() == []


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}", "[::1]:{port}"])
def test_loopback_names_with_the_port_are_accepted(running: Running, host: str) -> None:
    code, _, body = running.get(f"{running.prefix}/ui/", host=host.format(port=running.proxy.port))
    assert (code, body) == (200, b"<html>page of leader</html>")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "PROPFIND"])
def test_only_get_and_head_are_forwarded(running: Running, fake: FakeApiServer, method: str) -> None:
    code, headers, _ = running.get(f"{running.prefix}/ui/api/queue", method=method)
    assert code == 405 and headers["allow"] == "GET, HEAD"
    code, _, _ = running.get(f"/{'0' * 32}/ui/", method=method)
    assert code == 404  # without the capability, not even the method is discussed
    assert fake.proxied() == []


def test_head_is_asked_as_get_and_answered_without_a_body(running: Running, fake: FakeApiServer) -> None:
    code, headers, body = running.get(f"{running.prefix}/ui/", method="HEAD")
    assert (code, body) == (200, b"")
    assert headers["content-length"] == str(len(b"<html>page of leader</html>"))
    assert [(m, t) for m, t, _ in fake.requests if "/proxy/" in t] == [("GET", f"{LEADER}/ui/"),
                                                                        ("GET", f"{SERVICE}/ui/")]


@pytest.mark.parametrize("path", ["/debug/queue", "/metrics", "/healthz", "/api/v1/namespaces", "/uix",
                                  "/ui/../debug/queue", "/ui/./app.js", "/ui/%2e%2e/debug/queue", "/ui/..%2fdebug",
                                  "/ui//app.js", "/ui/app.js/..", "/ui\\..\\debug", "/ui/.hidden"])
def test_only_plain_ui_paths_are_forwarded(running: Running, fake: FakeApiServer, path: str) -> None:
    assert running.get(running.prefix + path)[0] == 404, path
    assert fake.proxied() == []


def test_the_bare_capability_redirects_to_the_page(running: Running, fake: FakeApiServer) -> None:
    for path in (running.prefix, running.prefix + "/"):
        code, headers, _ = running.get(path)
        assert (code, headers["location"]) == (302, f"{running.prefix}/ui/")
    assert fake.proxied() == []


# -- what is forwarded, and how ------------------------------------------------------------------------------------


def test_the_users_token_goes_in_x_mcad_authorization_and_browser_credentials_do_not(
        running: Running, fake: FakeApiServer) -> None:
    code, _, body = running.get(f"{running.prefix}/ui/api/queue?namespace=team-a&state=Queued&offset=0&limit=50",
                                headers={"Cookie": "sid=1", "Authorization": "Bearer browser"})
    assert code == 200
    # The API server is shown the kubeconfig's own credentials (it authorizes the proxying, then drops them; this
    # fake does not), never the browser's.
    assert json.loads(body) == {"controller": "leader", "query": "namespace=team-a&state=Queued&offset=0&limit=50",
                                "proxyAuthorization": f"Bearer {USER_TOKEN}", "cookie": None,
                                "authorization": f"Bearer {USER_TOKEN}"}


def test_a_token_the_page_sends_itself_is_passed_on(running: Running) -> None:
    # The page's token form (for a kubeconfig with no token to pass on) sends X-Mcad-Authorization itself.
    _, _, body = running.get(f"{running.prefix}/ui/api/queue",
                             headers={"X-Mcad-Authorization": "Bearer from-the-form"})
    assert json.loads(body)["proxyAuthorization"] == "Bearer from-the-form"


def test_answers_keep_status_and_headers_but_lose_set_cookie(running: Running) -> None:
    code, headers, body = running.get(f"{running.prefix}/ui/")
    assert code == 200
    assert headers["content-security-policy"] == CSP
    assert headers["x-content-type-options"] == "nosniff"
    assert "set-cookie" not in headers
    code, headers, body = running.get(f"{running.prefix}/ui/nope")
    assert (code, json.loads(body)) == (404, {"error": "no such page"})  # the controller's own error, unchanged


def test_a_relative_redirect_passes_as_is_and_one_into_the_proxy_path_is_mapped_back(
        running: Running, fake: FakeApiServer) -> None:
    code, headers, _ = running.get(f"{running.prefix}/ui")
    assert (code, headers["location"]) == (302, "ui/")

    def rewritten(rest: str, headers: dict[str, str]) -> Reply:
        # What the API server makes of a Location that is an absolute path.
        return 302, [("Location", f"{SERVICE}/ui/")], b""

    fake.service = rewritten
    code, headers, _ = running.get(f"{running.prefix}/ui")
    assert (code, headers["location"]) == (302, f"{running.prefix}/ui/")


def test_large_answers_stream_through_unchanged(running: Running) -> None:
    code, _, body = running.get(f"{running.prefix}/ui/big.js")
    assert code == 200 and body == bytes(range(256)) * 8192


# -- the API server's refusals ---------------------------------------------------------------------------------------


FORBIDDEN = ('services "mcad-controller" is forbidden: User "system:serviceaccount:team-a:bob" cannot get resource '
             '"services/proxy" in API group "" in the namespace "mcad-system"')


def test_the_api_servers_403_is_a_readable_page_naming_the_missing_right(running: Running,
                                                                         fake: FakeApiServer) -> None:
    fake.service = lambda rest, headers: status(403, FORBIDDEN + " <script>")
    code, headers, body = running.get(f"{running.prefix}/ui/")
    assert code == 403
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert headers["content-security-policy"].startswith("default-src 'none'")
    page = body.decode()
    assert ("get on services/proxy with the resource name mcad-controller:http (RBAC sees the name as the URL "
            "spells it) in namespace mcad-system") in page
    assert "cannot get resource &quot;services/proxy&quot;" in page and "&lt;script&gt;" in page
    assert "<script>" not in page
    # The page's data requests get the same words as JSON.
    code, headers, body = running.get(f"{running.prefix}/ui/api/queue")
    assert code == 403 and headers["content-type"] == "application/json"
    assert "your user needs get on services/proxy" in json.loads(body)["error"]


def test_the_controllers_own_403_passes_through_unchanged(running: Running, fake: FakeApiServer) -> None:
    refused = b'{"error": "system:serviceaccount:a:b may not get /debug/ledger"}'
    fake.service = lambda rest, headers: (403, [("Content-Type", "application/json")], refused)
    code, _, body = running.get(f"{running.prefix}/ui/api/nodes")
    assert (code, body) == (403, refused)


def test_no_endpoints_and_bad_credentials_say_what_to_check(running: Running, fake: FakeApiServer) -> None:
    fake.service = lambda rest, headers: status(503, 'no endpoints available for service "mcad-controller"',
                                                "ServiceUnavailable")
    code, _, body = running.get(f"{running.prefix}/ui/")
    assert code == 503 and b"is the controller running" in body
    fake.service = lambda rest, headers: status(401, "Unauthorized", "Unauthorized")
    code, _, body = running.get(f"{running.prefix}/ui/")
    assert code == 401 and b"does not accept the credentials" in body
    code, _, body = running.get(f"{running.prefix}/ui/api/queue")
    assert code == 502, "a 401 would make the page ask for a token, which cannot help"


def test_an_api_server_that_does_not_answer_in_time_is_a_502(fake: FakeApiServer, tmp_path: Path) -> None:
    def hang(rest: str, headers: dict[str, str]) -> Reply:
        fake.release.wait(30)
        return controller()(rest, headers)

    fake.service = hang
    with run_proxy(fake, tmp_path, timeout=0.5) as running:
        code, _, body = running.get(f"{running.prefix}/ui/")
        assert code == 502 and b"cannot reach the API server" in body


# -- finding the leader ----------------------------------------------------------------------------------------------


def test_the_leaders_service_is_asked_first_and_kept(fake: FakeApiServer, tmp_path: Path) -> None:
    fake.lease_holder = "mcad-0_abc"  # not needed: the leader's Service selects its pod
    fake.leader = controller("the leader's Service")
    with run_proxy(fake, tmp_path) as running:
        assert running.get(f"{running.prefix}/ui/")[2] == b"<html>page of the leader's Service</html>"
        assert running.get(f"{running.prefix}/ui/api/queue")[0] == 200
        assert fake.proxied() == [f"{LEADER}/ui/", f"{LEADER}/ui/api/queue"]
        assert running.notes == []


@pytest.mark.parametrize("leader", [
    None,  # no such Service: an older chart, or no leader election
    lambda rest, headers: status(503, 'no endpoints available for service "mcad-controller-leader"',
                                 "ServiceUnavailable"),  # a handover under way
    lambda rest, headers: status(403, 'cannot get resource "services/proxy"'),  # an older debug-client Role
    standby("mcad-1_xyz"),  # the old leader's pod, still labelled
], ids=["missing", "no-endpoints", "forbidden", "standby"])
def test_a_leaders_service_that_does_not_deliver_falls_back_to_the_service_for_good(
        fake: FakeApiServer, tmp_path: Path, leader: Callable[[str, dict[str, str]], Reply] | None) -> None:
    fake.leader = leader
    with run_proxy(fake, tmp_path) as running:
        code, _, body = running.get(f"{running.prefix}/ui/api/queue")
        assert code == 200 and json.loads(body)["controller"] == "leader"
        assert running.get(f"{running.prefix}/ui/")[2] == b"<html>page of leader</html>"
        assert [t for _, t, _ in fake.requests if "/proxy/" in t] == [f"{LEADER}/ui/api/queue",
                                                                      f"{SERVICE}/ui/api/queue", f"{SERVICE}/ui/"]
        assert any("now forwarding to the Service mcad-system/mcad-controller" in n for n in running.notes)


def test_a_standby_is_followed_to_the_leader_and_the_leader_kept(running: Running, fake: FakeApiServer) -> None:
    fake.service = standby("mcad-1_xyz")
    fake.pods["mcad-1"] = controller("pod mcad-1")
    code, _, body = running.get(f"{running.prefix}/ui/api/queue")
    assert code == 200 and json.loads(body)["controller"] == "pod mcad-1"
    code, _, body = running.get(f"{running.prefix}/ui/api/queue?limit=1")
    assert json.loads(body)["proxyAuthorization"] == f"Bearer {USER_TOKEN}"
    assert fake.proxied() == [f"{SERVICE}/ui/api/queue", f"{pod_base('mcad-1')}/ui/api/queue",
                              f"{pod_base('mcad-1')}/ui/api/queue?limit=1"]


def test_a_standby_whose_leader_cannot_be_reached_is_passed_through_and_pods_not_tried_again(
        running: Running, fake: FakeApiServer) -> None:
    fake.service = standby("mcad-1_xyz")
    fake.pods["mcad-1"] = lambda rest, headers: status(403, "cannot get resource pods/proxy")
    for _ in range(2):
        code, _, body = running.get(f"{running.prefix}/ui/api/queue")
        assert (code, json.loads(body)) == (503, {"error": "not the leader", "leader": "mcad-1_xyz"})
    service, pod = f"{SERVICE}/ui/api/queue", f"{pod_base('mcad-1')}/ui/api/queue"
    # The first: the Service, the leader's pod (refused), the Service SERVICE_TRIES - 1 times more; the second: the
    # Service SERVICE_TRIES times.
    tries = dashboardproxy.SERVICE_TRIES
    assert tries == 8
    assert fake.proxied() == [service, pod, *[service] * (tries - 1), *[service] * tries]


def test_without_pods_proxy_the_service_is_asked_again_until_the_leader_answers(
        running: Running, fake: FakeApiServer) -> None:
    # Two replicas behind the Service: the API server sends each request to either.
    replicas = iter([standby("mcad-1_xyz"), standby("mcad-1_xyz"), controller("mcad-1")] * 2)
    fake.service = lambda rest, headers: next(replicas)(rest, headers)
    code, _, body = running.get(f"{running.prefix}/ui/api/queue")
    assert code == 200 and json.loads(body)["controller"] == "mcad-1"
    assert fake.proxied() == [f"{SERVICE}/ui/api/queue", f"{pod_base('mcad-1')}/ui/api/queue",
                              f"{SERVICE}/ui/api/queue", f"{SERVICE}/ui/api/queue"]


# -- bounds ----------------------------------------------------------------------------------------------------------


def test_connections_beyond_the_bound_are_answered_503_at_once(fake: FakeApiServer, tmp_path: Path) -> None:
    with run_proxy(fake, tmp_path, max_connections=1) as running:
        # A client that connects and says nothing holds the only slot (until CLIENT_TIMEOUT).
        idle = socket.create_connection(("127.0.0.1", running.proxy.port))
        try:
            code, _, body = running.get(f"{running.prefix}/ui/")
            assert (code, body) == (503, b"too many connections at once\n")
        finally:
            idle.close()
        wait_until(lambda: running.get(f"{running.prefix}/ui/")[0] == 200, 10, "the slot to be free again")


# -- the command -----------------------------------------------------------------------------------------------------


def test_the_command_prints_the_url_and_the_route_and_stops_on_ctrl_c(
        fake: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[str] = []

    def serve(self: DashboardProxy, poll_interval: float = 0.5) -> None:
        served.append(self.url)
        raise KeyboardInterrupt

    monkeypatch.setattr(DashboardProxy, "serve", serve)
    config = kubeconfig(tmp_path, fake.port)
    result = CliRunner().invoke(mcadctl.main, ["--kubeconfig", str(config), "dashboard"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dashboard: {served[0]}"
    # This fake has no leader's Service (an older chart): the probe finds out, and the Service is the route.
    assert lines[1].startswith("the leader's Service mcad-system/mcad-controller-leader is not reachable"), lines
    assert lines[2] == "now forwarding to the Service mcad-system/mcad-controller"
    assert lines[3].startswith("Forwarding /ui to the Service mcad-system/mcad-controller through the API server "
                               f"http://127.0.0.1:{fake.port}")
    assert lines[-1] == "stopped"
    assert fake.proxied() == [f"{SERVICE}/ui/"]  # the probe


def test_the_command_warns_when_the_page_is_refused_and_about_client_certificates(
        fake: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DashboardProxy, "serve", lambda self, poll_interval=0.5: None)
    fake.service = lambda rest, headers: status(403, FORBIDDEN)
    config = kubeconfig(tmp_path, fake.port, "client-certificate-data: eA==, client-key-data: eQ==")
    result = CliRunner().invoke(mcadctl.main, ["--kubeconfig", str(config), "dashboard"])
    assert result.exit_code == 0, result.output
    assert "authenticates with a client certificate" in result.stderr and "--token" in result.stderr
    assert "your user needs get on services/proxy" in result.stderr
    (_, _, sent), = [r for r in fake.requests if "/proxy/" in r[1] and not r[1].startswith(LEADER)]
    assert "x-mcad-authorization" not in sent


@pytest.mark.parametrize(("args", "words"), [
    (["--offline", "dashboard"], "no --offline view"),
    (["--url", "http://127.0.0.1:8080", "dashboard"], "open http://127.0.0.1:8080/ui/"),
    (["dashboard", "--address", "0.0.0.0"], "'0.0.0.0' is not one of"),
    (["dashboard", "--port", "70000"], "70000"),
])
def test_bad_usage_is_exit_2(args: list[str], words: str) -> None:
    result = CliRunner().invoke(mcadctl.main, args)
    assert result.exit_code == 2 and words in result.stderr, result.output


def test_help_says_who_sees_what() -> None:
    result = CliRunner().invoke(mcadctl.main, ["dashboard", "--help"], terminal_width=200)
    text = " ".join(result.stdout.split())
    for words in ("get on services/proxy", "pods/proxy", "debug-viewer", "may list them", "random secret",
                  "--open", "GET and HEAD"):
        assert words in text, words


def test_a_non_loopback_address_is_refused_by_the_proxy_itself(running: Running) -> None:
    with pytest.raises(ValueError, match="loopback"):
        dashboardproxy.DashboardProxy(running.proxy.forwarder, address="192.0.2.2")


def test_open_starts_a_browser_only_when_asked(fake: FakeApiServer, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    served: list[str] = []
    monkeypatch.setattr(DashboardProxy, "serve", lambda self, poll_interval=0.5: served.append(self.url))
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    config = str(kubeconfig(tmp_path, fake.port))
    assert CliRunner().invoke(mcadctl.main, ["--kubeconfig", config, "dashboard"]).exit_code == 0
    assert opened == []
    assert CliRunner().invoke(mcadctl.main, ["--kubeconfig", config, "dashboard", "--open"]).exit_code == 0
    assert opened == served[-1:]


def test_an_unreachable_api_server_is_an_error_before_listening(tmp_path: Path) -> None:
    result = CliRunner().invoke(mcadctl.main, ["--kubeconfig", str(unreachable_kubeconfig(tmp_path)), "dashboard"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot reach the API server https://127.0.0.1:9"), result.output
    assert "Dashboard:" not in result.stdout
