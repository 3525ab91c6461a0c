"""Helpers for the quota e2e tests: QuotaSubtree bodies, a namespace's trees, a fake node to pin pods on, and the
controller's /debug/quota and /metrics.

Every test builds its trees in its own namespace under tree names with a random suffix, so no test sees another's
trees, and deletes them (waiting until they are gone) before the next test: a tree left behind with a ``default``
node would charge every AppWrapper of every later test. The AppWrappers are pinned (nodeSelector) to a fake node
of known size, so the tests mean the same on any cluster: quota binds where a test wants quota to bind, and the
node fills where a test wants the cluster full.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.k8s import kube
from test.e2e.conftest import (
    LOGS,
    AppWrappers,
    Controller,
    appwrapper,
    deployment_item,
    fake_node,
    pinned,
    running_controller,
)
from test.support import wait_until

GROUP, VERSION, PLURAL = "quota.codeflare.dev", "v1alpha1", "quotasubtrees"
def controller_log(module: str, kubeconfig: str) -> Path:
    """The module controller's log, named after the cluster too: .dev/e2e-logs is shared by everyone working in
    this tree, and two runs of one module against two clusters must not write (and read the port from) one file."""
    return LOGS / f"{module}-{Path(kubeconfig).name}.log"


def suffix() -> str:
    return uuid.uuid4().hex[:6]


def node(name: str, *, hard: bool | None = None, disabled: bool | None = None,
         **requests: str | int) -> dict[str, Any]:
    """One entry of spec.children, its limits as keyword arguments (``gpu=`` stands for nvidia.com/gpu)."""
    quotas: dict[str, Any] = {"requests": {("nvidia.com/gpu" if k == "gpu" else k): v for k, v in requests.items()}}
    if hard is not None:
        quotas["hardLimit"] = hard
    if disabled is not None:
        quotas["disabled"] = disabled
    return {"name": name, "quotas": quotas}


def subtree(name: str, tree: str, *children: dict[str, Any], parent: str | None = None,
            version: str = VERSION) -> dict[str, Any]:
    spec: dict[str, Any] = {"children": list(children)}
    if parent:
        spec["parent"] = parent
    return {"apiVersion": f"{GROUP}/{version}", "kind": "QuotaSubtree",
            "metadata": {"name": name, "labels": {"tree": tree}}, "spec": spec}


class QuotaTrees:
    """The QuotaSubtrees of one namespace."""

    def __init__(self, custom: k8s.CustomObjectsApi, connection: kube.Connection, namespace: str) -> None:
        self.custom = custom
        self.connection = connection
        self.namespace = namespace

    def create(self, *bodies: dict[str, Any]) -> None:
        for body in bodies:
            version = body["apiVersion"].rpartition("/")[2]
            self.custom.create_namespaced_custom_object(GROUP, version, self.namespace, PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)  # type: ignore[no-any-return]

    def replace_children(self, name: str, *children: dict[str, Any]) -> None:
        """Change a QuotaSubtree's nodes (a JSON merge patch replaces the whole children list)."""
        kube.request_json(self.connection, "PATCH",
                          f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{name}",
                          body={"spec": {"children": list(children)}}, content_type="application/merge-patch+json")

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def names(self) -> list[str]:
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]
        return [item["metadata"]["name"] for item in items]

    def delete_all(self) -> None:
        for name in self.names():
            with contextlib.suppress(k8s.exceptions.ApiException):
                self.delete(name)
        wait_until(lambda: not self.names(), 30, f"the QuotaSubtrees of {self.namespace} to go")


def labelled(body: dict[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """An AppWrapper body with quota labels (``tree: node``)."""
    body["metadata"].setdefault("labels", {}).update(labels)
    return body


def pods(name: str, selector: Mapping[str, str], cpu: str, replicas: int = 1, memory: str = "64Mi",
         gpu: int = 0) -> dict[str, Any]:
    """A Deployment item of ``replicas`` pods of ``cpu`` (and ``memory``, ``gpu``) on the pinned node."""
    item = pinned(deployment_item(name, replicas, cpu, memory), selector)
    if gpu:
        container = item["generictemplate"]["spec"]["template"]["spec"]["containers"][0]
        for part in ("requests", "limits"):
            container["resources"][part]["nvidia.com/gpu"] = str(gpu)
    return item


# -- the controller's view -------------------------------------------------------------------------------------------


def debug_quota(ctl: Controller) -> dict[str, Any]:
    code, text = ctl.get("/debug/quota")
    assert code == 200, (code, text)
    return json.loads(text)  # type: ignore[no-any-return]


def tree_doc(ctl: Controller, tree: str) -> dict[str, Any] | None:
    """The /debug/quota entry of ``tree``, None while the controller does not know it."""
    return next((t for t in debug_quota(ctl)["trees"] if t["name"] == tree), None)


def node_doc(ctl: Controller, tree: str, name: str) -> dict[str, Any] | None:
    found = tree_doc(ctl, tree)
    return next((n for n in found["nodes"] if n["name"] == name), None) if found else None


def wait_tree(ctl: Controller, tree: str, nodes: int) -> dict[str, Any]:
    """Wait until the controller knows ``tree`` with ``nodes`` nodes (informer events are asynchronous: a test
    that submits AppWrappers before the controller sees the tree would test nothing)."""
    return wait_until(lambda: (t := tree_doc(ctl, tree)) and len(t["nodes"]) == nodes and t, 30,
                      f"the controller to know tree {tree} with {nodes} nodes")


def sample(metrics: str, name: str, **labels: str) -> float | None:
    """One sample's value from the Prometheus text format (labels in any order)."""
    for line in metrics.splitlines():
        found = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} ([0-9.e+-]+)", line)
        if found and dict(re.findall(r'(\w+)="([^"]*)"', found.group(1))) == labels:
            return float(found.group(2))
    return None


# -- upstream's trees ------------------------------------------------------------------------------------------------


def upstream_trees(trees: QuotaTrees, *, gpu: bool = False) -> tuple[str, str]:
    """Upstream's kuttl trees (test/e2e-kuttl/install-quota-subtree.yaml; with ``gpu``, the borrowing suite's), under
    fresh tree names: ``quota_context`` (root 1075m/1045Mi; gold and silver soft, bronze hard 900m/300Mi, default
    0) and ``quota_service`` (root 1075m/1045Mi; gold the same, default 0). The roots are applied as
    quota.codeflare.dev/v1, as upstream's quickstart says, the children as v1alpha1. Returns (context, service)."""
    tag = suffix()
    context, service = f"quota_context_{tag}", f"quota_service_{tag}"
    extra: dict[str, Any] = {"gpu": 16} if gpu else {}

    def gpus(count: int) -> dict[str, Any]:
        return {"gpu": count} if gpu else {}

    trees.create(
        subtree("context-root", context, node("context-root", cpu="1075m", memory="1045Mi", **extra), version="v1"),
        subtree("service-root", service, node("service-root", cpu="1075m", memory="1045Mi", **extra), version="v1"),
        subtree("context-root-children", context,
                node("gold", cpu="1075m", memory="450Mi", **gpus(8)),
                node("silver", hard=False, cpu="1075m", memory="400Mi", **gpus(8)),
                node("bronze", hard=True, cpu="900m", memory="300Mi", **gpus(8)),
                node("default", hard=False, cpu="0m", memory="0Mi", **gpus(0)),
                parent="context-root"),
        subtree("service-root-children", service,
                node("gold", cpu="1075m", memory="1045Mi", **gpus(16)),
                node("default", hard=False, cpu="0m", memory="0Mi", **gpus(0)),
                parent="service-root"))
    return context, service


@contextlib.contextmanager
def trees_in(custom: k8s.CustomObjectsApi, aws: AppWrappers) -> Iterator[QuotaTrees]:
    """QuotaTrees in the test's namespace; afterwards its AppWrappers go before their trees (a queued one must
    not be dispatched in between, when its tree is gone)."""
    found = QuotaTrees(custom, aws.connection, aws.namespace)
    yield found
    custom.delete_collection_namespaced_custom_object("workload.codeflare.dev", "v1beta1", aws.namespace,
                                                      "appwrappers")
    found.delete_all()


def aw(name: str, labels: Mapping[str, str], where: Mapping[str, str], cpu: str, *, replicas: int = 1,
       memory: str = "64Mi", priority: int | None = None) -> dict[str, Any]:
    """An AppWrapper of ``replicas`` pods pinned to the ``where`` node, charged where ``labels`` say."""
    return labelled(appwrapper(name, pods(name, where, cpu, replicas, memory), priority=priority), labels)


# Fixtures the quota modules share. A module takes one by naming it at module level
# (``controller = quota.controller_fixture("test_x", "--preemption")``, ``trees = quota.trees``): pytest finds
# fixtures by the module's attribute names.

def controller_fixture(module: str, *args: str) -> Any:
    """A module-scoped ``controller`` started once the QuotaSubtree CRD exists (it watches QuotaSubtrees), with the
    chart's ServiceAccount and ``args``, its log named after ``module``."""

    @pytest.fixture(scope="module")
    def controller(kubeconfig: str, controller_kubeconfig: str, crd: None, quota_crd: None) -> Iterator[Controller]:
        with running_controller(controller_kubeconfig, controller_log(module, kubeconfig), *args) as ctl:
            yield ctl

    return controller


def node_fixture(cpu: str, memory: str = "16Gi") -> Any:
    """A module-scoped ``on_node``: the selector of a fake node of that size, which the tests pin their pods to."""

    @pytest.fixture(scope="module")
    def on_node(core: k8s.CoreV1Api) -> Iterator[dict[str, str]]:
        with fake_node(core, cpu=cpu, memory=memory) as selector:
            yield selector

    return on_node


@pytest.fixture
def trees(custom: k8s.CustomObjectsApi, aws: AppWrappers, quota_crd: None) -> Iterator[QuotaTrees]:
    """The test's QuotaTrees (``trees_in``)."""
    with trees_in(custom, aws) as found:
        yield found


@contextlib.contextmanager
def other_namespace(core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, kubeconfig: str,
                    prefix: str = "mcad-victims") -> Iterator[AppWrappers]:
    """Another tenant's namespace next to the test's own; its AppWrappers and pods are gone before it is deleted."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mcad.test/owned": "true"}}})
    wait_until(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
               30, f"ServiceAccount default in {name}")
    try:
        yield AppWrappers(custom, core, name, kube.connect(kubeconfig))
    finally:
        custom.delete_collection_namespaced_custom_object("workload.codeflare.dev", "v1beta1", name, "appwrappers")
        wait_until(lambda: not core.list_namespaced_pod(name).items, 60, f"pods in {name} to go away")
        core.delete_namespace(name, propagation_policy="Background")


def waits_saying(aws: AppWrappers, name: str, *parts: str, timeout: float = 30) -> dict[str, Any]:
    """``name``'s status once it is Pending with a message holding every one of ``parts``."""
    try:
        return wait_until(lambda: (s := aws.status(name)).get("state") == "Pending"
                          and all(p in (s.get("message") or "") for p in parts) and s, timeout,
                          f"{name} Pending, its message naming {parts}")
    except AssertionError as err:
        raise AssertionError(f"{err}; its status: {aws.status(name)!r}") from None
