"""The AppWrapper reviewers against a fake Facts: every refusal and its message, the denylist whatever the rights,
the update rules, the creator patch."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from mcad.admission.facts import Decision, FactUnavailable, Resource
from mcad.admission.request import AdmissionRequest, Outcome, UserInfo
from mcad.admission.review import (
    CREATOR_ANNOTATION,
    CREATOR_UID_ANNOTATION,
    MAX_KINDS,
    AdmissionConfig,
    bounded_message,
    build,
    pointer,
)
from mcad.api.validation import MAX_REPORTED

ALICE = UserInfo("system:serviceaccount:team-a:alice", uid="uid-alice",
                 groups=("system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"))
ADMIN = UserInfo("admin", uid="uid-admin", groups=("system:masters",))

SERVED = {
    ("v1", "ConfigMap"): Resource("", "v1", "configmaps", "ConfigMap", True),
    ("v1", "Pod"): Resource("", "v1", "pods", "Pod", True),
    ("v1", "Secret"): Resource("", "v1", "secrets", "Secret", True),
    ("v1", "Service"): Resource("", "v1", "services", "Service", True),
    ("v1", "Event"): Resource("", "v1", "events", "Event", True),
    ("v1", "PersistentVolume"): Resource("", "v1", "persistentvolumes", "PersistentVolume", False),
    ("apps/v1", "Deployment"): Resource("apps", "v1", "deployments", "Deployment", True),
    ("batch/v1", "Job"): Resource("batch", "v1", "jobs", "Job", True),
    ("events.k8s.io/v1", "Event"): Resource("events.k8s.io", "v1", "events", "Event", True),
    ("rbac.authorization.k8s.io/v1", "Role"): Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"):
        Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"):
        Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ("workload.codeflare.dev/v1beta1", "AppWrapper"):
        Resource("workload.codeflare.dev", "v1beta1", "appwrappers", "AppWrapper", True),
}


class FakeFacts:
    """Discovery from SERVED; ``rights`` maps a username to the (group, resource, namespace) it may create, or
    "*" for everything; ``broken`` makes every question fail."""

    def __init__(self, rights: Mapping[str, Any] | None = None, *, broken: str = "") -> None:
        self.rights = dict(rights or {})
        self.broken = broken
        self.asked: list[tuple[str, ...]] = []

    def _check(self) -> None:
        if self.broken:
            raise FactUnavailable(self.broken)

    def resource_for(self, api_version: str, kind: str) -> Resource | None:
        self.asked.append(("discovery", api_version, kind))
        self._check()
        return SERVED.get((api_version, kind))

    def may(self, user: UserInfo, verb: str, resource: Resource, namespace: str, name: str = "") -> Decision:
        self.asked.append(("sar", user.username, verb, resource.resource, namespace))
        self._check()
        held = self.rights.get(user.username, set())
        allowed = held == "*" or (resource.group, resource.resource, namespace) in held
        return Decision(allowed, "" if allowed else "no RBAC policy matched")

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        self._check()
        return {"metadata": {"name": name}}

    def priority_class(self, name: str) -> int | None:
        self._check()
        return None


def cm(name: str = "cfg", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}, **extra}


def deployment(name: str = "web", cpu: str = "100m") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {
        "replicas": 2, "selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}}}


def with_spec(template: dict[str, Any], **fields: Any) -> dict[str, Any]:
    template["spec"].update(fields)
    return template


def pod_spec(cpu: str = "100m", **fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}], **fields}


def job(name: str = "train", **pod: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": 1, "template": {"spec": pod_spec(**pod)}}}


def ray_cluster(head: dict[str, Any] | None = None, worker: dict[str, Any] | None = None,
                **group: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "ray"}, "spec": {
        "headGroupSpec": {"template": {"spec": pod_spec(**(head or {}))}},
        "workerGroupSpecs": [{"groupName": "w", "replicas": 1, **group,
                              "template": {"spec": pod_spec(**(worker or {}))}}]}}


def pytorch_job(replicas: int = 1, **pod: Any) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "torch"}, "spec": {
        "pytorchReplicaSpecs": {"Worker": {"replicas": replicas, "template": {"spec": pod_spec(**pod)}}}}}


def aw(*templates: Mapping[str, Any], name: str = "job", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"resources": {"GenericItems": [{"generictemplate": dict(t)} for t in templates]}, **spec}}


def request(obj: Mapping[str, Any], *, user: UserInfo = ALICE, old: Mapping[str, Any] | None = None,
            namespace: str = "team-a") -> AdmissionRequest:
    return AdmissionRequest(uid="r-1", operation="UPDATE" if old is not None else "CREATE",
                            group="workload.codeflare.dev", namespace=namespace,
                            name=str(obj["metadata"]["name"]), user=user, obj=obj, old=old)


def alice_may(*resources: tuple[str, str]) -> dict[str, Any]:
    return {ALICE.username: {(g, r, "team-a") for g, r in resources}, ADMIN.username: "*"}


def validate(obj: Mapping[str, Any], facts: FakeFacts | None = None, config: AdmissionConfig | None = None,
             **kw: Any) -> Outcome:
    _, check = build(facts or FakeFacts({ALICE.username: "*", ADMIN.username: "*"}), config or AdmissionConfig())
    return check(request(obj, **kw))


def refused(outcome: Outcome) -> str:
    assert not outcome.allowed, "expected a refusal"
    assert outcome.message
    return outcome.message


# -- create: rights ------------------------------------------------------------------------------------------------


def test_an_appwrapper_whose_items_the_user_may_create_is_admitted() -> None:
    facts = FakeFacts(alice_may(("", "configmaps"), ("apps", "deployments")))
    assert validate(aw(cm(), deployment()), facts).allowed
    # One review per item, as alice, verb create, in the AppWrapper's namespace.
    assert [a for a in facts.asked if a[0] == "sar"] == [
        ("sar", ALICE.username, "create", "configmaps", "team-a"),
        ("sar", ALICE.username, "create", "deployments", "team-a")]


def test_an_item_the_user_may_not_create_is_refused_naming_the_item_and_the_right() -> None:
    facts = FakeFacts(alice_may(("", "configmaps")))
    message = refused(validate(aw(cm(), deployment()), facts))
    assert message == ('GenericItems[1] (Deployment web): user "system:serviceaccount:team-a:alice" may not create '
                       'deployments.apps in namespace team-a (no RBAC policy matched)')


def test_core_kinds_are_named_without_a_group() -> None:
    message = refused(validate(aw({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                   "spec": {"containers": [{"name": "c", "image": "x"}]}}), FakeFacts(alice_may())))
    assert 'GenericItems[0] (Pod p): user "system:serviceaccount:team-a:alice" may not create pods in namespace ' \
           'team-a' in message


def test_a_kind_the_api_server_does_not_serve_is_refused_naming_it() -> None:
    item = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}}
    message = refused(validate(aw(item)))
    assert message == "GenericItems[0] (RayCluster rc): the API server does not serve ray.io/v1 RayCluster " \
                      "(is its CRD installed?)"


def test_a_cluster_scoped_kind_is_refused() -> None:
    item = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"}}
    assert refused(validate(aw(item))) == ("GenericItems[0] (PersistentVolume pv): PersistentVolume is "
                                          "cluster-scoped; an AppWrapper can only wrap namespaced objects")


def test_an_item_in_another_namespace_is_refused() -> None:
    message = refused(validate(aw(cm(metadata={"name": "cfg", "namespace": "team-b"}))))
    assert "GenericItems[0] (ConfigMap cfg): metadata.namespace 'team-b' differs from the AppWrapper's namespace " \
           "'team-a'" in message


def test_when_a_fact_cannot_be_had_the_request_is_refused_saying_so() -> None:
    facts = FakeFacts({ALICE.username: "*"}, broken="could not check whether 'alice' may create configmaps: "
                                                    "the API server did not answer (timeout)")
    message = refused(validate(aw(cm(), deployment()), facts))
    assert message == "could not check whether 'alice' may create configmaps: the API server did not answer (timeout)"
    assert len(facts.asked) == 1  # no further question once one went unanswered


def test_more_than_max_kinds_kinds_are_refused_before_asking_anything() -> None:
    items = [{"apiVersion": f"example.com/v{i + 1}", "kind": "Thing", "metadata": {"name": f"t{i}"}}
             for i in range(MAX_KINDS + 5)]
    facts = FakeFacts({ALICE.username: "*"})
    message = refused(validate(aw(*items), facts))
    assert message == f"the AppWrapper wraps {MAX_KINDS + 5} kinds (API version and kind); at most {MAX_KINDS} are " \
                      f"allowed"
    assert facts.asked == []


# -- create: the denylist and the allowlist ------------------------------------------------------------------------

DENIED = [
    pytest.param({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "x"},
                  "rules": []}, "RBAC objects cannot be wrapped", id="role"),
    pytest.param({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "x"}},
                 "RBAC objects cannot be wrapped", id="rolebinding"),
    pytest.param({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "x"}},
                 "RBAC objects cannot be wrapped", id="clusterrole"),
    pytest.param({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"},
                  "type": "kubernetes.io/service-account-token"},
                 "Secrets of type kubernetes.io/service-account-token cannot be wrapped", id="sa-token-secret"),
    pytest.param({"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "x", "annotations": {"kubernetes.io/service-account.name": "deployer"}}},
        "Secrets annotated kubernetes.io/service-account.name cannot be wrapped", id="sa-annotated-secret"),
    pytest.param({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "x"}},
                 "Events cannot be wrapped", id="core-event"),
    pytest.param({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "x"}},
                 "Events cannot be wrapped", id="events-event"),
    pytest.param({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
                  "spec": {"ports": [{"port": 80}], "externalIPs": ["8.8.8.8"]}},
                 "Services with spec.externalIPs cannot be wrapped", id="service-externalips"),
]


@pytest.mark.parametrize(("template", "reason"), DENIED)
def test_denylisted_kinds_are_refused_even_to_a_user_holding_every_right(template: dict[str, Any],
                                                                          reason: str) -> None:
    everything = AdmissionConfig(allowed_kinds=frozenset(
        (r.group, r.resource) for r in SERVED.values()), allowed_namespaces=frozenset({"team-a"}))
    message = refused(validate(aw(cm(), template), FakeFacts({ADMIN.username: "*"}), everything, user=ADMIN))
    assert message.startswith(f"GenericItems[1] ({template['kind']} x): {reason}")


def test_ordinary_secrets_and_services_are_judged_by_the_users_rights_alone() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"k": "v"}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}}
    assert validate(aw(secret, service), FakeFacts(alice_may(("", "secrets"), ("", "services")))).allowed
    message = refused(validate(aw(secret, service), FakeFacts(alice_may(("", "secrets")))))
    assert message.startswith('GenericItems[1] (Service svc): user "system:serviceaccount:team-a:alice" may not '
                              'create services in namespace team-a')


def test_the_allowlist_refuses_other_kinds_even_when_the_user_may_create_them() -> None:
    config = AdmissionConfig(allowed_kinds=frozenset({("", "configmaps"), ("batch", "jobs")}))
    message = refused(validate(aw(cm(), deployment()), config=config))
    assert message == ("GenericItems[1] (Deployment web): deployments.apps is not among the kinds the cluster admin "
                       "allows in AppWrappers")


# -- create: shape -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("obj", "expected"), [
    pytest.param(aw(cm(), {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                           "metadata": {"name": "inner"}}),
                 "GenericItems[1] (AppWrapper inner): an AppWrapper cannot wrap another AppWrapper", id="nested"),
    pytest.param(aw(cm(), cm()), "GenericItems[1] (ConfigMap cfg) names the same object as GenericItems[0]",
                 id="duplicate"),
    pytest.param(aw(cm(), name="x" * 64), "metadata.name is 64 characters long; at most 63", id="name-too-long"),
    pytest.param(aw(cm(), name="bad_"), "metadata.name 'bad_' cannot be a label value", id="name-not-label"),
    pytest.param(aw(deployment(cpu="lots")), "GenericItems[0] (Deployment web): generictemplate.spec.template.spec."
                 "containers[0].resources.requests.cpu", id="unparseable-quantity"),
    pytest.param(aw(deployment(cpu="1e30")), "GenericItems[0] (Deployment web): generictemplate.spec.template.spec."
                 "containers[0].resources.requests.cpu is '1e30', more than Kubernetes can count",
                 id="absurd-quantity"),
    pytest.param(aw(cm(), schedulingSpec={"requeuing": {"timeInSeconds": 0}}),
                 "spec.schedulingSpec.requeuing.timeInSeconds is 0; it must be between 1 and", id="zero-requeue"),
    pytest.param(aw(cm(), schedulingSpec={"dispatchDuration": {"limit": 10**12}}),
                 "spec.schedulingSpec.dispatchDuration.limit is 1000000000000", id="absurd-duration"),
    pytest.param(aw(cm(), schedulingSpec={"requeuing": {"timeInSeconds": "5m"}}),
                 "spec.schedulingSpec.requeuing.timeInSeconds must be an integer, got '5m'", id="duration-string"),
    pytest.param(aw(cm(), priority=2**31), "spec.priority is 2147483648", id="priority-out-of-int32"),
    pytest.param(aw(), "spec.resources.GenericItems is empty", id="no-items"),
    pytest.param(aw({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "x-"}}),
                 "GenericItems[0] (ConfigMap (no name)): metadata.name is required", id="no-name"),
    pytest.param(aw({"metadata": {"name": "x"}}), "GenericItems[0] (? x): generictemplate needs apiVersion and kind",
                 id="no-kind"),
    # A pod template's metadata that is not an object was a traceback ("could not check the AppWrapper:
    # AttributeError") before: the message names the item and the field.
    pytest.param(aw({**job(), "spec": {**job()["spec"], "template": {"metadata": "x", "spec": {}}}}),
                 "GenericItems[0] (Job train): spec.template.metadata must be an object", id="pod-metadata-not-object"),
    pytest.param(aw({**job(), "spec": {**job()["spec"], "template": {"metadata": {"labels": ["a"]}, "spec": {}}}}),
                 "GenericItems[0] (Job train): spec.template.metadata.labels must be a map of strings",
                 id="pod-labels-not-map"),
    pytest.param({**aw(cm()), "spec": {"resources": {"GenericItems": [{"custompodresources": [
        {"replicas": 1, "requests": {"cpu": "-1"}}], "generictemplate": cm()}]}}},
        "GenericItems[0] (ConfigMap cfg): custompodresources[0].requests.cpu", id="negative-custom"),
    # Counts below zero were a traceback ("internal error") before: the message names the item and the field.
    pytest.param(aw(with_spec(deployment(), replicas=-3)), "GenericItems[0] (Deployment web): generictemplate.spec."
                 "replicas: must be a non-negative integer, got -3", id="negative-replicas"),
    pytest.param(aw(with_spec(job(), parallelism=-1)), "GenericItems[0] (Job train): generictemplate.spec."
                 "parallelism: must be a non-negative integer, got -1", id="negative-parallelism"),
    pytest.param(aw(with_spec(job(), completions=-2)), "GenericItems[0] (Job train): generictemplate.spec."
                 "completions: must be a non-negative integer, got -2", id="negative-completions"),
    pytest.param(aw(with_spec(job(), parallelism=1.5)), "GenericItems[0] (Job train): generictemplate.spec."
                 "parallelism: must be a non-negative integer, got 1.5", id="fractional-parallelism"),
    pytest.param(aw(ray_cluster(replicas=-1)), "GenericItems[0] (RayCluster ray): generictemplate.spec."
                 "workerGroupSpecs[0].replicas: must be a non-negative integer, got -1", id="negative-ray-replicas"),
    pytest.param(aw(ray_cluster(minReplicas=-1)), "GenericItems[0] (RayCluster ray): generictemplate.spec."
                 "workerGroupSpecs[0].minReplicas: must be a non-negative integer, got -1", id="negative-ray-min"),
    pytest.param(aw(ray_cluster(maxReplicas="9")), "GenericItems[0] (RayCluster ray): generictemplate.spec."
                 "workerGroupSpecs[0].maxReplicas: must be a non-negative integer, got '9'", id="string-ray-max"),
    pytest.param(aw(pytorch_job(-4)), "GenericItems[0] (PyTorchJob torch): generictemplate.spec."
                 "pytorchReplicaSpecs.Worker.replicas: must be a non-negative integer, got -4",
                 id="negative-pytorch-replicas"),
    # Kubernetes names: an item the API server would refuse at dispatch is refused at create, naming it.
    pytest.param(aw(cm("café")), "GenericItems[0] (ConfigMap café): metadata.name 'café' is not a valid Kubernetes "
                 "name (a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending "
                 "with a letter or digit)", id="name-not-dns"),
    pytest.param(aw(cm("Web")), "GenericItems[0] (ConfigMap Web): metadata.name 'Web' is not a valid", id="upper"),
    pytest.param(aw(cm("a" * 254)), f"metadata.name '{'a' * 36}... is not a valid Kubernetes name",
                 id="name-too-long-for-kubernetes"),
    pytest.param(aw({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": 7}}),
                 "GenericItems[0] (ConfigMap (no name)): metadata.name must be a string, got 7", id="name-not-str"),
    pytest.param(aw({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "generateName": "Ça-"}}),
                 "GenericItems[0] (ConfigMap x): metadata.generateName 'Ça-' is not a valid Kubernetes name prefix",
                 id="generate-name-not-dns"),
])
def test_shape_problems_are_refused_with_the_field_or_item_named(obj: dict[str, Any], expected: str) -> None:
    message = refused(validate(obj))
    assert expected in message, message


def test_protected_namespaces_are_refused_unless_the_admin_allows_them() -> None:
    config = AdmissionConfig(controller_namespace="mcad-system")
    for namespace in ("kube-system", "kube-public", "kube-node-lease", "mcad-system"):
        obj = aw(cm())
        obj["metadata"]["namespace"] = namespace
        message = refused(validate(obj, config=config, namespace=namespace, user=ADMIN))
        assert message.startswith(f"namespace {namespace} is protected")
    obj = aw(cm())
    obj["metadata"]["namespace"] = "kube-system"
    lifted = AdmissionConfig(controller_namespace="mcad-system", allowed_namespaces=frozenset({"kube-system"}))
    assert validate(obj, config=lifted, namespace="kube-system", user=ADMIN).allowed


def test_a_creator_annotation_that_is_not_the_users_is_refused() -> None:
    obj = aw(cm())
    obj["metadata"]["annotations"] = {CREATOR_ANNOTATION: "bob"}
    assert "metadata.annotations[workload.codeflare.dev/creator] is set by admission" in refused(validate(obj))
    obj["metadata"]["annotations"] = {CREATOR_ANNOTATION: ALICE.username, CREATOR_UID_ANNOTATION: ALICE.uid}
    assert validate(obj).allowed


def test_one_bounded_message_for_all_problems() -> None:
    items = [deployment(name=f"d{i}") for i in range(8)]
    message = refused(validate(aw(*items), FakeFacts(alice_may())))
    assert message.count("may not create deployments.apps") == MAX_REPORTED
    assert message.endswith("; and 3 more problems")
    assert len(bounded_message(["x" * 10_000] * 50)) < MAX_REPORTED * 410 + 40


def test_a_reviewer_never_raises_on_any_json() -> None:
    mutate, check = build(FakeFacts({ALICE.username: "*"}), AdmissionConfig())
    for spec in (None, 1, "x", [], {"resources": None}, {"resources": {"GenericItems": [None, 1, "x", []]}},
                 {"resources": {"GenericItems": [{"generictemplate": {"apiVersion": 1, "kind": [], "metadata": 3}}]}}):
        obj = {"metadata": {"name": "x", "annotations": None}, "spec": spec}
        assert not check(request(obj)).allowed
        assert mutate(request(obj)).allowed


# -- update --------------------------------------------------------------------------------------------------------


def stored(obj: dict[str, Any], user: UserInfo = ALICE) -> dict[str, Any]:
    old = copy.deepcopy(obj)
    old["metadata"].update({"uid": "aw-uid", "resourceVersion": "7", "generation": 1,
                            "annotations": {CREATOR_ANNOTATION: user.username, CREATOR_UID_ANNOTATION: user.uid}})
    return old


def test_items_are_immutable_after_create() -> None:
    old = stored(aw(cm(), deployment()))
    new = copy.deepcopy(old)
    new["spec"]["resources"]["GenericItems"][1]["generictemplate"]["spec"]["template"]["spec"]["containers"][0][
        "image"] = "evil"
    assert refused(validate(new, old=old)).startswith("spec.resources may not change once the AppWrapper is created")
    new = copy.deepcopy(old)
    new["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [{"replicas": 1, "requests": {"cpu": "1m"}}]
    assert refused(validate(new, old=old)).startswith("spec.resources may not change")


@pytest.mark.parametrize("key", ["minAvailable", "dispatchDuration", "clusterScheduling"])
def test_frozen_scheduling_fields_may_not_change(key: str) -> None:
    old = stored(aw(cm(), schedulingSpec={"minAvailable": 1}))
    new = copy.deepcopy(old)
    new["spec"]["schedulingSpec"][key] = {"limit": 5} if key == "dispatchDuration" else (
        {"clusterSelector": {}} if key == "clusterScheduling" else 3)
    assert refused(validate(new, old=old)) == f"spec.schedulingSpec.{key} may not change once the AppWrapper is " \
                                              f"created"


def test_labels_annotations_priority_and_requeuing_may_change() -> None:
    old = stored(aw(cm(), priority=1))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "a"}
    new["metadata"]["annotations"]["note"] = "hello"
    new["spec"]["priority"] = 5
    new["spec"]["schedulingSpec"] = {"requeuing": {"timeInSeconds": 60}}
    assert validate(new, old=old).allowed


def test_creator_annotations_may_not_change() -> None:
    old = stored(aw(cm()))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][CREATOR_ANNOTATION] = "bob"
    assert refused(validate(new, old=old)).startswith(
        "metadata.annotations[workload.codeflare.dev/creator] may not change")
    del new["metadata"]["annotations"][CREATOR_UID_ANNOTATION]
    assert "creator-uid] may not change" in refused(validate(new, old=old))


def test_an_update_is_not_refused_for_what_the_stored_object_already_had() -> None:
    # Alice lost her right to create deployments after the create: she can still relabel her AppWrapper.
    old = stored(aw(deployment()))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    assert validate(new, FakeFacts(alice_may()), old=old).allowed
    # But a new problem is refused.
    new["spec"]["priority"] = 2**40
    # (startswith: the tenancy rules may add their own refusal of such a priority)
    assert refused(validate(new, FakeFacts(alice_may()), old=old)).startswith(
        "spec.priority is 1099511627776; it must be between -2147483648 and 2147483647")


def test_status_finalizer_and_annotation_updates_ask_nothing_and_pass_even_when_facts_fail() -> None:
    old = stored(aw(deployment()))
    new = copy.deepcopy(old)
    new["status"] = {"state": "Running"}
    new["metadata"]["finalizers"] = ["workload.codeflare.dev/finalizer"]
    new["metadata"]["annotations"]["note"] = "x"
    facts = FakeFacts(broken="the API server is down")
    assert validate(new, facts, old=old).allowed
    assert facts.asked == []


def deleting(obj: dict[str, Any]) -> dict[str, Any]:
    obj = stored(obj)
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj["metadata"]["finalizers"] = ["workload.codeflare.dev/finalizer"]
    return obj


def test_an_appwrapper_being_deleted_lets_its_finalizers_and_annotations_go_without_asking() -> None:
    old = deleting(aw(deployment()))
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    new["metadata"]["annotations"]["note"] = "x"
    facts = FakeFacts(broken="down")
    assert validate(new, facts, old=old).allowed
    assert facts.asked == []


@pytest.mark.parametrize(("change", "named"), [
    (lambda o: o["spec"].update(priority=999), "spec (priority included)"),
    (lambda o: o["spec"]["resources"].clear(), "spec (priority included)"),
    (lambda o: o["spec"].update(schedulingSpec={"requeuing": {"timeInSeconds": 5}}), "spec (priority included)"),
    (lambda o: o["metadata"].update(labels={"tenants": "team-b"}), "metadata.labels (quota nodes included)"),
], ids=["priority", "items", "requeuing", "quota-label"])
def test_an_appwrapper_being_deleted_refuses_spec_and_label_changes(change: Any, named: str) -> None:
    old = deleting(aw(deployment()))
    new = copy.deepcopy(old)
    change(new)
    new["metadata"]["finalizers"] = []  # even together with what deletion needs
    message = refused(validate(new, FakeFacts(broken="down"), old=old))
    assert message == (f"the AppWrapper is being deleted (metadata.deletionTimestamp is set): {named} may not change "
                       f"any more; only its finalizers may come off")


# -- the status subresource ----------------------------------------------------------------------------------------

CONTROLLER = UserInfo("system:serviceaccount:mcad-system:mcad", uid="uid-mcad")


def status_write(user: UserInfo, state: str = "Completed") -> AdmissionRequest:
    old = stored(aw(deployment()))
    old["status"] = {"state": "Running"}
    new = copy.deepcopy(old)
    new["status"] = {"state": state}
    return AdmissionRequest(uid="r-2", operation="UPDATE", group="workload.codeflare.dev", namespace="team-a",
                            name="job", user=user, obj=new, old=old, sub_resource="status")


def test_only_the_controller_writes_status() -> None:
    mutate_, check = build(FakeFacts(broken="down"),
                           AdmissionConfig(status_writers=frozenset({CONTROLLER.username})))
    assert check(status_write(CONTROLLER)).allowed
    for user in (ALICE, ADMIN):
        assert refused(check(status_write(user))) == (
            f'user "{user.username}" may not write the status of AppWrappers: only the mcad controller does '
            f"(status records what it decided: the state, when it dispatched, how often it requeued)")
        outcome = mutate_(status_write(user))
        assert outcome.allowed and not outcome.patch  # nothing to set on a status write


def test_without_known_status_writers_nobody_writes_status() -> None:
    _, check = build(FakeFacts(), AdmissionConfig())
    assert not check(status_write(CONTROLLER)).allowed


def test_the_subresource_travels_in_the_review() -> None:
    review = {"request": {"uid": "u", "operation": "UPDATE", "subResource": "status", "object": {"metadata": {}},
                          "userInfo": {"username": "x"}}}
    assert AdmissionRequest.parse(review).sub_resource == "status"
    del review["request"]["subResource"]
    assert AdmissionRequest.parse(review).sub_resource == ""


# -- mutate --------------------------------------------------------------------------------------------------------


def apply_patch(obj: dict[str, Any], operations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Just enough RFC 6902 (add, remove on object members) to check the reviewer's operations."""
    out = copy.deepcopy(obj)
    for op in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for part in parts[:-1]:
            target = target[part]
        if op["op"] == "add":
            target[parts[-1]] = op["value"]
        elif op["op"] == "remove":
            del target[parts[-1]]
        else:
            raise AssertionError(f"unexpected op {op}")
    return out


def mutate(obj: dict[str, Any], **kw: Any) -> Outcome:
    reviewer, _ = build(FakeFacts({ALICE.username: "*"}), AdmissionConfig())
    return reviewer(request(obj, **kw))


def test_create_records_the_creator_in_annotations() -> None:
    obj = aw(cm())
    outcome = mutate(obj)
    assert outcome.allowed
    assert list(outcome.patch) == [{"op": "add", "path": "/metadata/annotations", "value": {
        CREATOR_ANNOTATION: ALICE.username, CREATOR_UID_ANNOTATION: ALICE.uid}}]
    assert apply_patch(obj, outcome.patch)["metadata"]["annotations"] == {
        CREATOR_ANNOTATION: ALICE.username, CREATOR_UID_ANNOTATION: ALICE.uid}


def test_create_overwrites_forged_creator_annotations_with_escaped_keys() -> None:
    obj = aw(cm())
    obj["metadata"]["annotations"] = {CREATOR_ANNOTATION: "bob", CREATOR_UID_ANNOTATION: "uid-bob", "keep": "me"}
    outcome = mutate(obj, user=UserInfo("cert-user"))  # no uid: the forged uid goes
    assert list(outcome.patch) == [
        {"op": "add", "path": "/metadata/annotations/workload.codeflare.dev~1creator", "value": "cert-user"},
        {"op": "remove", "path": "/metadata/annotations/workload.codeflare.dev~1creator-uid"}]
    assert apply_patch(obj, outcome.patch)["metadata"]["annotations"] == {CREATOR_ANNOTATION: "cert-user",
                                                                          "keep": "me"}
    assert pointer("a~b", "c/d") == "/a~0b/c~1d"


def test_update_restores_the_stored_creator() -> None:
    old = stored(aw(cm()))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][CREATOR_ANNOTATION] = "bob"
    del new["metadata"]["annotations"][CREATOR_UID_ANNOTATION]
    outcome = mutate(new, user=ADMIN, old=old)
    assert apply_patch(new, outcome.patch)["metadata"]["annotations"] == old["metadata"]["annotations"]
    # Nothing to restore: no operations.
    assert list(mutate(copy.deepcopy(old), user=ADMIN, old=old).patch) == []
    # An AppWrapper created before the webhook has no creator: one added on update is removed.
    legacy = aw(cm())
    forged = copy.deepcopy(legacy)
    forged["metadata"]["annotations"] = {CREATOR_ANNOTATION: "bob"}
    assert apply_patch(forged, mutate(forged, old=legacy).patch)["metadata"]["annotations"] == {}


def test_the_patch_travels_base64_in_the_response() -> None:
    response = mutate(aw(cm())).response("r-1")["response"]
    assert response["patchType"] == "JSONPatch" and response["allowed"] is True


def test_an_update_without_the_stored_object_is_refused() -> None:
    _, check = build(FakeFacts({ALICE.username: "*"}), AdmissionConfig())
    obj = aw(cm())
    outcome = check(AdmissionRequest(uid="r", operation="UPDATE", group="workload.codeflare.dev", namespace="team-a",
                                     name="job", user=ALICE, obj=obj, old=None))
    assert refused(outcome) == "the update carries no stored AppWrapper (oldObject) to compare with"


def test_the_controller_flags_become_the_admission_config() -> None:
    from mcad.cli.controller import admission_config, protected_namespaces

    config = admission_config("pods, deployments.apps,jobs.batch,", protected_namespaces("mcad-system", ("infra",)),
                              ("infra",))
    assert config.allowed_kinds == frozenset({("", "pods"), ("apps", "deployments"), ("batch", "jobs")})
    assert config.protected("kube-system") and config.protected("kube-public") and config.protected("mcad-system")
    assert not config.protected("infra") and not config.protected("team-a")
    assert admission_config("", frozenset({"kube-system"})).allowed_kinds == frozenset()
    assert admission_config("", frozenset(), status_writers=frozenset({"me"})).status_writers == frozenset({"me"})
    # --default-max-priority: admission refuses above the ceiling the dispatcher caps at (it used the built-in one).
    assert admission_config("", frozenset(), default_max_priority=5000).default_priority_ceiling == 5000
    assert admission_config("", frozenset()).default_priority_ceiling == 1000


def test_a_review_that_runs_out_of_time_refuses_saying_so() -> None:
    now = [0.0]

    class SlowFacts(FakeFacts):
        def may(self, user: UserInfo, verb: str, resource: Resource, namespace: str, name: str = "") -> Decision:
            now[0] += 4.0  # each review takes 4 s
            return super().may(user, verb, resource, namespace, name)

    facts = SlowFacts({ALICE.username: "*"})
    _, check = build(facts, AdmissionConfig(), clock=lambda: now[0])
    message = refused(check(request(aw(cm(), deployment(), {**cm("other"), "kind": "Secret",
                                                             "apiVersion": "v1"}))))
    assert message == "could not check the AppWrapper within 7 s: the API server answers too slowly"
    assert len([a for a in facts.asked if a[0] == "sar"]) == 2


def test_mutate_asks_tenancy_on_create_and_on_updates_of_what_it_judges_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from mcad.model import tenancy

    asked: list[str] = []

    def patch(obj: Mapping[str, Any], facts: Any) -> list[dict[str, Any]]:
        asked.append(obj["metadata"]["name"])
        return [{"op": "add", "path": "/metadata/labels", "value": {"tree": "node"}}]

    monkeypatch.setattr(tenancy, "admission_patch", patch)
    reviewer, _ = build(FakeFacts(broken="down"), AdmissionConfig())
    assert {"op": "add", "path": "/metadata/labels", "value": {"tree": "node"}} in reviewer(request(aw(cm()))).patch
    old = stored(aw(cm()))
    finalizer = copy.deepcopy(old)
    finalizer["metadata"]["finalizers"] = ["x"]
    assert reviewer(request(finalizer, old=old)).allowed
    assert len(asked) == 1
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"tree": "other"}
    assert reviewer(request(relabelled, old=old)).patch
    assert len(asked) == 2


def test_tenancy_refusals_are_reported_on_create_and_on_updates_that_bring_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mcad.model import tenancy

    seen: list[int] = []

    def problems(obj: Mapping[str, Any], facts: Any, ceiling: int) -> list[str]:
        seen.append(ceiling)
        priority = obj["spec"].get("priority", 0)
        return [f"spec.priority {priority} is above the namespace's ceiling {ceiling}"] if priority > ceiling else []

    monkeypatch.setattr(tenancy, "admission_problems", problems)
    config = AdmissionConfig(default_priority_ceiling=100)
    assert refused(validate(aw(cm(), priority=500), config=config)) == \
        "spec.priority 500 is above the namespace's ceiling 100"
    assert seen == [100]
    old = stored(aw(cm(), priority=50))
    raised = copy.deepcopy(old)
    raised["spec"]["priority"] = 500
    assert refused(validate(raised, config=config, old=old)) == "spec.priority 500 is above the namespace's ceiling 100"
    # Stored above the ceiling already (the ceiling was lowered since): a relabel is not refused for it.
    high = stored(aw(cm(), priority=500))
    relabelled = copy.deepcopy(high)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert validate(relabelled, config=config, old=high).allowed


def test_an_appwrapper_nested_hundreds_of_levels_deep_is_refused_clearly() -> None:
    from test.unit.test_validation import _nested
    obj = aw(cm())
    obj["spec"] = _nested(900)["spec"]
    assert refused(validate(obj)) == "the AppWrapper nests objects and arrays more than 100 levels deep; at most 100 " \
                                     "are allowed"
