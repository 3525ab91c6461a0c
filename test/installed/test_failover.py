"""Leader failover of the chart's Deployment: the leader's pod is deleted (as a node drain or `kubectl delete pod`
does) while AppWrappers are being created. The standby takes the Lease within 30 s, and every AppWrapper is
dispatched exactly once (test.installed.load). Creates go through the webhooks of whichever replica the Service
picks; none may be refused while the leader's pod goes.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import kubernetes.client as k8s

from test.e2e.conftest import conditions_of
from test.installed.conftest import CONTROLLER, NAMESPACE, Installation, record
from test.installed.load import DeploymentWatch, SteadyCreates, dispatched_once
from test.support import wait_until


def micro_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_standby_takes_over_and_every_appwrapper_is_dispatched_once(
        installation: Installation, namespace: str, api: k8s.ApiClient) -> None:
    custom = k8s.CustomObjectsApi(api)
    leader = installation.holder()
    assert leader is not None
    deployments = DeploymentWatch(k8s.AppsV1Api(api), namespace)
    creates = SteadyCreates(custom, namespace, count=40, pace=4.0).start()
    try:
        wait_until(lambda: len(creates.created) >= 10, 60, "the first 10 AppWrappers created")
        deleted_at, deleted_wall = time.monotonic(), datetime.now(UTC)
        installation.kubectl("-n", NAMESPACE, "delete", "pod", leader, "--wait=false")
        new = wait_until(lambda: (h := installation.holder()) not in (None, leader) and h, 30,
                         f"a new leader other than {leader}")
        takeover = time.monotonic() - deleted_at
        creates.join()
        items = dispatched_once(custom, namespace, creates, deployments)
    finally:
        deployments.stop()
    # The new leader's first dispatch: the first one after it acquired the Lease (the old leader may still have
    # dispatched between the delete and its SIGTERM).
    lease = installation.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{CONTROLLER}")
    acquired = max(deleted_wall, micro_time(lease["spec"]["acquireTime"]))
    after = sorted(t for aw in items for c in conditions_of(aw["status"], "Dispatched")
                   if (t := micro_time(c["lastTransitionMicroTime"])) >= acquired)
    assert after, "the new leader dispatched nothing"
    record("leader failover: pod deleted -> new Lease holder", f"{takeover:.1f} s ({leader} -> {new})")
    record("leader failover: pod deleted -> the new leader's first dispatch",
           f"{(after[0] - deleted_wall).total_seconds():.1f} s")
