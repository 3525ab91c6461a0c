"""AppWrapper status, as pure functions: from the current status and a decision to the desired status.

Contract:
- Field names and vocabulary are upstream MCAD's (state, canrun, queuejobstate, conditions with micro-time
  stamps, controllerfirsttimestamp, pending/running/Succeeded/failed), so `kubectl describe`, the codeflare SDK
  and existing scripts keep working. ``message`` (declared but never set upstream) carries the one-line reason
  shown by ``kubectl get appwrappers``.
- Conditions form a chronological log (oldest first) with at most one entry per (type, reason), the key
  upstream replaces Dispatched and PreemptCandidate entries by (its other conditions also key on the message,
  so each new message appends an entry without bound). The latest entry of a type (the last one in the log)
  is its current value, and the one every reader means (``latest``). Asserting a condition:
  - whose (type, reason) has no entry appends one: a type whose reason changes keeps its past reasons as
    history (a requeued AppWrapper's ``PreemptionTriggered`` Backoff outlives its later
    ``AppWrapperNotRunnable.`` Backoff, as upstream's "Fail Fast Preemption" spec expects);
  - that equals the latest entry of its type in status, reason and message changes nothing, not even its
    timestamps, so a decision that did not change yields a status equal to the input and the caller can skip
    the write; unless it records a new event (``refresh``: a requeue, a preemption), which re-stamps it;
  - otherwise replaces its (type, reason) entry with one at the end of the log. A new message alone (the
    latest entry of its type, same status) moves ``lastUpdateMicroTime`` and keeps
    ``lastTransitionMicroTime``; a new status, a return to an older reason or a new event sets both.
  The log keeps at most ``MAX_CONDITIONS`` entries, dropping the oldest first but never the latest entry of a
  type (unless a status written by someone else holds more types than that).
- ``pendingpodconditions`` (written with the pod counts) names the dispatched AppWrapper's Pending pods the
  scheduler could not place, with their ``PodScheduled=False`` condition, as upstream writes it: at most
  ``MAX_PENDING_PODS`` pods, sorted by name, messages cut to ``views.MAX_SCHEDULER_MESSAGE`` characters; absent
  when none is unschedulable, and dropped at every (re)dispatch, requeue and final state.
- ``estimatedStart`` (RFC 3339, to the nearest second) is when a queued AppWrapper is expected to start
  (``mcad.model.estimate``); when that is not known, it is absent and ``estimateWhy`` says why (``with_estimate``).
  Both are carried along while it waits and dropped when it is dispatched, requeued or reaches a final state.
- Every builder returns a new dict; inputs are never mutated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from mcad.api.appwrapper import State
from mcad.api.views import UNSCHEDULABLE
from mcad.api.views import Unschedulable as Unschedulable  # re-exported: the verdicts with_pod_counts takes

# Condition types, reasons and messages of upstream MCAD (mcad-upstream.md §1.3).
INIT = "Init"
QUEUEING, AWAITING_HEAD_OF_LINE = "Queueing", "AwaitingHeadOfLine"
HEAD_OF_LINE, FRONT_OF_QUEUE = "HeadOfLine", "FrontOfQueue."
BACKOFF, NOT_RUNNABLE = "Backoff", "AppWrapperNotRunnable."
INSUFFICIENT_RESOURCES = "Insufficient resources to dispatch AppWrapper."
DISPATCHED, RUNNABLE = "Dispatched", "AppWrapperRunnable"
RUNNING, PODS_RUNNING = "Running", "PodsRunning"
FAILED = "Failed"
ITEM_CREATION_FAILURE = "ItemCreationFailure."
INVALID_SPEC = "InvalidSpec"
PROTECTED_NAMESPACE = "ProtectedNamespace"  # beyond upstream: the kube-* namespaces, the controller's own
PREEMPT_CANDIDATE = "PreemptCandidate"
MIN_PODS_NOT_RUNNING = "MinPodsNotRunning"
DISPATCH_DEADLINE_EXCEEDED = "DispatchDeadlineExceeded"
PREEMPTED_BY_QUOTA_RECLAIM = "PreemptedByQuotaReclaim"  # beyond upstream: borrowed quota taken back
PREEMPTED_BY_PRIORITY = "PreemptedByHigherPriority"  # beyond upstream, which only planned priority preemption
PREEMPTION_TRIGGERED = "PreemptionTriggered"  # upstream's Backoff reason for an AppWrapper sent back to the queue
MAX_REQUEUINGS_REACHED = "MaxRequeuingsReached"
RUNNING_HOLD_COMPLETION, SOME_ITEMS_COMPLETED = "RunningHoldCompletion", "SomeItemsCompleted"
COMPLETED, PODS_COMPLETED = "Completed", "PodsCompleted"
# Fault tolerance (loop.health), with upstream AppWrapper v1beta2's condition types: Unhealthy (True while a failure
# is in its grace period, or was acted on; reason = its cause), Resetting (True during the retry pause), and
# DeletingResources (its objects deleted on time: success TTL, deletion-on-failure grace). AtRisk: cordoned or
# NotReady nodes under its running pods (reported, nothing done).
UNHEALTHY, RESETTING, DELETING_RESOURCES, AT_RISK = "Unhealthy", "Resetting", "DeletingResources", "AtRisk"
RETRY_LIMIT_REACHED, TERMINAL_EXIT_CODE = "RetryLimitReached", "TerminalExitCode"
# Unhealthy reasons (mcad.loop.health): what failed. GRACED ones wait failureGracePeriod before the reset (their own
# controller may recover them); the others are acted on at once.
FAILED_PODS, INSUFFICIENT_PODS, PODS_NOT_READY = "FailedPods", "InsufficientPods", "PodsNotReady"
FAILED_COMPONENT, MISSING_COMPONENT, NODE_UNHEALTHY = "FailedComponent", "MissingComponent", "NodeUnhealthy"
GRACED = (FAILED_PODS, MISSING_COMPONENT)
PAUSE_ENDED = "PauseEnded"
# How many resets ``status.resets`` remembers (the oldest go first).
MAX_RESETS_KEPT = 10
# Hub mode, beyond upstream: whether the worker it was dispatched to can be reached, and why not.
CLUSTER_AVAILABLE = "ClusterAvailable"
CLUSTER_UNREACHABLE_TIMEOUT = "ClusterUnreachableTimeout"
# Beyond upstream: a queued AppWrapper's expected start, or why it is not known.
ESTIMATED_START, ESTIMATE_WHY = "estimatedStart", "estimateWhy"


# 11 condition types are written: 20 entries keep every current value plus at least 9 past reasons (a requeued,
# preempted AppWrapper in a worker that went away: Backoff, PreemptCandidate and ClusterAvailable each with two or
# three reasons), while the log stays a few KiB, which every status write and every watch event carries.
MAX_CONDITIONS = 20
# A gang that does not fit shows its pattern in a few pods (they usually share one scheduler message); `pending`
# still counts them all. 10 entries of at most 1 KiB keep the status small.
MAX_PENDING_PODS = 10


def micro_time(now: datetime) -> str:
    """RFC 3339 with microseconds, as metav1.MicroTime serialises."""
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def latest(conditions: Iterable[Any] | None, type_: str) -> Mapping[str, Any] | None:
    """The current entry of ``type_``: its last one in the log (earlier ones are history), or None."""
    found: Mapping[str, Any] | None = None
    for condition in conditions or ():
        if isinstance(condition, Mapping) and condition.get("type") == type_:
            found = condition
    return found


def with_condition(conditions: list[dict[str, Any]], type_: str, now: datetime, *, reason: str = "",
                   message: str = "", status: str = "True", refresh: bool = False) -> list[dict[str, Any]]:
    """The log with ``type_`` asserted (see the module docstring); ``refresh`` for a new event."""
    current = latest(conditions, type_) or {}
    same = bool(current) and current.get("reason", "") == reason and current.get("status") == status
    if same and current.get("message", "") == message and not refresh:
        return conditions
    stamp = micro_time(now)
    # Only a new message for the same state: it has been in that state since its last transition.
    since = current.get("lastTransitionMicroTime") if same and not refresh else None
    entry: dict[str, Any] = {"type": type_, "status": status, "lastUpdateMicroTime": stamp,
                             "lastTransitionMicroTime": since or stamp}
    if reason:
        entry["reason"] = reason
    if message:
        entry["message"] = message
    kept = [c for c in conditions if not (c.get("type") == type_ and c.get("reason", "") == reason)]
    return _bounded([*kept, entry])


def _bounded(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most MAX_CONDITIONS entries: the oldest go first, the latest entry of each type last of all."""
    excess = len(conditions) - MAX_CONDITIONS
    if excess <= 0:
        return conditions
    current = {c.get("type"): i for i, c in enumerate(conditions)}  # the last index of each type
    history = [i for i in range(len(conditions)) if current.get(conditions[i].get("type")) != i]
    drop = set(history[:excess])
    if len(drop) < excess:  # more types than entries allowed: only a status written by someone else has that
        drop |= set(sorted(set(range(len(conditions))) - drop)[:excess - len(drop)])
    return [c for i, c in enumerate(conditions) if i not in drop]


def with_estimate(status: Mapping[str, Any], *, at: datetime | None, why: str = "") -> dict[str, Any]:
    """A queued AppWrapper's expected start (``at``), or, when it is not known (None), why not."""
    new = dict(status)
    if at is None:
        new.pop(ESTIMATED_START, None)
        new[ESTIMATE_WHY] = why
    else:
        new[ESTIMATED_START] = (at + timedelta(milliseconds=500)).strftime("%Y-%m-%dT%H:%M:%SZ")  # to the second
        new.pop(ESTIMATE_WHY, None)
    return new


def _without_estimate(status: dict[str, Any]) -> dict[str, Any]:
    """No longer queued: no expected start (``status`` is a new dict of the caller's)."""
    status.pop(ESTIMATED_START, None)
    status.pop(ESTIMATE_WHY, None)
    return status


def _base(status: Mapping[str, Any], now: datetime, priority: int) -> dict[str, Any]:
    new = dict(status)
    new["conditions"] = [dict(c) for c in status.get("conditions") or []]
    new.setdefault("controllerfirsttimestamp", micro_time(now))
    new["systempriority"] = float(priority)
    for count in ("pending", "running", "Succeeded", "failed", "numberOfRequeueings", "requeueingTimeInSeconds"):
        new.setdefault(count, 0)
    return new


def _enqueued(status: Mapping[str, Any], now: datetime, priority: int) -> dict[str, Any]:
    new = _base(status, now, priority)
    conditions = new["conditions"]
    if latest(conditions, INIT) is None:
        conditions = with_condition(conditions, INIT, now)
    conditions = with_condition(conditions, QUEUEING, now, reason=AWAITING_HEAD_OF_LINE)
    new["conditions"] = with_condition(conditions, HEAD_OF_LINE, now, reason=FRONT_OF_QUEUE)
    new.update(state=State.PENDING.value, canrun=False)
    return new


def queued(status: Mapping[str, Any], now: datetime, *, priority: int, why: str) -> dict[str, Any]:
    """Not dispatched this cycle: Backoff with upstream's reason, and ``why`` (what is short and by how much)."""
    new = _enqueued(status, now, priority)
    new["conditions"] = with_condition(new["conditions"], BACKOFF, now, reason=NOT_RUNNABLE,
                                       message=f"{INSUFFICIENT_RESOURCES} {why}")
    new.update(queuejobstate=BACKOFF, message=why)
    return new


def dispatched(status: Mapping[str, Any], now: datetime, *, priority: int, requeue_wait: int = 0,
               cluster: str = "") -> dict[str, Any]:
    """Every wrapped object was created: the AppWrapper runs and keeps its capacity reserved.

    The Dispatched condition's transition time is this dispatch (requeue timers count from it);
    ``controllerfirstdispatchtimestamp`` is the first one (the dispatch deadline counts from it).
    ``requeue_wait`` is the current minAvailable wait, recorded so that a restart keeps the timer.
    ``cluster`` (hub mode) is the worker its objects went to, kept as ``targetClusterName``.
    """
    new = _enqueued(status, now, priority)
    conditions = [c for c in new["conditions"] if c.get("type") not in (DISPATCHED, RUNNING, CLUSTER_AVAILABLE)]
    conditions = with_condition(conditions, DISPATCHED, now, reason=RUNNABLE)
    unhealthy_now = latest(conditions, UNHEALTHY)
    if unhealthy_now is not None and unhealthy_now.get("status") == "True":
        # Dispatched again after a reset: what was unhealthy is gone with the objects it was about.
        conditions = with_condition(conditions, UNHEALTHY, now, reason=str(unhealthy_now.get("reason", "")),
                                    message="Reset; dispatched again.", status="False")
    new["conditions"] = conditions
    new.update(state=State.RUNNING.value, canrun=True, queuejobstate=DISPATCHED, pending=0, running=0,
               Succeeded=0, failed=0)
    new.setdefault("controllerfirstdispatchtimestamp", micro_time(now))
    new.pop("pendingpodconditions", None)
    if requeue_wait:
        new["requeueingTimeInSeconds"] = requeue_wait
    new.pop("message", None)
    if cluster:
        new["targetClusterName"] = cluster
    return _without_estimate(new)


def _asserted(old: Mapping[str, Any], type_: str, now: datetime, /, **condition: Any) -> dict[str, Any]:
    """``old`` with one condition asserted (``with_condition``: reason, message, status), nothing else changed."""
    new = dict(old)
    new["conditions"] = with_condition([dict(c) for c in old.get("conditions") or []], type_, now, **condition)
    return new


def cluster_available(status: Mapping[str, Any], now: datetime, *, available: bool, reason: str,
                      message: str = "") -> dict[str, Any]:
    """Hub mode: the health of the worker it runs in, as a condition (its state is kept: it may come back)."""
    return _asserted(status, CLUSTER_AVAILABLE, now, reason=reason, message=message,
                     status="True" if available else "False")


def requeued(status: Mapping[str, Any], now: datetime, *, priority: int, reason: str, message: str,
             requeuings: int, requeue_wait: int) -> dict[str, Any]:
    """Its objects are being deleted and it is back in the queue: PreemptCandidate says why, Backoff (upstream's
    PreemptionTriggered) that it waits; ``numberOfRequeueings`` and the grown wait are recorded. Each requeue
    is a new event: both conditions are stamped now even when an earlier requeue said the same."""
    new = _enqueued(status, now, priority)
    conditions = with_condition(new["conditions"], PREEMPT_CANDIDATE, now, reason=reason, message=message,
                                refresh=True)
    new["conditions"] = with_condition(conditions, BACKOFF, now, reason=PREEMPTION_TRIGGERED, message=message,
                                       refresh=True)
    new.update(queuejobstate=BACKOFF, message=message, numberOfRequeueings=requeuings,
               requeueingTimeInSeconds=requeue_wait, pending=0, running=0, Succeeded=0, failed=0)
    new.pop("targetClusterName", None)
    new.pop("pendingpodconditions", None)
    return _without_estimate(new)


def is_draining(status: Mapping[str, Any]) -> bool:
    """Requeued and not yet looked at again (its current Backoff is the requeue's): its old pods may still be
    going away."""
    backoff = latest(status.get("conditions"), BACKOFF)
    return backoff is not None and backoff.get("reason") == PREEMPTION_TRIGGERED


def hold_completion(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Every item with a completionstatus is complete, but some pods still run: capacity stays reserved."""
    new = _asserted(status, RUNNING_HOLD_COMPLETION, now, reason=SOME_ITEMS_COMPLETED)
    new.update(state=State.RUNNING_HOLD_COMPLETION.value, queuejobstate=RUNNING_HOLD_COMPLETION)
    return new


def completed(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Done: the reservation is released; the objects are kept (their logs and results stay readable)."""
    new = _asserted(status, COMPLETED, now, reason=PODS_COMPLETED)
    new.update(state=State.COMPLETED.value, canrun=False, queuejobstate=COMPLETED)
    new.pop("message", None)
    new.pop("pendingpodconditions", None)
    return _without_estimate(new)


def failed(status: Mapping[str, Any], now: datetime, *, priority: int, reason: str, message: str,
           preempted: bool = False) -> dict[str, Any]:
    """Terminal: its reservation is released, and ``message`` says what happened or what to fix.
    ``preempted`` (it was stopped by mcad) also records a PreemptCandidate condition, as upstream does."""
    new = _base(status, now, priority)
    conditions = new["conditions"]
    if preempted:
        conditions = with_condition(conditions, PREEMPT_CANDIDATE, now, reason=reason, message=message,
                                    refresh=True)
    new["conditions"] = with_condition(conditions, FAILED, now, reason=reason, message=message)
    new.update(state=State.FAILED.value, canrun=False, queuejobstate=FAILED, message=message)
    new.pop("pendingpodconditions", None)  # its pods are no longer followed
    return _without_estimate(new)


def unhealthy(status: Mapping[str, Any], now: datetime, *, reason: str, message: str) -> dict[str, Any]:
    """A failure seen and not acted on yet (its grace period runs from the condition's transition)."""
    return _asserted(status, UNHEALTHY, now, reason=reason, message=message)


def reset_deferred(status: Mapping[str, Any], now: datetime, *, reason: str, message: str) -> dict[str, Any]:
    """A reset that waits for its namespace's bound on resets: Unhealthy (its cause's reason, so a grace period
    that ran keeps its start) and the status message say so."""
    new = _asserted(status, UNHEALTHY, now, reason=reason, message=message)
    new["message"] = message
    return new


def healthy(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """What was unhealthy recovered within its grace period (its own controller fixed it)."""
    current = latest(status.get("conditions"), UNHEALTHY)
    if current is None or current.get("status") != "True":
        return dict(status)
    return _asserted(status, UNHEALTHY, now, reason=str(current.get("reason", "")),
                     message="Recovered within its grace period.", status="False")


def unhealthy_since(status: Mapping[str, Any], reason: str) -> str | None:
    """When the current Unhealthy condition with ``reason`` became True (its time stamp), else None."""
    current = latest(status.get("conditions"), UNHEALTHY)
    if current is None or current.get("status") != "True" or current.get("reason") != reason:
        return None
    stamp = current.get("lastTransitionMicroTime")
    return stamp if isinstance(stamp, str) else None


def resetting(status: Mapping[str, Any], now: datetime, *, priority: int, reason: str, message: str,
              counted: bool) -> dict[str, Any]:
    """Its objects are being deleted for a retry: Unhealthy and Resetting say why, ``resettingCount`` counts the
    resets that count against its retryLimit, ``resets`` keeps the last ``MAX_RESETS_KEPT``. It is requeued
    (state Pending, draining until its old pods are gone) with its requeue counters unchanged, and dispatched
    again once its pause ends (``resume``)."""
    new = requeued(status, now, priority=priority, reason=reason, message=message,
                   requeuings=count_field(status.get("numberOfRequeueings")),
                   requeue_wait=count_field(status.get("requeueingTimeInSeconds")))
    conditions = with_condition(new["conditions"], UNHEALTHY, now, reason=reason, message=message)
    new["conditions"] = with_condition(conditions, RESETTING, now, reason=reason, message=message, refresh=True)
    count = count_field(status.get("resettingCount")) + (1 if counted else 0)
    history = [dict(r) for r in status.get("resets") or [] if isinstance(r, Mapping)]
    history.append({"time": micro_time(now), "reason": reason, "message": message, "counted": counted})
    new.update(resettingCount=count, resets=history[-MAX_RESETS_KEPT:])
    return new


def resume(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The retry pause is over: it waits to be dispatched again like any queued AppWrapper, at its place."""
    current = latest(status.get("conditions"), RESETTING) or {}
    return _asserted(status, RESETTING, now, reason=PAUSE_ENDED, message=str(current.get("message", "")),
                     status="False")


def resources_deleted(status: Mapping[str, Any], now: datetime, *, reason: str, message: str) -> dict[str, Any]:
    """Its objects were deleted on time (success TTL, deletion-on-failure grace): DeletingResources says so."""
    return _asserted(status, DELETING_RESOURCES, now, reason=reason, message=message)


def resources_deleted_already(status: Mapping[str, Any]) -> bool:
    current = latest(status.get("conditions"), DELETING_RESOURCES)
    return current is not None and current.get("status") == "True"


def at_risk(status: Mapping[str, Any], now: datetime, *, reason: str, message: str) -> dict[str, Any]:
    """Cordoned or NotReady nodes under its running pods (``reason`` "" : none any more)."""
    current = latest(status.get("conditions"), AT_RISK)
    if not reason and (current is None or current.get("status") != "True"):
        return dict(status)
    return _asserted(status, AT_RISK, now, reason=reason or str((current or {}).get("reason", "")),
                     message=message, status="True" if reason else "False")


def count_field(value: Any) -> int:
    """A count as status holds it: a non-negative integer, else 0 (a value written by someone else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def with_pod_counts(status: Mapping[str, Any], now: datetime, *, pending: int, running: int, succeeded: int,
                    failed_: int, unschedulable: Iterable[tuple[str, Unschedulable]] = ()) -> dict[str, Any]:
    """Pod phase counts of a dispatched AppWrapper; the first Running pod adds the Running condition.
    ``unschedulable`` are (pod name, verdict) of its Pending pods the scheduler could not place: they become
    ``pendingpodconditions`` (see the module docstring)."""
    new = dict(status)
    new.update(pending=pending, running=running, Succeeded=succeeded, failed=failed_)
    if running > 0 and latest(status.get("conditions"), RUNNING) is None:
        new["conditions"] = with_condition([dict(c) for c in status.get("conditions") or []], RUNNING, now,
                                           reason=PODS_RUNNING)
        new["queuejobstate"] = RUNNING
    pods = pending_pod_conditions(unschedulable)
    if pods:
        new["pendingpodconditions"] = pods
    else:
        new.pop("pendingpodconditions", None)
    return new


def pending_pod_conditions(unschedulable: Iterable[tuple[str, Unschedulable]]) -> list[dict[str, Any]]:
    """Upstream's ``pendingpodconditions``: per pod its name and its PodScheduled=False condition, by pod name,
    at most MAX_PENDING_PODS pods."""
    out = []
    for name, verdict in sorted(unschedulable, key=lambda pod: pod[0])[:MAX_PENDING_PODS]:
        condition = {"type": "PodScheduled", "status": "False", "reason": UNSCHEDULABLE, "message": verdict.message}
        if verdict.since:
            condition["lastTransitionTime"] = verdict.since
        out.append({"podname": name, "conditions": [condition]})
    return out
