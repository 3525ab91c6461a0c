"""Fair sharing in the loop (``--fair-sharing``): what each tenant's dispatched AppWrappers hold, kept in the usage
ledger (``mcad.model.fairshare``) as they are dispatched and let go, and each pass's scores.

Contract:
- ``tenant(aw)``: whose usage ``aw`` counts in (``fairshare.tenant_of``: its first quota tree's node, else its
  namespace), for the queue's groups (``Queued``) and for what it holds.
- A ``Watcher`` of ``Active``: ``dispatched(aw)`` adds its demand's share of the cluster's capacity (then) to its
  tenant's holding, from now; ``undispatched(key)`` takes that same share away.
- ``begin(snapshot, act=True)`` (a dispatch cycle): first what the dispatched AppWrappers are is reconciled with what
  the ledger was told (AppWrappers adopted at a restart are not announced to watchers), when ``adoptions`` (a count
  of those, ``Active.adoptions``) moved since the last reconciling (and at the first cycle); then the pass's
  ``FairPass``. ``begin(snapshot, act=False)`` (the dry run behind explain): the same scores, changing nothing.
- ``weight(tenant)``: what the admin set, read when a pass asks (``FairPass`` keeps it for the pass), so a change
  counts from the next cycle: a ``namespace:<name>`` tenant's from its Namespace's policy (``namespaces``, the
  store of ``mcad.model.tenancy.NamespacePolicy``; none given, or the Namespace not known: 1), a
  ``quota:<tree>/<node>`` tenant's from the node in the quota forest the accountant holds now (kept per forest: a
  forest is replaced, never changed in place). Never from an AppWrapper.
- ``usage()``: each tenant's usage now, for readers, as a copy. ``standing()``: that usage with the half-life and,
  per quota tenant, the namespaces whose AppWrappers were dispatched under it while it had usage (what a reader of
  those namespaces may see named, ``mcad.model.standing``); kept for tenants the ledger still knows, so bounded by
  the tenants and the namespaces dispatched from.
- With a ``store`` (``mcad.k8s.fairsharestore``), usage outlives the controller: ``load()`` (when the dispatcher
  starts: after a restart, or in a replica that just became the leader) adds what was saved, decayed by the wall-clock
  time since it was saved; ``save()`` hands a write of the usage now to the write pool and is due again
  ``SAVE_INTERVAL_SECONDS`` later (the ``FairShareSave`` timer) and once more when the dispatcher stops, so a stop
  loses nothing and a crash at most that much. A store that
  cannot be read or written is logged (once per attempt) and fair sharing goes on from what it knows.
- Runs on the dispatcher's thread only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import structlog

from mcad.api.appwrapper import AppWrapperView
from mcad.clock import Clock
from mcad.errors import ApiError
from mcad.k8s.fairsharestore import FairShareStore, StoredUsageError
from mcad.k8s.informer import Store
from mcad.k8s.writes import Writes
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.fairshare import FairPass, FairShare, share, tenant_of
from mcad.model.fairweight import DEFAULT_WEIGHT
from mcad.model.quota import Forest
from mcad.model.standing import NAMESPACE_TENANT, FairUsage
from mcad.model.tenancy import NamespacePolicy

log = structlog.get_logger("mcad.fairsharing")

SAVE_INTERVAL_SECONDS = 60.0


class FairSharing:
    def __init__(self, ledger: FairShare, accountant: Accountant, dispatched: Mapping[str, AppWrapperView],
                 clock: Clock, *, store: FairShareStore | None = None, writes: Writes | None = None,
                 namespaces: Store[NamespacePolicy] | None = None, adoptions: Callable[[], int]) -> None:
        self.ledger = ledger
        self._accountant = accountant
        self._dispatched = dispatched  # Active.views: read, never written here
        self._adoptions = adoptions  # Active.adoptions
        self._adoptions_seen = -1  # none seen yet: the first cycle reconciles
        self._clock = clock
        self._store = store
        self._writes = writes
        self._held: dict[str, tuple[str, float]] = {}  # dispatched key -> (tenant, the share it was counted at)
        self._namespaces = namespaces
        # The quota nodes' weights other than 1, by tenant, for the forest they were read from.
        self._node_weights: tuple[Forest | None, dict[str, float]] = (None, {})
        self._dispatched_from: dict[str, set[str]] = {}  # quota tenant -> namespaces dispatched under it

    @property
    def stored(self) -> bool:
        return self._store is not None

    def load(self) -> None:
        if self._store is None:
            return
        where = f"{self._store.namespace}/{self._store.name}"
        try:
            found = self._store.read()
        except (ApiError, StoredUsageError) as err:
            log.warning("fair-share usage not read: every tenant starts from zero", configmap=where, error=str(err))
            return
        if found is None:
            log.info("no fair-share usage saved yet", configmap=where)
            return
        usage, saved_at = found
        elapsed = max((self._clock.now() - saved_at).total_seconds(), 0.0)
        kept = math.exp(-elapsed * math.log(2) / self.ledger.half_life)
        self.ledger.restore({tenant: amount * kept for tenant, amount in usage.items()}, self._clock.monotonic())
        log.info("fair-share usage restored", configmap=where, tenants=len(usage), saved_s_ago=round(elapsed))

    def save(self, *, now_here: bool = False) -> None:
        """The usage now, written in the background; ``now_here``: on this thread, before returning (when the
        dispatcher stops, after which the write pool starts nothing new). See the module docstring."""
        store, writes = self._store, self._writes
        if store is None or (writes is None and not now_here):
            return
        usage, now = self.usage(), self._clock.now()

        def job() -> None:
            try:
                store.write(usage, now)
            except ApiError as err:
                log.warning("fair-share usage not saved", configmap=f"{store.namespace}/{store.name}",
                            error=str(err))
        if now_here or writes is None:
            job()
        else:
            writes.submit(f"configmap/{store.namespace}/{store.name}", job, tenant=store.namespace, urgent=False)

    def tenant(self, aw: AppWrapperView) -> str:
        quota = self._accountant.quota
        return tenant_of(aw, quota.forest.charges(aw.labels)[0] if quota is not None else None)

    def dispatched(self, aw: AppWrapperView) -> None:
        if aw.key in self._held:
            return
        tenant, amount = self.tenant(aw), share(aw.demand, self._accountant.ledger.capacity())
        self._held[aw.key] = (tenant, amount)
        if not tenant.startswith(NAMESPACE_TENANT):
            self._dispatched_from.setdefault(tenant, set()).add(aw.namespace)
        self.ledger.change(self._clock.monotonic(), tenant, amount)

    def undispatched(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self.ledger.change(self._clock.monotonic(), held[0], -held[1])

    def begin(self, snapshot: Snapshot, *, act: bool) -> FairPass:
        if act and (adoptions := self._adoptions()) != self._adoptions_seen:
            # O(dispatched): only when an AppWrapper was adopted since the last look (the watcher calls keep the
            # rest), so a cycle with thousands running does not walk them all.
            for key in [key for key in self._held if key not in self._dispatched]:
                self.undispatched(key)
            for key, aw in self._dispatched.items():
                if key not in self._held:
                    self.dispatched(aw)
            self._adoptions_seen = adoptions
        return FairPass(self.ledger.usage_at(self._clock.monotonic()), self.weight)

    def weight(self, tenant: str) -> float:
        kind, _, name = tenant.partition(":")
        if kind == "namespace":
            policy = self._namespaces.get(name) if self._namespaces is not None else None
            return policy.fair_share_weight if policy is not None else DEFAULT_WEIGHT
        quota = self._accountant.quota
        if kind != "quota" or quota is None:
            return DEFAULT_WEIGHT
        forest, weights = self._node_weights
        if forest is not quota.forest:
            # Keyed as tenant_of names them (a tree's name, a label key, may hold a "/": never split the tenant).
            weights = {f"quota:{tree_name}/{node_name}": node.weight for tree_name, tree in quota.forest.trees.items()
                       for node_name, node in tree.nodes.items() if node.weight != DEFAULT_WEIGHT}
            self._node_weights = (quota.forest, weights)
        return weights.get(tenant, DEFAULT_WEIGHT)

    def usage(self) -> dict[str, float]:
        return self.ledger.usage_at(self._clock.monotonic())

    def standing(self) -> FairUsage:
        usage = self.usage()
        for tenant in [tenant for tenant in self._dispatched_from if tenant not in usage]:
            del self._dispatched_from[tenant]  # forgotten by the ledger: no usage left to tell of
        return FairUsage(self.ledger.half_life, usage,
                         {tenant: frozenset(namespaces) for tenant, namespaces in self._dispatched_from.items()})
