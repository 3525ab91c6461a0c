"""The Helm chart, for tests: render it, install it, and act as its ServiceAccount.

``install(kubeconfig)`` runs ``helm upgrade --install`` of charts/mcad into ``mcad-system`` with no replicas (the
tests run the controller as a local process instead), then asks the TokenRequest API for a token of the chart's
ServiceAccount and writes a kubeconfig that carries only that token. A controller started with it has exactly
the chart's RBAC: that is how the e2e suite proves least privilege.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from mcad.k8s import kube
from test.support import REPO, token_kubeconfig

CHART = REPO / "charts" / "mcad"
NAMESPACE = "mcad-system"
RELEASE = "mcad"
# The controller's Deployment and its leader-election Lease (the chart's fullname plus "-controller").
LEASE = "mcad-controller"
# What the e2e suite wraps beyond the chart's defaults.
# The legacy group's RBAC is granted, its CRD applied by the tests (a CRD owned by a Helm release could not be
# applied by anything else, nor adopted by a later install).
E2E_VALUES = {"replicaCount": 0,
              "rbac": {"extraWrappedKinds": [{"apiGroups": ["ray.io"], "resources": ["rayclusters"],
                                              "watch": True}]},
              "legacyApi": {"enabled": True, "installCRD": False}}
# The label that puts a namespace under a release's webhooks in tests; its value is the release name.
WEBHOOK_LABEL = "mcad.test/webhook"


def webhook_host() -> str:
    """The address of this machine as the API server reaches it: 127.0.0.1, unless the API server runs elsewhere
    (in KinD's node container, hack/e2e-kind.sh sets the kind network's gateway)."""
    return os.environ.get("MCAD_E2E_WEBHOOK_HOST") or "127.0.0.1"


def webhook_values(port: int, release: str = RELEASE) -> dict[str, Any]:
    """Webhooks registered by URL for a controller running on this host at ``port``, for the namespaces labelled
    ``WEBHOOK_LABEL=<release>`` only: failurePolicy is Fail, and AppWrappers that other tests create while no
    controller runs (integration tests, a kept cluster's next session) must not be refused."""
    return {"webhook": {"url": f"https://{webhook_host()}:{port}",
                        "namespaceSelector": {"matchLabels": {WEBHOOK_LABEL: release}}}}


def webhook_args(port: int, release: str = RELEASE) -> tuple[str, ...]:
    """What a local controller needs to serve the webhooks of ``release`` installed with ``webhook_values``
    (several controllers on this host share the port, as replicas behind a Service would)."""
    # No drain at shutdown: the kernel spreads connections over the processes sharing the port, and sends none to
    # one that has closed it, so there is no Service whose endpoint change must spread first.
    return ("--webhook-bind-address", f"{webhook_host()}:{port}", "--webhook-share-port", "--webhook-cert-hosts",
            webhook_host(), "--webhook-cert-secret", f"{release}-webhook-cert", "--webhook-configuration-name", release,
            "--webhook-cert-poll-seconds", "2", "--webhook-drain-seconds", "0")


@functools.cache
def helm_binary() -> Path:
    proc = subprocess.run([str(REPO / "hack" / "build-tools.sh"), "--print"], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"helm is not built yet (run hack/build-tools.sh): {proc.stderr.strip()}")
    return Path(proc.stdout.strip()) / "helm"


def helm(*args: str, kubeconfig: str | None = None) -> str:
    command = [str(helm_binary()), *args]
    if kubeconfig:
        command += ["--kubeconfig", kubeconfig]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def render(*set_args: str, values: dict[str, Any] | None = None, tmp: Path | None = None,
           api_versions: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """``helm template`` of the chart: the rendered objects. ``api_versions``: what the cluster is taken to serve
    beyond Helm's defaults (``group/version`` or ``group/version/Kind``), as a cluster answers ``helm install``."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for item in set_args:
        args += ["--set", item]
    for served in api_versions:
        args += ["--api-versions", served]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.json"
        path.write_text(json.dumps(values))
        args += ["--values", str(path)]
    return [doc for doc in yaml.safe_load_all(helm(*args)) if doc]


def install(kubeconfig: str, workdir: Path, *, release: str = RELEASE, namespace: str = NAMESPACE,
            values: dict[str, Any] | None = None) -> str:
    """Install (or upgrade) the chart; return the path of a kubeconfig acting as its ServiceAccount. A release
    whose name starts with "mcad" has that name as its fullname (and ServiceAccount name)."""
    values_file = workdir / f"{release}-values.json"
    values_file.write_text(json.dumps(E2E_VALUES if values is None else values))
    helm("upgrade", "--install", release, str(CHART), "--namespace", namespace, "--create-namespace",
         "--values", str(values_file), "--wait", "--timeout", "120s", kubeconfig=kubeconfig)
    admin = kube.connect(kubeconfig)
    account = release  # the chart's fullname when the release name contains the chart's
    token = kube.request_json(admin, "POST",
                              f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                              body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": {"expirationSeconds": 6 * 3600}})["status"]["token"]
    return token_kubeconfig(kubeconfig, token, workdir / f"{release}-sa.kubeconfig", user="mcad-sa")


def who_am_i(kubeconfig: str) -> str:
    """The username the API server sees for ``kubeconfig`` (SelfSubjectReview)."""
    conn = kube.connect(kubeconfig)
    review = kube.request_json(conn, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                               body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["username"])
