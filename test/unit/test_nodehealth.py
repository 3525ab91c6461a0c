"""Sick nodes as a spec: the rules and what they say of a node (``mcad.model.nodehealth``), how the fit reads them
(``mcad.model.placement``: never on NoSchedule/NoExecute nodes, PreferNoSchedule ones last, messages naming the
label), how the accountant marks its nodes with them, and the controller's flags that choose them."""

from __future__ import annotations

from typing import Any

import pytest

from mcad.api.nodemarks import Effect, Verdict
from mcad.api.podgroups import PodGroup
from mcad.api.resources import ResourceVector
from mcad.api.views import NodeView, PodView, pod_view
from mcad.cli.settingsflags import node_health_from_flags
from mcad.model import placement
from mcad.model.accounting import Accountant
from mcad.model.nodehealth import (
    AUTOPILOT_LABEL,
    DEFAULT_RULES,
    GPU,
    NO_RULES,
    NodeHealth,
    Rule,
    parse_rule,
    verdict_for,
)
from mcad.model.placement import pack
from test.unit.nodes_and_pods import GI, node_view, raw_node, raw_pod

ONE_GPU = ResourceVector({"cpu": 1000, "memory": GI, GPU: 1})
CPU_ONLY = ResourceVector({"cpu": 1000, "memory": GI})
HEALTH = NodeHealth()


def gpu_node(name: str, health: str | None = None, gpus: int = 8) -> NodeView:
    """A GPU node as the accountant keeps it: marked with what Autopilot's rules say of its label."""
    labels = {AUTOPILOT_LABEL: health} if health is not None else {}
    view = NodeView(name, ResourceVector({"cpu": 64000, "memory": 512 * GI, GPU: gpus}), True, "1", labels=labels)
    acc = Accountant(node_health=HEALTH)
    acc.observe_node(view)
    marked = acc.ledger.node(name)
    assert marked is not None
    return marked


def gpu_pods(count: int, gpus: int = 1, label: str = "Job trainer") -> PodGroup:
    return PodGroup(count, ResourceVector({"cpu": 1000, "memory": GI, GPU: gpus}), label=label)


def cpu_pods(count: int) -> PodGroup:
    return PodGroup(count, CPU_ONLY, label="Job web")


def placed(packing: placement.Packing) -> list[tuple[str, int]]:
    assert packing.fits, packing.why
    return [(node, n) for node, _, n in packing.placement]


# -- the rules ---------------------------------------------------------------------------------------------------


def test_the_default_rules_are_autopilots() -> None:
    assert [str(rule) for rule in DEFAULT_RULES] == [
        "nvidia.com/gpu:autopilot.ibm.com/gpuhealth=WARN:PreferNoSchedule",
        "nvidia.com/gpu:autopilot.ibm.com/gpuhealth=TESTING:NoSchedule",
        "nvidia.com/gpu:autopilot.ibm.com/gpuhealth=EVICT:NoExecute"]
    assert [parse_rule(str(rule)) for rule in DEFAULT_RULES] == list(DEFAULT_RULES)


@pytest.mark.parametrize("text", ["", "nvidia.com/gpu", "nvidia.com/gpu:label=v", "gpu:label:NoSchedule",
                                  "nvidia.com/gpu:label=v:Evict", "nvidia.com/gpu:la bel=v:NoSchedule",
                                  "nvidia.com/gpu:label=v=w:NoSchedule", ":label=v:NoSchedule"])
def test_a_rule_that_does_not_parse_says_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match=r"RESOURCE:LABEL=VALUE:EFFECT|effect must be one of"):
        parse_rule(text)


def test_an_empty_value_is_a_rule_too() -> None:
    assert parse_rule("example.com/fpga:fpga.example.com/bad=:NoSchedule") == \
        Rule("example.com/fpga", "fpga.example.com/bad", "", Effect.NO_SCHEDULE)


def test_a_pod_that_requests_none_of_the_rules_resources_is_never_affected() -> None:
    for value in ("WARN", "TESTING", "EVICT"):
        assert HEALTH.verdict({AUTOPILOT_LABEL: value}, CPU_ONLY) is None
        assert HEALTH.verdict({AUTOPILOT_LABEL: value}, ResourceVector({GPU: 0, "cpu": 1})) is None


def test_the_strongest_rule_wins_and_others_values_are_healthy() -> None:
    health = NodeHealth([*DEFAULT_RULES, Rule(GPU, "example.com/drain", "yes", Effect.NO_EXECUTE)])
    labels = {AUTOPILOT_LABEL: "WARN", "example.com/drain": "yes"}
    verdict = health.verdict(labels, ONE_GPU)
    assert verdict == Verdict(Effect.NO_EXECUTE, "example.com/drain", "yes", GPU)
    assert HEALTH.verdict({AUTOPILOT_LABEL: "PASS"}, ONE_GPU) is None
    assert HEALTH.verdict({}, ONE_GPU) is None
    assert NO_RULES.verdict({AUTOPILOT_LABEL: "EVICT"}, ONE_GPU) is None


def test_marks_hold_every_matching_rule_and_answer_as_the_rules_do() -> None:
    health = NodeHealth([*DEFAULT_RULES, Rule("example.com/fpga", AUTOPILOT_LABEL, "TESTING", Effect.PREFER_NOT)])
    marks = health.marks({AUTOPILOT_LABEL: "TESTING"})
    assert [(m.resource, m.effect) for m in marks] == [(GPU, Effect.NO_SCHEDULE),
                                                      ("example.com/fpga", Effect.PREFER_NOT)]
    fpga = ResourceVector({"example.com/fpga": 1})
    assert verdict_for(marks, fpga) == health.verdict({AUTOPILOT_LABEL: "TESTING"}, fpga)
    assert verdict_for(marks, fpga + ONE_GPU) is not None
    assert verdict_for(marks, fpga + ONE_GPU).effect is Effect.NO_SCHEDULE  # type: ignore[union-attr]
    assert HEALTH.marks({"other": "x"}) == ()


def test_a_verdict_says_which_label_and_which_pods() -> None:
    testing = HEALTH.verdict({AUTOPILOT_LABEL: "TESTING"}, ONE_GPU)
    assert testing is not None
    assert testing.describe() == "labelled autopilot.ibm.com/gpuhealth=TESTING (no nvidia.com/gpu pods)"
    warn = HEALTH.verdict({AUTOPILOT_LABEL: "WARN"}, ONE_GPU)
    assert warn is not None and not warn.effect.keeps_off
    assert "only when nothing else fits" in warn.describe()


# -- the controller's flags --------------------------------------------------------------------------------------


def test_flags_choose_the_rules() -> None:
    assert node_health_from_flags((), False).rules == DEFAULT_RULES
    assert node_health_from_flags((), True).rules == ()
    custom = node_health_from_flags(("example.com/fpga:fpga.example.com/health=bad:NoExecute",), False)
    assert custom.rules == (Rule("example.com/fpga", "fpga.example.com/health", "bad", Effect.NO_EXECUTE),)
    with pytest.raises(ValueError, match="contradict"):
        node_health_from_flags(("nvidia.com/gpu:a=b:NoSchedule",), True)
    with pytest.raises(ValueError, match="effect must be one of"):
        node_health_from_flags(("nvidia.com/gpu:a=b:Never",), False)


# -- the fit -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("health", ["TESTING", "EVICT"])
def test_gpu_pods_never_go_to_a_no_schedule_or_no_execute_node(health: str) -> None:
    nodes = [gpu_node("gpu-1"), gpu_node("gpu-2", health), gpu_node("gpu-3")]
    assert placed(pack([gpu_pods(16)], nodes, {})) == [("gpu-1", 8), ("gpu-3", 8)]
    packing = pack([gpu_pods(17)], nodes, {})
    assert not packing.fits
    assert packing.why == (
        "1 of 17 pods of Job trainer (cpu 1, memory 1Gi, nvidia.com/gpu 1 each) fit on no node: "
        "2 nodes have too little nvidia.com/gpu free (at most 0 on one node), "
        f"node gpu-2 is labelled autopilot.ibm.com/gpuhealth={health} (no nvidia.com/gpu pods)")
    assert packing.about == {"nodes:nvidia.com/gpu", "nodes:health"}
    assert not placement.eligible(gpu_pods(1), nodes[1])


def test_cpu_only_pods_still_go_to_a_sick_gpu_node() -> None:
    nodes = [gpu_node("gpu-1", "EVICT"), gpu_node("gpu-2", "TESTING")]
    assert placed(pack([cpu_pods(3)], nodes, {})) == [("gpu-1", 3)]
    assert placement.eligible(cpu_pods(1), nodes[0])


def test_prefer_not_nodes_are_used_last_and_a_gang_that_needs_them_still_fits() -> None:
    nodes = [gpu_node("gpu-1", "WARN"), gpu_node("gpu-2"), gpu_node("gpu-3", "WARN"), gpu_node("gpu-4")]
    assert placed(pack([gpu_pods(8)], nodes, {})) == [("gpu-2", 8)]
    assert placed(pack([gpu_pods(20)], nodes, {})) == [("gpu-2", 8), ("gpu-4", 8), ("gpu-1", 4)]
    # Only as much of them as the healthy nodes cannot hold: room taken elsewhere pushes pods there.
    full = {"gpu-2": ResourceVector({"cpu": 64000, "memory": 512 * GI, GPU: 0})}
    assert placed(pack([gpu_pods(10)], nodes, full)) == [("gpu-4", 8), ("gpu-1", 2)]
    # The order a reservation gives is kept among the healthy, the prefer-not ones still last.
    assert placed(pack([gpu_pods(9)], nodes, {}, in_given_order=True)) == [("gpu-2", 8), ("gpu-4", 1)]
    # cpu-only pods take the nodes in their order, warned or not.
    assert placed(pack([cpu_pods(1)], nodes, {})) == [("gpu-1", 1)]


def test_every_sick_node_is_named_by_its_label_a_few_at_a_time() -> None:
    nodes = [*(gpu_node(f"t{i}", "TESTING") for i in range(5)), gpu_node("e1", "EVICT")]
    packing = pack([gpu_pods(1)], nodes, {})
    assert packing.why == (
        "1 pod of Job trainer (cpu 1, memory 1Gi, nvidia.com/gpu 1) fits on no node: "
        "node e1 is labelled autopilot.ibm.com/gpuhealth=EVICT (no nvidia.com/gpu pods), "
        "nodes t0, t1, t2 and 2 more are labelled autopilot.ibm.com/gpuhealth=TESTING (no nvidia.com/gpu pods)")
    assert packing.about == {"nodes:health"}


def test_a_healthy_cluster_pays_no_partition() -> None:
    nodes = [gpu_node(f"n{i:04}") for i in range(1000)]
    assert not any(n.health for n in nodes)
    assert sum(n for _, n in placed(pack([gpu_pods(8000)], nodes, {}))) == 8000


# -- the accountant ----------------------------------------------------------------------------------------------


def labelled(name: str, value: str | None, rv: str = "1") -> NodeView:
    raw = raw_node(name, gpu=8, rv=rv)
    if value is not None:
        raw["metadata"]["labels"] = {AUTOPILOT_LABEL: value}
    return node_view(raw)


def test_the_accountant_marks_its_nodes_and_a_label_change_matters() -> None:
    acc = Accountant()  # Autopilot's rules by default
    assert acc.observe_node(labelled("gpu-1", None)) is True
    assert acc.node_verdict("gpu-1", ONE_GPU) is None
    assert acc.observe_node(labelled("gpu-1", None, rv="2")) is False  # a heartbeat
    assert acc.observe_node(labelled("gpu-1", "EVICT", rv="3")) is True  # the health checker labelled it
    verdict = acc.node_verdict("gpu-1", ONE_GPU)
    assert verdict is not None and verdict.value == "EVICT" and verdict.effect is Effect.NO_EXECUTE
    assert acc.node_verdict("gpu-1", CPU_ONLY) is None
    assert acc.observe_node(labelled("gpu-1", "TESTING", rv="4")) is True
    testing = acc.node_verdict("gpu-1", ONE_GPU)
    assert testing is not None and testing.effect is Effect.NO_SCHEDULE
    snapshot = acc.snapshot(by_nodes=True)
    assert not pack([gpu_pods(1)], snapshot.nodes, snapshot.room or {}).fits
    assert acc.observe_node(labelled("gpu-1", None, rv="5")) is True  # healed
    snapshot = acc.snapshot(by_nodes=True)
    assert pack([gpu_pods(1)], snapshot.nodes, snapshot.room or {}).fits
    assert acc.node_verdict("unknown", ONE_GPU) is None


def test_the_pods_of_an_appwrapper_on_no_execute_nodes_are_listed_with_why() -> None:
    acc = Accountant()
    for name, value in (("gpu-1", "EVICT"), ("gpu-2", "TESTING"), ("gpu-3", None)):
        acc.observe_node(labelled(name, value))

    def gpu_pod(uid: str, node: str, phase: str = "Running", gpus: str = "1") -> PodView:
        raw = raw_pod(uid, node_name=node, phase=phase, aw="a")
        raw["spec"]["containers"][0]["resources"]["requests"][GPU] = gpus
        return pod_view(raw)

    for view in (gpu_pod("on-evict", "gpu-1"), gpu_pod("on-testing", "gpu-2"), gpu_pod("healthy", "gpu-3"),
                 gpu_pod("done", "gpu-1", phase="Failed"), gpu_pod("cpu-only", "gpu-1", gpus="0")):
        acc.observe_pod(view)
    acc.observe_pod(pod_view(raw_pod("unbound", aw="a")))
    evicted = acc.evicted_pods("ns/a")
    assert [(p.name, v.describe()) for p, v in evicted] == [
        ("pod-on-evict", f"labelled {AUTOPILOT_LABEL}=EVICT (no {GPU} pods)")]
    assert acc.evicted_pods("ns/other") == []


def test_without_rules_no_node_is_marked() -> None:
    acc = Accountant(node_health=NO_RULES)
    acc.observe_node(labelled("gpu-1", "EVICT"))
    assert acc.node_verdict("gpu-1", ONE_GPU) is None
    snapshot = acc.snapshot(by_nodes=True)
    assert pack([gpu_pods(4)], snapshot.nodes, snapshot.room or {}).fits


# -- what operators see ------------------------------------------------------------------------------------------


def test_the_ledger_report_and_mcadctl_show_each_nodes_health() -> None:
    from mcad.cli.render import node_status
    acc = Accountant()
    acc.observe_node(labelled("gpu-1", "TESTING"))
    marked = acc.ledger.node("gpu-1")
    assert marked is not None
    doc = {"ready": True, "schedulable": True,
           "health": [{"resource": m.resource, "label": m.label, "value": m.value, "effect": m.effect.value}
                      for m in marked.health]}
    assert node_status(doc) == f"Ready,{AUTOPILOT_LABEL}=TESTING"
    assert node_status({"ready": True, "schedulable": False}) == "Ready,SchedulingDisabled"


@pytest.mark.parametrize(("args", "message"), [
    (["--node-health-rule", "nvidia.com/gpu:autopilot.ibm.com/gpuhealth=EVICT"], "RESOURCE:LABEL=VALUE:EFFECT"),
    (["--node-health-rule", "nvidia.com/gpu:a=b:Drain"], "the effect must be one of"),
    (["--no-node-health-rules", "--node-health-rule", "nvidia.com/gpu:a=b:NoSchedule"], "contradict"),
])
def test_the_controller_refuses_bad_rules_before_connecting(args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from mcad.cli import controller
    result = CliRunner().invoke(controller.main, ["--kubeconfig", "/nonexistent/kubeconfig", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


# -- what the kube-scheduler is told: pod templates keep off sick nodes ------------------------------------------


def test_keep_off_lists_the_no_schedule_and_no_execute_values_per_label() -> None:
    assert HEALTH.keep_off(ONE_GPU) == ((AUTOPILOT_LABEL, ("TESTING", "EVICT")),)
    assert HEALTH.keep_off(CPU_ONLY) == ()
    assert NO_RULES.keep_off(ONE_GPU) == ()


def _job(spec_extra: dict[str, Any], requests: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"}, "spec": {"template": {"spec": {
        "containers": [{"name": "c", "resources": {"requests": requests}}], **spec_extra}}}}


def _placed_spec(template: dict[str, Any], health: NodeHealth | None = HEALTH) -> dict[str, Any]:
    from mcad.api.appwrapper import appwrapper_view
    from mcad.k8s.apply import manifest
    item = {"generictemplate": template}
    aw = appwrapper_view({"metadata": {"name": "aw", "namespace": "team", "uid": "u-1"},
                          "spec": {"resources": {"GenericItems": [item]}}})
    spec: dict[str, Any] = manifest(aw, 0, item, gate=True, health=health)["spec"]["template"]["spec"]
    return spec


NOT_SICK = {"key": AUTOPILOT_LABEL, "operator": "NotIn", "values": ["TESTING", "EVICT"]}
GPU_REQUESTS = {"cpu": "1", GPU: "1"}


def _terms(spec: dict[str, Any]) -> Any:
    return spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_gpu_pod_templates_require_nodes_not_labelled_sick() -> None:
    assert _terms(_placed_spec(_job({}, GPU_REQUESTS))) == [{"matchExpressions": [NOT_SICK]}]
    assert "affinity" not in _placed_spec(_job({}, {"cpu": "1"})), "cpu-only pods are not affected"
    assert "affinity" not in _placed_spec(_job({}, GPU_REQUESTS), health=NO_RULES)
    assert "affinity" not in _placed_spec(_job({}, GPU_REQUESTS), health=None)


def test_the_requirement_is_anded_into_every_term_and_an_empty_term_stays_empty() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    named = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [zone]}, {"matchFields": [named]}, {}]}}}
    assert _terms(_placed_spec(_job({"affinity": affinity}, GPU_REQUESTS))) == [
        {"matchExpressions": [zone, NOT_SICK]}, {"matchFields": [named], "matchExpressions": [NOT_SICK]}, {}]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0] == \
        {"matchExpressions": [zone]}, "the AppWrapper's own template is not changed"
    # A field of the wrong type is left for the API server to refuse, as it would without mcad.
    assert _placed_spec(_job({"affinity": "bad"}, GPU_REQUESTS))["affinity"] == "bad"


def test_the_pods_constraints_then_keep_them_off_sick_nodes_even_unmarked() -> None:
    from mcad.api.podgroups import pod_constraints
    from mcad.api.workloads import pod_requests
    spec = _placed_spec(_job({}, GPU_REQUESTS))
    group = PodGroup(1, pod_requests(spec), *pod_constraints(spec))
    unmarked = NodeView("t", ResourceVector({GPU: 8}), True, "1", labels={AUTOPILOT_LABEL: "TESTING"})
    assert not unmarked.health and not placement.eligible(group, unmarked)  # what the kube-scheduler would say
    assert placement.eligible(group, NodeView("ok", ResourceVector({GPU: 8}), True, "1"))


def test_a_pod_mcad_created_is_told_the_label_not_its_affinity() -> None:
    from mcad.api.podgroups import pod_constraints
    from mcad.api.workloads import pod_requests
    spec = _placed_spec(_job({}, GPU_REQUESTS))
    group = PodGroup(1, pod_requests(spec), *pod_constraints(spec), label="Job train")
    packing = pack([group], [gpu_node("gpu-3", "TESTING")], {})
    assert packing.about == {"nodes:health"}
    assert packing.why.endswith(f"node gpu-3 is labelled {AUTOPILOT_LABEL}=TESTING (no {GPU} pods)")
