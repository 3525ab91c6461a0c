"""Fragmentation-aware fit: the pods of an AppWrapper (gang) packed first-fit decreasing onto nodes (pack)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from mcad.api.podgroups import NodeRequirement, PodGroup, Toleration, gang
from mcad.api.resources import ResourceVector
from mcad.api.views import NodeView, Taint
from mcad.model import placement
from mcad.model.placement import Packing, pack

GI = 2**30
GPU = "nvidia.com/gpu"


def v(**amounts: int) -> ResourceVector:
    return ResourceVector({(GPU if k == "gpu" else k): a for k, a in amounts.items()})


def nd(name: str, *, cpu: int = 8000, memory: int = 32 * GI, gpu: int = 0, labels: dict[str, str] | None = None,
       taints: Sequence[Taint] = (), ready: bool = True, unschedulable: bool = False) -> NodeView:
    return NodeView(name, v(cpu=cpu, memory=memory, gpu=gpu), ready and not unschedulable and not taints, "1",
                    labels=labels or {}, taints=tuple(taints), unschedulable=unschedulable, ready=ready)


def pods(count: int, label: str = "Job trainer", **requests: int) -> PodGroup:
    return PodGroup(count, v(**requests), label=label)


def placed(packing: Packing) -> list[tuple[str, int]]:
    assert packing.fits, packing.why
    return [(node, n) for node, _, n in packing.placement]


# -- fragmentation ---------------------------------------------------------------------------------------------------


def test_eight_one_gpu_nodes_do_not_hold_one_eight_gpu_pod() -> None:
    nodes = [nd(f"n{i}", gpu=1) for i in range(8)]
    # In aggregate the cluster has exactly the 8 GPUs asked for; no node has more than one.
    packing = pack([pods(1, gpu=8)], nodes, {})
    assert not packing.fits
    assert packing.placement == ()
    assert packing.why == ("1 pod of Job trainer (nvidia.com/gpu 8) fits on no node: "
                           "8 nodes have too little nvidia.com/gpu free (at most 1 on one node)")
    assert packing.about == {"nodes:nvidia.com/gpu"}


def test_eight_one_gpu_nodes_hold_eight_one_gpu_pods() -> None:
    nodes = [nd(f"n{i}", gpu=1) for i in reversed(range(8))]
    assert placed(pack([pods(8, gpu=1)], nodes, {})) == [(f"n{i}", 1) for i in range(8)]


def test_a_ninth_one_gpu_pod_does_not_fit() -> None:
    packing = pack([pods(9, gpu=1, cpu=1000)], [nd(f"n{i}", gpu=1) for i in range(8)], {})
    assert not packing.fits
    assert packing.why.startswith("1 of 9 pods of Job trainer (cpu 1, nvidia.com/gpu 1 each) fit on no node: "
                                  "8 nodes have too little nvidia.com/gpu free (at most 0 on one node)")


def test_bigger_pods_are_placed_first() -> None:
    small, big = pods(1, "small", cpu=2000), pods(1, "big", cpu=4000)
    nodes = [nd("a", cpu=4000), nd("b", cpu=2000)]
    # In arrival order first-fit puts the small pod on a, and the big one then fits nowhere.
    assert placed(pack([small, big], nodes, {})) == [("a", 1), ("b", 1)]
    assert pack([small, big], nodes, {}) == pack([big, small], nodes, {})
    assert pack([small, big], nodes, {}).placement[0] == ("a", v(cpu=4000), 1)


def test_gpu_pods_are_placed_before_larger_cpu_pods() -> None:
    cpu_heavy, gpu_pod = pods(1, "cpu", cpu=8000), pods(1, "gpu", cpu=1000, gpu=1)
    nodes = [nd("a", cpu=8000, gpu=1), nd("b", cpu=8000)]
    # The 8-cpu pod placed first would take a's cpu and leave the GPU pod no node with both.
    assert placed(pack([cpu_heavy, gpu_pod], nodes, {})) == [("a", 1), ("b", 1)]
    packing = pack([cpu_heavy, gpu_pod], nodes, {})
    assert [requests for _, requests, _ in packing.placement] == [v(cpu=1000, gpu=1), v(cpu=8000)]


def test_pods_of_one_group_fill_a_node_before_the_next() -> None:
    nodes = [nd("a", cpu=3000), nd("b", cpu=3000), nd("c", cpu=3000)]
    assert placed(pack([pods(5, cpu=1000)], nodes, {})) == [("a", 3), ("b", 2)]


def test_every_resource_limits_a_node() -> None:
    nodes = [nd("a", cpu=8000, memory=2 * GI), nd("b", cpu=2000, memory=32 * GI)]
    assert placed(pack([pods(3, cpu=1000, memory=GI)], nodes, {})) == [("a", 2), ("b", 1)]


def test_extended_resources_count_like_cpu() -> None:
    node = NodeView("a", ResourceVector({"cpu": 8000, "example.com/fpga": 2}), True, "1")
    assert placed(pack([PodGroup(2, ResourceVector({"example.com/fpga": 1}))], [node], {})) == [("a", 2)]
    packing = pack([PodGroup(3, ResourceVector({"example.com/fpga": 1}), label="x")], [node], {})
    assert not packing.fits
    assert packing.about == {"nodes:example.com/fpga"}
    missing = pack([PodGroup(1, ResourceVector({"example.com/tpu": 1}), label="x")], [node], {})
    assert missing.why == ("1 pod of x (example.com/tpu 1) fits on no node: "
                           "1 node has too little example.com/tpu free (0)")


def test_a_resource_not_requested_never_blocks() -> None:
    # The node is over-committed on memory (negative free) and has no GPU; the pod asks for cpu only.
    free = {"a": ResourceVector({"cpu": 1000, "memory": -GI})}
    assert placed(pack([pods(1, cpu=1000)], [nd("a")], free)) == [("a", 1)]


def test_pods_without_requests_need_only_an_eligible_node() -> None:
    nodes = [nd("a", unschedulable=True), nd("b", cpu=0, memory=0)]
    assert placed(pack([PodGroup(1000, ResourceVector(), label="x")], nodes, {})) == [("b", 1000)]
    packing = pack([PodGroup(2, ResourceVector(), label="x")], nodes[:1], {})
    assert packing.why == "2 of 2 pods of x (no resource requests) fit on no node: 1 node unschedulable"


def test_free_is_the_room_and_a_node_missing_from_it_has_its_allocatable() -> None:
    nodes = [nd("a", gpu=8), nd("b", gpu=8)]
    assert placed(pack([pods(1, gpu=8)], nodes, {"a": v(gpu=1)})) == [("b", 1)]
    packing = pack([pods(1, gpu=8)], nodes, {"a": v(gpu=1), "b": v(gpu=-2)})
    assert packing.why == ("1 pod of Job trainer (nvidia.com/gpu 8) fits on no node: "
                           "2 nodes have too little nvidia.com/gpu free (at most 1 on one node)")


def test_no_groups_fit_anywhere_and_no_nodes_fit_nothing() -> None:
    assert pack([], [], {}) == Packing(True)
    assert pack([pods(0, cpu=1)], [], {}) == Packing(True)
    packing = pack([pods(2, cpu=1000)], [], {})
    assert packing == Packing(False,
                              reason="2 of 2 pods of Job trainer (cpu 1 each) fit on no node: there are no nodes",
                              about=frozenset({"nodes:none"}))


# -- node eligibility ----------------------------------------------------------------------------------------------


def test_not_ready_and_cordoned_nodes_are_skipped() -> None:
    nodes = [nd("a", gpu=8, ready=False), nd("b", gpu=8, unschedulable=True), nd("c", gpu=8)]
    assert placed(pack([pods(1, gpu=8)], nodes, {})) == [("c", 1)]
    packing = pack([pods(1, gpu=8)], nodes[:2], {})
    assert packing.why == ("1 pod of Job trainer (nvidia.com/gpu 8) fits on no node: "
                           "1 node not ready, 1 node unschedulable")
    assert packing.about == {"nodes:not-ready", "nodes:unschedulable"}


def test_a_cordoned_node_takes_pods_that_tolerate_the_cordon() -> None:
    cordon = Toleration("node.kubernetes.io/unschedulable", "Exists", "", "NoSchedule")
    group = PodGroup(1, v(cpu=1000), tolerations=(cordon,))
    assert placed(pack([group], [nd("a", unschedulable=True)], {})) == [("a", 1)]
    assert placed(pack([PodGroup(1, v(cpu=1000), tolerations=(Toleration(operator="Exists"),))],
                       [nd("a", unschedulable=True)], {})) == [("a", 1)]


GPU_TAINT = Taint("gpu", "true", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        pytest.param(Toleration("gpu", "Equal", "true", "NoSchedule"), GPU_TAINT, True, id="Equal, same value"),
        pytest.param(Toleration("gpu", "Equal", "false", "NoSchedule"), GPU_TAINT, False, id="Equal, other value"),
        pytest.param(Toleration("gpu", value="true"), GPU_TAINT, True, id="Equal is the default, empty effect: all"),
        pytest.param(Toleration("gpu", "Exists", "", "NoSchedule"), GPU_TAINT, True, id="Exists ignores the value"),
        pytest.param(Toleration("gpu", "Exists", "", "NoExecute"), GPU_TAINT, False, id="other effect"),
        pytest.param(Toleration("cpu", "Exists"), GPU_TAINT, False, id="other key"),
        pytest.param(Toleration("", "Exists"), GPU_TAINT, True, id="empty key with Exists: every taint"),
        pytest.param(Toleration("", "Exists", "", "NoExecute"), GPU_TAINT, False, id="every key, one effect"),
        pytest.param(Toleration("gpu", "Equal", "", "NoSchedule"), Taint("gpu", "", "NoSchedule"), True,
                     id="Equal, both values empty"),
        pytest.param(Toleration("gpu", "Equal"), GPU_TAINT, False, id="Equal, empty value"),
        pytest.param(Toleration("gpu", "Like", "true"), GPU_TAINT, False, id="unknown operator"),
    ],
)
def test_toleration_semantics(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    assert toleration.tolerates(taint) is tolerated
    packing = pack([PodGroup(1, v(cpu=1000), tolerations=(toleration,))], [nd("a", taints=[taint])], {})
    assert packing.fits is tolerated


def test_every_taint_must_be_tolerated() -> None:
    node = nd("a", taints=[GPU_TAINT, Taint("dedicated", "ml", "NoExecute")])
    one = PodGroup(1, v(cpu=1000), tolerations=(Toleration("gpu", "Exists"),), label="x")
    both = PodGroup(1, v(cpu=1000), tolerations=(Toleration("gpu", "Exists"), Toleration("dedicated", value="ml")))
    assert placed(pack([both], [node], {})) == [("a", 1)]
    packing = pack([one], [node], {})
    assert packing.why == ("1 pod of x (cpu 1) fits on no node: "
                           "1 node with taints it does not tolerate (dedicated=ml:NoExecute)")
    assert packing.about == {"nodes:taint"}


def test_untolerated_taints_listed_at_most_three() -> None:
    nodes = [nd(f"n{i}", taints=[Taint(f"t{i}", "", "NoSchedule")]) for i in range(5)]
    packing = pack([pods(1, cpu=1000)], nodes, {})
    assert packing.why.endswith("5 nodes with taints it does not tolerate (t0:NoSchedule, t1:NoSchedule, "
                                "t2:NoSchedule and 2 more)")


def test_node_selector() -> None:
    nodes = [nd("a", labels={"pool": "cpu"}), nd("b", labels={"pool": "gpu", "zone": "z1"}), nd("c")]
    group = PodGroup(1, v(cpu=1000), node_selector=(("pool", "gpu"), ("zone", "z1")), label="x")
    assert placed(pack([group], nodes, {})) == [("b", 1)]
    packing = pack([group], [nodes[0], nodes[2]], {})
    assert packing.why == "1 pod of x (cpu 1) fits on no node: 2 nodes not matching its nodeSelector"
    assert packing.about == {"nodes:nodeSelector"}


@pytest.mark.parametrize(
    ("requirement", "matches"),
    [
        (NodeRequirement("zone", "In", ("z1", "z2")), ["a", "b"]),
        (NodeRequirement("zone", "NotIn", ("z1",)), ["b", "c"]),  # a node without the label is in no set
        (NodeRequirement("zone", "Exists"), ["a", "b"]),
        (NodeRequirement("zone", "DoesNotExist"), ["c"]),
        (NodeRequirement("gen", "Gt", ("3",)), ["b"]),
        (NodeRequirement("gen", "Lt", ("4",)), ["a"]),
        (NodeRequirement("gen", "Gt", ("x",)), []),
        (NodeRequirement("zone", "Near", ("z1",)), []),
        (NodeRequirement("metadata.name", "In", ("c", "a"), field=True), ["a", "c"]),
        (NodeRequirement("metadata.name", "NotIn", ("c",), field=True), ["a", "b"]),
        (NodeRequirement("metadata.uid", "In", ("c",), field=True), []),
    ],
)
def test_node_requirement(requirement: NodeRequirement, matches: list[str]) -> None:
    nodes = [nd("a", labels={"zone": "z1", "gen": "3"}), nd("b", labels={"zone": "z2", "gen": "4"}), nd("c")]
    assert [n.name for n in nodes if requirement.matches(n)] == matches


def test_required_affinity_terms_are_ored_and_requirements_anded() -> None:
    nodes = [nd("a", labels={"zone": "z1", "gpu": "a100"}), nd("b", labels={"zone": "z1"}),
             nd("c", labels={"zone": "z2"}), nd("d")]
    terms = ((NodeRequirement("zone", "In", ("z1",)), NodeRequirement("gpu", "Exists")),
             (NodeRequirement("zone", "In", ("z2",)),))
    group = PodGroup(4, v(cpu=8000), required_affinity=terms, label="x")
    packing = pack([group], nodes, {})
    assert packing.why == ("2 of 4 pods of x (cpu 8 each) fit on no node: 2 nodes have too little cpu free "
                           "(at most 0 on one node), 2 nodes not matching its required node affinity")
    assert packing.about == {"nodes:cpu", "nodes:affinity"}
    assert placed(pack([PodGroup(2, v(cpu=8000), required_affinity=terms)], nodes, {})) == [("a", 1), ("c", 1)]


def test_an_empty_affinity_term_matches_no_node() -> None:
    assert not pack([PodGroup(1, v(cpu=1), required_affinity=((),))], [nd("a")], {}).fits


# -- why and about ---------------------------------------------------------------------------------------------------


def test_why_counts_nodes_per_reason() -> None:
    pool = {"pool": "train"}
    nodes = [
        *(nd(f"big{i}", cpu=8000, gpu=8, labels=pool) for i in range(2)),
        *(nd(f"small{i}", cpu=8000, gpu=1, labels=pool) for i in range(6)),
        nd("cordoned", gpu=8, labels=pool, unschedulable=True),
        *(nd(f"tainted{i}", gpu=8, labels=pool, taints=[GPU_TAINT]) for i in range(2)),
        nd("elsewhere", gpu=8),
    ]
    group = PodGroup(4, v(cpu=4000, gpu=8), node_selector=(("pool", "train"),), label="Job trainer")
    packing = pack([group], nodes, {})
    assert packing.why == (
        "2 of 4 pods of Job trainer (cpu 4, nvidia.com/gpu 8 each) fit on no node: "
        "8 nodes have too little nvidia.com/gpu free (at most 1 on one node), 1 node unschedulable, "
        "2 nodes with taints it does not tolerate (gpu=true:NoSchedule), 1 node not matching its nodeSelector")
    assert packing.about == {"nodes:nvidia.com/gpu", "nodes:unschedulable", "nodes:taint", "nodes:nodeSelector"}


def test_a_node_short_of_several_resources_counts_once_gpu_first() -> None:
    packing = pack([pods(1, cpu=16000, memory=64 * GI, gpu=2)], [nd("a", gpu=1), nd("b", gpu=4)], {})
    assert packing.why == ("1 pod of Job trainer (cpu 16, memory 64Gi, nvidia.com/gpu 2) fits on no node: "
                           "1 node has too little nvidia.com/gpu free (1), 1 node has too little cpu free (8)")
    assert packing.about == {"nodes:nvidia.com/gpu", "nodes:cpu"}


def test_why_names_the_first_group_left_over() -> None:
    nodes = [nd("a", cpu=4000, gpu=1)]
    packing = pack([pods(1, "head", cpu=2000), pods(2, "workers", cpu=1000, gpu=1)], nodes, {})
    assert packing.why.startswith("1 of 2 pods of workers (cpu 1, nvidia.com/gpu 1 each) fit on no node")


@pytest.mark.parametrize(
    ("free_gpus", "requested"),
    [(1, 8), (2, 8), (0, 4), (3, 4)],
)
def test_about_does_not_change_with_amounts(free_gpus: int, requested: int) -> None:
    nodes = [*(nd(f"n{i}", gpu=8) for i in range(4)), nd("t", gpu=8, taints=[GPU_TAINT])]
    free = {f"n{i}": v(cpu=8000, memory=32 * GI, gpu=free_gpus) for i in range(4)}
    packing = pack([pods(2, cpu=1000, gpu=requested)], nodes, free)
    assert not packing.fits
    assert f"(at most {free_gpus} on one node)" in packing.why
    assert packing.about == {"nodes:nvidia.com/gpu", "nodes:taint"}


# -- bulk placement ------------------------------------------------------------------------------------------------


def test_a_thousand_pods_over_a_thousand_nodes() -> None:
    nodes = [nd(f"n{i:04}", cpu=1000) for i in range(1000)]
    packing = pack([pods(1000, cpu=1000)], nodes, {})
    assert placed(packing) == [(f"n{i:04}", 1) for i in range(1000)]
    many = pack([pods(10_000, cpu=100)], nodes, {})
    assert placed(many) == [(f"n{i:04}", 10) for i in range(1000)]
    short = pack([pods(1001, cpu=1000)], nodes, {})
    assert short.why == ("1 of 1001 pods of Job trainer (cpu 1 each) fit on no node: "
                         "1000 nodes have too little cpu free (at most 0 on one node)")


def test_room_is_checked_once_per_group_and_node_not_per_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = placement._how_many_fit

    def counting(*args: Any) -> int:
        nonlocal calls
        calls += 1
        return real(*args)

    monkeypatch.setattr(placement, "_how_many_fit", counting)
    nodes = [nd(f"n{i:04}", cpu=3000, gpu=2) for i in range(1000)]
    groups = [pods(1500, "a", gpu=1), pods(2000, "b", cpu=1000), pods(100, "c", cpu=500)]
    packing = pack(groups, nodes, {})
    assert sum(n for _, _, n in packing.placement) == 3600
    assert calls <= len(groups) * len(nodes)
    calls = 0
    assert not pack([pods(3001, cpu=1000)], nodes, {}).fits
    assert calls <= len(nodes)


# -- the pods of an AppWrapper ---------------------------------------------------------------------------------------


def container(**requests: Any) -> dict[str, Any]:
    return {"name": "c", "image": "busybox", "resources": {"requests": requests}}


def pod_template(*, node_selector: Any = None, tolerations: Any = None, affinity: Any = None,
                 **requests: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(**requests)]}
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if affinity is not None:
        spec["affinity"] = affinity
    return {"metadata": {"labels": {"app": "x"}}, "spec": spec}


def job(name: str = "trainer", parallelism: Any = 2, **template: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": parallelism, "template": pod_template(**template)}}


def test_gang_of_a_job() -> None:
    item = {"generictemplate": job(cpu="2", memory="1Gi", **{GPU: 1}, node_selector={"pool": "train"},
                                   tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                                                {"key": "dedicated", "value": "ml"}])}
    assert gang([item]) == [PodGroup(2, v(cpu=2000, memory=GI, gpu=1), (("pool", "train"),),
                                     (Toleration("gpu", "Exists", "", "NoSchedule"), Toleration("dedicated", "Equal",
                                                                                                "ml", "")),
                                     label="Job trainer")]


def test_gang_reads_required_node_affinity() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1", "z2"]},
                              {"key": "gpu", "operator": "Exists"}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]},
    ]}, "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}
    [group] = gang([{"generictemplate": job(cpu="1", affinity=affinity)}])
    assert group.required_affinity == (
        (NodeRequirement("zone", "In", ("z1", "z2")), NodeRequirement("gpu", "Exists")),
        (NodeRequirement("metadata.name", "In", ("n9",), field=True),),
    )


def test_gang_of_a_raycluster_head_and_workers() -> None:
    gpu_toleration = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    raycluster = {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
        "spec": {"headGroupSpec": {"template": pod_template(cpu="2", memory="4Gi")},
                 "workerGroupSpecs": [
                     {"groupName": "small-group", "replicas": 3, "minReplicas": 1, "maxReplicas": 5,
                      "template": pod_template(cpu="1", memory="2Gi", **{GPU: 1}, tolerations=gpu_toleration)},
                     {"replicas": 0, "template": pod_template(cpu="1")},
                     {"replicas": 1, "template": pod_template(cpu="3")},
                 ]},
    }
    groups = gang([{"generictemplate": raycluster}])
    assert [(g.label, g.count, g.requests) for g in groups] == [
        ("RayCluster rc head", 1, v(cpu=2000, memory=4 * GI)),
        ("RayCluster rc worker group small-group", 3, v(cpu=1000, memory=2 * GI, gpu=1)),
        ("RayCluster rc worker group 2", 1, v(cpu=3000)),
    ]
    assert groups[1].tolerations == (Toleration("nvidia.com/gpu", "Exists"),)
    gpu_taint = Taint("nvidia.com/gpu", "", "NoSchedule")
    nodes = [nd("cpu", cpu=4000), *(nd(f"gpu{i}", cpu=2000, gpu=2, taints=[gpu_taint]) for i in range(2))]
    # The head and the 3-cpu worker need the only untainted node, which holds one of them.
    packing = pack(groups, nodes, {})
    assert packing.why == ("1 pod of RayCluster rc head (cpu 2, memory 4Gi) fits on no node: "
                           "1 node has too little cpu free (1), "
                           "2 nodes with taints it does not tolerate (nvidia.com/gpu:NoSchedule)")
    nodes.append(nd("cpu2", cpu=4000))
    assert placed(pack(groups, nodes, {})) == [("gpu0", 2), ("gpu1", 1), ("cpu", 1), ("cpu2", 1)]


def test_gang_of_a_pytorchjob_names_the_roles() -> None:
    pytorchjob = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
                  "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": pod_template(cpu="1")},
                                                   "Worker": {"replicas": 4, "template": pod_template(cpu="2")}}}}
    assert [(g.label, g.count) for g in gang([{"generictemplate": pytorchjob}])] == [
        ("PyTorchJob pt Master", 1), ("PyTorchJob pt Worker", 4)]


def test_gang_of_custompodresources() -> None:
    item = {
        "custompodresources": [
            {"replicas": 2, "requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}},
            {"replicas": 1, "requests": {"cpu": "0", GPU: 4}, "limits": {"cpu": "2"}},
            {"replicas": 0, "requests": {"cpu": "1"}},
            {"replicas": -1, "requests": {"cpu": "1"}},
            {"replicas": 1, "requests": {"cpu": "lots"}},
            "nonsense",
        ],
        "generictemplate": job(parallelism=2, cpu="500m", node_selector={"pool": "train"},
                               tolerations=[{"operator": "Exists"}]),
    }
    assert gang([item]) == [
        PodGroup(2, v(cpu=500, memory=GI), (("pool", "train"),), (Toleration("", "Exists"),),
                 label="Job trainer custompodresources[0]"),
        PodGroup(1, v(cpu=2000, gpu=4), (("pool", "train"),), (Toleration("", "Exists"),),
                 label="Job trainer custompodresources[1]"),
    ]


def test_custompodresources_below_the_templates_give_way_to_the_templates_pods() -> None:
    """A tenant's understatement: 1 pod x 1m declared in front of 100 pods of 8 cpu are placed as the 100 pods
    that will exist."""
    item = {"custompodresources": [{"replicas": 1, "requests": {"cpu": "1m"}}],
            "generictemplate": job(parallelism=100, cpu="8", node_selector={"pool": "train"})}
    assert gang([item]) == [PodGroup(100, v(cpu=8000), (("pool", "train"),), label="Job trainer")]


def test_custompodresources_of_a_template_with_several_pod_sets_carry_no_constraints() -> None:
    raycluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
                  "spec": {"headGroupSpec": {"template": pod_template(cpu="1", node_selector={"a": "b"})},
                           "workerGroupSpecs": [{"replicas": 1, "template": pod_template(cpu="1")}]}}
    item = {"custompodresources": [{"replicas": 3, "requests": {"cpu": "1"}}], "generictemplate": raycluster}
    assert gang([item]) == [PodGroup(3, v(cpu=1000), label="RayCluster rc custompodresources[0]")]
    bare = {"custompodresources": [{"replicas": 1, "requests": {"cpu": "1"}}]}
    assert gang([bare]) == [PodGroup(1, v(cpu=1000), label="GenericItems[0] custompodresources[0]")]


def test_gang_keeps_pods_without_requests_and_drops_empty_groups() -> None:
    items = [{"generictemplate": job(parallelism=0, cpu="1")},
             {"generictemplate": job("sleeper", parallelism=3)}]
    assert gang(items) == [PodGroup(3, ResourceVector(), label="Job sleeper")]


def test_gang_never_raises_on_odd_shapes() -> None:
    items: list[Any] = [
        "not an item",
        {"generictemplate": "not an object"},
        {"generictemplate": {"apiVersion": "example.com/v1", "kind": "Unknown", "spec": {}}},
        {"generictemplate": job(parallelism=-1, cpu="1")},  # demand_error's business
        {"generictemplate": job("odd", cpu="nonsense", memory="1Gi", node_selector=["pool"],
                                tolerations={"key": "x"}, affinity="close")},
        {"generictemplate": job("odder", cpu="1", node_selector={"pool": 1, "zone": "z1"},
                                tolerations=[None, {"key": 7, "operator": None, "effect": "NoSchedule"}],
                                affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [None, {"matchExpressions": [
                                        None, {"key": "zone", "operator": "In", "values": ["z1", 2]}]}]}}})},
        {"custompodresources": "not a list", "generictemplate": job("fallback", parallelism=1, cpu="1")},
    ]
    assert gang(items) == [
        PodGroup(2, v(memory=GI), label="Job odd"),
        PodGroup(2, v(cpu=1000), (("zone", "z1"),), (Toleration(effect="NoSchedule"),),
                 ((NodeRequirement("zone", "In", ("z1",)),),), label="Job odder"),
        PodGroup(1, v(cpu=1000), label="Job fallback"),
    ]
