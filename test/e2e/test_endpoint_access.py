"""Who may read the controller's /metrics and /debug, against a real API server: tokens are TokenReviewed and
rights SubjectAccessReviewed by the controller running as the chart's ServiceAccount (so the chart's RBAC lets it
make those reviews), and the readers hold the chart's ClusterRoles or a tenant's namespace rights."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import kubernetes.client as k8s
import pytest

from mcad import kube
from test.e2e.conftest import GROUP, PLURAL, VERSION, Controller, appwrapper, deployment_item, service_account_token
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


@pytest.fixture
def team_b(core: k8s.CoreV1Api) -> Iterator[str]:
    name = f"mcad-test-b-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mcad.test/owned": "true"}}})
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


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
        controller: Controller, kubeconfig: str, namespace: str, team_b: str, tenant_role: str,
        custom: k8s.CustomObjectsApi) -> None:
    team_a = namespace
    queue_forever(custom, team_a, "mine")
    queue_forever(custom, team_b, "theirs")
    alice = service_account_token(kubeconfig, team_a, "alice", roles=((tenant_role, team_a),))

    def queued(token: str | None = "") -> set[tuple[str, str]]:
        code, body = controller.get("/debug/queue", token=token)
        assert code == 200, body
        return {(aw["namespace"], aw["name"]) for aw in json.loads(body)["queued"]}

    # The reader (every namespace) sees both once queued; alice only hers.
    wait_until(lambda: {(team_a, "mine"), (team_b, "theirs")} <= queued(), 30, "both AppWrappers queued")
    seen = queued(alice)
    assert (team_a, "mine") in seen and not {ns for ns, _ in seen} - {team_a}, seen

    code, body = controller.get(f"/debug/explain?namespace={team_a}&name=mine", token=alice)
    assert code == 200 and json.loads(body)["summary"].startswith("It is queued"), body
    hidden = controller.get(f"/debug/explain?namespace={team_b}&name=theirs", token=alice)
    absent = controller.get(f"/debug/explain?namespace={team_b}&name=no-such-thing", token=alice)
    assert hidden[0] == absent[0] == 404
    assert json.loads(hidden[1]) == {"error": f"AppWrapper {team_b}/theirs not found"}
    assert controller.get(f"/debug/explain?namespace={team_b}&name=theirs")[0] == 200  # the reader may
    assert controller.get("/debug/ledger", token=alice)[0] == 403
    assert controller.get("/metrics", token=alice)[0] == 403
