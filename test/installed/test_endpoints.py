"""The controller's HTTP port as an installation exposes it: through the chart's Services (ClusterIPs that kube-proxy
routes on this machine, the real node) and to the kubelet's probes.

/healthz and /readyz answer anyone; /metrics answers only a bearer token whose user may get it (the chart's
ClusterRole mcad-metrics-reader): none is 401, one without the right 403. The leader Service reaches the leader
alone. The probes: both pods Ready (readiness on /readyz) and never restarted (liveness on /healthz).
"""

from __future__ import annotations

import re

from test.installed.conftest import CONTROLLER, NAMESPACE, RELEASE, Installation, http_get


def gauge(metrics: str, name: str) -> float:
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", metrics, re.MULTILINE)
    assert match, f"no {name} in the metrics"
    return float(match.group(1))


def test_health_answers_anyone_through_the_service(installation: Installation) -> None:
    url = installation.service_url(CONTROLLER, "http")
    for path in ("/healthz", "/readyz"):
        status, body = http_get(url + path)
        assert status == 200, (path, status, body)


def test_metrics_through_the_services_need_a_token_with_the_right(installation: Installation) -> None:
    url = installation.service_url(CONTROLLER, "http")
    assert http_get(url + "/metrics")[0] == 401
    stranger = installation.token(NAMESPACE, "e2e-stranger")
    assert http_get(url + "/metrics", stranger)[0] == 403
    reader = installation.token(NAMESPACE, "e2e-metrics-reader", cluster_roles=(f"{RELEASE}-metrics-reader",))
    status, metrics = http_get(url + "/metrics", reader)
    assert status == 200, metrics
    assert gauge(metrics, "mcad_build_info") == 1
    # The leader Service selects the pod the leader labels: its metrics say it leads.
    leader_url = installation.service_url(f"{CONTROLLER}-leader", "http")
    for _ in range(5):  # every answer, not one that happened to be the leader's
        status, metrics = http_get(leader_url + "/metrics", reader)
        assert status == 200
        assert gauge(metrics, "mcad_leader") == 1


def test_each_replica_passes_its_probes_and_one_leads(installation: Installation) -> None:
    reader = installation.token(NAMESPACE, "e2e-metrics-reader", cluster_roles=(f"{RELEASE}-metrics-reader",))
    pods = installation.ready_pods()
    assert len(pods) == 2
    leading = []
    for pod in pods:
        statuses = pod["status"]["containerStatuses"]
        assert [s["restartCount"] for s in statuses] == [0], statuses
        assert pod["spec"]["nodeName"] == installation.real_node()
        status, metrics = http_get(f"http://{pod['status']['podIP']}:8080/metrics", reader)
        assert status == 200
        leading.append(gauge(metrics, "mcad_leader"))
    assert sorted(leading) == [0, 1]
