"""What becomes of a dispatched AppWrapper: completion, a failed Job, requeuing, the dispatch deadline. Pure.

Contract:
- ``watched_kinds(aw, jobs=...)``: the (apiVersion, kind) pairs whose objects decide ``aw``'s fate: the kinds of
  items with a ``completionstatus``, and, with ``jobs``, the ``FAILING_KINDS`` (batch/v1 Job, Kubeflow's
  PyTorchJob: one that fails is a failed component, ``mcad.loop.health``). The caller asks for them once a pod
  of the AppWrapper has failed: a Job fails only after a pod of it did, and watching every wrapped Job for a
  failure that rarely comes would cost the API server (and this controller) an event stream as busy as the pods'
  for nothing.
- ``evaluate(aw, lookup, active_pods)`` gives a ``Verdict``:
  * ``FAILED`` when a wrapped Job or PyTorchJob (owned by this AppWrapper) has condition Failed=True; the reason
    is its own.
  * ``COMPLETED`` when there is at least one item with ``completionstatus``, each such item's object exists
    (owned by this AppWrapper) and has a condition whose type is one of the item's comma-separated types (exact,
    case-insensitive) with status True, and no pod of the AppWrapper is still active (not Succeeded/Failed);
    ``HOLD_COMPLETION`` when the items are complete but pods are still active, or none of its pods has been
    seen yet although it will have some (a Deployment is Progressing before its ReplicaSet makes pods: that
    is not completion).
  * ``UNKNOWN`` while a kind it depends on is not watched yet (its informer has not synced): decide nothing.
  * ``RUNNING`` otherwise (an AppWrapper without ``completionstatus`` runs until deleted, as upstream).
- ``requeue_wait(spec, requeuings)`` is the wait before the minAvailable check after the ``requeuings``-th
  requeue: ``timeInSeconds`` then grown per ``growthType`` (exponential: doubles, linear: + timeInSeconds,
  anything else: constant), capped by ``maxTimeInSeconds`` when that is > 0 (upstream MCAD's rules), and always
  within 1..``MAX_REQUEUE_SECONDS``. Then a floor (``requeue_floor``), mcad's own: from the
  ``REQUEUES_AS_SPECIFIED``+1-th requeue on, the wait is at least ``timeInSeconds`` doubled once per requeue past
  that many, up to ``REQUEUE_FLOOR_CAP_SECONDS`` (upstream's default ``timeInSeconds``), whatever
  ``growthType`` and ``maxTimeInSeconds`` say. Without it, ``growthType: none`` (or a small
  ``maxTimeInSeconds``) with ``maxNumRequeuings: 0`` (unlimited) would dispatch, delete and requeue a gang that
  never starts every second for ever; with it such a gang costs one cycle per 5 minutes once it has failed a
  few times, and every wait that the spec gives longer than the floor is kept as it is. A requeue whose wait the
  floor raised says so in its message (``requeue_floor_note``). There is no cap on the number of requeuings
  beyond ``maxNumRequeuings``: unlimited stays unlimited, at that pace.
- ``requeue_due``/``deadline_due`` are when the minAvailable check and the dispatch deadline fall, from the times
  and the current wait mcad records in status (None when status lacks the dispatch time), so timers survive
  restarts. ``current_requeue_wait`` reads the recorded wait, ignoring one that is not an integer in
  1..``MAX_REQUEUE_SECONDS`` (status written by someone else).
- None of these raises on what status or spec hold: a time beyond what ``datetime`` represents is
  ``FAR_FUTURE``, and ``seconds_until`` is at most ``MAX_TIMER_SECONDS`` (a timer that fires early re-checks and
  sets itself again), so every delay handed to the work queue is finite and small enough to wait on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from mcad.api.appwrapper import AppWrapperView, SchedulingSpec
from mcad.api.statusview import StatusView
from mcad.api.validation import MAX_DISPATCH_LIMIT_SECONDS, MAX_REQUEUE_SECONDS
from mcad.api.wrappedview import NotSynced, WrappedView

JOB = ("batch/v1", "Job")
# Kinds whose condition Failed=True fails the item (a reset or a failure: mcad.loop.health), watched once a pod of
# the AppWrapper failed: a Job, and Kubeflow's PyTorchJob (the usual wrapper of a long training run).
FAILING_KINDS = frozenset({JOB, ("kubeflow.org/v1", "PyTorchJob")})
# Where a start time plus a wait would overflow datetime (status stamps near year 9999): never, in effect.
FAR_FUTURE = datetime.max.replace(tzinfo=UTC)
# The longest delay a timer is set for; longer ones are re-armed when it fires.
MAX_TIMER_SECONDS = float(MAX_DISPATCH_LIMIT_SECONDS)

Lookup = Callable[[str, str, str, str], "WrappedView | NotSynced | None"]


class Outcome(Enum):
    RUNNING = "running"
    UNKNOWN = "unknown"
    HOLD_COMPLETION = "hold"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class TrackedItem:
    api_version: str
    kind: str
    name: str
    completion_types: frozenset[str]  # lower-cased; empty when the item has no completionstatus


def tracked_items(aw: AppWrapperView, *, jobs: bool = True) -> list[TrackedItem]:
    """The items whose objects are watched: those with a completionstatus, and (``jobs``) Jobs."""
    out = []
    for item in aw.items:
        if not (item.name and item.api_version and item.kind):
            continue
        if item.completion or (jobs and (item.api_version, item.kind) in FAILING_KINDS):
            out.append(TrackedItem(item.api_version, item.kind, item.name, item.completion))
    return out


def watched_kinds(aw: AppWrapperView, *, jobs: bool = True) -> set[tuple[str, str]]:
    return {(item.api_version, item.kind) for item in tracked_items(aw, jobs=jobs)}


def _true(view: WrappedView, type_: str) -> tuple[str, str, str, str] | None:
    found = view.condition(type_)
    return found if found is not None and found[1] == "True" else None


def evaluate(aw: AppWrapperView, lookup: Lookup, active_pods: int, *, pods_pending_creation: bool = False,
             jobs: bool = True) -> Verdict:
    items = tracked_items(aw, jobs=jobs)
    objects: list[tuple[TrackedItem, WrappedView | None]] = []
    unknown = False
    for item in items:
        found = lookup(item.api_version, item.kind, aw.namespace, item.name)
        if isinstance(found, NotSynced):
            unknown = True
            continue
        # An object left by an earlier AppWrapper of the same name is not ours.
        objects.append((item, found if found is not None and found.owner_uid == aw.uid else None))
    for item, view in objects:
        if view is not None and (item.api_version, item.kind) in FAILING_KINDS and (failed := _true(view, "Failed")):
            reason = failed[2] or f"{item.kind}Failed"
            detail = f": {failed[3]}" if failed[3] else ""
            return Verdict(Outcome.FAILED, reason, f"{item.kind} {item.name} failed ({reason}){detail}")
    if unknown:
        return Verdict(Outcome.UNKNOWN)
    completion = [(item, view) for item, view in objects if item.completion_types]
    if not completion:
        return Verdict(Outcome.RUNNING)
    for item, view in completion:
        if view is None or not any(_true(view, t) for t in item.completion_types):
            return Verdict(Outcome.RUNNING)
    if active_pods > 0 or pods_pending_creation:
        return Verdict(Outcome.HOLD_COMPLETION)
    return Verdict(Outcome.COMPLETED)


# Requeues that wait exactly what the spec says (upstream's behaviour) before the floor of requeue_floor applies;
# maxNumRequeuings up to this many never meets the floor.
REQUEUES_AS_SPECIFIED = 5
# The floor grows to this: upstream's default requeuing.timeInSeconds, the pace upstream users expect by default.
REQUEUE_FLOOR_CAP_SECONDS = 300


def requeue_floor(spec: SchedulingSpec, requeuings: int) -> int:
    """The least wait after the ``requeuings``-th requeue, whatever the spec says (see the module docstring)."""
    past = requeuings - REQUEUES_AS_SPECIFIED
    if past <= 0:
        return 0
    return min(spec.requeue_seconds << min(past, 32), REQUEUE_FLOOR_CAP_SECONDS)


def specified_requeue_wait(spec: SchedulingSpec, requeuings: int) -> int:
    """What the requeuing stanza alone makes of the wait after the ``requeuings``-th requeue (upstream's rules)."""
    if spec.growth == "exponential":
        wait = spec.requeue_seconds << min(requeuings, 32)  # the bound keeps the integer small
    elif spec.growth == "linear":
        wait = spec.requeue_seconds * (requeuings + 1)
    else:
        wait = spec.requeue_seconds
    if spec.requeue_max_seconds:
        wait = min(wait, spec.requeue_max_seconds)
    return min(max(wait, 1), MAX_REQUEUE_SECONDS)


def requeue_wait(spec: SchedulingSpec, requeuings: int) -> int:
    return min(max(specified_requeue_wait(spec, requeuings), requeue_floor(spec, requeuings)), MAX_REQUEUE_SECONDS)


def requeue_floor_note(spec: SchedulingSpec, requeuings: int) -> str:
    """For the requeue message: why its wait is longer than its requeuing stanza asks ("" when it is not)."""
    asked, wait = specified_requeue_wait(spec, requeuings), requeue_wait(spec, requeuings)
    if wait <= asked:
        return ""
    return (f" The next check waits {wait} s instead of the {asked} s its requeuing asks: after "
            f"{REQUEUES_AS_SPECIFIED} requeuings mcad doubles the wait per requeue, up to "
            f"{REQUEUE_FLOOR_CAP_SECONDS} s, so that pods that never start do not cycle for ever.")


def parse_time(stamp: Any) -> datetime | None:
    """A status time stamp (RFC 3339, with or without fractional seconds), or None."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: a stamp at year 1 or 9999 that UTC moves out of range
        return None


def dispatched_at(status: StatusView) -> datetime | None:
    """When the current dispatch happened: the (latest) Dispatched condition's last transition."""
    return parse_time(status.dispatched_since)


def current_requeue_wait(spec: SchedulingSpec, status: StatusView) -> int:
    """The minAvailable wait of the current dispatch: as recorded in status, else ``timeInSeconds``."""
    recorded = status.requeue_wait
    if 1 <= recorded <= MAX_REQUEUE_SECONDS:
        # Never below the floor of the recorded count: a status written by an older mcad keeps its wait only
        # where the floor agrees.
        return max(recorded, min(requeue_floor(spec, status.requeuings), MAX_REQUEUE_SECONDS))
    return spec.requeue_seconds


def _after(start: datetime, seconds: int) -> datetime:
    try:
        return start + timedelta(seconds=seconds)
    except OverflowError:
        return FAR_FUTURE


def requeue_due(spec: SchedulingSpec, status: StatusView) -> datetime | None:
    since = dispatched_at(status)
    return None if since is None else _after(since, current_requeue_wait(spec, status))


def deadline_due(spec: SchedulingSpec, status: StatusView) -> datetime | None:
    first = parse_time(status.first_dispatch)
    return None if first is None else _after(first, spec.dispatch_limit_seconds)


def seconds_until(deadline: datetime | None, now: datetime) -> float:
    """Seconds from ``now`` to ``deadline``: 0 when past or unknown, at most ``MAX_TIMER_SECONDS``."""
    if deadline is None:
        return 0.0
    return min(max((deadline - now).total_seconds(), 0.0), MAX_TIMER_SECONDS)
