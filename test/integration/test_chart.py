"""The Helm chart renders what the controller needs and nothing more (helm lint / helm template, no cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcad import clusters
from test import chart
from test.support import REPO

ENDPOINT_ACCESS = "endpoint-access"


def endpoint_access(o: dict[str, Any]) -> bool:
    """The RBAC of /metrics and /debug access (templates/endpoint-access.yaml), told apart by a label."""
    return bool((o["metadata"].get("labels") or {}).get("mcad.codeflare.dev/role") == ENDPOINT_ACCESS)


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of ``kind`` besides those of endpoint access."""
    found = [o for o in objects if o["kind"] == kind and not endpoint_access(o)]
    assert len(found) == 1, [o["kind"] for o in objects]
    return found[0]


def test_helm_lint_passes() -> None:
    out = chart.helm("lint", str(chart.CHART), "--strict")
    assert "0 chart(s) failed" in out


CRDS = ["workload.codeflare.dev_appwrappers.yaml", "quota.codeflare.dev_quotasubtrees.yaml"]


@pytest.mark.parametrize("name", CRDS)
def test_the_chart_ships_the_same_crds_as_config(name: str) -> None:
    assert (chart.CHART / "crds" / name).read_bytes() == (REPO / "config" / "crd" / name).read_bytes()


def test_the_chart_ships_no_other_crd() -> None:
    assert sorted(p.name for p in (chart.CHART / "crds").iterdir()) == sorted(CRDS)


def test_quota_crd_serves_v1_and_v1alpha1_with_one_schema() -> None:
    """Upstream's quickstart applies quota.codeflare.dev/v1 and its tests v1alpha1: both must mean the same."""
    crd = yaml.safe_load((REPO / "config" / "crd" / "quota.codeflare.dev_quotasubtrees.yaml").read_text())
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert sorted(versions) == ["v1", "v1alpha1"]
    assert versions["v1alpha1"]["storage"] is True and versions["v1"]["storage"] is False
    assert all(v["served"] for v in versions.values())
    alpha, v1 = (dict(versions[name]) for name in ("v1alpha1", "v1"))
    for version in (alpha, v1):
        del version["name"], version["storage"]
    assert alpha == v1
    assert [c["jsonPath"] for c in v1["additionalPrinterColumns"]] == [
        ".metadata.labels.tree", ".spec.parent", ".metadata.creationTimestamp"]
    assert v1["subresources"] == {"status": {}}


ELECTION_ARGS = ["--leader-elect", f"--leader-elect-lease-name={chart.LEASE}", "--leader-elect-lease-duration=15",
                 "--leader-elect-renew-deadline=10", "--leader-elect-retry-period=2"]


def test_defaults_render_two_hardened_controllers_with_leader_election() -> None:
    objects = chart.render()
    assert sorted(o["kind"] for o in objects if not endpoint_access(o)) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    deployment = by_kind(objects, "Deployment")
    assert deployment["metadata"]["name"] == "mcad-controller"
    assert deployment["metadata"]["namespace"] == chart.NAMESPACE
    assert deployment["spec"]["replicas"] == 2
    # A new pod joins as a standby and the old leader hands over: rolling is safe with leader election.
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == by_kind(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["args"] == ["--fit=nodes", "--write-workers=32", "--max-items=1000",
                                 "--max-appwrapper-bytes=1310720", "--log-level=info", "--log-format=json",
                                 "--http-bind-address=:8080", *ELECTION_ARGS]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = by_kind(objects, "Service")
    assert service["metadata"]["name"] == "mcad-controller"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert container["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    assert container["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}
    assert "PodDisruptionBudget" not in {o["kind"] for o in objects}


def test_every_flag_has_a_value(tmp_path: Path) -> None:
    values = {"controller": {"fit": "aggregate", "preemption": True, "strictFifo": True, "writeWorkers": 8,
                             "maxItems": 50, "maxAppwrapperBytes": 2097152,
                             "logLevel": "debug", "logFormat": "console", "extraArgs": ["--context=x"],
                             "httpPort": 9090, "quota": False},
              "leaderElection": {"leaseDuration": 4, "renewDeadline": 3, "retryPeriod": 0.5},
              "legacyApi": {"enabled": True}}
    container = by_kind(chart.render(values=values, tmp=tmp_path), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    assert container["args"] == ["--fit=aggregate", "--write-workers=8", "--max-items=50",
                                 "--max-appwrapper-bytes=2097152", "--log-level=debug",
                                 "--log-format=console", "--preemption", "--strict-fifo",
                                 "--http-bind-address=:9090", "--no-quota", "--legacy-api",
                                 "--leader-elect", f"--leader-elect-lease-name={chart.LEASE}",
                                 "--leader-elect-lease-duration=4", "--leader-elect-renew-deadline=3",
                                 "--leader-elect-retry-period=0.5", "--context=x"]


def test_the_lease_role_grants_exactly_what_the_elector_uses() -> None:
    objects = chart.render()
    role = by_kind(objects, "Role")
    assert role["metadata"]["namespace"] == chart.NAMESPACE
    # create cannot be limited by name (the name is unknown when it is authorized); get/update are, to one Lease.
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [chart.LEASE],
         "verbs": ["get", "update"]},
    ]
    binding = by_kind(objects, "RoleBinding")
    assert binding["metadata"]["namespace"] == chart.NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": by_kind(objects, "ServiceAccount")[
        "metadata"]["name"], "namespace": chart.NAMESPACE}]


def test_without_leader_election_one_replica_recreated_and_no_lease_role() -> None:
    objects = chart.render("leaderElection.enabled=false", "replicaCount=1")
    kinds = {o["kind"] for o in objects if not endpoint_access(o)}
    assert "Role" not in kinds and "RoleBinding" not in kinds
    deployment = by_kind(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--leader-elect")]


def test_several_replicas_without_leader_election_are_refused() -> None:
    with pytest.raises(RuntimeError, match=r"replicaCount > 1 needs leaderElection\.enabled"):
        chart.render("leaderElection.enabled=false")


def test_rbac_grants_only_the_verbs_the_controller_uses(tmp_path: Path) -> None:
    rules = by_kind(chart.render(), "ClusterRole")["rules"]
    assert rules[:6] == [
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers/status"], "verbs": ["get", "patch"]},
        # Quota trees are read, never written, except the status that shows what each node uses.
        {"apiGroups": ["quota.codeflare.dev"], "resources": ["quotasubtrees"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["quota.codeflare.dev"], "resources": ["quotasubtrees/status"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    wrapped = {(group, resource) for rule in rules[6:] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert ("batch", "jobs") in wrapped and ("apps", "deployments") in wrapped
    assert all(rule["verbs"] == ["get", "list", "watch", "create", "patch", "delete"] for rule in rules[6:])
    for rule in rules:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert not {"update", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_extra_wrapped_kinds_are_granted(tmp_path: Path) -> None:
    values = {"rbac": {"extraWrappedKinds": [{"apiGroups": ["ray.io"], "resources": ["rayclusters"]}]}}
    rules = by_kind(chart.render(values=values, tmp=tmp_path), "ClusterRole")["rules"]
    assert {"apiGroups": ["ray.io"], "resources": ["rayclusters"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"]} in rules


@pytest.mark.parametrize("flag", ["rbac.create=false", "serviceAccount.create=false"])
def test_rbac_and_account_can_be_brought_by_the_platform(flag: str) -> None:
    kinds = {o["kind"] for o in chart.render(flag)}
    assert ("ClusterRole" in kinds) == (flag != "rbac.create=false")
    assert ("Role" in kinds) == (flag != "rbac.create=false")
    assert ("ServiceAccount" in kinds) == (flag != "serviceAccount.create=false")


def test_chart_yaml_names_the_app_version() -> None:
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert meta["name"] == "mcad" and meta["appVersion"]


def test_the_legacy_api_is_off_by_default_and_complete_when_on() -> None:
    assert not [o for o in chart.render() if o["kind"] == "CustomResourceDefinition"], "crds/ is not rendered"
    objects = chart.render("legacyApi.enabled=true")
    crd = by_kind(objects, "CustomResourceDefinition")
    expected = yaml.safe_load((REPO / "config" / "crd" / "legacy" / "mcad.ibm.com_mcadappwrappers.yaml").read_text())
    # Kept on uninstall, like the CRDs of crds/: deleting it would delete every legacy AppWrapper.
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert crd == expected
    rules = by_kind(objects, "ClusterRole")["rules"]
    assert {"apiGroups": ["mcad.ibm.com"], "resources": ["mcadappwrappers"], "verbs": ["get", "list", "watch"]} in rules
    assert {"apiGroups": ["mcad.ibm.com"], "resources": ["mcadappwrappers/status"], "verbs": ["get", "patch"]} in rules
    args = by_kind(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--legacy-api" in args
    managed = chart.render("legacyApi.enabled=true", "legacyApi.installCRD=false")
    assert "CustomResourceDefinition" not in {o["kind"] for o in managed}
    assert by_kind(managed, "ClusterRole")["rules"] == rules


# -- hub mode --------------------------------------------------------------------------------------------------------

HUB_CONFIG = {"workers": [{"name": "east", "labels": {"region": "us-east"}, "secret": {"name": "east-kubeconfig"}},
                          {"name": "west", "secret": {"name": "west-kubeconfig", "key": "config",
                                                      "namespace": chart.NAMESPACE}},
                          # Two workers may share one Secret (different keys): it is granted once.
                          {"name": "north", "secret": {"name": "east-kubeconfig", "key": "north"}}],
              "unreachableTimeoutSeconds": 120, "policy": "first"}
HUB_RULES = [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"], "verbs": ["patch", "update"]},
             {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers/finalizers"], "verbs": ["update"]}]


def hub_values(**hub: Any) -> dict[str, Any]:
    return {"hub": {"enabled": True, "config": HUB_CONFIG, **hub}}


def controller_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(objects, "Deployment")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_hub_off_renders_nothing_of_hub_mode() -> None:
    objects = chart.render()
    assert "ConfigMap" not in {o["kind"] for o in objects}
    pod = controller_pod(objects)
    assert "volumes" not in pod and "volumeMounts" not in pod["containers"][0]
    assert not [a for a in pod["containers"][0]["args"] if a.startswith("--cluster")]
    assert "annotations" not in by_kind(objects, "Deployment")["spec"]["template"]["metadata"]
    rules = by_kind(objects, "ClusterRole")["rules"]
    assert not [r for r in rules if "secrets" in r["resources"] and r.get("resourceNames")]
    assert not [r for r in HUB_RULES if r in rules]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Role" and not endpoint_access(o)] == [
        "mcad-controller-leader-election"]


def test_hub_on_mounts_the_clusters_file_the_controller_can_load(tmp_path: Path) -> None:
    objects = chart.render(values=hub_values(policy="spread", probePeriodSeconds=5), tmp=tmp_path)
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    assert config_map["metadata"] == {**config_map["metadata"], "name": "mcad-hub", "namespace": chart.NAMESPACE}
    text = config_map["data"]["clusters.yaml"]
    assert yaml.safe_load(text) == HUB_CONFIG
    # The controller's own loader accepts what the chart renders.
    (tmp_path / "clusters.yaml").write_text(text)
    loaded = clusters.load_config(tmp_path / "clusters.yaml")
    assert [w.name for w in loaded.workers] == ["east", "west", "north"]
    assert loaded.workers[1].secret == clusters.SecretRef("west-kubeconfig", chart.NAMESPACE, "config")
    pod = controller_pod(objects)
    container = pod["containers"][0]
    assert container["args"][-3:] == ["--clusters-config=/etc/mcad/hub/clusters.yaml", "--cluster-policy=spread",
                                      "--cluster-probe-period=5"]
    assert container["volumeMounts"] == [{"name": "hub-config", "mountPath": "/etc/mcad/hub", "readOnly": True},
                                         {"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "hub-config", "configMap": {"name": "mcad-hub"}},
                              {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
    # The root filesystem stays read-only: only the memory-backed /tmp is writable (for Secret kubeconfigs).
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_hub_policy_flag_only_when_set_and_config_changes_roll_the_pods(tmp_path: Path) -> None:
    objects = chart.render(values=hub_values(), tmp=tmp_path)
    args = controller_pod(objects)["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--cluster-policy")], "the file's policy applies"
    assert "--cluster-probe-period=2" in args
    annotations = by_kind(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    changed = {**HUB_CONFIG, "unreachableTimeoutSeconds": 60}
    other = chart.render(values={"hub": {"enabled": True, "config": changed}, "podAnnotations": {"team": "ml"}},
                         tmp=tmp_path)
    other_annotations = by_kind(other, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert other_annotations["team"] == "ml"
    assert other_annotations["checksum/hub-config"] != annotations["checksum/hub-config"]


def test_hub_role_reads_exactly_the_workers_secrets(tmp_path: Path) -> None:
    objects = chart.render(values=hub_values(), tmp=tmp_path)
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "mcad-hub-kubeconfigs")
    assert role["metadata"]["namespace"] == chart.NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["east-kubeconfig", "west-kubeconfig"], "verbs": ["get"]}]
    binding = next(o for o in objects if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == "mcad-hub-kubeconfigs")
    assert binding["metadata"]["namespace"] == chart.NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mcad", "namespace": chart.NAMESPACE}]
    rules = by_kind(objects, "ClusterRole")["rules"]
    assert rules[2:4] == HUB_RULES, "the finalizer needs patch/update of AppWrappers and update of finalizers"
    # Nothing else widens: secrets are granted only through the Role, by name.
    assert chart.render(values={"hub": {"enabled": False, "config": HUB_CONFIG}}, tmp=tmp_path) == chart.render()
    assert not [o for o in chart.render(values={**hub_values(), "rbac": {"create": False}}, tmp=tmp_path)
                if o["kind"] in ("Role", "RoleBinding", "ClusterRole")]


@pytest.mark.parametrize(("config", "message"), [
    ({"workers": []}, r"hub\.enabled needs at least one worker in hub\.config\.workers"),
    ({"workers": [{"name": "east", "kubeconfig": "/etc/east.kubeconfig"}]},
     r"east needs secret\.name: .*a kubeconfig file is not mounted"),
    ({"workers": [{"name": "east", "secret": {"name": "e", "namespace": "elsewhere"}}]},
     r"east: secret\.namespace elsewhere is not the release namespace mcad-system"),
])
def test_hub_config_the_chart_cannot_serve_is_refused(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        chart.render(values={"hub": {"enabled": True, "config": config}}, tmp=tmp_path)


def test_unknown_hub_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"hub\.policy must be first, best, spread"):
        chart.render(values=hub_values(policy="worst"), tmp=tmp_path)


def test_helm_lint_passes_in_hub_mode(tmp_path: Path) -> None:
    values = tmp_path / "hub.json"
    values.write_text(json.dumps(hub_values()))
    out = chart.helm("lint", str(chart.CHART), "--strict", "--namespace", chart.NAMESPACE, "--values", str(values))
    assert "0 chart(s) failed" in out


def test_endpoint_access_lets_the_controller_review_and_readers_read() -> None:
    objects = [o for o in chart.render() if endpoint_access(o)]
    named = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert sorted(named) == [("ClusterRole", "mcad-access-reviews"), ("ClusterRole", "mcad-debug-viewer"),
                             ("ClusterRole", "mcad-metrics-reader"), ("ClusterRoleBinding", "mcad-access-reviews"),
                             ("Role", "mcad-debug-client")]
    assert named[("ClusterRole", "mcad-access-reviews")]["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]
    assert named[("ClusterRoleBinding", "mcad-access-reviews")]["subjects"] == [
        {"kind": "ServiceAccount", "name": "mcad", "namespace": chart.NAMESPACE}]
    assert named[("ClusterRole", "mcad-metrics-reader")]["rules"] == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert named[("ClusterRole", "mcad-debug-viewer")]["rules"][0] == {"nonResourceURLs": ["/debug/*"],
                                                                       "verbs": ["get"]}
    assert named[("Role", "mcad-debug-client")]["metadata"]["namespace"] == chart.NAMESPACE
    args = by_kind(chart.render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--insecure-debug-endpoints" not in args


def test_the_service_monitor_sends_prometheus_token_and_may_bind_its_account(tmp_path: Path) -> None:
    values = {"serviceMonitor": {"enabled": True,
                                 "prometheusServiceAccount": {"name": "prometheus-k8s", "namespace": "monitoring"}}}
    objects = chart.render(values=values, tmp=tmp_path)
    monitor = by_kind(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    binding = next(o for o in objects if o["kind"] == "ClusterRoleBinding"
                   and o["metadata"]["name"] == "mcad-metrics-reader")
    assert binding["roleRef"]["name"] == "mcad-metrics-reader"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]
    secret = {"type": "Bearer", "credentials": {"name": "prom-token", "key": "token"}}
    values["serviceMonitor"]["authorization"] = secret
    monitor = by_kind(chart.render(values=values, tmp=tmp_path), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["authorization"] == secret
    assert "bearerTokenFile" not in monitor["spec"]["endpoints"][0]
