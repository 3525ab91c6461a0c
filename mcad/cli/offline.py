"""``mcadctl --offline``'s view: the controller's own wiring over a one-time list of the cluster.

Contract:
- ``rebuilt(conn, fit=..., strict_fifo=..., preemption=..., reservations=..., topology_levels=...)`` builds a
  dispatcher and its informers the way the controller does (``mcad.wiring.build``: the same informers, the same
  transforms; QuotaSubtrees when the API server serves them), with one write worker that is never started, lists
  each informer once and rebuilds the ledger the controller would have from them. It starts no thread and writes
  nothing: a write would raise instead of reaching the API server. It makes the list requests, and one discovery
  request. Informers over wrapped kinds are never started, so a pod counts for the AppWrapper its label names, as
  it does in the controller's first moments, before its owner chain can be read (``mcad.loop.ownership``).
- ``reports_over(dispatcher)`` is the ``Reports`` (``mcad.serve.debug``) over its ``LoopView``; ``reports(conn,
  ...)`` both in one.
"""

from __future__ import annotations

from mcad.k8s import kube
from mcad.loop.dispatcher import Dispatcher
from mcad.model.reservations import DEFAULT_RESERVATIONS
from mcad.serve.debug import Reports
from mcad.settings import ApiSettings, SchedulingSettings
from mcad.wiring import build, quota_served


def reports(conn: kube.Connection, *, fit: str = "nodes", strict_fifo: bool = False, preemption: bool = False,
            reservations: int = DEFAULT_RESERVATIONS, topology_levels: tuple[str, ...] = ()) -> Reports:
    """Reports computed from a one-time list of AppWrappers, Nodes and Pods, as the controller would see them."""
    return reports_over(rebuilt(conn, fit=fit, strict_fifo=strict_fifo, preemption=preemption,
                                reservations=reservations, topology_levels=topology_levels))


def rebuilt(conn: kube.Connection, *, fit: str = "nodes", strict_fifo: bool = False, preemption: bool = False,
            reservations: int = DEFAULT_RESERVATIONS, topology_levels: tuple[str, ...] = ()) -> Dispatcher:
    """A dispatcher built as the controller's, its ledger rebuilt from one list of each informer; never run."""
    scheduling = SchedulingSettings(fit=fit, strict_fifo=strict_fifo, preemption=preemption,
                                    reservations=reservations, write_workers=1, topology_levels=topology_levels)
    dispatcher, informers = build(conn, scheduling, ApiSettings(quota_trees=quota_served(kube.Client(conn))),
                                  watch_wrapped=False)
    for informer in informers:
        informer.list_once()
    dispatcher.rebuild()
    return dispatcher


def reports_over(dispatcher: Dispatcher) -> Reports:
    return Reports(dispatcher.view, lambda: {"identity": "offline", "leader": False, "offline": True})
