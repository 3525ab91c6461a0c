"""`helm upgrade` changing a controller flag, as an admin does: the Deployment rolls (one new pod at a time, the old
leader handing the Lease over as it terminates), the new pods run with the new flag, and AppWrappers created
throughout are each dispatched exactly once (test.installed.load). The release is put back afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.client as k8s

from mcad.model.reservations import DEFAULT_RESERVATIONS
from test.installed.conftest import Installation, record
from test.installed.load import DeploymentWatch, SteadyCreates, dispatched_once
from test.support import wait_until


def rolled(installation: Installation, old: set[str], flag: str) -> str | None:
    """The leader, once two new pods (none of ``old``) are Ready with ``flag`` and one of them leads."""
    pods = installation.ready_pods()
    fresh = [p for p in pods if p["metadata"]["name"] not in old
             and flag in p["spec"]["containers"][0]["args"]]
    leader = installation.holder()
    names = {p["metadata"]["name"] for p in fresh}
    return leader if len(fresh) == 2 and len(pods) == 2 and leader in names else None


def test_an_upgrade_of_a_flag_rolls_the_pods_without_losing_or_repeating_a_dispatch(
        installation: Installation, namespace: str, api: k8s.ApiClient, tmp_path: Path) -> None:
    custom = k8s.CustomObjectsApi(api)
    values: dict[str, Any] = installation.values()
    old = {p["metadata"]["name"] for p in installation.pods()}
    deployments = DeploymentWatch(k8s.AppsV1Api(api), namespace)
    creates = SteadyCreates(custom, namespace, count=40, pace=2.0).start()
    try:
        wait_until(lambda: len(creates.created) >= 5, 60, "the first 5 AppWrappers created")
        upgraded = {**values, "controller": {**values.get("controller", {}), "reservations": 4}}
        installation.upgrade(upgraded, tmp_path)
        leader = wait_until(lambda: rolled(installation, old, "--reservations=4"), 180,
                            "the Deployment to roll to two new pods with --reservations=4, one leading")
        creates.join()
        dispatched_once(custom, namespace, creates, deployments)
    finally:
        deployments.stop()
        current = {p["metadata"]["name"] for p in installation.pods()}
        installation.upgrade(values, tmp_path)
        wait_until(lambda: rolled(installation, current, f"--reservations={DEFAULT_RESERVATIONS}"), 180,
                   "the release put back")
    record("helm upgrade: new pods leading", leader)
