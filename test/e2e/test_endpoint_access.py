"""Who may read the controller's /metrics and /debug, against a real API server: tokens are TokenReviewed and
rights SubjectAccessReviewed by the controller running as the chart's ServiceAccount (so the chart's RBAC lets it
make those reviews), and the readers hold the chart's ClusterRoles or a tenant's namespace rights."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test import support
from test.e2e.conftest import (
    GROUP,
    NODE_LABEL,
    PLURAL,
    VERSION,
    Controller,
    appwrapper,
    deployment_item,
    fake_node,
    service_account_token,
)
from test.support import wait_until

# A tenant's rights: its AppWrappers, in its namespace only (bound with a RoleBinding there).
TENANT_ROLE = "mcad-e2e-appwrapper-user"


@pytest.fixture(scope="module")
def tenant_role(kubeconfig: str) -> str:
    kube.Client(kube.connect(kubeconfig)).apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": TENANT_ROLE},
        "rules": [{"apiGroups": [GROUP], "resources": [PLURAL],
                   "verbs": ["create", "get", "list", "watch", "delete"]}]}, field_manager="mcad-e2e", force=True)
    return TENANT_ROLE


def queue_forever(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> None:
    """An AppWrapper of a thousand cpus: no test cluster has them, so it stays queued."""
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                           appwrapper(name, deployment_item(name, 2, "500")))


def test_anonymous_requests_get_401_and_health_stays_open(controller: Controller) -> None:
    for path in ("/metrics", "/debug/queue", "/debug/ledger", "/debug/explain?namespace=default&name=x"):
        code, body = controller.get(path, token=None)
        assert code == 401 and "no bearer token" in body, (path, code, body)
        code, body = controller.get(path, token="not-a-token")
        assert code == 401 and "not accepted" in body, (path, code, body)
    assert controller.get("/healthz", token=None) == (200, "ok\n")
    assert controller.get("/readyz", token=None) == (200, "ok\n")


def test_a_token_without_rights_gets_403(controller: Controller, kubeconfig: str, namespace: str) -> None:
    nobody = service_account_token(kubeconfig, namespace, "nobody")
    code, body = controller.get("/metrics", token=nobody)
    assert (code, body.strip()) == (403, f"system:serviceaccount:{namespace}:nobody may not get /metrics (a "
                                         "ClusterRole with nonResourceURLs and verb get grants it)")
    for path in ("/debug/ledger", "/debug/quota", "/debug/clusters"):
        code, body = controller.get(path, token=nobody)
        assert code == 403 and f"may not get {path}" in json.loads(body)["error"], (path, body)
    code, body = controller.get("/debug/queue", token=nobody)
    assert code == 403 and "may not list appwrappers.workload.codeflare.dev" in json.loads(body)["error"]
    # The session's reader holds the chart's ClusterRoles.
    assert controller.get("/metrics")[0] == 200
    assert controller.get("/debug/ledger")[0] == 200


def test_a_tenant_sees_only_its_namespace_and_explain_elsewhere_is_404(
        controller: Controller, kubeconfig: str, namespace: str, other_namespace: str, tenant_role: str,
        custom: k8s.CustomObjectsApi) -> None:
    team_a = namespace
    queue_forever(custom, team_a, "mine")
    queue_forever(custom, other_namespace, "theirs")
    alice = service_account_token(kubeconfig, team_a, "alice", roles=((tenant_role, team_a),))

    def queued(token: str | None = "") -> set[tuple[str, str]]:
        code, body = controller.get("/debug/queue", token=token)
        assert code == 200, body
        return {(aw["namespace"], aw["name"]) for aw in json.loads(body)["queued"]}

    # The reader (every namespace) sees both once queued; alice only hers.
    wait_until(lambda: {(team_a, "mine"), (other_namespace, "theirs")} <= queued(), 30, "both AppWrappers queued")
    seen = queued(alice)
    assert (team_a, "mine") in seen and not {ns for ns, _ in seen} - {team_a}, seen

    code, body = controller.get(f"/debug/explain?namespace={team_a}&name=mine", token=alice)
    assert code == 200 and json.loads(body)["summary"].startswith("It is queued"), body
    hidden = controller.get(f"/debug/explain?namespace={other_namespace}&name=theirs", token=alice)
    absent = controller.get(f"/debug/explain?namespace={other_namespace}&name=no-such-thing", token=alice)
    assert hidden[0] == absent[0] == 404
    assert json.loads(hidden[1]) == {"error": f"AppWrapper {other_namespace}/theirs not found"}
    assert controller.get(f"/debug/explain?namespace={other_namespace}&name=theirs")[0] == 200  # the reader may
    assert controller.get("/debug/ledger", token=alice)[0] == 403
    assert controller.get("/metrics", token=alice)[0] == 403


def test_a_tenant_is_told_what_is_ahead_of_it_only_as_counts(
        controller: Controller, kubeconfig: str, namespace: str, other_namespace: str, tenant_role: str,
        custom: k8s.CustomObjectsApi) -> None:
    """Another namespace's AppWrapper of higher priority is ahead of alice's: /debug/queue and the dashboard's
    queue view tell her its count, never its namespace or name; the cluster-wide reader sees both as before, and
    named when it asks for her namespace. Fair sharing is off in this controller, and both say so."""
    team_a, hidden = namespace, f"hidden-{other_namespace[-8:]}"
    custom.create_namespaced_custom_object(GROUP, VERSION, other_namespace, PLURAL,
                                           appwrapper(hidden, deployment_item(hidden, 2, "500"), priority=5))
    queue_forever(custom, team_a, "mine")
    alice = service_account_token(kubeconfig, team_a, "alice", roles=((tenant_role, team_a),))

    def queue(path: str = "/debug/queue", token: str | None = "") -> dict[str, Any]:
        code, body = controller.get(path, token=token)
        assert code == 200, body
        return json.loads(body)  # type: ignore[no-any-return]

    def both_queued() -> bool:
        names = {(aw["namespace"], aw["name"]) for aw in queue()["queued"]}
        return {(team_a, "mine"), (other_namespace, hidden)} <= names
    wait_until(both_queued, 30, "both AppWrappers queued")
    for path in ("/debug/queue", "/debug/queue?limit=5", f"/debug/queue?namespace={team_a}"):
        told = queue(path, alice)
        mine = next(aw for aw in told["queued"] if aw["name"] == "mine")
        first = next(a for a in told["aheadOfYou"] if a["namespace"] == team_a)
        assert (first["name"], first["position"], first["ahead"]) == ("mine", mine["position"], mine["position"] - 1)
        assert first["named"] == {} and first["others"]["appwrappers"] == mine["position"] - 1 >= 1, first
        assert told["fairShare"] == {"enabled": False}
        text = json.dumps(told)
        assert other_namespace not in text and hidden not in text, path
    view = queue("/ui/api/queue", alice)
    assert [a["name"] for a in view["aheadOfYou"] if a["namespace"] == team_a] == ["mine"]
    assert view["fairShare"] == {"enabled": False}
    assert other_namespace not in json.dumps(view) and hidden not in json.dumps(view)
    everything = queue()
    assert "aheadOfYou" not in everything and everything["fairShare"] == {"enabled": False}
    assert {other_namespace, team_a} <= {aw["namespace"] for aw in everything["queued"]}
    named = next(a for a in queue(f"/debug/queue?namespace={team_a}")["aheadOfYou"] if a["namespace"] == team_a)
    assert named["named"].get(other_namespace) == 1, named


DISCLOSE = "mcad.test/disclose"  # an extended resource only this test's fake node has


def disclose_job(name: str, slots: int, selector: dict[str, str]) -> dict[str, Any]:
    """A Job of one pod taking ``slots`` of the test node's slots for an hour, pinned to that node."""
    requests = {"cpu": "10m", "memory": "16Mi", DISCLOSE: str(slots)}
    return {"replicas": 1, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "3600s"}},
            "spec": {"restartPolicy": "Never", "nodeSelector": selector, "containers": [{
                "name": "main", "image": "busybox", "resources": {"requests": requests, "limits": requests}}]}}}}}


def test_a_tenant_waiting_behind_another_namespaces_reservation_is_not_told_whose_or_where(
        controller: Controller, kubeconfig: str, namespace: str, other_namespace: str, tenant_role: str,
        custom: k8s.CustomObjectsApi, core: k8s.CoreV1Api, tmp_path: Path) -> None:
    """"waiting behind the reservation of secret-project/acquisition-x on nodes ..." would tell a tenant
    another namespace's AppWrapper and the nodes it holds, which the reservations list hides. Alice holds only
    AppWrapper rights in team A: her AppWrapper's status and her explain say it waits behind a reservation of
    another namespace, without naming it or its node; the reader with cluster-wide rights still sees the holder."""
    team_a = namespace
    with fake_node(core, cpu="8", memory="16Gi", **{DISCLOSE: "4"}) as selector:
        node_name = f"mcad-test-node-{selector[NODE_LABEL]}"
        create = partial(custom.create_namespaced_custom_object, GROUP, VERSION, plural=PLURAL)
        create(team_a, body=appwrapper("filler", disclose_job("filler", 3, selector)))
        wait_until(lambda: any(p.status.phase == "Running" for p in core.list_namespaced_pod(
            team_a, label_selector="workload.codeflare.dev/appwrapper=filler").items), 60, "filler Running")
        # The secret project's gang needs the whole node: it reserves it, holding the one slot left free.
        create(other_namespace,
               body=appwrapper("acquisition-x", disclose_job("acquisition-x", 4, selector), priority=10))
        create(team_a, body=appwrapper("mine", disclose_job("mine", 1, selector)))

        alice = service_account_token(kubeconfig, team_a, "alice", roles=((tenant_role, team_a),))
        as_alice = kube.connect(support.token_kubeconfig(kubeconfig, alice, tmp_path / "alice", user="alice",
                                                         namespace=team_a))
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{team_a}/{PLURAL}/mine"
        said = "waiting behind the reservation of an AppWrapper in another namespace"
        status = wait_until(lambda: (s := kube.request_json(as_alice, "GET", path).get("status") or {})
                            and said in (s.get("message") or "") and s, 60, "mine waiting behind the reservation")
        secrets = (other_namespace, "acquisition-x", node_name)
        told = json.dumps(status)
        assert not [s for s in secrets if s in told], told
        assert kube.request_json(as_alice, "GET", path)["metadata"]["name"] == "mine"

        code, body = controller.get(f"/debug/explain?namespace={team_a}&name=mine", token=alice)
        assert code == 200, body
        assert said in json.loads(body)["summary"], body
        assert not [s for s in secrets if s in body], body
        code, body = controller.get("/debug/queue", token=alice)
        assert code == 200 and not [s for s in secrets if s in body], body

        # A tenant's rights stop at its namespace: the other side stays unreadable to alice ...
        with pytest.raises(kube.ApiError) as refused:
            kube.request_json(as_alice, "GET",
                              f"/apis/{GROUP}/{VERSION}/namespaces/{other_namespace}/{PLURAL}/acquisition-x")
        assert refused.value.status == 403
        # ... while the reader with cluster-wide rights sees whose reservation it is, and where.
        code, body = controller.get("/debug/queue")
        held = {r["appwrapper"]: r for r in json.loads(body)["reservations"]}
        assert held[f"{other_namespace}/acquisition-x"]["nodes"] == [node_name], body
        for name, where in (("mine", team_a), ("filler", team_a), ("acquisition-x", other_namespace)):
            custom.delete_namespaced_custom_object(GROUP, VERSION, where, PLURAL, name)
