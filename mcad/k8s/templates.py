"""The templates (GenericItems) of AppWrappers the informer saw lately, so that a dispatch need not GET its
AppWrapper to read them: a cache bounded in bytes and in entries.

Contract:
- ``keep(key, uid, generation, raw)`` (the informer thread, as it judges a spec it had not seen): remember
  ``raw``'s GenericItems, as compact JSON, with its uid and generation, under ``key`` (``object_key``: its
  apiVersion, namespace and name). Any entry of that key is dropped first, so a new generation (or a namesake with
  a new uid) never leaves the old one's items behind. Items of more than ``max_item_bytes`` of JSON are not kept,
  nor are any when the cache is full, unless the entry kept longest has been there ``stale_after`` seconds or
  more: it makes room (an AppWrapper queued that long pays a GET when it is dispatched, as every one did before).
  Keeping the oldest rather than the newest matches the order a queue is served in.
- ``take(key)`` (a write thread, as a dispatch starts): the uid, generation and items of the entry, the items
  parsed afresh (the caller may change them), and the entry is dropped; None when there is none. The API server
  bumps ``generation`` on every change of an AppWrapper's spec, so the items of one uid and generation are the ones
  a read of that generation returns.
- ``forget(key, uid)``: the AppWrapper of that uid is gone, or its spec is one not to keep (an entry of another
  uid under that key stays).
- ``TemplatesFirst(writer, templates)`` is ``writer`` (a ``mcad.k8s.dispatchjob.Writer``) whose dispatch read,
  the read of an AppWrapper at ``not_older_than`` a resourceVersion, is answered from ``templates`` when they hold
  that AppWrapper: the object with its uid, generation and GenericItems, which is all a dispatch reads of it
  (``mcad.k8s.dispatchjob`` compares the uid and generation with the ones it decided about, as it does with an
  object read from the API server). That answer has no resourceVersion, which every answer of the API server
  carries: so a dispatch tells a read that made no request, and takes no write-pool step for it. Every other call
  goes to ``writer``. The informer drops an entry when it sees its AppWrapper deleted or with another spec, so a
  dispatch that starts after that reads it, and finds it gone or stale, as it would without the cache; the API
  server answers such a read from its watch cache, which is no fresher than the informer.
- Bounds: at most ``max_entries`` entries and ``max_bytes`` bytes in all, each entry counted as its JSON plus
  ``ENTRY_OVERHEAD`` bytes for its key, its bytes object and its place in the order. Thread-safe (one lock, held
  for dictionary operations only: the JSON is encoded and decoded outside it).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcad.api import fastjson
from mcad.api.appwrapper import KIND
from mcad.k8s.dispatchjob import Writer

# What an entry costs besides its JSON: its record, the bytes object's header and the ordered dict's slot and
# links, about 180 bytes (tracemalloc, 10,000 entries), plus the uid string (85 bytes) when the view that holds
# it too is gone; counted generously.
ENTRY_OVERHEAD = 320
MAX_BYTES = 2 * 1024 * 1024
MAX_ENTRIES = 8192
MAX_ITEM_BYTES = 64 * 1024
STALE_AFTER_SECONDS = 300.0


Key = tuple[str, str, str]  # apiVersion, namespace, name


def object_key(api_version: str, namespace: str, name: str) -> Key:
    return api_version, namespace, name


@dataclass(frozen=True, slots=True)
class _Entry:
    uid: str
    generation: int
    data: bytes
    since: float


def _items(raw: Mapping[str, Any]) -> Any:
    spec = raw.get("spec")
    resources = spec.get("resources") if isinstance(spec, Mapping) else None
    return resources.get("GenericItems") if isinstance(resources, Mapping) else None


class Templates:
    def __init__(self, *, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES,
                 max_item_bytes: int = MAX_ITEM_BYTES, stale_after: float = STALE_AFTER_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self._max_item_bytes = max_item_bytes
        self._stale_after = stale_after
        self._clock = clock
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size(self) -> tuple[int, int]:
        """(entries, bytes counted) now."""
        with self._lock:
            return len(self._entries), self._bytes

    def keep(self, key: Key, uid: str, generation: int, raw: Mapping[str, Any]) -> None:
        self.forget(key)
        items = _items(raw)
        if not uid or not isinstance(items, list):
            return
        try:
            data = fastjson.dumps(items)
        except (TypeError, ValueError, RecursionError):  # not what the API server sends: the GET will say
            return
        if len(data) > self._max_item_bytes:
            return
        cost = len(data) + ENTRY_OVERHEAD
        now = self._clock()
        with self._lock:
            while self._entries and (len(self._entries) >= self._max_entries
                                     or self._bytes + cost > self._max_bytes):
                oldest_key, oldest = next(iter(self._entries.items()))
                if now - oldest.since < self._stale_after:
                    return  # full of entries that are still likely to be used
                self._drop(oldest_key)
            if cost > self._max_bytes or self._max_entries <= 0:
                return
            self._entries.pop(key, None)  # another thread's keep of the same key since ours began
            self._entries[key] = _Entry(uid, generation, data, now)
            self._bytes += cost

    def take(self, key: Key) -> tuple[str, int, list[Mapping[str, Any]]] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._drop(key)
            self.hits += 1
        items = fastjson.loads(entry.data)
        return entry.uid, entry.generation, [item if isinstance(item, Mapping) else {} for item in items]

    def forget(self, key: Key, uid: str = "") -> None:
        """Drop the entry of ``key`` (only if it is of ``uid``, when given)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (not uid or entry.uid == uid):
                self._drop(key)

    def _drop(self, key: Key) -> None:
        """Lock held."""
        entry = self._entries.pop(key)
        self._bytes -= len(entry.data) + ENTRY_OVERHEAD


class TemplatesFirst:
    """``writer``, but a dispatch's read of an AppWrapper is answered from ``templates`` when they hold it (see the
    module docstring)."""

    def __init__(self, writer: Writer, templates: Templates) -> None:
        self._writer = writer
        self.templates = templates

    def read(self, api_version: str, kind: str, namespace: str, name: str, *,
             not_older_than: str = "") -> Mapping[str, Any]:
        if kind == KIND and not_older_than:
            found = self.templates.take(object_key(api_version, namespace, name))
            if found is not None:
                uid, generation, items = found
                return {"apiVersion": api_version, "kind": kind,
                        "metadata": {"namespace": namespace, "name": name, "uid": uid, "generation": generation},
                        "spec": {"resources": {"GenericItems": items}}}
        return self._writer.read(api_version, kind, namespace, name, not_older_than=not_older_than)

    def is_namespaced(self, api_version: str, kind: str) -> bool:
        return self._writer.is_namespaced(api_version, kind)

    def create(self, obj: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        return self._writer.create(obj, field_manager=field_manager)

    def apply(self, obj: Mapping[str, Any], *, field_manager: str, force: bool) -> Mapping[str, Any]:
        return self._writer.apply(obj, field_manager=field_manager, force=force)

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        self._writer.delete(api_version, kind, namespace, name, owner_uid=owner_uid, uid=uid, label=label)

    def apply_status(self, api_version: str, kind: str, namespace: str, name: str, new_status: Mapping[str, Any],
                     *, field_manager: str) -> Mapping[str, Any]:
        return self._writer.apply_status(api_version, kind, namespace, name, new_status, field_manager=field_manager)

    def replace_status(self, api_version: str, kind: str, namespace: str, name: str, uid: str,
                       new_status: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        return self._writer.replace_status(api_version, kind, namespace, name, uid, new_status,
                                           field_manager=field_manager)

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self._writer.force_delete_pod(namespace, name, uid)

    def patch_json(self, api_version: str, kind: str, namespace: str, name: str,
                   operations: list[dict[str, Any]]) -> Mapping[str, Any]:
        return self._writer.patch_json(api_version, kind, namespace, name, operations)
