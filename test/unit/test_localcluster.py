"""Pure parts of hack/localcluster.py: node manifests, readiness, ports, environment parsing."""

from __future__ import annotations

import pytest

from test.support import load_hack_module

lc = load_hack_module("localcluster")


def test_fake_node_is_managed_by_kwok_untainted_and_carries_its_capacity() -> None:
    node = lc.fake_node("n0", "8", "8Gi", 2, 110)
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert "taints" not in node.get("spec", {}), "ordinary manifests must schedule without tolerations"
    assert node["status"]["allocatable"] == {"cpu": "8", "memory": "8Gi", "pods": "110", "nvidia.com/gpu": "2"}
    assert node["status"]["capacity"] == node["status"]["allocatable"]


def test_fake_node_without_gpus_has_no_gpu_resource() -> None:
    assert "nvidia.com/gpu" not in lc.fake_node("n0", "8", "8Gi", 0, 110)["status"]["allocatable"]


@pytest.mark.parametrize(("node", "expected"), [
    ({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True),
    ({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, False),
    ({"status": {}}, False),
    ({"spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
      "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, False),
])
def test_node_ready_and_untainted(node: dict[str, object], expected: bool) -> None:
    assert lc.node_ready_and_untainted(node) is expected


def test_free_ports_are_distinct() -> None:
    ports = lc.free_ports(6)
    assert len(set(ports)) == 6
    assert all(1024 < p < 65536 for p in ports)


def test_env_int_rejects_garbage_with_the_variable_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODES", "three")
    with pytest.raises(SystemExit, match="NODES='three' is not an integer"):
        lc.env_int("NODES", 1)


def test_env_int_default_when_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODES", raising=False)
    assert lc.env_int("NODES", 1) == 1
    monkeypatch.setenv("NODES", "")
    assert lc.env_int("NODES", 1) == 1


def test_default_cluster_uses_dev_kubeconfig_and_others_a_suffixed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCAD_DEV_DIR", raising=False)
    assert lc.Layout("mcad").kubeconfig == lc.REPO / ".dev" / "kubeconfig"
    assert lc.Layout("worker1").kubeconfig == lc.REPO / ".dev" / "kubeconfig-worker1"
    assert lc.Layout("worker1").state == lc.REPO / ".dev" / "clusters" / "worker1"
