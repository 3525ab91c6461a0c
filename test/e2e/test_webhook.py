"""The admission webhooks against the real API server: registered by the chart, served by the controller over TLS
with the certificate it manages, failing closed while no controller answers."""

from __future__ import annotations

import base64
import datetime
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from cryptography import x509

from mcad.admission import certs
from mcad.k8s import kube
from test import chart
from test.e2e.conftest import LOGS, AppWrappers, Controller, appwrapper, deployment_item
from test.support import REPO, wait_until

# A small bound, so an AppWrapper over it is easy to send: the webhook refuses AdmissionReviews over
# 4 x 1 KiB + 256 KiB unread (413), and the API server then refuses the create.
CONTROLLER_ARGS = ("--log-level", "debug", "--max-appwrapper-bytes", "1024")
SECRET_PATH = f"/api/v1/namespaces/{chart.NAMESPACE}/secrets/{chart.RELEASE}-webhook-cert"
CONFIGS = [f"{certs.ADMISSION_API}/{kind}/{chart.RELEASE}" for kind in certs.CONFIGURATION_KINDS]
# The chart's webhooks: validate and status (validating configuration), mutate.
WEBHOOKS = 3


@pytest.fixture
def admin(kubeconfig: str) -> kube.Connection:
    return kube.connect(kubeconfig)


def secret_material(admin: kube.Connection) -> certs.Material:
    material = certs.Material.from_secret_data(kube.request_json(admin, "GET", SECRET_PATH).get("data"))
    assert material is not None, "the webhook Secret holds no certificate"
    return material


def ca_bundles(admin: kube.Connection) -> list[bytes]:
    """caBundle of every webhook of both configurations."""
    return [base64.b64decode(hook["clientConfig"].get("caBundle") or "")
            for path in CONFIGS for hook in kube.request_json(admin, "GET", path)["webhooks"]]


def write_material(admin: kube.Connection, material: certs.Material | None) -> None:
    secret = kube.request_json(admin, "GET", SECRET_PATH)
    secret["data"] = material.as_secret_data() if material is not None else {}
    kube.request_json(admin, "PUT", SECRET_PATH, body=secret)


def create_error(aws: AppWrappers, body: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(k8s.exceptions.ApiException) as info:
        aws.create(body)
    return int(info.value.status), str(json.loads(info.value.body or "{}").get("message"))


def absent(aws: AppWrappers, name: str) -> bool:
    try:
        aws.get(name)
    except k8s.exceptions.ApiException as err:
        return bool(err.status == 404)
    return False


def test_an_appwrapper_create_goes_through_both_webhooks(controller: Controller, aws: AppWrappers,
                                                          admin: kube.Connection) -> None:
    size = controller.log.stat().st_size
    aws.create(appwrapper("through", deployment_item("through", 1, "10m")))
    aws.wait_state("through", "Running")
    # The API server called this controller, over TLS it verified with the bundle the controller patched in.
    logged = controller.log.read_bytes()[size:]
    assert re.search(rb'"POST /mutate\?timeout=10s HTTP/1.1" 200', logged), logged.decode()[-2000:]
    assert re.search(rb'"POST /validate\?timeout=10s HTTP/1.1" 200', logged), logged.decode()[-2000:]
    bundle = secret_material(admin).ca_bundle
    assert ca_bundles(admin) == [bundle] * WEBHOOKS


def test_an_oversized_appwrapper_is_refused_by_the_webhook_unread(controller: Controller, aws: AppWrappers) -> None:
    item = {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
                                               "data": {"blob": "x" * 300_000}}}
    status, message = create_error(aws, appwrapper("oversized", item))
    assert status == 500, message
    assert 'failed calling webhook "mutate.appwrappers.workload.codeflare.dev"' in message, message
    assert absent(aws, "oversized")
    assert re.search(rb'"POST /mutate\?timeout=10s HTTP/1.1" 413', controller.log.read_bytes())


def test_webhook_down_creates_fail_clearly_and_nothing_is_admitted(controller: Controller, aws: AppWrappers,
                                                                    kubeconfig: str) -> None:
    controller.stop()
    try:
        status, message = create_error(aws, appwrapper("while-down", deployment_item("while-down", 1, "10m")))
        # What kubectl prints too: the API server names the webhook and why it could not call it.
        assert status == 500, message
        assert re.search(r'failed calling webhook "mutate\.appwrappers\.workload\.codeflare\.dev": .*'
                         r'https://[\d.]+:\d+/mutate.*connection refused', message), message
        assert absent(aws, "while-down")
        kubectl = shutil.which("kubectl") or str(REPO / ".dev" / "bin" / "kubectl")
        manifest = json.dumps({**appwrapper("by-kubectl", deployment_item("by-kubectl", 1, "10m")),
                               "metadata": {"name": "by-kubectl", "namespace": aws.namespace}})
        proc = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "create", "-f", "-"],
                              input=manifest, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode != 0
        assert 'Error from server (InternalError)' in proc.stderr, proc.stderr
        assert "failed calling webhook" in proc.stderr and "connection refused" in proc.stderr, proc.stderr
        assert absent(aws, "by-kubectl")
    finally:
        controller.start()
    aws.create(appwrapper("after", deployment_item("after", 1, "10m")))
    aws.wait_state("after", "Running")


def test_a_near_expiry_certificate_is_renewed_and_the_ca_bundle_repatched(
        controller: Controller, aws: AppWrappers, admin: kube.Connection) -> None:
    hosts = certs.service_hosts("mcad-controller", chart.NAMESPACE, [chart.webhook_host()])
    now = datetime.datetime.now(datetime.UTC)
    # A CA with 100 days left (under a certificate's 90 plus the 30-day margin: it must be replaced) that signed,
    # 89 days ago when it had more left, a serving certificate with one day left.
    ca = certs.issue(hosts, now - certs.CA_LIFETIME + datetime.timedelta(days=100))
    old = certs.issue(hosts, now - certs.CERT_LIFETIME + datetime.timedelta(days=1), ca)
    assert old.ca_bundle == ca.ca_bundle
    assert "expires" in (certs.renewal_reason(old, hosts, now) or "")
    write_material(admin, old)

    def replaced() -> certs.Material | None:
        material = secret_material(admin)
        return material if material.cert != old.cert else None

    renewed = wait_until(replaced, 30, "the renewal")
    cert = x509.load_pem_x509_certificate(renewed.cert)
    assert cert.not_valid_after_utc > now + certs.CERT_LIFETIME - datetime.timedelta(hours=1)
    new_ca, kept = x509.load_pem_x509_certificates(renewed.ca_bundle)
    assert kept == old.authority().cert  # type: ignore[union-attr]
    assert new_ca != kept
    wait_until(lambda: ca_bundles(admin) == [renewed.ca_bundle] * WEBHOOKS, 30, "the caBundle re-patched")
    aws.create(appwrapper("renewed", deployment_item("renewed", 1, "10m")))  # the API server trusts the new one

    # Someone resets caBundle: the controller puts it back at its next poll.
    foreign = base64.b64encode(certs.issue(hosts, now).ca_bundle).decode()
    for path in CONFIGS:
        kube.request_json(admin, "PATCH", path, content_type="application/json-patch+json",
                          body=[{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": foreign}])
    wait_until(lambda: ca_bundles(admin) == [renewed.ca_bundle] * WEBHOOKS, 30, "the reset caBundle re-patched")


def ready(ctl: Controller) -> tuple[int, str]:
    return ctl.get("/readyz")


@pytest.fixture
def stopped(controller: Controller) -> Iterator[Controller]:
    """The module's controller stopped for the test: the test runs its own."""
    controller.stop()
    try:
        yield controller
    finally:
        controller.start()


def test_readiness_waits_for_the_certificate(stopped: Controller, controller_kubeconfig: str, tmp_path: Path) -> None:
    """With --webhook-cert-dir empty, the replica is not ready; once the files land it loads them and is."""
    ctl = Controller(controller_kubeconfig, LOGS / "test_webhook-readiness.log", "--webhook-bind-address",
                     "127.0.0.1:0", "--webhook-cert-dir", str(tmp_path), "--webhook-cert-poll-seconds", "1")
    ctl.log.unlink(missing_ok=True)
    try:
        ctl.start()
        # Once the informers have synced, only the certificate is missing.
        wait_until(lambda: ready(ctl) == (503, "the webhook certificate is not loaded yet\n"), 30,
                   "readiness to wait on the certificate alone")
        material = certs.issue(("127.0.0.1",), datetime.datetime.now(datetime.UTC))
        (tmp_path / "tls.key").write_bytes(material.key)
        (tmp_path / "tls.crt").write_bytes(material.cert)
        wait_until(lambda: ready(ctl)[0] == 200, 30, "the controller to be ready")
    finally:
        ctl.stop()


def test_two_replicas_starting_together_converge_on_one_certificate(
        stopped: Controller, controller_kubeconfig: str, admin: kube.Connection, aws: AppWrappers) -> None:
    write_material(admin, None)  # as the chart creates it: empty
    replicas = [Controller(controller_kubeconfig, LOGS / f"test_webhook-replica-{x}.log", "--leader-elect",
                           "--leader-elect-namespace", chart.NAMESPACE, "--leader-elect-lease-name", chart.LEASE)
                for x in "ab"]
    for ctl in replicas:
        ctl.log.unlink(missing_ok=True)
    try:
        for ctl in replicas:
            ctl.launch()  # both at once: both find the Secret empty
        for ctl in replicas:
            ctl.wait_ready(b"leader")  # "became leader" or "waiting for leadership", then its certificate loaded
        material = secret_material(admin)

        def last_loaded(ctl: Controller) -> str:
            found = re.findall(rb"webhook certificate loaded.*?fingerprint=(\w+)", ctl.log.read_bytes())
            return found[-1].decode() if found else ""

        wait_until(lambda: all(last_loaded(c) == material.fingerprint for c in replicas), 30,
                   "both replicas to serve the Secret's certificate")
        assert ca_bundles(admin) == [material.ca_bundle] * WEBHOOKS
        # Through either replica (the kernel spreads connections over both), creates are admitted.
        for i in range(4):
            aws.create(appwrapper(f"converged-{i}", deployment_item(f"converged-{i}", 1, "10m")))
    finally:
        for ctl in replicas:
            ctl.stop()
