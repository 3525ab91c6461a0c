"""Fair sharing's usage kept in a ConfigMap (``mcad.k8s.fairsharestore``) against the real API server: nothing
there yet reads as nothing, a write reads back as written (and a second write replaces it, with one field manager),
and what an admin's hand spoiled is refused with the reason, never half-read."""

from __future__ import annotations

from datetime import UTC, datetime

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from mcad.k8s.fairsharestore import KEY, MAX_TENANTS, FairShareStore, StoredUsageError


@pytest.fixture
def store(kubeconfig: str, namespace: str) -> FairShareStore:
    return FairShareStore(kube.Client(kube.connect(kubeconfig)), namespace, "mcad-fair-share")


def test_usage_round_trips_through_the_configmap(store: FairShareStore, core: k8s.CoreV1Api) -> None:
    assert store.read() is None
    saved_at = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
    store.write({"namespace:team-a": 1234.5, "quota:tree/gold": 0.25, "bad": float("inf")}, saved_at)
    assert store.read() == ({"namespace:team-a": 1234.5, "quota:tree/gold": 0.25}, saved_at)
    store.write({"namespace:team-b": 7.0}, saved_at)
    assert store.read() == ({"namespace:team-b": 7.0}, saved_at)
    stored = core.read_namespaced_config_map("mcad-fair-share", store.namespace)
    assert {m.manager for m in stored.metadata.managed_fields} == {"mcad-controller"}


def test_at_most_max_tenants_are_kept_the_largest(store: FairShareStore) -> None:
    usage = {f"namespace:t{i}": float(i) for i in range(MAX_TENANTS + 5)}
    store.write(usage, datetime(2026, 11, 29, tzinfo=UTC))
    found = store.read()
    assert found is not None and len(found[0]) == MAX_TENANTS and "namespace:t0" not in found[0]


@pytest.mark.parametrize(("data", "why"), [
    ({}, f"it has no {KEY}"),
    ({KEY: "{not json"}, "does not parse"),
    ({KEY: '{"savedAt": "2026-11-29T08:00:00", "tenants": {}}'}, "no time zone"),
    ({KEY: '{"savedAt": "2026-11-29T08:00:00+00:00", "tenants": []}'}, "no tenants map"),
])
def test_a_spoiled_configmap_is_refused_with_why(store: FairShareStore, core: k8s.CoreV1Api,
                                                 data: dict[str, str], why: str) -> None:
    core.create_namespaced_config_map(store.namespace, {"metadata": {"name": store.name}, "data": data})
    with pytest.raises(StoredUsageError, match=why):
        store.read()


def test_values_that_are_not_usage_are_dropped(store: FairShareStore, core: k8s.CoreV1Api) -> None:
    text = ('{"savedAt": "2026-11-29T08:00:00+00:00", "tenants": {"a": 1, "b": -3, "c": "x", "d": true, '
            '"e": 2.5}}')
    core.create_namespaced_config_map(store.namespace, {"metadata": {"name": store.name}, "data": {KEY: text}})
    found = store.read()
    assert found is not None and found[0] == {"a": 1.0, "e": 2.5}
