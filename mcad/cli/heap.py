"""Python's cyclic garbage collector around the informers' first lists: a controller holds the whole cluster's
objects for as long as it runs, and must not scan them again and again.

Contract:
- ``StartupHeap(synced, stop, bound_seconds, clock)``: ``pause()`` disables the cyclic collector (reference counting
  still frees every object without a cycle, which is nearly all an informer makes) and starts a thread that waits
  until ``synced()`` is true (every informer has listed), ``stop`` is set, or ``bound_seconds`` have passed,
  whichever comes first; then ``settle()``: every object alive is moved to the permanent generation
  (``gc.freeze``) and the collector is enabled again. ``settle()`` runs once, whoever calls it.
- Frozen objects are never scanned by a collection again; they are still freed when nothing refers to them. What
  is made later (new AppWrappers, each cycle's work) is collected as usual.
- The bound keeps a list that never ends (an API server that drops every watch) from running without the
  collector for ever.
- Once settled, a collection that takes ``SLOW_COLLECTION_SECONDS`` or longer is logged (info; warning from a
  second): the process stood still that long, whichever thread was working. A full collection (generation 2)
  that slow means the process made many long-lived objects since the last freeze (a cold start rewrites every
  AppWrapper's status, and the informer replaces every view): what survived it is frozen too, so the next full
  collection does not scan them again. The price: a reference cycle alive at that moment and dropped later is
  never collected (views, the bulk of what is frozen, hold none); it happens once per that much growth, not per
  collection.
- Only ``mcad.cli.controller`` uses it, once per process; nothing else touches ``gc``.

Why: a list of 100,000 AppWrappers makes a few million objects that live as long as the process. With the collector
on, a full collection runs each time the objects that survived grow by a quarter, and scans every one of them: about
1.8 s each on the development machine at 100,000, in whichever thread allocated (the dispatcher's included), several
during the list itself and one every few /debug snapshots afterwards. Frozen, the backlog costs no collection.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import structlog

from mcad.clock import Clock, RealClock

log = structlog.get_logger("mcad.cli.heap")

DEFAULT_BOUND_SECONDS = 600.0
# How often the waiting thread looks at ``synced()`` (informers set no event it could wait on together).
POLL_SECONDS = 0.2
SLOW_COLLECTION_SECONDS = 0.1


class StartupHeap:
    def __init__(self, synced: Callable[[], bool], stop: threading.Event, *,
                 bound_seconds: float = DEFAULT_BOUND_SECONDS, clock: Clock | None = None) -> None:
        self._synced = synced
        self._stop = stop
        self._bound = bound_seconds
        self._clock: Clock = clock if clock is not None else RealClock()
        self._lock = threading.Lock()
        self._settled = False
        self.paused_at: float | None = None
        self._collecting_since = 0.0

    def pause(self) -> None:
        gc.disable()
        self.paused_at = self._clock.monotonic()
        threading.Thread(target=self._wait, name="startup-heap", daemon=True).start()

    def settle(self) -> None:
        with self._lock:
            if self._settled:
                return
            self._settled = True
        gc.freeze()
        gc.callbacks.append(self._timed)
        gc.enable()
        waited = self._clock.monotonic() - self.paused_at if self.paused_at is not None else 0.0
        log.info("objects of the start-up frozen; garbage collector on", frozen=gc.get_freeze_count(),
                 paused_s=round(waited, 3))

    def _timed(self, phase: str, info: dict[str, int]) -> None:
        now = self._clock.monotonic()
        if phase == "start":
            self._collecting_since = now
            return
        took = now - self._collecting_since
        if took >= SLOW_COLLECTION_SECONDS:
            full = info.get("generation") == 2
            if full:
                gc.freeze()  # the collection is over: its survivors are not scanned again (see the docstring)
            report = log.warning if took >= 1.0 else log.info
            report("slow garbage collection", seconds=round(took, 3), generation=info.get("generation"),
                   collected=info.get("collected"), frozen=gc.get_freeze_count() if full else None)

    def forget(self) -> None:
        """No more timing of collections (tests; a process never needs it)."""
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)

    def _wait(self) -> None:
        deadline = self._clock.monotonic() + self._bound
        while not self._synced() and self._clock.monotonic() < deadline:
            if self._stop.wait(POLL_SECONDS):
                break
        self.settle()
