"""AppWrapper status, as pure functions: from the current status and a decision to the desired status.

Contract:
- Field names and vocabulary are upstream MCAD's (state, canrun, queuejobstate, conditions with micro-time
  stamps, controllerfirsttimestamp, pending/running/Succeeded/failed), so `kubectl describe`, the codeflare SDK
  and existing scripts keep working. ``message`` (declared but never set upstream) carries the one-line reason
  shown by ``kubectl get appwrappers``.
- Conditions form a chronological log with at most one entry per type. Re-asserting a condition with the same
  status, reason and message changes nothing (not even its timestamps), so a decision that did not change
  yields a status equal to the input and the caller can skip the write.
- Every builder returns a new dict; inputs are never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from mcad.api.appwrapper import State

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
PREEMPT_CANDIDATE = "PreemptCandidate"
MIN_PODS_NOT_RUNNING = "MinPodsNotRunning"
DISPATCH_DEADLINE_EXCEEDED = "DispatchDeadlineExceeded"
PREEMPTED_BY_QUOTA_RECLAIM = "PreemptedByQuotaReclaim"  # beyond upstream: borrowed quota taken back
PREEMPTED_BY_PRIORITY = "PreemptedByHigherPriority"  # beyond upstream, which only planned priority preemption
PREEMPTION_TRIGGERED = "PreemptionTriggered"  # upstream's Backoff reason for an AppWrapper sent back to the queue
MAX_REQUEUINGS_REACHED = "MaxRequeuingsReached"
RUNNING_HOLD_COMPLETION, SOME_ITEMS_COMPLETED = "RunningHoldCompletion", "SomeItemsCompleted"
COMPLETED, PODS_COMPLETED = "Completed", "PodsCompleted"
# Hub mode, beyond upstream: whether the worker it was dispatched to can be reached, and why not.
CLUSTER_AVAILABLE = "ClusterAvailable"
CLUSTER_UNREACHABLE_TIMEOUT = "ClusterUnreachableTimeout"


def micro_time(now: datetime) -> str:
    """RFC 3339 with microseconds, as metav1.MicroTime serialises."""
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _condition_index(conditions: list[dict[str, Any]], type_: str) -> int | None:
    for i, cond in enumerate(conditions):
        if cond.get("type") == type_:
            return i
    return None


def with_condition(conditions: list[dict[str, Any]], type_: str, now: datetime, *, reason: str = "",
                   message: str = "", status: str = "True") -> list[dict[str, Any]]:
    """The log with ``type_`` asserted: unchanged if an identical entry exists, else that entry moves to the end."""
    i = _condition_index(conditions, type_)
    if i is not None:
        old = conditions[i]
        if old.get("status") == status and old.get("reason", "") == reason and old.get("message", "") == message:
            return conditions
        conditions = conditions[:i] + conditions[i + 1:]
    stamp = micro_time(now)
    entry: dict[str, Any] = {"type": type_, "status": status, "lastUpdateMicroTime": stamp,
                             "lastTransitionMicroTime": stamp}
    if reason:
        entry["reason"] = reason
    if message:
        entry["message"] = message
    return [*conditions, entry]


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
    if _condition_index(conditions, INIT) is None:
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
    new["conditions"] = with_condition(conditions, DISPATCHED, now, reason=RUNNABLE)
    new.update(state=State.RUNNING.value, canrun=True, queuejobstate=DISPATCHED, pending=0, running=0,
               Succeeded=0, failed=0)
    new.setdefault("controllerfirstdispatchtimestamp", micro_time(now))
    if requeue_wait:
        new["requeueingTimeInSeconds"] = requeue_wait
    new.pop("message", None)
    if cluster:
        new["targetClusterName"] = cluster
    return new


def cluster_available(status: Mapping[str, Any], now: datetime, *, available: bool, reason: str,
                      message: str = "") -> dict[str, Any]:
    """Hub mode: the health of the worker it runs in, as a condition (its state is kept: it may come back)."""
    new = dict(status)
    new["conditions"] = with_condition([dict(c) for c in status.get("conditions") or []], CLUSTER_AVAILABLE, now,
                                       reason=reason, message=message, status="True" if available else "False")
    return new


def requeued(status: Mapping[str, Any], now: datetime, *, priority: int, reason: str, message: str,
             requeuings: int, requeue_wait: int) -> dict[str, Any]:
    """Its objects are being deleted and it is back in the queue: PreemptCandidate says why, Backoff (upstream's
    PreemptionTriggered) that it waits; ``numberOfRequeueings`` and the grown wait are recorded."""
    new = _enqueued(status, now, priority)
    conditions = with_condition(new["conditions"], PREEMPT_CANDIDATE, now, reason=reason, message=message)
    new["conditions"] = with_condition(conditions, BACKOFF, now, reason=PREEMPTION_TRIGGERED, message=message)
    new.update(queuejobstate=BACKOFF, message=message, numberOfRequeueings=requeuings,
               requeueingTimeInSeconds=requeue_wait, pending=0, running=0, Succeeded=0, failed=0)
    new.pop("targetClusterName", None)
    return new


def is_draining(status: Mapping[str, Any]) -> bool:
    """Requeued and not yet looked at again: its old pods may still be going away."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == BACKOFF:
            return bool(condition.get("reason") == PREEMPTION_TRIGGERED)
    return False


def hold_completion(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Every item with a completionstatus is complete, but some pods still run: capacity stays reserved."""
    new = dict(status)
    new["conditions"] = with_condition([dict(c) for c in status.get("conditions") or []], RUNNING_HOLD_COMPLETION,
                                       now, reason=SOME_ITEMS_COMPLETED)
    new.update(state=State.RUNNING_HOLD_COMPLETION.value, queuejobstate=RUNNING_HOLD_COMPLETION)
    return new


def completed(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Done: the reservation is released; the objects are kept (their logs and results stay readable)."""
    new = dict(status)
    new["conditions"] = with_condition([dict(c) for c in status.get("conditions") or []], COMPLETED, now,
                                       reason=PODS_COMPLETED)
    new.update(state=State.COMPLETED.value, canrun=False, queuejobstate=COMPLETED)
    new.pop("message", None)
    return new


def failed(status: Mapping[str, Any], now: datetime, *, priority: int, reason: str, message: str,
           preempted: bool = False) -> dict[str, Any]:
    """Terminal: its reservation is released, and ``message`` says what happened or what to fix.
    ``preempted`` (it was stopped by mcad) also records a PreemptCandidate condition, as upstream does."""
    new = _base(status, now, priority)
    conditions = new["conditions"]
    if preempted:
        conditions = with_condition(conditions, PREEMPT_CANDIDATE, now, reason=reason, message=message)
    new["conditions"] = with_condition(conditions, FAILED, now, reason=reason, message=message)
    new.update(state=State.FAILED.value, canrun=False, queuejobstate=FAILED, message=message)
    return new


def with_pod_counts(status: Mapping[str, Any], now: datetime, *, pending: int, running: int, succeeded: int,
                    failed_: int) -> dict[str, Any]:
    """Pod phase counts of a dispatched AppWrapper; the first Running pod adds the Running condition."""
    new = dict(status)
    new.update(pending=pending, running=running, Succeeded=succeeded, failed=failed_)
    if running > 0 and _condition_index(list(status.get("conditions") or []), RUNNING) is None:
        new["conditions"] = with_condition([dict(c) for c in status.get("conditions") or []], RUNNING, now,
                                           reason=PODS_RUNNING)
        new["queuejobstate"] = RUNNING
    return new
