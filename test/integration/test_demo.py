"""`make demo`, run as a user would: the walk-through ends 0 with the second AppWrapper running, and its controller
runs as an installation runs it (issue 26: it ran as cluster-admin with no kind allowlist): as the chart's
ServiceAccount, with the chart's RBAC and the Deployment's flags, so admission refuses a kind the chart does not
allow, even to cluster-admin. The demo shares the default local cluster: one that was up before is left up (only
the demo's controller is stopped); one the demo started is taken down with `make demo-down`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from test import chart
from test.support import REPO, wait_until

PIDFILE = REPO / ".dev" / "demo-controller.pid"
KUBECONFIG = REPO / ".dev" / "kubeconfig"
CONTROLLER_KUBECONFIG = REPO / ".dev" / "demo-controller.kubeconfig"
ALLOWED = "--admission-allowed-kinds=pods,services,configmaps,persistentvolumeclaims,secrets,deployments.apps," \
          "statefulsets.apps,replicasets.apps,jobs.batch"


def make(target: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", target], cwd=REPO, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=timeout, check=False)


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / ".dev" / "bin" / "kubectl"), "--kubeconfig", str(KUBECONFIG), *args],
                          input=stdin, text=True, capture_output=True, timeout=60, check=False)


def cluster_is_up() -> bool:
    return subprocess.run([sys.executable, str(REPO / "hack" / "localcluster.py"), "status"],
                          capture_output=True, check=False).returncode == 0


def stop_controller() -> None:
    if PIDFILE.exists():
        pid = int(PIDFILE.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        else:
            wait_until(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status")
                       .read_text().lower(), 30, "the demo's controller to stop")
        PIDFILE.unlink()
    CONTROLLER_KUBECONFIG.unlink(missing_ok=True)


def release_revision() -> int | None:
    """The revision of the chart's release in the shared cluster (None: not installed)."""
    try:
        history = json.loads(chart.helm("history", chart.RELEASE, "--namespace", chart.NAMESPACE, "--max", "1",
                                        "--output", "json", kubeconfig=str(KUBECONFIG)))
    except RuntimeError:  # "release: not found"
        return None
    return int(history[-1]["revision"]) if history else None


def restore_release(revision: int | None) -> None:
    """Put the chart's release back as it was before the demo re-registered its webhooks for its own controller: left
    registered for a controller that is gone, they would refuse every AppWrapper create in the cluster (failurePolicy
    Fail), the later tests' too."""
    if revision is None:
        chart.helm("uninstall", chart.RELEASE, "--namespace", chart.NAMESPACE, "--wait", kubeconfig=str(KUBECONFIG))
    else:
        chart.helm("rollback", chart.RELEASE, str(revision), "--namespace", chart.NAMESPACE, "--wait",
                   kubeconfig=str(KUBECONFIG))


def test_demo_walks_through_with_the_charts_identity_and_allowlist() -> None:
    was_up = cluster_is_up()
    revision = release_revision() if was_up else None
    try:
        demo = make("demo", timeout=900)
        out = demo.stdout
        assert demo.returncode == 0, out[-4000:]
        assert "mcad-controller runs as system:serviceaccount:mcad-system:mcad (the chart's RBAC)" in out, out[-4000:]
        assert ALLOWED in out, out[-4000:]
        assert re.search(r"^0002-aw-generic-deployment-2\s+Running\b", out, re.MULTILINE), out[-4000:]

        # The credential it runs with holds that ServiceAccount's token and nothing of the admin's.
        assert CONTROLLER_KUBECONFIG.stat().st_mode & 0o077 == 0
        users = yaml.safe_load(CONTROLLER_KUBECONFIG.read_text())["users"]
        assert [set(u["user"]) for u in users] == [{"token"}], users
        # What the chart's RBAC does not grant, it cannot do; cluster-admin could.
        for question in (("create", "clusterrolebindings"), ("get", "secrets", "-n", "kube-system")):
            as_controller = subprocess.run(
                [str(REPO / ".dev" / "bin" / "kubectl"), "--kubeconfig", str(CONTROLLER_KUBECONFIG), "auth",
                 "can-i", *question], text=True, capture_output=True, timeout=60, check=False)
            assert as_controller.stdout.strip() == "no", (question, as_controller.stdout + as_controller.stderr)

        # The allowlist: a NetworkPolicy is no kind the chart wraps, so admission refuses it even to the admin.
        policy = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                  "metadata": {"name": "demo-not-allowed", "namespace": "default"},
                  "spec": {"resources": {"GenericItems": [{"replicas": 1, "generictemplate": {
                      "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny"},
                      "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}}]}}}
        refused = kubectl("create", "-f", "-", stdin=yaml.safe_dump(policy))
        assert refused.returncode != 0, refused.stdout
        words = "networkpolicies.networking.k8s.io is not among the kinds the cluster admin allows in AppWrappers"
        assert words in refused.stderr, refused.stderr
    finally:
        kubectl("delete", "appwrappers", "--all", "-n", "default", "--wait=false")
        if was_up:
            stop_controller()
            restore_release(revision)
        else:
            down = make("demo-down", timeout=300)
            assert down.returncode == 0, down.stdout[-2000:]
    assert not PIDFILE.exists() and not CONTROLLER_KUBECONFIG.exists()
