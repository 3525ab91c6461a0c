"""The /debug documents, built on the dispatcher thread at a bounded rate and shared by every reader.

Contract:
- ``Snapshots.read(parts, timeout)`` returns a ``Snapshot`` holding at least ``parts`` (the documents "queue",
  "ledger", "quota", "clusters", and ``("explain", namespace, name)`` for single AppWrappers), built on the
  dispatcher thread after the call began: a reader never sees a state older than its request, and never touches
  dispatcher state itself.
- Builds are made by one publisher thread, which asks the dispatcher loop (``Dispatcher.call``, run between two
  keys, never inside a cycle) for one snapshot holding the union of the parts wanted so far; readers that ask while
  it is built wait for the next one. Two builds start on the loop at least ``interval`` seconds apart, and at
  least ten times the last build's cost (its time on the loop, then formatting and encoding, and what its readers
  spent formatting its deferred documents), so however many clients poll, they cost the loop at most one build
  per interval and the process a tenth of its time. The spacing counts from when the loop began the last build,
  not from when it was asked for: a build the loop ran late does not let the next one follow it closely. The loop
  only reads state. The queue document (the large one) is deferred (``Deferred``, ``mcad.serve.queuereport``):
  each reader formats only what it asks for (a dashboard page its rows); the whole document is formatted and
  encoded once, off the loop: by the first reader of /debug/queue that asks for it, and, while the last snapshot's
  whole document was read, by the publisher before the next one is published (so the spacing readers see does not
  jump once one of them formats it).
- ``read(parts, timeout, fresh_within=s)`` (the dashboard's pollers) takes the latest snapshot holding ``parts`` at
  once if it was built at most ``s`` seconds plus the current spacing between builds before the call (no newer one
  could be had sooner), and asks for the next one meanwhile: a page that polls never waits on the loop, and sees
  a state at most that old (1 s with a small queue; with 10,000 queued, builds are seconds apart).
- A one-shot reader whose ``timeout`` is shorter than the current spacing between builds (a queue of 100,000:
  builds seconds apart, and ten times that between them) is served as a poller with ``fresh_within=0``: the latest
  snapshot if built within the spacing, else the next; waiting for a build after its request could only end in
  ``Busy``.
- A reader waits at most ``timeout``; then ``Busy`` (the HTTP layer answers 503 "busy, retry"). So does a reader
  whose explain would push the wanted set over ``max_explains`` names (a client asking for thousands of names
  makes no build larger than that).
- Every snapshot also carries ``namespaces``: the namespaces that hold any AppWrapper the controller knows
  (what the access checks of /debug/queue consider), read from the informer's store by the publisher right after
  the build, off the loop.
- Time (spacing, freshness, a reader's timeout, a build's cost) is read from ``clock`` (``mcad.clock``;
  ``RealClock`` unless one is handed in), and every wait ends by that clock: the publisher's pause and a reader's
  wait sleep on a condition, and ``wake()`` has them look at the clock again. A test that steps its own clock
  calls ``wake()`` after each step; with the real clock nothing needs to.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog

from mcad.clock import Clock, RealClock
from mcad.serve.debug import Reports

log = structlog.get_logger("mcad.serve.snapshots")

Part = str | tuple[str, str, str]
DOCUMENTS = ("queue", "ledger", "quota", "clusters")
# A poller sees a state at most this old (plus one build); a one-shot reader usually none older than its request.
DEFAULT_INTERVAL_SECONDS = 0.5
MAX_EXPLAINS = 256
# Builds are spaced by at least this many times the last one's cost (on the loop, then formatting and encoding):
# readers take at most a tenth of the process's time.
LOOP_SHARE_FACTOR = 10.0
# How long the publisher waits for the dispatcher to run a build (a long cycle, or a loop that does not run yet).
BUILD_TIMEOUT_SECONDS = 60.0


class Busy(Exception):
    """No snapshot could be had in time; the reader should retry."""


@runtime_checkable
class Deferred(Protocol):
    """A document read on the loop and formatted elsewhere (``mcad.serve.queuereport.QueueReport``): ``document()``
    formats the whole of it on its first call and keeps it."""

    def document(self) -> Any: ...


@dataclass(frozen=True)
class Snapshot:
    built_at: float  # the clock's monotonic() when the dispatcher began building it
    documents: dict[Part, Any] = field(default_factory=dict)  # explain parts map to None for an unknown AppWrapper
    namespaces: frozenset[str] = frozenset()
    build_seconds: float = 0.0  # how long the dispatcher thread spent building it
    _encoded: dict[Part, bytes] = field(default_factory=dict, compare=False, repr=False)
    _encoding: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    _later: list[float] = field(default_factory=lambda: [0.0], compare=False, repr=False)  # readers' formatting
    _asked_whole: set[Part] = field(default_factory=set, compare=False, repr=False)  # deferred parts readers encoded
    monotonic: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)  # the Snapshots' clock

    def __contains__(self, part: Part) -> bool:
        return part in self.documents

    def document(self, part: Part) -> Any:
        """The JSON-ready document (a deferred one formatted now, once)."""
        document = self.documents[part]
        return document.document() if isinstance(document, Deferred) else document

    def encoded(self, part: Part) -> bytes:
        """The document as JSON, encoded once for every reader of this snapshot: 16 pollers of a queue of
        thousands would otherwise each encode the same half megabyte, holding the interpreter lock the dispatcher
        thread needs. A deferred one not formatted yet is formatted and encoded now, and that time counts in
        ``later_seconds``."""
        deferred = isinstance(self.documents[part], Deferred)
        if deferred:
            self._asked_whole.add(part)
        return self._encode(part, by_reader=deferred)

    def later_seconds(self) -> float:
        """What readers spent formatting and encoding its deferred documents, so far."""
        return self._later[0]

    def wanted_whole(self, part: Part) -> bool:
        """Whether a reader asked for the whole of this deferred part (a reader of /debug/queue)."""
        return part in self._asked_whole

    def _encode(self, part: Part, *, by_reader: bool = False) -> bytes:
        with self._encoding:
            data = self._encoded.get(part)
            if data is None:
                started = self.monotonic()
                data = self._encoded[part] = encode(self.document(part))
                if by_reader:
                    self._later[0] += self.monotonic() - started
            return data


# A list longer than this in a document's top level is encoded this many items at a time.
ENCODE_CHUNK = 1000


def encode(document: Any) -> bytes:
    """Compact JSON (the C encoder: one with indent is pure Python, several times slower), newline-terminated.
    The C encoder holds the interpreter lock for the whole of one call (0.3-0.5 s for the 38 MB queue document at
    100,000 queued, the dispatcher thread standing still meanwhile): the long lists at a dict document's top level
    are encoded ``ENCODE_CHUNK`` items per call, which gives the lock back between calls. Same bytes either way."""
    if not isinstance(document, dict) or not any(isinstance(value, list) and len(value) > ENCODE_CHUNK
                                                 for value in document.values()):
        return json.dumps(document, separators=(",", ":")).encode() + b"\n"
    parts = []
    for key, value in document.items():
        name = json.dumps(key if isinstance(key, str) else str(key))
        if isinstance(value, list) and len(value) > ENCODE_CHUNK:
            items = ",".join(json.dumps(value[i:i + ENCODE_CHUNK], separators=(",", ":"))[1:-1]
                             for i in range(0, len(value), ENCODE_CHUNK))
            parts.append(f"{name}:[{items}]")
        else:
            parts.append(f"{name}:{json.dumps(value, separators=(',', ':'))}")
    return ("{" + ",".join(parts) + "}").encode() + b"\n"


class Snapshots:
    def __init__(self, call: Callable[[Callable[[], Snapshot], float], Snapshot], reports: Reports,
                 all_namespaces: Callable[[], Iterable[str]], *, interval: float = DEFAULT_INTERVAL_SECONDS,
                 max_explains: int = MAX_EXPLAINS, clock: Clock | None = None) -> None:
        """``call`` runs a function on the dispatcher thread (``Dispatcher.call``); ``reports`` read dispatcher
        state, so they run only inside it. ``all_namespaces`` reads the informer's store (thread-safe): it runs on
        the publisher's thread, off the loop (a set over 100,000 keys)."""
        self._call = call
        self._clock: Clock = clock if clock is not None else RealClock()
        self._reports = reports
        self._all_namespaces = all_namespaces
        self.interval = interval
        self.max_explains = max_explains
        self._cond = threading.Condition()
        self._wanted: set[Part] = set()
        self._latest: Snapshot | None = None
        self._thread: threading.Thread | None = None
        self.builds = 0  # for tests and metrics of the benchmark
        self._cost = 0.0  # the last build's, on the loop and then by the publisher

    def read(self, parts: Iterable[Part], timeout: float, *, fresh_within: float | None = None) -> Snapshot:
        parts = set(parts)
        asked = self._clock.monotonic()
        deadline = asked + timeout
        with self._cond:
            explains = {p for p in self._wanted | parts if isinstance(p, tuple)}
            if len(explains) > self.max_explains:
                raise Busy(f"more than {self.max_explains} AppWrappers are being explained at once")
            self._wanted |= parts
            self._ensure_thread()
            self._cond.notify_all()
            seen = self._latest
            if fresh_within is None and self.spacing > timeout:
                # Builds are spaced further apart than this reader may wait (a queue of 100,000): the latest
                # snapshot within the spacing is the freshest it could get, where waiting would end in Busy.
                fresh_within = 0.0
            if (fresh_within is not None and seen is not None and parts.issubset(seen.documents)
                    and asked - seen.built_at <= fresh_within + self.spacing):
                return seen
            while True:
                latest = self._latest
                if latest is not seen:
                    # A poller takes the next one whenever it was built: it is the freshest there is.
                    if (latest is not None and parts.issubset(latest.documents)
                            and (latest.built_at >= asked or fresh_within is not None)):
                        return latest
                    # A build that took the wanted set before this reader added to it, or one that failed
                    # (the publisher put its set back): still wanted.
                    self._wanted |= parts
                    seen = latest
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    raise Busy("the controller is busy; retry")
                self._cond.wait(left)

    def wake(self) -> None:
        """Have the publisher and every reader look at the clock again (after a test stepped its clock)."""
        with self._cond:
            self._cond.notify_all()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._publish, name="debug-snapshots", daemon=True)
            self._thread.start()

    def _publish(self) -> None:
        last_start = float("-inf")
        while True:
            with self._cond:
                while not self._wanted:
                    self._cond.wait()
                # At most one build per interval, however many readers wait: they all share the next one. A build
                # that took long (a queue of many thousands) spaces the next ones out, so that readers never take
                # more than a tenth of the loop's time. A wait on the condition, not a sleep: wake() ends it when a
                # test steps the clock (readers' notifications only make it look at the clock again).
                while (pause := last_start + self.spacing - self._clock.monotonic()) > 0:
                    self._cond.wait(pause)
                wanted, self._wanted = set(self._wanted), set()
            asked = last_start = self._clock.monotonic()
            try:
                snapshot = self._call(functools.partial(self._build, wanted), BUILD_TIMEOUT_SECONDS)
            except Exception as err:  # a timeout or a bug in a report: the readers time out; try again later
                log.warning("debug snapshot failed", reason=type(err).__name__, error=str(err))
                with self._cond:
                    self._wanted |= wanted
                continue
            # Formatting and encoding here, once for every reader: still this process's time (and its interpreter
            # lock, which the loop needs), so it counts in the spacing below.
            finishing = self._clock.monotonic()
            snapshot = dataclasses.replace(snapshot, namespaces=frozenset(self._all_namespaces()))
            last = self._latest
            for part, document in snapshot.documents.items():
                if isinstance(document, Deferred):
                    # Formatted and encoded here only while readers read the whole of it (a /debug/queue reader
                    # polls): else each reader formats only what it asks for (a dashboard page).
                    if last is not None and last.wanted_whole(part):
                        snapshot._encode(part)
                    continue
                if callable(document):
                    snapshot.documents[part] = document()
                if snapshot.documents[part] is not None:
                    snapshot._encode(part)
            finished_in = self._clock.monotonic() - finishing
            with self._cond:
                self._cost = snapshot.build_seconds + finished_in  # with its snapshot: readers see both at once
                self._latest = snapshot
                self.builds += 1
                self._cond.notify_all()
            spacing = self.spacing
            # The next build is spaced from when the loop began this one (at or after it was asked for).
            last_start = max(asked, snapshot.built_at)
            log.debug("debug snapshot built", parts=len(wanted), waited=round(snapshot.built_at - asked, 4),
                      seconds=round(snapshot.build_seconds, 4), formatted=round(finished_in, 4),
                      next_in=round(spacing, 3))

    @property
    def spacing(self) -> float:
        """How long after the last build's start the next may start: the interval, or ten times what the last build
        cost, the work its readers did formatting its deferred documents included (a 38 MB /debug/queue read as
        often as builds allowed would otherwise take the process's time). Read afresh by the publisher and by
        readers alike: the readers' share grows after the build is published."""
        latest = self._latest
        later = latest.later_seconds() if latest is not None else 0.0
        return max(self.interval, LOOP_SHARE_FACTOR * (self._cost + later))

    def _build(self, wanted: set[Part]) -> Snapshot:
        """On the dispatcher thread: every wanted document, the queue assessed once for all of them."""
        started = self._clock.monotonic()
        documents: dict[Part, Any] = {}
        with self._reports.shared_assessments():
            for part in sorted(wanted, key=repr):
                if isinstance(part, tuple):
                    _, namespace, name = part
                    documents[part] = self._reports.explain(namespace, name)
                elif part == "queue":
                    documents[part] = self._reports.queue_deferred()  # formatted as far as each reader asks
                elif part == "ledger":
                    documents[part] = self._reports.ledger()
                elif part == "quota":
                    documents[part] = self._reports.quota()
                elif part == "clusters":
                    documents[part] = self._reports.clusters()
        return Snapshot(started, documents, frozenset(), self._clock.monotonic() - started,
                        monotonic=self._clock.monotonic)
