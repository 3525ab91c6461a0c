"""Following a dispatched AppWrapper: its timers, and what its pods and wrapped objects say about its end.

Contract (the dispatcher thread runs this; decisions are ``mcad.model.lifecycle``'s, carried out through
``mcad.loop.active`` and told through ``mcad.loop.decisions``; built by ``mcad.wiring``, a watcher of ``Active``):
- ``follow(aw)`` is called on every event of a dispatched AppWrapper. The first time, it sets its timers from the
  times in its status (so they survive restarts): a ``MinAvailableCheck`` when ``minAvailable`` > 0, a
  ``DeadlineCheck`` when ``dispatchDuration.limit`` > 0. Then it asks the wrapped-object informers of the place
  its objects are in (none while a worker cannot be reached) and its pods: a wrapped Job that failed goes to
  ``mcad.loop.health`` (a reset, or Failed), Completed (its resources are released at once) or
  RunningHoldCompletion. A kind not known yet is waited for: ``WrappedObjects`` wakes the
  AppWrapper when it is, nothing polls.
- ``check_min_available(key)``: too few Running or Succeeded pods at its time requeues it (MinPodsNotRunning,
  counted, with the wait ``lifecycle.requeue_wait`` gives, its message saying when mcad's floor made it longer than
  the spec asks), or fails it once ``maxNumRequeuings`` is reached (its objects deleted);
  enough pods: nothing more is checked. ``check_deadline(key)``: past its limit it fails, objects deleted.
  A timer of an earlier dispatch that fires early is set again for what is left.
- ``undispatched(key)`` once it is no longer dispatched (``dispatched(aw)``: just dispatched, followed at once).
- ``pod_counts_due(key)``: its pod counts (and pods that cannot be placed) in its status, in the low lane.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from mcad.api.appwrapper import FINAL_STATES, AppWrapperView, State
from mcad.api.views import Unschedulable
from mcad.clock import Clock
from mcad.k8s.informer import Store
from mcad.k8s.workqueue import WorkQueue
from mcad.loop.active import Active
from mcad.loop.decisions import Decisions
from mcad.loop.health import Health
from mcad.loop.queued import Queued
from mcad.loop.sites import Sites
from mcad.model import lifecycle, status
from mcad.model.accounting import Accountant
from mcad.model.keys import DeadlineCheck, Key, MinAvailableCheck

log = structlog.get_logger("mcad.loop.dispatcher")


class Unplaced(Protocol):
    def waiting(self, key: str) -> list[tuple[str, Unschedulable]]:
        """Its pods that wait to be placed (``mcad.loop.pinning``), with why each is not placed yet."""
        ...


class Follower:
    def __init__(self, active: Active, queued: Queued, decisions: Decisions, *, appwrappers: Store[AppWrapperView],
                 accountant: Accountant, sites: Sites, unplaced: Unplaced, health: Health, queue: WorkQueue[Key],
                 clock: Clock) -> None:
        self._active = active
        self._queued = queued
        self._decisions = decisions
        self._appwrappers = appwrappers
        self._unplaced = unplaced
        self._health = health
        self._accountant = accountant
        self._sites = sites
        self._queue = queue
        self._clock = clock
        # Dispatched AppWrappers whose timers are set; those whose minAvailable was met (nothing more to check).
        self._timed: set[str] = set()
        self._min_available_met: set[str] = set()

    def dispatched(self, aw: AppWrapperView) -> None:
        self.follow(aw)

    def undispatched(self, key: str) -> None:
        self._timed.discard(key)
        self._min_available_met.discard(key)

    def pod_counts_due(self, key: str) -> None:
        """Its pod counts in its status, at most once per window (``mcad.loop.active``), in the low lane."""
        aw = self._appwrappers.get(key)
        if aw is None or self._queued.is_queued(aw) or self._decisions.state(aw) in FINAL_STATES:
            return
        phases = self._accountant.phases(key)
        new = status.with_pod_counts(self._decisions.status(aw).raw(), self._clock.now(),
                                     pending=phases.count("Pending"), running=phases.count("Running"),
                                     succeeded=phases.count("Succeeded"), failed_=phases.count("Failed"),
                                     unschedulable=self._accountant.unschedulable_pods(key)
                                     + self._unplaced.waiting(key))
        self._decisions.decide(aw, new, urgent=False)

    def follow(self, aw: AppWrapperView) -> None:
        key = aw.key
        if key not in self._timed:
            self._set_timers(aw)
        wrapped = self._sites.wrapped_of(key)
        if wrapped is None:
            return
        phases = self._accountant.phases(key)
        jobs = "Failed" in phases
        kinds = lifecycle.watched_kinds(aw, jobs=jobs)
        if not kinds:
            return
        # A list, not a generator: every kind that is not ready registers the AppWrapper as its waiter.
        if not all([wrapped.ensure(api_version, kind, waiter=key) for api_version, kind in kinds]):
            return
        active = sum(1 for phase in phases if phase not in ("Succeeded", "Failed"))
        expects_pods = any(group.count > 0 for group in aw.gang)
        verdict = lifecycle.evaluate(aw, wrapped.lookup, active,
                                     pods_pending_creation=expects_pods and not phases, jobs=jobs)
        current = self._decisions.status(aw)
        now = self._clock.now()
        if verdict.outcome is lifecycle.Outcome.FAILED:
            self._health.failed_component(aw, verdict.reason, verdict.message)
        elif verdict.outcome is lifecycle.Outcome.COMPLETED:
            self._active.finish(aw, status.completed(current.raw(), now))
            log.info("appwrapper completed", appwrapper=key)
            self._decisions.note(aw, "completed", "Every wrapped item reports completion and no pod is active; "
                                                  "its resources are released.")
        elif verdict.outcome is lifecycle.Outcome.HOLD_COMPLETION and current.state != State.RUNNING_HOLD_COMPLETION:
            self._decisions.decide(aw, status.hold_completion(current.raw(), now))

    def _set_timers(self, aw: AppWrapperView) -> None:
        key = aw.key
        self._timed.add(key)
        current = self._decisions.status(aw)
        now = self._clock.now()
        spec = aw.scheduling
        if spec.min_available > 0 and key not in self._min_available_met:
            due = lifecycle.requeue_due(spec, current)
            self._queue.add_after(MinAvailableCheck(key), lifecycle.seconds_until(due, now) if due
                                  else lifecycle.current_requeue_wait(spec, current))
        if spec.dispatch_limit_seconds > 0:
            due = lifecycle.deadline_due(spec, current)
            self._queue.add_after(DeadlineCheck(key), lifecycle.seconds_until(due, now) if due
                                  else spec.dispatch_limit_seconds)

    def check_min_available(self, key: str) -> None:
        aw = self._queued.dispatched_now(key)
        if aw is None or aw.scheduling.min_available <= 0:
            return
        current = self._decisions.status(aw)
        now = self._clock.now()
        wait = lifecycle.current_requeue_wait(aw.scheduling, current)
        due = lifecycle.requeue_due(aw.scheduling, current)
        if due is not None and (remaining := lifecycle.seconds_until(due, now)) > 0:
            self._queue.add_after(MinAvailableCheck(key), remaining)  # an earlier dispatch's timer
            return
        phases = self._accountant.phases(key)
        running, succeeded = phases.count("Running"), phases.count("Succeeded")
        minimum = aw.scheduling.min_available
        if running + succeeded >= minimum:
            self._min_available_met.add(key)
            return
        done = current.requeuings
        why = (f"Insufficient number of Running and Completed pods, minimum={minimum}, running={running}, "
               f"completed={succeeded}, {wait} s after dispatch.")
        limit = aw.scheduling.max_requeuings
        if limit > 0 and done >= limit:
            message = f"{why} Requeued {done} times already; maxNumRequeuings is {limit}."
            log.warning("appwrapper failed", appwrapper=key, reason=status.MAX_REQUEUINGS_REACHED, message=message)
            self._decisions.note(aw, "failed", f"{status.MAX_REQUEUINGS_REACHED}: {message}")
            self._active.finish(aw, status.failed(current.raw(), now, priority=aw.priority,
                                                  reason=status.MAX_REQUEUINGS_REACHED,
                                                  message=message, preempted=True), stop=True)
            return
        self._active.requeue(aw, status.MIN_PODS_NOT_RUNNING,
                             why + lifecycle.requeue_floor_note(aw.scheduling, done + 1),
                             requeuings=done + 1, requeue_wait=lifecycle.requeue_wait(aw.scheduling, done + 1))

    def check_deadline(self, key: str) -> None:
        aw = self._queued.dispatched_now(key)
        limit = aw.scheduling.dispatch_limit_seconds if aw is not None else 0
        if aw is None or limit <= 0:
            return
        current = self._decisions.status(aw)
        now = self._clock.now()
        due = lifecycle.deadline_due(aw.scheduling, current)
        if due is not None and (remaining := lifecycle.seconds_until(due, now)) > 0:
            self._queue.add_after(DeadlineCheck(key), remaining)
            return
        message = f"Dispatch deadline exceeded: allowed to run for {limit} s (dispatchDuration.limit)."
        log.warning("appwrapper failed", appwrapper=key, reason=status.DISPATCH_DEADLINE_EXCEEDED)
        self._decisions.note(aw, "failed", f"{status.DISPATCH_DEADLINE_EXCEEDED}: {message}")
        self._active.finish(aw, status.failed(current.raw(), now, priority=aw.priority,
                                              reason=status.DISPATCH_DEADLINE_EXCEEDED,
                                              message=message, preempted=True), stop=True)
