"""Through the real webhooks: fault tolerance annotations a tenant sets on its AppWrappers
(`kubectl` with a TokenRequest token) are refused at create, and on an update that sets or changes them, with the
annotation named; good ones are admitted. The controller runs with ``--grace-period-ceiling=2h``: the ceiling
admission judges by is the flag's; the floors are the defaults (10s), and a refusal for a shorter period states the
floor. Numbers are read in ASCII digits only. The legacy group (``--legacy-api``) is judged the same.

alice holds only AppWrapper rights (create, get, list, watch, delete, update, patch): what she cannot wrap is refused
anyway, and the annotation is named all the same. bob may also create ConfigMaps, so the annotation is the only
reason his AppWrapper is refused, and his good one is admitted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.api import faulttolerance as ft
from mcad.k8s import kube
from test import escalations
from test.e2e.conftest import LOGS, AppWrappers, Controller, running_controller
from test.e2e.test_admission import account, kubectl, token_kubeconfig
from test.support import wait_until

CEILING = "2h"
RIGHTS = [{"apiGroups": ["workload.codeflare.dev", "mcad.ibm.com"], "resources": ["appwrappers", "mcadappwrappers"],
           "verbs": [*escalations.APPWRAPPER_RIGHTS[0]["verbs"], "update", "patch"]}]


@pytest.fixture(scope="module")
def controller(legacy_crd: None, controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    with running_controller(controller_kubeconfig, LOGS / "test_fault_admission.log", "--legacy-api",
                            "--grace-period-ceiling", CEILING, "--allowed-scheduler-names", "volcano") as ctl:
        yield ctl


class Tenants:
    def __init__(self, kubeconfig: str, namespace: str, tmp: Path) -> None:
        admin = kube.connect(kubeconfig)
        self.namespace = namespace
        account(admin, namespace, "alice", RIGHTS)
        account(admin, namespace, "bob", [*RIGHTS, {"apiGroups": [""], "resources": ["configmaps"],
                                                    "verbs": ["create"]}])
        self.alice = token_kubeconfig(kubeconfig, admin, namespace, "alice", tmp / "alice")
        self.bob = token_kubeconfig(kubeconfig, admin, namespace, "bob", tmp / "bob")


@pytest.fixture
def tenants(kubeconfig: str, aws: AppWrappers, controller: Controller, tmp_path: Path) -> Tenants:
    made = Tenants(kubeconfig, aws.namespace, tmp_path)
    wait_until(lambda: kubectl(made.bob, "auth", None, "can-i", "create", "configmaps").stdout.strip() == "yes", 30,
               "bob's Role to count")
    return made


def wrapper(namespace: str, name: str, annotations: dict[str, str], group: str = "workload.codeflare.dev"
            ) -> dict[str, Any]:
    body = escalations.appwrapper(namespace, name, {"apiVersion": "v1", "kind": "ConfigMap",
                                                    "metadata": {"name": f"{name}-cm"}, "data": {"k": "v"}})
    body["apiVersion"] = f"{group}/v1beta1"
    body["metadata"]["annotations"] = annotations
    return body


REFUSED = [
    pytest.param({ft.RETRY_LIMIT: "-1"}, f"annotation {ft.RETRY_LIMIT}: '-1' must be an integer in 0..1000",
                 id="bad-retry-limit"),
    pytest.param({ft.FAILURE_GRACE: "5 minutes"},
                 f"annotation {ft.FAILURE_GRACE}: '5 minutes' not a duration (write it as Go does: 90s, 5m, 1h30m)",
                 id="malformed-duration"),
    pytest.param({ft.RETRY_PAUSE: "3h"},
                 f"annotation {ft.RETRY_PAUSE}: '3h' exceeds the cluster's ceiling of {CEILING}", id="above-ceiling"),
    pytest.param({ft.TERMINAL_EXIT_CODES: "1,300"},
                 f"annotation {ft.TERMINAL_EXIT_CODES}: '1,300' holds '300', not an exit code: write a "
                 f"comma-separated list of integers in 1..255", id="exit-code-out-of-range"),
    pytest.param({ft.RETRY_PAUSE: "1ns"},
                 f"annotation {ft.RETRY_PAUSE}: '1ns' is below the cluster's floor of 10s (the shortest this period "
                 f"may be)", id="pause-below-floor"),
    pytest.param({ft.FAILURE_GRACE: "0s"},
                 f"annotation {ft.FAILURE_GRACE}: '0s' is below the cluster's floor of 10s (the shortest this period "
                 f"may be)", id="grace-below-floor"),
    pytest.param({ft.RETRY_LIMIT: "\u0661\u0662"},
                 f"annotation {ft.RETRY_LIMIT}: '\u0661\u0662' must be an integer in 0..1000 (in ASCII digits)",
                 id="non-ascii-digits"),
]


@pytest.mark.parametrize(("annotations", "message"), REFUSED)
def test_a_refused_annotation_is_refused_at_create_naming_it(
        tenants: Tenants, aws: AppWrappers, annotations: dict[str, str], message: str) -> None:
    for user, kubeconfig in (("bob", tenants.bob), ("alice", tenants.alice)):
        proc = kubectl(kubeconfig, "create", wrapper(tenants.namespace, f"bad-{user}", annotations))
        assert proc.returncode != 0, proc.stdout
        assert "denied the request: " in proc.stderr and message in proc.stderr, proc.stderr
        if user == "bob":  # he may create the ConfigMap: the annotation is the only reason
            assert proc.stderr.rstrip().endswith(f"denied the request: {message}"), proc.stderr
        with pytest.raises(k8s.ApiException, match="Not Found"):
            aws.get(f"bad-{user}")


def test_good_annotations_are_admitted_and_an_update_to_a_bad_value_is_refused(
        tenants: Tenants, aws: AppWrappers) -> None:
    good = {ft.ADMISSION_GRACE: "1m", ft.WARMUP_GRACE: "10m", ft.FAILURE_GRACE: "90s", ft.RETRY_PAUSE: CEILING,
            ft.RETRY_LIMIT: "5", ft.FORCEFUL_DELETION_GRACE: "1h30m", ft.DELETION_ON_FAILURE_GRACE: "0",
            ft.SUCCESS_TTL: "168h", ft.TERMINAL_EXIT_CODES: "1,2", ft.RETRYABLE_EXIT_CODES: "137, 143",
            ft.DELETE_WHEN_FINISHED: "true"}
    proc = kubectl(tenants.bob, "create", wrapper(tenants.namespace, "good", good))
    assert proc.returncode == 0, proc.stderr
    stored = aws.get("good")["metadata"]["annotations"]
    assert {key: stored[key] for key in good} == good

    def patch(values: dict[str, str]) -> Any:
        return kubectl(tenants.bob, "patch", None, "appwrapper", "good", "--type", "merge",
                       "-p", json.dumps({"metadata": {"annotations": values}}))

    for values, message in (
            ({ft.RETRY_LIMIT: "lots"}, f"annotation {ft.RETRY_LIMIT}: 'lots' must be an integer in 0..1000"),
            ({ft.FAILURE_GRACE: "121m"}, f"annotation {ft.FAILURE_GRACE}: '121m' exceeds the cluster's ceiling of "
                                         f"{CEILING}"),
            ({ft.TERMINAL_EXIT_CODES: "1,137"}, f"annotation {ft.RETRYABLE_EXIT_CODES}: lists 137, also in "
                                                f"terminalExitCodes")):
        proc = patch(values)
        assert proc.returncode != 0, proc.stdout
        assert f"denied the request: {message}" in proc.stderr, proc.stderr
    assert aws.get("good")["metadata"]["annotations"][ft.RETRY_LIMIT] == "5"
    # An edit that leaves them alone, and one that sets a good value, go through.
    proc = patch({"note": "edited", ft.RETRY_LIMIT: "0"})
    assert proc.returncode == 0, proc.stderr
    assert aws.get("good")["metadata"]["annotations"][ft.RETRY_LIMIT] == "0"


def test_the_legacy_group_is_judged_the_same(tenants: Tenants, aws: AppWrappers) -> None:
    proc = kubectl(tenants.bob, "create", wrapper(tenants.namespace, "old-bad", {ft.SUCCESS_TTL: "8d"},
                                                  group="mcad.ibm.com"))
    assert proc.returncode != 0, proc.stdout
    assert f"denied the request: annotation {ft.SUCCESS_TTL}: '8d' not a duration" in proc.stderr, proc.stderr
    proc = kubectl(tenants.bob, "create", wrapper(tenants.namespace, "old-good", {ft.SUCCESS_TTL: "8h"},
                                                  group="mcad.ibm.com"))
    assert proc.returncode == 0, proc.stderr


def pod_wrapper(namespace: str, name: str, scheduler: str) -> dict[str, Any]:
    return escalations.appwrapper(namespace, name, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-0"},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "trainer",
                                                              "resources": {"requests": {"cpu": "10m"}}}]}})


def test_a_pod_template_naming_a_scheduler_the_admin_does_not_allow_is_refused(
        kubeconfig: str, aws: AppWrappers, controller: Controller, tmp_path: Path) -> None:
    """carol may create AppWrappers and pods in her namespace: ``schedulerName: nobody`` is the only reason hers is
    refused, the message naming the template and the schedulers allowed; ``volcano`` (allowed by the flag) and the
    default scheduler are admitted, and the default one dispatches."""
    admin = kube.connect(kubeconfig)
    account(admin, aws.namespace, "carol", [*RIGHTS, {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])
    carol = token_kubeconfig(kubeconfig, admin, aws.namespace, "carol", tmp_path / "carol")
    wait_until(lambda: kubectl(carol, "auth", None, "can-i", "create", "pods").stdout.strip() == "yes", 30,
               "carol's Role to count")
    proc = kubectl(carol, "create", pod_wrapper(aws.namespace, "nobody", "nobody"))
    assert proc.returncode != 0, proc.stdout
    assert proc.stderr.rstrip().endswith(
        "denied the request: GenericItems[0] (Pod nobody-0): generictemplate.spec.schedulerName 'nobody' is not a "
        "scheduler the cluster admin allows (default-scheduler, volcano; --allowed-scheduler-names): mcad reserves "
        "room for pods as the default scheduler places them, and pods another scheduler places, or none, could hold "
        "that room without ever starting"), proc.stderr
    with pytest.raises(k8s.ApiException, match="Not Found"):
        aws.get("nobody")
    for name, scheduler in (("volcano", "volcano"), ("default", "default-scheduler")):
        proc = kubectl(carol, "create", pod_wrapper(aws.namespace, name, scheduler))
        assert proc.returncode == 0, proc.stderr
    aws.wait_state("default", "Running")
