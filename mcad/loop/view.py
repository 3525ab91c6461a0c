"""The loop as its readers see it: answers about what the loop decided, never the owners that decided them.

Contract:
- ``LoopView`` is what ``/debug`` (``mcad.serve.debug``: the queue, ledger, clusters, quota and explain documents the
  dashboard and ``mcadctl`` read) and the metrics' quota rows read of the loop, and all they read of it. It hands out
  values (copies, views, the dry run's ``QueueAssessment``), so a reader cannot change the loop through it, and no
  reader names an owner: an owner can change its insides without touching what is served.
- Its methods read state the dispatcher thread writes, so they run on that thread (``mcad.serve.snapshots`` builds
  each published snapshot there, between two keys, and readers on other threads get only that immutable
  document), or over a dispatcher nobody runs (``mcadctl --offline``). ``quota_samples`` is the exception: the
  quota status writer replaces its rows whole, so any thread may read them.
- The dispatcher builds one at start (``Dispatcher.view``) over its owners and settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mcad.api.appwrapper import AppWrapperView
from mcad.api.faulttolerance import FaultPolicy
from mcad.api.resources import ResourceVector
from mcad.api.statusview import StatusView
from mcad.api.views import NodeView, PodView
from mcad.clock import Clock
from mcad.k8s.informer import Store
from mcad.loop.owners import Owners, Settings
from mcad.model.assess import QueueAssessment
from mcad.model.fit import Targets
from mcad.model.standing import FairUsage


class LoopView:
    """Read-only answers over the loop's owners (see the module docstring)."""

    def __init__(self, owners: Owners, settings: Settings, appwrappers: Store[AppWrapperView], clock: Clock) -> None:
        self._owners = owners
        self._settings = settings
        self._accountant = owners.accountant
        self._ledger = owners.accountant.ledger
        self._plans = owners.accountant.plans
        self.appwrappers = appwrappers  # the informer's store: thread-safe reads
        self.clock = clock

    # -- the controller's settings, as /debug shows them ---------------------------------------------------------

    def header(self) -> dict[str, Any]:
        s = self._settings
        return {"fit": s.fit, "strictFifo": s.strict_fifo, "preemption": s.preemption,
                "reservations": self._owners.reservations.limit}

    def topology_levels(self) -> tuple[str, ...]:
        """The node label keys of the cluster's topology (--topology-level), largest first; () when none."""
        return self._settings.topology_levels

    def fair_usage(self) -> FairUsage | None:
        """Each tenant's fair-share usage now (``FairSharing.standing``); None when fair sharing is off."""
        fair = self._owners.fair
        return None if fair is None else fair.standing()

    # -- AppWrappers --------------------------------------------------------------------------------------------

    def assess_queue(self) -> QueueAssessment:
        """What the next cycle would do with every queued AppWrapper (the one pass, run dry)."""
        return self._owners.cycle.assess()

    def status(self, aw: AppWrapperView) -> StatusView:
        """Its status as decided here (written or about to be), else as the informer shows it."""
        return self._owners.decisions.status(aw)

    def intents(self) -> Callable[[AppWrapperView], StatusView | None]:
        """The statuses decided and not yet seen back from the API server, frozen: their reader."""
        return self._owners.decisions.sync.frozen_intents()

    def dispatching(self, key: str) -> bool:
        """Its objects are being written now."""
        return key in self._owners.dispatches

    def queued(self, key: str) -> bool:
        return key in self._owners.queued.pending

    def health_policy(self, aw: AppWrapperView) -> FaultPolicy:
        return self._owners.health.policy(aw)

    def phases(self, key: str) -> list[str]:
        """The phase of each of its pods."""
        return list(self._accountant.phases(key))

    def pods(self, key: str) -> list[PodView]:
        return list(self._accountant.pods(key))

    def holds(self, key: str) -> bool:
        """Whether room is held for it (its pods, or a reservation for the rest)."""
        return self._accountant.holds(key)

    def reservation(self, key: str) -> ResourceVector:
        """What is still reserved for its pods not placed yet."""
        return self._ledger.reservation(key)

    def planned_nodes(self, key: str) -> list[tuple[str, int]]:
        return list(self._plans.planned_nodes(key))

    def placed(self) -> dict[str, str]:
        """Hub mode: AppWrapper key -> the worker its objects are in."""
        return dict(self._owners.sites.placed())

    # -- the ledger ---------------------------------------------------------------------------------------------

    def totals(self) -> tuple[ResourceVector, ResourceVector, ResourceVector, ResourceVector]:
        """(capacity, in use, reserved, free) over the schedulable nodes."""
        ledger = self._ledger
        return ledger.capacity(), ledger.in_use(), ledger.reserved(), ledger.free()

    def nodes(self) -> Sequence[NodeView]:
        return list(self._ledger.nodes())

    def pods_by_node(self) -> dict[str, int]:
        return dict(self._ledger.pods_by_node())

    def room_by_node(self) -> dict[str, ResourceVector]:
        return dict(self._ledger.room_by_node())

    def reservations(self) -> dict[str, ResourceVector]:
        """Every AppWrapper with room reserved for pods not placed yet, and how much."""
        return {key: self._ledger.reservation(key) for key in sorted(self._ledger.reserved_keys())}

    def planned_by_node(self) -> dict[str, ResourceVector]:
        return dict(self._plans.planned_by_node())

    def pinned_by_node(self) -> dict[str, int]:
        return dict(self._plans.pinned_by_node())

    def targets(self) -> Targets:
        """Where gangs may go (this cluster's nodes, or hub mode's workers), for a report to describe."""
        return self._owners.targets

    # -- quota trees --------------------------------------------------------------------------------------------

    @property
    def quota_enabled(self) -> bool:
        return self._accountant.quota is not None

    def quota_report(self, describe: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
        """Every quota tree, each consumer described by ``describe(key)``; [] without quota trees."""
        quota = self._accountant.quota
        return quota.report(describe) if quota is not None else []

    def quota_demand(self, key: str) -> ResourceVector | None:
        """What a consumer of the quota trees is charged for (None: it is charged nothing)."""
        quota = self._accountant.quota
        consumer = quota.consumer(key) if quota is not None else None
        return consumer.demand if consumer is not None else None

    def quota_samples(self) -> Callable[[], Any]:
        """The quota metrics' rows, readable on any thread (none without quota trees)."""
        writer = self._owners.quota_status
        return (lambda: writer.samples) if writer is not None else tuple
