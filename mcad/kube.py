"""The one module that imports the official ``kubernetes`` client.

Contract: everything else in mcad talks to the API server through the functions and classes here, on raw
dicts, so the client library can be swapped or pinned in one place. Connection problems surface as
``KubeConnectError`` with a message a person can act on (which kubeconfig, which server, what failed);
nothing here prints or exits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.config.config_exception import ConfigException


class KubeConnectError(Exception):
    """The API server could not be configured or reached."""


class ApiError(Exception):
    """A request failed. ``status`` is the HTTP code, or 0 when no response came (connection, timeout)."""

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"no response: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body

    @property
    def transient(self) -> bool:
        """Worth retrying with backoff: throttled, server-side trouble, or no answer at all."""
        return self.status in (0, 429, 500, 502, 503, 504)


class GoneError(ApiError):
    """410 Gone: the resourceVersion asked for is too old; a watcher must relist."""


@dataclass(frozen=True)
class Connection:
    """A configured API client plus where its configuration came from (for messages)."""

    api: kubernetes.client.ApiClient
    source: str
    server: str


def connect(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """Build an API client: an explicit kubeconfig, else $KUBECONFIG, else in-cluster, else ~/.kube/config."""
    explicit = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = kubernetes.client.Configuration()
    try:
        if explicit:
            if not os.path.exists(explicit.split(os.pathsep)[0]):
                raise KubeConnectError(f"kubeconfig {explicit!r} does not exist")
            kubernetes.config.load_kube_config(
                config_file=explicit, context=context, client_configuration=configuration
            )
            source = f"kubeconfig {explicit}"
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            source = "in-cluster service account"
        else:
            default = os.path.expanduser("~/.kube/config")
            if not os.path.exists(default):
                raise KubeConnectError(
                    "no Kubernetes configuration found: pass --kubeconfig, set KUBECONFIG, "
                    "or run inside a cluster (tip: `make cluster` writes .dev/kubeconfig)"
                )
            kubernetes.config.load_kube_config(
                config_file=default, context=context, client_configuration=configuration
            )
            source = f"kubeconfig {default}"
    except ConfigException as err:
        raise KubeConnectError(f"invalid Kubernetes configuration: {err}") from err
    return Connection(kubernetes.client.ApiClient(configuration), source, configuration.host)


def server_version(conn: Connection, timeout_seconds: float = 10.0) -> str:
    """GET /version; the cheapest proof that the server answers and accepts our credentials."""
    try:
        info = kubernetes.client.VersionApi(conn.api).get_code(_request_timeout=timeout_seconds)
    except kubernetes.client.exceptions.ApiException as err:
        raise KubeConnectError(
            f"API server {conn.server} refused the request ({err.status} {err.reason}); "
            f"check the credentials in {conn.source}"
        ) from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise KubeConnectError(
            f"cannot reach the API server {conn.server} (from {conn.source}): {err}"
        ) from err
    return str(info.git_version)
