"""The namespace admins' rules in the dispatcher (mcad.k8s.tenantstore), stepped key by key: a quota label naming
another node charges the node the namespace is bound to, an unlabelled AppWrapper in a bound namespace is charged,
custompodresources below the templates are charged and placed as the templates, and a forged priority is capped
so it cannot preempt work at the ceiling. Admission is not involved: this is the defence when it is bypassed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from mcad import wiring
from mcad.api.appwrapper import appwrapper_view
from mcad.api.views import node_view, pod_view
from mcad.k8s.informer import Informer
from mcad.k8s.tenantstore import TenantAppWrappers, priority_class_value
from mcad.model.quota import subtree_view
from mcad.model.tenancy import namespace_policy
from test.component.harness import RecordingWriter, Stepped, aw, loop_options, made_by, node
from test.component.test_quota_dispatch import subtree
from test.fakes import FakeClock, FakeListerWatcher, wait_informed


def namespace(name: str, labels: Mapping[str, str] | None = None,
              annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "resourceVersion": "1", "labels": dict(labels or {}), "annotations": dict(annotations or {})}}


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name, "resourceVersion": "1"}, "value": value}


def in_namespace(raw: dict[str, Any], ns: str, *, labels: Mapping[str, str] | None = None,
                 **spec: Any) -> dict[str, Any]:
    raw["metadata"]["namespace"] = ns
    raw["metadata"]["uid"] = f"uid-{ns}-{raw['metadata']['name']}"
    if labels is not None:
        raw["metadata"]["labels"] = dict(labels)
    raw["spec"].update(spec)
    return raw


def deployment_aw(name: str, replicas: int, cpu: str, custom: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    raw = aw(name, "1")
    item: dict[str, Any] = {"generictemplate": {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}}}}
    if custom is not None:
        item["custompodresources"] = custom
    raw["spec"]["resources"]["GenericItems"] = [item]
    return raw


class TenantHarness(Stepped):
    def __init__(self, *, nodes: list[dict[str, Any]], namespaces: list[dict[str, Any]], aws: list[dict[str, Any]],
                 classes: list[dict[str, Any]] = (), subtrees: list[dict[str, Any]] | None = None,
                 ceiling: int = 1000, **options: Any) -> None:
        self.lw = {k: FakeListerWatcher() for k in ("aw", "node", "pod", "ns", "pc", "quota")}
        for kind, objects in (("node", nodes), ("ns", namespaces), ("aw", aws), ("pc", classes),
                              ("quota", subtrees or [])):
            for obj in objects:
                self.lw[kind].add(obj)
        self.clock = FakeClock()
        self.writer = RecordingWriter()
        self.writer.objects = self.lw["aw"]
        appwrappers = Informer("appwrappers", self.lw["aw"], transform=appwrapper_view)
        ns = Informer("namespaces", self.lw["ns"], transform=namespace_policy)
        pc = Informer("priorityclasses", self.lw["pc"], transform=priority_class_value)
        self.store = TenantAppWrappers(appwrappers, ns, pc, ceiling)
        self.informers: list[Informer[Any]] = [
            appwrappers, ns, pc, Informer("nodes", self.lw["node"], transform=node_view),
            Informer("pods", self.lw["pod"], transform=pod_view, key=lambda raw: raw["metadata"]["uid"])]
        quota_subtrees = Informer("quotasubtrees", self.lw["quota"], transform=subtree_view) \
            if subtrees is not None else None
        self.dispatcher = wiring.loop(appwrappers=self.store, nodes=self.informers[3], pods=self.informers[4],
                                     writer=self.writer, queue=wiring.dispatcher_queue(self.clock), clock=self.clock,
                                     quota_subtrees=quota_subtrees, **loop_options(**options))
        if quota_subtrees is not None:
            self.informers.append(quota_subtrees)
        self.start_stepping()

    def settle(self, what: str) -> None:
        """After a change to a fake API: wait until an informer handler queued a key for it, then process all."""
        wait_informed(lambda: len(self.dispatcher.queue) > 0, 5, what)
        self.drain()

    def last(self, name: str) -> dict[str, Any]:
        return next(status for n, status in reversed(self.writer.statuses) if n == name)

@pytest.fixture
def tenants() -> Iterator[Any]:
    yield from made_by(TenantHarness)


TREE = [subtree("root", "tenants", {"root": "10"}),
        subtree("teams", "tenants", {"team-a": "2", "team-b": "8"}, parent="root", hard=("team-a", "team-b"))]
BOUND = namespace("ns", labels={"quota.codeflare.dev/tenants": "team-a"})


def test_a_forged_quota_label_charges_the_node_the_namespace_is_bound_to(tenants: Any) -> None:
    h = tenants(nodes=[node("n0", "16")], namespaces=[BOUND, namespace("free")], subtrees=TREE, fit="aggregate",
                aws=[in_namespace(aw("forged", "3"), "ns", labels={"tenants": "team-b"}),
                     in_namespace(aw("honest-b", "3"), "free", labels={"tenants": "team-b"})])
    h.drain()
    assert h.last("honest-b")["state"] == "Running", "an unbound namespace: its label decides, as before"
    forged = h.last("forged")
    assert forged["state"] == "Pending"
    assert forged["message"].startswith("quota: node team-a of tree tenants is full: cpu needs 3, 2 of 2 left "
                                        "(charged at team-a)"), forged["message"]
    quota = h.dispatcher.owners.accountant.quota
    assert quota.usage("tenants", "team-b").get("cpu") == 3000, "team-b pays only for its own"
    assert h.dispatcher.owners.accountant.quota.usage("tenants", "team-a").get("cpu") == 0


def test_an_unlabelled_appwrapper_in_a_bound_namespace_is_charged(tenants: Any) -> None:
    h = tenants(nodes=[node("n0", "16")], namespaces=[BOUND], subtrees=TREE, fit="aggregate",
                aws=[in_namespace(aw("first", "2"), "ns"), in_namespace(aw("second", "1"), "ns")])
    h.drain()
    assert h.last("first")["state"] == "Running"
    assert h.dispatcher.owners.accountant.quota.usage("tenants", "team-a").get("cpu") == 2000
    assert h.last("second")["state"] == "Pending", "team-a's quota is used up, label or no label"
    assert "node team-a of tree tenants is full" in h.last("second")["message"]


def test_binding_a_namespace_later_judges_its_queued_appwrappers_again(tenants: Any) -> None:
    h = tenants(nodes=[node("n0", "16")], namespaces=[namespace("ns")], subtrees=TREE, fit="aggregate",
                aws=[in_namespace(aw("big", "4"), "ns", labels={"tenants": "team-a"})])
    h.drain()
    assert h.last("big")["state"] == "Pending"
    h.lw["ns"].modify(namespace("ns", labels={"quota.codeflare.dev/tenants": "team-b"}))
    h.settle("the namespace informer to see the binding")
    assert h.last("big")["state"] == "Running", "the admin moved the namespace to team-b, which has room"
    assert h.dispatcher.owners.accountant.quota.usage("tenants", "team-b").get("cpu") == 4000


def test_understated_custompodresources_are_charged_and_placed_as_the_templates(tenants: Any) -> None:
    """A tenant's understatement: 1 pod x 1m declared in front of a Deployment of 6 x 3 cpu is 18 cpu, placed
    as 6 pods."""
    understated = [{"replicas": 1, "requests": {"cpu": "1m"}}]
    h = tenants(nodes=[node("n0", "6"), node("n1", "6")], namespaces=[namespace("ns")],
                aws=[in_namespace(deployment_aw("web", 6, "3", understated), "ns")])
    h.drain()
    status = h.last("web")
    assert status["state"] == "Pending", "6 pods of 3 cpu do not fit on 2 nodes of 6 cpu"
    assert "cpu" in status["message"], status["message"]
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 12000, "nothing reserved"

    h.lw["node"].add(node("n2", "6"))
    h.settle("the node informer to see n2")
    assert h.last("web")["state"] == "Running"
    assert h.dispatcher.owners.accountant.ledger.reservation("ns/web").get("cpu") == 18000
    assert {n: room.get("cpu") for n, room in h.dispatcher.owners.accountant.plans.planned_by_node().items()} == {
        "n0": 6000, "n1": 6000, "n2": 6000}, "placed as 6 pods of 3 cpu, two per node"


def test_a_forged_priority_is_capped_and_cannot_preempt_work_at_the_ceiling(tenants: Any) -> None:
    victim = in_namespace(aw("victim", "4"), "other", priority=1000)
    h = tenants(nodes=[node("n0", "4")], preemption=True, fit="aggregate",
                namespaces=[namespace("ns"), namespace("other"),
                            namespace("vip", annotations={"mcad.codeflare.dev/max-priority": "5000"})],
                aws=[victim])
    h.drain()
    assert h.last("victim")["state"] == "Running"

    h.lw["aw"].add(in_namespace(aw("forged", "4"), "ns", priority=2**31 - 1))
    h.settle("the AppWrapper informer to see it")
    assert h.store.get("ns/forged").priority == 1000, "capped at the default ceiling"
    assert h.dispatcher.preemptions == 0 and h.last("victim")["state"] == "Running"
    forged = h.last("forged")
    assert forged["state"] == "Pending" and forged["systempriority"] == 1000.0

    # The admin granted namespace vip a higher ceiling: there the same claim is worth 5000, and preempts.
    h.lw["aw"].add(in_namespace(aw("granted", "4"), "vip", priority=2**31 - 1))
    h.settle("the AppWrapper informer to see it")
    assert h.store.get("vip/granted").priority == 5000
    assert h.dispatcher.preemptions == 1 and h.last("victim")["state"] == "Pending"


def test_an_unknown_priority_class_waits_naming_it_until_the_class_exists(tenants: Any) -> None:
    h = tenants(nodes=[node("n0", "4")], namespaces=[namespace("ns")], fit="aggregate",
                aws=[in_namespace(aw("classy", "1"), "ns", priorityClassName="batch-high")])
    h.drain()
    status = h.last("classy")
    assert status["state"] == "Pending"
    assert status["message"].startswith("spec.priorityClassName 'batch-high': there is no PriorityClass of that "
                                        "name; it waits until there is one"), status["message"]
    h.lw["pc"].add(priority_class("batch-high", 500))
    h.settle("the PriorityClass informer")
    status = h.last("classy")
    assert status["state"] == "Running" and status["systempriority"] == 500.0


def test_an_appwrapper_whose_namespace_is_not_known_yet_is_held(tenants: Any) -> None:
    h = tenants(nodes=[node("n0", "4")], namespaces=[], fit="aggregate", aws=[in_namespace(aw("early", "1"), "ns")])
    h.drain()
    assert h.last("early")["state"] == "Pending"
    assert "namespace ns is not known to the controller yet" in h.last("early")["message"]
    h.lw["ns"].add(namespace("ns"))
    h.settle("the namespace informer")
    assert h.last("early")["state"] == "Running"


def test_a_declaration_above_the_templates_in_one_resource_and_below_in_another_waits_for_both(tenants: Any) -> None:
    """Upstream's case 20 shape: 2 x 80 cpu declared (and no memory) in front of 2 pods of 1 cpu and 64Mi. The pods
    are the templates' (they pack), the charge the larger of each: 160 cpu, which the cluster does not have."""
    declared = [{"replicas": 2, "requests": {"cpu": "80"}}]
    raw = in_namespace(deployment_aw("mixed", 2, "1", declared), "ns")
    raw["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["template"]["spec"]["containers"][0][
        "resources"]["requests"]["memory"] = "64Mi"
    h = tenants(nodes=[node("n0", "4")], namespaces=[namespace("ns")], aws=[raw])
    h.drain()
    status = h.last("mixed")
    assert status["state"] == "Pending"
    assert status["message"].startswith("short of cpu 156 (needs 160, 4 free)"), status["message"]
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 4000


def test_views_the_rules_leave_alone_are_not_copied_and_unrelated_namespace_changes_rejudge_nothing(
        tenants: Any) -> None:
    h = tenants(nodes=[node("n0", "4")], namespaces=[namespace("ns"), BOUND | {"metadata": {
                    **BOUND["metadata"], "name": "bound"}}], fit="aggregate",
                aws=[in_namespace(aw("plain", "1"), "ns", priority=5),
                     in_namespace(aw("capped", "1"), "ns", priority=5000),
                     in_namespace(aw("relabelled", "1"), "bound")])
    h.drain()
    inner = h.store.appwrappers
    assert h.store.get("ns/plain") is inner.get("ns/plain"), "nothing to change: the informer's own view"
    capped = h.store.get("ns/capped")
    assert capped is not inner.get("ns/capped") and capped.priority == 1000
    assert h.store.get("ns/capped") is capped, "a changed view is made once, not per read"
    assert dict(h.store.get("bound/relabelled").labels) == {"tenants": "team-a"}
    assert len(h.store._resolved) == 2, "one entry per view the rules change"

    # A label that binds nothing (the namespace's policy is the same) makes no work for the dispatcher.
    generation = h.store._generation
    changed = h.lw["ns"].modify(namespace("ns", labels={"team": "x"}))
    namespaces = h.informers[1]
    wait_informed(lambda: namespaces._store["ns"][0] == changed["metadata"]["resourceVersion"], 5, "the event")
    assert h.store._generation == generation and len(h.dispatcher.queue) == 0

    h.lw["ns"].modify(namespace("ns", annotations={"mcad.codeflare.dev/max-priority": "10"}))
    h.settle("the ceiling change")
    assert h.store.get("ns/plain").priority == 5 and h.store.get("ns/capped").priority == 10
    assert h.dispatcher.owners.active.views["ns/capped"].priority == 10, "the dispatcher re-read it"
