"""When will a queued AppWrapper start: an estimate from what holds the room it needs and the queue ahead of it.

Contract:
- ``estimate_starts(queued, running, free, now)`` plans the queue as conservative backfilling would, over the
  cluster's free room as one amount (nodes and quota are not modelled: an estimate, not a promise): a profile of
  free room over time starts from ``free`` now and grows as each running AppWrapper's expected end comes (its
  ``dispatchDuration.limit`` deadline; one with none holds its room for ever); each queued AppWrapper, in the order
  given (dispatch order, fair sharing's included), starts at the earliest time from which the profile has room for
  its demand for as long as it may run (its own limit; for ever without one), and that room is taken from the
  profile from then on. One the dispatch cycle's judgement says does not fit now (``Waiter.blocked``: its nodes,
  quota or the reservations ahead keep it out, which one amount of room cannot see) starts no sooner than the
  profile's next change after now, never now.
- The first ``limit`` queued get an ``Estimate``: ``at`` (now when it fits now), or ``at`` None with ``why``: the
  room it needs is held by AppWrappers with no run-time limit, it does not fit now and no run-time limit says when
  room frees, or it needs more than the cluster has. Those beyond
  ``limit`` are not estimated (the caller says so).
- Cost: O(limit x (running + limit)) resource comparisons; the caller bounds ``limit``.
- Pure: values and times in, estimates out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from mcad.api.resources import ResourceVector

# How many queued AppWrappers, in dispatch order, an assessment estimates.
ESTIMATED = 100
UNKNOWN_HELD = "the room it needs is held by AppWrappers with no dispatchDuration.limit"
UNKNOWN_TOO_BIG = "it needs more than the cluster has"
UNKNOWN_BLOCKED = "it does not fit now, and no dispatchDuration.limit of what runs says when room frees"
NOT_ESTIMATED = f"not estimated: at least {ESTIMATED} AppWrappers are ahead of it"


@dataclass(frozen=True, slots=True)
class Estimate:
    at: datetime | None  # None: unknown (``why`` says why)
    why: str = ""


@dataclass(frozen=True, slots=True)
class Waiter:
    key: str
    demand: ResourceVector
    limit_seconds: float  # its dispatchDuration.limit; 0 for none
    blocked: bool = False  # the dispatch cycle's judgement: it does not fit now


@dataclass(frozen=True, slots=True)
class Holder:
    demand: ResourceVector
    ends: datetime | None  # None: no run-time limit


def estimate_starts(queued: Iterable[Waiter], running: Iterable[Holder], free: ResourceVector,
                    capacity: ResourceVector, now: datetime, limit: int = ESTIMATED) -> dict[str, Estimate]:
    times: list[datetime] = [now]
    room: list[ResourceVector] = [free]  # room[i]: free from times[i] until times[i + 1]
    for held in sorted((r for r in running if r.ends is not None), key=lambda r: r.ends or now):
        assert held.ends is not None
        _add(times, room, max(held.ends, now), None, held.demand)
    estimates: dict[str, Estimate] = {}
    for count, aw in enumerate(queued):
        if count >= limit:
            break
        if not aw.demand.fits_in(capacity):
            estimates[aw.key] = Estimate(None, UNKNOWN_TOO_BIG)
            continue
        start = _earliest(times, room, aw.demand, aw.limit_seconds, first=1 if aw.blocked else 0)
        if start is None:
            # Room enough now for all one amount can tell: what keeps it out is its nodes, quota or reservations.
            roomy = aw.blocked and _earliest(times, room, aw.demand, aw.limit_seconds) == now
            estimates[aw.key] = Estimate(None, UNKNOWN_BLOCKED if roomy else UNKNOWN_HELD)
            continue
        ends = start + timedelta(seconds=aw.limit_seconds) if aw.limit_seconds > 0 else None
        _add(times, room, start, ends, -aw.demand)
        estimates[aw.key] = Estimate(start)
    return estimates


def _earliest(times: Sequence[datetime], room: Sequence[ResourceVector], demand: ResourceVector,
              seconds: float, first: int = 0) -> datetime | None:
    """The first breakpoint, from the ``first``, from which ``demand`` fits for ``seconds`` (for ever when 0)."""
    for i, start in enumerate(times[first:], first):
        ends = start + timedelta(seconds=seconds) if seconds > 0 else None
        j = i
        while j < len(times) and (ends is None or times[j] < ends):
            if not demand.fits_in(room[j]):
                break
            j += 1
        else:
            return start
    return None


def _add(times: list[datetime], room: list[ResourceVector], start: datetime, ends: datetime | None,
         delta: ResourceVector) -> None:
    """``delta`` added to the room from ``start`` until ``ends`` (for ever when None)."""
    first = _breakpoint(times, room, start)
    last = _breakpoint(times, room, ends) if ends is not None else len(times)
    for i in range(first, last):
        room[i] = room[i] + delta


def _breakpoint(times: list[datetime], room: list[ResourceVector], at: datetime) -> int:
    """The index of the breakpoint at ``at``, made if it is not there (it copies the room before it)."""
    i = bisect.bisect_left(times, at)
    if i < len(times) and times[i] == at:
        return i
    times.insert(i, at)
    room.insert(i, room[i - 1] if i > 0 else ResourceVector())
    return i
