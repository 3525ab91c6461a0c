"""Dispatches under way, and what becomes of them: dispatched, taken back, retried after a backoff, or failed.

Contract (the dispatcher thread owns this; the writes run on the write pool, ``mcad.k8s.dispatchjob``; built by
``mcad.wiring`` with the owners it hands outcomes to: ``mcad.loop.active``, ``mcad.loop.queued``,
``mcad.loop.decisions``, ``mcad.loop.notices``):
- ``start(aw, status, cluster)``: the loop has reserved ``aw``'s room and placed it; its objects are created in
  the background and, meanwhile, it is in flight: neither queued nor dispatched.
- The in-flight record (``InFlight``) is this owner's: ``mcad.wiring`` builds it (the queue needs to read it before
  this owner exists) and hands the record to ``Dispatches`` alone, which adds to it in ``start`` and takes from it
  in ``done``. Readers (``mcad.loop.queued``, ``mcad.loop.evictions``, ``Dispatches.in_flight``) get its ``view``:
  a live, read-only ``Mapping`` (key -> the AppWrapper decided about) that cannot be written through.
  The dispatch retries (``RetryTimes`` under ``DISPATCH_RETRY``) are this owner's too, built by ``mcad.wiring`` for
  it alone: it records failures and successes; ``mcad.loop.notices`` reads them through their ``reader()``.
  ``test/unit/test_owned_state.py`` holds both.
- ``done(outcome)``, once the writes finished:
  * created, and the AppWrapper is still the one decided about: ``Active.dispatched`` (it records it, with the
    uids of its objects, one request each to delete them later, and decides the Dispatched status); its failures
    are forgotten.
  * created, but the AppWrapper was deleted meanwhile: its objects are deleted at once.
  * refused (what was applied is undone: plan, placement and reservation released): a refusal that would repeat,
    or failing TRANSIENT-ly for too long (``DISPATCH_RETRY``), fails it; anything else puts it back in the queue
    until its own backoff passes (``waiting``), its status saying why from the first failure, with a
    ``DispatchRetry`` timer of its own (DISPATCH timers of several AppWrappers would merge into the earliest).
  * stale (the read showed another spec, or it is gone): decided again after a short backoff of its own, not at
    once (a read that keeps disagreeing must not spin).
- ``recovered()``: the API server answers again; every backoff ends now (the failures most likely came from its
  absence), bounded still by the retry budget of ``mcad.model.retry``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import structlog

from mcad.api.appwrapper import AppWrapperView
from mcad.k8s import apply
from mcad.k8s.dispatchjob import Dispatched, Writer, create_objects
from mcad.k8s.informer import Store
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.writes import Writes
from mcad.loop.active import Active
from mcad.loop.decisions import Decisions
from mcad.loop.notices import Notices
from mcad.loop.queued import Queued
from mcad.loop.sites import Sites
from mcad.model import status
from mcad.model.accounting import Accountant
from mcad.model.keys import DISPATCH, DispatchRetry, Key
from mcad.model.retry import FailureKind, Policy, RetryTimes

log = structlog.get_logger("mcad.loop.dispatcher")

# Object writes: per AppWrapper 0.5 s doubling to 5 s, so a fault of 20 s costs each AppWrapper about ten attempts
# and it runs within 5 s of the fault's end; at most 10 retries a second in all; failing TRANSIENT-ly for 5 minutes
# (and 10 attempts) fails the AppWrapper.
DISPATCH_RETRY = Policy(base=0.5, cap=5.0, rate=10.0, burst=100, give_up_attempts=10, give_up_seconds=300.0)


class InFlight:
    """The dispatches whose writes are under way: AppWrapper key -> the view decided about. Only ``Dispatches``
    writes it (``add`` and ``remove``); everyone else reads ``view``, live and read-only."""

    def __init__(self) -> None:
        self._entries: dict[str, AppWrapperView] = {}
        self.view: Mapping[str, AppWrapperView] = MappingProxyType(self._entries)

    def add(self, aw: AppWrapperView) -> None:
        self._entries[aw.key] = aw

    def remove(self, key: str) -> None:
        self._entries.pop(key, None)


class Dispatches:
    def __init__(self, active: Active, queued: Queued, decisions: Decisions, notices: Notices, *,
                 appwrappers: Store[AppWrapperView], accountant: Accountant, sites: Sites, writer: Writer,
                 writes: Writes, queue: WorkQueue[Key], retries: RetryTimes, in_flight: InFlight) -> None:
        self._active = active
        self._queued = queued
        self._decisions = decisions
        self._notices = notices
        self._appwrappers = appwrappers
        self._accountant = accountant
        self._sites = sites
        self._writer = writer
        self._writes = writes
        self._queue = queue
        self._retries = retries  # DISPATCH_RETRY's times: mcad.loop.notices reads them through their reader()
        self._in_flight = in_flight  # its view is read live by the queue (mcad.loop.queued) and evictions

    @property
    def in_flight(self) -> Mapping[str, AppWrapperView]:
        """The dispatches under way, read-only (``InFlight.view``)."""
        return self._in_flight.view

    def __contains__(self, key: object) -> bool:
        return key in self._in_flight.view

    def start(self, aw: AppWrapperView, new: Mapping[str, Any], cluster: str) -> None:
        self._in_flight.add(aw)
        self._writes.submit(aw.key, partial(create_objects, self._writer, self._sites, aw, new, cluster),
                            tenant=aw.namespace, priority=aw.priority)

    def attempts(self, key: str) -> int:
        """Failed dispatches since its last success."""
        return self._retries.attempts(key)

    def waiting(self, key: str) -> bool:
        """Its last dispatch failed and its backoff has not passed yet."""
        return self._retries.waiting(key)

    def forget(self, key: str) -> None:
        """It is gone: its failures."""
        self._retries.forget(key)

    def done(self, key: str, outcome: Dispatched) -> None:
        aw = outcome.aw
        self._in_flight.remove(key)
        current = self._appwrappers.get(key)
        # The very AppWrapper decided about, as the informer has it now (None: deleted, or another one by now).
        same = current if current is not None and current.uid == aw.uid and not current.deleting else None
        if outcome.error is not None or outcome.stale:
            self._accountant.plans.drop(key)
            self._sites.unplace(key)  # what was applied is undone
            if self._accountant.holds(key) and (same is not None or current is None) and self._active.release(key):
                self._active.capacity_may_have_grown()
            if same is not None and outcome.error is not None:
                self._failed(same, outcome.error)
            elif same is not None:
                # The informer is behind (a newer spec, or it is gone): decide again once it caught up.
                retry = self._retries.failed(key, FailureKind.UNAVAILABLE)
                log.info("dispatch read another spec than decided about; deciding again", appwrapper=key,
                         delay_s=round(retry.delay, 3))
                self._queued.enqueue(same)
                self._queue.add_after(DispatchRetry(key), retry.delay)
            return
        if same is None:
            # Deleted while its objects were being created: take them back at once.
            self._sites.delete_objects(aw, outcome.uids)
            return
        self._retries.succeeded(key)
        self._active.dispatched(aw, same, outcome.status, outcome.uids)

    def _failed(self, aw: AppWrapperView, error: apply.DispatchFailed) -> None:
        key = aw.key
        retry = self._retries.failed(key, error.kind)
        if retry.give_up:
            message = error.message if error.kind is FailureKind.PERMANENT else \
                f"{error.message} (gave up after {retry.attempts} attempts in {retry.seconds:.0f} s)"
            self._decisions.fail(aw, status.ITEM_CREATION_FAILURE, message)
            return
        log.warning("dispatch failed; will retry", appwrapper=key, attempts=retry.attempts,
                    delay_s=round(retry.delay, 3), reason=error.message)
        self._queued.enqueue(aw)
        self._queue.add_after(DispatchRetry(key), retry.delay)
        why = f"creating its objects failed, retrying with backoff: {error.message}"
        self._notices.tell(aw, frozenset({"dispatch failed"}), partial(str, why), paced=False)

    def retry_due(self, key: str) -> None:
        """Its DispatchRetry timer fired: a cycle tries it again, unless a later failure moved its time."""
        remaining = self._retries.remaining(key)
        if remaining is None:
            return
        if remaining > 0:
            self._queue.add_after(DispatchRetry(key), remaining)
            return
        self._queue.add(DISPATCH)

    def recovered(self) -> None:
        waited = self._retries.release_all()
        if waited:
            log.info("api server answers again; retrying failed dispatches now", appwrappers=waited)
            self._queue.add(DISPATCH)
