"""Fair sharing over time: among AppWrappers of one priority, the tenant that used the least lately goes first.

Contract:
- A tenant is the quota node an AppWrapper is charged to (its first quota tree's, ``quota:<tree>/<node>``), else its
  namespace (``namespace:<name>``): ``tenant_of``.
- What a tenant holds is a share of the cluster (``share``): of its GPUs when the AppWrapper asks for GPUs (GPUs
  dominate), else the larger of its cpu and memory shares. A tenant's usage is the share it held, integrated over
  time in share-seconds and decayed with a half-life: usage(t) = usage(t0) 2^-(t-t0)/h + held x h/ln2 x
  (1 - 2^-(t-t0)/h) while it holds the same share, so one hour of the whole cluster an hour ago counts half as much
  as one now.
- ``FairShare`` keeps, per tenant, its usage at the last time it was brought up to date and the share it has held
  since. ``change(now, tenant, delta)`` records that a tenant holds more or less from ``now`` on (an AppWrapper of
  its was dispatched, or let go). ``usage_at(now)`` says what each tenant's usage is at ``now`` without changing
  anything: a dispatch cycle and the dry run behind explain both read that, and a ``change`` at ``now`` leaves it as
  it was, so both judge alike.
  A tenant whose usage has decayed below ``FORGET_BELOW`` and that holds nothing is forgotten at its next change
  (bounded by the tenants there are: quota nodes and namespaces).
- A tenant may have a weight, set by the cluster admin (``mcad.model.fairweight``; 1 unless set): tenants are
  ordered by usage / weight, so two busy tenants of weights 2 and 1 settle where the first holds twice the share.
- ``FairPass`` is one pass's view: a tenant's score is its usage at the pass's start, plus, for each AppWrapper the
  pass dispatches, its share times ``ENTRY_SECONDS`` (so one pass interleaves tenants instead of giving all the room
  to the one that was lowest when it began), all divided by its weight (so turns within a pass follow the weights
  too). ``weight(tenant)`` is asked at most once per tenant per pass (not for a tenant that used nothing, whose score
  is 0) and kept: a weight changed during a pass counts from the next, and scores only grow within a pass.
- ``projected_order(orders, tenant, taken, scores)`` is the order a dispatch cycle would take a queue in if the
  room of all of it freed at once: priority first; within a priority, the tenant with the lowest score, then age;
  each one taken adds to its tenant's score what a pass adds (``taken``: its share times ``ENTRY_SECONDS``, over
  the tenant's weight). It is what a queue's reader is shown as positions and what the expected start plans in:
  the order as usage stands now (room frees over time, while usage grows and decays). O(queue x log tenants).
- Pure: values and a time given by the caller; nothing is written anywhere.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector
from mcad.model.fairweight import DEFAULT_WEIGHT
from mcad.model.pending import Order
from mcad.model.placement import GPU
from mcad.model.quota import Charges

DEFAULT_HALF_LIFE_SECONDS = 3600.0
# What a dispatch adds to its tenant's score within one pass: a second of the share it takes, what it will have
# used a second from now. Enough to take turns between tenants of equal usage, too little to outweigh real history.
ENTRY_SECONDS = 1.0
# Usage below this (share-seconds: a thousandth of the cluster for a second) of a tenant holding nothing is gone.
FORGET_BELOW = 1e-3


def tenant_of(aw: AppWrapperView, charges: Charges | None) -> str:
    """Whose usage ``aw`` counts in: its first quota tree's node, else its namespace."""
    if charges:
        tree, node = charges[0]
        return f"quota:{tree}/{node}"
    return f"namespace:{aw.namespace}"


def share(demand: ResourceVector, capacity: ResourceVector) -> float:
    """The share of the cluster ``demand`` holds: GPUs when it asks for any, else the larger of cpu and memory."""
    if demand.get(GPU) > 0:
        return demand.get(GPU) / capacity.get(GPU) if capacity.get(GPU) > 0 else 1.0
    shares = [demand.get(name) / capacity.get(name) for name in ("cpu", "memory") if capacity.get(name) > 0]
    return max(shares, default=0.0)


@dataclass
class _Account:
    usage: float  # share-seconds at ``at``
    at: float  # monotonic seconds
    held: float  # the share held since ``at``


@dataclass
class FairShare:
    half_life: float = DEFAULT_HALF_LIFE_SECONDS
    _accounts: dict[str, _Account] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.half_life > 0:
            raise ValueError(f"the half-life must be positive, not {self.half_life}")

    def usage_at(self, now: float) -> dict[str, float]:
        """Each known tenant's usage at ``now`` (see the module docstring)."""
        return {tenant: self._decayed(account, now) for tenant, account in self._accounts.items()}

    def change(self, now: float, tenant: str, delta: float) -> None:
        """``tenant`` holds ``delta`` more (or less) from ``now`` on; its usage so far is brought up to ``now``."""
        account = self._accounts.get(tenant)
        if account is None:
            if delta <= 0:
                return
            account = self._accounts[tenant] = _Account(0.0, now, 0.0)
        account.usage, account.at = self._decayed(account, now), now
        account.held = max(account.held + delta, 0.0)
        if account.held <= 0 and account.usage < FORGET_BELOW:
            del self._accounts[tenant]

    def restore(self, usage: Mapping[str, float], now: float) -> None:
        """Usage read back (after a restart, or from the leader before this replica), as of ``now``."""
        for tenant, amount in usage.items():
            if amount >= FORGET_BELOW and math.isfinite(amount):
                account = self._accounts.setdefault(tenant, _Account(0.0, now, 0.0))
                account.usage, account.at = self._decayed(account, now) + amount, now

    def _decayed(self, account: _Account, now: float) -> float:
        elapsed = max(now - account.at, 0.0)
        kept = math.exp(-elapsed * math.log(2) / self.half_life)
        return account.usage * kept + account.held * self.half_life / math.log(2) * (1.0 - kept)


@dataclass
class FairPass:
    """One pass's scores: usage at its start plus what it dispatched, over the tenant's weight (see the module
    docstring). ``weights``: a tenant's weight (None: every tenant's is 1)."""

    usage: Mapping[str, float]
    weights: Callable[[str], float] | None = None
    added: dict[str, float] = field(default_factory=dict)
    _weights: dict[str, float] = field(default_factory=dict)  # each tenant's, as first asked in this pass
    # Each tenant's score as last worked out: a pass asks it for every group of the tenant's and again whenever a
    # group comes to the front, so it is kept until ``took`` changes it.
    _scores: dict[str, float] = field(default_factory=dict)

    def weight(self, tenant: str) -> float:
        weight = self._weights.get(tenant)
        if weight is None:
            weight = self.weights(tenant) if self.weights is not None else DEFAULT_WEIGHT
            if not (weight > 0 and math.isfinite(weight)):
                weight = DEFAULT_WEIGHT  # the sources bound it (mcad.model.fairweight): a division needs it so
            self._weights[tenant] = weight
        return weight

    def score(self, tenant: str) -> float:
        score = self._scores.get(tenant)
        if score is None:
            used = self.usage.get(tenant, 0.0) + self.added.get(tenant, 0.0)
            # Nothing used is 0 whatever the weight: a queue of many idle tenants asks no weights.
            score = used / self.weight(tenant) if used else 0.0
            self._scores[tenant] = score
        return score

    def took(self, tenant: str, taken_share: float) -> None:
        self.added[tenant] = self.added.get(tenant, 0.0) + taken_share * ENTRY_SECONDS
        self._scores.pop(tenant, None)


def projected_order(orders: Iterable[Order], tenant: Callable[[str], str], taken: Callable[[str], float],
                    scores: Mapping[str, float]) -> list[str]:
    """The keys of ``orders`` (in dispatch order without fair sharing: priority, then age) in the order they would
    be dispatched one at a time with it (see the module docstring). ``scores``: each tenant's score now (usage over
    weight; 0 when absent)."""
    projected: list[str] = []
    for _, level in itertools.groupby(orders, key=lambda order: order[0]):
        queues: dict[str, deque[Order]] = {}
        for order in level:
            queues.setdefault(tenant(order[2]), deque()).append(order)
        heads = [(scores.get(name, 0.0), queue[0], name) for name, queue in queues.items()]
        heapq.heapify(heads)
        while heads:
            score, _, name = heapq.heappop(heads)
            queue = queues[name]
            key = queue.popleft()[2]
            projected.append(key)
            if queue:
                heapq.heappush(heads, (score + taken(key), queue[0], name))
    return projected
