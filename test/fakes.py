"""Test doubles for the seams of mcad: a lister-watcher (client-go's FakeControllerSource) and a clock.

``FakeListerWatcher`` keeps objects with a resourceVersion counter and a history of events, so a watch from
resourceVersion N first replays what happened after N, as a real API server does. Tests can push events into
the open watch, drop it, make the next list/watch raise, send an in-stream ERROR (410 or another code), and
change objects silently ("*_silently": no event, only a relist reveals it; client-go's AddDropWatch).

``wait_informed(check)`` waits for what informers over these fakes did: it checks again each time a consumer of
a fake watch asks for its next event (an informer has handled the last one, handlers included), not on a timer.
``settle(fakes)`` waits until the informers reading ``fakes`` have handled every event sent so far: a test that
changed several resources need not guess which informer is last.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from mcad.k8s.kube import ApiError, GoneError

_END = object()
T = TypeVar("T")

# Counts the times a consumer of any fake watch asked for its next event: an informer does so only once it has
# handled the last one (store written, handlers run). wait_informed re-checks on each.
_handled = threading.Condition()
_handled_count = 0
# What wait_informed re-checks at least this often for: a check that also depends on something no fake watch
# delivers (it is not how the wait ends when it depends on a fake watch).
_RECHECK_SECONDS = 0.1


def _count_handled() -> None:
    global _handled_count
    with _handled:
        _handled_count += 1
        _handled.notify_all()


def settle(fakes: Iterable[Any], timeout: float = 5.0) -> None:
    """Wait until every ``FakeListerWatcher`` among ``fakes`` (other objects are skipped) has had every event it
    sent handled by the informer reading it; the deadline only bounds a hang."""
    watched = [fake for fake in fakes if isinstance(fake, FakeListerWatcher)]
    wait_informed(lambda: all(fake.handled_all() for fake in watched), timeout,
                  "the informers to handle every event sent to them")


def wait_informed(check: Callable[[], T | None], timeout: float = 5.0, what: str = "condition") -> T:
    """Return ``check()`` once it is truthy; it is called again each time an informer over a fake lister-watcher
    has handled an event (see the module docstring), so a test waits for an informer as long as it takes to handle
    the event, not a polling interval. The deadline only bounds a hang: a failure names ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        with _handled:
            seen = _handled_count
        value = check()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last value: {value!r})")
        with _handled:
            _handled.wait_for(lambda seen=seen: _handled_count != seen, min(left, _RECHECK_SECONDS))


def configmap(name: str, namespace: str | None = "default", **data: str) -> dict[str, Any]:
    """A minimal raw object; the fake assigns its resourceVersion."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(data)}


class FakeWatchStream:
    """One open watch: a queue of events fed by the fake; ``close()`` works from any thread."""

    def __init__(self, resource_version: str, timeout_seconds: int) -> None:
        self.resource_version = resource_version
        self.timeout_seconds = timeout_seconds
        self._cond = threading.Condition()
        self._items: deque[Any] = deque()
        self.closed = False
        self.ended = False
        self._waiting = False  # its consumer waits for the next event: it has handled every one before

    def handled_all(self) -> bool:
        """Open, nothing queued, and its consumer waits for more: every event sent has been handled."""
        with self._cond:
            return not self.closed and not self.ended and not self._items and self._waiting

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        _count_handled()  # the consumer is done with the last event
        with self._cond:
            while not self._items and not self.closed:
                self._waiting = True
                _count_handled()  # and now with every one: settle() may be waiting for that
                self._cond.wait()
            self._waiting = False
            if self.closed or self._items[0] is _END:
                self.ended = True
                raise StopIteration
            item: dict[str, Any] = self._items.popleft()
            return item

    def put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class FakeListerWatcher:
    """Objects, a resourceVersion counter, and the watch streams opened on them; thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rv = 100
        self._objects: dict[str, dict[str, Any]] = {}
        self._history: list[tuple[int, dict[str, Any]]] = []
        self._list_failures: deque[Exception] = deque()
        self._watch_failures: deque[Exception] = deque()
        self.lists = 0
        self.watches: list[FakeWatchStream] = []

    # -- the ListerWatcher protocol -------------------------------------------------------------------------

    def list(self, *, compact: Any = None) -> tuple[list[Any], str]:
        with self._cond:
            self.lists += 1
            self._cond.notify_all()
            if self._list_failures:
                raise self._list_failures.popleft()
            items = [copy.deepcopy(obj) for obj in self._objects.values()]
            return [compact(obj) for obj in items] if compact else items, str(self._rv)

    def watch(self, resource_version: str, timeout_seconds: int) -> FakeWatchStream:
        with self._cond:
            if self._watch_failures:
                failure = self._watch_failures.popleft()
                self._cond.notify_all()
                raise failure
            stream = FakeWatchStream(resource_version, timeout_seconds)
            since = int(resource_version or self._rv)
            for rv, event in self._history:
                if rv > since:
                    stream.put(copy.deepcopy(event))
            self.watches.append(stream)
            self._cond.notify_all()
            return stream

    # -- changes with events --------------------------------------------------------------------------------

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._change("ADDED", obj, emit=True)

    def modify(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._change("MODIFIED", obj, emit=True)

    def delete(self, key: str) -> dict[str, Any]:
        return self._change("DELETED", self._objects[key], emit=True)

    def bookmark(self) -> str:
        """Advance the resourceVersion and send a BOOKMARK carrying it to the open watch."""
        with self._cond:
            self._rv += 1
            event = {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1",
                                                    "metadata": {"resourceVersion": str(self._rv)}}}
            self._current().put(event)
            return str(self._rv)

    # -- changes without events: only a relist shows them ----------------------------------------------------

    def add_silently(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._change("ADDED", obj, emit=False)

    def modify_silently(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._change("MODIFIED", obj, emit=False)

    def delete_silently(self, key: str) -> dict[str, Any]:
        return self._change("DELETED", self._objects[key], emit=False)

    # -- faults ---------------------------------------------------------------------------------------------

    def drop_watch(self) -> None:
        """End the open stream as a dropped connection or a server timeout would."""
        self._current().put(_END)

    def send_error(self, code: int, reason: str = "Expired", message: str = "too old resource version") -> None:
        """An in-stream ERROR event (a Status); the stream ends after it, as the API server's does."""
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
                  "code": code}
        stream = self._current()
        stream.put({"type": "ERROR", "object": status})
        stream.put(_END)

    def fail_next_list(self, error: Exception | None = None) -> None:
        self._list_failures.append(error or ApiError(503, "ServiceUnavailable", "injected list failure"))

    def fail_next_watch(self, error: Exception | None = None) -> None:
        self._watch_failures.append(error or ApiError(503, "ServiceUnavailable", "injected watch failure"))

    def expire_next_watch(self) -> None:
        """The next watch request is refused with 410 Gone (the version asked for was compacted)."""
        self._watch_failures.append(GoneError(410, "Expired", "too old resource version"))

    # -- waiting (with deadlines) ---------------------------------------------------------------------------

    def wait_for_watches(self, count: int, timeout: float = 5.0) -> FakeWatchStream:
        """Block until ``count`` watches were opened; return the last one."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.watches) >= count, timeout):
                raise AssertionError(f"timed out waiting for watch #{count} (opened: {len(self.watches)})")
            return self.watches[-1]

    def wait_for_lists(self, count: int, timeout: float = 5.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.lists >= count, timeout):
                raise AssertionError(f"timed out waiting for list #{count} (lists: {self.lists})")

    def items(self) -> list[dict[str, Any]]:
        """A copy of every object stored."""
        with self._cond:
            return [copy.deepcopy(obj) for obj in self._objects.values()]

    def get(self, key: str) -> dict[str, Any] | None:
        """A copy of the object stored under ``namespace/name`` (or ``name``), as a GET would return it."""
        with self._cond:
            found = self._objects.get(key)
            return copy.deepcopy(found) if found is not None else None

    @property
    def resource_version(self) -> str:
        with self._cond:
            return str(self._rv)

    def handled_all(self) -> bool:
        """What an informer reading this fake was sent, it has handled: it watches, and waits on the latest watch
        for more (events sent before that watch opened were replayed into it). True if nothing ever listed it."""
        with self._cond:
            if not self.watches:
                return self.lists == 0
            latest = self.watches[-1]
        return latest.handled_all()

    # -- internals ------------------------------------------------------------------------------------------

    def _current(self) -> FakeWatchStream:
        with self._cond:
            if not self.watches:
                raise AssertionError("no watch has been opened")
            return self.watches[-1]

    def _change(self, etype: str, obj: dict[str, Any], *, emit: bool) -> dict[str, Any]:
        with self._cond:
            self._rv += 1
            stored = copy.deepcopy(obj)
            stored.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            metadata = stored["metadata"]
            key = f"{metadata['namespace']}/{metadata['name']}" if metadata.get("namespace") else metadata["name"]
            if etype == "DELETED":
                self._objects.pop(key, None)
            else:
                self._objects[key] = stored
            if emit:
                event = {"type": etype, "object": copy.deepcopy(stored)}
                self._history.append((self._rv, event))
                for stream in self.watches:
                    if not stream.closed and not stream.ended:
                        stream.put(copy.deepcopy(event))
            return copy.deepcopy(stored)


class FakeClock:
    """A clock that moves only when told (``advance``); satisfies ``mcad.clock.Clock``."""

    def __init__(self, start: float = 1000.0) -> None:
        self._lock = threading.Lock()
        self._monotonic = start
        self._now = datetime(2024, 1, 1, tzinfo=UTC)

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._monotonic += seconds
            self._now += timedelta(seconds=seconds)


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 as the API server applies it (add, remove, replace, test; paths of object keys and list indexes),
    enough to check the patch does what it means: a failed test raises, like the API server's 422."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "test":
            have = parent[int(last)] if isinstance(parent, list) else parent.get(last, KeyError)
            if have != op["value"]:
                raise ValueError(f"test failed at {op['path']}: {have!r} != {op['value']!r}")
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and last not in parent:
                raise ValueError(f"replace of a missing {op['path']}")
            parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[last]
    return doc
