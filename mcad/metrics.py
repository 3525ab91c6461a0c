"""Prometheus metrics of one controller process (text format on ``/metrics``, see ``mcad.serve.server``).

Contract:
- ``Metrics`` owns its own registry: no process-wide state, so tests (and a process running two dispatchers) can
  build as many as they like.
- Events are counted where they happen, by the dispatcher thread: ``decision`` (dispatched, queued, preempted,
  requeued, completed, failed), ``dispatch_latency`` (AppWrapper creation to its Dispatched status),
  ``cycle`` (one dispatch cycle's duration), ``topology_placed`` (a dispatch of an AppWrapper that asks for a
  topology level), ``preemption_spared`` (an AppWrapper a preemptor would have evicted but spared, by reason).
  Each is a dict lookup and an add; nothing here blocks.
- Label values tenants choose are bounded: priority classes (``PRIORITY_LABELS``, then "other") and topology levels
  (only those named by ``name_topology_levels``, the controller's --topology-level, else "other").
- State is read at scrape time from ``Sources`` the controller registers: informer relists, API errors by verb and
  code, leader status, event recorder counters, AppWrappers by state (the informer's store, corrected by the
  decisions it does not show yet), and what the dispatcher loop publishes (``LoopState``: the ledger's totals,
  its queue, its decisions not yet seen, placements per worker), one immutable object replaced whole at most once
  per ``PUBLISH_INTERVAL_SECONDS`` after a change, at a cost that does not grow with the number of AppWrappers.
  Every source is a thread-safe read, so a scrape never waits for the dispatcher loop and never reads its state
  while the loop changes it.
- ``serve(stats)`` adds a port's front door counters (``PortCounters``: ``mcad.serve.frontdoor.Stats``, read through a
  protocol so that the loop's owners, which count here, do not reach the HTTP server) as the ``mcad_http_*`` families,
  labelled ``server`` (http, webhook): connections open and their bound, requests in progress and served,
  connections closed by the door and requests it refused, by reason.
- Units are Prometheus base units: cpu in cores, memory in bytes, other resources in their own counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mcad import __version__
from mcad.api.resources import ZERO, ResourceVector
from mcad.k8s.events import EventCounters
from mcad.model import status
from mcad.model.preemption import SPARED_REASONS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DECISIONS = ("dispatched", "queued", "preempted", "requeued", "completed", "failed")
# Creation to dispatch: from an empty cluster's tens of milliseconds to a busy queue's hours.
# Distinct priority_class label values of mcad_time_to_dispatch_seconds (tenants pick spec.priority freely: without
# a bound they could make the scrape as large as they like).
PRIORITY_LABELS = 32
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
# A cycle is sub-millisecond for a short queue and tens of milliseconds for thousands of queued demand groups.
UNGATE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10, 30)
CYCLE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def base_units(resource: str, amount: int) -> float:
    """A ledger amount in Prometheus base units (the ledger counts cpu in millicores)."""
    return amount / 1000 if resource == "cpu" else float(amount)


# How a gang asks for a topology level (mcad.model.topologyasked), and the label value of a level the controller is
# not configured with: levels come from tenants' annotations, so only the configured ones get a value of their own.
TOPOLOGY_ASKS = ("required", "preferred")
OTHER_LEVEL = "other"

# Every series of mcad_caller_refusals exists from the start (rate() needs a zero).
CALLER_REFUSALS = (("webhook", "unauthenticated"), ("webhook", "access_reviews_source"),
                   ("webhook", "access_reviews_total"), ("webhook", "access_reviews_api_server_total"),
                   ("http", "unknown_tokens"))

# The loop publishes its state for scrapes at most this often (and within this long of a change).
PUBLISH_INTERVAL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class LoopState:
    """What the dispatcher loop last published for scrapes (never changed: the loop replaces it whole)."""

    # (capacity, used, reserved, free) of the ledger.
    capacity: tuple[ResourceVector, ResourceVector, ResourceVector, ResourceVector] = (ZERO, ZERO, ZERO, ZERO)
    # queued (waiting to fit), dispatching (writes under way), preempting (waiting for victims).
    queue: Mapping[str, int] = field(default_factory=dict)
    # key -> (uid, state) of the loop's decisions the AppWrapper informer may not show yet: a scrape counts
    # AppWrappers by state from the informer's store, corrected by these (O(decisions) to publish, not O(store)).
    decided: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # Hub mode: AppWrappers whose objects are in each worker.
    placed: Mapping[str, int] = field(default_factory=dict)
    # Blocked AppWrappers holding a reservation after the last dispatch cycle (mcad.model.reservations).
    reservations: int = 0
    # Backoff statuses decided but waiting for their pace (--backoff-status-rate, mcad.loop.statussync).
    backoff_statuses_waiting: int = 0
    # --placement=binding: gated pods by what they wait for (mcad.loop.pinning.Pinning.counts).
    gated: Mapping[str, int] = field(default_factory=dict)


class PortCounters(Protocol):
    """One port's front door counters (``mcad.serve.frontdoor.Stats``), read at scrape time from any thread."""

    @property
    def name(self) -> str: ...
    @property
    def cap(self) -> int: ...
    @property
    def open(self) -> int: ...
    @property
    def accepted(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def requests(self) -> int: ...
    @property
    def closed(self) -> Mapping[str, int]: ...
    @property
    def rejected(self) -> Mapping[str, int]: ...


@dataclass
class Sources:
    """What a scrape reads. Each callable must be safe to call from the HTTP server's threads."""

    # (capacity, used, reserved, free) of the ledger.
    capacity: Callable[[], tuple[ResourceVector, ResourceVector, ResourceVector, ResourceVector]] | None = None
    # AppWrappers by status.state ("" before the controller has written one).
    appwrapper_states: Callable[[], Mapping[str, int]] | None = None
    # The dispatcher's own queue: queued (waiting to fit), dispatching (writes under way), preempting.
    queue: Callable[[], Mapping[str, int]] | None = None
    # Blocked AppWrappers holding a reservation.
    reservations: Callable[[], int] | None = None
    # Backoff statuses waiting for their pace.
    backoff_statuses_waiting: Callable[[], int] | None = None
    # Gated pods by what they wait for (--placement=binding).
    gated_pods: Callable[[], Mapping[str, int]] | None = None
    # informer name -> (relists, synced)
    informers: Callable[[], Mapping[str, tuple[int, bool]]] | None = None
    # (verb, HTTP code) -> failed requests
    api_errors: Callable[[], Mapping[tuple[str, int], int]] | None = None
    # (verb, resource) -> writes sent
    api_writes: Callable[[], Mapping[tuple[str, str], int]] | None = None
    # None: no leader election (the process always leads).
    leader: Callable[[], bool] | None = None
    # the event recorder's counters
    events: Callable[[], EventCounters] | None = None
    # (tree, node, resource, limit, used, borrowed) rows of the quota trees
    quota: Callable[[], Iterable[tuple[str, str, str, float, float, float]]] | None = None
    # Hub mode: (worker, health state, usable, AppWrappers placed there) rows
    clusters: Callable[[], Iterable[tuple[str, str, bool, int]]] | None = None
    # (endpoint, reason) -> requests refused before any work for them (mcad.admission.callers.CallerRefusals)
    caller_refusals: Callable[[], Mapping[tuple[str, str], int]] | None = None


class _StateCollector(Collector):
    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        s = self.sources
        info = GaugeMetricFamily("mcad_build_info", "The running mcad version (always 1).", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        if s.leader is not None:
            yield GaugeMetricFamily("mcad_leader", "1 while this replica leads (dispatches), 0 while it stands by.",
                                    value=1 if s.leader() else 0)
        else:
            yield GaugeMetricFamily("mcad_leader", "1 while this replica leads (dispatches), 0 while it stands by.",
                                    value=1)
        if s.capacity is not None:
            yield from _capacity(*s.capacity())
        if s.appwrapper_states is not None:
            states = GaugeMetricFamily("mcad_appwrappers", "AppWrappers by status.state (New: no state yet).",
                                       labels=["state"])
            for state, count in sorted(s.appwrapper_states().items()):
                states.add_metric([state or "New"], count)
            yield states
        if s.queue is not None:
            queue = GaugeMetricFamily(
                "mcad_queue_length", "AppWrappers in the dispatcher's hands by queue state: queued (waiting to fit), "
                "preempting (waiting for lower-priority victims to leave), dispatching (writes under way).",
                labels=["state"])
            for state, count in sorted(s.queue().items()):
                queue.add_metric([state], count)
            yield queue
        if s.reservations is not None:
            yield GaugeMetricFamily("mcad_reservations", "Blocked AppWrappers holding a reservation: room that those "
                                    "behind them may not take (unless sure to end first), after the last dispatch "
                                    "cycle.", value=s.reservations())
        if s.backoff_statuses_waiting is not None:
            yield GaugeMetricFamily("mcad_backoff_statuses_waiting", "Backoff statuses (what a waiting AppWrapper is "
                                    "told) decided but not written yet: beyond --backoff-status-rate they wait "
                                    "their turn.", value=s.backoff_statuses_waiting())
        if s.gated_pods is not None:
            gated = GaugeMetricFamily(
                "mcad_gated_pods", "Pods held by mcad's scheduling gate (--placement=binding), by what they wait for: "
                "ungating (the pin is being written), placing (beyond the plan, to be placed in the next cycle), room "
                "(beyond the plan, no node has room now), dispatch (their AppWrapper is not dispatched now: being "
                "dispatched, queued or draining).",
                labels=["waiting_for"])
            counts = s.gated_pods()
            for state in ("dispatch", "placing", "room", "ungating"):
                gated.add_metric([state], counts.get(state, 0))
            yield gated
        if s.informers is not None:
            relists = CounterMetricFamily("mcad_informer_relists", "Full lists an informer made after its first "
                                          "one: its watch expired (410) or failed.", labels=["informer"])
            synced = GaugeMetricFamily("mcad_informer_synced", "1 once an informer's first list is applied.",
                                       labels=["informer"])
            for name, (count, is_synced) in sorted(s.informers().items()):
                relists.add_metric([name], count)
                synced.add_metric([name], 1 if is_synced else 0)
            yield relists
            yield synced
        if s.api_errors is not None:
            errors = CounterMetricFamily("mcad_api_errors", "Failed API server requests by Kubernetes verb and HTTP "
                                         "code (0: no response: connection refused, timeout).", labels=["verb", "code"])
            for (verb, code), count in sorted(s.api_errors().items()):
                errors.add_metric([verb, str(code)], count)
            yield errors
        if s.api_writes is not None:
            writes = CounterMetricFamily("mcad_api_writes", "Writes sent to the API server (create, update, patch, "
                                         "delete; whatever the answer) by verb and resource: where the controller's "
                                         "writes go.", labels=["verb", "resource"])
            for (verb, resource), count in sorted(s.api_writes().items()):
                writes.add_metric([verb, resource], count)
            yield writes
        if s.events is not None:
            yield from _events(s.events())
        if s.quota is not None:
            yield from _quota(s.quota())
        if s.clusters is not None:
            yield from _clusters(s.clusters())
        if s.caller_refusals is not None:
            refusals = CounterMetricFamily(
                "mcad_caller_refusals", "Requests refused to bound what an unauthenticated caller can cost, by "
                "endpoint and reason: webhook/unauthenticated (no accepted client certificate or token, 401), "
                "webhook/access_reviews_source, webhook/access_reviews_total and "
                "webhook/access_reviews_api_server_total (a SubjectAccessReview over the bound per source, in all, "
                "or in all for the API server's addresses: the review is refused), http/unknown_tokens (a "
                "TokenReview of an unknown bearer token over the bound, 503).", labels=["endpoint", "reason"])
            refused: dict[tuple[str, str], int] = dict.fromkeys(CALLER_REFUSALS, 0)
            refused.update(s.caller_refusals())
            for (endpoint, reason), count in sorted(refused.items()):
                refusals.add_metric([endpoint, reason], count)
            yield refusals


_CLUSTER_STATES = ("Unknown", "Healthy", "Unreachable", "Unauthorized")


def _clusters(rows: Iterable[tuple[str, str, bool, int]]) -> Iterator[Metric]:
    healthy = GaugeMetricFamily("mcad_cluster_healthy", "1 while a worker cluster takes part in placement (reachable, "
                                "credentials accepted, Nodes and Pods listed), else 0.", labels=["cluster"])
    state = GaugeMetricFamily("mcad_cluster_state", "A worker cluster's health state (1 for the current one): "
                              "Unauthorized means its credentials are rejected.", labels=["cluster", "state"])
    placed = GaugeMetricFamily("mcad_cluster_appwrappers", "AppWrappers whose objects are in a worker cluster.",
                               labels=["cluster"])
    for name, current, usable, count in rows:
        healthy.add_metric([name], 1.0 if usable else 0.0)
        for candidate in _CLUSTER_STATES:
            state.add_metric([name, candidate], 1.0 if candidate == current else 0.0)
        placed.add_metric([name], float(count))
    yield healthy
    yield state
    yield placed


def _quota(rows: Iterable[tuple[str, str, str, float, float, float]]) -> Iterator[Metric]:
    labels = ["tree", "node", "resource"]
    limit = GaugeMetricFamily("mcad_quota_limit", "A quota tree node's limit (quotas.requests).", labels=labels)
    used = GaugeMetricFamily("mcad_quota_used", "Demand of dispatched AppWrappers charged to the node or below it.",
                             labels=labels)
    borrowed = GaugeMetricFamily("mcad_quota_borrowed", "max(0, used - limit): what the node borrows from its "
                                 "siblings through its parent.", labels=labels)
    for tree, node, resource, lim, use, borrow in rows:
        limit.add_metric([tree, node, resource], lim)
        used.add_metric([tree, node, resource], use)
        borrowed.add_metric([tree, node, resource], borrow)
    yield limit
    yield used
    yield borrowed


def _events(counters: EventCounters) -> Iterator[Metric]:
    yield CounterMetricFamily("mcad_events_recorded", "Events the dispatcher asked for (one per transition).",
                              value=counters.recorded)
    yield CounterMetricFamily("mcad_events_aggregated", "Repeats that raised an existing Event's count instead of "
                              "creating another.", value=counters.aggregated)
    yield CounterMetricFamily("mcad_events_sent", "Event writes the API server accepted.", value=counters.sent)
    dropped = CounterMetricFamily("mcad_events_dropped", "Events not written, by reason: per_object_limit, "
                                  "global_limit, queue_full, send_failed, stopped, invalid.", labels=["reason"])
    for reason, count in sorted(counters.dropped.items()):
        dropped.add_metric([reason], count)
    yield dropped
    errors = CounterMetricFamily("mcad_event_send_errors", "Failed Event writes by HTTP code (0: no response).",
                                 labels=["code"])
    for code, count in sorted(counters.send_errors.items()):
        errors.add_metric([str(code)], count)
    yield errors
    yield GaugeMetricFamily("mcad_events_queued", "Event writes waiting to be sent.", value=counters.queued)


def _capacity(capacity: ResourceVector, used: ResourceVector, reserved: ResourceVector,
              free: ResourceVector) -> Iterator[Metric]:
    names = sorted(set(capacity) | set(used) | set(reserved))
    for metric, help_text, vector in (
        ("mcad_capacity", "Allocatable of Ready, schedulable nodes, per resource (cpu in cores, memory in bytes).",
         capacity),
        ("mcad_capacity_used", "Requests of non-terminal pods bound to those nodes.", used),
        ("mcad_capacity_reserved", "Demand of dispatched AppWrappers not yet covered by their own pods.", reserved),
        ("mcad_capacity_free", "capacity - used - reserved: what the next dispatch may take.", free),
    ):
        family = GaugeMetricFamily(metric, help_text, labels=["resource"])
        for name in names:
            family.add_metric([name], base_units(name, vector.get(name)))
        yield family


class _ServingCollector(Collector):
    def __init__(self, ports: list[PortCounters]) -> None:
        self.ports = ports

    def collect(self) -> Iterator[Metric]:
        labels = ["server"]
        opened = GaugeMetricFamily("mcad_http_connections", "Connections open on a port.", labels=labels)
        cap = GaugeMetricFamily("mcad_http_connection_limit", "Connections a port holds at most (one more closes "
                                "the longest-idle).", labels=labels)
        flight = GaugeMetricFamily("mcad_http_requests_in_flight", "Requests in the hands of a port's workers.",
                                   labels=labels)
        accepted = CounterMetricFamily("mcad_http_connections_accepted", "Connections accepted on a port (on the "
                                       "webhook's, each one a TLS handshake).", labels=labels)
        served = CounterMetricFamily("mcad_http_requests", "Request heads received on a port.", labels=labels)
        closed = CounterMetricFamily("mcad_http_connections_closed", "Connections the server closed or lost, by "
                                     "reason: <phase>_timeout (handshake, idle, header, body, write), evicted (for a "
                                     "new one, the bound reached), refused (bound reached, none evictable), "
                                     "client_gone, no_certificate, error.", labels=["server", "reason"])
        rejected = CounterMetricFamily("mcad_http_requests_rejected", "Requests refused by the server before their "
                                       "handler, by reason: busy (no worker in time), too_large, header_too_large, "
                                       "bad_request, unauthorized (the webhook's caller check).",
                                       labels=["server", "reason"])
        for stats in list(self.ports):
            opened.add_metric([stats.name], stats.open)
            cap.add_metric([stats.name], stats.cap)
            accepted.add_metric([stats.name], stats.accepted)
            flight.add_metric([stats.name], stats.in_flight)
            served.add_metric([stats.name], stats.requests)
            for reason, count in sorted(dict(stats.closed).items()):
                closed.add_metric([stats.name, reason], count)
            for reason, count in sorted(dict(stats.rejected).items()):
                rejected.add_metric([stats.name, reason], count)
        yield from (opened, cap, accepted, flight, served, closed, rejected)


# The causes a reset is counted under (mcad.loop.health); anything else is "other" (a bounded label set).
RESET_CAUSES = (status.FAILED_PODS, status.INSUFFICIENT_PODS, status.PODS_NOT_READY, status.FAILED_COMPONENT,
                status.MISSING_COMPONENT, status.NODE_UNHEALTHY, "other")


class Metrics:
    """The process's metrics: counters the dispatcher bumps, plus state read at scrape time from ``sources``."""

    def __init__(self, sources: Sources | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.sources = sources if sources is not None else Sources()
        self._decisions = Counter("mcad_dispatch_decisions", "Decisions about AppWrappers, by kind: dispatched, "
                                  "queued (first time it waits), preempted (evicted and requeued for a higher "
                                  "priority), requeued (taken back: minAvailable not met), completed, failed.",
                                  ["decision"], registry=self.registry)
        for decision in DECISIONS:
            self._decisions.labels(decision)  # every series exists from the start: rate() needs a zero
        self._latency = Histogram("mcad_dispatch_latency_seconds", "From an AppWrapper's creation to its dispatch.",
                                  buckets=LATENCY_BUCKETS, registry=self.registry)
        self._waited = Histogram("mcad_time_to_dispatch_seconds", "From an AppWrapper's creation to its dispatch, "
                                 "by priority class (spec.priorityClassName, else spec.priority; at most "
                                 f"{PRIORITY_LABELS} distinct values, the rest as \"other\").",
                                 ["priority_class"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self._priority_labels: set[str] = set()
        self._cycle = Histogram("mcad_dispatch_cycle_duration_seconds", "One dispatch cycle: walking the queue and "
                                "deciding (writes happen in the background).", buckets=CYCLE_BUCKETS,
                                registry=self.registry)
        self._ungate = Histogram("mcad_pod_ungate_seconds", "--placement=binding: from when the controller's "
                                 "informer receives a gated pod to its pin written (the gate removed, the node "
                                 "required).",
                                 buckets=UNGATE_BUCKETS, registry=self.registry)
        self._pins = Counter("mcad_pod_pins", "--placement=binding: what became of gated pods: pinned (every pin "
                             "written), extra (placed beyond their plan, then pinned), released (ungated without a "
                             "pin), replanned (the node refused the pin), refused (not made by a dispatched "
                             "AppWrapper: left gated), unbound (pinned beyond the plan and not bound in time: the room "
                             "held for it given back).",
                             ["outcome"], registry=self.registry)
        for outcome in ("pinned", "extra", "released", "replanned", "refused", "unbound"):
            self._pins.labels(outcome)
        self._resets = Counter("mcad_appwrapper_resets", "Fault tolerance: resets of running AppWrappers (objects "
                               "deleted and dispatched again), by cause (the Unhealthy reason: FailedPods, "
                               "InsufficientPods, PodsNotReady, FailedComponent, MissingComponent, NodeUnhealthy).",
                               ["cause"], registry=self.registry)
        self._deferred_resets = Counter(
            "mcad_appwrapper_resets_deferred", "Fault tolerance: resets deferred because their namespace had had "
            "--max-resets-per-namespace-per-minute resets in the last minute (counted once per wait), by cause.",
            ["cause"], registry=self.registry)
        self._lost = Counter("mcad_appwrapper_reset_lost_seconds", "Fault tolerance: time lost to resets, by cause: "
                             "from the dispatch a reset ended to the reset (pod-seconds are not counted: this is "
                             "wall time of the AppWrappers' runs that were thrown away).",
                             ["cause"], registry=self.registry)
        self._ft_failures = Counter("mcad_appwrapper_fault_failures", "Fault tolerance: running AppWrappers failed, "
                                    "by reason (RetryLimitReached, TerminalExitCode).", ["reason"],
                                    registry=self.registry)
        for cause in RESET_CAUSES:
            self._resets.labels(cause)
            self._deferred_resets.labels(cause)
            self._lost.labels(cause)
        for reason in (status.RETRY_LIMIT_REACHED, status.TERMINAL_EXIT_CODE):
            self._ft_failures.labels(reason)
        self._spared = Counter("mcad_preemption_spared", "Priority preemption: running AppWrappers a preemptor "
                               "would have evicted but spared, by reason: min-runtime (dispatched less than their "
                               "minimum run time ago), cooldown (preempted before and dispatched again less than "
                               "--preemption-cooldown ago); each counted once per preemptor.",
                               ["reason"], registry=self.registry)
        for reason in SPARED_REASONS:
            self._spared.labels(reason)
        self._topology = Counter("mcad_topology_gangs_placed", "Dispatches of AppWrappers that ask for a topology "
                                 "level (themselves or a pod set), by level (a configured --topology-level, else "
                                 "\"other\") and ask (required, preferred); an AppWrapper counts once per level "
                                 "and ask it names.", ["level", "ask"], registry=self.registry)
        self._topology_levels: frozenset[str] = frozenset()
        self.name_topology_levels(())
        self.registry.register(_StateCollector(self.sources))
        self._ports: list[PortCounters] = []
        self.registry.register(_ServingCollector(self._ports))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...

    def serve(self, stats: PortCounters) -> None:
        """Export a port's front door counters (``mcad_http_*``)."""
        self._ports.append(stats)

    def decision(self, decision: str, count: int = 1) -> None:
        self._decisions.labels(decision).inc(count)

    def dispatch_latency(self, seconds: float, priority_class: str = "") -> None:
        """Time to dispatch; ``priority_class`` labels the per-priority histogram (bounded: tenants choose it)."""
        seconds = max(seconds, 0.0)
        self._latency.observe(seconds)
        label = priority_class or "none"
        if label not in self._priority_labels:
            if len(self._priority_labels) >= PRIORITY_LABELS:
                label = "other"
            else:
                self._priority_labels.add(label)
        self._waited.labels(label).observe(seconds)

    def reset(self, cause: str, lost_seconds: float) -> None:
        cause = cause if cause in RESET_CAUSES else "other"
        self._resets.labels(cause).inc()
        self._lost.labels(cause).inc(max(lost_seconds, 0.0))

    def reset_deferred(self, cause: str) -> None:
        self._deferred_resets.labels(cause if cause in RESET_CAUSES else "other").inc()

    def fault_failure(self, reason: str) -> None:
        self._ft_failures.labels(reason).inc()

    def preemption_spared(self, reason: str) -> None:
        """One AppWrapper a preemptor would have evicted but spared, for ``reason`` (``SPARED_REASONS``)."""
        self._spared.labels(reason if reason in SPARED_REASONS else "other").inc()

    def name_topology_levels(self, levels: Iterable[str]) -> None:
        """The levels ``topology_placed`` labels with their own name (--topology-level); any other counts as
        "other". Their series, and "other"'s, exist from now on."""
        self._topology_levels = frozenset(levels)
        for level in (*sorted(self._topology_levels), OTHER_LEVEL):
            for ask in TOPOLOGY_ASKS:
                self._topology.labels(level, ask)

    def topology_placed(self, asked: Iterable[tuple[str, str]]) -> None:
        """One dispatch of an AppWrapper that asked for these (level, ask) pairs: each series once, whatever
        number of pairs falls under it (two unconfigured levels are one "other")."""
        series = {(level if level in self._topology_levels else OTHER_LEVEL, ask)
                  for level, ask in asked if ask in TOPOLOGY_ASKS}
        for level, ask in series:
            self._topology.labels(level, ask).inc()

    def cycle(self, seconds: float) -> None:
        self._cycle.observe(seconds)

    def pin(self, outcome: str) -> None:
        self._pins.labels(outcome).inc()

    def ungate_latency(self, seconds: float) -> None:
        self._ungate.observe(max(seconds, 0.0))

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def dispatched_total(self) -> float:
        """``mcad_dispatch_decisions_total{decision="dispatched"}``, read from the counter alone (``value`` collects
        the whole registry, the AppWrapper count by state included: O(AppWrappers))."""
        for family in self._decisions.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("decision") == "dispatched":
                    return sample.value
        return 0.0

    def latency_buckets(self) -> tuple[tuple[float, float], ...]:
        """``mcad_dispatch_latency_seconds``: (upper bound, cumulative count) per bucket, ascending, +Inf last;
        read from the histogram alone (see ``dispatched_total``)."""
        buckets = []
        for family in self._latency.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets.append((float(sample.labels["le"]), sample.value))
        return tuple(sorted(buckets))

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """One sample's value (tests and the debug CLI): ``name`` as exposed, e.g. ``mcad_dispatch_decisions_total``."""
        return self.registry.get_sample_value(name, dict(labels or {}))
