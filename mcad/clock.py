"""Time as a seam: every component that waits or timestamps takes a ``Clock`` so tests can step time.

Contract: ``monotonic()`` never goes backwards and measures intervals (seconds, float); ``now()`` is the wall
clock in UTC for timestamps written to the API. ``RealClock`` is the only production implementation.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...


class RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)
