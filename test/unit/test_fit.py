"""The one fit check as a spec: held first, then quota (unknown node, then over quota) before capacity, nodes
mode packs and returns a plan, aggregate mode checks the total only; and the questions preemption asks of it
(could it ever fit, would it fit once these are gone)."""

from __future__ import annotations

import dataclasses
from typing import Any

from mcad.api.appwrapper import AppWrapperView, appwrapper_view
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.fit import SingleCluster, could_ever_fit, fits, fits_without
from mcad.model.quota import Forest, subtree_view
from test.unit.nodes_and_pods import GI, node, running, v

CLUSTER = SingleCluster()


def appwrapper(name: str, pods: int, cpu: str, *, priority: int = 0, labels: dict[str, str] | None = None,
               held: str = "") -> AppWrapperView:
    """``pods`` pods of ``cpu`` each (custompodresources in front of a ConfigMap), in namespace ns."""
    raw: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1,
                     "creationTimestamp": "2026-01-01T00:00:00Z", "labels": labels or {}},
        "spec": {"priority": priority, "resources": {"GenericItems": [{
            "custompodresources": [{"replicas": pods, "requests": {"cpu": cpu}}],
            "generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-cm"}}}]}},
        "status": {}}
    view = appwrapper_view(raw)
    assert view.demand_error is None
    return dataclasses.replace(view, held=held) if held else view


def cluster(*cpus: str, quota: Forest | None = None) -> Accountant:
    """Nodes n1, n2, ... of these cpus (16Gi each)."""
    acc = Accountant(quota_trees=quota is not None)
    if quota is not None:
        assert acc.quota is not None
        acc.quota.set_forest(quota)
    for i, cpu in enumerate(cpus, 1):
        acc.observe_node(node(f"n{i}", cpu=cpu))
    return acc


def tree(root_cpu: str, **children: str) -> Forest:
    """Tree "t": a root of ``root_cpu`` cpu with soft children of these cpus."""
    def subtree(name: str, kids: dict[str, str], parent: str | None) -> Any:
        spec: dict[str, Any] = {"children": [{"name": k, "quotas": {"requests": {"cpu": c}}} for k, c in kids.items()]}
        if parent:
            spec["parent"] = parent
        return subtree_view({"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
                             "metadata": {"name": name, "namespace": "q", "labels": {"tree": "t"}}, "spec": spec})
    subtrees = [subtree("root", {"root": root_cpu}, None)]
    if children:
        subtrees.append(subtree("kids", children, "root"))
    return Forest.build(subtrees)


def check(aw: AppWrapperView, snap: Snapshot) -> Any:
    return fits(aw, snap.need(aw.key, aw.demand), snap, CLUSTER)


# -- fits -------------------------------------------------------------------------------------------------------------


def test_a_held_appwrapper_never_fits_nor_ever_could() -> None:
    acc = cluster("64")
    aw = appwrapper("a", 1, "1", held="its priorityClassName names no PriorityClass")
    for by_nodes in (False, True):
        snap = acc.snapshot(by_nodes=by_nodes)
        fit = check(aw, snap)
        assert not fit.fits and fit.about == {"held"} and fit.why() == aw.held
        assert not could_ever_fit(aw, aw.demand, snap, CLUSTER)
    assert check(dataclasses.replace(aw, held=""), acc.snapshot(by_nodes=True)).fits


def test_an_unknown_quota_node_is_said_before_any_shortage() -> None:
    acc = cluster("1", quota=tree("4", gold="2"))
    aw = appwrapper("a", 4, "1", labels={"t": "platinum"})  # short of cpu too
    fit = check(aw, acc.snapshot(by_nodes=True))
    assert not fit.fits and fit.about == {"quota: unknown node"}
    assert not could_ever_fit(aw, aw.demand, acc.snapshot(by_nodes=True), CLUSTER, fit)


def test_over_quota_waits_on_quota_whatever_the_cluster_has_free() -> None:
    acc = cluster("1", quota=tree("2", gold="2"))
    aw = appwrapper("a", 3, "1", labels={"t": "gold"})  # over the root's 2 and short of cluster cpu
    fit = check(aw, acc.snapshot(by_nodes=False))
    assert not fit.fits and fit.about == {"quota t/root"}
    assert "quota: node root of tree t is full" in fit.why()

    roomy = cluster("64", quota=tree("2", gold="2"))
    assert check(aw, roomy.snapshot(by_nodes=True)).about == {"quota t/root"}
    assert check(appwrapper("b", 2, "1", labels={"t": "gold"}), roomy.snapshot(by_nodes=True)).fits


def test_nodes_mode_packs_the_gang_and_returns_its_plan() -> None:
    acc = cluster("4", "4")
    aw = appwrapper("a", 3, "2")
    fit = check(aw, acc.snapshot(by_nodes=True))
    assert fit.fits
    assert fit.plan == (("n1", v(cpu=2000), 2), ("n2", v(cpu=2000), 1))


def test_fragmented_room_fails_nodes_mode_while_aggregate_mode_checks_only_the_total() -> None:
    acc = cluster("4", "4")
    acc.observe_pod(running("x1", node_name="n1", cpu="1", memory="0"))
    acc.observe_pod(running("x2", node_name="n2", cpu="1", memory="0"))
    aw = appwrapper("a", 3, "2")  # 6 cpu: 6 are free in all, but 3 on each node
    by_nodes = check(aw, acc.snapshot(by_nodes=True))
    assert not by_nodes.fits and "nodes:cpu" in by_nodes.about and by_nodes.plan == ()
    aggregate = check(aw, acc.snapshot(by_nodes=False))
    assert aggregate.fits and aggregate.plan == ()
    short = check(appwrapper("b", 7, "1"), acc.snapshot(by_nodes=False))
    assert not short.fits and short.about == {"cpu"}
    assert short.why() == "short of cpu 1 (needs 7, 6 free)"
    # Both short: with --fit=nodes the nodes' verdict is the one given (the total is checked after packing).
    unpackable = check(appwrapper("c", 2, "4"), acc.snapshot(by_nodes=True))
    assert not unpackable.fits and "nodes:cpu" in unpackable.about and "cpu" not in unpackable.about


def test_own_pods_that_exist_are_not_needed_again() -> None:
    acc = cluster("4")
    acc.observe_pod(running("own", node_name="n1", cpu="3", memory="0", aw="a"))
    aw = appwrapper("a", 2, "3")  # 6 cpu, 3 of them running already: 1 free is short of the other 3
    snap = acc.snapshot(by_nodes=True)
    assert snap.need(aw.key, aw.demand) == v(cpu=3000)
    assert not check(aw, snap).fits
    acc.forget_node("n1")
    acc.observe_node(node("n1", cpu="6"))
    snap = acc.snapshot(by_nodes=True)
    fit = check(aw, snap)
    assert fit.fits and fit.plan == ()  # where its own pods run is known: only the rest is judged, in total
    assert not fits(aw, aw.demand, snap, CLUSTER).fits  # the whole demand would not


def test_need_must_fit_the_free_total_even_when_the_pods_pack() -> None:
    acc = cluster("4")
    aw = appwrapper("a", 1, "2")
    snap = acc.snapshot(by_nodes=True)
    fit = fits(aw, v(cpu=5000), snap, CLUSTER)  # e.g. custompodresources declaring more than the pods ask
    assert not fit.fits and fit.about == {"cpu"}


# -- could_ever_fit ---------------------------------------------------------------------------------------------------


def test_could_ever_fit_asks_the_empty_cluster() -> None:
    acc = cluster("4", "4")
    acc.observe_pod(running("x", node_name="n1", cpu="4", memory="0"))
    acc.observe_pod(running("y", node_name="n2", cpu="4", memory="0"))
    for by_nodes in (False, True):
        snap = acc.snapshot(by_nodes=by_nodes)
        full_now = appwrapper("a", 2, "4")
        assert not check(full_now, snap).fits
        assert could_ever_fit(full_now, full_now.demand, snap, CLUSTER)
        too_big = appwrapper("b", 3, "3")  # 9 cpu of 8
        assert not could_ever_fit(too_big, too_big.demand, snap, CLUSTER)
    one_big_pod = appwrapper("c", 1, "6")  # 6 cpu of 8, yet no node has 6
    assert could_ever_fit(one_big_pod, one_big_pod.demand, acc.snapshot(by_nodes=False), CLUSTER)
    assert not could_ever_fit(one_big_pod, one_big_pod.demand, acc.snapshot(by_nodes=True), CLUSTER)


# -- fits_without -----------------------------------------------------------------------------------------------------


def test_fits_without_frees_the_footprints_given() -> None:
    acc = cluster("4", "4")
    acc.assume("ns/victim", v(cpu=4000), {}, plan=(("n2", v(cpu=4000), 1),))
    acc.observe_pod(running("x", node_name="n1", cpu="2", memory="0"))
    aw = appwrapper("a", 1, "4")
    for by_nodes in (False, True):
        snap = acc.snapshot(by_nodes=by_nodes)
        assert not check(aw, snap).fits
        assert not fits_without(aw, aw.demand, snap, CLUSTER, [])
        assert fits_without(aw, aw.demand, snap, CLUSTER, [acc.footprint("ns/victim")])
    assert acc.snapshot(by_nodes=True).free == v(cpu=2000, memory=32 * GI, pods=220)  # nothing was taken


def test_fits_without_frees_room_on_the_victims_nodes_not_just_in_total() -> None:
    acc = cluster("4", "4")
    acc.observe_pod(running("own1", node_name="n1", cpu="2", memory="0", aw="v1"))
    acc.observe_pod(running("own2", node_name="n2", cpu="2", memory="0", aw="v2"))
    acc.observe_pod(running("x", node_name="n2", cpu="2", memory="0"))
    aw = appwrapper("a", 1, "4")
    snap = acc.snapshot(by_nodes=True)
    # Freeing v2 gives 4 cpu in total (2 + 2) but no node with 4; freeing v1 empties n1.
    assert not fits_without(aw, aw.demand, snap, CLUSTER, [acc.footprint("ns/v2")])
    assert fits_without(aw, aw.demand, snap, CLUSTER, [acc.footprint("ns/v1")])
    assert fits_without(aw, aw.demand, acc.snapshot(by_nodes=False), CLUSTER, [acc.footprint("ns/v2")])
