"""Placement that binds, its pure parts: what a pod's view keeps for pinning, the ungate patch (checked against
the JSON-patch rules the API server applies), which pods mcad will place, and how the accountant hands out slots."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from mcad.api.resources import ZERO
from mcad.api.views import PLACEMENT_GATE, pod_view
from mcad.errors import ApiError
from mcad.k8s.workqueue import WorkQueue
from mcad.loop.pinning import UNGATE_RETRY_BASE_SECONDS, Here, Pinning, Ungated
from mcad.loop.ungate import ungate_patch
from mcad.model.accounting import Accountant
from mcad.model.keys import PodEvent
from test.fakes import FakeClock, apply_json_patch
from test.unit.nodes_and_pods import GI, node, raw_pod, v

ONE = v(cpu=1000, memory=GI)
TWO = v(cpu=2000, memory=GI)
KEY = "ns/a"


def gated(uid: str = "u1", *, gates: tuple[str, ...] = (PLACEMENT_GATE,), affinity: Any = None,
          owner: dict[str, Any] | None = None, cpu: str = "1", node_name: str | None = None,
          selector: dict[str, str] | None = None) -> dict[str, Any]:
    raw = raw_pod(uid, aw="a", cpu=cpu, node_name=node_name)
    raw["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    if gates:
        raw["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    if affinity is not None:
        raw["spec"]["affinity"] = affinity
    if selector:
        raw["spec"]["nodeSelector"] = selector
    if owner is not None:
        raw["metadata"]["ownerReferences"] = [{"controller": True, **owner}]
    return raw


def test_a_pod_view_keeps_pin_facts_only_while_it_is_an_unbound_pod_of_an_appwrapper() -> None:
    view = pod_view(gated(owner={"kind": "Job", "name": "j", "uid": "ju"}, selector={"zone": "a"}))
    assert view.gated and view.pin is not None
    assert view.pin.owner is not None and (view.pin.owner.kind, view.pin.owner.name) == ("Job", "j")
    assert view.pin.constraints.node_selector == (("zone", "a"),) and view.pin.constraints.requests == ONE
    assert view.unschedulable is None  # a gated pod waits for mcad, not for room
    assert pod_view(gated(node_name="n1")).pin is None  # bound: nothing kept
    other = gated()
    del other["metadata"]["labels"]
    assert pod_view(other).pin is None  # no AppWrapper's


def test_the_gate_alone_is_removed_and_a_pod_without_affinity_is_pinned_by_node_name() -> None:
    raw = gated(gates=("other/gate", PLACEMENT_GATE))
    view = pod_view(raw)
    assert view.pin is not None
    patched = apply_json_patch(raw, ungate_patch("u1", view.pin, "n7"))
    assert patched["spec"]["schedulingGates"] == [{"name": "other/gate"}]
    assert patched["spec"]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}]}}}
    assert pod_view(patched).pin is not None and pod_view(patched).pin.pinned_to == "n7"  # type: ignore[union-attr]
    assert not pod_view(patched).gated


def test_existing_terms_are_narrowed_not_replaced() -> None:
    terms = [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100", "h100"]}]},
             {"matchExpressions": [{"key": "zone", "operator": "Exists"}],
              "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]}]
    raw = gated(affinity={"podAntiAffinity": {}, "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [],
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
    view = pod_view(raw)
    assert view.pin is not None
    patched = apply_json_patch(raw, ungate_patch("u1", view.pin, "n2"))
    assert "schedulingGates" not in patched["spec"]
    new_terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    pin = {"key": "metadata.name", "operator": "In", "values": ["n2"]}
    # Every term keeps what it required and gains the node: Kubernetes allows adding requirements to a gated pod.
    assert new_terms == [{**terms[0], "matchFields": [pin]},
                         {**terms[1], "matchFields": [*terms[1]["matchFields"], pin]}]
    assert patched["spec"]["affinity"]["podAntiAffinity"] == {}


@pytest.mark.parametrize("affinity", [{}, {"nodeAffinity": {}}, {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}])
def test_partial_affinity_gets_the_one_term_it_lacks(affinity: dict[str, Any]) -> None:
    raw = gated(affinity=affinity)
    view = pod_view(raw)
    assert view.pin is not None
    patched = apply_json_patch(raw, ungate_patch("u1", view.pin, "n1"))
    assert pod_view(patched).pin.pinned_to == "n1"  # type: ignore[union-attr]


def test_the_patch_refuses_a_pod_changed_since_it_was_read() -> None:
    raw = gated()
    view = pod_view(raw)
    assert view.pin is not None
    ops = ungate_patch("u1", view.pin, "n1")
    other = copy.deepcopy(raw)
    other["metadata"]["uid"] = "someone-else"
    with pytest.raises(ValueError, match="metadata/uid"):
        apply_json_patch(other, ops)
    regated = copy.deepcopy(raw)
    regated["spec"]["schedulingGates"].append({"name": "late/gate"})
    with pytest.raises(ValueError, match="schedulingGates"):
        apply_json_patch(regated, ops)


def test_without_a_node_only_the_gate_goes() -> None:
    raw = gated()
    view = pod_view(raw)
    assert view.pin is not None
    patched = apply_json_patch(raw, ungate_patch("u1", view.pin, ""))
    assert "schedulingGates" not in patched["spec"] and "affinity" not in patched["spec"]


# -- slots ------------------------------------------------------------------------------------------------------------


def accountant() -> Accountant:
    acc = Accountant()
    for name in ("n1", "n2"):
        acc.observe_node(node(name))
    return acc


def test_each_gated_pod_takes_its_own_slot_of_its_shape_and_binding_uses_it() -> None:
    acc = accountant()
    acc.assume(KEY, ONE.scale(2) + TWO, {}, plan=(("n1", TWO, 1), ("n2", ONE, 2)))
    anywhere = lambda _node: True  # noqa: E731
    assert acc.plans.pin(KEY, "p1", ONE, anywhere) == "n2"
    assert acc.plans.pin(KEY, "p2", ONE, anywhere) == "n2"
    assert acc.plans.pin(KEY, "p3", ONE, anywhere) is None  # both ONE slots are taken: beyond the plan
    assert acc.plans.pin(KEY, "p4", TWO, lambda n: n != "n1") is None  # its node is not one it may use
    assert acc.plans.pin(KEY, "p4", TWO, anywhere) == "n1"
    assert acc.plans.pinned_by_node() == {"n2": 2, "n1": 1}
    # A pinned pod that binds takes its own slot; the room stays promised until then.
    assert acc.room()["n2"] == node("n2").allocatable - ONE.scale(2)
    acc.observe_pod(pod_view(gated("p1", gates=(), node_name="n2")))
    assert acc.plans.pinned_node("p1") is None and acc.plans.planned_nodes(KEY) == [("n1", 1), ("n2", 1)]


def test_a_pod_that_goes_unbound_hands_its_slot_back_and_a_refused_one_drops_it() -> None:
    acc = accountant()
    acc.assume(KEY, ONE.scale(2), {}, plan=(("n2", ONE, 2),))
    acc.plans.pin(KEY, "p1", ONE, lambda _n: True)
    acc.plans.pin(KEY, "p2", ONE, lambda _n: True)
    acc.observe_pod(pod_view(gated("p1", gates=())))
    acc.forget_pod("p1")  # deleted before it bound: its replacement gets the slot
    assert acc.plans.pin(KEY, "p3", ONE, lambda _n: True) == "n2"
    assert acc.plans.unpin("p2", drop_slot=True) == "n2"  # the node refused it: that slot leaves the plan
    assert acc.plans.planned_nodes(KEY) == [("n2", 1)] and acc.plans.planned_by_node() == {"n2": ONE}


def test_an_extra_pod_gets_a_slot_of_its_own_and_dropping_the_plan_drops_every_pin() -> None:
    acc = accountant()
    acc.assume(KEY, ONE, {}, plan=(("n1", ONE, 1),))
    acc.plans.pin(KEY, "p1", ONE, lambda _n: True)
    acc.plans.pin_extra(KEY, "p2", "n2", TWO)
    assert acc.plans.planned_by_node() == {"n1": ONE, "n2": TWO}
    assert acc.plans.pins() == {"p1": (KEY, "n1"), "p2": (KEY, "n2")}
    acc.forget(KEY)
    assert acc.plans.pins() == {} and acc.plans.planned_by_node() == {}


def test_a_pod_placed_on_its_own_accounts_for_one_open_slot_an_unusable_one_first() -> None:
    acc = accountant()
    acc.assume(KEY, ONE.scale(3), {}, plan=(("n1", ONE, 1), ("n2", ONE, 2)))
    assert acc.plans.drop_open_slot(KEY, lambda n: n == "n1") == "n1"
    assert acc.plans.drop_open_slot(KEY, lambda n: n == "n1") == "n2"  # none unusable left: the last
    acc.plans.pin(KEY, "p1", ONE, lambda _n: True)
    assert acc.plans.drop_open_slot(KEY, lambda _n: False) is None, "the last slot is pinned: none open"
    assert acc.plans.planned_nodes(KEY) == [("n2", 1)]


def test_a_pod_that_asks_less_than_its_slots_takes_the_smallest_that_holds_it() -> None:
    acc = accountant()
    big, half = v(cpu=4000), v(cpu=500)
    acc.assume(KEY, big + TWO, {}, plan=(("n1", big, 1), ("n2", TWO, 1)))
    assert acc.plans.pin(KEY, "p1", half, lambda _n: True) == "n2"
    assert acc.plans.pin(KEY, "p2", half, lambda _n: True) == "n1"
    assert acc.plans.pin(KEY, "p3", half, lambda _n: True) is None
    assert acc.plans.pin(KEY, "p4", v(cpu=8000), lambda _n: True) is None


def test_after_a_restart_a_pinned_unbound_pod_keeps_its_node() -> None:
    acc = accountant()
    pinned = gated("p1", gates=(), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}})
    acc.observe_pod(pod_view(pinned))
    acc.observe_pod(pod_view(gated("p2")))
    acc.assume(KEY, ONE.scale(2), {})
    from mcad.api.podgroups import PodGroup
    snapshot = acc.snapshot(by_nodes=True)
    acc.replan(KEY, [PodGroup(2, ONE)], acc.ledger.nodes(), snapshot)
    assert acc.plans.pinned_node("p1") == "n2"
    # The other pod's slot is planned afresh (first fit: n1), and the gated pod takes it.
    assert acc.plans.pin(KEY, "p2", ONE, lambda _n: True) == "n1"


def test_a_pins_own_requirement_is_told_apart_from_the_pods() -> None:
    from mcad.loop.ungate import without_pin
    terms = [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]
    raw = gated(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}})
    view = pod_view(raw)
    assert view.pin is not None
    pinned = pod_view(apply_json_patch(raw, ungate_patch("u1", view.pin, "n2"))).pin
    assert pinned is not None and without_pin(pinned.constraints, "n2") == view.pin.constraints
    bare = pod_view(gated())
    assert bare.pin is not None
    pinned_bare = pod_view(apply_json_patch(gated(), ungate_patch("u1", bare.pin, "n2"))).pin
    assert pinned_bare is not None and without_pin(pinned_bare.constraints, "n2").required_affinity == ()


# -- ungate retries ---------------------------------------------------------------------------------------------------


class _Pods:
    def __init__(self, *raws: dict[str, Any]) -> None:
        self._views = {raw["metadata"]["uid"]: pod_view(raw) for raw in raws}

    def get(self, uid: str) -> Any:
        return self._views.get(uid)


def test_ungate_retries_are_jittered_so_a_gangs_pods_do_not_retry_in_step() -> None:
    """A gang's ungate patches fail together (a webhook, a throttle); each pod's retry is drawn from [d/2, d]."""
    clock = FakeClock()
    queue: WorkQueue[Any] = WorkQueue(clock=clock)
    draws = iter([0.0, 0.999])
    pinning = Pinning(binding=True, accountant=accountant(), pods=_Pods(gated("u1"), gated("u2")),
                      where=None, writes=None, queue=queue, queued=None, active=None, decisions=None,  # type: ignore[arg-type]
                      appwrappers=None, recorder=None, metrics=None, ownership=None,  # type: ignore[arg-type]
                      monotonic=clock.monotonic, draw=lambda: next(draws))
    for uid in ("u1", "u2"):
        pinning.done(Ungated(uid, KEY, "n1", ApiError(500, "InternalError", "webhook timed out")))
    base = UNGATE_RETRY_BASE_SECONDS
    clock.advance(base / 2)
    assert _ready(queue) == [PodEvent("u1")], "the first at half its delay"
    clock.advance(base / 2 - base / 1000)
    assert _ready(queue) == [], "the second near its full delay"
    clock.advance(base / 1000)
    assert _ready(queue) == [PodEvent("u2")]


class _HeldWrites:
    """Keeps each submitted job for the test to run when it chooses."""

    def __init__(self) -> None:
        self.jobs: list[Callable[[], Any]] = []

    def submit(self, key: str, job: Callable[[], Any], **_: Any) -> None:
        self.jobs.append(job)


class _Writer:
    def patch_json(self, *args: Any) -> dict[str, Any]:
        return {}


class _Latencies:
    def __init__(self) -> None:
        self.observed: list[float] = []
        self.pins: list[str] = []

    def pin(self, outcome: str) -> None:
        self.pins.append(outcome)

    def ungate_latency(self, seconds: float) -> None:
        self.observed.append(seconds)


def test_the_ungate_time_is_kept_when_the_pod_is_seen_bound_before_its_patch_comes_back() -> None:
    """The patch's answer and the pod's bound event race: the scheduler may bind it before the loop takes the
    outcome. The time from first seen gated to the patch's answer must be recorded either way."""
    clock = FakeClock()
    writes, latencies = _HeldWrites(), _Latencies()
    pinning = Pinning(binding=False, accountant=accountant(), pods=_Pods(), where=Here(_Writer()),  # type: ignore[arg-type]
                      writes=writes, queue=None, queued=None, active=None, decisions=None,  # type: ignore[arg-type]
                      appwrappers=None, recorder=None, metrics=latencies, ownership=None,  # type: ignore[arg-type]
                      monotonic=clock.monotonic)
    seen_gated = pod_view(gated("u1"))
    pinning.observe(replace(seen_gated, pin=replace(seen_gated.pin, seen=clock.monotonic())))
    clock.advance(0.25)
    outcome = writes.jobs[0]()  # the patch answers
    pinning.observe(pod_view(gated("u1", gates=(), node_name="n1")))  # seen bound first
    pinning.done(outcome)
    assert latencies.observed == [0.25] and latencies.pins == ["released"]


def _ready(queue: WorkQueue[Any]) -> list[Any]:
    out = []
    while True:
        key, shutdown = queue.get(timeout=0)
        if key is None or shutdown:
            return out
        queue.done(key)
        out.append(key)


def test_a_slot_made_for_a_pod_beyond_the_plan_goes_with_that_pod() -> None:
    """A pod beyond the plan deleted before it binds (or one someone else made and removed): no room stays promised
    to a pod that does not exist, while a slot of the plan itself waits for the replacement."""
    acc = accountant()
    acc.assume(KEY, ONE + TWO, {}, plan=(("n1", ONE, 1),))
    acc.plans.pin(KEY, "p1", ONE, lambda _n: True)
    acc.plans.pin_extra(KEY, "p2", "n2", TWO)
    acc.observe_pod(pod_view(gated("p2", gates=())))
    acc.forget_pod("p2")
    assert acc.plans.planned_by_node() == {"n1": ONE} and acc.plans.pins() == {"p1": (KEY, "n1")}
    acc.forget_pod("p1")
    assert acc.plans.planned_nodes(KEY) == [("n1", 1)], "the plan's own slot waits for its replacement"
    assert acc.plans.unpin("p2") is None


def test_room_beyond_the_plan_is_bounded_by_the_demand() -> None:
    acc = accountant()
    acc.assume(KEY, ONE.scale(2), {}, plan=(("n1", ONE, 2),))
    assert acc.beyond_demand(KEY, ONE) == ONE, "two planned slots and one more: one over"
    acc.observe_pod(pod_view(raw_pod("p1", aw="a", node_name="n1", phase="Running")))
    acc.observe_pod(pod_view(raw_pod("p2", aw="a", node_name="n1", phase="Running")))
    assert acc.plans.planned_nodes(KEY) == []
    assert acc.beyond_demand(KEY, ONE) == ONE, "both bound and running: still one over"
    acc.observe_pod(pod_view(raw_pod("p2", aw="a", node_name="n1", phase="Failed")))
    assert acc.beyond_demand(KEY, ONE) == ZERO, "one ended: its replacement fits the demand"
    assert acc.beyond_demand(KEY, TWO) == TWO - ONE
    assert acc.beyond_demand("ns/none", TWO) == ZERO, "no reservation: nothing planned, nothing to bound"
