"""The controller's settings as values: its flags parsed into typed, frozen groups, one group per consumer.

Contract: each group holds what one part of the controller reads, already validated (``mcad.cli.controller`` parses
the flags into them, one small function per group, and refuses what does not hold together there):

- ``SchedulingSettings``: what the dispatcher loop decides by (``mcad.wiring.loop`` hands each owner its part): the
  fit and placement modes, strict FIFO, reservations, preemption and its bounds, the node-health rules, the
  protected namespaces, hub mode's worker policy, how many write threads and how fast Backoff statuses go out, and
  the fault tolerance defaults (``mcad.api.faulttolerance.FaultDefaults``, itself a frozen group: defaults, floors,
  ceilings and the reset bound).
- ``ApiSettings``: which AppWrappers are served and the bounds they keep (``mcad.wiring.build``'s informers and
  admission alike): the legacy group, quota trees, the size limits and allowed scheduler names, the default
  priority ceiling, the protected namespaces the admin allowed.
- ``ServingSettings``: the HTTP port (/metrics, /healthz, /readyz, /debug, the dashboard) and who may read it.
- ``AdmissionSettings``: the webhooks' port, certificate, callers and their costs, what admission allows.
- ``HubSettings``: hub mode's worker clusters (the parsed clusters file) and their probes.
- ``LeaderElectionSettings``: the Lease and its timings.

Where a group has defaults they are what a controller given no flag does, so tests and ``mcadctl --offline`` build
a group naming only what they change; the exception is ``ApiSettings.quota_trees``, off unless asked (the controller
asks, and turns it off again when the QuotaSubtree CRD is not served). ``ServingSettings`` and ``AdmissionSettings``
have none: only the controller builds them, from its flags. The module does no I/O and starts nothing; only the
entry points (``mcad.cli``) and the composition root (``mcad.wiring``) import it (``test/unit/test_layers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mcad.api import minruntime
from mcad.api.faulttolerance import DEFAULTS, FaultDefaults
from mcad.api.validation import DEFAULT_LIMITS, Limits
from mcad.hub.clusters import HubConfig
from mcad.hub.connections import DEFAULT_PROBE_PERIOD_SECONDS
from mcad.hub.placement import Policy
from mcad.loop.evictions import (
    DEFAULT_MAX_EVICTIONS_PER_MINUTE,
    DEFAULT_PREEMPTION_BACKOFF_SECONDS,
    DEFAULT_PREEMPTION_COOLDOWN_SECONDS,
)
from mcad.model import tenancy
from mcad.model.nodehealth import NodeHealth
from mcad.model.reservations import DEFAULT_RESERVATIONS

# A preemptor waits this long for its victims' pods to go before it force-deletes those whose grace period is
# over and stops holding the queue (a pod finalizer or a process ignoring SIGTERM would hold it for ever).
DEFAULT_VICTIM_TIMEOUT_SECONDS = 300.0
# What waiting AppWrappers are told (their Backoff status) is written at most this often a second after a burst
# (mcad.wiring.BACKOFF_STATUS_BURST), as their Events are (mcad.k8s.events): under a flood of arrivals the API
# server's writes go to dispatches, and an AppWrapper dispatched before its turn never costs a Backoff write.
DEFAULT_BACKOFF_STATUS_RATE = 10.0
DEFAULT_WRITE_WORKERS = 32
# A cycle for freed room starts no sooner than this after the last cycle's start: under churn every pod that ends
# frees room and asks for one, and a cycle judges every group's head; folding those asks into one cycle per
# interval leaves freed room idle at most this long. A newcomer is judged at once (docs/performance.md, "The cost
# of judging").
DEFAULT_CYCLE_INTERVAL_SECONDS = 0.05


@dataclass(frozen=True)
class SchedulingSettings:
    """What the dispatcher loop decides by (``mcad.wiring.loop``)."""

    fit: str = "nodes"  # mcad.wiring.FIT_MODES
    placement: str = "binding"  # mcad.loop.pinning.PLACEMENT_MODES; binding needs fit "nodes"
    strict_fifo: bool = False
    reservations: int = DEFAULT_RESERVATIONS
    preemption: bool = False
    victim_timeout: float = DEFAULT_VICTIM_TIMEOUT_SECONDS
    preemption_backoff: float = DEFAULT_PREEMPTION_BACKOFF_SECONDS
    max_evictions_per_minute: int = DEFAULT_MAX_EVICTIONS_PER_MINUTE
    # How long after its dispatch an AppWrapper is no priority preemption victim: its annotation, else the default,
    # at most the ceiling (which admission judges the annotation by too).
    min_runtime: minruntime.MinRuntime = minruntime.DEFAULT
    # How long after being dispatched again one that was evicted is no priority preemption victim; 0: off.
    preemption_cooldown: float = DEFAULT_PREEMPTION_COOLDOWN_SECONDS
    node_health: NodeHealth | None = None  # None: Autopilot's rules (mcad.model.nodehealth)
    # The controller's are known once it knows its own namespace (mcad.cli.controller.protected_namespaces).
    protected_namespaces: frozenset[str] = frozenset()
    cluster_policy: Policy | None = None  # hub mode: None takes the hub's own (its clusters file's)
    write_workers: int = DEFAULT_WRITE_WORKERS  # 0 runs writes inline (tests)
    backoff_status_rate: float = DEFAULT_BACKOFF_STATUS_RATE  # 0: not paced
    cycle_interval: float = DEFAULT_CYCLE_INTERVAL_SECONDS  # 0: a cycle as soon as one is asked for
    # Node label keys of the cluster's topology, largest first (block, rack, host): a preferred level falls back
    # up them (mcad.model.topology.Hierarchy). Required levels work without them.
    topology_levels: tuple[str, ...] = ()
    # Among AppWrappers of one priority, the tenant with the least decayed usage first (mcad.model.fairshare).
    fair_sharing: bool = False
    fair_sharing_half_life: float = 3600.0
    # Where usage outlives the controller: a ConfigMap of this name in the controller's own namespace ("": nowhere).
    fair_sharing_configmap: str = "mcad-fair-share"
    own_namespace: str = ""  # known once connected (mcad.cli.controller)
    fault_defaults: FaultDefaults = DEFAULTS  # the cluster's fault tolerance defaults, floors and ceilings


@dataclass(frozen=True)
class ApiSettings:
    """Which AppWrappers are served and the bounds they keep, for the dispatcher and admission alike."""

    legacy_api: bool = False
    quota_trees: bool = False
    limits: Limits = DEFAULT_LIMITS  # size bounds and the allowed scheduler names
    default_max_priority: int = tenancy.DEFAULT_MAX_PRIORITY
    allowed_protected: tuple[str, ...] = ()  # protected namespaces dispatched in after all


@dataclass(frozen=True)
class ServingSettings:
    """The HTTP port and who may read it."""

    bind_address: str  # "0": not served
    insecure: bool
    unknown_tokens_per_second: float  # TokenReviews a second for tokens not seen accepted (mcad.serve.endpointauth)
    unknown_tokens_burst: int

    @property
    def served(self) -> bool:
        return self.bind_address != "0"


@dataclass(frozen=True)
class AdmissionSettings:
    """The admission webhooks: where they are served, their certificate, who may call them and at what cost."""

    enabled: bool
    bind_address: str
    share_port: bool
    cert_dir: str | None
    cert_secret: str
    cert_namespace: str | None
    service_name: str
    cert_hosts: tuple[str, ...]
    configuration_name: str
    creator: str
    cert_poll_seconds: float
    drain_seconds: float
    client_ca: str | None
    client_names: tuple[str, ...]
    token_file: str | None
    access_reviews_per_second: float
    access_reviews_burst: int
    access_reviews_total: float
    api_server_cidrs: tuple[str, ...]
    allowed_kinds: str
    status_writers: tuple[str, ...]


@dataclass(frozen=True)
class HubSettings:
    """Hub mode: the worker clusters (None: dispatch into this cluster) and how often each is probed."""

    config: HubConfig | None = None  # the clusters file, parsed, with --cluster-policy applied
    probe_period: float = DEFAULT_PROBE_PERIOD_SECONDS


@dataclass(frozen=True)
class LeaderElectionSettings:
    """The Lease replicas compete for (off: one process dispatches with no Lease)."""

    enabled: bool = False
    lease_name: str = "mcad-controller"
    namespace: str | None = None  # None: the controller's own
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    label_pod: bool = False


# The flags' defaults as groups, for callers that change nothing of one.
DEFAULT_SCHEDULING = SchedulingSettings()
DEFAULT_API = ApiSettings()
