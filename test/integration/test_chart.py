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


def test_the_chart_ships_the_same_crd_as_config() -> None:
    assert (chart.CHART / "crds" / "workload.codeflare.dev_appwrappers.yaml").read_bytes() == \
        (REPO / "config" / "crd" / "workload.codeflare.dev_appwrappers.yaml").read_bytes()


def test_defaults_render_a_hardened_single_controller() -> None:
    objects = chart.render()
    assert sorted(o["kind"] for o in objects) == ["ClusterRole", "ClusterRoleBinding", "Deployment",
                                                  "ServiceAccount"]
    deployment = by_kind(objects, "Deployment")
    assert deployment["metadata"]["namespace"] == chart.NAMESPACE
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == by_kind(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["args"] == ["--fit=nodes", "--write-workers=32", "--log-level=info", "--log-format=json"]
    assert container["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}


def test_every_flag_has_a_value(tmp_path: Path) -> None:
    values = {"controller": {"fit": "aggregate", "preemption": True, "strictFifo": True, "writeWorkers": 8,
                             "logLevel": "debug", "logFormat": "console", "extraArgs": ["--context=x"]}}
    container = by_kind(chart.render(values=values, tmp=tmp_path), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    assert container["args"] == ["--fit=aggregate", "--write-workers=8", "--log-level=debug",
                                 "--log-format=console", "--preemption", "--strict-fifo", "--context=x"]


def test_rbac_grants_only_the_verbs_the_controller_uses(tmp_path: Path) -> None:
    rules = by_kind(chart.render(), "ClusterRole")["rules"]
    assert rules[:3] == [
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers/status"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
    ]
    wrapped = {(group, resource) for rule in rules[3:] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert ("batch", "jobs") in wrapped and ("apps", "deployments") in wrapped
    assert all(rule["verbs"] == ["get", "list", "watch", "create", "patch", "delete"] for rule in rules[3:])
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
    assert ("ServiceAccount" in kinds) == (flag != "serviceAccount.create=false")


def test_chart_yaml_names_the_app_version() -> None:
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert meta["name"] == "mcad" and meta["appVersion"]
