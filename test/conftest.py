"""Session fixtures for tests that need a real API server.

Which cluster: $MCAD_TEST_KUBECONFIG, else $KUBECONFIG, else the local control plane of hack/localcluster.py
(reused when it already runs; otherwise brought up for the session and taken down afterwards, unless
MCAD_KEEP_CLUSTER=1). Every test that asks for ``namespace`` gets a fresh namespace, deleted afterwards.
Tests that use these fixtures carry the ``cluster`` marker automatically; under test/unit and test/component
(what ``make unit`` runs, without a cluster) such a test is a collection error.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes.client as k8s
import pytest
import yaml

from mcad.k8s import kube
from test.support import REPO, wait_until

CLUSTER_FIXTURES = {"kubeconfig", "api", "namespace", "core", "apps", "batch", "kuberay_operator", "crd", "quota_crd"}
CRD = REPO / "config" / "crd" / "workload.codeflare.dev_appwrappers.yaml"
QUOTA_CRD = REPO / "config" / "crd" / "quota.codeflare.dev_quotasubtrees.yaml"


# `make unit` runs these without a cluster: a test in them that asks for one is refused at collection.
NO_CLUSTER_DIRECTORIES = (REPO / "test" / "unit", REPO / "test" / "component")
# The suite against an installation (`make e2e`): it needs root and Docker, brings up a real kubelet node of its own,
# and is collected only with --installed, so `make test` and a plain `pytest test` never start one.
INSTALLED_DIRECTORY = REPO / "test" / "installed"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--installed", action="store_true", default=False,
                     help="run test/installed: mcad installed by the chart from its image on a real kubelet node "
                          "(hack/e2ecluster.py; root and Docker); `make e2e` passes it")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.is_relative_to(INSTALLED_DIRECTORY) and not config.getoption("--installed"):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if CLUSTER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
            if any(item.path.is_relative_to(directory) for directory in NO_CLUSTER_DIRECTORIES):
                raise pytest.UsageError(f"{item.nodeid} needs a cluster: it belongs in test/integration or test/e2e, "
                                        "not among the tests `make unit` runs without one")


def _local_cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "hack" / "localcluster.py"), *args],
                          text=True, stdout=subprocess.PIPE)


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[str]:
    given = os.environ.get("MCAD_TEST_KUBECONFIG") or os.environ.get("KUBECONFIG")
    if given:
        yield given
        return
    started_here = _local_cluster("status").returncode != 0
    if started_here:
        # Progress of the (possibly long) bring-up goes straight to the terminal via stderr.
        proc = _local_cluster("up")
        if proc.returncode != 0:
            pytest.exit(f"the local control plane did not come up (exit {proc.returncode}); see the messages above",
                        returncode=3)
    path = str(REPO / ".dev" / "kubeconfig")
    try:
        yield path
    finally:
        if started_here and os.environ.get("MCAD_KEEP_CLUSTER") != "1":
            _local_cluster("down")


def apply_crd(api: k8s.ApiClient, path: Path) -> None:
    """Server-side apply the CRD in ``path`` and wait until it is Established (its resources can be used)."""
    ext = k8s.ApiextensionsV1Api(api)
    body = yaml.safe_load(path.read_text())
    name = body["metadata"]["name"]
    ext.patch_custom_resource_definition(name, body, field_manager="mcad-e2e", force=True,
                                         _content_type="application/apply-patch+yaml")

    def established() -> bool:
        crd = ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_until(established, 30, f"the CRD {name} to be established")


@pytest.fixture(scope="session")
def crd(api: k8s.ApiClient) -> None:
    """The AppWrapper CRD of config/crd/, applied and Established, and known to the garbage collector."""
    apply_crd(api, CRD)
    wait_for_garbage_collection_of_appwrappers(api)


def wait_for_garbage_collection_of_appwrappers(api: k8s.ApiClient, timeout: float = 120) -> None:
    """Wait until kube-controller-manager's garbage collector deletes what an AppWrapper owns once it is gone.

    The collector learns a new CRD at its next resource sync (every 30 s), and until then retries an owner it
    cannot map with a growing backoff: on a cluster that just came up, a test deleting an AppWrapper would wait
    for its wrapped objects well past any deadline of its own. A probe (an AppWrapper in ``default``, deleted at
    once, and a ConfigMap it owns) shows when the collector is ready; a fresh probe every few seconds, so that the
    first one after the sync is collected at once instead of waiting out the backoff of the earlier ones."""
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        name = f"gc-probe-{uuid.uuid4().hex[:8]}"
        probe = custom.create_namespaced_custom_object(
            "workload.codeflare.dev", "v1beta1", "default", "appwrappers",
            {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper", "metadata": {"name": name},
             "spec": {"resources": {"GenericItems": [{"replicas": 1, "generictemplate": {
                 "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-item"}}}]}}})
        owner = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper", "name": name,
                 "uid": probe["metadata"]["uid"]}
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "ownerReferences": [owner]}})
        custom.delete_namespaced_custom_object("workload.codeflare.dev", "v1beta1", "default", "appwrappers", name)
        if _gone(lambda n=name: core.read_namespaced_config_map(n, "default"), 5):
            return
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespaced_config_map(name, "default")
        if time.monotonic() > deadline:
            raise AssertionError(f"the garbage collector did not learn AppWrappers within {timeout:.0f} s")


def _gone(read: Callable[[], object], seconds: float) -> bool:
    """Whether ``read`` answers 404 within ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            read()
        except k8s.ApiException as err:
            if err.status == 404:
                return True
            raise
        time.sleep(0.2)
    return False

@pytest.fixture(scope="session")
def quota_crd(api: k8s.ApiClient) -> None:
    """The QuotaSubtree CRD of config/crd/, applied and Established. Applied here and not left to the chart: Helm
    installs crds/ only on a release's first install, and a cluster may carry an older release."""
    apply_crd(api, QUOTA_CRD)


@pytest.fixture(scope="session")
def kuberay_operator(kubeconfig: str) -> Iterator[None]:
    """The KubeRay operator (hack/kuberay.py) running against the test cluster, with its CRDs installed."""
    def kuberay(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(REPO / "hack" / "kuberay.py"), "--kubeconfig", kubeconfig, *args],
                              capture_output=True, text=True, timeout=600)

    # Leave an operator that someone else started running afterwards.
    started_here = kuberay("status").returncode != 0
    proc = kuberay("up")
    assert proc.returncode == 0, f"hack/kuberay.py up failed:\n{proc.stderr}"
    try:
        yield
    finally:
        if started_here:
            kuberay("down")


@pytest.fixture(scope="session")
def api(kubeconfig: str) -> k8s.ApiClient:
    conn = kube.connect(kubeconfig)
    kube.server_version(conn)
    return conn.api


@pytest.fixture(scope="session")
def core(api: k8s.ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(api)


@pytest.fixture(scope="session")
def apps(api: k8s.ApiClient) -> k8s.AppsV1Api:
    return k8s.AppsV1Api(api)


@pytest.fixture(scope="session")
def batch(api: k8s.ApiClient) -> k8s.BatchV1Api:
    return k8s.BatchV1Api(api)


@pytest.fixture
def namespace_labels() -> dict[str, str]:
    """Labels of the ``namespace`` fixture's namespace beyond mcad.test/owned (the e2e suite's select webhooks)."""
    return {}


@pytest.fixture
def namespace(core: k8s.CoreV1Api, namespace_labels: dict[str, str]) -> Iterator[str]:
    name = f"mcad-test-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mcad.test/owned": "true", **namespace_labels}}})

    def default_sa_exists() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
            return True
        except k8s.exceptions.ApiException as err:
            if err.status == 404:
                return False
            raise

    # The ServiceAccount controller creates "default" asynchronously; pods are refused until it exists.
    wait_until(default_sa_exists, 30, f"ServiceAccount default in {name}")
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")

