"""mcad.k8s.kube.Client against the real API server: discovery, server-side apply, guarded deletes."""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes.client as k8s
import pytest
import yaml

from mcad.k8s import kube


@pytest.fixture
def client(kubeconfig: str) -> kube.Client:
    return kube.Client(kube.connect(kubeconfig))


def test_discovery_knows_scope_and_refuses_unknown_kinds(client: kube.Client) -> None:
    assert client.resource("v1", "ConfigMap") == kube.ApiResource("configmaps", True)
    assert client.resource("v1", "Node") == kube.ApiResource("nodes", False)
    assert client.resource("apps/v1", "Deployment").plural == "deployments"
    with pytest.raises(kube.ApiError) as unknown:
        client.resource("v1", "Widget")
    assert unknown.value.status == 404
    with pytest.raises(kube.ApiError) as no_group:
        client.resource("nowhere.example.com/v1", "Widget")
    assert no_group.value.status == 404


def test_apply_creates_then_updates_with_one_field_manager(client: kube.Client, namespace: str,
                                                           core: k8s.CoreV1Api) -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied", "namespace": namespace},
           "data": {"a": "1"}}
    created = client.apply(obj, field_manager="mcad-test", force=True)
    assert created["metadata"]["uid"]
    updated = client.apply({**obj, "data": {"a": "2"}}, field_manager="mcad-test", force=True)
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    assert core.read_namespaced_config_map("applied", namespace).data == {"a": "2"}
    managers = {m.manager for m in core.read_namespaced_config_map("applied", namespace).metadata.managed_fields}
    assert managers == {"mcad-test"}


# Outside the BMP, a character YAML forbids raw, one a YAML 1.1 decoder folds as a line break, and a quote.
AWKWARD = "ok \U0001f600 \x7f \x85 \u2028 \ufeff \"é\""


def test_apply_sends_any_unicode_text_unchanged(client: kube.Client, namespace: str, core: k8s.CoreV1Api,
                                                crd: None) -> None:
    """Apply bodies are YAML to the API server: escaped JSON of a character outside the BMP was refused (400)."""
    obj = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "unicode", "namespace": namespace, "annotations": {"note": AWKWARD}},
           "data": {"k": AWKWARD}}
    client.apply(obj, field_manager="mcad-test", force=True)
    stored = core.read_namespaced_config_map("unicode", namespace)
    assert stored.metadata.annotations["note"] == AWKWARD
    assert stored.data == {"k": AWKWARD}
    # A status message carries names and API messages that may hold anything too.
    aw = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
          "metadata": {"name": "unicode", "namespace": namespace},
          "spec": {"resources": {"GenericItems": [{"generictemplate": obj}]}}}
    client.apply(aw, field_manager="mcad-test", force=True)
    written = client.apply_status("workload.codeflare.dev/v1beta1", "AppWrapper", namespace, "unicode",
                                  {"state": "Failed", "message": AWKWARD}, field_manager="mcad-test")
    assert written["status"]["message"] == AWKWARD


def test_delete_with_owner_uid_spares_objects_of_another_owner(client: kube.Client, namespace: str,
                                                               core: k8s.CoreV1Api) -> None:
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid, "controller": True}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "owned", "ownerReferences": [ref]}})

    client.delete("v1", "ConfigMap", namespace, "owned", owner_uid="someone-else")
    assert core.read_namespaced_config_map("owned", namespace)

    client.delete("v1", "ConfigMap", namespace, "owned", owner_uid=owner.metadata.uid)
    with pytest.raises(k8s.exceptions.ApiException) as gone:
        core.read_namespaced_config_map("owned", namespace)
    assert gone.value.status == 404
    client.delete("v1", "ConfigMap", namespace, "owned", owner_uid=owner.metadata.uid)  # already gone: fine


def test_delete_with_uid_removes_only_that_very_object(client: kube.Client, namespace: str,
                                                       core: k8s.CoreV1Api) -> None:
    first = core.create_namespaced_config_map(namespace, {"metadata": {"name": "same-name"}})
    client.delete("v1", "ConfigMap", namespace, "same-name", uid=first.metadata.uid)
    again = core.create_namespaced_config_map(namespace, {"metadata": {"name": "same-name"}})

    client.delete("v1", "ConfigMap", namespace, "same-name", uid=first.metadata.uid)  # a namesake: left alone
    assert core.read_namespaced_config_map("same-name", namespace).metadata.uid == again.metadata.uid
    client.delete("v1", "ConfigMap", namespace, "same-name", uid=again.metadata.uid)
    with pytest.raises(k8s.exceptions.ApiException) as gone:
        core.read_namespaced_config_map("same-name", namespace)
    assert gone.value.status == 404


def test_failed_requests_are_counted_by_verb_and_code(kubeconfig: str, namespace: str) -> None:
    conn = kube.connect(kubeconfig)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    with pytest.raises(kube.ApiError):
        kube.request_json(conn, "GET", f"{path}/missing")
    with pytest.raises(kube.ApiError):
        kube.request_json(conn, "DELETE", f"{path}/missing")
    kube.request_json(conn, "POST", path, body={"metadata": {"name": "once"}})
    with pytest.raises(kube.ApiError):
        kube.request_json(conn, "POST", path, body={"metadata": {"name": "once"}})
    kube.request_json(conn, "GET", path, query=[("limit", "1")])
    assert conn.errors.snapshot() == {("get", 404): 1, ("delete", 404): 1, ("create", 409): 1}


def test_create_refuses_a_taken_name_and_apply_with_a_uid_lands_only_on_that_object(
        client: kube.Client, namespace: str, core: k8s.CoreV1Api) -> None:
    """What mcad.k8s.apply relies on to never take an object over: a create answers 409 AlreadyExists instead of
    writing, and a uid in an apply body is a precondition (422 on another object of that name, 409 on none)."""
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taken", "namespace": namespace},
           "data": {"a": "1"}}
    created = client.create(obj, field_manager="mcad-controller-u1")
    assert [m.manager for m in core.read_namespaced_config_map("taken", namespace).metadata.managed_fields] == [
        "mcad-controller-u1"]
    with pytest.raises(kube.ApiError) as taken:
        client.create({**obj, "data": {"a": "2"}}, field_manager="mcad-controller-u2")
    assert (taken.value.status, taken.value.reason) == (409, "AlreadyExists")
    uid = created["metadata"]["uid"]
    client.apply({**obj, "metadata": {**obj["metadata"], "uid": uid}, "data": {"a": "3"}},
                 field_manager="mcad-controller-u1", force=True)
    assert core.read_namespaced_config_map("taken", namespace).data == {"a": "3"}
    with pytest.raises(kube.ApiError) as other:
        client.apply({**obj, "metadata": {**obj["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}},
                     field_manager="mcad-controller-u1", force=True)
    assert other.value.status == 422 and "uid" in other.value.message
    gone = {**obj, "metadata": {"name": "never-made", "namespace": namespace, "uid": uid}}
    with pytest.raises(kube.ApiError) as missing:
        client.apply(gone, field_manager="mcad-controller-u1", force=True)
    assert missing.value.status == 409 and "uid" in missing.value.message
    assert core.read_namespaced_config_map("taken", namespace).data == {"a": "3"}


def test_allowed_answers_for_this_clients_own_rights(client: kube.Client, namespace: str) -> None:
    assert client.allowed("create", "v1", "ConfigMap", namespace)  # the admin may
    assert client.allowed("list", "v1", "Secret")


def test_an_exec_plugins_token_is_asked_again_once_it_expired(kubeconfig: str, namespace: str, tmp_path: Path,
                                                              core: k8s.CoreV1Api) -> None:
    """mcad's requests authenticate as the client's configuration resolves the token for each request: an exec
    plugin's token that expired is asked for again (here the plugin reads a file the test rewrites)."""
    for account in ("token-a", "token-b"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    token_file = tmp_path / "token"
    plugin = tmp_path / "plugin.py"
    # Expired as it is issued: the client asks the plugin again before every request.
    plugin.write_text(
        "import json, pathlib\n"
        f"token = pathlib.Path({str(token_file)!r}).read_text().strip()\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',\n"
        "                  'status': {'token': token, 'expirationTimestamp': '2000-01-01T00:00:00Z'}}))\n")
    admin = yaml.safe_load(Path(kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    if "certificate-authority" in cluster["cluster"]:  # a relative path is read from the admin kubeconfig's folder
        cluster["cluster"]["certificate-authority"] = str(
            Path(kubeconfig).parent / cluster["cluster"]["certificate-authority"])
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "plugin",
        "clusters": [cluster], "contexts": [{"name": "plugin", "context": {"cluster": cluster["name"],
                                                                            "user": "plugin"}}],
        "users": [{"name": "plugin", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(plugin)],
            "interactiveMode": "Never"}}}]}))

    def who() -> str:
        review = kube.request_json(conn, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                   body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        return str(review["status"]["userInfo"]["username"])

    def token_of(account: str) -> str:
        answer = core.create_namespaced_service_account_token(account, namespace, {"spec": {}})
        return str(answer.status.token)

    token_file.write_text(token_of("token-a"))
    conn = kube.connect(str(config))
    assert who() == f"system:serviceaccount:{namespace}:token-a"
    token_file.write_text(token_of("token-b"))
    assert who() == f"system:serviceaccount:{namespace}:token-b"


def test_a_query_given_as_a_mapping_is_sent_as_pairs_are(kubeconfig: str, namespace: str,
                                                          core: k8s.CoreV1Api) -> None:
    conn = kube.connect(kubeconfig)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dry", "namespace": namespace}}
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    for query in ({"dryRun": "All"}, [("dryRun", "All")]):
        answer = kube.request_json(conn, "POST", path, query=query, body=body)  # type: ignore[arg-type]
        assert answer["metadata"]["name"] == "dry"
    assert [c.metadata.name for c in core.list_namespaced_config_map(namespace).items if c.metadata.name == "dry"] \
        == [], "a dry run creates nothing"
