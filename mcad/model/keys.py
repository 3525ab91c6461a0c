"""The dispatcher's work-queue keys: one small type per kind of work, so that a key says what it is about.

Contract:
- Each kind is a frozen dataclass. Two keys are equal only when they are of the same type with equal fields, so
  the work queue coalesces repeats of one kind of work about one object and never merges two kinds.
- Keys about an AppWrapper carry its ``"namespace/name"`` in ``appwrapper``; a Pod's carries its uid, a Node's and a
  worker's their names. Kinds about nothing in particular are the constants below (``DISPATCH`` and the rest).
- Who adds which: informer handlers (``AppWrapperEvent``, ``NodeEvent``, ``PodEvent``, ``QUOTA``), the write pool
  when a job of an AppWrapper finished (``Written``), status sync (``StatusRetry``), timers of the dispatcher
  (``MinAvailableCheck``, ``DeadlineCheck``, ``DispatchRetry``, ``PodCounts``, ``HealthDue``, ``QUOTA_STATUS``,
  ``CycleDue``, ``EstimatesDue``),
  status sync's pace (``BACKOFF_STATUS``),
  hub mode (``ClusterEvent``, ``WorkerCleanup``), the API server coming back (``RECOVERED``), other threads (``CALL``),
  the loop itself after a change (``PUBLISH``).
- The dispatcher handles each kind in a table; a kind it has no handler for is a bug and raises. Its work queue hands
  out the ``URGENT`` kinds ahead of the others.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AppWrapperEvent:
    """Look at this AppWrapper again (it, its pods or its wrapped objects changed)."""

    appwrapper: str


@dataclass(frozen=True, slots=True)
class NodeEvent:
    name: str


@dataclass(frozen=True, slots=True)
class PodEvent:
    uid: str


@dataclass(frozen=True, slots=True)
class Written:
    """Background writes of this AppWrapper finished: collect their outcomes."""

    appwrapper: str


@dataclass(frozen=True, slots=True)
class StatusRetry:
    """A status write of this AppWrapper that failed is due again."""

    appwrapper: str


@dataclass(frozen=True, slots=True)
class DispatchRetry:
    """A dispatch of this AppWrapper that failed may be tried again."""

    appwrapper: str


@dataclass(frozen=True, slots=True)
class MinAvailableCheck:
    """Time to check that enough of this dispatched AppWrapper's pods run (``minAvailable``)."""

    appwrapper: str


@dataclass(frozen=True, slots=True)
class DeadlineCheck:
    """This dispatched AppWrapper's ``dispatchDuration.limit`` may be over."""

    appwrapper: str


@dataclass(frozen=True, slots=True)
class PodCounts:
    """Write the pod counts of this dispatched AppWrapper's status (coalesced over a window)."""

    appwrapper: str


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """Hub mode: adopt this worker's health."""

    name: str


@dataclass(frozen=True, slots=True)
class WorkerCleanup:
    """Hub mode: delete what AppWrappers left in this worker."""

    name: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run a dispatch cycle (coalesced: a burst of events costs one)."""


@dataclass(frozen=True, slots=True)
class CycleDue:
    """A dispatch cycle due at a time, events or not (a preemptor's victim timeout or backoff ending, the eviction
    budget refilling, a pin's bind deadline). The due time is part of the key, in ticks of ``CYCLE_TICK_SECONDS``:
    the work queue keeps one timer per key, so timers of one kind (``DISPATCH``) would keep only the earliest and
    drop the rest, while timers with their own keys each fire. Timers due in the same tick are one."""

    tick: int


# Timers for a cycle closer together than this are one: a cycle judges everything anyway.
CYCLE_TICK_SECONDS = 0.01


@dataclass(frozen=True, slots=True)
class FairShareSave:
    """Fair sharing's usage is due to be saved (``mcad.loop.fairsharing``)."""


@dataclass(frozen=True, slots=True)
class RoomFreed:
    """Room may have freed (pods ended, an AppWrapper finished): a dispatch cycle, paced (``--cycle-interval``)."""


@dataclass(frozen=True, slots=True)
class EstimatesDue:
    """Queued AppWrappers' expected starts are due to be judged again for their status (``mcad.loop.cycle``)."""


@dataclass(frozen=True, slots=True)
class Call:
    """Run the work other threads handed to the dispatcher thread (reads of its state for /debug)."""


@dataclass(frozen=True, slots=True)
class QuotaChanged:
    """A QuotaSubtree changed: rebuild the forest."""


@dataclass(frozen=True, slots=True)
class QuotaStatus:
    """Write the QuotaSubtrees' status (coalesced over a window)."""


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish the loop's state for metrics scrapes (coalesced, at most once per interval)."""


@dataclass(frozen=True, slots=True)
class HealthDue:
    """Something about this AppWrapper's health may be due (``mcad.loop.health``): a grace period over, its retry
    pause ended, pods stuck terminating to force, its objects to delete on time."""

    appwrapper: str


@dataclass(frozen=True, slots=True)
class BackoffStatus:
    """A token for the next paced Backoff status write is due (``mcad.loop.statussync``)."""


@dataclass(frozen=True, slots=True)
class Recovered:
    """The API server answers again after failing: retry the writes that wait out a backoff."""


Key = (AppWrapperEvent | NodeEvent | PodEvent | Written | StatusRetry | DispatchRetry | MinAvailableCheck
       | DeadlineCheck | PodCounts | ClusterEvent | WorkerCleanup | Dispatch | Call | QuotaChanged | QuotaStatus
       | Publish | Recovered | HealthDue | BackoffStatus | RoomFreed | CycleDue | FairShareSave | EstimatesDue)

DISPATCH = Dispatch()
ROOM_FREED = RoomFreed()
ESTIMATES_DUE = EstimatesDue()
FAIR_SHARE_SAVE = FairShareSave()
CALL = Call()
QUOTA = QuotaChanged()
QUOTA_STATUS = QuotaStatus()
RECOVERED = Recovered()
PUBLISH = Publish()
BACKOFF_STATUS = BackoffStatus()

# The kinds the dispatcher's work queue hands out ahead of the rest: write outcomes. A dispatch is marked dispatched
# (its Dispatched status decided and sent, its room's holder recorded) only once the outcome of its creates is read;
# under a burst of arrivals, hundreds of new AppWrappers a second, each a key, it would otherwise wait for the whole
# burst to be read, and whoever waits for it to be seen running with it. Outcomes come no faster than the API server
# answers writes, so the other keys still get their turn. Everything else keeps its order: a cycle must not judge
# before the events already queued (a node or a worker that became ready) are read.
URGENT: frozenset[type] = frozenset({Written})
