"""Pure parts of hack/localcluster.py: node manifests, readiness, ports, environment parsing."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

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


def test_reserved_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The same candidate twice, then a fresh one: the second call must not return the first's port.
    picks = iter([21001, 21001, 21002])
    monkeypatch.setattr(lc.random, "randint", lambda low, high: next(picks))
    monkeypatch.setattr(lc, "_HANDED_OUT", set())
    assert [lc.reserved_port(), lc.reserved_port()] == [21001, 21002]


def test_a_reserved_port_someone_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        picks = iter([taken, 21003])
        monkeypatch.setattr(lc.random, "randint", lambda low, high: next(picks))
        monkeypatch.setattr(lc, "_HANDED_OUT", set())
        assert lc.reserved_port() == 21003


def test_reserved_ports_are_drawn_below_the_kernels_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    bounds: list[tuple[int, int]] = []
    monkeypatch.setattr(lc.random, "randint", lambda low, high: bounds.append((low, high)) or 21004)
    monkeypatch.setattr(lc, "_HANDED_OUT", set())
    monkeypatch.setattr(lc, "ephemeral_low", lambda: 32768)
    lc.reserved_port()
    assert bounds == [(26000, 32767)]


def test_the_ports_clusters_name_at_up_never_meet_the_ports_tests_name() -> None:
    # A test's server on the port a cluster's API server calls its webhook at would receive the cluster's reviews.
    assert lc.CLUSTER_PORTS[1] < lc.TEST_PORTS_LOW


def test_ephemeral_low_reads_the_kernel_range_and_falls_back_on_garbage(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("40000\t60999\n")
    bad.write_text("")
    assert lc.ephemeral_low(good) == 40000
    assert lc.ephemeral_low(bad) == 32768
    assert lc.ephemeral_low(tmp_path / "missing") == 32768


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


def test_webhook_client_credentials_go_to_one_webhook_host_only(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server's admission kubeconfig names 127.0.0.1:<port> alone: no "*" entry and no current context,
    which the API server would otherwise use for every other webhook too."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl makes the cluster's certificates")
    monkeypatch.setenv("MCAD_DEV_DIR", str(tmp_path))
    layout = lc.Layout("unit")
    lc.make_pki(layout.pki)
    found = lc.webhook_client_config(layout, 23456)
    assert found["port"] == 23456 and found["name"] == lc.WEBHOOK_CLIENT_NAME
    kubeconfig = json.loads((layout.state / "admission-kubeconfig.json").read_text())
    assert [u["name"] for u in kubeconfig["users"]] == ["127.0.0.1:23456"]
    assert "current-context" not in kubeconfig and "contexts" not in kubeconfig
    user = kubeconfig["users"][0]["user"]
    assert user["token"] == Path(found["token_file"]).read_text().strip()
    assert user["client-certificate"] == found["cert"] and user["client-key"] == found["key"]
    config = json.loads((layout.state / "admission-config.json").read_text())
    assert config["kind"] == "AdmissionConfiguration"
    assert {p["name"]: p["configuration"]["kubeConfigFile"] for p in config["plugins"]} == {
        "ValidatingAdmissionWebhook": str(layout.state / "admission-kubeconfig.json"),
        "MutatingAdmissionWebhook": str(layout.state / "admission-kubeconfig.json")}
