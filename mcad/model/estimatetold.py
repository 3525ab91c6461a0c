"""When a queued AppWrapper's estimated start (``mcad.model.estimate``) is written to its status, and when not.

Contract:
- ``worth_telling(told, new, now, monotonic)`` is the rule, a pure function of what was last written for the
  AppWrapper (``told``: the estimate and the monotonic time it was decided; None when nothing was) and the new
  estimate. Nothing written yet: write. Otherwise never within ``MIN_SECONDS_BETWEEN`` (60 s) of the last write;
  after that, write when the estimate turned from known to unknown or back, when an unknown one's reason changed, or
  when a known one moved by more than ``FRACTION`` (10 %) of the time that remained until the written estimate,
  and at least ``FLOOR_SECONDS`` (30 s): an estimate an hour away is rewritten when it moves by more than 6 minutes,
  one a minute away (or already past) when it moves by more than 30 s.
- ``held_by_pace(told, new, now, monotonic)``: the rule would write ``new`` but for the minute since the last write
  (so whoever judges estimates must judge again once that minute is over, even if nothing else changed).
- ``EstimatesTold`` keeps the one record per AppWrapper the rule reads: ``due`` asks the rule, ``held`` asks
  ``held_by_pace``, ``told`` records a
  write decided, ``forget`` drops the record (the AppWrapper left the queue: dispatched, requeued, deleted), so
  memory is one small entry per queued AppWrapper that was ever estimated.
- Times come in as values (``now`` for the estimate's distance, ``monotonic`` for the pace): no clock is read here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from mcad.model.estimate import Estimate

# At most one estimate write per AppWrapper in this many seconds.
MIN_SECONDS_BETWEEN = 60.0
# A known estimate is rewritten when it moves by more than this fraction of the time left until the written one...
FRACTION = 0.1
# ... and by more than this many seconds: near (or past) the written time, a few seconds of drift are noise.
FLOOR_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Told:
    """What was last written: the estimate, and when (monotonic seconds) that write was decided."""

    estimate: Estimate
    when: float


def worth_telling(told: Told | None, new: Estimate, now: datetime, monotonic: float) -> bool:
    """Whether ``new`` should be written, given what was (see the module docstring)."""
    if told is None:
        return True
    if monotonic - told.when < MIN_SECONDS_BETWEEN:
        return False
    before = told.estimate
    if (before.at is None) != (new.at is None):
        return True
    if before.at is None or new.at is None:
        return before.why != new.why
    remaining = max((before.at - now).total_seconds(), 0.0)
    return abs((new.at - before.at).total_seconds()) > max(FLOOR_SECONDS, FRACTION * remaining)


def held_by_pace(told: Told | None, new: Estimate, now: datetime, monotonic: float) -> bool:
    """Whether ``new`` is worth writing but for ``MIN_SECONDS_BETWEEN`` (see the module docstring)."""
    return (told is not None and monotonic - told.when < MIN_SECONDS_BETWEEN
            and worth_telling(Told(told.estimate, monotonic - MIN_SECONDS_BETWEEN), new, now, monotonic))


class EstimatesTold:
    """The estimate last written for each queued AppWrapper (see the module docstring)."""

    def __init__(self) -> None:
        self._told: dict[str, Told] = {}

    def __len__(self) -> int:
        return len(self._told)

    def __iter__(self) -> Iterator[str]:
        """The keys of the AppWrappers with a record."""
        return iter(self._told)

    def due(self, key: str, new: Estimate, now: datetime, monotonic: float) -> bool:
        return worth_telling(self._told.get(key), new, now, monotonic)

    def held(self, key: str, new: Estimate, now: datetime, monotonic: float) -> bool:
        return held_by_pace(self._told.get(key), new, now, monotonic)

    def told(self, key: str, estimate: Estimate, monotonic: float) -> None:
        self._told[key] = Told(estimate, monotonic)

    def forget(self, key: str) -> None:
        self._told.pop(key, None)
