"""How ``mcadctl`` reaches the controller's ``/debug`` endpoints.

Contract:
- ``fetch(where, endpoint, query)`` GETs ``/debug/<endpoint>`` from the controller and returns the parsed JSON object.
- With ``where.url`` it talks plain HTTP to that address (say, a ``kubectl port-forward``). Otherwise only a
  kubeconfig is needed. First the Service ``<namespace>/<name>-leader`` (port ``http``, through the service
  proxy), which selects the leader's pod alone (the leader labels it: ``mcad.k8s.leaderpod``); the chart's debug-client
  Role grants exactly that and the Service below. When it answers nothing useful (no such Service, no endpoint
  during a handover, refused, or a standby that still carries the label): the Lease ``<namespace>/<name>`` names
  the leader (holderIdentity ``<pod>_<suffix>``), which is reached through the API server's pod proxy when the user
  may (``pods/proxy``: operators; the chart's debug-client Role does not grant it, since it would reach every pod
  of the namespace); with no Lease, no holder, or a pod the API server cannot or will not proxy to, the Service
  ``<namespace>/<name>`` (port ``http``) of every replica is reached through the service proxy. A standby replica
  answers 503 naming the leader; that answer is followed once to the leader's pod when pods/proxy was not refused,
  else the Service is asked again (the API server picks a replica per request), up to ``SERVICE_TRIES`` times in
  all.
- The controller wants the user's bearer token (it TokenReviews it and checks the user's rights). Through the API
  server it goes in ``X-Mcad-Authorization``, since the proxy drops ``Authorization`` after authenticating the
  user; with ``where.url`` in ``Authorization``. The token is ``where.token`` (``--token``), else the kubeconfig's
  as the client resolves it (token, tokenFile, exec plugin); with ``where.url`` the kubeconfig's only when the URL
  is a loopback address (a port-forward), since it goes over plain HTTP to wherever the URL points. A kubeconfig
  that authenticates with a client certificate has none to pass on: through the API server that is a
  ``DebugUnavailable`` saying how to get one.
- Failures raise ``DebugUnavailable`` with a message a person can act on (which API server and kubeconfig, which
  Lease or Service is missing, what the proxy said) and the hint ``--offline`` where it helps.
  ``ControllerRefused`` (a subclass) means the controller itself answered with an error status, e.g. 404 for an
  AppWrapper it does not know; ``.status`` and ``.body`` carry its answer.

Answers from the API server and answers from the controller are told apart by their body: the API server's
errors are ``Status`` objects, the controller's are ``{"error": ...}``.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcad.errors import ApiError, KubeConnectError
from mcad.k8s import kube

SERVICE_PORT_NAME = "http"
# How often one request may go to the Service while standbys answer it: the API server picks a replica behind it
# per request, so with the chart's two replicas all of them miss the leader once in 2**SERVICE_TRIES. Users
# without pods/proxy (the chart's debug-client Role grants none) have no other way to the leader.
SERVICE_TRIES = 8
# How long one request may take when --timeout is not given: long enough for a ledger of thousands of nodes.
DEFAULT_TIMEOUT = 10.0
_OFFLINE_HINT = "or use --offline to compute the same from cluster state"


class DebugUnavailable(Exception):
    """The controller's /debug answer could not be had; the message says why and what to try."""


class ControllerRefused(DebugUnavailable):
    """The controller answered, with an error status (its body is ``{"error": ...}``)."""

    def __init__(self, status: int, body: dict[str, Any], message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Where:
    """Where the controller is: a URL, or the namespace and name of its Lease and Service (and its pods' port)."""

    namespace: str = "mcad-system"
    name: str = "mcad-controller"
    port: int = 8080
    url: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    token: str | None = None  # the bearer token shown to the controller; None: the kubeconfig's


Query = Sequence[tuple[str, str]]


def pod_of_holder(identity: str) -> str:
    """The pod name in a leader-election identity ``<pod name>_<suffix>`` (pod names never contain ``_``)."""
    return identity.partition("_")[0].strip()


def pod_proxy_base(namespace: str, pod: str, port: int) -> str:
    """The API server's path to ``port`` of a pod: what follows it is the path asked of the pod."""
    return f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy"


def service_proxy_base(namespace: str, service: str) -> str:
    """The API server's path to a Service's ``http`` port: what follows it is the path asked of a pod behind it."""
    return f"/api/v1/namespaces/{namespace}/services/{service}:{SERVICE_PORT_NAME}/proxy"


def leader_service_name(service: str) -> str:
    """The chart's Service that selects the leader's pod alone (the leader labels its pod)."""
    return f"{service}-leader"


def pod_proxy_path(namespace: str, pod: str, port: int, endpoint: str) -> str:
    return f"{pod_proxy_base(namespace, pod, port)}/debug/{endpoint}"


def service_proxy_path(namespace: str, service: str, endpoint: str) -> str:
    return f"{service_proxy_base(namespace, service)}/debug/{endpoint}"


def lease_path(namespace: str, name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"


PROXY_HEADER = "X-Mcad-Authorization"  # mcad.serve.endpointauth.PROXY_HEADER; not imported: mcadctl stays light


_TOKEN_HINT = ("pass --token (or set MCAD_TOKEN), e.g. `--token \"$(kubectl create token SERVICEACCOUNT -n "
               "NAMESPACE)\"` for a ServiceAccount that may list appwrappers where you work (or is bound to the "
               "chart's debug-viewer ClusterRole)")


def no_token_hint(source: str) -> str:
    return (f"{source} authenticates with a client certificate, which the API server does not pass on to the "
            f"controller, and the controller needs a bearer token to check who you are: {_TOKEN_HINT}, or use a "
            "kubeconfig with a token or an exec plugin")


def fetch(where: Where, endpoint: str, query: Query = ()) -> dict[str, Any]:
    """The controller's ``/debug/<endpoint>`` answer (see the module contract for the route taken)."""
    if where.url:
        return _fetch_direct(where, endpoint, query)
    try:
        conn = kube.connect(where.kubeconfig, where.context)
    except KubeConnectError as err:
        raise DebugUnavailable(str(err)) from err
    token = where.token or kube.bearer_token(conn)
    if not token:
        raise DebugUnavailable(no_token_hint(conn.source))
    return _ThroughApiServer(conn, where, endpoint, list(query), token).fetch()


def _direct_token(where: Where, url: str) -> str | None:
    """--url: the given token, else the kubeconfig's if there is one and the URL is this machine's (a
    ``kubectl port-forward``): a kubeconfig's credentials are not sent, over plain HTTP, to wherever --url points
    unless asked with --token. Having none is no error here: a controller run with --insecure-debug-endpoints needs
    none, and one that does answers 401."""
    if where.token:
        return where.token
    if not _loopback(urllib.parse.urlsplit(url).hostname or ""):
        return None
    try:
        return kube.bearer_token(kube.connect(where.kubeconfig, where.context))
    except KubeConnectError:
        return None


def lease_holder(conn: kube.Connection, where: Where) -> str:
    """The pod the Lease ``where.namespace/where.name`` names as the leader ("" when it names none); ``ApiError``
    when it cannot be read (404: there is no such Lease)."""
    lease = kube.request_json(conn, "GET", lease_path(where.namespace, where.name), timeout=where.timeout)
    return pod_of_holder(str((lease.get("spec") or {}).get("holderIdentity") or ""))


# -- directly, to --url ----------------------------------------------------------------------------------------------


def _fetch_direct(where: Where, endpoint: str, query: Query) -> dict[str, Any]:
    assert where.url
    base = where.url if "://" in where.url else f"http://{where.url}"
    url = f"{base.rstrip('/')}/debug/{endpoint}"
    if query:
        url += "?" + urllib.parse.urlencode(list(query))
    headers = {"Accept": "application/json"}
    token = _direct_token(where, url)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=where.timeout) as response:
            status, data = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, data = err.code, err.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise DebugUnavailable(
            f"cannot reach the controller at {url}: {reason} (is the address right, and the port-forward "
            f"running?); drop --url to go through the API server, {_OFFLINE_HINT}") from err
    body = json_object(data)
    if 200 <= status < 300:
        if body is None:
            raise DebugUnavailable(f"{url} answered {status} with something that is not a JSON object; "
                                   "is it the mcad controller's --http-bind-address?")
        return body
    if status == 503 and body and "leader" in body:
        raise DebugUnavailable(
            f"{where.url} is a standby replica, not the leader (the leader is {body.get('leader') or 'unknown'}); "
            "point --url at the leader, or drop --url and mcadctl finds it through the API server")
    if status == 401 and not token:
        raise DebugUnavailable(f"the controller at {url} wants a bearer token and mcadctl has none to send there "
                               f"(a kubeconfig's token goes only to a loopback --url): {_TOKEN_HINT}")
    raise _refused(status, body, data, f"the controller at {url}")


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def json_object(data: bytes) -> dict[str, Any] | None:
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _refused(status: int, body: dict[str, Any] | None, data: bytes, who: str) -> DebugUnavailable:
    if body is not None and "error" in body:
        return ControllerRefused(status, body, f"{who} answered {status}: {body['error']}")
    text = data.decode("utf-8", errors="replace").strip()[:300] or "no message"
    return DebugUnavailable(f"{who} answered {status}: {text}")


# -- through the API server ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Standby:
    """A standby replica's answer through the Service: the leader it names (identity, and its pod)."""

    leader: str
    leader_pod: str


@dataclass
class _ThroughApiServer:
    """One fetch through the API server's proxy: the leader's pod by its Lease, else the Service."""

    conn: kube.Connection
    where: Where
    endpoint: str
    query: list[tuple[str, str]]
    token: str  # the user's, for the controller (the proxy drops Authorization)
    tried: list[str] = field(default_factory=list)  # what failed on the way, for the final message
    pods_refused: bool = False  # the API server refused pods/proxy: only the Service is left

    def fetch(self) -> dict[str, Any]:
        where = self.where
        leader = leader_service_name(where.name)
        answer = self._get(service_proxy_path(where.namespace, leader, self.endpoint),
                           f"the Service {where.namespace}/{leader} (the leader's)", optional=True)
        if isinstance(answer, dict):
            return answer
        holder, lease_missing = self._lease_holder()
        if holder:
            answer = self._get(pod_proxy_path(where.namespace, holder, where.port, self.endpoint),
                               f"the leader's pod {where.namespace}/{holder} (from the Lease)")
            if isinstance(answer, dict):
                return answer
        service = f"the Service {where.namespace}/{where.name}"
        answer = None
        for _ in range(SERVICE_TRIES):
            # The API server sends each request to one replica behind the Service; a standby names the leader.
            answer = self._get(service_proxy_path(where.namespace, where.name, self.endpoint), service)
            if not isinstance(answer, _Standby):
                break
            if answer.leader_pod and not self.pods_refused:
                followed = self._get(pod_proxy_path(where.namespace, answer.leader_pod, where.port, self.endpoint),
                                     f"the leader's pod {where.namespace}/{answer.leader_pod} (named by a standby)",
                                     followed=True)
                if isinstance(followed, dict):
                    return followed
        if isinstance(answer, _Standby):
            raise DebugUnavailable(
                f"{service} answered from a standby replica {SERVICE_TRIES} times (it names "
                f"{answer.leader or 'no one'} as the leader), and the leader's pod could not be asked directly "
                f"({'; '.join(self.tried) or 'no pods/proxy right'}); try again (the API server picks a replica "
                f"per request), {_OFFLINE_HINT}")
        if answer is None and lease_missing and self._service_missing():
            raise DebugUnavailable(self._not_installed())
        if answer is not None:
            return answer
        raise DebugUnavailable(self._nothing_answered())

    def _lease_holder(self) -> tuple[str, bool]:
        """The leader's pod name ("" when none is known), and whether the API server said there is no Lease."""
        where = self.where
        try:
            holder = lease_holder(self.conn, where)
        except ApiError as err:
            self._fail_if_cluster_unreachable(err)
            if err.status == 404:
                self.tried.append(f"no Lease {where.namespace}/{where.name}")
            else:
                # Say 403: a user may be allowed to proxy to the Service without reading Leases.
                self.tried.append(f"reading the Lease {where.namespace}/{where.name} failed ({_short(err)})")
            return "", err.status == 404
        if not holder:
            self.tried.append(f"the Lease {where.namespace}/{where.name} has no holder")
        return holder, False

    def _service_missing(self) -> bool:
        """Whether the Service itself is absent. The service proxy answers 404 both for a missing Service and for a
        Service without an Endpoints object, so only a plain read tells "not installed" apart."""
        where = self.where
        try:
            kube.request_json(self.conn, "GET", f"/api/v1/namespaces/{where.namespace}/services/{where.name}",
                              timeout=where.timeout)
        except ApiError as err:
            return err.status == 404
        return False

    def _get(self, path: str, what: str, *, followed: bool = False,
             optional: bool = False) -> dict[str, Any] | _Standby | None:
        """The answer through one proxy path; None when the API server could not deliver it, or would not through
        a pod (noted in ``tried``); ``_Standby`` when a standby answered. Raises when the controller itself
        refused, when the API server refused the Service route, or for a standby reached by following one.
        ``optional``: a route worth a try (the leader's Service, which an older chart or a single replica without
        leader election lacks), where the API server's refusal is noted, not raised."""
        through_pod = "/pods/" in path
        try:
            return kube.request_json(self.conn, "GET", path, query=self.query, timeout=self.where.timeout,
                                     headers={PROXY_HEADER: f"Bearer {self.token}"})
        except ApiError as err:
            self._fail_if_cluster_unreachable(err)
            body = err.body if isinstance(err.body, dict) else None
            if body is None or body.get("kind") == "Status":
                if err.status == 403 and (through_pod or optional):
                    # The chart's debug-client Role grants no pods/proxy (it would reach every pod of the
                    # namespace): the Service is the route for most users.
                    self.pods_refused = self.pods_refused or through_pod
                    self.tried.append(f"the API server refused to proxy to {what} ({_short(err)})")
                    return None
                if err.status in (401, 403):
                    raise DebugUnavailable(
                        f"the API server {self.conn.server} refused to proxy to {what} ({_short(err)}): your "
                        f"credentials need get on services/proxy named {self.where.name}:{SERVICE_PORT_NAME} in "
                        f"{self.where.namespace} (the chart's debug-client Role); or run `kubectl port-forward` "
                        f"and pass --url, {_OFFLINE_HINT}") from err
                self.tried.append(f"the API server could not reach {what} ({_short(err)})")
                return None
            if err.status == 503 and "leader" in body:  # a standby; "leader" is null while it knows none
                leader = str(body.get("leader") or "")
                if followed:
                    raise DebugUnavailable(
                        f"{what} is a standby replica and names {leader or 'no one'} as the leader, which could "
                        f"not be asked; try again in a few seconds (an election may be under way), "
                        f"{_OFFLINE_HINT}") from err
                return _Standby(leader, pod_of_holder(leader))
            raise ControllerRefused(err.status, body, f"the controller ({what}) answered {err.status}: "
                                    f"{body.get('error')}") from err

    def _fail_if_cluster_unreachable(self, err: ApiError) -> None:
        if err.status == 0:
            raise DebugUnavailable(f"cannot reach the API server {self.conn.server} (from {self.conn.source}): "
                                   f"{err.message}") from err
        if err.status == 401:
            raise DebugUnavailable(f"the API server {self.conn.server} does not accept the credentials in "
                                   f"{self.conn.source} (401 Unauthorized)") from err

    def _not_installed(self) -> str:
        where = self.where
        return (f"no Lease or Service {where.name} in {where.namespace}: is mcad installed? "
                f"(--controller-namespace and --controller-name say where to look) try --url or --offline")

    def _nothing_answered(self) -> str:
        return ("the controller could not be reached through the API server " + self.conn.server + ": "
                + "; ".join(self.tried) + f". Is the controller running? Try --url, {_OFFLINE_HINT}")


def _short(err: ApiError) -> str:
    message = err.message if len(err.message) <= 300 else err.message[:297] + "..."
    return f"{err.status} {err.reason}: {message}" if err.reason else f"{err.status}: {message}"
