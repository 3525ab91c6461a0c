"""Health of dispatched AppWrappers, and what is done about it: grace periods, resets that keep the gang's room,
failure when retries run out, and cleanup on time: upstream AppWrapper v1beta2's fault tolerance, with its
annotation names, for the v1beta1 AppWrappers mcad serves.

Contract (dispatcher thread only; built by ``mcad.wiring`` with the owners it acts through in one frozen
``HealthOwners`` and the loop's ``LoopTools``, a watcher of ``Active``; the policy of each AppWrapper
is ``mcad.api.faulttolerance.policy`` of its annotations and the cluster's ``FaultDefaults``):
- ``check(aw)`` runs on every event of a dispatched AppWrapper (its pods, its wrapped objects, its nodes), after
  the follower, and on its ``HealthDue`` timer. In order, the first that holds decides:
  * a Failed pod whose container's exit code is terminal (``FaultPolicy.terminal``): Failed at once, reason
    TerminalExitCode, naming the pod, the code and the node;
  * a running pod that requests a node-health rule's resource on a node whose labels make it NoExecute for it
    (``mcad.model.nodehealth``): reset at once, reason NodeUnhealthy, not counted against ``retryLimit`` (unless
    the last ``MAX_UNCOUNTED_IN_A_ROW`` resets were not counted either: then it counts, so retries stay bounded);
  * Failed pods (except those of a Job, which its own controller retries until the Job fails) or a wrapped object
    missing (deleted by hand; only where its kind is watched: ``QUIET_KINDS``, wrapped Pods, and kinds watched
    anyway for completion or failure; only once seen since this dispatch or once the dispatch is older than the
    admission grace period, so neither a slow informer nor a restart makes one up):
    Unhealthy (FailedPods, MissingComponent) at once, then, if still so after ``failureGracePeriod`` counted from
    that condition's transition, a reset (counted); recovered meanwhile, Unhealthy turns False;
  * only when ``schedulingSpec.minAvailable`` is 0 (with it, MCAD's requeuing governs start-up, unchanged): fewer
    pods than its gang declares ``admissionGracePeriod`` after dispatch is a reset (InsufficientPods); fewer of them
    Running or Succeeded ``warmupGracePeriod`` after dispatch is a reset (PodsNotReady). Once all were, start-up is
    not checked again in this dispatch.
  * cordoned or NotReady nodes under its running pods are reported (AtRisk condition, an Event), nothing more.
- ``failed_component(aw, reason, message)``: a wrapped Job reports Failed (``mcad.loop.follower``): a reset
  (FailedComponent, counted), unless an exit code of its pods is terminal.
- A reset deletes its objects and holds its room for ``retryPausePeriod`` (``Active.reset``: with ``--fit=nodes``
  on the nodes its pods were bound to, less the nodes that are NoSchedule or NoExecute for them; in aggregate, or
  in hub mode, its demand), so smaller work does not take it. Status says what failed and which reset of how many
  (``mcad.model.status.resetting``). A counted reset beyond ``retryLimit`` is Failed (RetryLimitReached) instead.
  While it pauses it is in no queue (``paused``, which the dispatcher asks before queueing anything, and after a
  restart takes its hold again, re-planned on nodes with --fit=nodes as every reservation is at a restart); when
  the pause ends it is queued at its place (its old pods, while they remain, keep it out of a cycle, as a
  requeued one) and dispatched like any other.
- Resets of one namespace's AppWrappers are bounded: at most ``FaultDefaults.max_namespace_resets_per_minute`` in
  any minute (``mcad.model.resetbudget``, on the clock's monotonic time). A reset beyond it is deferred: nothing is
  deleted, the AppWrapper stays as it is, its Unhealthy condition (its cause's reason) and its status message say
  the reset waits for the namespace's bound, an Event says so once, and the reset is tried again when the
  namespace has room (a ``HealthDue`` timer; what it was is kept in memory per AppWrapper, dropped with its
  dispatch; after a restart the causes are found again). Failures (retries used up, a terminal exit code) are not
  deferred: they delete nothing to re-create.
- Pods of a reset or failed AppWrapper still terminating ``forcefulDeletionGracePeriod`` after that (and after
  their own grace period) are force-deleted.
- ``finished(aw)``, for a final AppWrapper that was dispatched: a Completed one's objects are deleted
  ``successTTLDuration`` after completion, a Failed one's ``deletionOnFailureGracePeriodDuration`` after the failure
  (0: at once, as the failure is decided); DeletingResources records it, so it is done once. With
  ``delete-when-finished`` the AppWrapper itself is deleted then. A Failed one kept for debugging holds no
  reservation: its pods that still run use what they use, as any pod does, and nothing more is held for it.
  A Failed one that was never dispatched (an invalid spec, a protected namespace) has no objects; with
  ``delete-when-finished`` it is itself deleted ``deletionOnFailureGracePeriodDuration`` after its failure.
- Everything it waits for is a ``HealthDue`` timer computed from time stamps in status, so it survives restarts;
  what it remembers in memory (start-up passed, objects seen) is per dispatch and dropped with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Protocol

import structlog

from mcad.api import faulttolerance
from mcad.api.appwrapper import ACTIVE_STATES, AppWrapperView, State
from mcad.api.faulttolerance import FaultDefaults, FaultPolicy, format_duration
from mcad.api.resources import ResourceVector
from mcad.api.views import PodView
from mcad.api.wrappedview import NotSynced
from mcad.k8s import events
from mcad.k8s.informer import Store
from mcad.loop.active import Active
from mcad.loop.decisions import Decisions
from mcad.loop.queued import Queued
from mcad.loop.sites import Sites
from mcad.loop.tools import LoopTools
from mcad.model import lifecycle, status
from mcad.model.accounting import Accountant
from mcad.model.keys import DISPATCH, HealthDue
from mcad.model.plans import Plan
from mcad.model.resetbudget import ResetBudget
from mcad.model.status import (
    FAILED_COMPONENT,
    FAILED_PODS,
    GRACED,
    INSUFFICIENT_PODS,
    MISSING_COMPONENT,
    NODE_UNHEALTHY,
    PODS_NOT_READY,
)

log = structlog.get_logger("mcad.loop.health")

# Resets not counted against retryLimit (sick nodes) in a row after which the next one counts: a bound on a gang
# dispatched onto sick nodes again and again.
MAX_UNCOUNTED_IN_A_ROW = 3
# Kinds watched for the sole purpose of seeing one deleted by hand: their objects rarely change once created, so a
# watch costs little. Other kinds (Jobs, Deployments, ...: a status that changes with every pod) are judged only
# when their informer runs anyway (for completion or failure): watching them for a deletion that rarely comes would
# cost an event stream as busy as the pods'.
QUIET_KINDS = frozenset({("v1", "ConfigMap"), ("v1", "Service"), ("v1", "PersistentVolumeClaim")})
# How many pods, nodes or objects a message names before "and N more".
NAMED = 3


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A reset waiting for its namespace's bound: what ``_reset`` was asked."""

    reason: str
    what: str
    counted: bool
    cause_reason: str


class HealthWriter(Protocol):
    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None: ...


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMED])
    return shown + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "")


def _pod_failure(pod: PodView) -> str:
    assert pod.failure is not None
    return f"pod {pod.name} {pod.failure.describe()}" + (f" on node {pod.node_name}" if pod.node_name else "")


@dataclass(frozen=True, slots=True)
class HealthOwners:
    """What ``Health`` reads and acts through: AppWrappers are taken back through ``active``, put back in the
    queue through ``queued``, told through ``decisions``; their pods and nodes are the accountant's, their objects
    the sites'."""

    active: Active
    queued: Queued
    decisions: Decisions
    appwrappers: Store[AppWrapperView]
    accountant: Accountant
    sites: Sites


class Health:
    def __init__(self, owners: HealthOwners, tools: LoopTools, *, defaults: FaultDefaults, writer: HealthWriter,
                 by_nodes: bool) -> None:
        self._active = owners.active
        self._queued = owners.queued
        self._decisions = owners.decisions
        self._appwrappers = owners.appwrappers
        self._accountant = owners.accountant
        self._sites = owners.sites
        self._defaults = defaults
        self._writer = writer
        self._writes = tools.writes
        self._queue = tools.queue
        self._clock = tools.clock
        self._metrics = tools.metrics
        self._by_nodes = by_nodes  # --fit=nodes: a reset holds room on nodes (else an amount)
        self._default_policy = faulttolerance.policy({}, defaults)
        # Per dispatch: those whose pods all ran (start-up not checked again), and the items seen to exist.
        self._started: set[str] = set()
        self._seen: dict[str, set[int]] = {}
        self._reset_budget = ResetBudget(defaults.max_namespace_resets_per_minute)
        # Per dispatch: the reset each AppWrapper waits to do for its namespace's bound, as _reset's arguments.
        self._deferred: dict[str, _Deferred] = {}

    def policy(self, aw: AppWrapperView) -> FaultPolicy:
        if not aw.fault_annotations:
            return self._default_policy  # most AppWrappers: nothing to parse on each of their events
        return faulttolerance.policy(aw.fault_annotations, self._defaults)

    # -- watcher of Active -----------------------------------------------------------------------------------------

    def dispatched(self, aw: AppWrapperView) -> None:
        self.undispatched(aw.key)
        self._queue.add_after(HealthDue(aw.key), min(self.policy(aw).admission_grace, lifecycle.MAX_TIMER_SECONDS))

    def undispatched(self, key: str) -> None:
        self._started.discard(key)
        self._seen.pop(key, None)
        self._deferred.pop(key, None)

    # -- timers ----------------------------------------------------------------------------------------------------

    def due(self, key: str) -> None:
        aw = self._appwrappers.get(key)
        if aw is None or aw.deleting:
            return
        current = self._decisions.status(aw)
        if current.resetting_since:
            self.paused(aw)
        elif current.state in (State.COMPLETED, State.FAILED):
            self.finished(aw)
        elif self._queued.dispatched_now(key) is not None:
            deferred = self._deferred.pop(key, None)
            if deferred is not None and current.state in ACTIVE_STATES:
                self._reset(aw, self.policy(aw), deferred.reason, deferred.what, counted=deferred.counted,
                            cause_reason=deferred.cause_reason)
            else:
                self.check(aw)

    def _after(self, key: str, seconds: float) -> None:
        self._queue.add_after(HealthDue(key), min(max(seconds, 0.0), lifecycle.MAX_TIMER_SECONDS))

    def _elapsed(self, stamp: str | None, now: datetime) -> float:
        since = lifecycle.parse_time(stamp)
        return (now - since).total_seconds() if since is not None else 0.0

    # -- a running AppWrapper --------------------------------------------------------------------------------------

    def check(self, aw: AppWrapperView) -> None:
        current = self._decisions.status(aw)
        if current.state not in ACTIVE_STATES or aw.key in self._queued.pending:
            return
        policy = self.policy(aw)
        pods = self._accountant.pods(aw.key)
        if (terminal := self._terminal(pods, policy)) is not None:
            self._fail(aw, policy, status.TERMINAL_EXIT_CODE, f"{terminal}.")
            return
        evicting = self._accountant.evicted_pods(aw.key)
        if evicting:
            labels = sorted({f"{pod.node_name} ({verdict.describe()})" for pod, verdict in evicting})
            self._reset(aw, policy, NODE_UNHEALTHY,
                        f"pod(s) {_names(sorted(pod.name for pod, _ in evicting))} run on node(s) labelled "
                        f"{_names(labels)}, which no pod of theirs may run on", counted=False)
            return
        now = self._clock.now()
        cause = self._graced_cause(aw, pods, policy, now)
        if cause is not None:
            reason, what = cause
            raw = current.raw()
            since = status.unhealthy_since(raw, reason) if current.unhealthy == reason else None
            if since is None:
                message = f"{what}; reset in {format_duration(policy.failure_grace)} unless it recovers."
                self._decisions.decide(aw, status.unhealthy(raw, now, reason=reason, message=message))
                self._decisions.event(aw, events.UNHEALTHY, f"{reason}: {message}")
                self._after(aw.key, policy.failure_grace)
                return
            left = policy.failure_grace - self._elapsed(since, now)
            if left > 0:
                self._after(aw.key, left)
                return
            self._reset(aw, policy, reason, what, counted=True)
            return
        if current.unhealthy in GRACED:
            self._decisions.decide(aw, status.healthy(current.raw(), now))
        if self._start_up(aw, pods, policy, now):
            return
        self._report_nodes(aw, pods, now)

    def failed_component(self, aw: AppWrapperView, reason: str, message: str) -> None:
        """A wrapped Job reports Failed: reset, or Failed when retries (or an exit code) say so."""
        policy = self.policy(aw)
        if (terminal := self._terminal(self._accountant.pods(aw.key), policy)) is not None:
            self._fail(aw, policy, status.TERMINAL_EXIT_CODE, f"{message}; {terminal}.")
            return
        self._reset(aw, policy, FAILED_COMPONENT, message, counted=True, cause_reason=reason)

    def _graced_cause(self, aw: AppWrapperView, pods: Sequence[PodView], policy: FaultPolicy,
                      now: datetime) -> tuple[str, str] | None:
        failed = sorted((pod for pod in pods if pod.failure is not None and pod.failure.controller_kind != "Job"),
                        key=lambda pod: pod.name)
        if failed:
            more = f" (and {len(failed) - 1} more failed pod(s))" if len(failed) > 1 else ""
            return FAILED_PODS, _pod_failure(failed[0]) + more
        missing = self._missing(aw, pods, policy, now)
        if missing:
            return MISSING_COMPONENT, f"wrapped object(s) {_names(missing)} no longer exist"
        return None

    def _missing(self, aw: AppWrapperView, pods: Sequence[PodView], policy: FaultPolicy, now: datetime) -> list[str]:
        wrapped = self._sites.wrapped_of(aw.key)
        dispatched = lifecycle.dispatched_at(self._decisions.status(aw))
        if wrapped is None or dispatched is None:
            return []
        old = (now - dispatched).total_seconds() >= policy.admission_grace
        seen = self._seen.setdefault(aw.key, set())
        pod_names = {pod.name for pod in pods}
        missing = []
        for index, item in enumerate(aw.items):
            if not (item.name and item.api_version and item.kind):
                continue
            if (item.api_version, item.kind) == ("v1", "Pod"):
                exists: bool | None = item.name in pod_names  # the pods' informer knows, no other watch needed
            else:
                if not wrapped.watches(item.api_version, item.kind, waiter=aw.key,
                                       start=(item.api_version, item.kind) in QUIET_KINDS):
                    continue  # not watched (yet, or at all): no verdict
                found = wrapped.lookup(item.api_version, item.kind, aw.namespace, item.name)
                if isinstance(found, NotSynced):
                    continue
                exists = found is not None and found.owner_uid == aw.uid
            if exists:
                seen.add(index)
            elif index in seen or old:
                missing.append(f"{item.kind} {item.name}")
        return missing

    def _start_up(self, aw: AppWrapperView, pods: Sequence[PodView], policy: FaultPolicy, now: datetime) -> bool:
        """The admission and warmup checks (True when they reset it)."""
        key = aw.key
        if key in self._started or aw.scheduling.min_available > 0:
            return False
        expected = sum(group.count for group in aw.gang)
        dispatched = lifecycle.dispatched_at(self._decisions.status(aw))
        if expected <= 0 or dispatched is None:
            self._started.add(key)
            return False
        exist = sum(1 for pod in pods if not pod.deleting)
        ready = sum(1 for pod in pods if pod.phase in ("Running", "Succeeded") and not pod.deleting)
        if ready >= expected:
            self._started.add(key)
            return False
        age = (now - dispatched).total_seconds()
        if age >= policy.warmup_grace:
            self._reset(aw, policy, PODS_NOT_READY,
                        f"{ready} of its {expected} pods Running or Succeeded "
                        f"{format_duration(policy.warmup_grace)} after dispatch", counted=True)
            return True
        if exist < expected and age >= policy.admission_grace:
            self._reset(aw, policy, INSUFFICIENT_PODS,
                        f"{exist} of its {expected} pods exist {format_duration(policy.admission_grace)} after "
                        f"dispatch", counted=True)
            return True
        next_check = policy.admission_grace if exist < expected and age < policy.admission_grace \
            else policy.warmup_grace
        self._after(key, next_check - age)
        return False

    def _report_nodes(self, aw: AppWrapperView, pods: Sequence[PodView], now: datetime) -> None:
        cordoned, not_ready = set(), set()
        for pod in pods:
            if pod.terminal or not pod.node_name:
                continue
            node = self._accountant.ledger.node(pod.node_name)
            if node is None:
                continue  # gone: its pods go with it
            if not node.ready:
                not_ready.add(pod.node_name)
            elif node.unschedulable:
                cordoned.add(pod.node_name)
        reason, parts = "", []
        if not_ready:
            reason = "NodeNotReady"
            parts.append(f"node(s) {_names(sorted(not_ready))} not Ready")
        if cordoned:
            reason = reason or "NodeCordoned"
            parts.append(f"node(s) {_names(sorted(cordoned))} cordoned")
        current = self._decisions.status(aw)
        if not reason and not current.at_risk:
            return  # the usual case: nothing to say, and the status is not unpacked
        message = ("Its running pods are on " + " and ".join(parts) + ".") if parts else "Its nodes are fine again."
        raw = current.raw()
        new = status.at_risk(raw, now, reason=reason, message=message)
        if new != raw:
            self._decisions.decide(aw, new)
            if reason:
                self._decisions.event(aw, events.AT_RISK, message)

    @staticmethod
    def _terminal(pods: Sequence[PodView], policy: FaultPolicy) -> str | None:
        """What ends it at once: the first pod that failed with a terminal exit code, and why it is one."""
        for pod in pods:
            failure = pod.failure
            if failure is None or failure.exit_code is None or not policy.terminal(failure.exit_code):
                continue
            why = (f"listed in {faulttolerance.short(faulttolerance.TERMINAL_EXIT_CODES)}"
                   if failure.exit_code in policy.terminal_exit_codes
                   else f"not in {faulttolerance.short(faulttolerance.RETRYABLE_EXIT_CODES)}")
            return f"{_pod_failure(pod)}: exit code {failure.exit_code} is terminal ({why})"
        return None

    # -- what is done ----------------------------------------------------------------------------------------------

    def _reset(self, aw: AppWrapperView, policy: FaultPolicy, reason: str, what: str, *, counted: bool,
               cause_reason: str = "") -> None:
        key = aw.key
        current = self._decisions.status(aw)
        done = current.resetting_count
        asked = _Deferred(reason, what, counted, cause_reason)
        if not counted and self._uncounted_in_a_row(current.raw()) >= MAX_UNCOUNTED_IN_A_ROW:
            # Dispatched onto sick nodes again and again (a rule the fit cannot honour: --fit=aggregate): from
            # here on such resets count, so retryLimit bounds them too.
            counted = True
            what += f" (counted: {MAX_UNCOUNTED_IN_A_ROW} resets in a row were not)"
        if counted and policy.retry_limit == 0:
            # No retries asked for: it fails as it would without fault tolerance, with its cause's own reason (a
            # wrapped Job's BackoffLimitExceeded, as upstream MCAD reports it).
            self._fail(aw, policy, cause_reason or reason, f"{what}. retryLimit is 0: it is not reset.")
            return
        if counted and done >= policy.retry_limit:
            self._fail(aw, policy, status.RETRY_LIMIT_REACHED,
                       f"{what}. Reset {done} time(s) already; retryLimit is {policy.retry_limit}.")
            return
        wait = self._reset_budget.take(aw.namespace, self._clock.monotonic())
        if wait > 0:
            self._defer(aw, asked, wait)
            return
        self._deferred.pop(key, None)
        now = self._clock.now()
        which = f"reset {done + 1} of {policy.retry_limit}" if counted else "not counted against retryLimit"
        hold = self._hold(aw)
        where = f"on node(s) {_names(sorted({node for node, _, _ in hold}))}" if hold else "in aggregate"
        message = (f"Resetting ({which}): {what}. Its objects are deleted and it is dispatched again after a "
                   f"{format_duration(policy.retry_pause)} pause; meanwhile its room is held {where}.")
        dispatched = lifecycle.dispatched_at(current)
        self._metrics.reset(reason, (now - dispatched).total_seconds() if dispatched is not None else 0.0)
        log.warning("appwrapper reset", appwrapper=key, reason=reason, cause=cause_reason or reason, counted=counted,
                    message=message)
        self._decisions.event(aw, events.RESET, message)
        self._active.reset(aw, status.resetting(current.raw(), now, priority=aw.priority, reason=reason,
                                                message=message, counted=counted), hold)
        self._after(key, min(policy.retry_pause, policy.forceful_deletion_grace))

    def _defer(self, aw: AppWrapperView, asked: _Deferred, wait: float) -> None:
        """The namespace has had its resets of the minute: this one waits (see the module docstring)."""
        per_minute = self._reset_budget.per_minute
        # One message while it waits (no countdown in it): each retry that finds no room writes nothing.
        message = (f"{asked.what}. Its reset is deferred: namespace {aw.namespace} has had {per_minute} resets in "
                   f"the last minute, the most the cluster allows (--max-resets-per-namespace-per-minute); it is "
                   f"reset once the namespace has room.")
        first = aw.key not in self._deferred
        self._deferred[aw.key] = asked
        current = self._decisions.status(aw)
        self._decisions.decide(aw, status.reset_deferred(current.raw(), self._clock.now(), reason=asked.reason,
                                                         message=message))
        if first:
            log.warning("appwrapper reset deferred", appwrapper=aw.key, reason=asked.reason,
                        namespace=aw.namespace, per_minute=per_minute, wait_seconds=round(wait, 3))
            self._metrics.reset_deferred(asked.reason)
            self._decisions.event(aw, events.UNHEALTHY, message)
        self._after(aw.key, wait)

    @staticmethod
    def _uncounted_in_a_row(raw: dict[str, object]) -> int:
        history = raw.get("resets")
        run = 0
        for entry in reversed(history if isinstance(history, list) else []):
            if not isinstance(entry, dict) or entry.get("counted") is not False:
                break
            run += 1
        return run

    def _fail(self, aw: AppWrapperView, policy: FaultPolicy, reason: str, message: str) -> None:
        current = self._decisions.status(aw)
        now = self._clock.now()
        keep = policy.deletion_on_failure_grace
        if keep > 0:
            message += (f" Its objects are kept for {format_duration(keep)} "
                        f"({faulttolerance.short(faulttolerance.DELETION_ON_FAILURE_GRACE)}).")
        self._metrics.fault_failure(reason)
        log.warning("appwrapper failed", appwrapper=aw.key, reason=reason, message=message)
        self._decisions.note(aw, "failed", f"{reason}: {message}")
        self._active.finish(aw, status.failed(current.raw(), now, priority=aw.priority, reason=reason,
                                              message=message), stop=keep <= 0)
        self._after(aw.key, keep if keep > 0 else policy.forceful_deletion_grace)

    def _hold(self, aw: AppWrapperView) -> Plan:
        """Where its room is held during the pause: the nodes its pods were bound to, less sick ones for them."""
        if self._sites.where(aw.key) or not self._by_nodes:
            return ()
        by_node: dict[tuple[str, ResourceVector], int] = {}
        for pod in self._accountant.pods(aw.key):
            if not pod.node_name:
                continue
            verdict = self._accountant.node_verdict(pod.node_name, pod.requests)
            if self._accountant.ledger.node(pod.node_name) is None or (verdict is not None
                                                                       and verdict.effect.keeps_off):
                continue
            by_node[(pod.node_name, pod.requests)] = by_node.get((pod.node_name, pod.requests), 0) + 1
        return tuple((node, requests, count) for (node, requests), count in sorted(
            by_node.items(), key=lambda entry: entry[0][0]))

    # -- the retry pause -------------------------------------------------------------------------------------------

    def paused(self, aw: AppWrapperView) -> bool:
        """True while ``aw`` pauses after a reset (it must not be queued); when the pause is over, queues it and
        says False."""
        current = self._decisions.status(aw)
        if not current.resetting_since or aw.deleting:
            return False
        policy = self.policy(aw)
        if not self._accountant.holds(aw.key):
            self._active.reserve(aw)  # after a restart (the rebuild re-plans it on nodes)
        began = lifecycle.parse_time(current.resetting_since)
        # A pause whose start is not known (a status written by someone else) ends now rather than never.
        left = policy.retry_pause - (self._clock.now() - began).total_seconds() if began is not None else 0.0
        self._force_stuck(aw, current.resetting_since, policy)
        if left > 0:
            self._after(aw.key, left)
            return True
        self._decisions.decide(aw, status.resume(current.raw(), self._clock.now()))
        self._active.release(aw.key)
        self._queued.enqueue(aw)
        self._queued.announce_later(aw.key)
        self._queue.add(DISPATCH)
        return False  # its pause is over: it is queued now

    def _force_stuck(self, aw: AppWrapperView, since: str, policy: FaultPolicy) -> None:
        """Its pods still terminating ``forcefulDeletionGracePeriod`` after ``since`` (and past their own grace
        period) are force-deleted; a timer is set for those not due yet."""
        now = self._clock.now()
        waited = self._elapsed(since, now)
        stuck = [pod for pod in self._accountant.pods(aw.key) if pod.deleting and not pod.terminal]
        if not stuck:
            return
        if waited < policy.forceful_deletion_grace:
            self._after(aw.key, policy.forceful_deletion_grace - waited)
            return
        epoch = now.timestamp()
        for pod in stuck:
            if pod.grace_ends and pod.grace_ends > epoch:
                self._after(aw.key, pod.grace_ends - epoch)
                continue
            log.warning("force-deleting a pod stuck terminating", appwrapper=aw.key, pod=pod.name,
                        node=pod.node_name)
            self._writes.submit(aw.key, partial(self._writer.force_delete_pod, pod.namespace, pod.name, pod.uid),
                                tenant=aw.namespace)

    # -- cleanup on time -------------------------------------------------------------------------------------------

    def finished(self, aw: AppWrapperView) -> None:
        """A final AppWrapper: its objects (and, if asked, itself) deleted on time (see the module docstring)."""
        current = self._decisions.status(aw)
        if not current.first_dispatch:
            self._failed_before_dispatch(aw)
            return
        raw = current.raw()
        policy = self.policy(aw)
        if status.resources_deleted_already(raw):
            if policy.delete_when_finished:
                self._delete_appwrapper(aw)
            return
        completed = current.state == State.COMPLETED
        final = status.latest(raw.get("conditions"), status.COMPLETED if completed else status.FAILED)
        stamp = final.get("lastTransitionMicroTime") if final is not None else None
        wait = policy.success_ttl if completed else policy.deletion_on_failure_grace
        now = self._clock.now()
        left = wait - self._elapsed(stamp if isinstance(stamp, str) else None, now)
        if not completed:
            self._force_stuck(aw, stamp if isinstance(stamp, str) else "", policy)
        if left > 0:
            self._after(aw.key, left)
            return
        name = faulttolerance.short(faulttolerance.SUCCESS_TTL if completed
                                    else faulttolerance.DELETION_ON_FAILURE_GRACE)
        message = f"Its objects were deleted {format_duration(wait)} after it {current.state.lower()} ({name})."
        self._sites.delete_objects(aw, self._active.object_uids(aw.key))
        self._decisions.decide(aw, status.resources_deleted(raw, now, reason="SuccessTTLExpired" if completed
                                                            else "DeletionGraceExpired", message=message))
        self._decisions.event(aw, events.CLEANED_UP, message)
        if policy.delete_when_finished:
            self._delete_appwrapper(aw)

    def _failed_before_dispatch(self, aw: AppWrapperView) -> None:
        """Failed without a dispatch (an invalid spec, a protected namespace): nothing of it exists, so only the
        AppWrapper itself goes, when asked, after the same deletion-on-failure grace as any failed one."""
        current = self._decisions.status(aw)
        policy = self.policy(aw)
        if current.state != State.FAILED or not policy.delete_when_finished:
            return
        final = status.latest(current.raw().get("conditions"), status.FAILED)
        stamp = final.get("lastTransitionMicroTime") if final is not None else None
        left = policy.deletion_on_failure_grace - self._elapsed(stamp if isinstance(stamp, str) else None,
                                                                self._clock.now())
        if left > 0:
            self._after(aw.key, left)
            return
        self._delete_appwrapper(aw)

    def _delete_appwrapper(self, aw: AppWrapperView) -> None:
        log.info("deleting a finished appwrapper, as its annotation asks", appwrapper=aw.key)
        self._writes.submit(aw.key, lambda: self._writer.delete(aw.api_version, "AppWrapper", aw.namespace, aw.name,
                                                                uid=aw.uid), tenant=aw.namespace)

