"""The front door's bookkeeping (``mcad.serve.frontdoor``): which connections are open, and turns at its lanes and
workers. Pure over the clock it is given; ``Slots`` runs on the door's event loop.

Contract:
- ``Registry(cap, clock)`` holds the open connections of one port (``Conn``), each in a ``Phase`` with a deadline
  (``enter``). ``add`` admits one more; at the cap it names the connection to close for it: the longest-idle
  kept-alive one (a fresh one waiting for its first request counts as idle), else the oldest still handshaking or
  sending its head; when every connection has a request in the workers' hands, none (the new one is refused).
  ``expired()`` removes and returns those past their deadline; ``phases()`` counts them by phase.
- ``Slots(size, clock)``: ``size`` slots handed out in turns by source: ``acquire(deadline, source)`` waits for
  one, and each source waiting gets one slot per round, first come first served within a source (a client with
  many connections waits behind its own, not in front of everyone). ``expire()`` fails the waiters past their
  deadline with ``Busy``; a cancelled waiter leaves the line.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from enum import Enum


class Phase(Enum):
    HANDSHAKE = "handshake"
    IDLE = "idle"
    HEAD = "header"
    BODY = "body"
    WORK = "work"
    WRITE = "write"


class Conn:
    """One connection as the registry sees it: its phase, since when, until when, and how to close it."""

    _ids = itertools.count()

    def __init__(self, peer: str, abort: Callable[[], None]) -> None:
        self.id = next(self._ids)
        self.peer = peer
        self.abort = abort
        self.phase = Phase.HANDSHAKE
        self.since = 0.0
        self.deadline: float | None = None


class Registry:
    """The open connections of one port, their deadlines and who goes when the cap is reached; pure bookkeeping
    over ``clock`` (no I/O, no event loop)."""

    def __init__(self, cap: int, clock: Callable[[], float]) -> None:
        self.cap = cap
        self.clock = clock
        self._conns: dict[int, Conn] = {}
        # Evictable connections, oldest first: kept-alive idle ones, then those still handshaking or sending a head.
        self._idle: OrderedDict[int, Conn] = OrderedDict()
        self._early: OrderedDict[int, Conn] = OrderedDict()

    def __len__(self) -> int:
        return len(self._conns)

    def add(self, conn: Conn, timeout: float) -> tuple[bool, Conn | None]:
        """Register ``conn`` (in its handshake, for ``timeout``): (admitted, the connection to close for it)."""
        victim = None
        if len(self._conns) >= self.cap:
            victim = self._pick_victim()
            if victim is None:
                return False, None
            self.remove(victim)
        self._conns[conn.id] = conn
        self.enter(conn, Phase.HANDSHAKE, timeout)
        return True, victim

    def _pick_victim(self) -> Conn | None:
        for pool in (self._idle, self._early):
            if pool:
                return next(iter(pool.values()))
        return None

    def enter(self, conn: Conn, phase: Phase, timeout: float | None) -> None:
        now = self.clock()
        conn.phase, conn.since = phase, now
        conn.deadline = None if timeout is None else now + timeout
        self._idle.pop(conn.id, None)
        self._early.pop(conn.id, None)
        if phase is Phase.IDLE:
            self._idle[conn.id] = conn
        elif phase in (Phase.HANDSHAKE, Phase.HEAD):
            self._early[conn.id] = conn

    def remove(self, conn: Conn) -> None:
        self._conns.pop(conn.id, None)
        self._idle.pop(conn.id, None)
        self._early.pop(conn.id, None)

    def expired(self) -> list[Conn]:
        """The connections past their deadline (removed from the registry)."""
        now = self.clock()
        gone = [c for c in self._conns.values() if c.deadline is not None and c.deadline <= now]
        for conn in gone:
            self.remove(conn)
        return gone

    def phases(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for conn in self._conns.values():
            counts[conn.phase.value] = counts.get(conn.phase.value, 0) + 1
        return counts


class Busy(Exception):
    pass


class Slots:
    """``size`` slots handed out on one event loop, in turns by source: ``acquire(deadline, source)`` waits for
    one, and each source waiting gets one slot per round, first come first served within a source (a client with
    many connections waits behind its own, not in front of everyone). ``expire()`` fails the waiters past their
    deadline with ``Busy``; a cancelled waiter leaves the line."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        self.size = size
        self.clock = clock
        self.used = 0
        self._lines: OrderedDict[str, deque[tuple[asyncio.Future[None], float | None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(1 for line in self._lines.values() for future, _ in line if not future.done())

    async def acquire(self, deadline: float | None = None, source: str = "") -> None:
        if self.used < self.size and not self.waiting:
            self.used += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lines.setdefault(source, deque()).append((future, deadline))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release()  # it was handed the slot as it was cancelled: pass it on
            raise

    def release(self) -> None:
        while self._lines:
            source, line = next(iter(self._lines.items()))
            while line and line[0][0].done():
                line.popleft()
            if not line:
                del self._lines[source]
                continue
            future, _ = line.popleft()
            if line:
                self._lines.move_to_end(source)  # its next waiter comes after every other source's
            else:
                del self._lines[source]
            future.set_result(None)  # the slot passes on, used stays
            return
        self.used -= 1

    def expire(self) -> int:
        now = self.clock()
        expired = 0
        for source in list(self._lines):
            line = self._lines[source]
            for future, deadline in line:
                if deadline is not None and deadline <= now and not future.done():
                    future.set_exception(Busy())
                    expired += 1
            kept = deque(w for w in line if not w[0].done())
            if kept:
                self._lines[source] = kept
            else:
                del self._lines[source]
        return expired
