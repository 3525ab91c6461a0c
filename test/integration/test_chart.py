"""The Helm chart renders what the controller needs and nothing more (helm lint / helm template, no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from test import chart
from test.support import REPO


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
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
    assert sorted(o["kind"] for o in objects) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Role",
                                                  "RoleBinding", "Service", "ServiceAccount"]
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
    assert container["args"] == ["--fit=nodes", "--write-workers=32", "--log-level=info", "--log-format=json",
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
                             "logLevel": "debug", "logFormat": "console", "extraArgs": ["--context=x"],
                             "httpPort": 9090, "quota": False},
              "leaderElection": {"leaseDuration": 4, "renewDeadline": 3, "retryPeriod": 0.5},
              "legacyApi": {"enabled": True}}
    container = by_kind(chart.render(values=values, tmp=tmp_path), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    assert container["args"] == ["--fit=aggregate", "--write-workers=8", "--log-level=debug",
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
    kinds = {o["kind"] for o in objects}
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
