"""The Helm chart renders what the controller needs and nothing more (helm lint / helm template, no cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from mcad.api import minruntime
from mcad.api.faulttolerance import DEFAULTS, FaultDefaults, format_duration
from mcad.cli import faultflags
from mcad.cli.settingsflags import node_health_from_flags
from mcad.hub import clusters
from mcad.loop.evictions import DEFAULT_PREEMPTION_COOLDOWN_SECONDS
from mcad.model.nodehealth import DEFAULT_RULES
from mcad.model.reservations import DEFAULT_RESERVATIONS
from test import chart
from test.support import REPO

ENDPOINT_ACCESS = "endpoint-access"
# What the chart passes by default: Autopilot's rules, spelled out.
AUTOPILOT_RULE_ARGS = ("--node-health-rule=nvidia.com/gpu:autopilot.ibm.com/gpuhealth=WARN:PreferNoSchedule",
                       "--node-health-rule=nvidia.com/gpu:autopilot.ibm.com/gpuhealth=TESTING:NoSchedule",
                       "--node-health-rule=nvidia.com/gpu:autopilot.ibm.com/gpuhealth=EVICT:NoExecute")


def endpoint_access(o: dict[str, Any]) -> bool:
    """The RBAC of /metrics and /debug access (templates/endpoint-access.yaml), told apart by a label."""
    return bool((o["metadata"].get("labels") or {}).get("mcad.codeflare.dev/role") == ENDPOINT_ACCESS)


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of ``kind`` besides those of endpoint access."""
    found = [o for o in objects if o["kind"] == kind and not endpoint_access(o)]
    assert len(found) == 1, [o["kind"] for o in objects]
    return found[0]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, [(o["kind"], o["metadata"]["name"]) for o in objects]
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


WEBHOOK_ARGS = ["--webhook-bind-address=:9443", "--webhook-configuration-name=mcad",
                "--webhook-service-name=mcad-controller", "--webhook-cert-poll-seconds=30",
                "--webhook-cert-secret=mcad-webhook-cert",
                # Admission allows the kinds the controller is granted, nothing else.
                "--admission-allowed-kinds=pods,services,configmaps,persistentvolumeclaims,secrets,deployments.apps,"
                "statefulsets.apps,replicasets.apps,jobs.batch"]
# The cluster's fault tolerance defaults and ceilings (faultTolerance), upstream AppWrapper's.
FAULT_ARGS = ["--admission-grace-period=60s", "--warmup-grace-period=5m", "--failure-grace-period=1m",
              "--retry-pause-period=90s", "--retry-limit=3", "--forceful-deletion-grace-period=10m",
              "--deletion-on-failure-grace-period=0s", "--success-ttl=168h", "--grace-period-ceiling=24h",
              "--success-ttl-ceiling=168h", "--retry-pause-floor=10s", "--grace-period-floor=10s",
              "--max-resets-per-namespace-per-minute=20", "--keep-finished-appwrappers"]
# Admission asks the API server whether the requesting user may create each item; the controller's own CA goes
# into its two webhook configurations (by name) and nowhere else.
WEBHOOK_RULES = [
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    {"apiGroups": ["admissionregistration.k8s.io"],
     "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"], "resourceNames": ["mcad"],
     "verbs": ["get", "patch"]}]


# The ClusterRole's rules before the webhooks' (see test_rbac_grants_only_the_verbs_the_controller_uses).
BASE_RULES = 8


ELECTION_ARGS = ["--leader-elect", f"--leader-elect-lease-name={chart.LEASE}", "--leader-elect-lease-duration=15",
                 "--leader-elect-renew-deadline=10", "--leader-elect-retry-period=2", "--leader-elect-label-pod"]


def test_defaults_render_two_hardened_controllers_with_leader_election() -> None:
    objects = chart.render()
    assert sorted(o["kind"] for o in objects if not endpoint_access(o)) == [
                                                  "ClusterRole", "ClusterRole", "ClusterRoleBinding",
                                                  "ClusterRoleBinding", "Deployment",
                                                  "MutatingWebhookConfiguration", "NetworkPolicy", "Role", "Role",
                                                  "RoleBinding", "RoleBinding", "Secret", "Service", "ServiceAccount",
                                                  "ValidatingWebhookConfiguration"]
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
    assert container["args"] == ["--fit=nodes", "--placement=binding", *AUTOPILOT_RULE_ARGS,
                                 "--write-workers=32", "--backoff-status-rate=10", "--cycle-interval=0.05",
                                 "--max-items=1000",
                                 "--default-max-priority=1000",
                                 "--max-appwrapper-bytes=1310720", "--log-level=info", "--log-format=json",
                                 f"--reservations={DEFAULT_RESERVATIONS}", *FAULT_ARGS,
                                 "--preemption-min-runtime-ceiling=1h",
                                 "--http-bind-address=:8080",
                                 *ELECTION_ARGS, *WEBHOOK_ARGS]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                                  {"name": "webhook", "containerPort": 9443, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = by_kind(objects, "Service")
    assert service["metadata"]["name"] == "mcad-controller"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"},
                                        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert container["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # What the e2e controllers run with too (test/e2e/conftest.py CONTROLLER_ENV).
        {"name": "PYTHONMALLOC", "value": "malloc"},
    ]
    assert container["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}
    assert "PodDisruptionBudget" not in {o["kind"] for o in objects}


def test_every_flag_has_a_value(tmp_path: Path) -> None:
    values = {"controller": {"fit": "aggregate", "placement": "advisory", "preemption": True, "strictFifo": True,
                             "preemptionVictimTimeoutSeconds": 45, "preemptionBackoffSeconds": 30,
                             "maxEvictionsPerMinute": 20, "preemptionMinRuntime": "5m",
                             "preemptionMinRuntimeCeiling": "2h", "preemptionCooldown": "15m", "writeWorkers": 8,
                             "backoffStatusRate": 2.5, "cycleIntervalSeconds": 0.2, "reservations": 5,
                             "maxItems": 50, "maxAppwrapperBytes": 2097152,
                             "allowedSchedulerNames": ["volcano", "kueue-scheduler"],
                             "logLevel": "debug", "logFormat": "console", "extraArgs": ["--context=x"],
                             "httpPort": 9090, "quota": False},
              "leaderElection": {"leaseDuration": 4, "renewDeadline": 3, "retryPeriod": 0.5},
              "legacyApi": {"enabled": True},
              "webhook": {"port": 8443, "certHosts": ["127.0.0.1", "mcad.example.com"], "certPollSeconds": 5},
              "admission": {"anyKind": True},
              "faultTolerance": {"admissionGracePeriod": "30s", "warmupGracePeriod": "1h", "failureGracePeriod": "2m",
                                 "retryPausePeriod": 0, "retryLimit": 7, "forcefulDeletionGracePeriod": "1h30m",
                                 "deletionOnFailureGracePeriod": "500ms", "successTTL": "48h",
                                 "gracePeriodCeiling": "2h", "successTTLCeiling": "72h",
                                 "retryPauseFloor": 0, "gracePeriodFloor": "5s",
                                 "maxResetsPerNamespacePerMinute": 7, "deleteFinishedAppWrappers": True},
              "nodeHealth": {"rules": ["example.com/fpga:fpga.example.com/health=bad:NoSchedule"]},
              "topology": {"levels": ["example.com/block", "example.com/rack"]},
              "scheduling": {"fairSharing": True, "fairSharingHalfLife": "30m"}}
    objects = chart.render(values=values, tmp=tmp_path)
    container = by_kind(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    [fair_role] = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "mcad-controller-fair-share"]
    assert fair_role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["mcad-controller-fair-share"],
         "verbs": ["get", "patch"]}]
    assert container["args"] == ["--fit=aggregate", "--placement=advisory",
                                 "--fair-sharing", "--fair-sharing-half-life=30m",
                                 "--fair-sharing-configmap=mcad-controller-fair-share",
                                 "--topology-level=example.com/block", "--topology-level=example.com/rack",
                                 "--node-health-rule=example.com/fpga:fpga.example.com/health=bad:NoSchedule",
                                 "--write-workers=8", "--backoff-status-rate=2.5", "--cycle-interval=0.2",
                                 "--max-items=50",
                                 "--default-max-priority=1000", "--max-appwrapper-bytes=2097152",
                                 "--allowed-scheduler-names=volcano,kueue-scheduler", "--log-level=debug",
                                 "--log-format=console", "--reservations=5",
                                 "--admission-grace-period=30s", "--warmup-grace-period=1h",
                                 "--failure-grace-period=2m", "--retry-pause-period=0", "--retry-limit=7",
                                 "--forceful-deletion-grace-period=1h30m", "--deletion-on-failure-grace-period=500ms",
                                 "--success-ttl=48h", "--grace-period-ceiling=2h", "--success-ttl-ceiling=72h",
                                 "--retry-pause-floor=0", "--grace-period-floor=5s",
                                 "--max-resets-per-namespace-per-minute=7",
                                 "--delete-finished-appwrappers", "--preemption", "--preemption-victim-timeout=45",
                                 "--preemption-backoff=30",
                                 "--preemption-max-evictions-per-minute=20", "--preemption-min-runtime=5m",
                                 "--preemption-cooldown=15m", "--preemption-min-runtime-ceiling=2h", "--strict-fifo",
                                 "--http-bind-address=:9090", "--no-quota", "--legacy-api",
                                 "--leader-elect", f"--leader-elect-lease-name={chart.LEASE}",
                                 "--leader-elect-lease-duration=4", "--leader-elect-renew-deadline=3",
                                 "--leader-elect-retry-period=0.5", "--leader-elect-label-pod",
                                 "--webhook-bind-address=:8443",
                                 "--webhook-configuration-name=mcad", "--webhook-service-name=mcad-controller",
                                 "--webhook-cert-poll-seconds=5", "--webhook-cert-secret=mcad-webhook-cert",
                                 "--webhook-cert-hosts=127.0.0.1,mcad.example.com",
                                 "--context=x"]


def fault_defaults_of(args: list[str]) -> FaultDefaults:
    """What the controller makes of the fault tolerance flags among ``args`` (its own flag parser)."""
    seen: list[FaultDefaults] = []

    @click.command(context_settings={"ignore_unknown_options": True})
    @click.argument("others", nargs=-1, type=click.UNPROCESSED)
    @faultflags.options
    def command(others: tuple[str, ...], **values: Any) -> None:
        seen.append(faultflags.fault_defaults(values))

    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_the_charts_fault_tolerance_values_are_the_controllers_defaults_and_reach_it(tmp_path: Path) -> None:
    args = by_kind(chart.render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert fault_defaults_of(args) == DEFAULTS
    values = {"faultTolerance": {"failureGracePeriod": "36h", "gracePeriodCeiling": "48h", "retryLimit": 0,
                                 "successTTL": "1h", "deleteFinishedAppWrappers": True, "retryPauseFloor": "1m",
                                 "gracePeriodFloor": "30s"}}
    args = by_kind(chart.render(values=values, tmp=tmp_path), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert fault_defaults_of(args) == FaultDefaults(failure_grace=36 * 3600, grace_ceiling=48 * 3600, retry_limit=0,
                                                    success_ttl=3600, delete_when_finished=True,
                                                    retry_pause_floor=60, grace_floor=30)


@pytest.mark.parametrize(("values", "message"), [
    ({"failureGracePeriod": "5min"}, r'faultTolerance\.failureGracePeriod: "5min" is not a duration'),
    ({"successTTL": "7d"}, r'faultTolerance\.successTTL: "7d" is not a duration'),
    ({"gracePeriodCeiling": "-1h"}, r'faultTolerance\.gracePeriodCeiling: "-1h" is not a duration'),
    ({"retryPauseFloor": "10"}, r'faultTolerance\.retryPauseFloor: "10" is not a duration'),
    ({"maxResetsPerNamespacePerMinute": -1},
     r'faultTolerance\.maxResetsPerNamespacePerMinute: "-1" is not a non-negative integer'),
    ({"retryLimit": "three"}, r'faultTolerance\.retryLimit: "three" is not an integer in 0\.\.1000'),
    ({"retryLimit": -1}, r'faultTolerance\.retryLimit: "-1" is not an integer'),
    ({"deleteFinishedAppWrappers": "yes"}, r"faultTolerance\.deleteFinishedAppWrappers must be true or false"),
])
def test_fault_tolerance_values_that_are_no_flag_value_are_refused(tmp_path: Path, values: dict[str, Any],
                                                                   message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        chart.render(values={"faultTolerance": values}, tmp=tmp_path)


def test_node_health_rules_default_to_autopilots_and_an_empty_list_turns_them_off(tmp_path: Path) -> None:
    # The controller parses what the chart renders, into its own defaults.
    assert node_health_from_flags(tuple(arg.split("=", 1)[1] for arg in AUTOPILOT_RULE_ARGS), False).rules == \
        DEFAULT_RULES
    values = {"nodeHealth": {"rules": []}}
    args = by_kind(chart.render(values=values, tmp=tmp_path), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--no-node-health-rules" in args
    assert not [arg for arg in args if arg.startswith("--node-health-rule=")]


def test_the_lease_role_grants_exactly_what_the_elector_uses() -> None:
    objects = chart.render()
    role = named(objects, "Role", "mcad-controller-leader-election")
    assert role["metadata"]["namespace"] == chart.NAMESPACE
    # create cannot be limited by name (the name is unknown when it is authorized); get/update are, to one Lease.
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [chart.LEASE],
         "verbs": ["get", "update"]},
        # The leader's label on its own pod (--leader-elect-label-pod), for the Service <name>-leader.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
    ]
    binding = named(objects, "RoleBinding", "mcad-controller-leader-election")
    assert binding["metadata"]["namespace"] == chart.NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": by_kind(objects, "ServiceAccount")[
        "metadata"]["name"], "namespace": chart.NAMESPACE}]


def test_without_leader_election_one_replica_recreated_and_no_lease_role() -> None:
    objects = chart.render("leaderElection.enabled=false", "replicaCount=1")
    assert [o["metadata"]["name"] for o in objects if o["kind"] in ("Role", "RoleBinding")
                                         and not endpoint_access(o)] == [
        "mcad-controller-webhook-cert", "mcad-controller-webhook-cert"]
    deployment = by_kind(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--leader-elect")]


def test_several_replicas_without_leader_election_are_refused() -> None:
    with pytest.raises(RuntimeError, match=r"replicaCount > 1 needs leaderElection\.enabled"):
        chart.render("leaderElection.enabled=false")


def test_rbac_grants_only_the_verbs_the_controller_uses(tmp_path: Path) -> None:
    objects = chart.render()
    rules = named(objects, "ClusterRole", chart.RELEASE)["rules"]
    assert rules[:BASE_RULES] == [
        # delete: delete-when-finished (fault tolerance) deletes the AppWrapper once its objects are deleted on time.
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
         "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers/status"], "verbs": ["get", "patch"]},
        # Quota trees are read, never written, except the status that shows what each node uses.
        {"apiGroups": ["quota.codeflare.dev"], "resources": ["quotasubtrees"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["quota.codeflare.dev"], "resources": ["quotasubtrees/status"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
        # The namespace admins' rules (quota binding, priority ceiling) and PriorityClasses: read only.
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    assert rules[BASE_RULES:BASE_RULES + 2] == WEBHOOK_RULES
    # Watched (label-selected) for completion, failure and missing objects: the kinds that report completion, and
    # the core kinds an AppWrapper usually wraps, never Secrets.
    assert rules[BASE_RULES + 2:] == [
        {"apiGroups": [""], "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "watch"]},
    ]
    wrapped = named(objects, "ClusterRole", f"{chart.RELEASE}-wrapped")["rules"]
    kinds = {(group, resource) for rule in wrapped for group in rule["apiGroups"] for resource in rule["resources"]}
    assert {("batch", "jobs"), ("apps", "deployments"), ("", "secrets")} <= kinds
    # --placement=binding: the pods' ungate is a patch, a re-planned pin a delete (and nothing else of pods').
    assert wrapped[-1] == {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch", "delete"]}
    # Secrets are created and deleted, never read (not get, nor patch, which answers with the object).
    secrets = [rule for rule in wrapped if "secrets" in rule["resources"]]
    assert secrets == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]}]
    assert all(rule["verbs"] == ["get", "create", "patch", "delete"] for rule in wrapped[:-1] if rule not in secrets)
    advisory = named(chart.render(values={"controller": {"placement": "advisory"}}, tmp=tmp_path), "ClusterRole",
                     f"{chart.RELEASE}-wrapped")["rules"]
    assert advisory == wrapped[:-1], "advisory placement patches no pod"
    for rule in rules + wrapped:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert not {"update", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
    binding = named(objects, "ClusterRoleBinding", f"{chart.RELEASE}-wrapped")
    assert binding["roleRef"]["name"] == f"{chart.RELEASE}-wrapped"


def test_no_secret_is_listed_or_watched_anywhere() -> None:
    """The controller may list and watch no Secret anywhere. The hub's worker kubeconfigs are read by name in the
    release namespace (a Role, see test_hub_role_reads_exactly_the_workers_secrets)."""
    for obj in chart.render():
        for rule in obj.get("rules") or []:
            if "" in rule.get("apiGroups", ()) and "secrets" in rule.get("resources", ()):  # nonResourceURLs too
                assert not {"list", "watch"} & set(rule["verbs"]), (obj["kind"], obj["metadata"]["name"], rule)
                assert obj["kind"] == "Role" or "resourceNames" not in rule


def test_no_secret_is_readable_outside_the_release_namespace() -> None:
    """No rule lets the controller get a Secret outside its release namespace (a wrapped kinds' rule with get on
    Secrets, bound cluster-wide, would). Every rule that could
    read a Secret (get, or patch/update, which answer with the object) is a Role's, on Secrets named in it."""
    for obj in chart.render():
        for rule in obj.get("rules") or []:
            secret = "" in rule.get("apiGroups", ()) and "secrets" in rule.get("resources", ())
            if secret and {"get", "patch", "update"} & set(rule["verbs"]):
                assert obj["kind"] == "Role" and rule.get("resourceNames"), (obj["metadata"]["name"], rule)
                assert obj["metadata"]["namespace"] == chart.NAMESPACE


def test_wrapped_kind_verbs_may_be_narrowed_but_not_widened(tmp_path: Path) -> None:
    values = {"rbac": {"extraWrappedKinds": [{"apiGroups": ["example.com"], "resources": ["widgets"],
                                              "verbs": ["create", "delete"]}]}}
    wrapped = named(chart.render(values=values, tmp=tmp_path), "ClusterRole", f"{chart.RELEASE}-wrapped")["rules"]
    assert {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["create", "delete"]} in wrapped
    for verbs, words in ((["create"], "must include create and delete"),
                         (["create", "delete", "update"], 'verb "update" of a wrapped kind is none')):
        values["rbac"]["extraWrappedKinds"][0]["verbs"] = verbs
        with pytest.raises(RuntimeError, match=words):
            chart.render(values=values, tmp=tmp_path)


def test_watching_secrets_is_refused(tmp_path: Path) -> None:
    values = {"rbac": {"extraWrappedKinds": [{"apiGroups": [""], "resources": ["secrets"], "watch": True}]}}
    with pytest.raises(RuntimeError, match="Secrets cannot be watched"):
        chart.render(values=values, tmp=tmp_path)


def test_extra_wrapped_kinds_are_granted(tmp_path: Path) -> None:
    values = {"rbac": {"extraWrappedKinds": [{"apiGroups": ["ray.io"], "resources": ["rayclusters"], "watch": True},
                                             {"apiGroups": ["example.com"], "resources": ["widgets"]}]}}
    objects = chart.render(values=values, tmp=tmp_path)
    wrapped = named(objects, "ClusterRole", f"{chart.RELEASE}-wrapped")["rules"]
    watched = named(objects, "ClusterRole", chart.RELEASE)["rules"]
    assert {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "create", "patch", "delete"]} \
        in wrapped
    assert {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["list", "watch"]} in watched
    assert {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "create", "patch", "delete"]} \
        in wrapped
    assert not [r for r in watched if r["apiGroups"] == ["example.com"]], "not watched unless asked"


def test_write_rights_can_be_bound_per_namespace_instead_of_cluster_wide(tmp_path: Path) -> None:
    objects = chart.render(values={"rbac": {"namespaces": ["team-a", "team-b"]}}, tmp=tmp_path)
    assert not [o for o in objects if o["kind"] == "ClusterRoleBinding"
                and o["metadata"]["name"] == f"{chart.RELEASE}-wrapped"], "no cluster-wide write rights"
    bindings = [o for o in objects
                if o["kind"] == "RoleBinding" and o["metadata"]["name"] == f"{chart.RELEASE}-wrapped"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": f"{chart.RELEASE}-wrapped"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": chart.RELEASE,
                                        "namespace": chart.NAMESPACE}]
    # Reading (the ledger, completion) stays cluster-wide.
    assert named(objects, "ClusterRoleBinding", chart.RELEASE)["roleRef"]["name"] == chart.RELEASE


def test_protected_namespaces_can_be_allowed(tmp_path: Path) -> None:
    values = {"controller": {"allowProtectedNamespaces": ["kube-system", "ops"]}}
    args = by_kind(chart.render(values=values, tmp=tmp_path), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert [a for a in args if "protected" in a] == ["--allow-protected-namespace=kube-system",
                                                      "--allow-protected-namespace=ops"]
    assert not [a for a in by_kind(chart.render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
                if "protected" in a]


def test_the_admission_allowlist_follows_the_granted_kinds(tmp_path: Path) -> None:
    values = {"rbac": {"extraWrappedKinds": [{"apiGroups": ["ray.io", "kubeflow.org"],
                                              "resources": ["rayclusters", "pytorchjobs"]}]}}
    args = by_kind(chart.render(values=values, tmp=tmp_path), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    allowed = next(a for a in args if a.startswith("--admission-allowed-kinds=")).partition("=")[2].split(",")
    assert allowed[-4:] == ["rayclusters.ray.io", "rayclusters.kubeflow.org", "pytorchjobs.ray.io",
                            "pytorchjobs.kubeflow.org"]
    assert "pods" in allowed and "jobs.batch" in allowed
    from mcad.cli.controller import admission_config

    assert ("ray.io", "rayclusters") in admission_config(",".join(allowed), "", "").allowed_kinds


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
    rules = named(objects, "ClusterRole", chart.RELEASE)["rules"]
    assert {"apiGroups": ["mcad.ibm.com"], "resources": ["mcadappwrappers"],
            "verbs": ["get", "list", "watch", "delete"]} in rules
    assert {"apiGroups": ["mcad.ibm.com"], "resources": ["mcadappwrappers/status"], "verbs": ["get", "patch"]} in rules
    args = by_kind(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--legacy-api" in args
    managed = chart.render("legacyApi.enabled=true", "legacyApi.installCRD=false")
    assert "CustomResourceDefinition" not in {o["kind"] for o in managed}
    assert named(managed, "ClusterRole", chart.RELEASE)["rules"] == rules


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
    rules = named(objects, "ClusterRole", chart.RELEASE)["rules"]
    assert not [r for r in rules if "secrets" in r["resources"] and r.get("resourceNames")]
    assert not [r for r in HUB_RULES if r in rules]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Role" and not endpoint_access(o)] == [
        "mcad-controller-leader-election", "mcad-controller-webhook-cert"]


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
    rules = named(objects, "ClusterRole", chart.RELEASE)["rules"]
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


# -- admission webhooks ------------------------------------------------------------------------------------------------

def webhooks(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The AppWrapper webhook of each configuration, by kind (the validating one also has the status webhook)."""
    found = {}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        config = by_kind(objects, kind)
        assert config["metadata"]["name"] == "mcad"
        assert [hook["name"] for hook in config["webhooks"]][1:] == (
            ["status.appwrappers.workload.codeflare.dev"] if kind.startswith("Validating") else [])
        found[kind] = config["webhooks"][0]
    return found


def status_webhook(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(by_kind(objects, "ValidatingWebhookConfiguration")["webhooks"][1])


def test_status_writes_are_validated_except_the_controllers_own() -> None:
    hook = status_webhook(chart.render("legacyApi.enabled=true", "webhook.statusWriters={ops-admin}"))
    assert hook["clientConfig"]["service"]["path"] == "/validate"
    assert hook["rules"] == [
        {"apiGroups": ["workload.codeflare.dev"], "apiVersions": ["v1beta1"], "operations": ["UPDATE"],
         "resources": ["appwrappers/status"], "scope": "Namespaced"},
        {"apiGroups": ["mcad.ibm.com"], "apiVersions": ["v1beta1"], "operations": ["UPDATE"],
         "resources": ["mcadappwrappers/status"], "scope": "Namespaced"}]
    assert hook["failurePolicy"] == "Fail"
    assert hook["matchConditions"] == [{"name": "not-a-status-writer", "expression": (
        '!(request.userInfo.username in ["system:serviceaccount:mcad-system:mcad","ops-admin"])')}]
    args = by_kind(chart.render("webhook.statusWriters={ops-admin}"), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--status-writer=ops-admin" in args


def test_webhooks_review_appwrappers_through_the_service_and_fail_closed() -> None:
    objects = chart.render()
    hooks = webhooks(objects)
    for kind, path in (("ValidatingWebhookConfiguration", "/validate"), ("MutatingWebhookConfiguration", "/mutate")):
        hook = hooks[kind]
        assert hook["clientConfig"] == {"service": {"name": "mcad-controller", "namespace": chart.NAMESPACE,
                                                    "path": path, "port": 443}}
        assert hook["rules"] == [{"apiGroups": ["workload.codeflare.dev"], "apiVersions": ["v1beta1"],
                                  "operations": ["CREATE", "UPDATE"], "resources": ["appwrappers"],
                                  "scope": "Namespaced"}]
        assert {k: hook[k] for k in ("failurePolicy", "matchPolicy", "sideEffects", "admissionReviewVersions",
                                     "timeoutSeconds")} == {
            "failurePolicy": "Fail", "matchPolicy": "Equivalent", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 10}
        assert "namespaceSelector" not in hook, "every namespace by default"
        assert "caBundle" not in hook["clientConfig"], "the controller patches it; Helm must not reset it"
    assert hooks["MutatingWebhookConfiguration"]["reinvocationPolicy"] == "Never"
    # The Service port the webhooks call goes to the container's webhook port.
    service = by_kind(objects, "Service")
    assert {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"} in service["spec"]["ports"]


def test_the_certificate_secret_is_created_empty_and_only_it_is_granted() -> None:
    objects = chart.render()
    secret = by_kind(objects, "Secret")
    assert secret["metadata"]["name"] == "mcad-webhook-cert" and secret["type"] == "Opaque"
    assert "data" not in secret and "stringData" not in secret, "Helm would reset the controller's certificate"
    role = named(objects, "Role", "mcad-controller-webhook-cert")
    assert role["metadata"]["namespace"] == chart.NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mcad-webhook-cert"],
                              "verbs": ["get", "update"]}]
    binding = named(objects, "RoleBinding", "mcad-controller-webhook-cert")
    assert binding["roleRef"]["name"] == "mcad-controller-webhook-cert"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mcad", "namespace": chart.NAMESPACE}]
    assert named(objects, "ClusterRole", chart.RELEASE)["rules"][BASE_RULES:BASE_RULES + 2] == WEBHOOK_RULES


def test_legacy_api_adds_its_appwrappers_to_both_webhooks() -> None:
    for hook in webhooks(chart.render("legacyApi.enabled=true")).values():
        assert [r["apiGroups"] + r["resources"] for r in hook["rules"]] == [
            ["workload.codeflare.dev", "appwrappers"], ["mcad.ibm.com", "mcadappwrappers"]]


def test_webhook_url_and_namespace_selector_for_a_controller_outside_the_cluster(tmp_path: Path) -> None:
    selector = {"matchLabels": {"mcad.test/webhook": "on"}}
    values = {"webhook": {"url": "https://127.0.0.1:9443/", "namespaceSelector": selector}}
    hooks = webhooks(chart.render(values=values, tmp=tmp_path))
    assert hooks["ValidatingWebhookConfiguration"]["clientConfig"] == {"url": "https://127.0.0.1:9443/validate"}
    assert hooks["MutatingWebhookConfiguration"]["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate"}
    assert all(hook["namespaceSelector"] == selector for hook in hooks.values())


def test_by_default_the_controllers_mutating_webhook_records_the_creator() -> None:
    objects = chart.render()
    assert not [o for o in objects if o["kind"].startswith("MutatingAdmissionPolicy")]
    assert not [a for a in controller_pod(objects)["containers"][0]["args"] if a.startswith("--webhook-creator")]


def test_creator_policy_replaces_the_mutating_webhook(tmp_path: Path) -> None:
    """webhook.creator=policy: a MutatingAdmissionPolicy and its binding, matching what the mutating webhook
    matched (both API groups, the namespace selector); no MutatingWebhookConfiguration; the validating webhook
    unchanged; the controller told (it then patches the CA bundle into the validating configuration only)."""
    selector = {"matchLabels": {"team": "ml"}}
    values = {"webhook": {"creator": "policy", "namespaceSelector": selector}, "legacyApi": {"enabled": True}}
    objects = chart.render(values=values, tmp=tmp_path)
    assert "MutatingWebhookConfiguration" not in {o["kind"] for o in objects}
    by_webhook = chart.render(values={"webhook": {"namespaceSelector": selector}, "legacyApi": {"enabled": True}},
                              tmp=tmp_path)
    assert by_kind(objects, "ValidatingWebhookConfiguration") == by_kind(by_webhook, "ValidatingWebhookConfiguration")
    policy = by_kind(objects, "MutatingAdmissionPolicy")
    binding = by_kind(objects, "MutatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1beta1"
    assert policy["metadata"]["name"] == "mcad-creator"
    assert binding["spec"] == {"policyName": "mcad-creator"}
    spec = policy["spec"]
    assert (spec["failurePolicy"], spec["reinvocationPolicy"]) == ("Fail", "Never")
    assert spec["matchConstraints"]["namespaceSelector"] == selector
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in spec["matchConstraints"]["resourceRules"]] == [
        (["workload.codeflare.dev"], ["appwrappers"], ["CREATE", "UPDATE"]),
        (["mcad.ibm.com"], ["mcadappwrappers"], ["CREATE", "UPDATE"])]
    assert "--webhook-creator=policy" in controller_pod(objects)["containers"][0]["args"]
    # A cluster that serves the GA API (Kubernetes 1.36+) gets v1.
    served = chart.render("webhook.creator=policy",
                          api_versions=("admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",))
    assert {o["apiVersion"] for o in served if o["kind"].startswith("MutatingAdmissionPolicy")} == {
        "admissionregistration.k8s.io/v1"}
    with pytest.raises(RuntimeError, match=r"webhook\.creator must be webhook or policy"):
        chart.render("webhook.creator=both")


def test_cert_manager_issues_the_certificate_and_the_controller_only_reads_it() -> None:
    objects = chart.render("webhook.certManager.enabled=true")
    kinds = [o["kind"] for o in objects]
    assert "Secret" not in kinds, "cert-manager creates it"
    certificate = by_kind(objects, "Certificate")
    assert certificate["spec"]["secretName"] == "mcad-webhook-cert"
    assert certificate["spec"]["dnsNames"] == [f"mcad-controller.{chart.NAMESPACE}.svc",
                                               f"mcad-controller.{chart.NAMESPACE}.svc.cluster.local"]
    issuer = by_kind(objects, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert by_kind(objects, kind)["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{chart.NAMESPACE}/mcad-webhook"}
    pod = controller_pod(objects)
    args = pod["containers"][0]["args"]
    assert "--webhook-cert-dir=/etc/mcad/webhook-cert" in args
    assert not [a for a in args if a.startswith(("--webhook-cert-secret", "--webhook-cert-hosts"))]
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "webhook-cert", "mountPath": "/etc/mcad/webhook-cert", "readOnly": True}]
    assert pod["volumes"] == [{"name": "webhook-cert", "secret": {"secretName": "mcad-webhook-cert"}}]
    # Neither the Secret nor the configurations are the controller's to write.
    assert [o["metadata"]["name"] for o in objects
            if o["kind"] == "Role" and not endpoint_access(o)] == ["mcad-controller-leader-election"]
    assert named(objects, "ClusterRole", chart.RELEASE)["rules"][BASE_RULES] == WEBHOOK_RULES[0]
    assert "admissionregistration.k8s.io" not in json.dumps(named(objects, "ClusterRole", chart.RELEASE)["rules"])
    with pytest.raises(RuntimeError, match=r"certManager\.enabled needs the Service"):
        chart.render("webhook.certManager.enabled=true", "webhook.url=https://127.0.0.1:9443")


def test_webhook_off_renders_none_of_it() -> None:
    objects = chart.render("webhook.enabled=false")
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Secret", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
    assert [o["metadata"]["name"] for o in objects
            if o["kind"] == "Role" and not endpoint_access(o)] == ["mcad-controller-leader-election"]
    args = controller_pod(objects)["containers"][0]["args"]
    assert "--no-webhook" in args and not [a for a in args if a.startswith("--webhook")]
    assert "subjectaccessreviews" not in json.dumps(named(objects, "ClusterRole", chart.RELEASE)["rules"])
    assert [p["name"] for p in by_kind(objects, "Service")["spec"]["ports"]] == ["http"]


def test_helm_lint_passes_with_cert_manager_and_url(tmp_path: Path) -> None:
    for values in ({"webhook": {"certManager": {"enabled": True}}}, {"webhook": {"url": "https://127.0.0.1:9443"}}):
        path = tmp_path / "values.json"
        path.write_text(json.dumps(values))
        out = chart.helm("lint", str(chart.CHART), "--strict", "--namespace", chart.NAMESPACE, "--values", str(path))
        assert "0 chart(s) failed" in out


def test_endpoint_access_lets_the_controller_review_and_readers_read() -> None:
    objects = [o for o in chart.render() if endpoint_access(o)]
    named = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert sorted(named) == [("ClusterRole", "mcad-access-reviews"), ("ClusterRole", "mcad-debug-viewer"),
                             ("ClusterRole", "mcad-metrics-reader"), ("ClusterRoleBinding", "mcad-access-reviews"),
                             ("Role", "mcad-debug-client"), ("Service", "mcad-controller-leader")]
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
    # The route to the Service's http port and nothing else; no pods/proxy (it would reach every port of
    # every pod of the namespace), no bare Service name (the proxy's default port).
    assert named[("Role", "mcad-debug-client")]["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["mcad-controller"],
         "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["services"], "resourceNames": ["mcad-controller"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["services/proxy"],
         "resourceNames": ["mcad-controller:http", "mcad-controller-leader:http"], "verbs": ["get"]}]
    assert "pods/proxy" not in json.dumps([o for o in chart.render() if o["kind"] in ("Role", "ClusterRole")])
    # The leader's Service: the controller's pods that carry the leader label, on the http port only; the leader
    # writes that label (--leader-elect-label-pod, with patch on pods in the release namespace).
    deployment = by_kind(chart.render(), "Deployment")
    leader = named[("Service", "mcad-controller-leader")]
    assert leader["spec"]["selector"] == {**deployment["spec"]["selector"]["matchLabels"],
                                          "mcad.codeflare.dev/leader": "true"}
    assert leader["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert leader["metadata"]["labels"]["app.kubernetes.io/component"] != "controller", "scraped twice"
    assert "--leader-elect-label-pod" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    election, = [o for o in chart.render() if o["metadata"]["name"] == "mcad-controller-leader-election"
                 and o["kind"] == "Role"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]} in election["rules"]
    # Without leader election every replica is the leader: no leader Service, no label, no pods patch.
    single = chart.render("leaderElection.enabled=false", "replicaCount=1")
    assert not [o for o in single if o["metadata"]["name"] == "mcad-controller-leader"]
    client = next(o for o in single if o["kind"] == "Role" and o["metadata"]["name"] == "mcad-debug-client")
    assert client["rules"][-1]["resourceNames"] == ["mcad-controller:http"]
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


# ---------------------------------------------------------------------------------------------- who may call


def controller_flags() -> set[str]:
    from mcad.cli.controller import main

    return {opt for param in main.params for opt in getattr(param, "opts", ())}


def flag_names(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args}


def network_policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(objects, "NetworkPolicy")


def test_the_network_policy_selects_the_controller_and_admits_every_peer_until_told_whom() -> None:
    objects = chart.render()
    policy = network_policy(objects)
    deployment = by_kind(objects, "Deployment")
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # Unset, it admits what reaches the two ports from anywhere (and nothing else): installing it changes nothing.
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "webhook", "protocol": "TCP"}]},
                                         {"ports": [{"port": "http", "protocol": "TCP"}]}]
    # The ports it names are the container's.
    named_ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == named_ports


def test_given_the_api_servers_range_only_it_reaches_the_webhooks_and_the_http_port_only_it_and_listed_peers(
        tmp_path: Path) -> None:
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    values = {"networkPolicy": {"apiServerCIDRs": ["10.0.0.10/32", "10.0.0.11/32"], "httpFrom": [prometheus]}}
    webhook_rule, http_rule = network_policy(chart.render(values=values, tmp=tmp_path))["spec"]["ingress"]
    api_servers = [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "10.0.0.11/32"}}]
    assert webhook_rule == {"ports": [{"port": "webhook", "protocol": "TCP"}], "from": api_servers}
    assert http_rule == {"ports": [{"port": "http", "protocol": "TCP"}], "from": [*api_servers, prometheus]}


def test_the_api_servers_range_goes_to_the_controller_too_with_or_without_the_policy(tmp_path: Path) -> None:
    """The controller gives the API server's addresses a SubjectAccessReview total of their own: on a CNI that does
    not enforce NetworkPolicy, forged reviews from elsewhere still reach the port."""
    assert not [a for a in controller_pod(chart.render())["containers"][0]["args"]
                if a.startswith("--api-server-cidrs")]
    for enabled in (True, False):
        values = {"networkPolicy": {"enabled": enabled, "apiServerCIDRs": ["10.0.0.10/32", "fd00::10/128"]}}
        args = controller_pod(chart.render(values=values, tmp=tmp_path))["containers"][0]["args"]
        assert [a for a in args if a.startswith("--api-server-cidrs")] == [
            "--api-server-cidrs=10.0.0.10/32,fd00::10/128"]
    values = {"webhook": {"enabled": False}, "networkPolicy": {"apiServerCIDRs": ["10.0.0.10/32"]}}
    args = controller_pod(chart.render(values=values, tmp=tmp_path))["containers"][0]["args"]
    assert "--no-webhook" in args and not [a for a in args if a.startswith("--api-server-cidrs")]


def test_listed_http_peers_alone_restrict_the_http_port_not_the_webhooks(tmp_path: Path) -> None:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    webhook_rule, http_rule = network_policy(chart.render(
        values={"networkPolicy": {"httpFrom": [peer]}}, tmp=tmp_path))["spec"]["ingress"]
    assert "from" not in webhook_rule
    assert http_rule["from"] == [peer]


def test_the_network_policy_follows_the_webhook_and_can_be_left_out() -> None:
    assert network_policy(chart.render("webhook.enabled=false"))["spec"]["ingress"] == [
        {"ports": [{"port": "http", "protocol": "TCP"}]}]
    assert "NetworkPolicy" not in {o["kind"] for o in chart.render("networkPolicy.enabled=false")}


def test_webhook_client_auth_is_off_by_default() -> None:
    pod = controller_pod(chart.render())
    args = pod["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--webhook-client", "--webhook-token", "--webhook-access",
                                                 "--unknown-tokens"))]
    assert "volumeMounts" not in pod["containers"][0]


def test_webhook_client_auth_mounts_the_secret_and_passes_the_flags(tmp_path: Path) -> None:
    values = {"webhook": {"clientAuth": {"secretName": "apiserver-webhook-client", "certificate": True,
                                         "names": ["kube-apiserver-webhook-client"], "token": True},
                          "accessReviews": {"perSecond": 10, "burst": 100, "total": 30}},
              "controller": {"unknownTokensPerSecond": 2, "unknownTokensBurst": 8}}
    pod = controller_pod(chart.render(values=values, tmp=tmp_path))
    container = pod["containers"][0]
    args = container["args"]
    wanted = ["--webhook-client-ca=/etc/mcad/webhook-client/ca.crt",
              "--webhook-client-name=kube-apiserver-webhook-client",
              "--webhook-token-file=/etc/mcad/webhook-client/token",
              "--webhook-access-reviews-per-second=10", "--webhook-access-reviews-burst=100",
              "--webhook-access-reviews-total=30", "--unknown-tokens-per-second=2", "--unknown-tokens-burst=8"]
    assert [a for a in args if a in wanted] == wanted
    assert flag_names(wanted) <= controller_flags()  # the controller has every flag the chart passes
    assert container["volumeMounts"] == [
        {"name": "webhook-client", "mountPath": "/etc/mcad/webhook-client", "readOnly": True}]
    assert pod["volumes"] == [{"name": "webhook-client", "secret": {"secretName": "apiserver-webhook-client"}}]


def test_token_only_client_auth_passes_no_certificate_flags(tmp_path: Path) -> None:
    values = {"webhook": {"clientAuth": {"secretName": "s", "token": True}}}
    args = controller_pod(chart.render(values=values, tmp=tmp_path))["containers"][0]["args"]
    assert "--webhook-token-file=/etc/mcad/webhook-client/token" in args
    assert not [a for a in args if a.startswith("--webhook-client")]


@pytest.mark.parametrize(("values", "message"), [
    ({"webhook": {"clientAuth": {"certificate": True}}}, r"needs webhook\.clientAuth\.secretName"),
    ({"webhook": {"clientAuth": {"token": True}}}, r"needs webhook\.clientAuth\.secretName"),
    ({"webhook": {"clientAuth": {"secretName": "s", "names": ["x"]}}}, r"names needs webhook\.clientAuth\.certificate"),
])
def test_client_auth_the_chart_cannot_serve_is_refused(tmp_path: Path, values: dict[str, Any], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        chart.render(values=values, tmp=tmp_path)


def test_the_preemption_durations_are_the_controllers_defaults_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    values = {"controller": {"preemption": True}}
    args = by_kind(chart.render(values=values, tmp=tmp_path), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--preemption-min-runtime=0s" in args and "--preemption-cooldown=10m" in args
    assert "--preemption-min-runtime-ceiling=1h" in args
    # The controller's own defaults, as it writes them.
    assert format_duration(minruntime.DEFAULT.default) == "0s"
    assert format_duration(minruntime.DEFAULT_CEILING) == "1h"
    assert format_duration(DEFAULT_PREEMPTION_COOLDOWN_SECONDS) == "10m"
    off = by_kind(chart.render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--preemption-min-runtime-ceiling=1h" in off, "admission judges the annotation with preemption off too"
    assert not any(arg.startswith(("--preemption-min-runtime=", "--preemption-cooldown")) for arg in off)
    with pytest.raises(RuntimeError, match=r'controller\.preemptionCooldown: "10 minutes" is not a duration'):
        chart.render(values={"controller": {"preemptionCooldown": "10 minutes"}}, tmp=tmp_path)
