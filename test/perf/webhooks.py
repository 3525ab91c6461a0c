"""The admission webhooks of a bench controller, registered against the scenario's API server as an installation
registers them (for throughput_webhooks' figure with webhooks on).

Contract:
- ``register(api, port)`` creates the controller's namespace (``NAMESPACE``) and applies what the chart renders
  for the webhooks (``helm template`` of charts/mcad with ``webhook.url=https://127.0.0.1:<port>``, as the demos
  and the e2e suite register them for a controller running on this host): the empty certificate Secret and the
  Validating and Mutating WebhookConfigurations for AppWrappers (CREATE and UPDATE, failurePolicy Fail,
  timeoutSeconds 10, every namespace). It returns the controller flags that serve them: the controller issues its
  CA and serving certificate into that Secret and patches the CA bundle into both configurations. From then on
  every AppWrapper create and update of the scenario goes through the controller. ``creator="policy"`` (the
  bench's --webhook-creator): the chart's MutatingAdmissionPolicy and its binding instead of the Mutating
  configuration, so the API server records the creator itself and calls only the validating webhook.
  ``ca_bundle`` given: another server answers on that port (``test.perf.nullwebhook``); its CA is put into the
  configurations as they are applied, and the controller serves nothing.
- ``wait_admitting(api, readyz_url, alive)`` returns once the controller answers /readyz (its certificate is
  loaded) and the API server actually reviews through it: a dry-run create of a good AppWrapper comes back with
  the creator annotation (set by the mutating webhook or the policy), and a dry-run create of a nested AppWrapper
  is refused by the validating webhook. Until the CA bundle is patched in, the API server cannot call the
  webhooks and refuses creates (failurePolicy Fail); that is what is waited out. ``BenchError`` after the timeout,
  saying what was last seen.
- ``wait_reviewed(api, requests)``: the same for the null webhook, which refuses nothing: a dry-run create comes
  back with the creator annotation, and the server's count of ``requests`` answered has risen.
"""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from test.perf.client import Api, ApiError, Obj
from test.perf.harness import BenchError, appwrapper, aw_path, configmap_item, create_namespace, wait_for
from test.support import free_port as support_free_port

NAMESPACE = "mcad-system"  # the chart's namespace: the certificate Secret lives here
CREATOR_ANNOTATION = "workload.codeflare.dev/creator"  # mcad.admission.review.CREATOR_ANNOTATION
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
CONFIGURATIONS = {"ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
                  "MutatingWebhookConfiguration": "mutatingwebhookconfigurations"}
# webhook.creator=policy: the creator is recorded by these instead of the mutating webhook (served as v1beta1 by the
# bench's 1.35 API server, which hack/localcluster.py starts with the API on).
POLICIES = {"MutatingAdmissionPolicy": "mutatingadmissionpolicies",
            "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings"}
HOST = "127.0.0.1"


def free_port() -> int:
    """A port nothing listens on now, below the ephemeral range (``test.support.free_port``): the controller logs
    at warning level, so a port it chose itself would not be printed."""
    return support_free_port(HOST)


def username(api: Api) -> str:
    """Who ``api`` is (a SelfSubjectReview): the bench's controller runs with the same kubeconfig."""
    review = api.create("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["username"])


def rendered(port: int, controller_user: str = "", creator: str = "webhook") -> list[Obj]:
    """The chart's webhook objects for a controller at https://127.0.0.1:<port>: Secret and both configurations.
    ``controller_user``: the controller's identity when it is not the chart's ServiceAccount, left out of the status
    webhook as the chart leaves its own ServiceAccount out (else every status write of the controller would be
    reviewed, which no installation does)."""
    from test import chart  # runs helm: only where webhooks are wanted

    writers = [f"webhook.statusWriters[0]={controller_user}"] if controller_user else []
    docs = chart.render("replicaCount=0", f"webhook.url=https://{HOST}:{port}", f"webhook.creator={creator}",
                        *writers)
    wanted = [d for d in docs if d.get("kind") in CONFIGURATIONS or d.get("kind") in POLICIES
              or (d.get("kind") == "Secret" and d["metadata"]["name"].endswith("-webhook-cert"))]
    kinds = sorted(d["kind"] for d in wanted)
    expected = sorted(["Secret", "ValidatingWebhookConfiguration", *(
        POLICIES if creator == "policy" else ["MutatingWebhookConfiguration"])])
    if kinds != expected:
        raise BenchError(f"the chart rendered {kinds} for its webhooks, not {expected}")
    return wanted


def admission_path(obj: Obj) -> str:
    """Where a rendered policy, policy binding or webhook configuration lives in the API."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind in POLICIES:
        return f"/apis/{obj['apiVersion']}/{POLICIES[kind]}/{name}"
    return f"{ADMISSION_API}/{CONFIGURATIONS[kind]}/{name}"


def register(api: Api, port: int, creator: str = "webhook", ca_bundle: bytes = b"") -> tuple[str, ...]:
    """Apply the chart's webhook objects (``creator``: the chart's webhook.creator); return the controller flags
    that serve them on ``port``. ``ca_bundle``: a server other than the controller answers on ``port`` (the null
    webhook); its CA goes into the configurations now, and the flags are not wanted."""
    create_namespace(api, NAMESPACE)
    secret = configuration = ""
    for obj in rendered(port, username(api), creator):
        name = obj["metadata"]["name"]
        if obj["kind"] == "Secret":
            secret = name
            api.apply(f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}", obj, "mcad-bench")
        else:
            if obj["kind"] not in POLICIES:
                configuration = name
                if ca_bundle:
                    for webhook in obj["webhooks"]:
                        webhook["clientConfig"]["caBundle"] = base64.b64encode(ca_bundle).decode()
            api.apply(admission_path(obj), obj, "mcad-bench")
    # No drain at shutdown: the API server calls this one process by URL, not through a Service whose endpoints
    # must first drop it.
    return ("--webhook", "--webhook-bind-address", f"{HOST}:{port}", "--webhook-cert-hosts", HOST,
            "--webhook-cert-namespace", NAMESPACE, "--webhook-cert-secret", secret,
            "--webhook-configuration-name", configuration, "--webhook-creator", creator, "--webhook-drain-seconds", "0")


def wait_reviewed(api: Api, requests: Callable[[], int], timeout: float = 60) -> None:
    """Wait until the API server reviews AppWrappers through a server that allows everything (the null webhook,
    whose ``requests`` answered so far are given): a dry-run create comes back with the creator annotation and
    the server counted its call. ``BenchError`` after the timeout, saying what was last seen."""
    last = [""]
    name = "bench-admission-check"
    good = appwrapper(name, [configmap_item(name, {"cpu": "10m"})])

    def reviewed() -> bool:
        before = requests()
        try:
            created = api.request("POST", aw_path(), good, query={"dryRun": "All"})
        except ApiError as err:
            last[0] = f"dry-run create refused: {err}"
            return False
        if CREATOR_ANNOTATION not in (created.get("metadata", {}).get("annotations") or {}):
            last[0] = f"dry-run create came back without {CREATOR_ANNOTATION}"
            return False
        if requests() <= before:
            last[0] = "the dry-run create did not reach the webhook server"
            return False
        return True

    try:
        wait_for(reviewed, timeout, "admission through the null webhook", interval=0.2)
    except BenchError as err:
        raise BenchError(f"{err}; last: {last[0]}") from None


def _readyz(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read(300).decode(errors="replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read(300).decode(errors="replace")
    except OSError as err:
        return 0, str(err)


def wait_admitting(api: Api, readyz_url: str, alive: Callable[[], None], timeout: float = 120) -> None:
    """Wait until the controller is ready and both webhooks review AppWrappers (see the module docstring)."""
    last = [""]

    def ready() -> bool:
        code, body = _readyz(readyz_url)
        last[0] = f"/readyz answered {code}: {body.strip()}"
        return code == 200

    try:
        wait_for(ready, timeout, "the controller's /readyz", interval=0.2, alive=alive)
    except BenchError as err:
        raise BenchError(f"{err}; last: {last[0]}") from None
    name = "bench-admission-check"
    good = appwrapper(name, [configmap_item(name, {"cpu": "10m"})])
    nested = appwrapper(name, [{"replicas": 1, "generictemplate": appwrapper("inner", [])}])

    def reviewed() -> bool:
        try:
            created = api.request("POST", aw_path(), good, query={"dryRun": "All"})
        except ApiError as err:  # the CA bundle not yet patched in: the API server cannot call the webhook
            last[0] = f"dry-run create refused: {err}"
            return False
        annotations: dict[str, Any] = created.get("metadata", {}).get("annotations") or {}
        if CREATOR_ANNOTATION not in annotations:
            last[0] = f"dry-run create came back without {CREATOR_ANNOTATION}: the mutating webhook did not run"
            return False
        try:
            api.request("POST", aw_path(), nested, query={"dryRun": "All"})
        except ApiError as err:
            if "denied the request" in str(err) and "another AppWrapper" in str(err):
                return True
            last[0] = f"the nested AppWrapper was refused, but not by the validating webhook: {err}"
            return False
        last[0] = "a nested AppWrapper was admitted: the validating webhook did not run"
        return False

    try:
        wait_for(reviewed, timeout, "admission through the webhooks", interval=0.2, alive=alive)
    except BenchError as err:
        raise BenchError(f"{err}; last: {last[0]}") from None
