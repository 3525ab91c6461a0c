"""ResourceClient and Informer against a real API server: paging, watch resumption, selectors, 410 Gone.

410 is provoked with a CustomResourceDefinition created for the test: the API server's watch cache for a new
resource starts at the version the CRD was created at, so resourceVersion "1" is older than anything it holds.
A list at that exact version answers HTTP 410, a watch from it answers 200 then an in-stream ERROR 410, and a
continue token carrying that version is refused with 410 (probed on kube-apiserver v1.35; built-in resources
whose cache dates from the server's start serve version "1" instead, and compaction is five minutes away).
"""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from mcad.k8s.informer import EventType, Informer
from test.support import compact_local_etcd, wait_until

TIMEOUT = 30.0


@pytest.fixture(scope="module")
def conn(kubeconfig: str) -> kube.Connection:
    return kube.connect(kubeconfig)


@pytest.fixture
def compacted(kubeconfig: str) -> None:
    """Old resourceVersions expired: etcd compacted now, not at the API server's next 5-minute compaction."""
    if not compact_local_etcd(kubeconfig):
        pytest.skip("provoking 410 needs the local control plane's etcd (hack/localcluster.py)")


@pytest.fixture(scope="module")
def fresh_crd(api: k8s.ApiClient) -> Iterator[tuple[str, str]]:
    """(group, plural) of a namespaced CRD created for this module; deleted afterwards."""
    group = f"p{uuid.uuid4().hex[:8]}.mcad-test.example.com"
    name = f"widgets.{group}"
    ext = k8s.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition({
        "metadata": {"name": name, "labels": {"mcad.test/owned": "true"}},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
    })

    def established() -> bool:
        conditions = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    try:
        wait_until(established, TIMEOUT, f"CRD {name} Established")
        yield group, "widgets"
    finally:
        ext.delete_custom_resource_definition(name)


def create_widget(api: k8s.ApiClient, group: str, namespace: str, name: str) -> None:
    body = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name}}

    def created() -> bool:
        try:
            k8s.CustomObjectsApi(api).create_namespaced_custom_object(group, "v1", namespace, "widgets", body)
            return True
        except k8s.exceptions.ApiException as err:
            if err.status == 404:  # discovery/storage for the new CRD not ready yet
                return False
            raise

    wait_until(created, TIMEOUT, f"widget {name} created")


def configmap_client(conn: kube.Connection, namespace: str, **kwargs: Any) -> kube.ResourceClient:
    return kube.ResourceClient(conn, group="", version="v1", plural="configmaps", namespace=namespace, **kwargs)


class Recorder:
    """Handler that queues (type, name, data) of the objects it hears about."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[EventType, str, dict[str, str]]] = queue.Queue()

    def __call__(self, etype: EventType, old: Any, new: Any) -> None:
        obj = new if new is not None else old
        self.events.put((etype, obj["metadata"]["name"], dict(obj.get("data") or {})))

    def until(self, etype: EventType, name: str) -> list[tuple[EventType, str, dict[str, str]]]:
        """All events up to and including ``etype`` for ``name``, skipping kube-root-ca.crt."""
        deadline = time.monotonic() + TIMEOUT
        seen = []
        while True:
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {etype} for {name} within {TIMEOUT} s; saw {seen}") from None
            if event[1] == "kube-root-ca.crt":
                continue
            seen.append(event)
            if event[:2] == (etype, name):
                return seen


@pytest.fixture
def informers() -> Iterator[list[Informer[Any]]]:
    """Informers appended here are stopped, and their threads joined, after the test."""
    started: list[Informer[Any]] = []
    yield started
    for informer in started:
        informer.stop()
    for informer in started:
        thread = informer._thread
        if thread is not None:
            thread.join(10)
            assert not thread.is_alive(), f"informer {informer.name} did not stop"


def test_list_pages_through_every_item_and_returns_the_list_version(
    conn: kube.Connection, core: k8s.CoreV1Api, namespace: str
) -> None:
    for i in range(7):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": f"cm-{i}", "labels": {"page": "yes"}}})
    client = configmap_client(conn, namespace, label_selector="page=yes", page_size=3)
    pages: list[list[tuple[str, str]]] = []
    real_get = client._get_page

    def counting_get(query: list[tuple[str, str]]) -> tuple[dict[str, Any], int]:
        pages.append(query)
        return real_get(query)

    client._get_page = counting_get  # type: ignore[method-assign]

    items, resource_version = client.list()

    assert sorted(item["metadata"]["name"] for item in items) == [f"cm-{i}" for i in range(7)]
    assert len(pages) == 3  # 3 + 3 + 1
    assert ("limit", "3") in pages[0] and any(k == "continue" for k, _ in pages[1])
    assert all(item["kind"] == "ConfigMap" and item["apiVersion"] == "v1" for item in items)
    assert resource_version and int(resource_version) >= max(int(i["metadata"]["resourceVersion"]) for i in items)


def record_limits(client: kube.ResourceClient) -> list[int]:
    """The ``limit`` of every page ``client`` asks for from now on."""
    limits: list[int] = []
    real_get = client._get_page

    def recording_get(query: list[tuple[str, str]]) -> tuple[dict[str, Any], int]:
        limits.append(int(dict(query)["limit"]))
        return real_get(query)

    client._get_page = recording_get  # type: ignore[method-assign]
    return limits


def test_list_pages_aim_at_a_size_in_bytes_not_only_a_count(
    conn: kube.Connection, core: k8s.CoreV1Api, namespace: str
) -> None:
    """Large objects make pages of fewer items (a list of 1 MiB AppWrappers must not hold hundreds at once); small
    ones let the limit grow back towards page_size."""
    for i in range(12):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": f"big-{i:02d}", "labels": {"size": "big"}},
                                                      "data": {"v": "x" * 100_000}})
    big = configmap_client(conn, namespace, label_selector="size=big", page_size=500)
    big._page_bytes = 250_000
    limits = record_limits(big)
    items, _ = big.list()
    assert sorted(i["metadata"]["name"] for i in items) == [f"big-{i:02d}" for i in range(12)]
    assert limits[0] == kube.FIRST_PAGE_LIMIT
    assert all(limit <= 2 for limit in limits[1:]), limits  # 250 kB a page: two of these at most
    assert big.largest_page_bytes <= kube.FIRST_PAGE_LIMIT * 101_000

    for i in range(40):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": f"small-{i:02d}", "labels": {"size": "s"}}})
    small = configmap_client(conn, namespace, label_selector="size=s", page_size=500)
    limits = record_limits(small)
    assert len(small.list()[0]) == 40
    assert limits == [8, 32], "small pages let the limit grow, fourfold at most"


def test_informer_sees_create_update_delete_in_order(
    conn: kube.Connection, core: k8s.CoreV1Api, namespace: str, informers: list[Informer[Any]]
) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "before"}, "data": {"v": "0"}})
    recorder = Recorder()
    informer: Informer[Any] = Informer("configmaps", configmap_client(conn, namespace))
    informer.add_handler(recorder)
    informers.append(informer)
    informer.start()
    assert informer.wait_synced(TIMEOUT)
    assert recorder.until("ADDED", "before") == [("ADDED", "before", {"v": "0"})]

    core.create_namespaced_config_map(namespace, {"metadata": {"name": "cm"}, "data": {"v": "1"}})
    core.patch_namespaced_config_map("cm", namespace, {"data": {"v": "2"}})
    core.delete_namespaced_config_map("cm", namespace)

    assert recorder.until("DELETED", "cm") == [
        ("ADDED", "cm", {"v": "1"}), ("MODIFIED", "cm", {"v": "2"}), ("DELETED", "cm", {"v": "2"})]
    assert informer.get(f"{namespace}/cm") is None
    assert informer.get(f"{namespace}/before")["data"] == {"v": "0"}
    assert informer.relists == 0


class ChangeBetweenStreams:
    """A ListerWatcher that, each time a watch stream ends, creates a ConfigMap before the next watch starts."""

    def __init__(self, inner: kube.ResourceClient, core: k8s.CoreV1Api, namespace: str) -> None:
        self.inner = inner
        self.core = core
        self.namespace = namespace
        self.lists = 0
        self.watches: list[str] = []  # the resourceVersion each watch started from
        self.created: list[str] = []

    def list(self, *, compact: Any = None) -> tuple[list[Any], str]:
        self.lists += 1
        return self.inner.list(compact=compact)

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        self.watches.append(resource_version)
        yield from self.inner.watch(resource_version, timeout_seconds)
        name = f"between-{len(self.created)}"
        self.core.create_namespaced_config_map(self.namespace, {"metadata": {"name": name}})
        self.created.append(name)


def test_watch_resumes_after_the_server_ends_it_without_missing_an_event(
    conn: kube.Connection, core: k8s.CoreV1Api, namespace: str, informers: list[Informer[Any]]
) -> None:
    source = ChangeBetweenStreams(configmap_client(conn, namespace), core, namespace)
    recorder = Recorder()
    informer: Informer[Any] = Informer("configmaps", source, watch_timeout=(1, 1))
    informer.add_handler(recorder)
    informers.append(informer)
    started = time.monotonic()
    informer.start()

    # between-0 is created after the first stream ended and before the second began: only resuming from the
    # last resourceVersion (not "now") delivers it.
    recorder.until("ADDED", "between-0")
    recorder.until("ADDED", "between-1")
    elapsed = time.monotonic() - started

    assert source.lists == 1 and informer.relists == 0
    assert len(source.watches) >= 3
    # Each watch resumed from the version the previous one reached, never from "" (which means "now").
    assert all(source.watches) and int(source.watches[1]) >= int(source.watches[0])
    assert elapsed >= 1.5  # two server-side timeouts of 1 s each really happened
    assert {f"{namespace}/between-0", f"{namespace}/between-1"} <= set(informer.keys())


def test_label_selector_limits_what_the_informer_sees(
    conn: kube.Connection, core: k8s.CoreV1Api, namespace: str, informers: list[Informer[Any]]
) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "mine-0", "labels": {"team": "a"}}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "other-0", "labels": {"team": "b"}}})
    recorder = Recorder()
    informer: Informer[Any] = Informer("team-a", configmap_client(conn, namespace, label_selector="team=a"))
    informer.add_handler(recorder)
    informers.append(informer)
    informer.start()
    assert informer.wait_synced(TIMEOUT)

    core.create_namespaced_config_map(namespace, {"metadata": {"name": "other-1", "labels": {"team": "b"}}})
    core.patch_namespaced_config_map("other-0", namespace, {"metadata": {"labels": {"team": "a"}}})  # joins
    core.patch_namespaced_config_map("mine-0", namespace, {"metadata": {"labels": {"team": "b"}}})  # leaves
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "mine-1", "labels": {"team": "a"}}})

    events = recorder.until("ADDED", "mine-1")
    assert [(etype, name) for etype, name, _ in events] == [
        ("ADDED", "mine-0"), ("ADDED", "other-0"), ("DELETED", "mine-0"), ("ADDED", "mine-1")]
    assert sorted(informer.keys()) == [f"{namespace}/mine-1", f"{namespace}/other-0"]


def test_stop_ends_a_long_watch_at_once(
    conn: kube.Connection, namespace: str, informers: list[Informer[Any]]
) -> None:
    informer: Informer[Any] = Informer("configmaps", configmap_client(conn, namespace), watch_timeout=(300, 300))
    thread = informer.start()
    assert informer.wait_synced(TIMEOUT)
    wait_until(lambda: informer._stream is not None, TIMEOUT, "the watch to be open")

    started = time.monotonic()
    informer.stop()
    thread.join(10)

    assert not thread.is_alive()
    assert time.monotonic() - started < 2.0


def test_watch_stream_close_from_another_thread_unblocks_the_reader(
    conn: kube.Connection, namespace: str
) -> None:
    client = configmap_client(conn, namespace)
    _, resource_version = client.list()
    stream = client.watch(resource_version, 300)
    received: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: received.extend(stream), daemon=True)
    reader.start()
    wait_until(lambda: stream._reading, TIMEOUT, "the reader to block in next()")

    started = time.monotonic()
    stream.close()
    reader.join(5)

    assert not reader.is_alive() and time.monotonic() - started < 2.0
    assert received == []


def test_list_at_a_version_older_than_the_server_keeps_raises_gone(
    conn: kube.Connection, api: k8s.ApiClient, namespace: str, fresh_crd: tuple[str, str], compacted: None
) -> None:
    group, plural = fresh_crd
    create_widget(api, group, namespace, "w0")
    client = kube.ResourceClient(conn, group=group, version="v1", plural=plural, namespace=namespace)

    with pytest.raises(kube.GoneError) as gone:
        client.list(resource_version="1")

    assert gone.value.status == 410 and gone.value.reason == "Expired"
    items, _ = client.list()
    assert [(i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in items] == [("Widget", f"{group}/v1", "w0")]


def test_watch_from_a_version_older_than_the_server_keeps_yields_an_in_stream_gone(
    conn: kube.Connection, api: k8s.ApiClient, namespace: str, fresh_crd: tuple[str, str], compacted: None
) -> None:
    group, plural = fresh_crd
    create_widget(api, group, namespace, "w0")
    client = kube.ResourceClient(conn, group=group, version="v1", plural=plural, namespace=namespace)

    events: list[dict[str, Any]] = []
    try:
        events = list(client.watch("1", 5))
    except kube.GoneError:  # a server may also refuse the request itself; both mean "relist"
        return
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410
    assert isinstance(kube.error_from_status(events[0]["object"]), kube.GoneError)


def test_an_expired_continue_token_restarts_the_list_once(
    conn: kube.Connection, api: k8s.ApiClient, namespace: str, fresh_crd: tuple[str, str], compacted: None
) -> None:
    group, plural = fresh_crd
    for i in range(5):
        create_widget(api, group, namespace, f"w{i}")
    client = kube.ResourceClient(conn, group=group, version="v1", plural=plural, namespace=namespace, page_size=2)
    # Swap the first continue token for one whose version predates the resource's watch cache: the server
    # refuses it with 410, as it would a token that outlived etcd compaction.
    expired = base64.urlsafe_b64encode(json.dumps(
        {"v": "meta.k8s.io/v1", "rv": 1, "start": "w1\u0000"}).encode()).decode().rstrip("=")
    real_get = client._get_page
    answers: list[str] = []

    def get_with_one_expired_token(query: list[tuple[str, str]]) -> tuple[dict[str, Any], int]:
        if any(k == "continue" for k, _ in query) and "Expired" not in answers:
            query = [(k, expired if k == "continue" else v) for k, v in query]
        try:
            page = real_get(query)
        except kube.GoneError:
            answers.append("Expired")
            raise
        answers.append("ok")
        return page

    client._get_page = get_with_one_expired_token  # type: ignore[method-assign]

    items, resource_version = client.list()

    assert sorted(i["metadata"]["name"] for i in items) == [f"w{i}" for i in range(5)]
    assert answers == ["ok", "Expired", "ok", "ok", "ok"]  # page 1, expired page 2, then 3 fresh pages
    assert resource_version


def test_list_compacts_each_item_as_its_page_arrives(conn: kube.Connection, api: k8s.ApiClient,
                                                     namespace: str) -> None:
    core = k8s.CoreV1Api(api)
    for i in range(5):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": f"c{i}"}})
    names, resource_version = configmap_client(conn, namespace, page_size=2).list(
        compact=lambda raw: raw["metadata"]["name"])
    assert sorted(n for n in names if n.startswith("c")) == [f"c{i}" for i in range(5)]
    assert resource_version
