"""The chart's creator policy (webhook.creator=policy) does in the API server what the mutating webhook does.

Against the real API server: the MutatingAdmissionPolicy the chart renders is applied for one namespace, and every
case is sent to the API server (dry run, as the user named) and to the controller's own mutating reviewer
(``mcad.admission.review.build``, the code behind /mutate) with the same object; the creator annotations and the
labels must come out the same. The users are the test's admin (a client certificate: no uid) and a ServiceAccount
holding only AppWrapper rights (a token: a uid). No mcad webhook is registered for the namespace, so what changes
is the policy's doing alone.
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from mcad.admission import review
from mcad.admission.facts import Facts
from mcad.admission.request import AdmissionRequest, UserInfo
from mcad.errors import ApiError
from mcad.k8s import kube
from test import chart
from test.support import token_kubeconfig, wait_until

SELECT_LABEL = "mcad.test/creator-policy"
MAP_API = "/apis/admissionregistration.k8s.io/v1beta1"
AW_API = "/apis/workload.codeflare.dev/v1beta1"
CREATOR, CREATOR_UID = review.CREATOR_ANNOTATION, review.CREATOR_UID_ANNOTATION
# The namespace binds two quota trees; the AppWrappers carry labels of their own for one of them.
BINDINGS = {"quota.codeflare.dev/context": "gold", "quota.codeflare.dev/team": "ml"}


@pytest.fixture
def namespace_labels() -> dict[str, str]:
    return {SELECT_LABEL: uuid.uuid4().hex[:12], **BINDINGS}


class NamespaceFacts:
    """The one fact the mutating reviewer asks: the Namespace, read live."""

    def __init__(self, conn: kube.Connection) -> None:
        self.conn = conn

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        return kube.request_json(self.conn, "GET", f"/api/v1/namespaces/{name}")


def who(conn: kube.Connection) -> UserInfo:
    answer = kube.request_json(conn, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                               body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return UserInfo.parse(answer["status"]["userInfo"])


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def patched(obj: Mapping[str, Any], operations: list[Mapping[str, Any]]) -> dict[str, Any]:
    """``obj`` with the add and remove operations the reviewer answers applied (RFC 6902, for those two)."""
    result = copy.deepcopy(dict(obj))
    for op in operations:
        *parents, last = [unescape(t) for t in op["path"].split("/")[1:]]
        target = result
        for token in parents:
            target = target[token]
        if op["op"] == "add":
            target[last] = copy.deepcopy(op["value"])
        else:
            assert op["op"] == "remove", op
            del target[last]
    return result


def appwrapper(name: str, annotations: dict[str, str] | None = None,
               labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper", "metadata": meta,
            "spec": {"resources": {"GenericItems": [{"replicas": 1, "generictemplate": {
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-cm"}, "data": {"a": "b"}}}]}}}


def what_matters(obj: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    meta = obj.get("metadata") or {}
    return dict(meta.get("annotations") or {}), dict(meta.get("labels") or {})


@pytest.fixture
def creator_policy(kubeconfig: str, crd: None, namespace: str, namespace_labels: dict[str, str],
                   tmp_path: Path) -> Iterator[str]:
    """The chart's policy and binding (under names of this test's own) for ``namespace`` only, in force."""
    admin = kube.connect(kubeconfig)
    try:
        served = kube.request_json(admin, "GET", MAP_API)
    except ApiError as err:
        served = {"resources": []} if err.status == 404 else {"error": str(err)}
    if not any(r.get("name") == "mutatingadmissionpolicies" for r in served.get("resources") or []):
        if os.environ.get("MCAD_TEST_KUBECONFIG") or os.environ.get("KUBECONFIG"):
            pytest.skip("the given cluster does not serve MutatingAdmissionPolicy (Kubernetes 1.36+, or 1.34-1.35 "
                        "with its feature gate and admissionregistration.k8s.io/v1beta1)")
        pytest.fail("the local cluster does not serve MutatingAdmissionPolicy: it predates hack/localcluster.py "
                    "enabling it; recreate it (make cluster-down, then the tests bring it up)")
    selector = {"matchLabels": {SELECT_LABEL: namespace_labels[SELECT_LABEL]}}
    objects = [o for o in chart.render(values={"webhook": {"creator": "policy", "namespaceSelector": selector}},
                                       tmp=tmp_path) if o["kind"].startswith("MutatingAdmissionPolicy")]
    name = f"mcad-creator-{namespace}"
    made = []
    try:
        for obj in sorted(objects, key=lambda o: o["kind"]):  # the policy, then its binding
            plural = "mutatingadmissionpolicies" if obj["kind"] == "MutatingAdmissionPolicy" \
                else "mutatingadmissionpolicybindings"
            obj["metadata"]["name"] = name
            if plural.endswith("bindings"):
                obj["spec"]["policyName"] = name
            kube.request_json(admin, "POST", f"{MAP_API}/{plural}", body=obj)
            made.append(f"{MAP_API}/{plural}/{name}")

        # The API server takes up a new policy a moment later: wait until a dry-run create carries the creator.
        def in_force() -> bool:
            answer = kube.request_json(admin, "POST", f"{AW_API}/namespaces/{namespace}/appwrappers",
                                       query={"dryRun": "All"}, body=appwrapper("probe"))
            return CREATOR in (answer["metadata"].get("annotations") or {})

        wait_until(in_force, 30, "the creator policy in force")
        yield namespace
    finally:
        for path in reversed(made):
            kube.request_json(admin, "DELETE", path)


def test_the_creator_policy_patches_as_the_mutating_webhook_does(kubeconfig: str, creator_policy: str,
                                                                  tmp_path: Path) -> None:
    namespace = creator_policy
    admin = kube.connect(kubeconfig)
    kube.request_json(admin, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                      body={"metadata": {"name": "alice"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kube.request_json(admin, "POST", f"{rbac}/roles", body={"metadata": {"name": "alice"}, "rules": [
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
         "verbs": ["create", "get", "update", "delete"]}]})
    kube.request_json(admin, "POST", f"{rbac}/rolebindings", body={
        "metadata": {"name": "alice"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                   "name": "alice"},
        "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": namespace}]})
    token = kube.request_json(admin, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/alice/token",
                              body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": {"expirationSeconds": 3600}})["status"]["token"]
    alice = kube.connect(token_kubeconfig(kubeconfig, token, tmp_path / "alice", user="alice"))
    users = {"admin": (admin, who(admin)), "alice": (alice, who(alice))}
    assert users["alice"][1].uid and not users["admin"][1].uid, "one user with a uid, one without"
    mutate, _ = review.build(cast(Facts, NamespaceFacts(admin)), review.AdmissionConfig())
    collection = f"{AW_API}/namespaces/{namespace}/appwrappers"
    compared = 0

    def same(user: str, operation: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
        """Send ``obj`` as ``user`` (a dry-run create, or a dry-run replace of ``old``) and compare the stored
        result with what /mutate would have made of it."""
        nonlocal compared
        conn, info = users[user]
        name = obj["metadata"]["name"]
        if operation == "CREATE":
            answer = kube.request_json(conn, "POST", collection, query={"dryRun": "All"}, body=obj)
        else:
            assert old is not None
            obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            answer = kube.request_json(conn, "PUT", f"{collection}/{name}", query={"dryRun": "All"}, body=obj)
        request = AdmissionRequest(uid="u", operation=operation, group="workload.codeflare.dev",
                                   namespace=namespace, name=name, user=info,
                                   obj={**obj, "metadata": {**obj["metadata"], "namespace": namespace}}, old=old)
        outcome = mutate(request)
        assert outcome.allowed, outcome
        expected = patched(request.obj, list(outcome.patch))
        assert what_matters(answer) == what_matters(expected), (user, operation, name)
        compared += 1

    # CREATE: whatever creator annotations were sent, the requesting user's; bound labels added, own ones kept.
    forged = {CREATOR: "someone-else", CREATOR_UID: "forged-uid", "note": "kept"}
    for user in ("alice", "admin"):
        same(user, "CREATE", appwrapper("forged", dict(forged), {"context": "silver", "app": "x"}))
        same(user, "CREATE", appwrapper("bare"))
        same(user, "CREATE", appwrapper("uid-only", {CREATOR_UID: "forged-uid"}, {}))

    # UPDATE: the stored values come back (removed where the stored object has none).
    stored_alice = kube.request_json(alice, "POST", collection, body=appwrapper("by-alice"))
    stored_admin = kube.request_json(admin, "POST", collection, body=appwrapper("by-admin", {"note": "n"}))
    assert stored_alice["metadata"]["annotations"][CREATOR_UID] == users["alice"][1].uid
    assert CREATOR_UID not in stored_admin["metadata"]["annotations"]
    for old in (stored_alice, stored_admin):
        name = old["metadata"]["name"]
        same("admin", "UPDATE", appwrapper(name, {CREATOR: "mallory", CREATOR_UID: "x"}, {"app": "y"}), old)
        same("alice", "UPDATE", appwrapper(name, {}, {"team": "other"}), old)
        same("alice", "UPDATE", appwrapper(name), old)

    # An AppWrapper being deleted: annotations put back, no label added.
    held = appwrapper("held")
    held["metadata"]["finalizers"] = ["mcad.test/hold"]
    kube.request_json(admin, "POST", collection, body=held)
    kube.request_json(admin, "DELETE", f"{collection}/held")
    deleting = kube.request_json(admin, "GET", f"{collection}/held")
    assert deleting["metadata"].get("deletionTimestamp")
    leaving = appwrapper("held", {}, {})
    leaving["metadata"]["finalizers"] = ["mcad.test/hold"]
    same("admin", "UPDATE", leaving, deleting)
    release = {"metadata": {"finalizers": None}}
    kube.request_json(admin, "PATCH", f"{collection}/held", body=release, content_type="application/merge-patch+json")
    assert compared == 13
