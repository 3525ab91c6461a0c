"""Hub mode: the worker clusters as the dispatcher sees them (connections, informers, health, writers).

Contract:
* ``Hub(config, connector)`` holds one ``Worker`` per configured worker, in config order. Nothing here runs
  unless ``--clusters-config`` is given: single-cluster mode never builds a Hub (no threads, no watches).
* Every worker has its own Node and Pod informers. Their views are *qualified* so that one ledger can hold all
  workers without clashes and the dispatcher can tell them apart: a Node's name becomes ``"<worker>/<node>"``
  (Kubernetes names never contain "/"), a Pod's ``node_name`` the same, and its ``cluster`` the worker's name.
  Pod uids are UUIDs, unique across clusters. ``hub.nodes`` and ``hub.pods`` are stores over all workers.
* Those stores report ``has_synced()`` True at once: a worker that is down when the controller starts must not
  hold the hub's queue. A worker takes part in placement only when it is ``usable``: its informers have synced
  and its last probe succeeded. Until then its capacity is unknown (neither zero nor full).
* ``start()`` runs one thread per worker (``run_worker``): it connects the worker (retrying while its
  credentials cannot be read or loaded), starts its informers, and probes it every ``probe_period`` seconds
  with ``mcad.hub.clusters.probe``, a one-item list of Nodes (which needs both a reachable API server and
  credentials that still work). A worker that hangs delays only its own probes. Whenever a worker's ``usable``
  or health state changes, ``on_change(name)`` is called: the dispatcher adopts the new state on its own
  thread, so a decision never sees a worker change under it.
* Rotated credentials are followed without a restart: each worker's thread re-reads its Secret or
  kubeconfig file, with the credential files it names, every ``credentials_period`` seconds (at every probe
  while the worker is Unauthorized) and, when their digest changed, moves the worker's one ``ApiClient`` onto
  the new credentials in place (``kube.adopt_credentials``): informers, writers and probes all use them from
  the next request, and no cache is rebuilt. Credentials that name another API server are refused with an
  error in the log (following a moved cluster would mix two clusters' objects in one cache): that takes a
  restart.
* A worker that turns Healthy again (back from Unreachable or Unauthorized) has its informers retry at once
  rather than at the end of their backoff, so its Nodes and Pods are fresh as soon as possible.
* ``writer(name)`` is the worker's ``kube.Client``; ``wrapped(name)`` its ``WrappedObjects`` (informers over
  wrapped kinds, started on demand); ``ensure_namespace(name, ns)`` creates the AppWrapper's namespace in the
  worker when it is missing (a hub namespace does not exist in a worker by itself).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from mcad.api.views import NodeView, PodView, node_view, pod_view
from mcad.errors import ApiError
from mcad.hub.clusters import (
    HealthState,
    HealthStatus,
    HubConfig,
    WorkerConnectError,
    WorkerConnector,
    WorkerHealth,
    WorkerSpec,
    check,
)
from mcad.k8s import kube
from mcad.k8s.informer import Handler, Informer, Reconnects
from mcad.k8s.wrapped import WrappedObjects, informer_factory

log = structlog.get_logger("mcad.hub")

DEFAULT_PROBE_PERIOD_SECONDS = 2.0
# How often a worker's Secret or kubeconfig is re-read for a rotation while its credentials work (a GET on the
# hub per worker); while they are rejected it is re-read at every probe.
DEFAULT_CREDENTIALS_PERIOD_SECONDS = 30.0
# Two failed probes in a row take a worker out (one lost packet should not).
FAILURE_THRESHOLD = 2
NAMESPACE_TIMEOUT_SECONDS = 10.0


def qualify(cluster: str, node: str) -> str:
    return f"{cluster}/{node}" if node else ""


def cluster_of(qualified_node: str) -> str:
    return qualified_node.partition("/")[0]


class Worker:
    def __init__(self, spec: WorkerSpec, on_change: Callable[[str], None],
                 on_wrapped_change: Callable[[str], None]) -> None:
        self.spec = spec
        self.name = spec.name
        self.health = WorkerHealth(spec.name, failure_threshold=FAILURE_THRESHOLD)
        self.conn: kube.Connection | None = None
        self.client: kube.Client | None = None
        self.nodes: Informer[NodeView] | None = None
        self.pods: Informer[PodView] | None = None
        self.wrapped: WrappedObjects | None = None
        self._on_change = on_change
        self._on_wrapped_change = on_wrapped_change
        # Namespaces known to exist there: written by the write pool's threads, several at once.
        self._namespaces: set[str] = set()
        self._namespaces_lock = threading.Lock()
        self._usable = False
        self.probes = 0  # probes completed: how tests see that probing goes on
        self.fingerprint = ""  # digest of the credentials in use (WorkerConnector.fingerprint)
        self.credentials_read_at = 0.0  # time.monotonic() of the last read of its Secret or file

    @property
    def synced(self) -> bool:
        return self.nodes is not None and self.pods is not None and self.nodes.has_synced() and \
            self.pods.has_synced()

    def usable(self) -> bool:
        return self.synced and self.health.usable()

    def informers(self) -> list[Informer[Any]]:
        return [i for i in (self.nodes, self.pods) if i is not None] + (
            self.wrapped.informers() if self.wrapped is not None else [])

    def build(self, conn: kube.Connection, handlers: Sequence[tuple[str, Handler[Any]]]) -> None:
        """Informers over its Nodes and Pods, with the hub stores' handlers; started by ``start``."""
        name = self.name
        self.conn = conn
        self.client = kube.Client(conn)

        def qualified_node(raw: dict[str, Any]) -> NodeView:
            view = node_view(raw)
            return dataclasses.replace(view, name=qualify(name, view.name), cluster=name)

        def qualified_pod(raw: dict[str, Any]) -> PodView:
            view = pod_view(raw)
            pin = view.pin
            if pin is not None and pin.pinned_to:  # the node of its pin, as the hub's ledger names nodes
                pin = dataclasses.replace(pin, pinned_to=qualify(name, pin.pinned_to))
            return dataclasses.replace(view, node_name=qualify(name, view.node_name), cluster=name, pin=pin)

        def node_key(raw: dict[str, Any]) -> str:
            return qualify(name, str(raw["metadata"]["name"]))

        def pod_uid(raw: dict[str, Any]) -> str:
            return str(raw["metadata"]["uid"])

        peers = Reconnects()  # one worker's informers reconnect together
        self.nodes = Informer(f"{name}-nodes", kube.ResourceClient(conn, group="", version="v1", plural="nodes"),
                              transform=qualified_node, key=node_key, peers=peers)
        self.pods = Informer(f"{name}-pods", kube.ResourceClient(conn, group="", version="v1", plural="pods"),
                             transform=qualified_pod, key=pod_uid, peers=peers)
        for kind, handler in handlers:
            (self.nodes if kind == "nodes" else self.pods).add_handler(handler)
        self.wrapped = WrappedObjects(informer_factory(conn, self.client, f"{name}-", peers),
                                      self._on_wrapped_change)
        self.nodes.start()
        self.pods.start()

    def probe(self) -> None:
        """One check of the worker; tells the hub when its usability or health state changed."""
        before = (self._usable, self.health.state)
        if self.conn is not None:
            check(self.health, self.conn)
        self.probes += 1
        self._usable = self.usable()
        if (self._usable, self.health.state) != before:
            status = self.health.status
            if status.state is HealthState.HEALTHY and before[1] is not HealthState.UNKNOWN:
                for informer in self.informers():  # they may sit in a backoff of up to 30 s
                    informer.retry_now()
            log.info("worker cluster changed", cluster=self.name, state=status.state.value, usable=self._usable,
                     message=status.message)
            self._on_change(self.name)

    def ensure_namespace(self, namespace: str) -> None:
        """Create ``namespace`` in the worker if it is not there (remembered once seen). Write-pool threads call
        this concurrently: two may both create it (the second gets 409, which is fine)."""
        with self._namespaces_lock:
            if namespace in self._namespaces or self.conn is None:
                return
        try:
            kube.request_json(self.conn, "GET", f"/api/v1/namespaces/{namespace}", timeout=NAMESPACE_TIMEOUT_SECONDS)
        except ApiError as err:
            if err.status != 404:
                raise
            try:
                kube.request_json(self.conn, "POST", "/api/v1/namespaces", timeout=NAMESPACE_TIMEOUT_SECONDS,
                                  body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            except ApiError as created:
                if created.status != 409:
                    raise
        with self._namespaces_lock:
            self._namespaces.add(namespace)

    def stop(self) -> None:
        for informer in (self.nodes, self.pods):
            if informer is not None:
                informer.stop()
        if self.wrapped is not None:
            self.wrapped.stop()


class _MergedStore:
    """The same kind of object from every worker, as one store (keys are unique across workers)."""

    def __init__(self, hub: Hub, kind: str) -> None:
        self._hub = hub
        self._kind = kind

    def _informers(self) -> list[Informer[Any]]:
        out = []
        for worker in self._hub.workers:
            informer = worker.nodes if self._kind == "nodes" else worker.pods
            if informer is not None:
                out.append(informer)
        return out

    def get(self, key: str) -> Any:
        if self._kind == "nodes":
            worker = self._hub.worker(cluster_of(key))
            informer = worker.nodes if worker is not None else None
            return informer.get(key) if informer is not None else None
        for informer in self._informers():
            found = informer.get(key)
            if found is not None:
                return found
        return None

    def keys(self) -> list[str]:
        return [key for informer in self._informers() for key in informer.keys()]  # noqa: SIM118 (an Informer, not a dict)

    def list(self) -> list[Any]:
        return [item for informer in self._informers() for item in informer.list()]

    def __len__(self) -> int:
        return sum(len(informer) for informer in self._informers())

    def has_synced(self) -> bool:
        return True  # see the module docstring: workers join placement one by one, as each becomes usable

    def add_handler(self, handler: Handler[Any]) -> None:
        self._hub.add_handler(self._kind, handler)


class Hub:
    def __init__(self, config: HubConfig, connector: WorkerConnector, *,
                 probe_period: float = DEFAULT_PROBE_PERIOD_SECONDS,
                 credentials_period: float = DEFAULT_CREDENTIALS_PERIOD_SECONDS) -> None:
        self.config = config
        self.connector = connector
        self.probe_period = probe_period
        self.credentials_period = credentials_period
        self._on_change: Callable[[str], None] = lambda _name: None
        self._on_wrapped_change: Callable[[str], None] = lambda _key: None
        self.workers = [Worker(spec, self._changed, self._wrapped_changed) for spec in config.workers]
        self._by_name = {w.name: w for w in self.workers}
        self._handlers: list[tuple[str, Handler[Any]]] = []
        self.nodes = _MergedStore(self, "nodes")
        self.pods = _MergedStore(self, "pods")
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._connect_errors: dict[str, str] = {}
        self._credential_errors: dict[str, str] = {}

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workers]

    def worker(self, name: str) -> Worker | None:
        return self._by_name.get(name)

    def subscribe(self, on_change: Callable[[str], None], on_wrapped_change: Callable[[str], None]) -> None:
        """Before ``start``: who hears of worker changes (by name) and of wrapped objects' changes (by AppWrapper)."""
        self._on_change = on_change
        self._on_wrapped_change = on_wrapped_change

    def add_handler(self, kind: str, handler: Handler[Any]) -> None:
        if self._threads:
            raise RuntimeError("add handlers before the hub starts")
        self._handlers.append((kind, handler))

    def _changed(self, name: str) -> None:
        self._on_change(name)

    def _wrapped_changed(self, key: str) -> None:
        self._on_wrapped_change(key)

    def usable(self, name: str) -> bool:
        worker = self._by_name.get(name)
        return worker is not None and worker.usable()

    def health(self, name: str) -> HealthStatus:
        return self._by_name[name].health.status

    def describe(self, name: str) -> str:
        """Why a worker is not usable, in a few words for Backoff messages (the details are in its health)."""
        worker = self._by_name.get(name)
        if worker is None:
            return "not configured"
        status = worker.health.status
        if worker.conn is None:
            return self._connect_errors.get(name) or "not connected yet"
        if status.state is HealthState.HEALTHY and not worker.synced:
            return "its Nodes and Pods are still being listed"
        if status.state is HealthState.UNAUTHORIZED:
            return "unauthorized: its credentials are rejected"
        if status.state is HealthState.UNREACHABLE:
            return "unreachable: its API server does not answer"
        return "not checked yet"

    def writer(self, name: str) -> kube.Client:
        worker = self._by_name[name]
        if worker.client is None:
            raise ApiError(0, "NotConnected", f"worker cluster {name} is not connected")
        return worker.client

    def wrapped(self, name: str) -> WrappedObjects | None:
        worker = self._by_name.get(name)
        return worker.wrapped if worker is not None else None

    def informers(self) -> list[Informer[Any]]:
        return [i for w in self.workers for i in w.informers()]

    # -- the workers' threads -------------------------------------------------------------------------------------

    def start(self) -> list[threading.Thread]:
        """One thread per worker (``hub-<name>``), so a worker that hangs delays only its own probes."""
        if self._threads:
            raise RuntimeError("hub already started")
        self._threads = [threading.Thread(target=self.run_worker, args=(worker, self._stop), name=f"hub-{worker.name}",
                                          daemon=True) for worker in self.workers]
        for thread in self._threads:
            thread.start()
        return self._threads

    def run_worker(self, worker: Worker, stop: threading.Event) -> None:
        """Connect (retrying until the credentials can be read and loaded), follow credential rotations, and probe
        every ``probe_period`` seconds, until ``stop`` is set."""
        while not stop.is_set():
            if worker.conn is None:
                self._connect(worker)
            elif self._credentials_due(worker):
                self.recheck_credentials(worker)
            worker.probe()
            stop.wait(self.probe_period)

    def _connect(self, worker: Worker) -> None:
        worker.credentials_read_at = time.monotonic()
        try:
            conn, fingerprint = self.connector.connect_fingerprinted(worker.spec)
        except WorkerConnectError as err:
            message = str(err)
            if self._connect_errors.get(worker.name) != message:
                log.warning("cannot connect to worker cluster", cluster=worker.name, reason=message)
                self._connect_errors[worker.name] = message
                failure = ApiError(err.status if err.status in (401, 403) else 0, "ConnectFailed", message)
                worker.health.record_probe_failure(failure)
                worker.health.record_probe_failure(failure)
                self._on_change(worker.name)
            return
        self._connect_errors.pop(worker.name, None)
        log.info("connected to worker cluster", cluster=worker.name, server=conn.server, source=worker.spec.source)
        worker.fingerprint = fingerprint
        worker.build(conn, self._handlers)

    def _credentials_due(self, worker: Worker) -> bool:
        period = 0.0 if worker.health.state is HealthState.UNAUTHORIZED else self.credentials_period
        return time.monotonic() - worker.credentials_read_at >= period

    def recheck_credentials(self, worker: Worker) -> bool:
        """Re-read a connected worker's credentials; True when changed ones were adopted. A source that cannot
        be read now (a Secret being replaced) leaves the credentials in use alone: they may still work."""
        assert worker.conn is not None, "only a connected worker has credentials to replace"
        worker.credentials_read_at = time.monotonic()
        try:
            if self.connector.fingerprint(worker.spec) == worker.fingerprint:
                return False
            fresh, fingerprint = self.connector.connect_fingerprinted(worker.spec)
        except WorkerConnectError as err:
            message = str(err)
            if self._credential_errors.get(worker.name) != message:
                log.warning("cannot re-read worker credentials; keeping the ones in use", cluster=worker.name,
                            reason=message)
                self._credential_errors[worker.name] = message
            return False
        self._credential_errors.pop(worker.name, None)
        worker.fingerprint = fingerprint  # a refused change is not retried until the source changes again
        try:
            kube.adopt_credentials(worker.conn, fresh)
        except ValueError:  # they name another API server
            log.error("worker credentials now name another API server; keeping the old ones: restart the "
                      "controller to follow the move", cluster=worker.name, server=worker.conn.server,
                      new_server=fresh.server, source=worker.spec.source)
            return False
        log.info("worker credentials changed; using the new ones", cluster=worker.name, source=worker.spec.source)
        return True

    def stop(self) -> None:
        self._stop.set()
        for worker in self.workers:
            worker.stop()
