"""hack/localcluster.py as a user drives it: a second cluster beside the session's, up twice, then down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test.support import REPO, load_hack_module

lc = load_hack_module("localcluster")
NAME = "mcad-lifecycle-test"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "hack" / "localcluster.py"), "--name", NAME, *args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


@pytest.fixture
def second_cluster(kubeconfig: str) -> Iterator[lc.Layout]:
    # Depends on ``kubeconfig`` so it runs where the session's cluster (and so the binaries) exist.
    layout = lc.Layout(NAME)
    try:
        yield layout
    finally:
        run("down")


def test_up_is_idempotent_and_down_removes_everything(second_cluster: lc.Layout) -> None:
    first = run("up", env={"NODES": "2", "NODE_CPU": "3", "NODE_MEMORY": "5Gi", "NODE_GPU": "1"})
    assert first.returncode == 0, first.stderr
    assert f"Kubeconfig: {second_cluster.kubeconfig}" in first.stdout
    pids = json.loads(second_cluster.state_file.read_text())["pids"]

    conn = kube.connect(str(second_cluster.kubeconfig))
    nodes = k8s.CoreV1Api(conn.api).list_node().items
    assert sorted(n.metadata.name for n in nodes) == ["kwok-node-0", "kwok-node-1"]
    for node in nodes:
        assert node.status.allocatable["cpu"] == "3"
        assert node.status.allocatable["memory"] == "5Gi"
        assert node.status.allocatable["nvidia.com/gpu"] == "1"

    again = run("up")
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stderr
    assert json.loads(second_cluster.state_file.read_text())["pids"] == pids, "a second up must not restart"

    assert run("status").returncode == 0
    down = run("down")
    assert down.returncode == 0, down.stderr
    assert not any(lc.pid_alive(pid) for pid in pids.values())
    assert not second_cluster.state.exists()
    assert not second_cluster.kubeconfig.exists()
    assert run("status").returncode == 1
