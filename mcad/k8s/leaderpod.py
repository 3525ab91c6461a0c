"""The leading replica labels its own pod, so that a Service selecting that label reaches the leader alone.

Why: ``/debug`` and the dashboard's data answer only on the leader. The chart's Service ``<name>-leader`` selects the
controller's pods that carry ``LEADER_LABEL``, which lets users reach the leader through the API server's service
proxy (``services/proxy`` on that Service), with no ``pods/proxy`` right, which RBAC could not narrow to the
leader's pod.

Contract:
- ``LeaderPodLabel(conn, namespace=, pod=, stop=)``: ``mark()`` sets ``LEADER_LABEL: "true"`` on the pod
  ``namespace/pod`` with a JSON merge patch, and ``unmark()`` removes it. Each write is bounded: at most
  ``attempts`` requests of at most ``timeout`` seconds each, ``first_delay`` seconds between the first two, doubled
  after each failure, and interrupted by ``stop``. Each returns whether it succeeded. Giving up logs a warning
  naming the pod and the last error. The leader still leads: users then reach it through the Service of every
  replica, asking again while standbys answer.
- A refusal that would repeat is not retried: 403 (the ServiceAccount may not patch pods there), 404 (the pod is
  gone), 422. While ``stop`` is set (a graceful stop), a write is tried once.
- ``unmark()`` cancels a ``mark()`` under way; a ``mark()`` after ``unmark()`` writes again (a new term).
- The controller calls ``unmark()`` once at start, before competing (a restarted container keeps its pod's
  labels), ``mark()`` in a thread of its own when it starts leading (dispatching does not wait for it), and
  ``unmark()`` when it stops leading. A leader that loses its Lease exits at once without unmarking; its pod
  is not Ready while its container restarts, so the Service drops it, and the restarted process unmarks it.
"""

from __future__ import annotations

import threading

import structlog

from mcad.errors import ApiError
from mcad.k8s import kube

log = structlog.get_logger("mcad.k8s.leaderpod")

LEADER_LABEL = "mcad.codeflare.dev/leader"


class LeaderPodLabel:
    def __init__(self, conn: kube.Connection, *, namespace: str, pod: str, stop: threading.Event,
                 attempts: int = 5, first_delay: float = 0.5, timeout: float = 5.0) -> None:
        if not pod:
            raise ValueError("the leader's pod needs a name ($POD_NAME)")
        self._conn = conn
        self.namespace = namespace
        self.pod = pod
        self._stop = stop
        self._attempts = attempts
        self._first_delay = first_delay
        self._timeout = timeout
        self._lock = threading.Lock()
        self._term = 0  # raised by every mark and unmark: a write of an older term gives up

    def mark(self) -> bool:
        return self._write("true")

    def unmark(self) -> bool:
        return self._write(None)

    def _write(self, value: str | None) -> bool:
        with self._lock:
            self._term += 1
            term = self._term
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}"
        body = {"metadata": {"labels": {LEADER_LABEL: value}}}
        delay = self._first_delay
        error: ApiError | None = None
        for attempt in range(self._attempts):
            if attempt:
                if self._stop.wait(delay):
                    break
                delay *= 2
            with self._lock:
                if term != self._term:
                    return False  # a later mark or unmark decides
            try:
                kube.request_json(self._conn, "PATCH", path, body=body, content_type="application/merge-patch+json",
                                  timeout=self._timeout)
            except ApiError as err:
                error = err
                if err.status in (403, 404, 422):  # not allowed, no such pod, refused: trying again won't help
                    break
                continue
            log.info("leader label written" if value else "leader label removed", pod=f"{self.namespace}/{self.pod}")
            return True
        log.warning("cannot write the leader label on this replica's pod; users reach the leader through the "
                    "Service of every replica", pod=f"{self.namespace}/{self.pod}", leader=bool(value),
                    reason=str(error) if error else "stopping")
        return False
