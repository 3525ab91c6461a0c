"""What waiting AppWrappers are told: their Backoff status and Queued Events, written only when they change.

Contract (dispatcher thread only; built by ``mcad.wiring`` with the owners it reads: what the loop decided
(``mcad.loop.decisions``, through which it writes), the queue (``mcad.loop.queued``), the preemptors and the
dispatch retries (a read-only ``RetryReader``: ``mcad.loop.dispatches`` owns them and alone records failures);
nothing here calls back into the dispatcher):
- ``tell(aw, about, why)`` decides the Backoff status saying what blocks ``aw`` and its queue position (none with
  fair sharing, whose order moves with usage; a paced,
  low write: ``mcad.loop.statussync`` and ``mcad.k8s.writes``, behind dispatches), unless the
  last one was about the same thing (``about``) and about the same place: exact for the first ten, then by powers
  of two, so an AppWrapper moving up a long queue is rewritten O(log n) times in all, not once per dispatch ahead
  of it. The message is built (``why()``) only when written. A Queued Event goes with a change of what blocks it,
  never with a change of place; the first notice of an AppWrapper counts one "queued" decision. Its write is
  paced (``mcad.loop.statussync``: at most ``--backoff-status-rate`` a second, and none for an AppWrapper
  dispatched before its turn) unless ``paced=False``: what a failed dispatch, a preemption or a reclaim says is
  written at once.
- ``announce(reserving)`` after a cycle tells each newcomer of the queue (``Queued.take_newcomers``: arrived, or
  changed group) what it waits for, the cycle may not have visited it (it skips the rest of a blocked
  group; a preemptor stops it). An AppWrapper whose requeue message still stands (its old pods are there) is
  kept for a later announce. Newcomers are fit-checked once per pending group and namespace (members of a group
  are judged alike), so announcing a backlog of 100,000 found at start-up costs O(groups x nodes) fit work, not
  O(n x nodes).
- ``refresh_group(head, about, reserving)``: a cycle judges one member per group; when what blocks the head changes, the
  other members are told once (O(group) per change, not per cycle), so none keeps an outdated reason.
- ``tell_estimates(assessed)``: each estimated AppWrapper's expected start (``mcad.model.estimate``, from the dry
  run ``assessed``) goes into its status (``estimatedStart``, or ``estimateWhy`` when unknown) when
  ``mcad.model.estimatetold``'s rule says so: at most once a minute per AppWrapper, and only when it moved by more
  than a fraction of the time left or turned known/unknown; one estimated before and now too far back in the queue
  is told that it is no longer estimated. Only one already told that it waits (state Pending) and that does not fit
  now is told; the write is paced and low, as a Backoff is. It returns how many were told and how many were held
  back by the minute (the caller judges again later for those). The dispatch cycle calls it at most once per
  ``ESTIMATE_INTERVAL_SECONDS`` (``mcad.loop.cycle``), so a deep queue costs at most ``ESTIMATED`` (100) judged
  AppWrappers per call.
- What they are told names another AppWrapper only within its own namespace (``mcad.model.disclosure``); an
  estimate is a time, which says nothing of other namespaces.
- Memory: one small entry per waiting AppWrapper (shared copies: ``(about, place)`` takes few values), one per
  pending group, one per queued AppWrapper whose estimate was written; ``forget`` and ``reset`` drop them, and one
  no longer in the queue is dropped at the next ``tell_estimates``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from functools import partial

import structlog

from mcad.api.appwrapper import AppWrapperView, State
from mcad.clock import Clock
from mcad.k8s import events
from mcad.k8s.informer import Store
from mcad.loop.decisions import Decisions
from mcad.loop.queued import Queued
from mcad.metrics import Metrics
from mcad.model import disclosure, status
from mcad.model.assess import QueueAssessment
from mcad.model.estimate import NOT_ESTIMATED, Estimate
from mcad.model.estimatetold import EstimatesTold
from mcad.model.fifo import BEHIND_STRICT_FIFO
from mcad.model.fit import Fit
from mcad.model.pending import alike
from mcad.model.preemption import Preemptors
from mcad.model.reservations import Pass
from mcad.model.retry import RetryReader

log = structlog.get_logger("mcad.loop.notices")


@functools.lru_cache(maxsize=1024)
def same_shortage(about: frozenset[str]) -> frozenset[str]:
    """One name per short resource, whether the fit found it short on every node ("nodes:cpu") or in the free
    total ("cpu"): with reservations withholding room from the total, one AppWrapper's shortfall turns from one to
    the other as room comes and goes, and each turn would rewrite its status (and its whole group's)."""
    if not any(item.startswith("nodes:") for item in about):
        return about
    return frozenset(item.removeprefix("nodes:") for item in about)


class Notices:
    def __init__(self, queued: Queued, appwrappers: Store[AppWrapperView], decisions: Decisions, *,
                 preemptors: Preemptors, dispatch_retries: RetryReader, metrics: Metrics,
                 clock: Clock, strict_fifo: bool) -> None:
        self._queued = queued
        self._pending = queued.pending
        self._appwrappers = appwrappers
        self._decisions = decisions
        self._preemptors = preemptors
        self._dispatch_retries = dispatch_retries
        self._metrics = metrics
        self._clock = clock
        self._strict_fifo = strict_fifo
        # Per waiting AppWrapper: what its last Backoff message was about. Per pending group: what blocked its head
        # when the group's members were last told (the newcomers still to be announced are the queue's).
        self._written: dict[str, frozenset[str]] = {}
        self._group_about: dict[Hashable, frozenset[str]] = {}
        # With fair sharing, per judgement shared by tenants' alike groups (``pending.alike``): what the heads a pass
        # dropped as alike to it were last told (``alike_news``).
        self._alike_about: dict[Hashable, frozenset[str]] = {}
        self._estimates = EstimatesTold()  # the estimated start last written for each queued AppWrapper

    def alike_news(self, dropped: Mapping[str, Sequence[str]],
                   about_of: Mapping[str, frozenset[str]]) -> list[tuple[str, frozenset[str]]]:
        """The heads a pass dropped as alike to another tenant's group (``mcad.model.walk``: by the key of the one
        judged) that are to be told what that one was, ``about_of`` it: all of them when that is not what the
        last pass told the heads alike to it, else none (each told so is told with its group, ``refresh_group``, so
        a member that becomes its group's head later was told the same; a new AppWrapper is told by ``announce``).
        A queue of many tenants thus costs nothing per head while what blocks them stays the same."""
        news: list[tuple[str, frozenset[str]]] = []
        seen: set[Hashable] = set()
        for judged, keys in dropped.items():
            about, entry = about_of.get(judged), self._pending.entry(judged)
            if not keys or about is None or entry is None:
                continue
            alike_to = alike(entry[1])
            seen.add(alike_to)
            if self._alike_about.get(alike_to) != about:
                self._alike_about[alike_to] = about
                news.extend((key, about) for key in keys)
        if len(self._alike_about) > 2 * self._pending.group_count() + 16:  # bounded by the queue's groups
            self._alike_about = {a: told for a, told in self._alike_about.items() if a in seen}
        return news

    def tell(self, aw: AppWrapperView, about: frozenset[str], why: Callable[[], str], *, paced: bool = True) -> None:
        about = same_shortage(about)
        # With fair sharing the queue's live order is not the order of dispatch (tenants take turns by usage, which
        # moves with time): the message gives no position; /debug/queue and mcadctl give the projected one.
        position = 0 if self._queued.fair else self._pending.position(aw.key)
        # Written again when what it is about changes, not when its place does: the message says its position
        # when written. Under churn the queue moves many times a second, and with reservations many AppWrappers
        # near the head are looked at every cycle: rewriting each as its place improved cost more status writes
        # than the dispatches themselves (the API server is what bounds mcad). /debug/queue and mcadctl are live.
        current = self._decisions.status(aw)
        before = self._written.get(aw.key)
        if before == about and current.state == State.PENDING:
            return
        reason = why()
        log.debug("backoff told", appwrapper=aw.key, about=sorted(about),
                  changed="new" if before is None else ("about" if before != about else "state"))
        message = f"{reason}; position {position} in the queue" if position else reason
        if before is None:
            self._metrics.decision("queued")
        if before != about:
            # An Event when what blocks it changes, not when its place does (that changes every cycle).
            self._decisions.event(aw, events.QUEUED, f"Waiting: {reason}.")
        # Bookkeeping (paced, then the low lane of the write pool): a backlog of 100,000 found at start-up is told
        # why it waits, and a new AppWrapper that fits must not wait for those writes. What is not paced (a failed
        # dispatch, a preemption or reclaim under way) goes in the urgent lane.
        self._decisions.decide(aw, status.queued(current.raw(), self._clock.now(), priority=aw.priority,
                                                 why=message), urgent=not paced, paced=paced)
        self._written[aw.key] = about

    def reset(self, key: str) -> None:
        """It left the queue (dispatched, or requeued with a message of its own): its next wait is told afresh."""
        self._written.pop(key, None)
        self._estimates.forget(key)

    def forget(self, key: str) -> None:
        self._written.pop(key, None)
        self._estimates.forget(key)

    def tell_estimates(self, assessed: QueueAssessment) -> tuple[int, int]:
        """Each estimated AppWrapper's expected start into its status, when the rule says so (module docstring).
        Returns how many were told, and how many would have been but for the minute since their last write."""
        now, monotonic = self._clock.now(), self._clock.monotonic()
        estimates = dict(assessed.estimates())
        for key in [key for key in self._estimates if key not in estimates]:
            if key not in self._pending:
                self._estimates.forget(key)  # left the queue in a way that did not reset it (failed, gone)
            else:
                estimates[key] = Estimate(None, NOT_ESTIMATED)
        told = held = 0
        for key, estimate in estimates.items():
            if self._tell_estimate(key, estimate, assessed, now, monotonic):
                told += 1
            elif self._estimates.held(key, estimate, now, monotonic):
                held += 1
        return told, held

    def _tell_estimate(self, key: str, estimate: Estimate, assessed: QueueAssessment, now: datetime,
                       monotonic: float) -> bool:
        aw = self._appwrappers.get(key)
        if aw is None or not self._queued.is_queued(aw):
            return False
        current = self._decisions.status(aw)
        # Told that it waits first (the cycle's announce); one that fits now is dispatched by the next cycle.
        if current.state != State.PENDING or not self._estimates.due(key, estimate, now, monotonic):
            return False
        assessment = assessed.of(key)
        if assessment is not None and assessment.fits_now:
            return False
        self._decisions.decide(aw, status.with_estimate(current.raw(), at=estimate.at, why=estimate.why),
                               urgent=False, paced=True)
        self._estimates.told(key, estimate, monotonic)
        return True

    def groups_changed(self) -> None:
        """Every group was rebuilt (quota trees changed): what blocked their heads is unknown again."""
        self._group_about.clear()

    def refresh_group(self, head: AppWrapperView, about: frozenset[str], reserving: Pass) -> None:
        about = same_shortage(about)
        entry = self._pending.entry(head.key)
        if entry is None:
            return
        group = entry[1]
        previous = self._group_about.get(group)
        self._group_about[group] = about
        # First sight of the group (a new one, or after a restart): its members were announced one by one.
        if previous is None or previous == about:
            return
        judged: dict[tuple[Hashable, str], Fit] = {}
        for key in self._pending.members(group):
            member = self._appwrappers.get(key) if key != head.key else None
            if member is None or not self._queued.waits_in_queue(member):
                continue
            fit = self._fit(member, reserving, group, judged)
            if not fit.fits:
                self.tell(member, fit.about, fit.why)
        if len(self._group_about) > 2 * self._pending.group_count() + 16:
            self._group_about = {g: a for g, a in self._group_about.items() if self._pending.has_group(g)}

    def announce(self, reserving: Pass, held_by: str = "") -> None:
        """After a cycle: the first Backoff of those that arrived and still wait (``held_by``: the key of the
        preemptor that stopped the cycle early by holding the queue; named only to its own namespace)."""
        held = set()
        judged: dict[tuple[Hashable, str], Fit] = {}
        for key in self._queued.take_newcomers():
            aw = self._appwrappers.get(key)
            if aw is None or key not in self._pending or key in self._written or key in self._preemptors:
                continue
            if self._queued.draining(aw):
                held.add(key)  # its requeue message stands until its old pods are gone
                continue
            if self._strict_fifo:
                self.tell(aw, frozenset({BEHIND_STRICT_FIFO}), partial(str, BEHIND_STRICT_FIFO))
                continue
            entry = self._pending.entry(key)
            fit = self._fit(aw, reserving, entry[1] if entry is not None else None, judged)
            if fit.fits:
                # It would fit, yet the cycle did not dispatch it: a preemptor holds the queue, or its last
                # dispatch failed and it waits out its backoff. Never an empty reason.
                why = disclosure.held_behind_preemptor(held_by, aw.namespace) if held_by else (
                    "waiting for the next dispatch cycle" if not self._dispatch_retries.waiting(key)
                    else "its last dispatch failed; retrying after its backoff")
                self.tell(aw, frozenset({why}), partial(str, why))
            else:
                self.tell(aw, fit.about, fit.why)
        for key in held:
            self._queued.announce_later(key)

    @staticmethod
    def _fit(aw: AppWrapperView, reserving: Pass, group: Hashable | None = None,
             judged: dict[tuple[Hashable, str], Fit] | None = None) -> Fit:
        """How ``aw`` fits on the room the cycle's pass left, as the pass would judge it (reservations ahead).
        With ``judged``, once per pending group and namespace: members of a group are judged alike (that is
        what makes them one, ``mcad.model.pending.demand_group``), and the message names others only within
        the namespace. A cold start announces 100,000 newcomers, and a fit check costs O(nodes)."""
        if judged is not None and group is not None:
            memo = (group, aw.namespace)
            found = judged.get(memo)
            if found is None:
                found = judged[memo] = Notices._fit(aw, reserving)
            return found
        need = reserving.snapshot.need(aw.key, aw.demand)
        fit = reserving.fit(aw, need)
        if fit.fits:
            return fit
        about, why = reserving.explain(aw, need, fit)
        return Fit(False, about, why)
