"""Tenant escalations (test.escalations) through the real webhooks: `kubectl create` as a tenant with a
TokenRequest token.

alice holds only create/get/list/watch/delete on appwrappers in her namespace; each AppWrapper that got the
controller to create what she could not is refused at create, the message naming the item and the missing right.
bob holds the rights too: his Deployment and his privileged Pod run; the denylisted kinds are refused for him as for
everyone. The creator is recorded in annotations nobody can forge, and the items are frozen after create.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.admission.review import CREATOR_ANNOTATION, CREATOR_UID_ANNOTATION
from mcad.api.topologyasks import PODSET_REQUIRED, TOPOLOGY_PREFERRED, TOPOLOGY_REQUIRED
from mcad.k8s import kube
from test import escalations, support
from test.e2e.conftest import AppWrappers, Controller, fake_node
from test.escalations import BOB_KINDS, DENYLISTED, deployment
from test.support import REPO, wait_until

# Editing their AppWrappers (the creator test) takes update and patch too.
APPWRAPPER_RIGHTS = [{**escalations.APPWRAPPER_RIGHTS[0],
                      "verbs": [*escalations.APPWRAPPER_RIGHTS[0]["verbs"], "update", "patch"]}]
ESCALATIONS = [pytest.param(template, item, plural, DENYLISTED.get(id_), id=id_)
               for template, item, plural, id_ in escalations.ESCALATIONS]


def wrapper(namespace: str, name: str, *templates: dict[str, Any]) -> dict[str, Any]:
    return escalations.appwrapper(namespace, name, *templates)



def account(admin: kube.Connection, namespace: str, name: str, rules: list[dict[str, Any]] | None,
            cluster_role: str = "") -> str:
    """The ServiceAccount ``name``, bound to a Role of ``rules`` (or to ``cluster_role``); returns its uid."""
    made = kube.request_json(admin, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                             body={"metadata": {"name": name}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role}
    if rules is not None:
        kube.request_json(admin, "POST", f"{rbac}/roles", body={"metadata": {"name": name}, "rules": rules})
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    kube.request_json(admin, "POST", f"{rbac}/rolebindings", body={
        "metadata": {"name": name}, "roleRef": ref,
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    return str(made["metadata"]["uid"])


def token_kubeconfig(admin_kubeconfig: str, admin: kube.Connection, namespace: str, name: str, path: Path) -> str:
    """A kubeconfig that acts as ServiceAccount ``name`` with a short-lived TokenRequest token."""
    answer = kube.request_json(admin, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                               body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": 3600}})
    return support.token_kubeconfig(admin_kubeconfig, answer["status"]["token"], path, user=name,
                                    namespace=namespace)


def kubectl(kubeconfig: str, verb: str, body: dict[str, Any] | None, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl <verb> <args>``, with ``-f -`` reading ``body`` when there is one."""
    binary = shutil.which("kubectl") or str(REPO / ".dev" / "bin" / "kubectl")
    stdin = ["-f", "-"] if body is not None else []
    return subprocess.run([binary, "--kubeconfig", kubeconfig, verb, *args, *stdin],
                          input=json.dumps(body) if body is not None else None,
                          capture_output=True, text=True, timeout=60, check=False)


class Tenants:
    def __init__(self, kubeconfig: str, namespace: str, tmp: Path) -> None:
        admin = kube.connect(kubeconfig)
        self.namespace = namespace
        self.alice_uid = account(admin, namespace, "alice", APPWRAPPER_RIGHTS)
        self.bob_uid = account(admin, namespace, "bob", APPWRAPPER_RIGHTS + [
            {"apiGroups": [g], "resources": [r], "verbs": ["create"]} for g, r in BOB_KINDS])
        account(admin, namespace, "deployer", None, cluster_role="admin")
        self.alice = token_kubeconfig(kubeconfig, admin, namespace, "alice", tmp / "alice")
        self.bob = token_kubeconfig(kubeconfig, admin, namespace, "bob", tmp / "bob")

    def user(self, name: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{name}"


@pytest.fixture
def tenants(kubeconfig: str, aws: AppWrappers, controller: Controller, tmp_path: Path) -> Tenants:
    made = Tenants(kubeconfig, aws.namespace, tmp_path)

    def bob_may_create_deployments() -> bool:
        return kubectl(made.bob, "auth", None, "can-i", "create", "deployments.apps").stdout.strip() == "yes"

    wait_until(bob_may_create_deployments, 30, "bob's Role to count")
    return made
















@pytest.mark.parametrize(("template", "item", "plural", "denylisted"), ESCALATIONS)
def test_a_tenant_cannot_make_the_controller_create_what_it_may_not(
        tenants: Tenants, aws: AppWrappers, template: Callable[[], dict[str, Any]], item: str, plural: str,
        denylisted: str | None) -> None:
    proc = kubectl(tenants.alice, "create", wrapper(tenants.namespace, "escalate", template()))
    assert proc.returncode != 0, proc.stdout
    reason = denylisted or (f'user "{tenants.user("alice")}" may not create {plural} in namespace '
                            f'{tenants.namespace}')
    assert f"denied the request: GenericItems[0] ({item}): {reason}" in proc.stderr, proc.stderr
    with pytest.raises(Exception, match="Not Found"):
        aws.get("escalate")


@pytest.mark.parametrize(("template", "item", "plural", "denylisted"), ESCALATIONS)
def test_a_user_holding_the_rights_runs_the_same_appwrapper_except_denylisted_kinds(
        tenants: Tenants, aws: AppWrappers, template: Callable[[], dict[str, Any]], item: str, plural: str,
        denylisted: str | None) -> None:
    proc = kubectl(tenants.bob, "create", wrapper(tenants.namespace, "allowed", template()))
    if denylisted:
        assert proc.returncode != 0 and f"denied the request: GenericItems[0] ({item}): {denylisted}" in proc.stderr, \
            proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    aws.wait_state("allowed", "Running")
    name = template()["metadata"]["name"]
    assert aws.exists(template()["apiVersion"], template()["kind"], name)


def test_the_creator_is_recorded_and_cannot_be_forged_or_changed(tenants: Tenants, aws: AppWrappers) -> None:
    body = wrapper(tenants.namespace, "mine", deployment())
    body["metadata"]["annotations"] = {CREATOR_ANNOTATION: "system:admin", CREATOR_UID_ANNOTATION: "forged"}
    proc = kubectl(tenants.bob, "create", body)
    assert proc.returncode == 0, proc.stderr
    annotations = aws.get("mine")["metadata"]["annotations"]
    assert annotations[CREATOR_ANNOTATION] == tenants.user("bob")
    assert annotations[CREATOR_UID_ANNOTATION] == tenants.bob_uid
    # An edit of the creator is quietly put back; an edit of the items is refused (patches: the controller writes
    # the AppWrapper meanwhile, a replace would conflict).
    edit = {"metadata": {"annotations": {CREATOR_ANNOTATION: "system:admin"}, "labels": {"edited": "yes"}}}
    proc = kubectl(tenants.bob, "patch", None, "appwrapper", "mine", "--type", "merge", "-p", json.dumps(edit))
    assert proc.returncode == 0, proc.stderr
    after = aws.get("mine")["metadata"]
    assert after["annotations"][CREATOR_ANNOTATION] == tenants.user("bob")
    assert after["labels"]["edited"] == "yes"
    image = "/spec/resources/GenericItems/0/generictemplate/spec/template/spec/containers/0/image"
    proc = kubectl(tenants.bob, "patch", None, "appwrapper", "mine", "--type", "json",
                   "-p", json.dumps([{"op": "replace", "path": image, "value": "evil"}]))
    assert proc.returncode != 0
    assert "denied the request: spec.resources may not change once the AppWrapper is created" in proc.stderr, \
        proc.stderr


def configmap(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}, "data": {"k": "v"}}


def pod(name: str | None, cpu: str = "10m") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name} if name else {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}


@pytest.mark.parametrize(("templates", "message"), [
    pytest.param([{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}],
                 "GenericItems[0] (Widget w): the API server does not serve example.com/v1 Widget", id="unknown-kind"),
    pytest.param([configmap("cm", namespace="kube-system")],
                 "GenericItems[0] (ConfigMap cm): metadata.namespace 'kube-system' differs from the AppWrapper's "
                 "namespace", id="other-namespace"),
    pytest.param([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mine"}}],
                 "GenericItems[0] (Namespace mine): Namespace is cluster-scoped", id="cluster-scoped"),
    pytest.param([pod(None)], "GenericItems[0] (Pod (no name)): metadata.name is required", id="nameless"),
    pytest.param([pod("q", cpu="-2")], "GenericItems[0] (Pod q): generictemplate.spec.containers[0].resources."
                 "requests.cpu: negative quantity '-2'", id="negative-quantity"),
    pytest.param([pod("huge", cpu="1e100")], "GenericItems[0] (Pod huge): generictemplate.spec.containers[0]."
                 "resources.requests.cpu is '1e100', more than Kubernetes can count", id="huge-quantity"),
    pytest.param([configmap("same"), pod("p"), configmap("same")],
                 "GenericItems[2] (ConfigMap same) names the same object as GenericItems[0]", id="duplicates"),
    pytest.param([{"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                   "metadata": {"name": "inner"}, "spec": {"resources": {"GenericItems": []}}}],
                 "GenericItems[0] (AppWrapper inner): an AppWrapper cannot wrap another AppWrapper", id="nested"),
    # The item and the field, not a traceback ("internal error").
    pytest.param([{**deployment(), "spec": {**deployment()["spec"], "replicas": -3}}],
                 "GenericItems[0] (Deployment web): generictemplate.spec.replicas: must be a non-negative integer, "
                 "got -3", id="negative-replicas"),
    # Refused at create, not admitted and then failed at dispatch.
    pytest.param([configmap("café")], "GenericItems[0] (ConfigMap café): metadata.name 'café' is not a valid "
                 "Kubernetes name (a DNS-1123 subdomain", id="name-not-dns"),
])
def test_what_dispatch_would_fail_is_refused_at_create_with_the_same_message(
        tenants: Tenants, aws: AppWrappers, templates: list[dict[str, Any]], message: str) -> None:
    proc = kubectl(tenants.bob, "create", wrapper(tenants.namespace, "bad", *templates))
    assert proc.returncode != 0
    assert f"denied the request: {message}" in proc.stderr, proc.stderr


def test_a_pod_template_cannot_raise_its_pods_priority_above_the_namespace_ceiling(
        kubeconfig: str, tenants: Tenants, aws: AppWrappers) -> None:
    """A pod-level priorityClassName inside a template is capped too (else pods get priority 1,000,000)."""
    admin = kube.connect(kubeconfig)
    name = f"mcad-e2e-high-{aws.namespace}"
    kube.request_json(admin, "POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                      body={"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": name}, "value": 1_000_000})
    try:
        loud = deployment()
        loud["spec"]["template"]["spec"]["priorityClassName"] = name
        proc = kubectl(tenants.bob, "create", wrapper(tenants.namespace, "loud", loud))
        assert proc.returncode != 0
        assert (f"GenericItems[0] (Deployment web): generictemplate.spec.template.spec.priorityClassName: "
                f"PriorityClass '{name}' has value 1000000, above the ceiling 1000 of namespace {tenants.namespace} "
                f"(set by the controller's --default-max-priority)") in proc.stderr, proc.stderr
        direct = pod("p")
        direct["spec"]["priority"] = 1_000_000
        proc = kubectl(tenants.bob, "create", wrapper(tenants.namespace, "direct", direct))
        assert proc.returncode != 0
        assert (f"GenericItems[0] (Pod p): generictemplate.spec.priority 1000000 is above the ceiling 1000 of "
                f"namespace {tenants.namespace}") in proc.stderr, proc.stderr
        assert not aws.exists("apps/v1", "Deployment", "web")
    finally:
        kube.request_json(admin, "DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def test_a_terminating_appwrapper_keeps_its_spec_and_labels_and_lets_its_finalizer_go(
        tenants: Tenants, aws: AppWrappers) -> None:
    """An AppWrapper held by a finalizer after delete is judged like any other: no spec, priority or quota label
    change gets past admission."""
    body = wrapper(tenants.namespace, "held", configmap("held-cm"))
    body["metadata"]["finalizers"] = ["example.com/hold"]
    proc = kubectl(tenants.bob, "create", body)
    assert proc.returncode == 0, proc.stderr
    proc = kubectl(tenants.bob, "delete", None, "appwrapper", "held", "--wait=false")
    assert proc.returncode == 0, proc.stderr
    wait_until(lambda: aws.get("held")["metadata"].get("deletionTimestamp"), 30, "held to be terminating")
    for patch, what in ((({"spec": {"priority": 999}}), "spec (priority included)"),
                        ({"metadata": {"labels": {"tenants": "team-b"}}}, "metadata.labels (quota nodes included)")):
        proc = kubectl(tenants.bob, "patch", None, "appwrapper", "held", "--type", "merge", "-p", json.dumps(patch))
        assert proc.returncode != 0
        assert (f"denied the request: the AppWrapper is being deleted (metadata.deletionTimestamp is set): {what} "
                f"may not change any more; only its finalizers may come off") in proc.stderr, proc.stderr
    proc = kubectl(tenants.bob, "patch", None, "appwrapper", "held", "--type", "json",
                   "-p", json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]))
    assert proc.returncode == 0, proc.stderr
    wait_until(lambda: not any(a["metadata"]["name"] == "held" for a in aws.custom.list_namespaced_custom_object(
        "workload.codeflare.dev", "v1beta1", tenants.namespace, "appwrappers")["items"]), 30, "held to go")


def test_a_tenant_cannot_forge_its_quota_node_its_priority_or_its_demand(
        kubeconfig: str, tenants: Tenants, aws: AppWrappers) -> None:
    """The admin binds the namespace to node team-a of tree "tenants" and caps priorities at 100 there: a label
    naming another node, a priority above the cap, an unknown PriorityClass and custompodresources below what the
    templates ask are refused at create; an unlabelled AppWrapper gets the bound label."""
    admin = kube.connect(kubeconfig)
    kube.request_json(admin, "PATCH", f"/api/v1/namespaces/{tenants.namespace}",
                      body={"metadata": {"labels": {"quota.codeflare.dev/tenants": "team-a"},
                                         "annotations": {"mcad.codeflare.dev/max-priority": "100"}}},
                      content_type="application/merge-patch+json")
    forged = wrapper(tenants.namespace, "forged", pod("p"))
    forged["metadata"]["labels"] = {"tenants": "team-b"}
    # Admission reads namespaces through a short cache: wait (with a server-side dry run, which goes through the
    # webhooks and stores nothing) until it sees the binding.
    wait_until(lambda: kubectl(tenants.bob, "create", forged, "--dry-run=server").returncode != 0, 30,
               "admission to see the namespace's binding")
    proc = kubectl(tenants.bob, "create", forged)
    assert proc.returncode != 0
    assert ("metadata.labels.tenants: 'team-b' names quota node team-b of tree tenants, but the cluster admin binds "
            f"namespace {tenants.namespace} to node team-a") in proc.stderr, proc.stderr

    loud = wrapper(tenants.namespace, "loud", pod("p"))
    loud["spec"]["priority"] = 2**31 - 1
    proc = kubectl(tenants.bob, "create", loud)
    assert proc.returncode != 0
    assert (f"spec.priority 2147483647 is above the ceiling 100 of namespace {tenants.namespace} (set by namespace "
            f"{tenants.namespace}'s annotation mcad.codeflare.dev/max-priority)") in proc.stderr, proc.stderr

    classy = wrapper(tenants.namespace, "classy", pod("p"))
    classy["spec"]["priorityClassName"] = "no-such-class"
    proc = kubectl(tenants.bob, "create", classy)
    assert proc.returncode != 0
    assert "spec.priorityClassName: there is no PriorityClass 'no-such-class'" in proc.stderr, proc.stderr

    understated = wrapper(tenants.namespace, "small", deployment())
    understated["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
        {"replicas": 1, "requests": {"cpu": "1m"}}]
    understated["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["replicas"] = 6
    proc = kubectl(tenants.bob, "create", understated)
    assert proc.returncode != 0
    assert "GenericItems[0] (Deployment web): custompodresources declare cpu 1m, less than its templates ask, " \
        "cpu 60m" in proc.stderr, proc.stderr

    proc = kubectl(tenants.bob, "create", wrapper(tenants.namespace, "plain", pod("p")))
    assert proc.returncode == 0, proc.stderr
    assert aws.get("plain")["metadata"]["labels"]["tenants"] == "team-a"


def test_an_appwrapper_nested_3000_deep_is_refused_naming_the_limit(tenants: Tenants, aws: AppWrappers) -> None:
    """Deeper than Python's JSON decoder goes (the API server stores up to 10,000 levels): refused with the limit,
    not with an internal error."""
    from test.e2e.test_bad_input import deep_appwrapper, kubectl_text
    proc = kubectl_text(tenants.alice, "create", "-f", "-", text=deep_appwrapper("deep", tenants.namespace, 3000))
    assert proc.returncode != 0, proc.stdout
    assert ("denied the request: the AppWrapper nests objects and arrays more than 100 levels deep; at most 100 are "
            "allowed") in proc.stderr, proc.stderr
    with pytest.raises(Exception, match="Not Found"):
        aws.get("deep")


def topology_wrapper(namespace: str, name: str, level: str, template_level: str | None = None) -> dict[str, Any]:
    """An AppWrapper of one Deployment requiring ``level`` (and, in the Deployment's pod template, Kueue's pod set
    annotation requiring ``template_level``)."""
    template = deployment()
    if template_level is not None:
        template["spec"]["template"]["metadata"]["annotations"] = {PODSET_REQUIRED: template_level}
    body = wrapper(namespace, name, template)
    body["metadata"]["annotations"] = {TOPOLOGY_REQUIRED: level}
    return body


def test_a_topology_level_that_is_not_a_label_key_is_refused_naming_the_annotation_and_why(
        tenants: Tenants, aws: AppWrappers) -> None:
    """As alice, who may create AppWrappers and nothing else: the topology problems come first, her missing right
    after them."""
    proc = kubectl(tenants.alice, "create", topology_wrapper(tenants.namespace, "bad-level", "rack!", "a/b/c"))
    assert proc.returncode != 0, proc.stdout
    name_rule = "its name part must be letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
    assert (f"denied the request: annotation {TOPOLOGY_REQUIRED}: 'rack!' is not a node label key: {name_rule}; "
            f"GenericItems[0] (Deployment web): generictemplate.spec.template.metadata.annotations[{PODSET_REQUIRED}]: "
            f"'a/b/c' is not a node label key: its prefix must be a DNS subdomain") in proc.stderr, proc.stderr
    assert f'user "{tenants.user("alice")}" may not create deployments.apps' in proc.stderr, proc.stderr
    with pytest.raises(Exception, match="Not Found"):
        aws.get("bad-level")
    # bob holds the rights for the Deployment: the level alone is refused, and so is an edit that sets one.
    proc = kubectl(tenants.bob, "create", topology_wrapper(tenants.namespace, "bad-level", "Rack"))
    assert proc.returncode == 0, proc.stderr
    edit = {"metadata": {"annotations": {TOPOLOGY_PREFERRED: "/rack"}}}
    proc = kubectl(tenants.bob, "patch", None, "appwrapper", "bad-level", "--type", "merge", "-p", json.dumps(edit))
    assert proc.returncode != 0
    assert (f"denied the request: annotation {TOPOLOGY_PREFERRED}: '/rack' is not a node label key: its prefix must "
            f"be a DNS subdomain of 1 to 253 characters") in proc.stderr, proc.stderr


def test_a_required_level_no_node_has_is_admitted_with_a_warning_and_waits_for_one(
        core: k8s.CoreV1Api, tenants: Tenants, aws: AppWrappers) -> None:
    level = f"topology.mcad.test/level-{uuid.uuid4().hex[:8]}"
    warning = f"Warning: no node has the label '{level}' yet: the AppWrapper waits until one does"
    proc = kubectl(tenants.bob, "create", topology_wrapper(tenants.namespace, "waits", level))
    assert proc.returncode == 0, proc.stderr
    assert f"{warning} (annotation {TOPOLOGY_REQUIRED})" in proc.stderr, proc.stderr
    # The same in a pod set's annotation, its template named.
    proc = kubectl(tenants.bob, "create", topology_wrapper(tenants.namespace, "waits-too", "kubernetes.io/os",
                                                           level), "--dry-run=server")
    assert proc.returncode == 0, proc.stderr
    assert (f"{warning} (annotation {PODSET_REQUIRED} of GenericItems[0] (Deployment web) "
            f"generictemplate.spec.template)") in proc.stderr, proc.stderr
    wait_until(lambda: any("no node has that label" in str(c.get("message"))
                           for c in aws.status("waits").get("conditions") or []), 60,
               "the AppWrapper's status to say no node has the label")
    with fake_node(core, labels={level: "domain-1"}, cpu="1"):
        # Once the controller's node informer has the node: no warning, and the AppWrapper runs in that domain.
        wait_until(lambda: "no node has the label" not in kubectl(
            tenants.bob, "create", topology_wrapper(tenants.namespace, "probe", level), "--dry-run=server").stderr,
            30, "the warning to stop once a node has the label")
        aws.wait_state("waits", "Running")
        (node,) = core.list_node(label_selector=level).items
        running = wait_until(lambda: aws.pods("waits", "Running"), 60, "the AppWrapper's pod to run")
        assert [p.spec.node_name for p in running] == [node.metadata.name]
        aws.delete("waits")
        wait_until(lambda: not aws.pods("waits"), 60, "the AppWrapper's pods to go before its node does")
