"""What the owners of the dispatcher loop act through, handed to each as one value by ``mcad.wiring``.

Contract: ``LoopTools`` holds the work queue (keys, and timers through ``add_after``), the clock, the write pool
(``mcad.k8s.writes``) and the metrics, the same four for every owner; it is frozen (the loop never swaps one) and
owns nothing of its own. An owner keeps what it uses of them. ``cycle_after`` is how an owner asks for a dispatch
cycle at a later time: each such timer fires, however many other timers are set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mcad.clock import Clock
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.writes import Writes
from mcad.metrics import Metrics
from mcad.model.keys import CYCLE_TICK_SECONDS, CycleDue, Key


@dataclass(frozen=True, slots=True)
class LoopTools:
    """The work queue, the clock, the write pool and the metrics of the loop (see the module docstring)."""

    queue: WorkQueue[Key]
    clock: Clock
    writes: Writes
    metrics: Metrics


def cycle_after(queue: WorkQueue[Key], now: float, seconds: float) -> None:
    """A dispatch cycle ``seconds`` after ``now`` (the queue's clock), rounded up to the next tick: never early, so
    what it is for (a timeout over, a budget refilled) is due when the cycle looks."""
    tick = math.ceil((now + max(seconds, 0.0)) / CYCLE_TICK_SECONDS)
    queue.add_after(CycleDue(tick), tick * CYCLE_TICK_SECONDS - now)
