"""The validating reviewer with the kube-backed Facts against a real API server (the controller's connection: the
admin's here), for users whose rights RBAC really decides.

The tenant is test.escalations': a ServiceAccount ``alice`` whose only rights are create/get/list/watch/delete on
appwrappers in her namespace. ``bob`` may also create what the escalation scenarios wrap; ``deployer`` is the
namespace admin alice's Pod would run as. Each escalation is refused for alice naming the item and the right; bob
is admitted except for the denylisted kinds, refused for everyone.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcad.admission.callers import SourceBuckets
from mcad.admission.facts import WouldAsk, at_hand_only
from mcad.admission.kubefacts import KubeFacts
from mcad.admission.request import AdmissionRequest, Outcome, UserInfo
from mcad.admission.review import AdmissionConfig, build
from mcad.k8s import kube
from test import escalations
from test.escalations import APPWRAPPER_RIGHTS, BOB_KINDS, DENYLISTED, deployment, privileged_pod
from test.support import wait_until


def create(conn: kube.Connection, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return kube.request_json(conn, "POST", path, body=body)


def service_account(conn: kube.Connection, namespace: str, name: str,
                    rules: list[dict[str, Any]] | None = None, cluster_role: str = "") -> UserInfo:
    """A ServiceAccount bound to a Role of ``rules`` (or to ``cluster_role``), and the UserInfo the API server
    gives a request made with its token."""
    account = create(conn, f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role}
    if rules is not None:
        create(conn, f"{rbac}/roles", {"metadata": {"name": name}, "rules": rules})
        role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    create(conn, f"{rbac}/rolebindings", {"metadata": {"name": name}, "roleRef": role_ref, "subjects": [
        {"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    return UserInfo(f"system:serviceaccount:{namespace}:{name}", uid=account["metadata"]["uid"],
                    groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))




class Tenants:
    def __init__(self, conn: kube.Connection, namespace: str) -> None:
        self.namespace = namespace
        self.alice = service_account(conn, namespace, "alice", APPWRAPPER_RIGHTS)
        self.bob = service_account(conn, namespace, "bob", APPWRAPPER_RIGHTS + [
            {"apiGroups": [group], "resources": [resource], "verbs": ["create"]} for group, resource in BOB_KINDS])
        self.deployer = service_account(conn, namespace, "deployer", cluster_role="admin")


@pytest.fixture
def admin(kubeconfig: str) -> kube.Connection:
    return kube.connect(kubeconfig)


@pytest.fixture
def tenants(admin: kube.Connection, namespace: str) -> Tenants:
    made = Tenants(admin, namespace)
    # RBAC answers from an informer cache: wait until bob's Role counts.
    facts = KubeFacts(admin, sar_ttl=0.001)
    deployments = facts.resource_for("apps/v1", "Deployment")
    assert deployments is not None
    wait_until(lambda: facts.may(made.bob, "create", deployments, namespace).allowed, 30, "bob's Role to count")
    return made


def appwrapper(namespace: str, *templates: dict[str, Any], name: str = "escalate") -> dict[str, Any]:
    return escalations.appwrapper(namespace, name, *templates)


ESCALATIONS = [pytest.param(template, f"GenericItems[0] ({item})", plural, id=id_)
               for template, item, plural, id_ in escalations.ESCALATIONS]












def review(facts: KubeFacts, user: UserInfo, obj: dict[str, Any], config: AdmissionConfig | None = None) -> Outcome:
    _, validate = build(facts, config or AdmissionConfig())
    return validate(AdmissionRequest(uid=uuid.uuid4().hex, operation="CREATE", group="workload.codeflare.dev",
                                     namespace=obj["metadata"]["namespace"], name=obj["metadata"]["name"],
                                     user=user, obj=obj, old=None))




@pytest.mark.parametrize(("template", "item", "plural"), ESCALATIONS)
def test_the_tenants_escalations_are_refused_naming_the_item_and_the_right(
        admin: kube.Connection, tenants: Tenants, template: Any, item: str, plural: str,
        request: pytest.FixtureRequest) -> None:
    outcome = review(KubeFacts(admin), tenants.alice, appwrapper(tenants.namespace, template()))
    assert not outcome.allowed
    denylisted = DENYLISTED.get(request.node.callspec.id)
    if denylisted:
        # Refused before any right is asked: the kind is refused for everyone.
        assert outcome.message.startswith(f"{item}: {denylisted}"), outcome.message
    else:
        assert outcome.message.startswith(
            f'{item}: user "system:serviceaccount:{tenants.namespace}:alice" may not create {plural} in namespace '
            f'{tenants.namespace}'), outcome.message


@pytest.mark.parametrize(("template", "item", "plural"), ESCALATIONS)
def test_a_user_holding_the_rights_is_admitted_except_for_denylisted_kinds(
        admin: kube.Connection, tenants: Tenants, template: Any, item: str, plural: str,
        request: pytest.FixtureRequest) -> None:
    outcome = review(KubeFacts(admin), tenants.bob, appwrapper(tenants.namespace, template()))
    denylisted = DENYLISTED.get(request.node.callspec.id)
    if denylisted:
        assert not outcome.allowed and outcome.message.startswith(f"{item}: {denylisted}"), outcome.message
    else:
        assert outcome.allowed, outcome.message
    # A cluster admin is no exception to the denylist either.
    admin_user = UserInfo("kubernetes-admin", groups=("system:masters", "system:authenticated"))
    assert review(KubeFacts(admin), admin_user, appwrapper(tenants.namespace, template())).allowed == (not denylisted)


def test_every_item_is_judged_and_reported_in_one_message(admin: kube.Connection, tenants: Tenants) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}}
    crd = {"apiVersion": "example.invalid/v1", "kind": "Gadget", "metadata": {"name": "g"}}
    cluster = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mine"}}
    outcome = review(KubeFacts(admin), tenants.bob, appwrapper(tenants.namespace, cm, deployment(), crd, cluster))
    assert outcome.message == (
        "GenericItems[2] (Gadget g): the API server does not serve example.invalid/v1 Gadget (is its CRD installed?); "
        "GenericItems[3] (Namespace mine): Namespace is cluster-scoped; an AppWrapper can only wrap namespaced objects")


def test_reviews_are_cached_per_user_and_resource_and_expire(admin: kube.Connection, tenants: Tenants) -> None:
    now = [0.0]
    facts = KubeFacts(admin, clock=lambda: now[0])
    obj = appwrapper(tenants.namespace, deployment(), privileged_pod())
    assert review(facts, tenants.bob, obj).allowed
    first = facts.requests
    # Discovery of v1 and apps/v1, one review per resource, and whatever the tenancy rules read (the namespace).
    assert first >= 4
    assert review(facts, tenants.bob, obj).allowed
    assert facts.requests == first  # all from the caches
    # A right revoked counts once the review's short life is over.
    kube.request_json(admin, "DELETE", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{tenants.namespace}/"
                                       f"rolebindings/bob")

    def refused_after_expiry() -> str:
        now[0] += 11  # past the review's life: each try asks the API server again (RBAC's own cache lags)
        outcome = review(facts, tenants.bob, obj)
        # The authorizer's cache may see the binding gone for one resource's review and not yet for the next one's,
        # so wait until both items are refused.
        return "" if outcome.allowed or "GenericItems[0]" not in outcome.message else outcome.message

    message = wait_until(refused_after_expiry, 30, "the revoked right to count")
    assert f'GenericItems[0] (Deployment web): user "system:serviceaccount:{tenants.namespace}:bob" may not create ' \
           f'deployments.apps' in message


def test_at_hand_only_nothing_is_asked_and_what_the_caches_hold_gives_the_same_answers(
        admin: kube.Connection, tenants: Tenants) -> None:
    """What the webhook judges on its event loop: a review that would ask raises WouldAsk before any request (or
    access review token); once the caches hold the answers, the review at hand is the one a worker gives."""
    # Two access reviews in all, never refilled: what bob's review asks (deployments, pods). Had the attempts at
    # hand taken any, his review would be refused as too many.
    buckets = SourceBuckets(per_source=1.0, burst=2, total=1.0, total_burst=2, clock=lambda: 0.0)
    facts = KubeFacts(admin, access_reviews=buckets)
    obj = appwrapper(tenants.namespace, deployment(), privileged_pod())
    for user in (tenants.bob, tenants.alice):
        with at_hand_only(), pytest.raises(WouldAsk):
            review(facts, user, obj)
    assert facts.requests == 0
    outcome = review(facts, tenants.bob, obj)
    assert outcome.allowed, outcome.message
    asked = facts.requests
    with at_hand_only():
        assert review(facts, tenants.bob, obj).allowed
        with pytest.raises(WouldAsk):  # alice's rights are not in the caches
            review(facts, tenants.alice, obj)
    assert facts.requests == asked


def test_a_kind_installed_after_a_miss_is_found_once_the_retry_interval_has_passed(
        admin: kube.Connection, namespace: str) -> None:
    group = f"t{uuid.uuid4().hex[:8]}.admission.mcad.dev"
    now = [0.0]
    facts = KubeFacts(admin, clock=lambda: now[0])
    assert facts.resource_for(f"{group}/v1", "Widget") is None
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"widgets.{group}"},
           "spec": {"group": group, "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    create(admin, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    try:
        wait_until(lambda: KubeFacts(admin).resource_for(f"{group}/v1", "Widget"), 60, "the CRD to be served")
        asked = facts.requests
        assert facts.resource_for(f"{group}/v1", "Widget") is None  # within the retry interval: no new request
        assert facts.requests == asked
        now[0] += 6
        found = facts.resource_for(f"{group}/v1", "Widget")
        assert found is not None and (found.resource, found.namespaced) == ("widgets", True)
    finally:
        kube.request_json(admin, "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{group}")


def test_objects_the_tenancy_rules_read(admin: kube.Connection, namespace: str) -> None:
    facts = KubeFacts(admin)
    assert (facts.namespace(namespace) or {})["metadata"]["name"] == namespace
    assert facts.namespace("no-such-namespace-here") is None
    assert facts.namespace("../etc") is None
    assert facts.priority_class("system-cluster-critical") == 2000000000
    assert facts.priority_class("no-such-class") is None


def kubeconfig_for(server: str, tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    return str(path)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


def test_an_api_server_that_does_not_answer_refuses_within_the_bound(silent_server: str, tmp_path: Path) -> None:
    facts = KubeFacts(kube.connect(kubeconfig_for(silent_server, tmp_path)), timeout=0.5)
    user = UserInfo("system:serviceaccount:team-a:alice")
    outcome = review(facts, user, appwrapper("team-a", deployment()))
    assert not outcome.allowed
    assert outcome.message == "could not check which kinds apps/v1 serves: the API server did not answer " \
                              "(GET /apis/apps/v1: no answer within 0.5 s)"
    assert facts.requests == 1


def test_an_api_server_that_refuses_the_connection_refuses_the_request(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    facts = KubeFacts(kube.connect(kubeconfig_for(f"https://127.0.0.1:{port}", tmp_path)))
    outcome = review(facts, UserInfo("u"), appwrapper("team-a", deployment()))
    assert not outcome.allowed and outcome.message.startswith(
        "could not check which kinds apps/v1 serves: the API server did not answer"), outcome.message
