"""What the owners of the dispatcher loop act through, handed to each as one value by ``mcad.wiring``.

Contract: ``LoopTools`` holds the work queue (keys, and timers through ``add_after``), the clock, the write pool
(``mcad.k8s.writes``) and the metrics, the same four for every owner; it is frozen (the loop never swaps one) and
owns nothing of its own. An owner keeps what it uses of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcad.clock import Clock
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.writes import Writes
from mcad.metrics import Metrics
from mcad.model.keys import Key


@dataclass(frozen=True, slots=True)
class LoopTools:
    """The work queue, the clock, the write pool and the metrics of the loop (see the module docstring)."""

    queue: WorkQueue[Key]
    clock: Clock
    writes: Writes
    metrics: Metrics
