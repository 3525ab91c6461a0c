"""Steady AppWrapper load while the installation changes (a leader going, a rolling upgrade), and the proof that
every AppWrapper was dispatched exactly once.

``SteadyCreates`` creates ``count`` AppWrappers, each wrapping a one-pod Deployment of 10m, at ``pace`` a second in
a thread, retrying a refused create (counted in ``refused``, which a test expects empty). ``DeploymentWatch``
records every uid each wrapped Deployment ever had, from a watch started before the first create: a Deployment
deleted and created again (a second dispatch) shows two. ``dispatched_once`` waits until every AppWrapper is
Running and checks both records.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import kubernetes.client as k8s
from kubernetes import watch

from test.e2e.conftest import appwrapper, conditions_of, deployment_item
from test.support import wait_until

GROUP, VERSION, PLURAL = "workload.codeflare.dev", "v1beta1", "appwrappers"


class DeploymentWatch:
    """Every uid seen for each Deployment name of a namespace."""

    def __init__(self, apps: k8s.AppsV1Api, namespace: str) -> None:
        self.uids: dict[str, set[str]] = defaultdict(set)
        self._watch = watch.Watch()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(apps, namespace), daemon=True)
        self._thread.start()

    def _run(self, apps: k8s.AppsV1Api, namespace: str) -> None:
        # Each new watch lists first, so a Deployment made between two watches is still seen.
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(apps.list_namespaced_deployment, namespace, timeout_seconds=30):
                    self.uids[event["object"].metadata.name].add(event["object"].metadata.uid)
            except Exception:  # the stream cut by stop(), or a dropped connection: the next round lists again
                if self._stop.is_set():
                    return

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()


class SteadyCreates:
    def __init__(self, custom: k8s.CustomObjectsApi, namespace: str, count: int, pace: float) -> None:
        self.custom = custom
        self.namespace = namespace
        self.names = [f"aw-{i:03d}" for i in range(count)]
        self.pace = pace
        self.created: list[str] = []
        self.refused: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SteadyCreates:
        self._thread.start()
        return self

    def _run(self) -> None:
        for name in self.names:
            body = appwrapper(name, deployment_item(name, 1, "10m", memory="16Mi"))
            for _ in range(20):
                try:
                    self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
                    self.created.append(name)
                    break
                except k8s.exceptions.ApiException as err:
                    self.refused.append(f"{name}: {err.status} {err.body}")
                    time.sleep(0.5)
            time.sleep(1 / self.pace)

    def join(self, timeout: float = 180) -> None:
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), "the creates did not finish"


def dispatched_once(custom: k8s.CustomObjectsApi, namespace: str, creates: SteadyCreates,
                    deployments: DeploymentWatch, timeout: float = 120) -> list[dict[str, Any]]:
    """Wait until every AppWrapper of ``creates`` is Running; check each was dispatched once; return them."""
    count = len(creates.names)

    def all_running() -> list[dict[str, Any]] | None:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        done = [aw for aw in items if (aw.get("status") or {}).get("state") == "Running"]
        return items if len(done) == count else None

    items = wait_until(all_running, timeout, f"all {count} AppWrappers Running")
    assert sorted(creates.created) == creates.names
    assert not creates.refused, f"creates refused: {creates.refused}"
    once = {aw["metadata"]["name"]: len(conditions_of(aw["status"], "Dispatched")) for aw in items}
    assert set(once.values()) == {1}, f"dispatches recorded per AppWrapper: {once}"
    twice = {name: uids for name, uids in deployments.uids.items() if len(uids) != 1}
    assert not twice, f"Deployments created more than once: {twice}"
    assert set(deployments.uids) == set(creates.names)
    return items
