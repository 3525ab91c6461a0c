"""A shared informer: client-go's reflector (list, then watch, own reconnects) plus a thread-safe store.

Contract (client-go ``tools/cache`` semantics; see model-codebases.md rules I1-I10):
- ``run`` lists, replaces the store, then watches from the list's resourceVersion with bookmarks and a random
  timeout from ``watch_timeout``. Every event moves the resourceVersion forward; a BOOKMARK does only that and
  never reaches handlers.
- A stream that ends (server timeout, dropped connection) is re-watched from the last resourceVersion, without a
  relist. 410 Gone (``GoneError`` on connect, or an in-stream ERROR event with code 410) means relist.
- A relist replaces the store: new keys are ADDED, keys whose ``metadata.resourceVersion`` changed are MODIFIED,
  keys that vanished are DELETED with the last known object (the tombstone); unchanged keys emit nothing.
- Other failures (``ApiError``, an in-stream ERROR with another code, a stream that ends at once with no event)
  back off with jitter, exponentially from ``backoff[0]`` to ``backoff[1]``, reset after two healthy minutes;
  ``stop()`` ends the wait at once, and so does ``retry_now()`` (the caller knows the server is back, or its
  credentials were replaced). After a failed list it relists; after a failed watch it re-watches from the last
  resourceVersion (a stale one then earns a 410 and a relist). The default cap is 4 s, not client-go's 30 s: a
  controller has a handful of informers, and after an outage each one otherwise comes back on its own schedule
  (up to 30 s late), and nothing is dispatched until they are back.
- Informers of one API server share a ``Reconnects`` group: the first of them to get an answer again after
  failing (a list, or a watch that connects) wakes the others whose last request failed, whether they wait in
  their backoff already or are on their way to it, so they reconnect together, and tells the group's listeners
  (the dispatcher retries what failed because the server was away).
- The store is written before any handler runs; handlers run in the informer thread, in event order, as
  ``handler(type, old, new)`` (ADDED: old None; DELETED: new None). A handler that raises is logged and the
  informer goes on. ``has_synced()`` turns true once the first list has been applied and its handlers ran;
  ``on_synced`` listeners then run once, in the informer thread (a waiter need not poll ``has_synced``).
- The store holds ``transform(raw)`` (keep only what callers need: memory at scale); reads are thread-safe and
  return the stored values, which callers must treat as read-only. An object the transform rejects (raises) is
  logged and treated as absent. ``reuse(stored, raw)``, when given, may build the new value from the one stored
  under the same key (say, only its status changed, and parsing the rest is costly) and return it, or None to
  fall back to ``transform``.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Literal, Protocol, TypeVar

import structlog

from mcad.clock import Clock, RealClock
from mcad.errors import ApiError, GoneError, error_from_status

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
Handler = Callable[[EventType, T | None, T | None], None]

_log = structlog.get_logger("mcad.k8s.informer")

# A watch that ends sooner than this (or than half its timeout) without a single event counts as a failure
# (backoff), as client-go's "very short watch": a server or proxy that closes every stream at once must not be
# hammered in a loop.
SHORT_WATCH_SECONDS = 1.0
# Backoff returns to backoff[0] after this long without a failure (client-go's reflector: 2 minutes).
BACKOFF_RESET_SECONDS = 120.0


class ListerWatcher(Protocol):
    """Where an informer reads from: ``mcad.k8s.kube.ResourceClient``, or a fake in tests.

    ``watch`` returns an iterator of raw events; if it also has a ``close()`` that is safe to call from another
    thread while a ``next()`` blocks, ``Informer.stop()`` uses it to end the current watch at once.
    """

    def list(self, *, compact: Callable[[dict[str, Any]], Any] | None = None) -> tuple[list[Any], str]:
        """All objects and the list's resourceVersion; ``compact`` (if given) maps each object as it arrives."""
        ...

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]: ...


def identity(obj: dict[str, Any]) -> Any:
    return obj


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object (client-go's MetaNamespaceKeyFunc)."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = str(metadata.get("name", ""))
    # Interned: a view that makes the same key from the object (AppWrapperView.key) then shares this string.
    return sys.intern(f"{namespace}/{name}") if namespace else name


def _resource_version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class _ShortWatchError(Exception):
    """The watch ended at once without an event."""


class _Backoff:
    """Exponential delay with "equal jitter": a wait in [d/2, d], d doubling from ``initial`` up to ``cap``."""

    def __init__(self, initial: float, cap: float, clock: Clock, rng: random.Random) -> None:
        self._initial = initial
        self._cap = cap
        self._clock = clock
        self._rng = rng
        self._failures = 0
        self._last_failure: float | None = None

    def next_delay(self) -> float:
        now = self._clock.monotonic()
        if self._last_failure is not None and now - self._last_failure >= BACKOFF_RESET_SECONDS:
            self._failures = 0
        self._last_failure = now
        delay = min(self._cap, self._initial * 2.0 ** min(self._failures, 32))
        self._failures += 1
        return delay / 2 + self._rng.random() * delay / 2


class Reconnects:
    """The informers of one API server, and who wants to know when it answers again (see the module docstring).
    Thread-safe: informers report from their own threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: list[Informer[Any]] = []
        self._listeners: list[Callable[[], None]] = []

    def join(self, informer: Informer[Any]) -> None:
        with self._lock:
            self._members.append(informer)

    def on_recovered(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs (in the informer's thread; it must only hand work on) each time the server is back."""
        with self._lock:
            self._listeners.append(listener)

    def recovered(self, origin: Informer[Any]) -> None:
        with self._lock:
            members, listeners = list(self._members), list(self._listeners)
        # Every peer whose last request failed, not only those already in their backoff wait: one whose list has
        # just failed and that is on its way to the wait would miss the wake and sit out its whole backoff;
        # retry_now makes that next wait return at once. A healthy peer is left alone.
        failing = [m for m in members if m is not origin and m.failing]
        for member in failing:
            member.retry_now()
        woken = [m.name for m in failing]
        _log.info("api server answers again", informer=origin.name, woken=woken)
        for listener in listeners:
            try:
                listener()
            except Exception:
                _log.exception("reconnect listener failed", informer=origin.name)


class Store(Protocol[T_co]):
    """What readers of an informer use: its store and its events (an ``Informer``, or several merged)."""

    def get(self, key: str) -> T_co | None: ...
    def keys(self) -> list[str]: ...
    def list(self) -> Sequence[T_co]: ...
    def __len__(self) -> int: ...
    def has_synced(self) -> bool: ...
    def add_handler(self, handler: Handler[Any]) -> None: ...


class Informer(Generic[T]):
    """List/watch one resource type into a store of ``T`` (by default the raw dicts), and notify handlers."""

    def __init__(
        self,
        name: str,
        lister_watcher: ListerWatcher,
        *,
        transform: Callable[[dict[str, Any]], T] = identity,
        key: Callable[[dict[str, Any]], str] = object_key,
        watch_timeout: tuple[int, int] = (300, 600),
        backoff: tuple[float, float] = (0.8, 4.0),
        clock: Clock | None = None,
        rng: random.Random | None = None,
        peers: Reconnects | None = None,
        reuse: Callable[[T, dict[str, Any]], T | None] | None = None,
    ) -> None:
        self.name = name
        self._lw = lister_watcher
        self._transform = transform
        self._reuse = reuse
        self._key = key
        self._watch_timeout = watch_timeout
        self._clock = clock if clock is not None else RealClock()
        self._rng = rng or random.Random()
        self._backoff = _Backoff(backoff[0], backoff[1], self._clock, self._rng)
        self._handlers: list[Handler[T]] = []
        self._synced_listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        # key -> (raw metadata.resourceVersion, transformed object); replaced whole on relist
        self._store: dict[str, tuple[str, T]] = {}
        self._resource_version = ""
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()  # ends a backoff wait early: set by stop() and retry_now()
        self._stream: Iterator[dict[str, Any]] | None = None
        self._thread: threading.Thread | None = None
        self._lists = 0
        self.relists = 0
        """Lists after the first one (410s, failed lists): a metric."""
        self._peers = peers
        self._failing = False  # the last list or watch request failed
        self.backing_off = False
        """It waits out a backoff now (read by its ``Reconnects`` group from other threads)."""
        if peers is not None:
            peers.join(self)

    # -- lifecycle ------------------------------------------------------------------------------------------

    def add_handler(self, handler: Handler[T]) -> None:
        if self._thread is not None:
            raise RuntimeError("add handlers before the informer starts")
        self._handlers.append(handler)

    def on_synced(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` once, in the informer thread, right after ``has_synced()`` first turns true."""
        if self._thread is not None:
            raise RuntimeError("add sync listeners before the informer starts")
        self._synced_listeners.append(listener)

    def start(self) -> threading.Thread:
        """Run ``run()`` in a daemon thread named after the informer."""
        if self._thread is not None:
            raise RuntimeError("informer already started")
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name=f"informer-{self.name}",
                                        daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """Set the stop event and close the current watch, so the informer thread returns promptly.

        A list in flight is not interrupted; it ends by its own request timeout.
        """
        self._stop.set()
        self._wake.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            _close(stream)

    @property
    def failing(self) -> bool:
        """Its last list or watch request failed, and none has been answered since."""
        return self._failing

    def retry_now(self) -> None:
        """End the current backoff wait, if any, so the next list or watch goes out now. A call while nothing
        waits only spares the next failure its wait."""
        self._wake.set()

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def resource_version(self) -> str:
        """The last resourceVersion seen (from a list, an event or a bookmark)."""
        return self._resource_version

    # -- store reads (any thread) ---------------------------------------------------------------------------

    def get(self, key: str) -> T | None:
        with self._lock:
            entry = self._store.get(key)
        return entry[1] if entry is not None else None

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._store)

    def list(self) -> list[T]:  # defined after keys(): inside the class, `list` now names this method
        with self._lock:
            return [entry[1] for entry in self._store.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    # -- the reflector loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event, wake: threading.Event | None = None) -> None:
        """List and watch until ``stop`` is set (blocking); end it through ``stop()``, which also cuts a backoff
        wait short. ``wake`` is the event backoff waits on (default: the informer's own, which ``stop()`` and
        ``retry_now()`` set); tests pass one that records the delays."""
        self._stop = stop
        if wake is not None:
            self._wake = wake
        need_list = True
        _log.info("informer started", informer=self.name)
        while not stop.is_set():
            try:
                if need_list:
                    self._list_and_replace()
                    need_list = False
                self._watch(stop)
            except GoneError as err:
                if need_list:  # the list itself expired (its continue token, twice): do not spin
                    self._wait_backoff(stop, "list", err)
                    continue
                _log.info("informer relisting", informer=self.name, resource_version=self._resource_version,
                          reason=err.reason or "Gone", error=err.message)
                need_list = True
            except (ApiError, _ShortWatchError) as err:
                self._wait_backoff(stop, "list" if need_list else "watch", err)
            except Exception as err:
                # A bug, or an object the code did not expect: never let it kill the thread; start over.
                _log.exception("informer loop failed", informer=self.name, reason=type(err).__name__)
                need_list = True
                self._wait_backoff(stop, "unexpected", err)
        _log.info("informer stopped", informer=self.name, resource_version=self._resource_version)

    def _wait_backoff(self, stop: threading.Event, phase: str, err: Exception) -> None:
        self._failing = True
        delay = self._backoff.next_delay()
        _log.warning("informer backing off", informer=self.name, phase=phase, delay_s=round(delay, 3),
                     resource_version=self._resource_version,
                     status=getattr(err, "status", None), reason=getattr(err, "reason", type(err).__name__),
                     error=str(err))
        self.backing_off = True
        try:
            if not stop.is_set() and self._wake.wait(delay):
                self._wake.clear()
        finally:
            self.backing_off = False

    def _answered(self) -> None:
        """A list or watch request got an answer: if the last one had failed, the server is back."""
        if self._failing:
            self._failing = False
            if self._peers is not None:
                self._peers.recovered(self)

    def list_once(self) -> None:
        """List and fill the store, without watching: a one-time snapshot (``mcad.cli.offline``)."""
        self._list_and_replace()

    def _list_and_replace(self) -> None:
        with self._lock:
            old_store = self._store

        def compact(raw: dict[str, Any]) -> tuple[str, tuple[str, T] | None]:
            # Runs as each page arrives, so raw objects are dropped page by page (peak memory at scale).
            key = self._key(raw)
            rv = _resource_version(raw)
            previous = old_store.get(key)
            if previous is not None and previous[0] == rv and rv:
                return key, previous  # unchanged: keep the transformed object, skip the transform
            transformed = self._safe_transform(key, raw, previous[1] if previous is not None else None)
            return key, None if transformed is None else (rv, transformed[0])

        items, resource_version = self._lw.list(compact=compact)
        self._answered()
        if self._lists:
            self.relists += 1
        self._lists += 1
        new_store: dict[str, tuple[str, T]] = {key: entry for key, entry in items if entry is not None}
        with self._lock:
            self._store = new_store
            self._resource_version = resource_version
        changes = 0
        for key, (_, obj) in new_store.items():
            previous = old_store.get(key)
            if previous is None:
                self._notify("ADDED", key, None, obj)
                changes += 1
            elif previous[1] is not obj:
                self._notify("MODIFIED", key, previous[1], obj)
                changes += 1
        for key, (_, obj) in old_store.items():
            if key not in new_store:
                self._notify("DELETED", key, obj, None)  # tombstone: the last object we knew
                changes += 1
        _log.info("informer listed", informer=self.name, resource_version=resource_version, items=len(new_store),
                  changes=changes, relist=self._lists > 1)
        if self._synced.is_set():
            return
        self._synced.set()
        for listener in self._synced_listeners:
            try:
                listener()
            except Exception:  # a listener's bug must not stop the informer, as for handlers
                _log.exception("informer sync listener failed", informer=self.name)

    def _watch(self, stop: threading.Event) -> None:
        timeout = self._rng.randint(*self._watch_timeout)
        stream = self._lw.watch(self._resource_version, timeout)
        self._answered()
        with self._lock:
            self._stream = stream
        started = self._clock.monotonic()
        events = 0
        try:
            if stop.is_set():  # stop() ran before the stream was published; it could not close it
                return
            _log.debug("informer watching", informer=self.name, resource_version=self._resource_version,
                       timeout_s=timeout)
            for event in stream:
                if stop.is_set():
                    return
                events += 1
                self._apply(event)
        finally:
            with self._lock:
                self._stream = None
            _close(stream)
        if stop.is_set():
            return
        if events == 0 and self._clock.monotonic() - started < min(SHORT_WATCH_SECONDS, timeout / 2):
            raise _ShortWatchError("the watch ended at once without an event")
        _log.debug("informer watch ended", informer=self.name, resource_version=self._resource_version,
                   events=events)

    def _apply(self, event: dict[str, Any]) -> None:
        etype = event.get("type")
        raw = event.get("object")
        if not isinstance(raw, dict):
            raise ApiError(0, "BadEvent", f"watch event {etype!r} without an object")
        if etype == "ERROR":
            raise error_from_status(raw)
        rv = _resource_version(raw)
        if etype == "BOOKMARK":
            self._resource_version = rv or self._resource_version
            return
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            _log.warning("informer ignored event", informer=self.name, reason="unknown type", type=str(etype))
            return
        key = self._key(raw)
        with self._lock:
            stored = self._store.get(key)  # only this thread writes the store: still current below
        transformed = self._safe_transform(key, raw, stored[1] if stored is not None else None)
        with self._lock:
            previous = self._store.get(key)
            if etype == "DELETED" or transformed is None:
                self._store.pop(key, None)
            else:
                self._store[key] = (rv, transformed[0])
            if rv:
                self._resource_version = rv
        if etype == "DELETED" or transformed is None:
            if previous is not None:
                # The final state from the event is the newest we know; fall back to the stored one.
                self._notify("DELETED", key, transformed[0] if transformed is not None else previous[1], None)
        elif previous is None:
            self._notify("ADDED", key, None, transformed[0])
        else:
            self._notify("MODIFIED", key, previous[1], transformed[0])

    def _safe_transform(self, key: str, raw: dict[str, Any], stored: T | None = None) -> tuple[T] | None:
        """``(reuse(stored, raw) or transform(raw),)``, or None (logged) when they raise: the object counts as
        absent."""
        try:
            if self._reuse is not None and stored is not None:
                reused = self._reuse(stored, raw)
                if reused is not None:
                    return (reused,)
            return (self._transform(raw),)
        except Exception as err:
            _log.error("informer transform failed", informer=self.name, key=key, reason=type(err).__name__,
                       error=str(err))
            return None

    def _notify(self, etype: EventType, key: str, old: T | None, new: T | None) -> None:
        for handler in self._handlers:
            try:
                handler(etype, old, new)
            except Exception as err:
                _log.exception("informer handler failed", informer=self.name, key=key, type=etype,
                               reason=type(err).__name__)


def _close(stream: Iterator[dict[str, Any]]) -> None:
    close = getattr(stream, "close", None)
    if close is None:
        return
    # ValueError: a generator closed from another thread while it runs; it ends at its next event.
    with contextlib.suppress(ValueError):
        close()
