"""What ``/debug/explain`` says about an AppWrapper's fault tolerance (loop.health): its policy, its health with what
is due and when, its resets, and its retry pause. Pure: status, policy and a few facts in, JSON-ready dicts out.

Contract:
- ``policy_document(policy, annotations, defaults_known=)``: the effective policy (``mcad.api.faulttolerance.policy``
  of its annotations and the cluster's defaults) with periods as Go durations, which knobs its own annotations set,
  and the annotations ignored because their value is refused (each with why). ``defaults_known`` False (an offline
  document) says the cluster's defaults were not known and the built-in ones stand in.
- ``resets_document(raw, policy)``: ``resettingCount`` against ``retryLimit``, and ``status.resets`` (at most
  ``status.MAX_RESETS_KEPT``: time, reason, counted, message) as status holds them, oldest first.
- ``health_document(raw, policy, now, facts)``: ``state`` is Resetting (in its retry pause), NotRunning (queued, or
  waiting to be dispatched again), Finished (Completed or Failed), else Unhealthy, AtRisk or Healthy, from the
  current Unhealthy / AtRisk conditions; ``conditions`` are the current entries of the fault tolerance condition
  types; ``next`` what the controller does next and when, as ``mcad.loop.health`` decides it from the same time
  stamps: the reset (or the failure, when ``retryLimit`` is used up) a graced failure leads to unless it recovers,
  the end of the retry pause, the start-up checks still ahead, the deletion of a finished one's objects. Times are
  RFC 3339 UTC, ``inSeconds`` counts from ``now`` (0 when overdue: the controller acts on its next look).
- ``pause_document(raw, policy, now, held_on, held)``: while Resetting, when the pause ends and where the room is
  held (nodes, or an amount in aggregate).
- Everything here is about the AppWrapper being explained: the caller has already checked that its reader may see
  it (``mcad.serve.endpointauth``); node names are those its own pods ran on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mcad.api import faulttolerance as ft
from mcad.api.appwrapper import State
from mcad.api.faulttolerance import FaultPolicy, format_duration
from mcad.model import lifecycle, status

Document = dict[str, Any]

# The policy's knobs as the document names them (the annotation's short name without "Duration"), and their fields.
_PERIODS = tuple((ft.short(annotation).removesuffix("Duration"), field) for annotation, field in ft.DURATIONS.items())
CONDITION_TYPES = (status.UNHEALTHY, status.RESETTING, status.AT_RISK, status.DELETING_RESOURCES)


@dataclass(frozen=True)
class Facts:
    """What the dispatcher knows beyond status: whether it runs now, its pods, its start-up rule."""

    running: bool  # dispatched and active (its objects exist, or are being created)
    expected_pods: int = 0  # what its gang declares
    ready_pods: int = 0  # Running or Succeeded now
    existing_pods: int = 0
    min_available: int = 0


def rfc3339(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def policy_document(policy: FaultPolicy, annotations: Mapping[str, str], *, defaults_known: bool = True) -> Document:
    ignored_names = {entry.partition(":")[0] for entry in policy.ignored}
    own = [ft.short(name) for name in ft.ANNOTATIONS if name in annotations and name not in ignored_names]
    doc: Document = {name: format_duration(getattr(policy, field)) for name, field in _PERIODS}
    doc.update(retryLimit=policy.retry_limit, terminalExitCodes=sorted(policy.terminal_exit_codes),
               retryableExitCodes=sorted(policy.retryable_exit_codes), deleteWhenFinished=policy.delete_when_finished,
               fromAnnotations=own, ignored=list(policy.ignored),
               defaults="controller" if defaults_known else "built-in")
    return doc


def resets_document(raw: Mapping[str, Any], policy: FaultPolicy) -> Document:
    history = []
    for entry in raw.get("resets") or []:
        if isinstance(entry, Mapping):
            history.append({"time": _str(entry.get("time")), "reason": _str(entry.get("reason")),
                            "counted": entry.get("counted") is not False, "message": _str(entry.get("message"))})
    return {"count": status.count_field(raw.get("resettingCount")),
            "retryLimit": policy.retry_limit, "history": history}


def _condition(raw: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return status.latest(raw.get("conditions"), type_)


def _true(raw: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    found = _condition(raw, type_)
    return found if found is not None and found.get("status") == "True" else None


def _since(condition: Mapping[str, Any] | None) -> datetime | None:
    return lifecycle.parse_time(condition.get("lastTransitionMicroTime")) if condition is not None else None


def _due(action: str, at: datetime | None, now: datetime, text: str) -> Document:
    left = max(0.0, (at - now).total_seconds()) if at is not None else None
    when = "now" if left is not None and left <= 0 else f"in {format_duration(left)}" if left is not None else ""
    return {"action": action, "at": rfc3339(at), "inSeconds": None if left is None else round(left, 3),
            "text": text.replace("{when}", when).strip()}


def _after(start: datetime | None, seconds: float) -> datetime | None:
    return None if start is None else start + timedelta(seconds=seconds)


def health_document(raw: Mapping[str, Any], policy: FaultPolicy, now: datetime, facts: Facts) -> Document:
    conditions = [{"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason", ""),
                   "message": c.get("message", ""), "since": c.get("lastTransitionMicroTime", "")}
                  for type_ in CONDITION_TYPES if (c := _condition(raw, type_)) is not None]
    state_, next_ = _state_and_next(raw, policy, now, facts)
    return {"state": state_, "conditions": conditions, "next": next_}


def _state_and_next(raw: Mapping[str, Any], policy: FaultPolicy, now: datetime,
                    facts: Facts) -> tuple[str, Document | None]:
    resetting = _true(raw, status.RESETTING)
    if resetting is not None:
        ends = _after(_since(resetting), policy.retry_pause)
        return "Resetting", _due("dispatch", ends, now, "queued again at its place {when}, at the end of its "
                                                        f"{format_duration(policy.retry_pause)} retry pause")
    state_ = _str(raw.get("state"))
    if state_ in (State.COMPLETED, State.FAILED):
        return "Finished", _cleanup(raw, policy, now, state_)
    if not facts.running:
        return "NotRunning", None
    unhealthy = _true(raw, status.UNHEALTHY)
    if unhealthy is not None:
        reason = _str(unhealthy.get("reason"))
        if reason not in status.GRACED:
            return "Unhealthy", None  # acted on at once: its reset or failure is under way
        at = _after(_since(unhealthy), policy.failure_grace)
        done = status.count_field(raw.get("resettingCount"))
        if policy.retry_limit == 0:
            what = "Failed {when} unless it recovers (retryLimit is 0)"
        elif done >= policy.retry_limit:
            what = f"Failed {{when}} unless it recovers (retryLimit {policy.retry_limit} used up)"
        else:
            what = f"reset ({done + 1} of {policy.retry_limit}) {{when}} unless it recovers"
        return "Unhealthy", _due("fail" if "Failed" in what else "reset", at, now, what)
    at_risk = _true(raw, status.AT_RISK)
    return ("AtRisk" if at_risk is not None else "Healthy"), _start_up(raw, policy, now, facts)


def _start_up(raw: Mapping[str, Any], policy: FaultPolicy, now: datetime, facts: Facts) -> Document | None:
    """The admission and warmup checks still ahead (only without minAvailable, as mcad.loop.health)."""
    if facts.min_available > 0 or facts.expected_pods <= 0 or facts.ready_pods >= facts.expected_pods:
        return None
    dispatched = _since(_condition(raw, status.DISPATCHED))
    if dispatched is None:
        return None
    n = facts.expected_pods
    admission, warmup = _after(dispatched, policy.admission_grace), _after(dispatched, policy.warmup_grace)
    if facts.existing_pods < n and admission is not None and admission > now:
        return _due("check", admission, now, f"reset {{when}} unless all {n} pods exist by then "
                                             f"(admissionGracePeriod {format_duration(policy.admission_grace)}; "
                                             f"{facts.existing_pods} exist)")
    return _due("check", warmup, now, f"reset {{when}} unless all {n} pods are Running or Succeeded by then "
                                      f"(warmupGracePeriod {format_duration(policy.warmup_grace)}; "
                                      f"{facts.ready_pods} are)")


def _cleanup(raw: Mapping[str, Any], policy: FaultPolicy, now: datetime, state_: str) -> Document | None:
    if not raw.get("controllerfirstdispatchtimestamp") or status.resources_deleted_already(raw):
        return None
    completed = state_ == State.COMPLETED
    final = _condition(raw, status.COMPLETED if completed else status.FAILED)
    wait = policy.success_ttl if completed else policy.deletion_on_failure_grace
    if not completed and wait <= 0:
        return None  # deleted as the failure was decided
    name = "successTTLDuration" if completed else "deletionOnFailureGracePeriodDuration"
    itself = " and then the AppWrapper itself" if policy.delete_when_finished else ""
    return _due("delete", _after(_since(final), wait), now,
                f"its objects are deleted{itself} {{when}} ({name} {format_duration(wait)})")


def pause_document(raw: Mapping[str, Any], policy: FaultPolicy, now: datetime, held_on: Sequence[str],
                   held: Mapping[str, str]) -> Document | None:
    resetting = _true(raw, status.RESETTING)
    if resetting is None:
        return None
    since = _since(resetting)
    ends = _after(since, policy.retry_pause)
    left = max(0.0, (ends - now).total_seconds()) if ends is not None else None
    return {"since": rfc3339(since), "until": rfc3339(ends), "inSeconds": None if left is None else round(left, 3),
            "reason": _str(resetting.get("reason")), "heldOn": list(held_on), "held": dict(held)}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
