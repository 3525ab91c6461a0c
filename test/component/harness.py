"""The component harness: the dispatcher stepped key by key over a real work queue and real informers fed by fake
lister-watchers, a writer that records (and can fail) every write, and a fake clock. No API server and no sleeps:
``drain`` first waits (by event, see ``test.fakes.settle``) until the informers have handled every change a test
made, whichever resources it touched.

``harness_factory`` (a fixture, registered for every component test module by conftest.py) builds ``Harness``es
and stops their informers afterwards; ``node``, ``pod``, ``aw`` and ``gang_aw`` write the raw objects they are fed;
``last_status`` reads back the status last written for an AppWrapper.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from mcad import wiring
from mcad.api.appwrapper import AppWrapperView, appwrapper_view
from mcad.api.faulttolerance import FaultDefaults
from mcad.api.views import node_view, pod_view
from mcad.k8s.informer import Informer, Store
from mcad.k8s.kube import ApiError
from mcad.k8s.tenantstore import TenantAppWrappers, priority_class_value
from mcad.loop.dispatcher import Dispatcher
from mcad.model.tenancy import DEFAULT_MAX_PRIORITY, namespace_policy
from mcad.settings import SchedulingSettings
from test.fakes import FakeClock, FakeListerWatcher, settle


class RecordingWriter:
    def __init__(self) -> None:
        self.applied: list[str] = []
        self.statuses: list[tuple[str, dict[str, Any]]] = []
        self.fail_apply: ApiError | None = None
        self.fail_status: ApiError | None = None
        self.fail_for: dict[str, ApiError] = {}  # object name -> the error applying it raises
        self.objects: FakeListerWatcher | None = None  # the AppWrappers, for read()
        self.attempts = 0  # apply calls, failed ones included
        self.status_attempts = 0
        self.status_attempts_of: Counter[str] = Counter()
        self.force_deleted: list[str] = []
        self.deleted: list[str] = []  # "Kind name" of each delete
        self.reads = 0  # read() calls: a dispatch's read of its AppWrapper

    def is_namespaced(self, api_version: str, kind: str) -> bool:
        return True

    def apply(self, obj: Mapping[str, Any], *, field_manager: str, force: bool) -> Mapping[str, Any]:
        self.attempts += 1
        failure = self.fail_apply or self.fail_for.get(obj["metadata"]["name"])
        if failure:
            raise failure
        self.applied.append(obj["metadata"]["name"])
        return obj

    def create(self, obj: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        # Every object is new to this fake API server: a create is recorded as its apply was.
        return self.apply(obj, field_manager=field_manager, force=False)

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        self.deleted.append(f"{kind} {name}")

    def apply_status(self, api_version: str, kind: str, namespace: str, name: str, new_status: Mapping[str, Any],
                     *, field_manager: str) -> Mapping[str, Any]:
        self.statuses.append((name, dict(new_status)))
        return new_status

    def replace_status(self, api_version: str, kind: str, namespace: str, name: str, uid: str,
                       new_status: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        self.status_attempts += 1
        self.status_attempts_of[name] += 1
        if self.fail_status:
            raise self.fail_status
        self.statuses.append((name, dict(new_status)))
        return {"metadata": {"name": name, "uid": uid}, "status": new_status}

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.force_deleted.append(name)

    def read(self, api_version: str, kind: str, namespace: str, name: str, *,
             not_older_than: str = "") -> Mapping[str, Any]:
        """The AppWrapper as the fake API server holds it (a dispatch reads its templates this way)."""
        self.reads += 1
        found = self.objects.get(f"{namespace}/{name}") if self.objects is not None else None
        if found is None:
            raise ApiError(404, "NotFound", f"appwrappers {name} not found")
        return found


def node(name: str, cpu: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1"},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod_meta_of(appwrapper: str | None) -> dict[str, Any]:
    """The metadata that makes a pod one of ``appwrapper``'s (``aw``'s item, a ConfigMap, as its controller: with
    no informers over wrapped kinds, kind and name are what the controller checks), or nobody's."""
    if not appwrapper:
        return {"labels": {}}
    return {"labels": {"workload.codeflare.dev/appwrapper": appwrapper},  # the name; same namespace
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": f"{appwrapper}-cm",
                                 "uid": f"uid-{appwrapper}-cm", "controller": True}]}


def pod(name: str, cpu: str, *, appwrapper: str | None = None, node_name: str = "n0") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", **pod_meta_of(appwrapper)},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running"}}


def aw(name: str, cpu: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"resources": {"GenericItems": [{
                "custompodresources": [{"replicas": 1, "requests": {"cpu": cpu}}],
                "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-cm"}}}]}},
            "status": status or {}}


class Stepped:
    """A dispatcher over informers a harness made: started once they synced, then stepped key by key."""

    informers: list[Informer[Any]]
    dispatcher: Dispatcher

    def start_stepping(self) -> None:
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            assert informer.wait_synced(5)
        self.dispatcher.start()

    def drain(self) -> None:
        """Every event sent so far handled by the informers (settle), then every key due processed."""
        settle(informer._lw for informer in self.informers)
        while self.dispatcher.process_next(timeout=0) is not None:
            pass

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()


NO_START_UP_CHECKS = FaultDefaults(admission_grace=86400.0, warmup_grace=86400.0)
SCHEDULING_FIELDS = frozenset(field.name for field in dataclasses.fields(SchedulingSettings))


def loop_options(**options: Any) -> dict[str, Any]:
    """``wiring.loop``'s keyword arguments from a test's flat options: those naming a ``SchedulingSettings`` field
    (``fit=``, ``strict_fifo=``, ``preemption=``, ``fault_defaults=``...) go into ``scheduling``, with writes inline
    (``write_workers=0``) and a cycle whenever one is asked for (``cycle_interval=0``) unless the test says
    otherwise; the rest (``recorder=``, ``wrapped=``, ``hub=``...) pass
    as they are. Tests state what they change as the flags do, without building the group."""
    scheduling = {name: options.pop(name) for name in list(options) if name in SCHEDULING_FIELDS}
    scheduling.setdefault("write_workers", 0)
    # A cycle whenever one is asked for: the clock moves only when a test moves it (test_cycle_pace.py tests the
    # pace).
    scheduling.setdefault("cycle_interval", 0)
    return {**options, "scheduling": SchedulingSettings(**scheduling)}


class Harness(Stepped):
    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], aws: list[dict[str, Any]],
                 writer: RecordingWriter | None = None, before_start: Any = None, write_through: Any = None,
                 namespaces: list[dict[str, Any]] | None = None, **options: Any) -> None:
        """``namespaces``: Namespace objects, and the dispatcher reads the AppWrappers as their admins' rules make
        them (``TenantAppWrappers``: bindings, ceilings, fair-share weights; ``lw["ns"]`` changes them)."""
        self.lw = {k: FakeListerWatcher() for k in ("aw", "node", "pod", "ns", "pc")}
        for obj in namespaces or []:
            self.lw["ns"].add(obj)
        for obj in nodes:
            self.lw["node"].add(obj)
        for obj in pods:
            self.lw["pod"].add(obj)
        for obj in aws:
            self.lw["aw"].add(obj)
        self.clock = FakeClock()
        self.writer = writer if writer is not None else RecordingWriter()
        self.writer.objects = self.lw["aw"]
        self.informers: list[Informer[Any]] = [
            Informer("appwrappers", self.lw["aw"], transform=appwrapper_view),
            Informer("nodes", self.lw["node"], transform=node_view),
            Informer("pods", self.lw["pod"], transform=pod_view, key=lambda raw: raw["metadata"]["uid"]),
        ]
        # No kubelet here makes the pods of what is dispatched: the start-up checks of fault tolerance (pods that
        # never come) are off unless a test asks for them, as tests of mcad.loop.health do.
        options.setdefault("fault_defaults", NO_START_UP_CHECKS)
        # Every Backoff written at once, so that tests count what is decided; test_backoff_pace.py tests the pace.
        options.setdefault("backoff_status_rate", 0)
        appwrappers: Store[AppWrapperView] = self.informers[0]
        if namespaces is not None:
            policies = Informer("namespaces", self.lw["ns"], transform=namespace_policy)
            classes = Informer("priorityclasses", self.lw["pc"], transform=priority_class_value)
            self.informers += [policies, classes]
            appwrappers = TenantAppWrappers(self.informers[0], policies, classes, DEFAULT_MAX_PRIORITY)
        self.dispatcher = wiring.loop(appwrappers=appwrappers, nodes=self.informers[1], pods=self.informers[2],
                                     writer=write_through if write_through is not None else self.writer,
                                     queue=wiring.dispatcher_queue(self.clock), clock=self.clock,
                                     **loop_options(**options))
        if options.get("quota_subtrees") is not None:
            self.informers.append(options["quota_subtrees"])  # started here, after the dispatcher's handlers
        if before_start is not None:
            before_start(self)  # e.g. handlers of a test's own, after the dispatcher's
        self.start_stepping()


def made_by(cls: Any) -> Iterator[Any]:
    """The body of a fixture that makes harnesses of ``cls`` (with ``drain`` and ``stop``) and stops them all."""
    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        made.append(cls(**kwargs))
        return made[-1]

    yield make
    for h in made:
        h.stop()


@pytest.fixture
def harness_factory() -> Iterator[Any]:
    yield from made_by(Harness)


def gpu_node(name: str, gpus: int) -> dict[str, Any]:
    raw = node(name, "8")
    raw["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus)
    return raw


def gang_aw(name: str, pods: int, requests: dict[str, str], priority: int = 0) -> dict[str, Any]:
    raw = aw(name, "0")
    raw["spec"]["priority"] = priority
    raw["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [{"replicas": pods, "requests": requests}]
    return raw


def last_status(h: Harness, name: str) -> dict[str, Any]:
    return next(status for n, status in reversed(h.writer.statuses) if n == name)
