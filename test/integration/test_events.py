"""The event recorder against a real API server: Events on a real AppWrapper that `kubectl describe` lists,
aggregation into one Event, the global limit under a flood, an expired Event re-created, a missing namespace
logged once, and transient failures retried then dropped (against a port nothing listens on)."""

from __future__ import annotations

import shutil
import socket
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
import yaml

from mcad.api.appwrapper import GROUP, PLURAL, VERSION
from mcad.k8s import events, kube
from mcad.k8s.eventlimits import EventLimits
from mcad.k8s.events import DROP_GLOBAL, DROP_SEND_FAILED, NORMAL, WARNING, EventRecorder, ObjectRef
from test.support import REPO

IDLE_TIMEOUT = 60.0  # seconds to wait for the recorder's queue to be sent


@pytest.fixture
def conn(kubeconfig: str) -> kube.Connection:
    return kube.connect(kubeconfig)


@pytest.fixture
def recorder(conn: kube.Connection) -> Iterator[EventRecorder]:
    rec = EventRecorder(conn, instance="test-instance")
    rec.start()
    try:
        yield rec
    finally:
        rec.stop(10.0)


def create_appwrapper(api: k8s.ApiClient, namespace: str, name: str) -> ObjectRef:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AppWrapper", "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": {
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-cm"}}}]}}}
    created = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return ObjectRef.appwrapper(namespace, name, created["metadata"]["uid"])


def events_about(core: k8s.CoreV1Api, namespace: str, name: str) -> list[Any]:
    return list(core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items)


def idle(recorder: EventRecorder) -> None:
    assert recorder.wait_idle(IDLE_TIMEOUT), f"events still unsent after {IDLE_TIMEOUT} s: {recorder.counters()}"


def test_an_event_on_a_real_appwrapper_is_found_by_involved_object(
        crd: None, api: k8s.ApiClient, core: k8s.CoreV1Api, namespace: str, recorder: EventRecorder) -> None:
    ref = create_appwrapper(api, namespace, "trainer")
    recorder.record(ref, NORMAL, events.QUEUED, "Insufficient resources to dispatch AppWrapper: cpu short by 2")
    idle(recorder)

    (event,) = events_about(core, namespace, "trainer")
    involved = event.involved_object
    assert (involved.api_version, involved.kind, involved.namespace, involved.name, involved.uid) == (
        f"{GROUP}/{VERSION}", "AppWrapper", namespace, "trainer", ref.uid)
    assert (event.type, event.reason, event.count) == ("Normal", "Queued", 1)
    assert event.message == "Insufficient resources to dispatch AppWrapper: cpu short by 2"
    assert event.source.component == "mcad-controller"
    assert (event.reporting_component, event.reporting_instance) == ("mcad-controller", "test-instance")
    assert event.first_timestamp == event.last_timestamp
    assert event.metadata.name.startswith("trainer.")
    assert recorder.counters().sent == 1


def test_kubectl_describe_appwrapper_shows_the_events(
        crd: None, api: k8s.ApiClient, kubeconfig: str, namespace: str, recorder: EventRecorder) -> None:
    kubectl = shutil.which("kubectl") or str(REPO / ".dev" / "bin" / "kubectl")
    if not Path(kubectl).exists():
        pytest.skip("no kubectl on PATH or in .dev/bin")
    ref = create_appwrapper(api, namespace, "described")
    recorder.record(ref, NORMAL, events.DISPATCHED, "Dispatched 2 items")
    recorder.record(ref, WARNING, events.PREEMPTED, "Preempted for team-b/urgent (priority 10)")
    idle(recorder)

    out = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "describe", "appwrapper", "described", "-n",
                          namespace], capture_output=True, text=True, timeout=60, check=True).stdout
    listed = out.split("Events:", 1)[1]
    assert "Normal   Dispatched" in listed and "Dispatched 2 items" in listed, out
    assert "Warning  Preempted" in listed and "Preempted for team-b/urgent (priority 10)" in listed, out
    assert "mcad-controller" in listed, out


def test_the_same_event_twice_is_one_event_with_count_2(
        crd: None, api: k8s.ApiClient, core: k8s.CoreV1Api, namespace: str, recorder: EventRecorder) -> None:
    ref = create_appwrapper(api, namespace, "twice")
    recorder.record(ref, WARNING, events.REQUEUED, "2 of 4 pods running after 300 s")
    idle(recorder)  # so the second is a PATCH of the created Event, not folded into the queued create
    recorder.record(ref, WARNING, events.REQUEUED, "2 of 4 pods running after 300 s")
    idle(recorder)

    (event,) = events_about(core, namespace, "twice")
    assert event.count == 2
    counters = recorder.counters()
    assert (counters.recorded, counters.sent, counters.aggregated, counters.dropped) == (2, 2, 1, {})

    recorder.record(ref, WARNING, events.REQUEUED, "1 of 4 pods running after 600 s")  # another message
    idle(recorder)
    assert sorted(e.count for e in events_about(core, namespace, "twice")) == [1, 2]


def test_an_expired_event_is_created_again_with_the_full_count(
        core: k8s.CoreV1Api, namespace: str, recorder: EventRecorder) -> None:
    ref = ObjectRef.appwrapper(namespace, "expiring", str(uuid.uuid4()))
    recorder.record(ref, NORMAL, events.QUEUED, "waiting")
    idle(recorder)
    (first,) = events_about(core, namespace, "expiring")
    core.delete_namespaced_event(first.metadata.name, namespace)  # as the API server's event TTL does

    recorder.record(ref, NORMAL, events.QUEUED, "waiting")
    idle(recorder)
    (again,) = events_about(core, namespace, "expiring")
    assert (again.metadata.name, again.count) == (first.metadata.name, 2)
    counters = recorder.counters()
    assert (counters.sent, counters.send_errors, counters.dropped) == (2, {}, {})


def test_a_flood_for_2000_objects_writes_at_most_the_global_burst_plus_rate(
        conn: kube.Connection, core: k8s.CoreV1Api, namespace: str) -> None:
    limits = EventLimits()
    started = time.monotonic()  # the global bucket is full from the recorder's creation
    recorder = EventRecorder(conn, instance="flood", limits=limits)
    recorder.start()
    try:
        for i in range(2000):
            recorder.record(ObjectRef.appwrapper(namespace, f"aw-{i}", f"uid-{i}"), NORMAL, events.QUEUED,
                            "Insufficient resources to dispatch AppWrapper.")
        elapsed = time.monotonic() - started
        idle(recorder)
    finally:
        recorder.stop(10.0)

    written = core.list_namespaced_event(namespace).items
    allowed = limits.global_burst + limits.global_rate * elapsed
    assert limits.global_burst <= len(written) <= allowed, (len(written), elapsed)
    counters = recorder.counters()
    assert counters.recorded == 2000
    assert counters.sent == len(written)
    assert counters.dropped == {DROP_GLOBAL: 2000 - len(written)}


def test_record_returns_in_microseconds(
        conn: kube.Connection, namespace: str, record_property: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Measured, not asserted (a loaded machine would make any bound flaky): max, p99 and median of 10,000
    calls for 10,000 objects while the sender thread writes the ones the limits let through."""
    recorder = EventRecorder(conn, instance="timing")
    recorder.start()
    refs = [ObjectRef.appwrapper(namespace, f"aw-{i}", f"uid-{i}") for i in range(10_000)]
    durations = []
    try:
        for ref in refs:
            before = time.perf_counter_ns()
            recorder.record(ref, NORMAL, events.QUEUED, "Insufficient resources to dispatch AppWrapper.")
            durations.append(time.perf_counter_ns() - before)
        idle(recorder)
    finally:
        recorder.stop(10.0)
    durations.sort()
    measured = {"max_us": durations[-1] / 1000, "p99_us": durations[9899] / 1000,
                "median_us": statistics.median(durations) / 1000, "sent": recorder.counters().sent}
    for key, value in measured.items():
        record_property(key, value)
    with capsys.disabled():
        print(f"\nrecord() over 10,000 calls: {measured}")
    assert recorder.counters().recorded == 10_000


class RecordingLog:
    """Stands in for the module's structlog logger to count what the sender logs (log output, not the API)."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, message: str, **fields: Any) -> None:
        self.warnings.append((message, fields))

    def exception(self, message: str, **fields: Any) -> None:
        raise AssertionError(f"unexpected exception logged: {message} {fields}")

    error = exception


def test_a_missing_namespace_is_counted_per_event_and_logged_once(
        conn: kube.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    logged = RecordingLog()
    monkeypatch.setattr(events, "log", logged)
    gone = f"mcad-gone-{uuid.uuid4().hex[:8]}"
    recorder = EventRecorder(conn, instance="gone")
    recorder.start()
    try:
        for i in range(5):
            recorder.record(ObjectRef.appwrapper(gone, f"aw-{i}", f"uid-{i}"), NORMAL, events.QUEUED, "waiting")
        idle(recorder)
    finally:
        recorder.stop(10.0)
    counters = recorder.counters()
    assert counters.send_errors == {404: 5}  # not retried
    assert counters.dropped == {DROP_SEND_FAILED: 5}
    assert [(m, f["namespace"], f["status"]) for m, f in logged.warnings] == [("event not written", gone, 404)]


@pytest.fixture
def unreachable_conn(tmp_path: Path) -> kube.Connection:
    """A connection to a loopback port that nothing listens on: every request fails with no response."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                  "insecure-skip-tls-verify": True}}],
        "users": [{"name": "nobody", "user": {"token": "none"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "nobody"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return kube.connect(str(path))


def test_transient_failures_are_retried_with_backoff_then_dropped(unreachable_conn: kube.Connection) -> None:
    recorder = EventRecorder(unreachable_conn, instance="dead",
                             limits=EventLimits(send_retries=2, retry_base_delay=0.05))
    recorder.start()
    started = time.monotonic()
    try:
        recorder.record(ObjectRef.appwrapper("default", "aw", "uid"), NORMAL, events.QUEUED, "waiting")
        idle(recorder)
    finally:
        recorder.stop(10.0)
    counters = recorder.counters()
    assert counters.send_errors == {0: 3}  # the first try and two retries, all without a response
    assert counters.dropped == {DROP_SEND_FAILED: 1}
    assert time.monotonic() - started >= 0.05 + 0.1  # it did back off between tries


def test_stop_gives_up_on_a_backlog_it_cannot_send_in_time(unreachable_conn: kube.Connection) -> None:
    recorder = EventRecorder(unreachable_conn, instance="dead",
                             limits=EventLimits(send_retries=5, retry_base_delay=1.0))
    recorder.start()
    for i in range(20):
        recorder.record(ObjectRef.appwrapper("default", f"aw-{i}", f"uid-{i}"), NORMAL, events.QUEUED, "waiting")
    started = time.monotonic()
    assert not recorder.stop(0.5)
    assert time.monotonic() - started < 5.0  # the backoff wait was cut short
    counters = recorder.counters()
    assert counters.queued == 0
    assert counters.dropped.get(events.DROP_STOPPED, 0) + counters.dropped.get(DROP_SEND_FAILED, 0) == 20
    assert counters.dropped.get(events.DROP_STOPPED, 0) >= 18
