"""The front door (mcad.serve.frontdoor): who goes when the connection bound is reached, deadlines per phase, the worker
bound and its busy answer, health never queued, big bodies in their own lane and left in the socket until it
admits them. Time is a fake clock stepped by the test; deadlines are checked when the test calls ``sweep()``."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mcad.metrics import Metrics
from mcad.serve.doorbook import Busy, Conn, Phase, Registry, Slots
from mcad.serve.frontdoor import FrontDoor, Limits
from mcad.serve.http1 import MAX_HEADER_FIELDS, BadRequest, Head, Response, parse_head
from test.support import wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def conn(name: str) -> Conn:
    return Conn(name, lambda: None)


# -- the registry: pure bookkeeping ---------------------------------------------------------------------------------

def test_at_the_cap_the_longest_idle_goes_then_the_oldest_still_sending_and_never_one_at_work() -> None:
    clock = FakeClock()
    registry = Registry(3, clock)
    a, b, c = conn("a"), conn("b"), conn("c")
    for each in (a, b, c):
        assert registry.add(each, 10) == (True, None)
        clock.now += 1
    registry.enter(a, Phase.WORK, None)
    registry.enter(b, Phase.IDLE, 120)
    clock.now += 1
    registry.enter(c, Phase.IDLE, 120)
    d = conn("d")
    assert registry.add(d, 10) == (True, b), "b has been idle longest"
    e = conn("e")
    assert registry.add(e, 10) == (True, c), "then c, the other idle one"
    registry.enter(d, Phase.HEAD, 10)  # still sending its head
    registry.enter(e, Phase.WORK, None)
    f = conn("f")
    assert registry.add(f, 10) == (True, d), "none idle: the oldest still sending its request"
    registry.enter(f, Phase.WORK, None)
    assert registry.add(conn("g"), 10) == (False, None), "every connection at work: the new one is refused"
    assert len(registry) == 3


def test_each_phase_has_its_deadline_and_work_has_none() -> None:
    clock = FakeClock()
    registry = Registry(10, clock)
    shaking, idle, head, body, work = (conn(n) for n in ("shaking", "idle", "head", "body", "work"))
    for each in (shaking, idle, head, body, work):
        registry.add(each, 10)
    registry.enter(idle, Phase.IDLE, 120)
    registry.enter(head, Phase.HEAD, 10)
    registry.enter(body, Phase.BODY, 5)
    registry.enter(work, Phase.WORK, None)
    clock.now += 4.9
    assert registry.expired() == []
    clock.now += 0.1
    assert registry.expired() == [body]
    clock.now += 5
    assert {c.peer for c in registry.expired()} == {"shaking", "head"}
    clock.now += 110
    assert registry.expired() == [idle]
    clock.now += 10_000
    assert registry.expired() == [] and len(registry) == 1, "work is never cut by the door"


def test_slots_are_first_come_first_served_and_a_waiter_past_its_deadline_is_busy() -> None:
    clock = FakeClock()

    async def scenario() -> list[str]:
        slots = Slots(1, clock)
        order: list[str] = []
        await slots.acquire(clock() + 5)

        async def wait(name: str, deadline: float) -> None:
            try:
                await slots.acquire(deadline)
            except Busy:
                order.append(f"{name} busy")
                return
            order.append(name)
        first = asyncio.ensure_future(wait("first", clock() + 5))
        second = asyncio.ensure_future(wait("second", clock() + 50))
        third = asyncio.ensure_future(wait("third", clock() + 50))
        await asyncio.sleep(0)
        clock.now += 6
        assert slots.expire() == 1
        await asyncio.sleep(0)
        third.cancel()  # a waiter that goes away leaves the line
        await asyncio.sleep(0)
        slots.release()
        await asyncio.gather(first, second, return_exceptions=True)
        assert slots.used == 1 and slots.waiting == 0
        slots.release()
        assert slots.used == 0
        return order

    assert asyncio.run(scenario()) == ["first busy", "second"]


def test_a_request_head_is_parsed_and_what_is_not_one_is_refused() -> None:
    head = parse_head(b"POST /validate?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 12\r\n\r\n", "10.0.0.1")
    assert (head.method, head.path, head.query, head.content_length, head.keep_alive) == (
        "POST", "/validate", "x=1", 12, True)
    assert head.headers["Content-Length"] == "12" and head.headers.get("HOST") == "a"
    assert not parse_head(b"GET / HTTP/1.0\r\n\r\n", "p").keep_alive
    for bad in (b"GARBAGE\r\n\r\n", b"GET / HTTP/2\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
                b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"):
        with pytest.raises(BadRequest, match=r"malformed|chunked"):
            parse_head(bad, "p")


def test_header_fields_are_read_strictly_where_leniency_lets_requests_be_smuggled() -> None:
    head = parse_head(b"GET / HTTP/1.1\r\nX-A:  one \t\r\nx-a: two\r\nEmpty:\r\nLatin: caf\xe9\r\n\r\n", "p")
    assert head.headers["x-a"] == "one" and head.headers.every("X-A") == ["one", "two"]
    assert head.headers["Empty"] == "" and head.headers["latin"] == "caf\u00e9"
    assert list(head.headers) == ["X-A", "Empty", "Latin"]
    many = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADER_FIELDS))
    assert len(parse_head(b"GET / HTTP/1.1\r\n" + many + b"\r\n", "p").headers) == MAX_HEADER_FIELDS
    for bad in (b"Host : a",  # whitespace before the colon: RFC 9112 says refuse
                b"Host: a\r\n folded",  # obs-fold
                b"no colon here", b": no name", b"Bad Name: a", b"X: a\x00b", b"X: a\nContent-Length: 5",
                b"X: \x7f", many + b"One-Too-Many: v"):
        with pytest.raises(BadRequest, match="malformed headers") as err:
            parse_head(b"POST / HTTP/1.1\r\n" + bad + b"\r\n\r\n", "p")
        assert err.value.status == 400, bad


# -- a served front door ----------------------------------------------------------------------------------------

class Service:
    name = "test"
    precheck = None

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def early(self, head: Head) -> Response | None:
        if head.path == "/healthz":
            return Response(200, b"ok\n")
        return None

    def handle(self, head: Head, body: bytes) -> Response:
        with self.lock:
            self.started.append((head.path, len(body)))
        if head.path.startswith("/block"):
            assert self.release.wait(30)
        return Response(200, f"{head.path} {len(body)}".encode())

    def busy(self, head: Head, body: bytes | None, reason: str) -> Response:
        return Response(503, f"busy: {reason}".encode())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def service() -> Service:
    return Service()


def serve(service: Any, clock: FakeClock, **limits: Any) -> FrontDoor:
    door = FrontDoor(service, ("127.0.0.1", 0), Limits(**{"max_body_bytes": 1 << 20, **limits}), clock=clock,
                     sweep_seconds=None)
    door.start()
    assert door.listening.wait(10)
    return door


@pytest.fixture
def door(service: Service, clock: FakeClock) -> Iterator[FrontDoor]:
    served = serve(service, clock, workers=1, worker_wait=5, header_timeout=10, idle_timeout=120, body_timeout=10,
                   big_body_bytes=1000, big_lane=1)
    yield served
    service.release.set()
    served.stop()


def connect(door: FrontDoor) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", door.port), timeout=10)
    return sock


def request(path: str, body: bytes = b"", method: str = "POST") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def answer(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ")[1]), body


def closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True


def test_a_head_sent_slowly_is_cut_off_at_its_deadline_from_its_first_byte(door: FrontDoor, clock: FakeClock) -> None:
    sock = connect(door)
    wait_until(lambda: door.registry.phases() == {"idle": 1}, 10, "the connection to be held, idle")
    clock.now += 100  # idle, within the idle timeout: kept
    door.sweep()
    sock.sendall(b"POST /x HTTP/1.1\r\n")
    wait_until(lambda: door.registry.phases() == {"header": 1}, 10, "the head to be under way")
    clock.now += 9.9
    door.sweep()
    sock.sendall(b"X-Slow: 1\r\n")
    clock.now += 0.2  # 10.1 s after its first byte, however regularly it sends
    door.sweep()
    assert closed(sock)
    assert door.stats.closed == {"header_timeout": 1}


def test_an_idle_connection_is_kept_until_the_idle_timeout(door: FrontDoor, clock: FakeClock) -> None:
    sock = connect(door)
    sock.sendall(request("/a"))
    assert answer(sock) == (200, b"/a 0")
    wait_until(lambda: door.registry.phases() == {"idle": 1}, 10, "the connection to be idle")
    clock.now += 119
    door.sweep()
    sock.sendall(request("/b", b"xy"))
    assert answer(sock) == (200, b"/b 2"), "kept alive past every other deadline"
    wait_until(lambda: door.registry.phases() == {"idle": 1}, 10, "the connection to be idle")
    clock.now += 121
    door.sweep()
    assert closed(sock)
    assert door.stats.closed == {"idle_timeout": 1}


def test_once_draining_every_answer_closes_its_connection_and_new_ones_are_still_served(door: FrontDoor) -> None:
    kept = connect(door)
    kept.sendall(request("/a"))
    assert answer(kept) == (200, b"/a 0")
    door.drain()
    kept.sendall(request("/b"))
    assert answer(kept) == (200, b"/b 0"), "a kept-alive connection still gets its answer"
    assert closed(kept), "and is closed after it"
    fresh = connect(door)
    fresh.sendall(request("/c"))
    assert answer(fresh) == (200, b"/c 0")
    assert closed(fresh)


def test_connections_accepted_are_counted_once_each_however_many_requests_they_carry(door: FrontDoor) -> None:
    first = connect(door)
    for path in ("/a", "/b", "/c"):
        first.sendall(request(path))
        assert answer(first) == (200, f"{path} 0".encode())
    second = connect(door)
    second.sendall(request("/d"))
    assert answer(second) == (200, b"/d 0")
    assert (door.stats.accepted, door.stats.requests) == (2, 4)
    metrics = Metrics()
    metrics.serve(door.stats)
    exported = metrics.render().decode()
    assert f'mcad_http_connections_accepted_total{{server="{door.stats.name}"}} 2.0' in exported
    assert f'mcad_http_requests_total{{server="{door.stats.name}"}} 4.0' in exported


def test_no_free_worker_in_time_is_a_busy_answer_and_health_is_never_queued(
        door: FrontDoor, service: Service, clock: FakeClock) -> None:
    blocker = connect(door)
    blocker.sendall(request("/block"))
    wait_until(lambda: door.stats.in_flight == 1, 10, "the only worker to be taken")
    waiting = connect(door)
    waiting.sendall(request("/waits"))
    wait_until(lambda: door.workers.waiting == 1, 10, "the second request to wait for a worker")
    health = connect(door)
    health.sendall(request("/healthz", method="GET"))
    assert answer(health) == (200, b"ok\n"), "answered on the event loop while every worker is busy"
    clock.now += 5.1
    door.sweep()
    status, body = answer(waiting)
    assert status == 503 and b"every one of the 1 workers was busy for 5 s" in body
    assert door.stats.rejected == {"busy": 1}
    service.release.set()
    assert answer(blocker) == (200, b"/block 0")
    assert [path for path, _ in service.started] == ["/block"], "the refused request never ran"


def test_a_big_body_waits_in_the_socket_for_its_lane_and_small_ones_pass_it(
        door: FrontDoor, service: Service, clock: FakeClock) -> None:
    door.stop()  # this test needs two workers
    door = serve(service, clock, workers=2, big_body_bytes=1000, big_lane=1)
    try:
        first = connect(door)
        first.sendall(request("/block-big", b"x" * 5000))
        wait_until(lambda: door.big_lane.used == 1 and door.stats.in_flight == 1, 10, "the big lane to be taken")
        second = connect(door)
        second.sendall(request("/big", b"y" * 5000))
        wait_until(lambda: door.big_lane.waiting == 1, 10, "the second big body to wait for the lane")
        assert door.registry.phases().get("body") == 1
        small = connect(door)
        small.sendall(request("/small", b"z" * 10))
        assert answer(small) == (200, b"/small 10"), "a small body does not wait behind the big ones"
        assert ("/big", 5000) not in service.started
        service.release.set()
        assert answer(first) == (200, b"/block-big 5000")
        assert answer(second) == (200, b"/big 5000")
    finally:
        door.stop()


def test_a_body_over_the_bound_is_413_unread_and_a_bad_head_400(door: FrontDoor) -> None:
    sock = connect(door)
    sock.sendall(b"POST /x HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n")
    status, body = answer(sock)
    assert status == 413 and b"over the bound" in body
    assert closed(sock)
    sock = connect(door)
    sock.sendall(b"NONSENSE\r\n\r\n")
    assert answer(sock)[0] == 400
    assert door.stats.rejected == {"too_large": 1, "bad_request": 1}


def test_a_head_over_its_size_bound_is_431(service: Service, clock: FakeClock) -> None:
    door = serve(service, clock, max_header_bytes=1024)
    try:
        sock = connect(door)
        sock.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
        assert answer(sock)[0] == 431
    finally:
        door.stop()


def test_slots_go_in_turns_by_source_so_one_client_waits_behind_its_own_requests() -> None:
    clock = FakeClock()

    async def scenario() -> list[str]:
        slots = Slots(1, clock)
        served: list[str] = []
        await slots.acquire(None, "attacker")

        async def wait(name: str, source: str) -> None:
            await slots.acquire(None, source)
            served.append(name)
        waiters = [asyncio.ensure_future(wait(f"attacker-{i}", "10.0.0.9")) for i in range(3)]
        await asyncio.sleep(0)
        waiters.append(asyncio.ensure_future(wait("api-server", "10.0.0.1")))
        await asyncio.sleep(0)
        for _ in range(4):
            slots.release()
            await asyncio.sleep(0)
        await asyncio.gather(*waiters)
        return served

    assert asyncio.run(scenario()) == ["attacker-0", "api-server", "attacker-1", "attacker-2"]


def test_a_handler_that_raises_is_a_500_and_an_early_answer_to_a_request_with_a_body_closes(
        service: Service, clock: FakeClock) -> None:
    class Failing(Service):
        def handle(self, head: Head, body: bytes) -> Response:
            raise RuntimeError("a bug")
    door = serve(Failing(), clock)
    try:
        sock = connect(door)
        sock.sendall(request("/x"))
        status, body = answer(sock)
        assert status == 500 and b"RuntimeError" in body
        sock = connect(door)
        sock.sendall(request("/healthz", b"GET / HTTP/1.1\r\n\r\n", method="GET"))  # a body that looks like a request
        assert answer(sock) == (200, b"ok\n")
        assert closed(sock), "the unread body is not taken for another request"
    finally:
        door.stop()


def test_quick_answers_small_bodies_on_the_loop_hands_on_what_it_declines_and_a_raise_is_a_500(
        clock: FakeClock) -> None:
    class Quick(Service):
        def __init__(self) -> None:
            super().__init__()
            self.offered: list[str] = []

        def quick(self, head: Head, body: bytes) -> Response | None:
            self.offered.append(head.path)
            if head.path == "/boom":
                raise RuntimeError("a bug")
            return Response(200, b"quick") if head.path == "/q" else None
    service = Quick()
    door = serve(service, clock, workers=1, quick_body_bytes=10)
    try:
        sock = connect(door)
        sock.sendall(request("/block", b"x"))  # declined by quick: takes the only worker and holds it
        wait_until(lambda: door.stats.in_flight == 1, 10, "the only worker to be taken")
        other = connect(door)
        other.sendall(request("/q", b"small"))
        assert answer(other) == (200, b"quick"), "answered on the loop, the only worker being held"
        other.sendall(request("/boom", b"x"))
        status, body = answer(other)
        assert status == 500 and b"RuntimeError" in body
        service.release.set()
        assert answer(sock) == (200, b"/block 1")
        sock.sendall(request("/q", b"over ten bytes"))  # too big to be offered: handled by a worker
        assert answer(sock) == (200, b"/q 14")
        assert service.offered == ["/block", "/q", "/boom"]
    finally:
        service.release.set()
        door.stop()
