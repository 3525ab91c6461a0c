"""No takeover: an AppWrapper naming an object that exists and is not its own fails, and leaves that object alone.

An AppWrapper naming an admin's Secret and ConfigMap, or another AppWrapper's Deployment, must not overwrite them
(as server-side apply with force would), take them over, or delete them when it goes. Each scenario here checks that
the existing object keeps its data (or image), its owners, its managedFields (who wrote it, and when) and, where
nobody else writes a status, its resourceVersion; that the AppWrapper is Failed with a message naming the item, and
that deleting the AppWrapper deletes nothing of theirs.
"""

from __future__ import annotations

import os
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test.e2e.conftest import AppWrappers, Controller, appwrapper, deployment_item
from test.support import wait_until


def configmap_item(name: str, **data: str) -> dict[str, Any]:
    return {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                               "data": data or {"taken": "over"}}}


def secret_item(name: str) -> dict[str, Any]:
    return {"replicas": 1, "generictemplate": {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                                               "stringData": {"password": "attacker-chosen"}}}


def raw(aws: AppWrappers, api_version: str, kind: str, name: str) -> dict[str, Any]:
    return kube.request_json(aws.connection, "GET", aws.client.object_path(api_version, kind, aws.namespace, name))


def fingerprint(obj: dict[str, Any]) -> dict[str, Any]:
    """What a takeover would change: content, owners, and who wrote which fields of the object when.

    Every write to the object itself (not its status) changes one manager's entry or adds one: a manager's entry
    carries the time of its last write. Status writes are left out: a Deployment's status is the Deployment
    controller's to write whenever its pods change, so the resourceVersion is no fingerprint of it."""
    meta = obj["metadata"]
    own_writes = sorted((m["manager"], m["operation"], m.get("time"))
                        for m in meta.get("managedFields") or [] if m.get("subresource") != "status")
    return {"uid": meta["uid"], "generation": meta.get("generation"),
            "ownerReferences": meta.get("ownerReferences"), "labels": meta.get("labels"),
            "annotations": meta.get("annotations"), "managers": own_writes,
            "data": obj.get("data"), "spec": obj.get("spec")}


def exactly(obj: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint of an object without a status (a Secret, a ConfigMap): any write changes its version."""
    return {**fingerprint(obj), "resourceVersion": obj["metadata"]["resourceVersion"]}


def settled_after_deletion(aws: AppWrappers, name: str) -> None:
    """``name`` is deleted and the controller has acted on it: the AppWrapper is gone, and one created after it
    ran (the controller handles its events in order, and deletes a gone AppWrapper's objects before later work
    of the same namespace is reported Running)."""
    aws.delete(name)
    wait_until(lambda: not aws.exists("workload.codeflare.dev/v1beta1", "AppWrapper", name), 30,
               f"AppWrapper {name} gone")
    marker = f"{name}-after"
    aws.create(appwrapper(marker, configmap_item(f"{marker}-cm")))
    aws.wait_state(marker, "Running", timeout=30)


def test_an_admins_secret_and_configmap_are_neither_overwritten_nor_deleted(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    core.create_namespaced_secret(aws.namespace, {"metadata": {"name": "db-credentials"},
                                                  "stringData": {"password": "admin-secret"}})
    core.create_namespaced_config_map(aws.namespace, {"metadata": {"name": "app-config"},
                                                      "data": {"mode": "production"}})
    before = {"Secret": exactly(raw(aws, "v1", "Secret", "db-credentials")),
              "ConfigMap": exactly(raw(aws, "v1", "ConfigMap", "app-config"))}

    # A new object first: it is created, then taken back when the next item turns out to be someone else's.
    aws.create(appwrapper("steal-secret", configmap_item("fresh"), secret_item("db-credentials")))
    aws.create(appwrapper("steal-config", configmap_item("app-config", mode="debug")))
    secret_status = aws.wait_state("steal-secret", "Failed", timeout=30)
    config_status = aws.wait_state("steal-config", "Failed", timeout=30)
    # The chart's controller may not read Secrets at all (only create and delete them), so it cannot tell whose
    # this one is either.
    refusal = ("exists and is not controlled by this AppWrapper" if os.environ.get("MCAD_E2E_ADMIN") == "1" else
               "exists, and the controller may not read it to tell whether it is this AppWrapper's")
    assert f"GenericItems[1] (Secret db-credentials) {refusal}" in secret_status["message"], secret_status
    assert ("GenericItems[0] (ConfigMap app-config) exists and is not controlled by this AppWrapper"
            in config_status["message"]), config_status
    wait_until(lambda: not aws.exists("v1", "ConfigMap", "fresh"), 15, "the dispatch's own ConfigMap undone")
    assert exactly(raw(aws, "v1", "Secret", "db-credentials")) == before["Secret"]
    assert exactly(raw(aws, "v1", "ConfigMap", "app-config")) == before["ConfigMap"]

    settled_after_deletion(aws, "steal-secret")
    settled_after_deletion(aws, "steal-config")
    assert exactly(raw(aws, "v1", "Secret", "db-credentials")) == before["Secret"]
    assert exactly(raw(aws, "v1", "ConfigMap", "app-config")) == before["ConfigMap"]


def test_another_appwrappers_deployment_is_not_taken_over_and_it_keeps_running(
        controller: Controller, aws: AppWrappers) -> None:
    aws.create(appwrapper("bob", deployment_item("web", 1, "10m")))
    aws.wait_state("bob", "Running", timeout=30)
    aws.wait_pods("bob", 1)

    def rolled_out() -> dict[str, Any] | None:
        web = raw(aws, "apps/v1", "Deployment", "web")
        status = web.get("status") or {}
        done = status.get("observedGeneration") == web["metadata"]["generation"] and status.get("availableReplicas")
        return web if done else None

    before = fingerprint(wait_until(rolled_out, 30, "bob's Deployment rolled out"))

    thief = deployment_item("web", 1, "10m")
    thief["generictemplate"]["spec"]["template"]["spec"]["containers"][0]["image"] = "attacker/miner:latest"
    aws.create(appwrapper("alice", thief))
    status = aws.wait_state("alice", "Failed", timeout=30)
    assert "GenericItems[0] (Deployment web) exists and is not controlled by this AppWrapper" in status["message"]
    after = fingerprint(raw(aws, "apps/v1", "Deployment", "web"))
    assert after == before, "bob's Deployment must be untouched"
    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == "kicbase/echo-server:1.0"

    settled_after_deletion(aws, "alice")
    assert fingerprint(raw(aws, "apps/v1", "Deployment", "web"))["uid"] == before["uid"]
    assert aws.status("bob")["state"] == "Running"
    assert len(aws.pods("bob", "Running")) == 1


@pytest.mark.parametrize("restart", [False, True], ids=["uid-recorded", "after-restart"])
def test_cleanup_never_deletes_a_namesake_someone_else_created_since(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api, restart: bool) -> None:
    """The cleanup deletes by the uid it recorded at dispatch or, after a restart (nothing recorded), by checking
    the owner first: either way the namesake stays."""
    aws.create(appwrapper("mine", configmap_item("shared", origin="appwrapper")))
    aws.wait_state("mine", "Running", timeout=30)
    created = raw(aws, "v1", "ConfigMap", "shared")
    if restart:
        controller.stop()
    # Someone else deletes it and makes their own under the same name (no owner: the garbage collector keeps it).
    core.delete_namespaced_config_map("shared", aws.namespace)
    wait_until(lambda: not aws.exists("v1", "ConfigMap", "shared"), 15, "ConfigMap shared deleted")
    core.create_namespaced_config_map(aws.namespace, {"metadata": {"name": "shared"}, "data": {"origin": "admin"}})
    replacement = raw(aws, "v1", "ConfigMap", "shared")
    assert replacement["metadata"]["uid"] != created["metadata"]["uid"]
    if restart:
        controller.start()

    settled_after_deletion(aws, "mine")
    assert exactly(raw(aws, "v1", "ConfigMap", "shared")) == exactly(replacement)
