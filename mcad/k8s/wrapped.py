"""Watching the objects AppWrappers wrap, for their conditions: one label-selected informer per kind, on demand.

Contract:
- Its informers store ``mcad.api.wrappedview.WrappedView``s: what completion and failure detection read of a wrapped
  object.
- ``WrappedObjects.ensure(api_version, kind, waiter)`` starts an informer for that kind once it knows the kind
  is served and may be watched (selecting only objects that carry the AppWrapper label, so a cluster's other Jobs
  cost nothing), and says whether it can be looked up yet. It never waits for the API server: finding out (API
  discovery and a SelfSubjectAccessReview) runs on one discovery thread of its own, started by the first ``ensure``
  and ended by ``stop()``; meanwhile ``ensure`` returns False and remembers ``waiter`` (an AppWrapper key), which
  is given to ``on_change`` once the answer is in (for a watched kind: once its informer has synced), so the
  caller need not poll. Each event that adds or removes an object or changes its conditions also enqueues the
  owning AppWrapper's key through ``on_change``: completion is detected from events, not by polling.
- A discovery that fails for a reason that passes (``mcad.model.retry.classify``: no answer, 5xx, 429) is not an answer:
  the kind is asked about again after its own backoff, 0.5 s doubling to 30 s and on every 30 s for as long as it
  fails, each delay drawn from its upper half (``mcad.model.retry.equal_jitter``). A kind the API server does not serve
  (absent from discovery, or 404) is remembered as not served and asked about again every 5 minutes (a CRD may
  be installed later); ``ensure`` stays False for it, and its waiters are woken by each such answer (and wait
  again), so a deleted AppWrapper is not remembered past the next one. A discovery refused for a lasting reason
  (403 and other 4xx) is asked again every 5 minutes too.
- Bounds: at most 256 kinds are known (an ``ensure`` for one more is refused with an error logged, and that kind
  is treated as one it may not watch, below), and at most 65,536 waiters over all kinds (one more is logged and
  not remembered: it is visited again on its next event only). Answers are kept for the life of the process.
- ``watches(api_version, kind)``: whether ``lookup`` can tell that an object of that kind does not exist (its
  informer runs and has synced), for the detection of wrapped objects deleted by hand (``mcad.loop.health``).
- ``lookup`` answers from the informer's store: the object, ``None`` when it does not exist, or ``NOT_SYNCED``
  when the kind's informer has not finished its first list (no decision may be taken on that).
- ``informer_factory(conn, client, prefix)`` is the factory for one cluster (the hub's own, or each worker's in hub
  mode, whose informers are named after the worker).
- Kinds the API server does not serve get no informer (logged once): an AppWrapper wrapping them fails at dispatch
  with its own message.
- Kinds the controller may not list and watch in every namespace (its RBAC, asked once per kind with a
  SelfSubjectAccessReview: least privilege grants list/watch only on kinds whose completion is worth watching, and
  never on Secrets) get no informer either, and are not waited for: ``ensure`` returns True and ``lookup`` None,
  as for an object that reports no conditions, so an item of such a kind never completes the AppWrapper (as a
  completionstatus on a Service never does) and a Job of it is not seen failing. Logged once per kind.
- Tests step discovery with ``background=False`` and ``discover_next()`` under an injected ``Clock``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import structlog

from mcad.api.appwrapper import APPWRAPPER_LABEL
from mcad.api.wrappedview import NOT_SYNCED, NotSynced, WrappedView, wrapped_view
from mcad.clock import Clock
from mcad.errors import ApiError
from mcad.k8s import kube
from mcad.k8s.informer import Informer, Reconnects
from mcad.k8s.workqueue import WorkQueue
from mcad.model import retry
from mcad.model.retry import FailureKind

log = structlog.get_logger("mcad.k8s.wrapped")


class Unwatchable:
    def __repr__(self) -> str:
        return "UNWATCHABLE"


# The controller's RBAC does not let it list and watch that kind in every namespace.
UNWATCHABLE: Final = Unwatchable()

# Builds (not starts) the informer for one kind; None when the API server does not serve it, UNWATCHABLE when the
# controller may not watch it. Raises ApiError when that could not be found out (asked again with backoff).
InformerFactory = Callable[[str, str], "Informer[WrappedView] | Unwatchable | None"]


def informer_factory(conn: kube.Connection, client: kube.Client, prefix: str = "",
                     peers: Reconnects | None = None) -> InformerFactory:
    """Informers over one wrapped kind in the cluster of ``conn``, only objects carrying the AppWrapper label,
    named ``<prefix>wrapped-<kind>``, reconnecting with ``peers``; None for a kind that cluster does not serve."""
    def make(api_version: str, kind: str) -> Informer[WrappedView] | Unwatchable | None:
        try:
            resource = client.resource(api_version, kind)
        except ApiError as err:
            if err.status == 404:
                return None
            raise  # not an answer: asked again with backoff
        if not all(client.allowed(verb, api_version, kind) for verb in ("list", "watch")):
            return UNWATCHABLE
        group, _, version = api_version.rpartition("/")
        return Informer(f"{prefix}wrapped-{kind.lower()}",
                        kube.ResourceClient(conn, group=group, version=version, plural=resource.plural,
                                            label_selector=APPWRAPPER_LABEL),
                        transform=wrapped_view, peers=peers)
    return make


# Bounds of what WrappedObjects remembers: a clever or careless AppWrapper author must not make it grow without end.
MAX_KINDS: Final = 256
MAX_WAITERS: Final = 65_536  # AppWrapper keys waiting on some kind's answer, all kinds together
# Discovery retries after a failure that passes (5xx, timeout, no connection): per kind, doubling up to the cap and
# on at the cap for ever, since the API server will answer again. A kind not served is asked about again rarely:
# its CRD may be installed later.
RETRY_BASE_SECONDS: Final = 0.5
RETRY_CAP_SECONDS: Final = 30.0
RECHECK_SECONDS: Final = 300.0


class NotServed:
    def __repr__(self) -> str:
        return "NOT_SERVED"


_NOT_SERVED: Final = NotServed()
Answer = Informer[WrappedView] | Unwatchable | NotServed


@dataclass(slots=True)
class _Kind:
    answer: Answer | None = None  # None: not known yet
    failures: int = 0  # discovery failures in a row that pass
    waiters: set[str] = field(default_factory=set)  # AppWrapper keys to wake with the answer

    def ready(self) -> bool:
        answer = self.answer
        return isinstance(answer, Unwatchable) or (isinstance(answer, Informer) and answer.has_synced())


class WrappedObjects:
    def __init__(self, factory: InformerFactory, on_change: Callable[[str], None], *, clock: Clock | None = None,
                 background: bool = True, max_kinds: int = MAX_KINDS, max_waiters: int = MAX_WAITERS,
                 retry_seconds: tuple[float, float] = (RETRY_BASE_SECONDS, RETRY_CAP_SECONDS),
                 recheck_seconds: float = RECHECK_SECONDS, draw: Callable[[], float] = random.random) -> None:
        self._factory = factory
        self._draw = draw  # jitter of the retries: kinds that failed together (discovery down) spread out
        self._on_change = on_change
        self._max_kinds = max_kinds
        self._max_waiters = max_waiters
        self._retry_base, self._retry_cap = retry_seconds
        self._recheck = recheck_seconds
        # Kinds to ask the API server about, each when due: deduplicated, delayed by the injected clock.
        self._due: WorkQueue[tuple[str, str]] = WorkQueue(clock=clock, name="wrapped-discovery")
        self._background = background
        self._thread: threading.Thread | None = None
        self._kinds: dict[tuple[str, str], _Kind] = {}
        self._waiting = 0  # waiters over all kinds
        self._stopped = False
        self._lock = threading.Lock()

    def ensure(self, api_version: str, kind: str, waiter: str | None = None) -> bool:
        """True once ``kind`` can be looked up (its informer has synced, or it is not watched); else False at once,
        and ``waiter`` (an AppWrapper key) is woken through ``on_change`` when the answer comes in. Never waits
        for the API server: discovery runs on the discovery thread."""
        key = (api_version, kind)
        refused = False
        with self._lock:
            entry = self._kinds.get(key)
            if entry is None:
                if len(self._kinds) >= self._max_kinds or self._stopped:
                    refused = not self._stopped
                else:
                    entry = self._kinds[key] = _Kind()
                    self._due.add(key)
                    self._start_locked()
            if entry is not None:
                if entry.ready():
                    return True
                if waiter is not None and waiter not in entry.waiters:
                    if self._waiting < self._max_waiters:
                        entry.waiters.add(waiter)
                        self._waiting += 1
                    else:
                        log.error("too many AppWrappers wait on wrapped kinds; this one is not woken when its kind is "
                                  "known, only by its next event", appwrapper=waiter, api_version=api_version,
                                  kind=kind, reason="WaitersFull", limit=self._max_waiters)
                return False
        if refused:
            log.error("too many wrapped kinds; the completion of this one is not watched", appwrapper=waiter,
                      api_version=api_version, kind=kind, reason="KindsFull", limit=self._max_kinds)
        return True  # refused (or stopping): nothing to wait for, as for a kind that may not be watched

    def discover_next(self, timeout: float | None = 0) -> bool:
        """Ask the API server about the next kind that is due, waiting up to ``timeout`` seconds (real time; None:
        until one is or ``stop()``) for one; False when none came. The discovery thread's loop, and the tests'
        step."""
        key, shut_down = self._due.get(timeout=timeout)
        if key is None or shut_down:
            return False
        try:
            with self._lock:
                stopped = self._stopped
            if not stopped:  # kinds still queued at stop() are not asked about
                self._discover(key)
        finally:
            self._due.done(key)
        return not stopped

    def _start_locked(self) -> None:
        if self._background and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="wrapped-discovery", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._due.shutting_down():
            try:
                self.discover_next(timeout=None)
            except Exception:  # a bug must not end discovery for every kind
                log.exception("wrapped kind discovery failed", reason="Unexpected")

    def _discover(self, key: tuple[str, str]) -> None:
        api_version, kind = key
        try:
            answer: Answer | None = self._factory(api_version, kind)
        except ApiError as err:
            if err.status != 404:  # 404: an answer, not served
                self._failed(key, retry.classify(err), err)
                return
            answer = None
        if answer is None:
            answer = _NOT_SERVED
        if isinstance(answer, Informer):
            answer.add_handler(self._handle)
            answer.on_synced(lambda: self._wake(key))
        with self._lock:
            entry = self._kinds[key]
            known = entry.answer
            entry.answer = answer
            entry.failures = 0
            stopped = self._stopped
        if isinstance(answer, Informer):
            if stopped:
                return
            answer.start()
            log.info("watching wrapped kind", api_version=api_version, kind=kind)
            return  # its waiters are woken once it has synced
        if isinstance(answer, Unwatchable):
            log.warning("wrapped kind may not be listed and watched (RBAC); the completion of its items is not "
                        "watched", api_version=api_version, kind=kind)
        else:
            if not isinstance(known, NotServed):
                log.warning("wrapped kind not served; its completion cannot be watched; checking again later",
                            api_version=api_version, kind=kind, reason="NotServed", recheck_seconds=self._recheck)
            self._due.add_after(key, self._recheck)
        # Not served too: those waiting ask again (and wait again), so a deleted AppWrapper is not held for ever.
        self._wake(key)

    def _failed(self, key: tuple[str, str], failure: FailureKind, err: ApiError) -> None:
        with self._lock:
            entry = self._kinds[key]
            entry.failures += 1
            failures = entry.failures
        if failure is FailureKind.PERMANENT:  # 403 and the like: asking again soon would get the same answer
            delay = self._recheck
        else:
            delay = retry.equal_jitter(min(self._retry_cap, self._retry_base * 2.0 ** min(failures - 1, 64)),
                                       self._draw)
        log.warning("cannot tell whether a wrapped kind is served and may be watched; asking again later",
                    api_version=key[0], kind=key[1], reason=str(err), failure=failure.value, attempts=failures,
                    retry_seconds=delay)
        self._due.add_after(key, delay)

    def _wake(self, key: tuple[str, str]) -> None:
        with self._lock:
            entry = self._kinds[key]
            waiters, entry.waiters = entry.waiters, set()
            self._waiting -= len(waiters)
        for waiter in sorted(waiters):
            self._on_change(waiter)

    def watches(self, api_version: str, kind: str, waiter: str | None = None, *, start: bool = True) -> bool:
        """True when objects of ``kind`` are watched and its informer has synced: only then does ``lookup``'s None
        mean that the object does not exist (a kind it may not watch also answers None). With ``start``, starts
        finding out as ``ensure`` does, waking ``waiter`` with the answer; without, only says what is known."""
        if start:
            self.ensure(api_version, kind, waiter)
        with self._lock:
            entry = self._kinds.get((api_version, kind))
        answer = entry.answer if entry is not None else None
        return isinstance(answer, Informer) and answer.has_synced()

    def lookup(self, api_version: str, kind: str, namespace: str, name: str) -> WrappedView | NotSynced | None:
        with self._lock:
            entry = self._kinds.get((api_version, kind))
            refused = entry is None and len(self._kinds) >= self._max_kinds
        answer = entry.answer if entry is not None else None
        if refused or isinstance(answer, Unwatchable):
            return None  # as an object that reports nothing
        if not isinstance(answer, Informer) or not answer.has_synced():
            return NOT_SYNCED
        return answer.get(f"{namespace}/{name}")

    def informers(self) -> list[Informer[WrappedView]]:
        """The informers started so far (for metrics)."""
        with self._lock:
            return [entry.answer for entry in self._kinds.values() if isinstance(entry.answer, Informer)]

    def stop(self) -> None:
        """Stop the discovery thread (a request in flight ends by its own timeout) and every informer."""
        with self._lock:
            self._stopped = True
        self._due.shutdown()
        for informer in self.informers():
            informer.stop()

    def _handle(self, _type: str, old: WrappedView | None, new: WrappedView | None) -> None:
        # Only conditions (and existence) decide anything: most updates of a Job's status change neither.
        if old is not None and new is not None and old.conditions == new.conditions:
            return
        view = new or old
        if view is not None and view.appwrapper:
            self._on_change(view.appwrapper)
