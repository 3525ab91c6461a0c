"""What the dispatcher loop is made of: its owners, built and connected by ``mcad.wiring``, and its settings.

Contract: ``Owners`` names every owner the loop drives (one each); ``mcad.wiring.loop`` builds them, hands each the
others it needs, and passes them to ``mcad.loop.dispatcher.Dispatcher`` in one value. ``Settings`` are the
controller's flags as the loop and /debug read them. Both are frozen: the loop never swaps an owner.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcad.api.faulttolerance import DEFAULTS, FaultDefaults
from mcad.k8s.writes import Writes
from mcad.loop.active import Active
from mcad.loop.cycle import DispatchCycle
from mcad.loop.decisions import Decisions
from mcad.loop.dispatches import Dispatches
from mcad.loop.evictions import Evictions
from mcad.loop.fairsharing import FairSharing
from mcad.loop.follower import Follower
from mcad.loop.health import Health
from mcad.loop.notices import Notices
from mcad.loop.ownership import Ownership
from mcad.loop.pinning import Pinning
from mcad.loop.queued import Queued
from mcad.loop.quotastatus import QuotaStatusWriter
from mcad.loop.sites import Sites
from mcad.model.accounting import Accountant
from mcad.model.fit import Targets
from mcad.model.preemption import Preemptors
from mcad.model.reservations import Reservations


@dataclass(frozen=True)
class Settings:
    """What the controller was told to do (its flags), as the loop and /debug read them."""

    fit: str = "nodes"
    strict_fifo: bool = False
    preemption: bool = False
    placement_mode: str = "binding"
    protected_namespaces: frozenset[str] = frozenset()
    fault_defaults: FaultDefaults = DEFAULTS  # the cluster's fault tolerance defaults and ceilings
    topology_levels: tuple[str, ...] = ()  # --topology-level, largest first


@dataclass(frozen=True)
class Owners:
    """Every owner the loop drives, built and connected by ``mcad.wiring``."""

    accountant: Accountant
    decisions: Decisions
    queued: Queued
    active: Active
    dispatches: Dispatches
    evictions: Evictions
    notices: Notices
    follower: Follower
    pinning: Pinning
    ownership: Ownership
    sites: Sites
    reservations: Reservations
    preemptors: Preemptors
    cycle: DispatchCycle
    targets: Targets
    writes: Writes
    quota_status: QuotaStatusWriter | None
    health: Health
    fair: FairSharing | None = None
