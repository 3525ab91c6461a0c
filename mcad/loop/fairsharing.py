"""Fair sharing in the loop (``--fair-sharing``): what each tenant's dispatched AppWrappers hold, kept in the usage
ledger (``mcad.model.fairshare``) as they are dispatched and let go, and each pass's scores.

Contract:
- ``tenant(aw)``: whose usage ``aw`` counts in (``fairshare.tenant_of``: its first quota tree's node, else its
  namespace), for the queue's groups (``Queued``) and for what it holds.
- A ``Watcher`` of ``Active``: ``dispatched(aw)`` adds its demand's share of the cluster's capacity (then) to its
  tenant's holding, from now; ``undispatched(key)`` takes that same share away.
- ``begin(snapshot, act=True)`` (a dispatch cycle): first what the dispatched AppWrappers are is reconciled with what
  the ledger was told (AppWrappers adopted at a restart are not announced to watchers), then the pass's
  ``FairPass``. ``begin(snapshot, act=False)`` (the dry run behind explain): the same scores, changing nothing.
- ``usage()``: each tenant's usage now, for readers, as a copy.
- Runs on the dispatcher's thread only.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcad.api.appwrapper import AppWrapperView
from mcad.clock import Clock
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.fairshare import FairPass, FairShare, share, tenant_of


class FairSharing:
    def __init__(self, ledger: FairShare, accountant: Accountant, dispatched: Mapping[str, AppWrapperView],
                 clock: Clock) -> None:
        self.ledger = ledger
        self._accountant = accountant
        self._dispatched = dispatched  # Active.views: read, never written here
        self._clock = clock
        self._held: dict[str, tuple[str, float]] = {}  # dispatched key -> (tenant, the share it was counted at)

    def tenant(self, aw: AppWrapperView) -> str:
        quota = self._accountant.quota
        return tenant_of(aw, quota.forest.charges(aw.labels)[0] if quota is not None else None)

    def dispatched(self, aw: AppWrapperView) -> None:
        if aw.key in self._held:
            return
        tenant, amount = self.tenant(aw), share(aw.demand, self._accountant.ledger.capacity())
        self._held[aw.key] = (tenant, amount)
        self.ledger.change(self._clock.monotonic(), tenant, amount)

    def undispatched(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self.ledger.change(self._clock.monotonic(), held[0], -held[1])

    def begin(self, snapshot: Snapshot, *, act: bool) -> FairPass:
        if act:
            for key in [key for key in self._held if key not in self._dispatched]:
                self.undispatched(key)
            for key, aw in self._dispatched.items():
                if key not in self._held:
                    self.dispatched(aw)
        return FairPass(self.ledger.usage_at(self._clock.monotonic()))

    def usage(self) -> dict[str, float]:
        return self.ledger.usage_at(self._clock.monotonic())
