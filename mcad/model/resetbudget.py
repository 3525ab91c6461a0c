"""How many resets each namespace may have in any minute. Pure (times are handed in), not thread-safe: the
dispatcher thread owns it.

Why: each reset of an AppWrapper deletes its objects and creates them again, and the controller and the API server
do that work for every tenant in turn. The fault tolerance floors (``mcad.api.faulttolerance``) pace one
AppWrapper; a tenant with many AppWrappers that always fail could still keep both busy enough to slow every other
tenant's dispatches. This bound makes a namespace's resets wait for each other instead.

Contract:
- ``ResetBudget(per_minute)`` (``FaultDefaults.max_namespace_resets_per_minute``): at most ``per_minute``
  resets in any ``WINDOW`` (60 s) per namespace; 0: no bound.
- ``take(namespace, now)`` (``now`` a monotonic time in seconds): 0.0 and the reset is counted when the namespace
  has room; else nothing is counted and the answer is how many seconds until it has room (> 0). A deferred reset
  asks again then; until then it is not counted, so deferred resets never make the wait longer.
- ``recent(namespace, now)``: how many resets of the namespace the window holds.
- Memory: at most ``per_minute`` times per namespace, and only for namespaces with a reset within the window:
  one ``take`` forgets every namespace whose last reset has left the window (in order of last reset, so the work
  is proportional to what is forgotten).
"""

from __future__ import annotations

from collections import OrderedDict, deque

WINDOW = 60.0


class ResetBudget:
    def __init__(self, per_minute: int) -> None:
        if per_minute < 0:
            raise ValueError(f"resets per minute may not be negative ({per_minute})")
        self.per_minute = per_minute
        # namespace -> times of its resets within the window, oldest first; namespaces by their last reset.
        self._times: OrderedDict[str, deque[float]] = OrderedDict()

    def take(self, namespace: str, now: float) -> float:
        if self.per_minute <= 0:
            return 0.0
        self._forget_idle(now)
        times = self._times.get(namespace)
        if times is None:
            times = self._times[namespace] = deque()
        while times and times[0] <= now - WINDOW:
            times.popleft()
        if len(times) >= self.per_minute:
            return max(times[0] + WINDOW - now, 1e-3)
        times.append(now)
        self._times.move_to_end(namespace)
        return 0.0

    def recent(self, namespace: str, now: float) -> int:
        return sum(1 for at in self._times.get(namespace, ()) if at > now - WINDOW)

    def _forget_idle(self, now: float) -> None:
        while self._times:
            namespace, times = next(iter(self._times.items()))
            if times and times[-1] > now - WINDOW:
                return
            del self._times[namespace]

    def __len__(self) -> int:
        """Namespaces remembered (tests of the memory bound)."""
        return len(self._times)
