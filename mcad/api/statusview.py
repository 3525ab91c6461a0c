"""An AppWrapper's status as the controller keeps it: the fields decisions read, typed, and the rest packed.

Contract:
- ``status_view(raw)`` never raises: an ill-typed field reads as absent. ``StatusView.of`` is the same.
- Typed, for the decisions taken on every event and cycle: ``state``, ``canrun``, ``requeuings``
  (numberOfRequeueings), ``requeue_wait`` (requeueingTimeInSeconds), ``first_dispatch``
  (controllerfirstdispatchtimestamp), ``dispatched_since`` (the last Dispatched condition's
  lastTransitionMicroTime), ``target_cluster`` (targetClusterName), ``backoff`` (the reason of the last Backoff
  condition, "" when there is none; a Backoff condition is only ever written with a reason), ``resetting_since``
  (the Resetting condition's lastTransitionMicroTime while it is True: a retry pause; "unknown" without a stamp)
  ``resetting_count`` (resettingCount), ``unhealthy`` (the Unhealthy condition's reason while True) and
  ``at_risk`` (AtRisk is True): what the health watch reads on every event without unpacking the status.
- ``raw()`` returns the whole status as a new dict, what the status builders (``mcad.model.status``) start from. It is
  kept as canonical JSON, deflated with a preset dictionary of the status vocabulary (keys, condition types,
  reasons, upstream's messages): a queued AppWrapper's status, about 1.3 KB of JSON and 4.4 KB as Python dicts,
  costs about 100 bytes, for some 30 µs each time ``raw()`` is called, which is once per decision about that
  AppWrapper, not per cycle.
- Two views are equal when their statuses are (the packed bytes are compared; keys are sorted when packing).
  ``EMPTY`` is the view of no status at all.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcad.api import fastjson

_DISPATCHED, _BACKOFF, _RESETTING, _UNHEALTHY, _AT_RISK = "Dispatched", "Backoff", "Resetting", "Unhealthy", "AtRisk"
_STAMP = "2026-01-01T00:00:00.000000Z"
# What most statuses are made of, as a preset dictionary for deflate: only the compression ratio depends on it
# (packed bytes never leave this process), so it holds the vocabulary of mcad.model.status, not real values.
_ZDICT = json.dumps({
    "Succeeded": 0, "canrun": False, "controllerfirstdispatchtimestamp": _STAMP, "controllerfirsttimestamp": _STAMP,
    "conditions": [{"lastTransitionMicroTime": _STAMP, "lastUpdateMicroTime": _STAMP, "message": message,
                    "reason": reason, "status": "True", "type": type_} for type_, reason, message in (
        ("Init", "", ""), ("Queueing", "AwaitingHeadOfLine", ""), ("HeadOfLine", "FrontOfQueue.", ""),
        ("Backoff", "AppWrapperNotRunnable.", "Insufficient resources to dispatch AppWrapper. 1 pod of Job (cpu 1, "
         "memory 1Gi, nvidia.com/gpu 1) fits on no node: nodes have too little cpu free; short of memory (needs "
         "free); position in the queue"),
        ("Dispatched", "AppWrapperRunnable", ""), ("Running", "PodsRunning", ""),
        ("PreemptCandidate", "MinPodsNotRunning", "Insufficient number of Running and Completed pods, minimum="),
        ("Backoff", "PreemptionTriggered", "Preempted by AppWrapper (priority)"),
        ("Failed", "ItemCreationFailure.", "GenericItems[0] (Deployment): Invalid (422)"),
        ("Completed", "PodsCompleted", ""), ("RunningHoldCompletion", "SomeItemsCompleted", ""))],
    "failed": 0, "message": "waiting", "numberOfRequeueings": 0, "pending": 0, "queuejobstate": "Backoff",
    "requeueingTimeInSeconds": 0, "running": 0, "state": "Pending", "systempriority": 0.0,
}, sort_keys=True, separators=(",", ":")).encode("ascii")


# An 8 KiB window (the preset dictionary and a status of a few KiB) and small hash tables: zlib's defaults
# (32 KiB, memLevel 8-9) allocate and clear ~400 KiB per call, which made packing cost ~250 us a status against
# ~20 us now, for the same packed size of a usual status; a cold start or restart packs one per AppWrapper (the
# bench's scale scenario: 100,000). Raw deflate: the inflater's 32 KiB window reads streams of any smaller one.
_PACK_WBITS = 13
_PACK_MEMLEVEL = 5


def _pack(text: bytes) -> bytes:
    deflate = zlib.compressobj(6, zlib.DEFLATED, -_PACK_WBITS, _PACK_MEMLEVEL, zlib.Z_DEFAULT_STRATEGY, zdict=_ZDICT)
    return deflate.compress(text) + deflate.flush()


def _unpack(packed: bytes) -> bytes:
    inflate = zlib.decompressobj(-15, zdict=_ZDICT)
    return inflate.decompress(packed) + inflate.flush()


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class StatusView:
    state: str = ""
    canrun: bool = False
    requeuings: int = 0
    requeue_wait: int = 0
    first_dispatch: str = ""
    dispatched_since: str = ""
    target_cluster: str = ""
    backoff: str = ""
    # When its current retry pause began (the Resetting condition's transition, while True), "" when not resetting.
    resetting_since: str = ""
    resetting_count: int = 0  # resettingCount: resets counted against its retryLimit
    unhealthy: str = ""  # the reason of its Unhealthy condition while True, else ""
    at_risk: bool = False  # its AtRisk condition is True
    packed: bytes = b""

    @staticmethod
    def of(raw: Mapping[str, Any] | None) -> StatusView:
        return status_view(raw)

    def raw(self) -> dict[str, Any]:
        """The whole status, as a new dict the caller may change."""
        if not self.packed:
            return {}
        value = fastjson.loads(_unpack(self.packed))
        return value if isinstance(value, dict) else {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StatusView) and self.packed == other.packed

    def __hash__(self) -> int:
        return hash(self.packed)


EMPTY = StatusView()


def _latest(conditions: Any, type_: str) -> Mapping[str, Any]:
    if isinstance(conditions, list):
        for condition in reversed(conditions):
            if isinstance(condition, Mapping) and condition.get("type") == type_:
                return condition
    return {}


def _true_reason(conditions: Any, type_: str) -> str:
    current = _latest(conditions, type_)
    return sys.intern(_str(current.get("reason")) or "Unknown") if current.get("status") == "True" else ""


def _resetting_since(conditions: Any) -> str:
    current = _latest(conditions, _RESETTING)
    if current.get("status") != "True":
        return ""
    # A Resetting condition without a time stamp (written by someone else) still says it is resetting.
    return _str(current.get("lastTransitionMicroTime")) or "unknown"


def status_view(raw: Mapping[str, Any] | None) -> StatusView:
    if not isinstance(raw, Mapping) or not raw:
        return EMPTY
    conditions = raw.get("conditions")
    try:
        text = fastjson.dumps(raw, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):  # keys that are not strings: not something the API server sends
        text = b"{}"
    return StatusView(
        # Few distinct values among thousands of AppWrappers: one copy each.
        state=sys.intern(_str(raw.get("state"))),
        canrun=raw.get("canrun") is True,
        requeuings=_int(raw.get("numberOfRequeueings")),
        requeue_wait=_int(raw.get("requeueingTimeInSeconds")),
        first_dispatch=_str(raw.get("controllerfirstdispatchtimestamp")),
        dispatched_since=_str(_latest(conditions, _DISPATCHED).get("lastTransitionMicroTime")),
        target_cluster=sys.intern(_str(raw.get("targetClusterName"))),
        backoff=sys.intern(_str(_latest(conditions, _BACKOFF).get("reason"))),
        resetting_since=_resetting_since(conditions),
        resetting_count=max(_int(raw.get("resettingCount")), 0),
        unhealthy=_true_reason(conditions, _UNHEALTHY),
        at_risk=_latest(conditions, _AT_RISK).get("status") == "True",
        packed=_pack(text),
    )
