"""Hub mode placement, stepped key by key: the real dispatcher, work queue and informers over fake lister-watchers,
and a fake hub (no threads, no network) standing for the worker clusters.

The fake hub has what the dispatcher reads: real ``HubConfig``/``WorkerSpec`` (names in order, labels, policy),
a real ``WorkerHealth`` per worker (the state machine the prober drives), the real ``Hub.describe`` wording, and
a recording writer per worker. Nodes and pods come, as from the real hub, in one store each with node names
qualified ``"<worker>/<node>"`` and ``PodView.cluster`` set. A worker joins placement only once the dispatcher has
processed its ``("cluster", name)`` key, as in production, where the hub's prober adds that key.

What is pinned: each policy picks the expected worker; a gang fits one worker or none (never their sum); the
clusterScheduling stanza and the workers' usability restrict the choice, with Backoff messages that name every
worker and why; a pod of an AppWrapper in a worker it is not placed in is that worker's usage, not the
AppWrapper's, and its leftovers there are deleted by the AppWrapper's uid label.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, cast

import pytest

from mcad import wiring
from mcad.api.appwrapper import APPWRAPPER_UID_LABEL, WORKER_CLEANUP_FINALIZER, appwrapper_view
from mcad.api.resources import ResourceVector
from mcad.api.views import NodeView, PodView, node_view, pod_view
from mcad.hub.clusters import HealthStatus, HubConfig, WorkerHealth, WorkerSpec
from mcad.hub.connections import Hub, cluster_of
from mcad.hub.placement import Policy
from mcad.k8s.informer import Informer
from mcad.k8s.kube import ApiError
from mcad.model.keys import WorkerCleanup
from mcad.serve.debug import Reports
from test.component.harness import RecordingWriter, loop_options, node, pod_meta_of
from test.fakes import FakeClock, FakeListerWatcher, settle, wait_informed

# Two workers of different sizes: "small" has one 4-cpu node, "big" two 8-cpu nodes.
SMALL = [node("small/n0", "4")]
BIG = [node("big/n0", "8"), node("big/n1", "8")]


class HubWriter(RecordingWriter):
    """The hub's API server: statuses (inherited) and the finalizer patches."""

    def __init__(self) -> None:
        super().__init__()
        self.patches: list[tuple[str, list[dict[str, Any]]]] = []

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        raise AssertionError(f"hub mode deletes wrapped objects in workers, never in the hub ({kind} {name})")

    def patch_json(self, api_version: str, kind: str, namespace: str, name: str,
                   ops: list[dict[str, Any]]) -> Mapping[str, Any]:
        self.patches.append((name, ops))
        return {}


class WorkerWriter:
    """One worker's API server: what was applied there and what was deleted (with the label the delete required)."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str, tuple[str, str] | None]] = []

    def is_namespaced(self, api_version: str, kind: str) -> bool:
        return True

    def apply(self, obj: Mapping[str, Any], *, field_manager: str, force: bool) -> Mapping[str, Any]:
        self.applied.append(dict(obj))
        return obj

    def create(self, obj: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        return self.apply(obj, field_manager=field_manager, force=False)

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        self.deleted.append((kind, name, label))

    @property
    def applied_names(self) -> list[str]:
        return [obj["metadata"]["name"] for obj in self.applied]


class FakeWorker:
    """What the dispatcher and ``Hub.describe`` read of a worker; its health is the real state machine."""

    def __init__(self, spec: WorkerSpec, clock: FakeClock) -> None:
        self.spec = spec
        self.name = spec.name
        self.health = WorkerHealth(spec.name, failure_threshold=1, clock=clock.monotonic)
        self.conn: object | None = object()  # "connected": Hub.describe then explains by health
        self.synced = True
        self.client = WorkerWriter()
        self.namespaces: list[str] = []

    def usable(self) -> bool:
        return self.synced and self.health.usable()

    def ensure_namespace(self, namespace: str) -> None:
        self.namespaces.append(namespace)


class FakeHub:
    def __init__(self, config: HubConfig, clock: FakeClock) -> None:
        self.config = config
        self.workers = [FakeWorker(spec, clock) for spec in config.workers]
        self._by_name = {w.name: w for w in self.workers}
        self._connect_errors: dict[str, str] = {}
        self._on_change: Any = None

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workers]

    def worker(self, name: str) -> FakeWorker | None:
        return self._by_name.get(name)

    def subscribe(self, on_change: Any, on_wrapped_change: Any) -> None:
        self._on_change = on_change

    def usable(self, name: str) -> bool:
        worker = self._by_name.get(name)
        return worker is not None and worker.usable()

    def health(self, name: str) -> HealthStatus:
        return self._by_name[name].health.status

    def describe(self, name: str) -> str:
        # The production wording: it reads only _by_name, _connect_errors and each worker's conn/synced/health.
        return Hub.describe(cast(Hub, self), name)

    def writer(self, name: str) -> WorkerWriter:
        return self._by_name[name].client

    def wrapped(self, name: str) -> None:
        return None  # completion is not watched here

    # -- what the prober would do ---------------------------------------------------------------------------------

    def healthy(self, name: str) -> None:
        self._by_name[name].health.record_success()
        self._on_change(name)

    def fails(self, name: str, err: ApiError) -> None:
        self._by_name[name].health.record_probe_failure(err)
        self._on_change(name)


def qualified_node(raw: dict[str, Any]) -> NodeView:
    """Nodes are named "<worker>/<node>" here, as the hub's worker informers name them (mcad.hub.connections)."""
    view = node_view(raw)
    return dataclasses.replace(view, cluster=cluster_of(view.name))


def qualified_pod(raw: dict[str, Any]) -> PodView:
    view = pod_view(raw)
    return dataclasses.replace(view, cluster=cluster_of(view.node_name))


def gang(name: str, pods: int, cpu: str, clusters: dict[str, Any] | None = None) -> dict[str, Any]:
    scheduling: dict[str, Any] = {"clusterScheduling": clusters} if clusters is not None else {}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulingSpec": scheduling, "resources": {"GenericItems": [{
                "custompodresources": [{"replicas": pods, "requests": {"cpu": cpu}}],
                "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-cm"}}}]}},
            "status": {}}


def worker_pod(name: str, qualified_node: str, cpu: str, *, appwrapper: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", **pod_meta_of(appwrapper)},
            "spec": {"nodeName": qualified_node,
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running"}}


class HubHarness:
    def __init__(self, *, workers: list[tuple[str, dict[str, str]]], nodes: list[dict[str, Any]],
                 aws: list[dict[str, Any]], policy: Policy = Policy.BEST, healthy: tuple[str, ...] | None = None,
                 pods: tuple[dict[str, Any], ...] = (), preemption: bool = False) -> None:
        self.clock = FakeClock()
        config = HubConfig(tuple(WorkerSpec(name, kubeconfig=f"/dev/null/{name}", labels=MappingProxyType(labels))
                                 for name, labels in workers), policy=policy)
        self.hub = FakeHub(config, self.clock)
        self.lw = {k: FakeListerWatcher() for k in ("aw", "node", "pod")}
        for kind, objects in (("node", nodes), ("pod", pods), ("aw", aws)):
            for obj in objects:
                self.lw[kind].add(obj)
        self.writer = HubWriter()
        self.writer.objects = self.lw["aw"]
        self.informers: list[Informer[Any]] = [
            Informer("appwrappers", self.lw["aw"], transform=appwrapper_view),
            Informer("nodes", self.lw["node"], transform=qualified_node),
            Informer("pods", self.lw["pod"], transform=qualified_pod, key=lambda raw: raw["metadata"]["uid"]),
        ]
        self.dispatcher = wiring.loop(appwrappers=self.informers[0], nodes=self.informers[1], pods=self.informers[2],
                                     writer=self.writer, queue=wiring.dispatcher_queue(self.clock), clock=self.clock,
                                     hub=self.hub, **loop_options(preemption=preemption))
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            assert informer.wait_synced(5)
        self.dispatcher.start()
        for name in self.hub.names if healthy is None else healthy:
            self.hub.healthy(name)
        self.drain()

    def drain(self) -> None:
        settle(self.lw.values())  # every change made so far handled by the informers, as Stepped.drain
        while self.dispatcher.process_next(timeout=0) is not None:
            pass

    def applied(self) -> dict[str, list[str]]:
        """Per worker, the names of the objects created there."""
        return {name: self.hub.writer(name).applied_names for name in self.hub.names}

    def last_status(self, name: str) -> dict[str, Any]:
        return [s for n, s in self.writer.statuses if n == name][-1]

    def add_appwrapper(self, raw: dict[str, Any]) -> None:
        self.lw["aw"].add(raw)
        key = f"{raw['metadata']['namespace']}/{raw['metadata']['name']}"
        wait_informed(lambda: self.dispatcher.appwrappers.get(key), 5, f"the AppWrapper informer to see {key}")
        self.drain()

    def add_pod(self, raw: dict[str, Any]) -> None:
        self.lw["pod"].add(raw)
        uid = raw["metadata"]["uid"]
        wait_informed(lambda: self.dispatcher.pods.get(uid), 5, f"the pod informer to see {uid}")
        self.drain()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()


@pytest.fixture
def hub_harness() -> Iterator[Any]:
    made: list[HubHarness] = []

    def make(**kwargs: Any) -> HubHarness:
        made.append(HubHarness(**kwargs))
        return made[-1]

    yield make
    for h in made:
        h.stop()


# -- policy ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("order", "policy", "expected"), [
    # Config order decides "first"; best leaves the most room elsewhere (small is filled to half, big to 1/8);
    # spread leaves the most room in the chosen one. Each policy differs from another in at least one order.
    (("small", "big"), Policy.FIRST, "small"),
    (("big", "small"), Policy.FIRST, "big"),
    (("small", "big"), Policy.BEST, "small"),
    (("big", "small"), Policy.BEST, "small"),
    (("small", "big"), Policy.SPREAD, "big"),
    (("big", "small"), Policy.SPREAD, "big"),
])
def test_policy_picks_the_worker(hub_harness: Any, order: tuple[str, str], policy: Policy, expected: str) -> None:
    h = hub_harness(workers=[(name, {}) for name in order], nodes=SMALL + BIG, aws=[gang("a", 2, "1")],
                    policy=policy)
    assert h.applied() == {name: ["a-cm"] if name == expected else [] for name in order}
    status = h.last_status("a")
    assert (status["state"], status["targetClusterName"]) == ("Running", expected)
    assert h.dispatcher.view.placed() == {"ns/a": expected}
    assert h.hub.worker(expected).namespaces == ["ns"], "the namespace is made sure of in the worker"
    assert [name for name, _ in h.writer.patches] == ["a"], "the cleanup finalizer goes on before any object"
    assert h.writer.patches[0][1][-1]["value"] == [WORKER_CLEANUP_FINALIZER]
    [obj] = h.hub.writer(expected).applied
    assert obj["metadata"]["labels"][APPWRAPPER_UID_LABEL] == "uid-a"
    assert "ownerReferences" not in obj["metadata"]


def test_the_room_taken_counts_for_the_next_gang_in_the_same_cycle(hub_harness: Any) -> None:
    # best fit: "a" (3 cpu) fills small to 1/4 left; "b" (3 cpu) no longer fits there and goes to big.
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG,
                    aws=[gang("a", 1, "3"), gang("b", 1, "3")])
    assert h.dispatcher.view.placed() == {"ns/a": "small", "ns/b": "big"}


# -- one worker, never the sum --------------------------------------------------------------------------------------


def test_a_gang_that_fits_only_in_the_sum_of_workers_stays_queued_naming_each(hub_harness: Any) -> None:
    # 3 pods of 5 cpu: one would go on small's 6-cpu node and one on each of big's, but no single worker can take
    # all three.
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=[node("small/n0", "6"), *BIG],
                    aws=[gang("a", 3, "5")])
    assert h.applied() == {"small": [], "big": []}
    status = h.last_status("a")
    assert status["state"] == "Pending"
    message = status["message"]
    assert message.startswith("does not fit in any worker cluster: ")
    assert "small: " in message and "big: " in message, message
    assert message.index("small: ") < message.index("big: "), "workers are named in config order"
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 22000, "nothing is reserved for it"


def test_the_same_gang_goes_when_one_worker_alone_is_big_enough(hub_harness: Any) -> None:
    # The control for the test above: 3 pods of 5 cpu fit on three 8-cpu nodes of one worker.
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG + [node("big/n2", "8")],
                    aws=[gang("a", 3, "5")])
    assert h.dispatcher.view.placed() == {"ns/a": "big"}


# -- clusterScheduling ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("clusters", [
    {"clusters": [{"name": "big"}]},
    {"clusterSelector": {"matchLabels": {"gpu": "a100"}}},
    {"clusterSelector": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}},
    {"clusters": [{"name": "small"}, {"name": "big"}],
     "clusterSelector": {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}},
])
def test_cluster_scheduling_overrides_the_policy(hub_harness: Any, clusters: dict[str, Any]) -> None:
    # best fit alone would pick small (see test_policy_picks_the_worker).
    h = hub_harness(workers=[("small", {"tier": "cheap"}), ("big", {"gpu": "a100"})], nodes=SMALL + BIG,
                    aws=[gang("a", 2, "1", clusters)])
    assert h.dispatcher.view.placed() == {"ns/a": "big"}
    assert h.applied() == {"small": [], "big": ["a-cm"]}


def test_no_matching_worker_says_what_was_asked(hub_harness: Any) -> None:
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG,
                    aws=[gang("a", 1, "1", {"clusterSelector": {"matchLabels": {"gpu": "h100"}}})])
    assert h.applied() == {"small": [], "big": []}
    assert h.last_status("a")["message"] == (
        "no worker cluster matches its clusterScheduling (clusterSelector gpu in (h100)); position 1 in the queue")


def test_an_invalid_stanza_fits_nowhere_and_says_why(hub_harness: Any) -> None:
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG,
                    aws=[gang("a", 1, "1", {"clusters": [{"nmae": "big"}]})])
    assert h.applied() == {"small": [], "big": []}
    assert "clusterScheduling is invalid: clusters[0].name must be a non-empty string" in \
        h.last_status("a")["message"]


def test_a_gang_that_fits_only_in_the_pinned_worker_waits_for_it(hub_harness: Any) -> None:
    # 6 cpu cannot go to small; pinned to small it waits although big has room.
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG,
                    aws=[gang("a", 1, "6", {"clusters": [{"name": "small"}]})])
    assert h.applied() == {"small": [], "big": []}
    message = h.last_status("a")["message"]
    assert message.startswith("does not fit in any worker cluster: small: ")
    assert "big" not in message, "a worker it may not go to is not a reason"


# -- usability ------------------------------------------------------------------------------------------------------


def test_a_worker_is_used_only_once_its_cluster_key_is_processed(hub_harness: Any) -> None:
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG, aws=[gang("a", 1, "1")],
                    policy=Policy.FIRST, healthy=("big",))
    # small was never adopted (its prober has not reported): first-in-order skips it.
    assert h.dispatcher.view.placed() == {"ns/a": "big"}
    assert h.dispatcher.owners.targets.usable == frozenset({"big"})


@pytest.mark.parametrize(("failure", "state", "words"), [
    (ApiError(0, "ConnectionRefused", "connection refused"), "Unreachable",
     "unreachable: its API server does not answer"),
    (ApiError(401, "Unauthorized", "token rejected"), "Unauthorized", "unauthorized: its credentials are rejected"),
])
def test_an_unusable_worker_is_skipped_and_named_with_why(hub_harness: Any, failure: ApiError, state: str,
                                                          words: str) -> None:
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG, aws=[], policy=Policy.FIRST)
    h.hub.fails("small", failure)
    h.drain()
    assert h.dispatcher.owners.targets.usable == frozenset({"big"})

    h.lw["aw"].add(gang("anywhere", 1, "1"))
    h.lw["aw"].add(gang("pinned", 1, "1", {"clusters": [{"name": "small"}]}))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/pinned"), 5, "the AppWrapper informer to see them")
    h.drain()
    assert h.dispatcher.view.placed() == {"ns/anywhere": "big"}, "first in order, but small is out of placement"
    assert h.hub.health("small").state.value == state
    assert h.last_status("pinned")["message"] == (
        f"does not fit in any worker cluster: small: {words}; position 1 in the queue")

    h.hub.healthy("small")
    h.drain()
    assert h.dispatcher.view.placed() == {"ns/anywhere": "big", "ns/pinned": "small"}, "back in placement, it goes"


# -- pods outside the AppWrapper's worker ---------------------------------------------------------------------------


def test_a_pod_in_another_worker_is_that_workers_usage_not_the_appwrappers(hub_harness: Any) -> None:
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG,
                    aws=[gang("a", 1, "2", {"clusters": [{"name": "big"}]})])
    assert h.dispatcher.view.placed() == {"ns/a": "big"}
    key = "ns/a"

    h.add_pod(worker_pod("stray", "small/n0", "3", appwrapper="a"))
    assert h.dispatcher.owners.accountant.ledger.consumed(key) == ResourceVector(), "not its pod: it is placed in big"
    room = h.dispatcher.owners.accountant.ledger.room_by_node()
    assert room["small/n0"].get("cpu") == 1000, "but it uses small's capacity"
    assert h.dispatcher.owners.accountant.phases(key) == [], "it does not make the AppWrapper look running"
    assert h.hub.writer("small").deleted == [("ConfigMap", "a-cm", (APPWRAPPER_UID_LABEL, "uid-a"))], \
        "its objects in small are deleted, only if they carry its uid"
    assert h.hub.writer("big").deleted == []

    # The control: the same pod in its own worker is its own.
    h.add_pod(worker_pod("own", "big/n0", "2", appwrapper="a"))
    assert h.dispatcher.owners.accountant.ledger.consumed(key).get("cpu") == 2000
    assert h.dispatcher.owners.accountant.phases(key) == ["Running"]


def test_a_failing_leftover_cleanup_is_retried_with_backoff_until_it_succeeds(hub_harness: Any) -> None:
    """Deleting in a worker that answers 500: retried on the WorkerCleanup(worker) key, whose failures count (growing
    delays, not a hot loop: processing that key must not reset them); the first success resets it."""
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG,
                    aws=[gang("a", 1, "2", {"clusters": [{"name": "big"}]})])
    small = h.hub.writer("small")
    queue = h.dispatcher.queue
    calls: list[float] = []

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        calls.append(h.clock.monotonic())
        raise ApiError(500, "InternalError", "etcd is unhappy")

    small.delete = refuse  # type: ignore[method-assign]
    h.add_pod(worker_pod("stray", "small/n0", "1", appwrapper="a"))
    assert len(calls) == 1 and queue.num_requeues(WorkerCleanup("small")) == 1
    for attempt in range(2, 5):
        h.clock.advance(60)  # past any backoff delay so far
        h.drain()
        assert len(calls) == attempt, "one more try per due retry"
        assert queue.num_requeues(WorkerCleanup("small")) == attempt, "the failures keep counting"
    del small.delete  # it answers again
    h.clock.advance(60)
    h.drain()
    assert small.deleted == [("ConfigMap", "a-cm", (APPWRAPPER_UID_LABEL, "uid-a"))]
    assert queue.num_requeues(WorkerCleanup("small")) == 0


def test_appwrappers_in_a_worker_no_longer_configured_are_requeued_after_the_timeout(hub_harness: Any) -> None:
    """A restart with a worker removed from the configuration: what ran there is treated as stranded in a worker
    that never comes back (requeued once unreachableTimeoutSeconds have passed), then placed again."""
    stranded = gang("a", 1, "2")
    stranded["metadata"]["finalizers"] = [WORKER_CLEANUP_FINALIZER]
    stranded["status"] = {"state": "Running", "canrun": True, "targetClusterName": "gone",
                          "conditions": [{"type": "Dispatched", "status": "True"}]}
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG, aws=[stranded])
    assert h.dispatcher.view.placed() == {"ns/a": "gone"}
    assert h.applied() == {"small": [], "big": []}, "nothing happens before the timeout"
    h.clock.advance(h.hub.config.unreachable_timeout_seconds)
    h.drain()
    requeued = [s for n, s in h.writer.statuses if n == "a" and s.get("state") == "Pending"]
    assert requeued and "not in the clusters configuration any more" in requeued[0]["message"]
    assert h.dispatcher.view.placed() == {"ns/a": "small"}
    assert h.applied() == {"small": ["a-cm"], "big": []}


def test_priority_preemption_frees_room_in_the_worker_the_preemptor_needs(hub_harness: Any) -> None:
    """--preemption in hub mode: a high-priority gang pinned to big, which a low-priority one fills, evicts it
    (its objects are deleted in big), then lands in big; the low one waits for a worker again."""
    low = gang("low", 2, "8", {"clusters": [{"name": "big"}]})
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG, aws=[low], preemption=True)
    assert h.dispatcher.view.placed() == {"ns/low": "big"}
    high = gang("high", 1, "8", {"clusters": [{"name": "big"}]})
    high["spec"]["priority"] = 10
    h.add_appwrapper(high)
    assert h.hub.writer("big").deleted == [("ConfigMap", "low-cm", (APPWRAPPER_UID_LABEL, "uid-low"))]
    assert h.dispatcher.view.placed()["ns/high"] == "big"
    assert h.last_status("low")["state"] == "Pending"
    assert "PreemptedByHigherPriority" in str(h.last_status("low")["conditions"])


def test_debug_clusters_dates_each_workers_health_on_the_dispatchers_clock(hub_harness: Any) -> None:
    """/debug/clusters says since when a worker is in its state: its health's time read on the same clock as the
    dispatcher's, not against the process's own monotonic time (a stepped clock here)."""
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=SMALL + BIG, aws=[])
    h.clock.advance(60)
    h.hub.fails("big", ApiError(0, "ConnectionRefused", "the worker is down"))
    h.clock.advance(30)
    clusters = Reports(h.dispatcher.view, lambda: {}, hub=cast(Hub, h.hub)).clusters()["clusters"]
    # The clock's wall time starts at 2024-01-01T00:00:00Z: healthy since the start, failing since 60 s later.
    assert {c["name"]: (c["state"], c["since"]) for c in clusters} == {
        "small": ("Healthy", "2024-01-01T00:00:00Z"), "big": ("Unreachable", "2024-01-01T00:01:00Z")}


# -- topology: domains are per worker -------------------------------------------------------------------------------


def racked(qualified: str, cpu: str, rack: str) -> dict[str, Any]:
    raw = node(qualified, cpu)
    raw["metadata"]["labels"] = {"example.com/rack": rack}
    return raw


def in_one_rack(raw: dict[str, Any]) -> dict[str, Any]:
    raw["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-required": "example.com/rack"}
    return raw


def test_a_gang_that_requires_a_rack_goes_to_a_worker_with_a_rack_that_holds_it(hub_harness: Any) -> None:
    # small/n0 and big/n0 carry the same rack value, but a domain never spans two workers: 2 x 5 cpu fits no rack
    # of either worker (it would fit big spread over its two racks, and "rack-1" if it spanned the workers).
    nodes = [racked("small/n0", "8", "rack-1"), racked("big/n0", "8", "rack-1"), racked("big/n1", "8", "rack-2")]
    h = hub_harness(workers=[("small", {}), ("big", {})], nodes=nodes, aws=[in_one_rack(gang("wide", 2, "5"))])
    assert h.applied() == {"small": [], "big": []}
    message = h.last_status("wide")["message"]
    assert "small: needs 2 pod(s) of cpu 5 in one example.com/rack: rack-1 has room for 1" in message, message
    assert "big: needs 2 pod(s) of cpu 5 in one example.com/rack: rack-1 has room for 1, rack-2 for 1" in message
    h.add_appwrapper(in_one_rack(gang("pair", 2, "3")))
    assert h.dispatcher.view.placed()["ns/pair"] in ("small", "big")
    pair_nodes = {n for n, _ in h.dispatcher.owners.accountant.plans.planned_nodes("ns/pair")}
    assert len(pair_nodes) == 1, pair_nodes
