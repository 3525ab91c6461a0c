"""Each AppWrapper's status on the API server, kept equal to the dispatcher's last decision about it.

Contract (the dispatcher thread owns this object; writes run on the write pool and come back as outcomes):
- ``want(aw, status)`` records the decision (the *intent*) and makes sure a write of it is under way. The intent
  is what the loop decides from (``intent(aw)``) until the informer shows that it landed, whatever happens to the
  writes: a decision is never taken back because its status write failed. That is what keeps a dispatched
  AppWrapper dispatched (and its first dispatch time its first) while status writes are refused.
- At most one write per AppWrapper is under way; it sends the newest intent when it starts, so a burst of
  decisions costs one write, and a decision made while a write is under way is sent right after it.
- ``want(..., urgent=False)`` (bookkeeping: a queued AppWrapper's Pending status) puts the write in the pool's low
  lane; an urgent decision made while such a write waits to start hurries it (``WritePool.hurry``): it will send
  the urgent one.
- A failed write is classified (``mcad.model.retry``): UNAVAILABLE and TRANSIENT ones are retried after the key's
  backoff through the work-queue key ``StatusRetry(key)``, and re-driven at once by ``observed`` (any event of the
  AppWrapper: its pods or objects changed) while no write or retry is pending; a PERMANENT refusal is logged and
  not retried until the next decision; 404 means the AppWrapper is gone, and its intent is dropped. Giving up
  (``mcad.model.retry.Backoff``) only stops the timer: the next event re-drives the write.
- ``observed(aw)`` is called for every informer event of an AppWrapper: once the informer holds the version our
  last write produced (or a later one), the intent is dropped, and decisions read the informer's status again;
  an intent for an older incarnation (another uid) is dropped at once.
- Writes carry the AppWrapper's uid as a precondition (``replace_status``), so a write for an AppWrapper deleted
  and re-created under the same name is refused (422) instead of landing on the new one.
- Paced decisions (``want(..., paced=True)``: what a waiting AppWrapper is told, its Backoff) take a token of
  ``pace`` (a rate with a burst, ``--backoff-status-rate``) before their write is submitted; without one they wait
  in arrival order (one entry per AppWrapper, however often it is decided again), and the ``BACKOFF_STATUS``
  work-queue key fires when the next token is due. A decision that is not paced (a dispatch, a failure) takes the
  AppWrapper out of that line and is written at once, so an AppWrapper dispatched before its turn never has its
  Backoff written: under a flood of arrivals the API server's writes go to dispatches, and what waiting
  AppWrappers are told costs at most ``rate`` writes a second (as their Events do, ``mcad.k8s.events``). The loop
  decides from the intent meanwhile, and /debug/queue, mcadctl and the dashboard read the loop, not the status.
  ``pace=None`` writes every decision at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from mcad.api.appwrapper import FIELD_MANAGER, KIND, AppWrapperView
from mcad.api.statusview import StatusView
from mcad.errors import ApiError
from mcad.model.keys import BACKOFF_STATUS, StatusRetry
from mcad.model.retry import Backoff, Clock, FailureKind, TokenBucket, classify

log = structlog.get_logger("mcad.loop.statussync")


class StatusWriter(Protocol):
    def replace_status(self, api_version: str, kind: str, namespace: str, name: str, uid: str,
                       new_status: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]: ...


class WritePool(Protocol):
    def submit(self, key: str, job: Callable[[], Any], *, tenant: str, urgent: bool = True,
               priority: int = 0) -> None: ...

    def hurry(self, key: str) -> None: ...


class KeyQueue(Protocol):
    def add_after(self, key: Any, delay: float) -> None: ...


def _intended(syncs: Mapping[str, _Sync], aw: AppWrapperView) -> StatusView | None:
    """The status last decided for this incarnation of ``aw`` in ``syncs``, if any."""
    sync = syncs.get(aw.key)
    return sync.intent.status if sync is not None and sync.intent.uid == aw.uid else None


class _FrozenIntents(Mapping[str, tuple[str, str]]):
    """Who has a decision under way, copied for a reader on another thread (a C-speed copy: a cold start of
    100,000 has as many); each intent is read when asked, so one replaced later may show through, never one for
    another incarnation. As a mapping: key -> (uid, state)."""

    def __init__(self, syncs: dict[str, _Sync]) -> None:
        self._syncs = dict(syncs)

    def __getitem__(self, key: str) -> tuple[str, str]:
        intent = self._syncs[key].intent
        return intent.uid, intent.status.state

    def __iter__(self) -> Iterator[str]:
        return iter(self._syncs)

    def __len__(self) -> int:
        return len(self._syncs)

    def status_of(self, aw: AppWrapperView) -> StatusView | None:
        """``StatusSync.intent`` over the copy."""
        return _intended(self._syncs, aw)


@dataclass(frozen=True, slots=True)
class _Intent:
    uid: str
    status: StatusView
    version: int  # counts decisions for this AppWrapper, so an outcome knows whether it wrote the newest


@dataclass(slots=True)
class _Sync:
    """Where the writes of one AppWrapper stand."""

    api_version: str
    namespace: str
    name: str
    intent: _Intent
    landed: int = 0  # the intent version the API server has
    landed_rv: str = ""  # the resourceVersion our last successful write produced
    busy: bool = False  # a write job is submitted and its outcome not yet collected
    retry_due: bool = False  # a StatusRetry(key) retry is scheduled
    retry_at: float = 0.0  # when (its timer may fire earlier: the queue keeps a key's earliest due time)
    refused: int = 0  # the intent version refused for good (not retried until a newer decision)
    priority: int = 0  # the AppWrapper's: its writes' place among its namespace's (mcad.k8s.writes)
    urgent: bool = True  # the newest intent's lane in the write pool (mcad.k8s.writes)
    paced: bool = False  # the newest intent waits for a token of the pace before its write is submitted


@dataclass(frozen=True, slots=True)
class StatusWritten:
    """The outcome of one status write job (handed to ``StatusSync.written`` on the dispatcher thread)."""

    uid: str
    version: int
    resource_version: str = ""
    error: ApiError | None = None


def _newer_or_same(observed: str, written: str) -> bool:
    """Whether the informer's resourceVersion is at or past ours. They are etcd revisions in practice; compared as
    integers when both are, else only equality can be trusted."""
    if observed.isdigit() and written.isdigit():
        return int(observed) >= int(written)
    return observed == written


class StatusSync:
    def __init__(self, writer: StatusWriter, writes: WritePool, queue: KeyQueue, backoff: Backoff,
                 clock: Clock, pace: TokenBucket | None = None) -> None:
        self._clock = clock
        self._writer = writer
        self._writes = writes
        self._queue = queue
        self._backoff = backoff
        self._syncs: dict[str, _Sync] = {}
        self._pace = pace
        self._paced: dict[str, None] = {}  # keys waiting for a token, in arrival order (a dict keeps it)
        self._pace_timer = False  # a BACKOFF_STATUS key is due

    def __len__(self) -> int:
        return len(self._syncs)

    def decided_states(self) -> Mapping[str, tuple[str, str]]:
        """key -> (uid, state) of every decision the informer may not show yet, for other threads (published once a
        second: see ``_FrozenIntents``)."""
        return _FrozenIntents(self._syncs)

    def intent(self, aw: AppWrapperView) -> StatusView | None:
        """The status last decided for this incarnation of ``aw``, while the informer may not show it yet."""
        return _intended(self._syncs, aw)

    def frozen_intents(self) -> Callable[[AppWrapperView], StatusView | None]:
        """``intent`` for a reader on another thread (see ``_FrozenIntents``)."""
        return _FrozenIntents(self._syncs).status_of

    def pending(self, key: str) -> bool:
        """A decision about ``key`` has not reached the API server yet."""
        sync = self._syncs.get(key)
        return sync is not None and sync.landed != sync.intent.version

    def paced_count(self) -> int:
        """Decisions waiting for a token of the pace (for metrics and /debug)."""
        return len(self._paced)

    def want(self, aw: AppWrapperView, status: StatusView, *, urgent: bool = True, paced: bool = False) -> None:
        sync = self._syncs.get(aw.key)
        if sync is None or sync.intent.uid != aw.uid:
            if sync is not None:
                self._backoff.forget(aw.key)
            sync = _Sync(aw.api_version, aw.namespace, aw.name, _Intent(aw.uid, status, 1))
            self._syncs[aw.key] = sync
        else:
            sync.intent = _Intent(aw.uid, status, sync.intent.version + 1)
        sync.priority = aw.priority
        sync.urgent = urgent
        sync.paced = paced and self._pace is not None
        if not sync.paced:
            self._paced.pop(aw.key, None)
        self._send(aw.key, sync)

    def observed(self, aw: AppWrapperView) -> None:
        """An informer event of ``aw`` (or its pods/objects changed): drop what the informer now shows, re-drive
        a write that failed and waits for nothing."""
        sync = self._syncs.get(aw.key)
        if sync is None:
            return
        if sync.intent.uid != aw.uid:
            self.forget(aw.key)
            return
        if sync.landed == sync.intent.version:
            if not sync.busy and sync.landed_rv and _newer_or_same(aw.resource_version, sync.landed_rv):
                del self._syncs[aw.key]
            return
        if sync.refused != sync.intent.version:
            self._send(aw.key, sync)

    def retry(self, key: str) -> None:
        """The StatusRetry(key) timer fired."""
        sync = self._syncs.get(key)
        if sync is None or not sync.retry_due:
            return
        early = sync.retry_at - self._clock.monotonic()
        if early > 0:  # an earlier timer of this key (retry_all ran meanwhile, and the write failed again)
            self._queue.add_after(StatusRetry(key), early)
            return
        sync.retry_due = False
        if sync.landed != sync.intent.version and sync.refused != sync.intent.version:
            self._send(key, sync)

    def retry_all(self) -> None:
        """Every write waiting out a backoff goes now (the API server is back); their timers then find nothing to
        do."""
        for key in [key for key, sync in self._syncs.items() if sync.retry_due]:
            self._syncs[key].retry_at = 0.0
            self.retry(key)

    def forget(self, key: str) -> None:
        self._syncs.pop(key, None)
        self._paced.pop(key, None)
        self._backoff.forget(key)

    def pace_due(self) -> None:
        """The BACKOFF_STATUS timer fired: a token may be there for the next paced write."""
        self._pace_timer = False
        self._release()

    def _release(self) -> None:
        """Submit the paced writes in arrival order while tokens last; set the timer for the next token."""
        assert self._pace is not None
        while self._paced:
            key = next(iter(self._paced))
            sync = self._syncs.get(key)
            if sync is None or not sync.paced or sync.busy or sync.retry_due or sync.landed == sync.intent.version:
                del self._paced[key]  # written, superseded or gone meanwhile: no token spent on it
                continue
            wait = self._pace.try_take()
            if wait > 0:
                if not self._pace_timer:
                    self._pace_timer = True
                    self._queue.add_after(BACKOFF_STATUS, wait)
                return
            del self._paced[key]
            self._submit(key, sync)

    def written(self, key: str, outcome: StatusWritten) -> None:
        """The outcome of a write job of ``key`` (dispatcher thread)."""
        sync = self._syncs.get(key)
        if sync is None or sync.intent.uid != outcome.uid:
            return  # forgotten meanwhile (deleted, or another incarnation)
        sync.busy = False
        err = outcome.error
        if err is None:
            self._backoff.succeeded(key)
            sync.landed, sync.landed_rv = outcome.version, outcome.resource_version
        elif err.status == 404:
            log.info("status write found no AppWrapper", appwrapper=key, reason=err.reason)
            self.forget(key)
            return
        else:
            kind = classify(err)
            if kind is FailureKind.PERMANENT:
                sync.refused = outcome.version
                log.warning("status write refused", appwrapper=key, status_code=err.status, reason=err.reason,
                            error=err.message)
            else:
                retry = self._backoff.failed(key, kind)
                if retry.give_up:
                    log.warning("status write keeps failing; waiting for the next event of the AppWrapper",
                                appwrapper=key, status_code=err.status, attempts=retry.attempts,
                                seconds=round(retry.seconds, 1), error=err.message)
                else:
                    log.info("status write failed; will retry", appwrapper=key, status_code=err.status,
                             attempts=retry.attempts, delay_s=round(retry.delay, 3), error=err.message)
                    sync.retry_due = True
                    sync.retry_at = self._clock.monotonic() + retry.delay
                    self._queue.add_after(StatusRetry(key), retry.delay)
                return
        if sync.landed != sync.intent.version and sync.refused != sync.intent.version:
            self._send(key, sync)  # decided again while the write was under way

    def _send(self, key: str, sync: _Sync) -> None:
        if sync.busy or sync.retry_due:
            if sync.busy and sync.urgent:
                self._writes.hurry(key)  # a low write not started yet would send an urgent decision: not last
            return  # the write under way (or the retry) sends the newest intent when it starts
        if sync.paced:
            self._paced.setdefault(key, None)  # keeps its place when decided again
            self._release()
            return
        self._submit(key, sync)

    def _submit(self, key: str, sync: _Sync) -> None:
        sync.busy = True
        writer, api_version, namespace, name = self._writer, sync.api_version, sync.namespace, sync.name

        def job() -> StatusWritten:
            intent = sync.intent  # the newest decision, read when the write starts (one attribute read: atomic)
            try:
                written = writer.replace_status(api_version, KIND, namespace, name, intent.uid,
                                                intent.status.raw(), field_manager=FIELD_MANAGER)
            except ApiError as err:
                return StatusWritten(intent.uid, intent.version, error=err)
            meta = written.get("metadata") if isinstance(written, Mapping) else None
            rv = str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""
            return StatusWritten(intent.uid, intent.version, rv)

        self._writes.submit(key, job, tenant=namespace, urgent=sync.urgent, priority=sync.priority)
