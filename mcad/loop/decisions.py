"""What the world is told about each AppWrapper: the status the loop decided for it, and its Events.

Contract (dispatcher thread only; built by ``mcad.wiring`` and handed to every owner that decides):
- ``status(aw)`` is the loop's own view: its last decision until the informer shows that decision landed (our
  writes may not be back from the watch yet, or may be failing), then the informer's status. Every decision
  builds on it, never on a status read elsewhere.
- ``decide(aw, new)`` makes ``new`` the AppWrapper's status unless it equals what the loop decided or saw last;
  ``mcad.loop.statussync`` (``self.sync``) writes it until it lands, whatever fails meanwhile (``paced=True``:
  after a token of its pace, for what a waiting AppWrapper is told). A final state
  decided here is remembered per incarnation (uid): ``decided_final(aw)`` tells a final state this loop decided
  from one written by someone else or before a restart. What that means for what it holds is
  ``Active.release_final``'s rule (``mcad.loop.active``), the only reader of ``decided_final`` and
  ``tell_undecided``.
- ``event(aw, reason, message)`` records an Event on the AppWrapper (the recorder rate-limits and never blocks);
  ``note(aw, decision, message)`` is a decision: counted in the metrics and told as its Event; ``fail`` is the
  Failed decision with its reason.
- ``forget(key)`` drops what is kept for an AppWrapper that is gone.

Who calls it: the dispatcher and every owner on the loop thread (active, dispatches, notices, evictions, follower,
pinning, the sites); nothing here calls back into them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from mcad.api.appwrapper import FINAL_STATES, KIND, AppWrapperView
from mcad.api.statusview import StatusView
from mcad.clock import Clock
from mcad.k8s import events
from mcad.loop.statussync import StatusSync
from mcad.metrics import Metrics
from mcad.model import status

log = structlog.get_logger("mcad.loop.dispatcher")

# Decisions (metrics) and the Event reason each is told with.
EVENT_REASONS = {"dispatched": events.DISPATCHED, "queued": events.QUEUED, "preempted": events.PREEMPTED,
                 "requeued": events.REQUEUED, "completed": events.COMPLETED, "failed": events.FAILED}


class Decisions:
    def __init__(self, sync: StatusSync, recorder: events.EventSink, metrics: Metrics, clock: Clock) -> None:
        self.sync = sync
        self._recorder = recorder
        self._metrics = metrics
        self._clock = clock
        # AppWrapper key -> uid of the incarnation this loop decided a final state for; and the (uid, state) a
        # StatusNotDecided Event named, so that it is told once.
        self._decided_final: dict[str, str] = {}
        self._undecided_told: dict[str, tuple[str, str]] = {}

    def status(self, aw: AppWrapperView) -> StatusView:
        intent = self.sync.intent(aw)
        return intent if intent is not None else aw.status

    def state(self, aw: AppWrapperView) -> str:
        return self.status(aw).state

    def decide(self, aw: AppWrapperView, new: Mapping[str, Any], *, urgent: bool = True,
               paced: bool = False) -> None:
        view = StatusView.of(new)
        if view.state in FINAL_STATES:
            self._decided_final[aw.key] = aw.uid
        if view == self.status(aw):
            return
        self.sync.want(aw, view, urgent=urgent, paced=paced)

    def decided_final(self, aw: AppWrapperView) -> bool:
        """Whether this loop decided the final state of this very incarnation of ``aw``."""
        return self._decided_final.get(aw.key) == aw.uid

    def event(self, aw: AppWrapperView, reason: str, message: str) -> None:
        self._recorder.record(events.ObjectRef(aw.api_version, KIND, aw.namespace, aw.name, aw.uid),
                              events.REASON_TYPES[reason], reason, message)

    def note(self, aw: AppWrapperView, decision: str, message: str) -> None:
        self._metrics.decision(decision)
        self.event(aw, EVENT_REASONS[decision], message)

    def fail(self, aw: AppWrapperView, reason: str, message: str) -> None:
        log.warning("appwrapper failed", appwrapper=aw.key, reason=reason, message=message)
        self.note(aw, "failed", f"{reason}: {message}")
        self.decide(aw, status.failed(self.status(aw).raw(), self._clock.now(), priority=aw.priority,
                                      reason=reason, message=message))

    def tell_undecided(self, aw: AppWrapperView, state: str, running: int) -> None:
        """Once per incarnation and state: a final state not decided here keeps its charges while pods run."""
        if self._undecided_told.get(aw.key) == (aw.uid, state):
            return
        self._undecided_told[aw.key] = (aw.uid, state)
        log.warning("final state not decided by the controller", appwrapper=aw.key,
                    reason=events.STATUS_NOT_DECIDED, state=state, pods=running)
        self.event(aw, events.STATUS_NOT_DECIDED,
                   f"status.state {state} was not decided by mcad while {running} of its pods still run: its "
                   f"capacity and quota stay charged until they end or the AppWrapper is deleted (only the "
                   f"controller writes AppWrapper status)")

    def forget(self, key: str) -> None:
        self._decided_final.pop(key, None)
        self._undecided_told.pop(key, None)
        self.sync.forget(key)
