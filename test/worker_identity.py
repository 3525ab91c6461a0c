"""A worker cluster's kubeconfig for a ServiceAccount token, minted as docs/multi-cluster.md says:
the token of a service-account-token Secret, beside the worker's server and CA from an admin kubeconfig."""

from __future__ import annotations

import base64
from pathlib import Path

from mcad.k8s import kube
from test import support
from test.support import wait_until


def token_kubeconfig(admin_kubeconfig: str, admin: kube.Connection, path: Path, *,
                     secret: str = "mcad-worker-token", namespace: str = "mcad-system") -> Path:
    def filled_in() -> str | None:
        found = kube.request_json(admin, "GET", f"/api/v1/namespaces/{namespace}/secrets/{secret}")
        encoded = (found.get("data") or {}).get("token")
        return base64.b64decode(encoded).decode() if encoded else None

    token = wait_until(filled_in, what=f"the token controller to fill in {secret}")
    return Path(support.token_kubeconfig(admin_kubeconfig, token, path, user="mcad-worker"))
