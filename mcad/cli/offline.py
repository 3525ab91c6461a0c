"""``mcadctl --offline``'s view: the controller's own wiring over a one-time list of the cluster.

Contract:
- ``reports(conn, fit=..., strict_fifo=..., preemption=..., reservations=...)`` builds a dispatcher and its informers
  the way the controller does (``mcad.wiring.build``: the same informers, the same transforms; QuotaSubtrees when
  the API server serves them), with one write worker that is never started, and returns the ``Reports``
  (``mcad.serve.debug.offline``) over one list of each informer. It starts no thread and writes nothing: a write
  would raise instead of reaching the API server. It makes the list requests, and one discovery request. Informers
  over wrapped kinds are never started, so a pod counts for the AppWrapper its label names, as it does in the
  controller's first moments, before its owner chain can be read (``mcad.loop.ownership``).
"""

from __future__ import annotations

from mcad.k8s import kube
from mcad.model.reservations import DEFAULT_RESERVATIONS
from mcad.serve.debug import Reports, offline
from mcad.settings import ApiSettings, SchedulingSettings
from mcad.wiring import build, quota_served


def reports(conn: kube.Connection, *, fit: str = "nodes", strict_fifo: bool = False, preemption: bool = False,
            reservations: int = DEFAULT_RESERVATIONS) -> Reports:
    """Reports computed from a one-time list of AppWrappers, Nodes and Pods, as the controller would see them."""
    scheduling = SchedulingSettings(fit=fit, strict_fifo=strict_fifo, preemption=preemption,
                                    reservations=reservations, write_workers=1)
    dispatcher, informers = build(conn, scheduling, ApiSettings(quota_trees=quota_served(kube.Client(conn))),
                                  watch_wrapped=False)
    return offline(dispatcher, informers)
