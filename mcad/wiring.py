"""The composition root: the controller's informers and the dispatcher they feed, connected but not running.

Contract:
- ``build(conn, scheduling, api, recorder=, hub=)`` returns ``(dispatcher, informers)``: informers over AppWrappers
  (both groups with ``api.legacy_api``), Namespaces and PriorityClasses (the admins' rules,
  ``mcad.k8s.tenantstore``), Nodes and Pods (all namespaces), QuotaSubtrees with ``api.quota_trees``; and a
  ``Dispatcher`` reading them through the namespace rules, writing through one ``kube.Client``, with its handlers
  registered. Its users are the controller process
  (``mcad.cli.controller``) and the offline reports (``mcad.cli.offline``), so both see the same stores through
  the same transforms.
- It starts nothing: no informer, no hub prober, no write pool, no event recorder, not one thread, and it makes no
  request. The caller decides what runs: the controller starts the informers, the hub, and ``Dispatcher.run``
  (which starts the write pool once the informers have synced); the offline reports list each informer once and
  rebuild the ledger without ever starting the pool, so any write they attempted would raise.
- The controller's flags come as settings groups (``mcad.settings``: ``SchedulingSettings`` for the loop,
  ``ApiSettings`` for the informers), never as loose keywords; each owner is handed only its part of them.
- ``loop(...)`` builds every owner of the dispatcher loop (``mcad.loop``) and hands each the owners it needs, then
  the ``Dispatcher`` that routes keys to them; no owner calls back into the dispatcher. The one cycle among owners
  (``Active`` takes objects back through the sites and tells its watchers, which take AppWrappers back through it)
  is closed here, by ``Active.connect``. Hub mode's sites and placement are chosen here too, so the loop never
  imports ``mcad.hub``. Tests build their loops through it as well.
- ``quota_served(client)`` asks the API server (one discovery request) whether QuotaSubtrees are served; the
  caller turns ``api.quota_trees`` off when they are not.

Layer: this module may import any module of ``mcad`` except the entry points (``mcad.cli``); nothing but the entry
points imports it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mcad.api.appwrapper import (
    ACTIVE_STATES,
    FINAL_STATES,
    GROUP,
    LEGACY_GROUP,
    LEGACY_PLURAL,
    PLURAL,
    VERSION,
    AppWrapperView,
    appwrapper_view,
    reuse_spec,
)
from mcad.api.views import NodeView, PodView, node_view, pod_view
from mcad.clock import Clock, RealClock
from mcad.errors import ApiError
from mcad.hub.connections import Hub
from mcad.hub.placement import WorkerPlacement
from mcad.hub.sites import WorkerClusters, WorkerPods, WorkerSites
from mcad.k8s import events, kube
from mcad.k8s.dispatchjob import Writer
from mcad.k8s.fairsharestore import FairShareStore
from mcad.k8s.informer import Informer, Reconnects, Store
from mcad.k8s.legacy import MergedAppWrappers
from mcad.k8s.templates import Templates, TemplatesFirst, object_key
from mcad.k8s.tenantstore import TenantAppWrappers, priority_class_value
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.wrapped import WrappedObjects, informer_factory
from mcad.k8s.writes import Writes
from mcad.loop.active import Active
from mcad.loop.cycle import CycleOwners, DispatchCycle
from mcad.loop.decisions import Decisions
from mcad.loop.dispatcher import Dispatcher
from mcad.loop.dispatches import DISPATCH_RETRY, Dispatches, InFlight
from mcad.loop.evictions import (
    BACKOFF_CAP_FACTOR,
    EvictionOwners,
    Evictions,
)
from mcad.loop.fairsharing import FairSharing
from mcad.loop.follower import Follower
from mcad.loop.health import Health, HealthOwners
from mcad.loop.notices import Notices
from mcad.loop.owners import Owners, Settings
from mcad.loop.ownership import Ownership
from mcad.loop.pinning import PLACEMENT_MODES, Here, Pinning, Where
from mcad.loop.queued import Queued
from mcad.loop.quotastatus import QuotaStatusWriter
from mcad.loop.sites import LocalCluster, Sites
from mcad.loop.statussync import StatusSync
from mcad.loop.tools import LoopTools
from mcad.metrics import Metrics
from mcad.model import quota, tenancy
from mcad.model.accounting import Accountant
from mcad.model.fairshare import FairShare
from mcad.model.fit import SingleCluster, Targets
from mcad.model.keys import RECOVERED, URGENT, AppWrapperEvent, Key
from mcad.model.preemption import EvictionBudget, Preemptors
from mcad.model.reservations import Reservations
from mcad.model.retry import Backoff, Policy, RetryTimes, TokenBucket
from mcad.model.topology import Hierarchy
from mcad.settings import DEFAULT_API, DEFAULT_SCHEDULING, ApiSettings, SchedulingSettings

# How a queued AppWrapper is judged to fit: "nodes" packs its pods onto the nodes' free room (first-fit
# decreasing; taints, nodeSelector, affinity), "aggregate" compares its total demand with the cluster's free total.
FIT_MODES = ("nodes", "aggregate")
# Retrying failed status writes (mcad.model.retry): 0.25 s doubling to 4 s, so a status is right within 4 s of a
# fault's end, at most 50 a second in all; giving up only stops the timer (the next event of the AppWrapper writes
# again). Failed object writes: mcad.loop.dispatches.
STATUS_RETRY = Policy(base=0.25, cap=4.0, rate=50.0, burst=500, give_up_attempts=20, give_up_seconds=300.0)
# What waiting AppWrappers are told (their Backoff status) is written at most
# ``SchedulingSettings.backoff_status_rate`` a second after a burst of this many, as their Events are
# (mcad.k8s.events).
BACKOFF_STATUS_BURST = 100


def dispatcher_queue(clock: Clock | None = None) -> WorkQueue[Key]:
    """The dispatcher's work queue: ``mcad.model.keys.URGENT`` kinds handed out ahead of the rest."""
    return WorkQueue(clock=clock, name="dispatcher", urgent=URGENT)


def loop(*, appwrappers: Store[AppWrapperView], nodes: Store[NodeView], pods: Store[PodView], writer: Writer,
         scheduling: SchedulingSettings = DEFAULT_SCHEDULING, queue: WorkQueue[Key] | None = None,
         clock: Clock | None = None, metrics: Metrics | None = None, recorder: events.EventSink | None = None,
         wrapped: WrappedObjects | None = None, quota_subtrees: Store[quota.SubtreeView] | None = None,
         hub: WorkerClusters | None = None) -> Dispatcher:
    """The dispatcher loop over these stores, with every owner built and connected (see the module docstring), each
    handed its part of ``scheduling``. Fair sharing reads namespace tenants' weights from the Namespace policies of
    ``appwrappers`` when it is the admins' view (``TenantAppWrappers``, as the controller's is; else each is 1).
    ``hub``: objects go into worker clusters (``mcad.hub``), placed by
    ``scheduling.cluster_policy`` (None: the hub's own); ``wrapped``: completion of wrapped objects is watched (None
    in tests of other parts); ``scheduling.write_workers=0`` runs writes inline (tests)."""
    fit, placement, strict_fifo = scheduling.fit, scheduling.placement, scheduling.strict_fifo
    preemption, fault_defaults = scheduling.preemption, scheduling.fault_defaults
    if fit not in FIT_MODES:
        raise ValueError(f"fit must be one of {', '.join(FIT_MODES)}, not {fit!r}")
    if placement not in PLACEMENT_MODES:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENT_MODES)}, not {placement!r}")
    if hub is not None and fit != "nodes":
        raise ValueError("hub mode places pods on a worker's nodes: fit must be 'nodes'")
    queue = queue if queue is not None else dispatcher_queue()
    clock = clock if clock is not None else RealClock()
    metrics = metrics if metrics is not None else Metrics()
    metrics.name_topology_levels(scheduling.topology_levels)  # tenants name levels: only these get a label value
    recorder = recorder if recorder is not None else events.DiscardEvents()
    binding = placement == "binding" and fit == "nodes"  # pods pinned to their plan's nodes (mcad.loop.pinning)
    by_nodes = fit == "nodes"
    # Quota trees: None when not served (no QuotaSubtree CRD, or --no-quota); then nothing is charged.
    accountant = Accountant(quota_trees=quota_subtrees is not None, node_health=scheduling.node_health)
    writes = Writes(queue, workers=scheduling.write_workers)
    tools = LoopTools(queue=queue, clock=clock, writes=writes, metrics=metrics)
    rate = scheduling.backoff_status_rate
    pace = TokenBucket(rate, BACKOFF_STATUS_BURST, clock) if rate > 0 else None
    decisions = Decisions(StatusSync(writer, writes, queue, Backoff(clock, STATUS_RETRY), clock, pace), recorder,
                          metrics, clock)
    backoff = scheduling.preemption_backoff
    preemptors = Preemptors(scheduling.victim_timeout, backoff, backoff * BACKOFF_CAP_FACTOR)
    # Dispatches whose writes are under way: the record goes to Dispatches alone (its writer); the queue, built
    # before it, reads the record's read-only view, as evictions do.
    in_flight = InFlight()
    dispatch_retries = RetryTimes(clock, DISPATCH_RETRY)  # Dispatches' too; notices read them through a reader
    queued = Queued(appwrappers, decisions, accountant, in_flight=in_flight.view, preemptors=preemptors,
                    by_nodes=by_nodes, fair=scheduling.fair_sharing)
    notices = Notices(queued, appwrappers, decisions, preemptors=preemptors, dispatch_retries=dispatch_retries.reader(),
                      metrics=metrics, clock=clock, strict_fifo=strict_fifo)
    active = Active(appwrappers, accountant, decisions, queued, notices, queue=queue, clock=clock, metrics=metrics)
    fair = None
    if scheduling.fair_sharing:
        store = FairShareStore(writer, scheduling.own_namespace, scheduling.fair_sharing_configmap) \
            if scheduling.own_namespace and scheduling.fair_sharing_configmap else None
        fair = FairSharing(FairShare(scheduling.fair_sharing_half_life), accountant, active.views, clock, store=store,
                           writes=writes,
                           namespaces=appwrappers.namespaces if isinstance(appwrappers, TenantAppWrappers) else None,
                           adoptions=lambda: active.adoptions)
    targets: Targets
    sites: Sites
    if hub is None:
        targets = SingleCluster(Hierarchy(scheduling.topology_levels))
        sites = LocalCluster(writer, writer, writes, wrapped,
                             retry=lambda key: queue.add_rate_limited(AppWrapperEvent(key)),
                             again=lambda key: queue.add(AppWrapperEvent(key)), gate=binding,
                             health=accountant.node_health)
        where: Where = Here(writer)
    else:
        targets = worker_placement = WorkerPlacement(hub, scheduling.cluster_policy,
                                                     Hierarchy(scheduling.topology_levels))
        sites = WorkerSites(hub, worker_placement, active=active, queued=queued, decisions=decisions,
                            accountant=accountant, appwrappers=appwrappers, finalizers=writer, writes=writes,
                            queue=queue, clock=clock, gate=binding)
        where = WorkerPods(hub, worker_placement)
    dispatches = Dispatches(active, queued, decisions, notices, appwrappers=appwrappers, accountant=accountant,
                            sites=sites, writer=writer, writes=writes, queue=queue, retries=dispatch_retries,
                            in_flight=in_flight)
    evictions = Evictions(EvictionOwners(preemptors, accountant, targets, active=active, decisions=decisions,
                                         notices=notices, in_flight=dispatches.in_flight, appwrappers=appwrappers),
                          tools, pods=writer, priority_preemption=preemption,
                          budget=EvictionBudget(scheduling.max_evictions_per_minute),
                          min_runtime=scheduling.min_runtime, cooldown=scheduling.preemption_cooldown)
    ownership = Ownership(appwrappers=appwrappers, pods=pods, objects_of=sites.wrapped_of)
    pinning = Pinning(binding=binding, accountant=accountant, pods=pods, where=where, writes=writes, queue=queue,
                      queued=queued, active=active, decisions=decisions, appwrappers=appwrappers, recorder=recorder,
                      metrics=metrics, ownership=ownership, timer=clock.monotonic)
    health = Health(HealthOwners(active, queued, decisions, appwrappers=appwrappers, accountant=accountant,
                                 sites=sites), tools, defaults=fault_defaults, writer=writer, by_nodes=by_nodes)
    follower = Follower(active, queued, decisions, appwrappers=appwrappers, accountant=accountant, sites=sites,
                        unplaced=pinning, health=health, queue=queue, clock=clock)
    active.connect(sites, watchers=(follower, pinning, health, *((fair,) if fair is not None else ())),
                   placing=pinning.placing)
    held = Reservations(scheduling.reservations, targets, active)
    cycle = DispatchCycle(CycleOwners(appwrappers, accountant, queued=queued, active=active, decisions=decisions,
                                      dispatches=dispatches, evictions=evictions, reservations=held, notices=notices,
                                      pinning=pinning, sites=sites, preemptors=preemptors, targets=targets,
                                      fair=fair),
                          tools, strict_fifo=strict_fifo, by_nodes=by_nodes, interval=scheduling.cycle_interval)
    quota_status = QuotaStatusWriter(accountant.quota, quota_subtrees, writer, writes) \
        if accountant.quota is not None and quota_subtrees is not None else None
    owners = Owners(accountant=accountant, decisions=decisions, queued=queued, active=active, dispatches=dispatches,
                    evictions=evictions, notices=notices, follower=follower, pinning=pinning, ownership=ownership,
                    sites=sites, reservations=held, preemptors=preemptors, cycle=cycle, targets=targets, writes=writes,
                    quota_status=quota_status, health=health, fair=fair)
    settings = Settings(fit=fit, strict_fifo=strict_fifo, preemption=preemption,
                        placement_mode="binding" if binding else "advisory",
                        protected_namespaces=scheduling.protected_namespaces, fault_defaults=fault_defaults,
                        topology_levels=scheduling.topology_levels)
    return Dispatcher(owners, settings, appwrappers=appwrappers, nodes=nodes, pods=pods, queue=queue, clock=clock,
                      metrics=metrics, quota_subtrees=quota_subtrees, wrapped=wrapped)


def _template_key(aw: AppWrapperView) -> tuple[str, str, str]:
    return object_key(aw.api_version, aw.namespace, aw.name)


def _pod_uid(raw: dict[str, object]) -> str:
    return str(raw["metadata"]["uid"])  # type: ignore[index]


def build(conn: kube.Connection, scheduling: SchedulingSettings = DEFAULT_SCHEDULING,
          api: ApiSettings = DEFAULT_API, *, recorder: events.EventSink | None = None,
          hub: Hub | None = None, watch_wrapped: bool = True) -> tuple[Dispatcher, list[Informer[Any]]]:
    """The dispatcher and the informers to start for it (see the module docstring). ``api.default_max_priority`` is
    the ceiling where a namespace sets none. Informers over wrapped kinds start when an AppWrapper needs them
    (``mcad.k8s.wrapped``); with ``watch_wrapped`` False they never do (a one-time view that starts no thread: a
    pod's owner chain is then never read, and it counts by its label, as in the controller's first moments). With
    ``hub``, Nodes, Pods and wrapped kinds are the workers' (the hub's own cluster runs
    nothing of ours) and the hub's threads start their informers, so they are not in the list returned.
    AppWrappers beyond ``api.limits`` are refused (failed) by the dispatcher, and so are those in
    ``scheduling.protected_namespaces``."""
    limits = api.limits
    # Every informer of this API server reconnects together after an outage, and the dispatcher then retries at
    # once the writes that failed meanwhile.
    peers = Reconnects()

    # A dispatch reads its AppWrapper's templates, which the views drop, from here before asking the API server.
    templates = Templates()

    def view(raw: dict[str, Any]) -> AppWrapperView:
        judged = appwrapper_view(raw, limits)
        # A spec seen for the first time (or changed): its templates are kept while it may still be dispatched.
        if judged.spec.demand_error is None and not judged.deleting and judged.generation > 0 \
                and judged.status.state not in ACTIVE_STATES and judged.status.state not in FINAL_STATES:
            templates.keep(_template_key(judged), judged.uid, judged.generation, raw)
        else:
            templates.forget(_template_key(judged), judged.uid)
        return judged

    def gone(kind: str, old: AppWrapperView | None, _new: AppWrapperView | None) -> None:
        if kind == "DELETED" and old is not None:
            templates.forget(_template_key(old), old.uid)

    def reuse(stored: AppWrapperView, raw: dict[str, Any]) -> AppWrapperView | None:
        # A status write (most events) keeps the spec: what it implies is taken from the stored view.
        return reuse_spec(stored, raw, limits)

    current = Informer("appwrappers", kube.ResourceClient(conn, group=GROUP, version=VERSION, plural=PLURAL),
                       transform=view, reuse=reuse, peers=peers)
    current.add_handler(gone)
    informers: list[Informer[Any]] = [current]
    appwrappers: Store[AppWrapperView] = current
    if api.legacy_api:
        legacy = Informer("appwrappers-legacy", kube.ResourceClient(conn, group=LEGACY_GROUP, version=VERSION,
                                                                    plural=LEGACY_PLURAL), transform=view,
                          reuse=reuse, peers=peers)
        legacy.add_handler(gone)
        informers.append(legacy)
        appwrappers = MergedAppWrappers(current, legacy)
    # What the dispatcher sees is what the namespace admins allow: bound quota nodes, capped priorities.
    namespaces = Informer("namespaces", kube.ResourceClient(conn, group="", version="v1", plural="namespaces"),
                          transform=tenancy.namespace_policy, peers=peers)
    classes = Informer("priorityclasses", kube.ResourceClient(conn, group="scheduling.k8s.io", version="v1",
                                                              plural="priorityclasses"),
                       transform=priority_class_value, peers=peers)
    informers += [namespaces, classes]
    appwrappers = TenantAppWrappers(appwrappers, namespaces, classes, api.default_max_priority)
    subtrees = Informer("quotasubtrees", kube.ResourceClient(conn, group=quota.GROUP, version=quota.VERSION,
                                                             plural=quota.PLURAL),
                        transform=quota.subtree_view, peers=peers) if api.quota_trees else None
    client = kube.Client(conn)
    writer = TemplatesFirst(client, templates)
    queue = dispatcher_queue()
    peers.on_recovered(lambda: queue.add(RECOVERED))
    if hub is not None:
        # Hub mode pins pods in the workers whatever --placement says (as it always has).
        dispatcher = loop(appwrappers=appwrappers, nodes=hub.nodes, pods=hub.pods, writer=writer, queue=queue,
                          scheduling=dataclasses.replace(scheduling, placement="binding"), recorder=recorder,
                          quota_subtrees=subtrees, hub=hub)
    else:
        nodes = Informer("nodes", kube.ResourceClient(conn, group="", version="v1", plural="nodes"),
                         transform=node_view, peers=peers)
        # Pods are keyed by uid: a pod re-created under the same name is a different consumer of capacity.
        pods = Informer("pods", kube.ResourceClient(conn, group="", version="v1", plural="pods"),
                        transform=pod_view, key=_pod_uid, peers=peers)
        wrapped = WrappedObjects(informer_factory(conn, client, peers=peers),
                                 lambda key: queue.add(AppWrapperEvent(key)), background=watch_wrapped)
        dispatcher = loop(appwrappers=appwrappers, nodes=nodes, pods=pods, writer=writer, queue=queue,
                          scheduling=scheduling, wrapped=wrapped, recorder=recorder, quota_subtrees=subtrees)
        informers += [nodes, pods]
    if subtrees is not None:
        informers.append(subtrees)
    return dispatcher, informers


def quota_served(client: kube.Client) -> bool:
    """Whether the API server serves QuotaSubtrees (the CRD is installed)."""
    try:
        client.resource(quota.API_VERSION, quota.KIND)
    except ApiError:
        return False
    return True
