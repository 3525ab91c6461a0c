"""The composition root: the controller's informers and the dispatcher they feed, connected but not running.

Contract:
- ``build(conn, ...)`` returns ``(dispatcher, informers)``: informers over AppWrappers (both groups with
  ``legacy_api``), Namespaces and PriorityClasses (the admins' rules, ``mcad.k8s.tenantstore``), Nodes and Pods (all
  namespaces), QuotaSubtrees with ``quota_trees``; and a ``Dispatcher`` reading them through the namespace rules,
  writing through one ``kube.Client``, with its handlers registered. Its users are the controller process
  (``mcad.cli.controller``) and the offline reports (``mcad.serve.debug.offline``), so both see the same stores through
  the same transforms.
- It starts nothing: no informer, no hub prober, no write pool, no event recorder, not one thread, and it makes no
  request. The caller decides what runs: the controller starts the informers, the hub, and ``Dispatcher.run``
  (which starts the write pool once the informers have synced); ``debug.offline`` lists each informer once and
  rebuilds the ledger without ever starting the pool, so any write it attempted would raise.
- ``quota_served(client)`` asks the API server (one discovery request) whether QuotaSubtrees are served; the
  caller turns ``quota_trees`` off when they are not.

Layer: this module may import any module of ``mcad`` except the entry points (``mcad.cli``); nothing but the entry
points and ``mcad.serve.debug`` imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcad.api.appwrapper import (
    GROUP,
    LEGACY_GROUP,
    LEGACY_PLURAL,
    PLURAL,
    VERSION,
    AppWrapperView,
    appwrapper_view,
    reuse_spec,
)
from mcad.api.validation import DEFAULT_LIMITS, Limits
from mcad.api.views import node_view, pod_view
from mcad.errors import ApiError
from mcad.hub.connections import Hub
from mcad.k8s import events, kube
from mcad.k8s.informer import Informer, Reconnects, Store
from mcad.k8s.legacy import MergedAppWrappers
from mcad.k8s.tenantstore import TenantAppWrappers, priority_class_value
from mcad.k8s.workqueue import WorkQueue
from mcad.k8s.wrapped import WrappedObjects, informer_factory
from mcad.loop.dispatcher import DEFAULT_VICTIM_TIMEOUT_SECONDS, Dispatcher
from mcad.model import quota, tenancy
from mcad.model.keys import RECOVERED, AppWrapperEvent, Key
from mcad.model.reservations import DEFAULT_RESERVATIONS


def _pod_uid(raw: dict[str, object]) -> str:
    return str(raw["metadata"]["uid"])  # type: ignore[index]


def build(conn: kube.Connection, *, strict_fifo: bool, write_workers: int = 32, preemption: bool = False,
          victim_timeout: float = DEFAULT_VICTIM_TIMEOUT_SECONDS,
          preemption_bounds: Mapping[str, Any] | None = None,
          fit: str = "nodes", legacy_api: bool = False, quota_trees: bool = False,
          recorder: events.EventSink | None = None,
          hub: Hub | None = None, limits: Limits = DEFAULT_LIMITS,
          default_max_priority: int = tenancy.DEFAULT_MAX_PRIORITY,
          protected_namespaces: frozenset[str] = frozenset(),
          reservations: int = DEFAULT_RESERVATIONS,
          placement: str = "binding") -> tuple[Dispatcher, list[Informer[Any]]]:
    """The dispatcher and the informers to start for it (see the module docstring). ``default_max_priority`` is
    the ceiling where a namespace sets none. Informers over wrapped kinds start when an AppWrapper needs them
    (``mcad.k8s.wrapped``). With ``hub``, Nodes, Pods and wrapped kinds are the workers' (the hub's own cluster runs
    nothing of ours) and the hub's threads start their informers, so they are not in the list returned.
    AppWrappers beyond ``limits`` are refused (failed) by the dispatcher, and so are those in
    ``protected_namespaces``."""
    # Every informer of this API server reconnects together after an outage, and the dispatcher then retries at
    # once the writes that failed meanwhile.
    peers = Reconnects()

    def view(raw: dict[str, Any]) -> AppWrapperView:
        return appwrapper_view(raw, limits)

    def reuse(stored: AppWrapperView, raw: dict[str, Any]) -> AppWrapperView | None:
        # A status write (most events) keeps the spec: what it implies is taken from the stored view.
        return reuse_spec(stored, raw, limits)

    current = Informer("appwrappers", kube.ResourceClient(conn, group=GROUP, version=VERSION, plural=PLURAL),
                       transform=view, reuse=reuse, peers=peers)
    informers: list[Informer[Any]] = [current]
    appwrappers: Store[AppWrapperView] = current
    if legacy_api:
        legacy = Informer("appwrappers-legacy", kube.ResourceClient(conn, group=LEGACY_GROUP, version=VERSION,
                                                                    plural=LEGACY_PLURAL), transform=view,
                          reuse=reuse, peers=peers)
        informers.append(legacy)
        appwrappers = MergedAppWrappers(current, legacy)
    # What the dispatcher sees is what the namespace admins allow: bound quota nodes, capped priorities.
    namespaces = Informer("namespaces", kube.ResourceClient(conn, group="", version="v1", plural="namespaces"),
                          transform=tenancy.namespace_policy, peers=peers)
    classes = Informer("priorityclasses", kube.ResourceClient(conn, group="scheduling.k8s.io", version="v1",
                                                              plural="priorityclasses"),
                       transform=priority_class_value, peers=peers)
    informers += [namespaces, classes]
    appwrappers = TenantAppWrappers(appwrappers, namespaces, classes, default_max_priority)
    subtrees = Informer("quotasubtrees", kube.ResourceClient(conn, group=quota.GROUP, version=quota.VERSION,
                                                             plural=quota.PLURAL),
                        transform=quota.subtree_view, peers=peers) if quota_trees else None
    client = kube.Client(conn)
    queue: WorkQueue[Key] = WorkQueue(name="dispatcher")
    peers.on_recovered(lambda: queue.add(RECOVERED))
    if hub is not None:
        dispatcher = Dispatcher(appwrappers=appwrappers, nodes=hub.nodes, pods=hub.pods, writer=client, queue=queue,
                                strict_fifo=strict_fifo, write_workers=write_workers, preemption=preemption, fit=fit,
                                recorder=recorder, quota_subtrees=subtrees, hub=hub, victim_timeout=victim_timeout,
                                protected_namespaces=protected_namespaces, reservations=reservations,
                                **(preemption_bounds or {}))
    else:
        nodes = Informer("nodes", kube.ResourceClient(conn, group="", version="v1", plural="nodes"),
                         transform=node_view, peers=peers)
        # Pods are keyed by uid: a pod re-created under the same name is a different consumer of capacity.
        pods = Informer("pods", kube.ResourceClient(conn, group="", version="v1", plural="pods"),
                        transform=pod_view, key=_pod_uid, peers=peers)
        wrapped = WrappedObjects(informer_factory(conn, client, peers=peers),
                                 lambda key: queue.add(AppWrapperEvent(key)))
        dispatcher = Dispatcher(appwrappers=appwrappers, nodes=nodes, pods=pods, writer=client, queue=queue,
                                strict_fifo=strict_fifo, write_workers=write_workers, wrapped=wrapped,
                                preemption=preemption, fit=fit, recorder=recorder, quota_subtrees=subtrees,
                                victim_timeout=victim_timeout, protected_namespaces=protected_namespaces,
                                reservations=reservations, placement=placement, **(preemption_bounds or {}))
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
