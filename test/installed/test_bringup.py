"""How `make e2e-up` (hack/e2ecluster.py up) fails: one line naming the cause and what to run, and nothing left.

A missing Docker engine and a taken port are found before anything starts; a kubelet that never registers its node
and a controller image that cannot start are found while the cluster comes up, and then everything started is
taken down: no process, mount, cgroup, bridge, iptables chain or sysctl of the attempt stays (hack/hoststate.py,
checked here against a snapshot taken before). Each runs under a cluster name of its own, before the session's
cluster is up (marker ``bringup``).
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from test.installed.conftest import e2ecluster, e2ecluster_command
from test.support import REPO, load_hack_module

pytestmark = [pytest.mark.bringup, pytest.mark.this_machine, pytest.mark.usefixtures("no_real_node")]
NAME = "e2e-fault"
hoststate = load_hack_module("hoststate")
lc = load_hack_module("localcluster")


def error_line(stderr: str) -> str:
    """The last line of the script's messages: the one that says what failed."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "no message at all"
    return lines[-1]


def assert_nothing_left(before: dict, name: str = NAME) -> None:
    node = e2ecluster.Node(name)
    assert hoststate.leftovers(before, node.scope()) == []
    assert not lc.Layout(name).state.exists()
    assert e2ecluster.read_node_state(node) is None


def test_without_a_docker_engine_nothing_starts() -> None:
    before = hoststate.snapshot()
    proc = e2ecluster_command("--name", NAME, "up", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 1
    line = error_line(proc.stderr)
    assert line.startswith("[e2e-cluster] error: the Docker engine does not answer"), proc.stderr
    assert "dockerd" in line
    assert_nothing_left(before)


def test_a_taken_api_server_port_is_named_before_anything_starts() -> None:
    before = hoststate.snapshot()
    address = e2ecluster.host_address()
    with socket.socket() as taken:
        taken.bind((address, 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = e2ecluster_command("--name", NAME, "up", "--api-port", str(port))
    assert proc.returncode == 1
    line = error_line(proc.stderr)
    assert line.startswith(f"[e2e-cluster] error: port {port} on {address} is taken"), proc.stderr
    assert "--api-port" in line
    assert_nothing_left(before)


def test_a_kubelet_that_never_registers_is_named_and_everything_is_taken_down() -> None:
    before = hoststate.snapshot()
    proc = e2ecluster_command("--name", NAME, "up", "--node-timeout", "20",
                              env={"E2E_KUBELET_ARGS": "--register-node=false"})
    assert proc.returncode == 1
    line = error_line(proc.stderr)
    assert line.startswith(f"[e2e-cluster] error: the kubelet did not bring node mcad-{NAME}-node Ready within "
                           "20 s (see kubelet.log)"), proc.stderr
    assert f".dev/e2e-logs/e2ecluster-{NAME}" in line and "all of it was taken down" in line
    assert (REPO / ".dev" / "e2e-logs" / f"e2ecluster-{NAME}" / "logs" / "kubelet.log").exists()
    assert_nothing_left(before)


@pytest.fixture
def broken_image() -> str:
    """An image whose entrypoint says so and exits 3, made from the local base image."""
    base = subprocess.run([str(REPO / "hack" / "base-image.sh")], capture_output=True, text=True, timeout=900,
                          check=True).stdout.strip()
    tag = "mcad.local/broken:e2e"
    dockerfile = (f"FROM {base}\n"
                  'ENTRYPOINT ["python3", "-c", "import sys; print(\'broken on purpose\'); sys.exit(3)"]\n')
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, capture_output=True, text=True,
                   timeout=300, check=True)
    return tag


def test_a_controller_image_that_cannot_start_is_named_with_its_last_words(broken_image: str, tmp_path: Path) -> None:
    before = hoststate.snapshot()
    proc = e2ecluster_command("--name", NAME, "up", "--image", broken_image, "--chart-timeout", "180")
    assert proc.returncode == 1
    line = error_line(proc.stderr)
    assert line.startswith("[e2e-cluster] error: the controller cannot start: pod mcad-controller-"), proc.stderr
    assert "exit code 3" in line and "broken on purpose" in line, line
    assert_nothing_left(before)
