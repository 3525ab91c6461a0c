"""Fair sharing on the local cluster, the controller started with ``--fair-sharing``: two namespaces of one priority
share a 2-cpu node. team-a queues four hour-long 1-cpu AppWrappers and two run; team-b then queues two. The
controller is stopped and started again (as a rollout or a change of leader would): the usage it saved in its
ConfigMap comes back, and when team-a's running ones end, team-b's two go next though team-a's were queued first.

A change of leader: two replicas with ``--leader-elect``; team-a's usage is built under the first leader only, team-b's
under the second only (a little, so that a new leader that had not loaded the saved usage would put team-a first);
the second leader must have loaded what the first saved (when it stopped on SIGTERM; before it was killed, in its
periodic save) for team-b to go before team-a's older ones.

Who writes what: the ConfigMap is in the controller's own namespace, where tenants have no rights (the test grants
the controller what the chart's Role grants there); the tenants only create AppWrappers in their namespaces.

Weights: the admin's label ``mcad.codeflare.dev/fair-share-weight`` on a Namespace changes the order from the next
cycle; the tenant, holding rights on AppWrappers (and the Jobs they wrap) in its namespace only, can neither label
its Namespace nor weigh itself by putting that key on its AppWrapper.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from mcad.model.fairweight import WEIGHT_LABEL
from test.e2e.conftest import LOGS, AppWrappers, Controller, appwrapper, fake_node, job_item, pinned, running_controller
from test.e2e.test_admission import account, kubectl, token_kubeconfig
from test.e2e.test_leader_election import became_leader_at, leader_and_standby
from test.escalations import APPWRAPPER_RIGHTS
from test.support import wait_until

CONFIGMAP = "mcad-fair-share"
NAMESPACE = "mcad-system"  # the controller's own (no $POD_NAMESPACE, not in a pod): its webhook certificate's too


@pytest.fixture
def fair_share_rights(api: k8s.ApiClient, core: k8s.CoreV1Api) -> Iterator[str]:
    """What the chart grants with scheduling.fairSharing, given here to the session's controller (its own namespace,
    mcad-system): create of ConfigMaps and get/patch of the one it saves usage in. Removed afterwards, with it."""
    rbac = k8s.RbacAuthorizationV1Api(api)
    role = {"metadata": {"name": "mcad-test-fair-share"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIGMAP], "verbs": ["get", "patch"]}]}
    binding = {"metadata": {"name": "mcad-test-fair-share"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mcad-test-fair-share"},
               "subjects": [{"kind": "ServiceAccount", "name": "mcad", "namespace": NAMESPACE}]}
    rbac.create_namespaced_role(NAMESPACE, role)
    rbac.create_namespaced_role_binding(NAMESPACE, binding)
    try:
        yield NAMESPACE
    finally:
        rbac.delete_namespaced_role_binding("mcad-test-fair-share", NAMESPACE)
        rbac.delete_namespaced_role("mcad-test-fair-share", NAMESPACE)
        try:
            core.delete_namespaced_config_map(CONFIGMAP, NAMESPACE)
        except k8s.ApiException as err:
            if err.status != 404:
                raise


def job(name: str, node: dict[str, str]) -> dict[str, Any]:
    return pinned(job_item(name, 1, "1", duration="1h"), node)


def test_the_tenant_that_used_less_goes_first_and_usage_outlives_a_restart(
        controller_kubeconfig: str, aws: AppWrappers, other_namespace: str, fair_share_rights: str,
        core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, kubeconfig: str) -> None:
    team_b = AppWrappers(custom, core, other_namespace, kube.connect(kubeconfig))
    log = LOGS / "test_fair_sharing.log"
    with fake_node(core, cpu="2", memory="8Gi") as node:
        with running_controller(controller_kubeconfig, log, "--fair-sharing") as first:
            for i in range(4):
                aws.create(appwrapper(f"a{i}", job(f"a{i}", node)))
            aws.wait_state("a0", "Running")
            aws.wait_state("a1", "Running")
            for i in range(2):
                team_b.create(appwrapper(f"b{i}", job(f"b{i}", node)))
            wait_until(lambda: aws.status("a2").get("state") == "Pending"
                       and team_b.status("b0").get("state") == "Pending", 30, "a2 and b0 pending")
            # Within one pass, b0's dispatch adds a second of its share to team-b's score (a tenth of a share-second
            # on a 10-cpu cluster): team-a must have used more than that, or its a2 rightly goes before b1.
            wait_until(lambda: usage(first).get(f"namespace:{aws.namespace}", 0) >= 1, 60,
                       "team-a to use a share-second")
        # Stopped: the usage was saved on the way out.
        saved = json.loads(core.read_namespaced_config_map(CONFIGMAP, fair_share_rights).data["usage.json"])
        assert saved["tenants"].get(f"namespace:{aws.namespace}", 0) >= 1, saved
        assert f"namespace:{other_namespace}" not in saved["tenants"], "team-b ran nothing"
        with running_controller(controller_kubeconfig, log, "--fair-sharing") as ctl:
            wait_until(lambda: b"fair-share usage restored" in ctl.log.read_bytes(), 30, "the usage read back")
            aws.delete("a0")
            aws.delete("a1")
            team_b.wait_state("b0", "Running")
            team_b.wait_state("b1", "Running")
            assert [aws.status(f"a{i}").get("state") for i in (2, 3)] == ["Pending", "Pending"]


def usage(ctl: Controller) -> dict[str, float]:
    """Each tenant's fair-share usage (share-seconds) as ``ctl`` reports it in /debug/queue."""
    return {row["tenant"]: row["usage"] for row in debug_queue(ctl)["fairShare"]["named"]}


def saved_usage(core: k8s.CoreV1Api, namespace: str) -> dict[str, Any] | None:
    """What the ConfigMap holds (``savedAt``, ``tenants``), or None while there is none."""
    try:
        found = core.read_namespaced_config_map(CONFIGMAP, namespace)
    except k8s.ApiException as err:
        if err.status == 404:
            return None
        raise
    return json.loads(found.data["usage.json"])  # type: ignore[no-any-return]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_new_leader_loads_the_usage_the_old_one_saved(
        controller_kubeconfig: str, aws: AppWrappers, other_namespace: str, fair_share_rights: str,
        core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, kubeconfig: str, stop: signal.Signals) -> None:
    """A 2-cpu node. Under leader a: team-a's a0 (2 cpu) runs until team-a has 2.5 share-seconds of usage, then ends.
    a is stopped: by SIGTERM (it saves the usage on the way out and hands the Lease over), or by SIGKILL once its
    periodic save (a minute after it started) has written that usage (nothing saved on the way out; the Lease
    lapses). Under the new leader b: team-b's b0 (100m) runs, so team-b has used a little (a twentieth of a0's
    rate, for seconds) and team-a nothing; team-a's a1 and a2, then team-b's b1, queue (2 cpu each: none fits
    beside b0). When b0 ends, b1 goes first: team-a's saved usage counts in b. Had b not loaded it, team-a (no usage
    in b) would come first and a1 would run."""
    team_b = AppWrappers(custom, core, other_namespace, kube.connect(kubeconfig))
    tenant_a, tenant_b = f"namespace:{aws.namespace}", f"namespace:{other_namespace}"
    admin = kube.connect(kubeconfig)
    with fake_node(core, cpu="2", memory="8Gi") as node, \
            leader_and_standby(controller_kubeconfig, admin, "test_fair_sharing-leader", args=("--fair-sharing",)
                               ) as (a, b):
        aws.create(appwrapper("a0", pinned(job_item("a0", 1, "2", duration="1h"), node)))
        aws.wait_state("a0", "Running")
        # Past 2 by a margin: usage decays once a0 ends (1 h half-life), by up to 2 % before a periodic save.
        wait_until(lambda: usage(a).get(tenant_a, 0) >= 2.5, 60, "team-a to use 2.5 share-seconds under leader a")
        aws.delete("a0")
        wait_until(lambda: aws.absent("a0"), 30, "a0 gone")
        if stop == signal.SIGKILL:
            # A periodic save while a0 still ran may hold less: wait for one that holds what a0 used.
            wait_until(lambda: (found := saved_usage(core, fair_share_rights)) and found["tenants"].get(tenant_a, 0)
                       >= 2, 90, "leader a's periodic save of team-a's usage")
            assert a.proc is not None and a.proc.poll() is None, "saved by the periodic save, not on the way out"
        a.stop(stop)
        assert a.proc is not None and a.proc.returncode == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
        saved = saved_usage(core, fair_share_rights)
        assert saved is not None and saved["tenants"].get(tenant_a, 0) >= 2, saved
        assert tenant_b not in saved["tenants"], "team-b ran nothing under leader a"

        became_leader_at(b, 30)
        wait_until(lambda: b"fair-share usage restored" in b.log.read_bytes(), 30, "b to read the usage back")
        team_b.create(appwrapper("b0", pinned(job_item("b0", 1, "100m", duration="1h"), node)))
        team_b.wait_state("b0", "Running")
        for name, owner in (("a1", aws), ("a2", aws), ("b1", team_b)):
            owner.create(appwrapper(name, pinned(job_item(name, 1, "2", duration="1h"), node)))
        wait_until(lambda: queued(b) == ["a1", "a2", "b1"], 30, "a1, a2 and b1 queued in b")
        held = usage(b)
        print(f"usage in the new leader before b0 ends: {held} (saved by the old one: {saved['tenants']})")
        # What makes the order hang on the load: team-b has some usage in b, team-a none but what was loaded.
        assert 0 < held.get(tenant_b, 0) < held.get(tenant_a, 0), held
        assert held[tenant_a] >= 0.95 * saved["tenants"][tenant_a], (held, saved)
        team_b.delete("b0")
        team_b.wait_state("b1", "Running")
        assert [aws.status(name).get("state") for name in ("a1", "a2")] == ["Pending", "Pending"]


def tenant(kubeconfig: str, namespace: str, tmp: Path) -> str:
    """A kubeconfig of alice, who may use AppWrappers in ``namespace`` and create the Jobs they wrap, nothing more."""
    admin = kube.connect(kubeconfig)
    account(admin, namespace, "alice", [*APPWRAPPER_RIGHTS, {"apiGroups": ["batch"], "resources": ["jobs"],
                                                             "verbs": ["create"]}])
    path = token_kubeconfig(kubeconfig, admin, namespace, "alice", tmp / "alice")
    wait_until(lambda: kubectl(path, "auth", None, "can-i", "create", "jobs.batch").stdout.strip() == "yes", 30,
               "alice's Role to count")
    return path


def debug_queue(ctl: Controller) -> dict[str, Any]:
    code, body = ctl.get("/debug/queue")
    assert code == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def queued(ctl: Controller) -> list[str]:
    return sorted(row["name"] for row in debug_queue(ctl)["queued"])


def reserved_for(ctl: Controller) -> list[str]:
    """Who holds the one reservation (--reservations=1) in the dry run behind /debug/queue: the first AppWrapper the
    pass took that waits for room, so the tenant fair sharing puts first."""
    return [r["appwrapper"].partition("/")[2] for r in debug_queue(ctl)["reservations"]]


def test_the_admins_namespace_label_weighs_a_tenant_and_the_tenant_cannot_weigh_itself(
        controller_kubeconfig: str, aws: AppWrappers, other_namespace: str, fair_share_rights: str,
        core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, kubeconfig: str, tmp_path: Path) -> None:
    """A 3-cpu node: team-a runs a 2-cpu AppWrapper, team-b a 1-cpu one, so team-a's usage grows twice as fast.
    b1 and b2 queue, then alice's a1, which carries the weight key as label and annotation (100). When b0 ends, b1
    goes: team-a used more, and its AppWrapper's key counts for nothing. Then the admin labels team-a's Namespace
    with weight 4 (its usage over 4 is below team-b's): when b1 ends, a1 goes, though b2 is older."""
    team_b = AppWrappers(custom, core, other_namespace, kube.connect(kubeconfig))
    alice = tenant(kubeconfig, aws.namespace, tmp_path)
    refused = kubectl(alice, "label", None, "namespace", aws.namespace, f"{WEIGHT_LABEL}=100")
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), (refused.stdout, refused.stderr)
    assert WEIGHT_LABEL not in (core.read_namespace(aws.namespace).metadata.labels or {})
    log = LOGS / "test_fair_sharing_weights.log"
    with fake_node(core, cpu="3", memory="8Gi") as node, \
            running_controller(controller_kubeconfig, log, "--fair-sharing", "--reservations=1") as ctl:
        aws.create(appwrapper("a0", pinned(job_item("a0", 1, "2", duration="1h"), node)))
        team_b.create(appwrapper("b0", job("b0", node)))
        aws.wait_state("a0", "Running")
        team_b.wait_state("b0", "Running")
        for name in ("b1", "b2"):
            team_b.create(appwrapper(name, job(name, node)))
        own = appwrapper("a1", job("a1", node))
        own["metadata"].update(namespace=aws.namespace, labels={WEIGHT_LABEL: "100"},
                               annotations={WEIGHT_LABEL: "100"})
        created = kubectl(alice, "create", own)
        assert created.returncode == 0, created.stderr
        wait_until(lambda: queued(ctl) == ["a1", "b1", "b2"], 30, "b1, b2 and alice's a1 queued")

        team_b.delete("b0")
        team_b.wait_state("b1", "Running")
        assert aws.status("a1").get("state") == "Pending", "the key on alice's own AppWrapper weighs nothing"
        assert wait_until(lambda: reserved_for(ctl) if queued(ctl) == ["a1", "b2"] else None, 30,
                          "a1 and b2 queued") == ["b2"], "team-b, having used less, is still first"

        core.patch_namespace(aws.namespace, {"metadata": {"labels": {WEIGHT_LABEL: "4"}}})
        wait_until(lambda: reserved_for(ctl) == ["a1"], 30, "the label to put team-a first (no restart)")
        team_b.delete("b1")
        aws.wait_state("a1", "Running")
        assert team_b.status("b2").get("state") == "Pending"
