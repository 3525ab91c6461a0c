"""The real node leaves other local clusters alone: a loopback cluster of hack/localcluster.py (what `make test`,
the demos and the benches run) comes up beside it, answers, runs pods on its kwok node and goes down cleanly, while
the e2e cluster's kubelet, kube-proxy and iptables rules are in place.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from mcad.k8s import kube
from test.installed.conftest import Installation
from test.support import REPO, load_hack_module, wait_until

pytestmark = pytest.mark.this_machine
NAME = "e2e-neighbour"
lc = load_hack_module("localcluster")


def localcluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "hack" / "localcluster.py"), "--name", NAME, *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def neighbour(installation: Installation) -> Iterator[kube.Connection]:
    proc = localcluster("up", "--nodes", "1")
    try:
        assert proc.returncode == 0, proc.stderr
        yield kube.connect(str(lc.Layout(NAME).kubeconfig))
    finally:
        down = localcluster("down")
        assert down.returncode == 0, down.stderr


def test_a_loopback_cluster_beside_the_real_node_works(installation: Installation,
                                                       neighbour: kube.Connection) -> None:
    assert neighbour.server.startswith("https://127.0.0.1:")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "neighbour"},
           "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}]}}
    kube.request_json(neighbour, "POST", "/api/v1/namespaces/default/pods", body=pod)
    wait_until(lambda: kube.request_json(neighbour, "GET", "/api/v1/namespaces/default/pods/neighbour")
               ["status"].get("phase") == "Running", 60, "the neighbour's pod to run on its kwok node")
    # The installation is unaffected by its neighbour.
    installation.wait_healthy()
