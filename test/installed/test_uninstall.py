"""`helm uninstall` and a new `helm install`, as docs/install.md describes them.

Uninstalling removes every object the release rendered (the Deployment and its pods, Services, RBAC, the webhook
configurations and the certificate Secret) and leaves what the docs say it leaves: the CRDs (Helm never deletes
those), the AppWrappers and what they wrap, still running, and the controller's Lease. Installing again picks the
running AppWrapper up where it was: still Running, its Deployment the same object (never dispatched a second time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import yaml

from mcad.k8s import kube
from test.e2e.conftest import appwrapper, conditions_of, deployment_item
from test.installed.conftest import CONTROLLER, NAMESPACE, RELEASE, Installation, e2ecluster
from test.support import wait_until

AW = "/apis/workload.codeflare.dev/v1beta1"
CRDS = ("appwrappers.workload.codeflare.dev", "quotasubtrees.quota.codeflare.dev")


def rendered(installation: Installation) -> list[dict[str, Any]]:
    """What the release installed: its manifest's objects (the CRDs of crds/ are not in it)."""
    manifest = installation.helm("get", "manifest", RELEASE, "-n", NAMESPACE)
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def path_of(client: kube.Client, obj: dict[str, Any]) -> str:
    """The object's API path; rendered without a namespace, a namespaced one is in the release's."""
    namespace = obj["metadata"].get("namespace") or NAMESPACE
    return client.object_path(obj["apiVersion"], obj["kind"], namespace, obj["metadata"]["name"])


def exists(installation: Installation, path: str) -> bool:
    try:
        installation.get(path)
        return True
    except kube.ApiError as err:
        if err.status == 404:
            return False
        raise


def test_uninstall_leaves_the_workloads_and_a_new_install_takes_them_up(
        installation: Installation, namespace: str, api: k8s.ApiClient, tmp_path: Path) -> None:
    conn = installation.conn
    kube.request_json(conn, "POST", f"{AW}/namespaces/{namespace}/appwrappers",
                      body=appwrapper("kept", deployment_item("kept", 1, "100m")))
    wait_until(lambda: (installation.get(f"{AW}/namespaces/{namespace}/appwrappers/kept").get("status") or {})
               .get("state") == "Running", 60, "the AppWrapper Running")
    apps = k8s.AppsV1Api(api)
    uid = apps.read_namespaced_deployment("kept", namespace).metadata.uid
    values = installation.values()
    client = kube.Client(conn)
    objects = [path_of(client, obj) for obj in rendered(installation)]
    assert any("/deployments/" in p for p in objects) and any("validatingwebhookconfigurations" in p
                                                               for p in objects)

    installation.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s")
    try:
        left = [p for p in objects if exists(installation, p)]
        assert not left, f"left by helm uninstall: {left}"
        wait_until(lambda: not installation.pods(), 60, "the controller's pods to go")
        ext = k8s.ApiextensionsV1Api(api)
        assert all(ext.read_custom_resource_definition(name) for name in CRDS)
        assert exists(installation, f"{AW}/namespaces/{namespace}/appwrappers/kept")
        # The controller's own Lease is not the chart's: it stays, as documented.
        assert exists(installation, f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{CONTROLLER}")
        assert apps.read_namespaced_deployment("kept", namespace).metadata.uid == uid
        pods = k8s.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="app=kept").items
        assert [p.status.phase for p in pods] == ["Running"]
    finally:
        path = tmp_path / "values.json"
        path.write_text(json.dumps(values))
        installation.helm("install", RELEASE, str(e2ecluster.CHART), "-n", NAMESPACE, "--values", str(path))
        installation.wait_healthy()

    kept = installation.get(f"{AW}/namespaces/{namespace}/appwrappers/kept")
    assert kept["status"]["state"] == "Running"
    assert len(conditions_of(kept["status"], "Dispatched")) == 1
    assert apps.read_namespaced_deployment("kept", namespace).metadata.uid == uid
