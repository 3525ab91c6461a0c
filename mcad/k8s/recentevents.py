"""The latest Events mcad recorded about each AppWrapper, kept in memory for the dashboard's detail view.

Contract:
- ``RecentEvents.add(namespace, name, uid, type_, reason, message, at)`` is called by the event recorder for every
  event it is asked to record (also those its rate limits keep from the API server: the dashboard shows what
  happened, not what was written). The same (type, reason, message) as the newest entry folds into it: its count
  goes up and its time moves on, as an aggregated Event does.
- ``of(namespace, name, uid)`` is the object's entries, newest first (none when they are about another uid), as
  JSON-ready dicts (``type``, ``reason``, ``message``, ``count``, ``lastSeen`` RFC 3339).
- Bounded: ``per_object`` entries per AppWrapper, ``max_objects`` AppWrappers and ``max_entries`` entries in all,
  the least recently updated AppWrapper forgotten first (messages come cut to an Event's 1 KiB by the recorder, so
  the whole stays under about 20 MiB however many AppWrappers there are and whatever their errors say). An event
  about a new uid under a known name (a re-created namesake) starts its list afresh.
- Thread-safe (the recorder runs on the dispatcher thread, readers on HTTP threads). Only this process's events:
  a new leader starts with none, and events other components wrote are not here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

PER_OBJECT = 10
MAX_OBJECTS = 10_000
MAX_ENTRIES = 20_000


@dataclass
class _Entry:
    type: str
    reason: str
    message: str
    count: int
    last_seen: datetime


class RecentEvents:
    def __init__(self, *, per_object: int = PER_OBJECT, max_objects: int = MAX_OBJECTS,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.per_object = per_object
        self.max_objects = max_objects
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._objects: OrderedDict[str, tuple[str, list[_Entry]]] = OrderedDict()
        self._entries = 0  # the sum of every object's entries

    def add(self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str,
            at: datetime) -> None:
        key = f"{namespace}/{name}"
        with self._lock:
            known = self._objects.pop(key, None)
            if known is not None:
                self._entries -= len(known[1])
            entries = known[1] if known is not None and known[0] == uid else []
            newest = entries[-1] if entries else None
            if newest is not None and (newest.type, newest.reason, newest.message) == (type_, reason, message):
                newest.count += 1
                newest.last_seen = at
            else:
                entries.append(_Entry(type_, reason, message, 1, at))
                del entries[: -self.per_object]
            self._objects[key] = (uid, entries)
            self._entries += len(entries)
            while len(self._objects) > self.max_objects or self._entries > self.max_entries:
                _, (_, forgotten) = self._objects.popitem(last=False)
                self._entries -= len(forgotten)

    def of(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        with self._lock:
            known = self._objects.get(f"{namespace}/{name}")
            entries = list(known[1]) if known is not None and known[0] == uid else []
            return [{"type": e.type, "reason": e.reason, "message": e.message, "count": e.count,
                     "lastSeen": e.last_seen.strftime("%Y-%m-%dT%H:%M:%SZ")} for e in reversed(entries)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)
