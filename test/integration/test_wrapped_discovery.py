"""WrappedObjects against a real API server: a group whose discovery answers 503 (an aggregated APIService whose
backing Service does not exist, as when an extension API server is down) is asked about again with backoff, not
remembered as "not served"; once the group is served (here, by a CRD), the kind is watched and the waiting
AppWrapper is woken. A kind that is not served is an answer, and wakes its waiter too."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest
import structlog

from mcad.k8s import kube
from mcad.k8s.wrapped import WrappedObjects, informer_factory
from test.support import wait_until

GROUP = "flaky.mcad.test"
API_SERVICE = f"v1.{GROUP}"
CRD = f"widgets.{GROUP}"
TIMEOUT = 30.0


def _ignore_404(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except k8s.ApiException as err:
        if err.status != 404:
            raise


@pytest.fixture
def unavailable_group(api: k8s.ApiClient) -> Iterator[None]:
    """GROUP served by an aggregated API server that is not there: its discovery answers 503."""
    registration = k8s.ApiregistrationV1Api(api)
    extensions = k8s.ApiextensionsV1Api(api)
    registration.create_api_service({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
        "spec": {"group": GROUP, "version": "v1", "groupPriorityMinimum": 1000, "versionPriority": 15,
                 "insecureSkipTLSVerify": True, "service": {"name": "nowhere", "namespace": "default"}}})
    try:
        yield
    finally:
        _ignore_404(extensions.delete_custom_resource_definition, CRD)
        _ignore_404(registration.delete_api_service, API_SERVICE)


def serve_with_a_crd(api: k8s.ApiClient) -> None:
    _ignore_404(k8s.ApiregistrationV1Api(api).delete_api_service, API_SERVICE)
    extensions = k8s.ApiextensionsV1Api(api)
    extensions.create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": CRD},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]}})


class Woken:
    def __init__(self) -> None:
        self._keys: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, key: str) -> None:
        with self._lock:
            self._keys.append(key)

    def seen(self) -> list[str]:
        with self._lock:
            return list(self._keys)


def test_a_503_from_discovery_is_retried_until_the_kind_is_served_then_the_waiter_is_woken(
        kubeconfig: str, api: k8s.ApiClient, unavailable_group: None) -> None:
    conn = kube.connect(kubeconfig)
    client = kube.Client(conn)

    def unavailable() -> bool:
        try:
            client.resource(f"{GROUP}/v1", "Widget")
        except kube.ApiError as err:
            return err.status == 503
        return False

    wait_until(unavailable, TIMEOUT, "the group's discovery to answer 503")
    woken = Woken()
    # A short recheck: a "not served" answer in the moment between the APIService's removal and the CRD's being
    # served is asked again soon, not after the default minute.
    wrapped = WrappedObjects(informer_factory(conn, client), woken, retry_seconds=(0.05, 0.4), recheck_seconds=0.5)
    try:
        with structlog.testing.capture_logs() as logs:
            assert wrapped.ensure(f"{GROUP}/v1", "Widget", waiter="team/a") is False

            def failures() -> int:
                return sum(1 for e in list(logs) if e.get("event", "").startswith("cannot tell whether a wrapped kind")
                           and e.get("kind") == "Widget")

            wait_until(lambda: failures() >= 3 or None, TIMEOUT, "discovery failing, and asked again")
            assert wrapped.ensure(f"{GROUP}/v1", "Widget", waiter="team/a") is False, "a 503 is not an answer"
            assert woken.seen() == [], "nor does it wake anyone"
            assert [e.get("failure") for e in logs if e.get("kind") == "Widget"][:3] == ["unavailable"] * 3

            serve_with_a_crd(api)
            # A discovery between the APIService's removal and the CRD's being served may answer "not served",
            # which wakes the waiter too (to ask again, as its AppWrapper's sync does): it is asked again here.
            wait_until(lambda: wrapped.ensure(f"{GROUP}/v1", "Widget", waiter="team/a") or None, TIMEOUT,
                       "the kind served and its informer synced")
            wait_until(lambda: "team/a" in woken.seen() or None, TIMEOUT, "the waiting AppWrapper woken")
        assert set(woken.seen()) == {"team/a"}
        assert [i.name for i in wrapped.informers()] == ["wrapped-widget"]

        assert wrapped.ensure("v1", "Widget", waiter="team/b") is False
        wait_until(lambda: "team/b" in woken.seen() or None, TIMEOUT, "a not-served answer wakes its waiter")
        assert wrapped.ensure("v1", "Widget") is False, "not served, remembered"
    finally:
        wrapped.stop()
