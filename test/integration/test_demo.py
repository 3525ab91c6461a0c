"""`make demo`, run as a user would: the walk-through ends 0 with the second AppWrapper running, and its controller runs
as an installation runs it (not as cluster-admin with no kind allowlist, which would hide what the chart lacks): as the
chart's ServiceAccount, with the chart's RBAC and the Deployment's flags, so admission refuses a kind the chart does not
allow, even to cluster-admin. The demo shares the default local cluster: one that was up before is left up (only the
demo's controller is stopped); one the demo started is taken down with `make demo-down`.

After it, `mcadctl queue`, `explain` and `dashboard` work as the README shows them, with the demo's kubeconfig and
token and no --url: the demo puts its controller (a process on this machine) behind the chart's Services through a
stand-in Pod at this machine's address (hack/demo-endpoint.sh), so mcadctl takes the route it takes to an
installation, through the API server; a tenant, who may not proxy to those Services, is refused by the API server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from test import chart
from test.support import REPO, token_kubeconfig, wait_until

PIDFILE = REPO / ".dev" / "demo-controller.pid"
KUBECONFIG = REPO / ".dev" / "kubeconfig"
CONTROLLER_KUBECONFIG = REPO / ".dev" / "demo-controller.kubeconfig"
MCADCTL = Path(sys.executable).parent / "mcadctl"
AW_2 = "0002-aw-generic-deployment-2"
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


def remove_controller_endpoint() -> None:
    """The demo's stand-in Pod for its controller (hack/demo-endpoint.sh), which a shared cluster must not keep: the
    chart's Services would point at a controller that is gone."""
    kubectl("-n", chart.NAMESPACE, "delete", "pod", "mcad-demo-controller", "--ignore-not-found", "--grace-period=0",
            "--force", "--wait=true")


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """`make demo` run once for this module's tests (its output), and afterwards the shared cluster as it was."""
    was_up = cluster_is_up()
    revision = release_revision() if was_up else None
    try:
        run = make("demo", timeout=900)
        assert run.returncode == 0, run.stdout[-4000:]
        yield run.stdout
    finally:
        kubectl("delete", "appwrappers", "--all", "-n", "default", "--wait=false")
        if was_up:
            stop_controller()
            remove_controller_endpoint()
            restore_release(revision)
        else:
            down = make("demo-down", timeout=300)
            assert down.returncode == 0, down.stdout[-2000:]
        assert not PIDFILE.exists() and not CONTROLLER_KUBECONFIG.exists()


def test_demo_walks_through_with_the_charts_identity_and_allowlist(demo: str) -> None:
    out = demo
    assert "mcad-controller runs as system:serviceaccount:mcad-system:mcad (the chart's RBAC)" in out, out[-4000:]
    assert ALLOWED in out, out[-4000:]
    assert re.search(rf"^{AW_2}\s+Running\b", out, re.MULTILINE), out[-4000:]

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


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user who followed the demo's closing lines (no $MCAD_TOKEN of the test run's own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MCAD_TOKEN", "KUBECONFIG")}
    return {**env, "KUBECONFIG": str(KUBECONFIG), **extra}


def mcadctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MCADCTL), *args], cwd=REPO, env=env, text=True, capture_output=True, timeout=120,
                          check=False)


def test_mcadctl_queue_explain_and_dashboard_reach_the_demos_controller(demo: str, tmp_path: Path) -> None:
    """As the demo's closing lines say: export KUBECONFIG and MCAD_TOKEN, then plain mcadctl commands."""
    assert "mcadctl finds it through the API server" in demo, demo[-4000:]
    token = subprocess.run(["hack/demo-token.sh", str(KUBECONFIG)], cwd=REPO, text=True, capture_output=True,
                           timeout=60, check=True).stdout.strip()
    env = user_env(MCAD_TOKEN=token)

    queue = mcadctl(env, "queue", "--dispatched")
    assert queue.returncode == 0, queue.stderr
    assert re.search(rf"^default\s+{AW_2}\s.*Running", queue.stdout, re.MULTILINE), queue.stdout
    explained = mcadctl(env, "explain", f"default/{AW_2}", "-o", "json")
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["found"] is True, explained.stdout
    assert f"default/{AW_2}" in mcadctl(env, "explain", f"default/{AW_2}").stdout

    dashboard = subprocess.Popen([str(MCADCTL), "dashboard"], cwd=REPO, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert dashboard.stdout is not None
        first = dashboard.stdout.readline()  # "Dashboard: URL", printed once it listens
        assert first.startswith("Dashboard: http://127.0.0.1:"), first + (dashboard.stderr.read()
                                                                         if dashboard.poll() is not None else "")
        url = first.split()[1]
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        with urllib.request.urlopen(url + "api/queue", timeout=30) as view:
            names = [row.get("name") for row in json.load(view).get("rows") or []]
        assert AW_2 in names, names
    finally:
        dashboard.send_signal(signal.SIGINT)
        out, err = dashboard.communicate(timeout=30)
    assert dashboard.returncode == 0, err
    assert "stopped" in out, out

    # A tenant (AppWrapper rights in default, nothing in mcad-system) cannot reach the controller through those
    # Services, nor put anything behind them.
    kubectl("create", "serviceaccount", "demo-tenant", "-n", "default")
    kubectl("create", "role", "demo-tenant", "-n", "default", "--verb=get,list,watch,create,delete",
            "--resource=appwrappers.workload.codeflare.dev")
    kubectl("create", "rolebinding", "demo-tenant", "-n", "default", "--role=demo-tenant",
            "--serviceaccount=default:demo-tenant")
    try:
        tenant_token = kubectl("create", "token", "demo-tenant", "-n", "default").stdout.strip()
        assert tenant_token
        tenant = token_kubeconfig(str(KUBECONFIG), tenant_token, tmp_path / "tenant.kubeconfig", user="tenant")
        refused = mcadctl(user_env(KUBECONFIG=tenant), "queue")
        assert refused.returncode == 1, refused.stdout
        assert "services/proxy" in refused.stderr, refused.stderr
        for verb, what in (("create", "pods"), ("create", "endpoints"), ("patch", "pods/status"),
                           ("create", "services")):
            can = subprocess.run([str(REPO / ".dev" / "bin" / "kubectl"), "--kubeconfig", tenant, "auth", "can-i",
                                  verb, what, "-n", chart.NAMESPACE], text=True, capture_output=True, timeout=60,
                                 check=False)
            assert can.stdout.strip() == "no", (verb, what, can.stdout + can.stderr)
    finally:
        for kind in ("rolebinding", "role", "serviceaccount"):
            kubectl("delete", kind, "demo-tenant", "-n", "default", "--ignore-not-found")
