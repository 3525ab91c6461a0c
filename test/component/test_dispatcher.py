"""The dispatcher stepped key by key (test/component/harness.py): real work queue and informers over fake
lister-watchers, a recording writer that can fail, a fake clock. No API server and no sleeps: decisions that need
exact control over failures and time are checked here; everything else is checked end to end in test/e2e/."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import structlog

from mcad.k8s.kube import ApiError
from mcad.loop.dispatcher import UnknownKey
from test.component.harness import aw, gang_aw, gpu_node, last_status, node, pod
from test.fakes import wait_informed


def test_a_failing_api_is_retried_with_the_appwrappers_own_growing_backoff(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")])
    h.writer.fail_for["a-cm"] = ApiError(503, "ServiceUnavailable", "etcd is sad")
    h.drain()
    assert h.writer.attempts == 1
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 8000, "a failed dispatch releases its reservation"
    first = last_status(h, "a")
    assert first["state"] == "Pending", "the first failure is told at once"
    assert first["message"].startswith("creating its objects failed, retrying with backoff: "), first["message"]
    assert "ServiceUnavailable (503): etcd is sad" in first["message"]

    # Other AppWrappers are dispatched meanwhile, each arrival a cycle: none may retry "a" early or reset its count.
    # Its own delays double (0.5, 1, 2 s), each drawn from its upper half (jitter): in [d/2, d] after the last.
    step, now, retried_at = 0.01, 0.0, [0.0]
    while len(retried_at) < 4:
        if len(h.writer.applied) < 4 and int(now / step) % 25 == 0:
            name = f"other{len(h.writer.applied)}"
            h.lw["aw"].add(aw(name, "100m"))
            wait_informed(lambda name=name: h.dispatcher.appwrappers.get(f"ns/{name}"), 5, "the other AppWrapper")
        before = h.writer.attempts - len(h.writer.applied)
        h.clock.advance(step)
        now += step
        h.drain()
        if h.writer.attempts - len(h.writer.applied) > before:
            retried_at.append(now)
        assert now < 4.0, f"retried at {retried_at} only"
    assert h.writer.applied == [f"other{i}-cm" for i in range(4)]
    gaps = [b - a for a, b in itertools.pairwise(retried_at)]
    for gap, delay in zip(gaps, (0.5, 1.0, 2.0), strict=True):
        assert delay / 2 - step <= gap <= delay + step, f"gaps {gaps}: per AppWrapper, doubling, jittered"
    assert [n for n, _ in h.writer.statuses].count("a") == 1, "its retries cost no status write each"

    del h.writer.fail_for["a-cm"]
    h.clock.advance(4.0)  # past its next delay (at most 4 s)
    h.drain()
    assert h.writer.applied[-1] == "a-cm"
    assert last_status(h, "a")["state"] == "Running"
    assert h.dispatcher.owners.dispatches.attempts("ns/a") == 0, "a success forgets its failures"


def test_own_pods_that_exist_already_are_credited_after_a_crash(harness_factory: Any) -> None:
    # The controller applied the objects and died before writing status: the pods run, the AppWrapper looks new.
    h = harness_factory(nodes=[node("n0", "4")], pods=[pod("a-0", "4", appwrapper="a")], aws=[aw("a", "4")])
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 0
    h.drain()
    assert h.writer.applied == ["a-cm"], "re-applied (a no-op on the server), not left waiting on its own pods"
    assert h.writer.statuses[-1][1]["state"] == "Running"
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 0, "its pods are counted once"


def test_backoff_is_rewritten_for_a_new_shortage_not_for_new_amounts(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "2")], pods=[pod("first", "1")], aws=[aw("big", "2")], fit="aggregate")
    h.drain()
    assert [s["message"] for _, s in h.writer.statuses] == ["short of cpu 1 (needs 2, 1 free); position 1 in the queue"]

    h.lw["pod"].add(pod("other", "500m"))  # free capacity moves; the shortage is still cpu
    wait_informed(lambda: h.dispatcher.pods.get("uid-other"), 5, "the pod informer to see the pod")
    h.lw["aw"].add(aw("next", "100m"))  # a new AppWrapper makes a cycle happen
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/next"), 5, "the AppWrapper informer to see it")
    h.drain()
    assert [n for n, _ in h.writer.statuses] == ["big", "next"], "big's new amounts alone cost no write"

    h.lw["node"].modify({**node("n0", "2"), "status": {"allocatable": {"cpu": "2", "memory": "1Mi"},
                                                       "conditions": [{"type": "Ready", "status": "True"}]}})
    h.lw["aw"].modify({**aw("big", "2"), "spec": {"resources": {"GenericItems": [{"custompodresources": [
        {"replicas": 1, "requests": {"cpu": "2", "memory": "2Mi"}}]}]}}, "metadata": {
        **aw("big", "2")["metadata"], "generation": 2}})
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/big").generation == 2, 5, "big's new spec")
    h.drain()
    name, last = h.writer.statuses[-1]
    assert name == "big"
    assert last["message"] == ("short of cpu 1600m (needs 2, 400m free), memory 1Mi (needs 2Mi, 1Mi free); "
                               "more than the whole cluster has; position 1 in the queue")


def test_a_deep_queue_costs_one_visit_per_group_and_no_status_writes_per_cycle(harness_factory: Any) -> None:
    waiting = [aw(f"gpu{i:04d}", "1") for i in range(300)]
    for raw in waiting:
        raw["spec"]["resources"]["GenericItems"][0]["custompodresources"][0]["requests"]["nvidia.com/gpu"] = "1"
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=waiting)
    h.drain()
    assert len(h.writer.statuses) == 300, "each waiting AppWrapper is told why once"

    for i in range(5):
        h.lw["aw"].add(aw(f"cpu{i}", "100m"))
        wait_informed(lambda i=i: h.dispatcher.appwrappers.get(f"ns/cpu{i}"), 5, "the new AppWrapper")
        h.drain()
    assert h.writer.applied == [f"cpu{i}-cm" for i in range(5)]
    assert len(h.writer.statuses) == 305, "only the new AppWrappers' statuses were written"
    assert h.dispatcher.owners.queued.pending.group_count() == 1


def test_pods_the_scheduler_cannot_place_are_named_in_status_until_they_run(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[aw("a", "2")])
    h.drain()
    assert h.writer.applied == ["a-cm"]
    stuck = {**pod("a-1", "3", appwrapper="a"), "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu.", "lastTransitionTime": "2026-01-01T00:00:09Z"}]}}
    del stuck["spec"]["nodeName"]
    h.lw["pod"].add(pod("a-0", "1", appwrapper="a"))
    h.lw["pod"].add(stuck)
    wait_informed(lambda: h.dispatcher.pods.get("uid-a-1"), 5, "the pods")
    h.drain()
    h.clock.advance(5)  # pod counts are written at most every 5 s
    h.drain()
    counted = last_status(h, "a")
    assert (counted["pending"], counted["running"]) == (1, 1)
    assert counted["pendingpodconditions"] == [{"podname": "a-1", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu.", "lastTransitionTime": "2026-01-01T00:00:09Z"}]}]

    writes = len(h.writer.statuses)
    churned = h.lw["pod"].modify(stuck)["metadata"]["resourceVersion"]  # the same pod, seen again
    wait_informed(lambda: h.dispatcher.pods.get("uid-a-1").resource_version == churned, 5, "the pod's update")
    h.drain()
    h.clock.advance(5)
    h.drain()
    assert len(h.writer.statuses) == writes, "the same verdict costs no write"

    h.lw["pod"].modify(pod("a-1", "1", appwrapper="a"))  # placed after all, and running
    wait_informed(lambda: h.dispatcher.pods.get("uid-a-1").phase == "Running", 5, "the pod to run")
    h.drain()
    h.clock.advance(5)
    h.drain()
    cleared = last_status(h, "a")
    assert cleared["running"] == 2 and "pendingpodconditions" not in cleared


@pytest.mark.parametrize("fit", ["nodes", "aggregate"])
def test_eight_single_gpus_do_not_admit_one_eight_gpu_pod_with_fit_nodes(harness_factory: Any, fit: str) -> None:
    h = harness_factory(nodes=[gpu_node(f"n{i}", 1) for i in range(8)], pods=[],
                        aws=[gang_aw("big", 1, {"cpu": "1", "nvidia.com/gpu": "8"})], fit=fit)
    h.drain()
    if fit == "aggregate":
        assert h.writer.applied == ["big-cm"], "the aggregate check admits it (its pod would stay Pending)"
        return
    assert h.writer.applied == []
    message = last_status(h, "big")["message"]
    assert "on no node" in message and "nvidia.com/gpu" in message, message
    h.lw["aw"].add(gang_aw("spread", 8, {"cpu": "1", "nvidia.com/gpu": "1"}))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/spread"), 5, "the second AppWrapper")
    h.drain()
    assert h.writer.applied == ["spread-cm"], "the same GPUs as eight 1-GPU pods fit"


def test_fit_nodes_remembers_where_unbound_pods_were_planned(harness_factory: Any) -> None:
    # 2 nodes x 4 cpu. 2 + 3 + 3 = 8 fits the total, but once 2 and 3 are placed no node has 3 left.
    h = harness_factory(nodes=[node("n0", "4"), node("n1", "4")], pods=[],
                        aws=[gang_aw("a", 1, {"cpu": "2"}), gang_aw("b", 1, {"cpu": "3"})])
    h.drain()
    assert sorted(h.writer.applied) == ["a-cm", "b-cm"]
    h.lw["aw"].add(gang_aw("c", 1, {"cpu": "3"}))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/c"), 5, "c")
    h.drain()
    assert "c-cm" not in h.writer.applied, "no pod of a or b is bound yet, but their room is promised"
    assert "on no node" in last_status(h, "c")["message"]

    # Their pods bind, each on the node the other was planned on: the plans are used up all the same, and the
    # nodes' usage takes over.
    planned = {key: h.dispatcher.owners.accountant.plans.planned_nodes(key)[0][0] for key in ("ns/a", "ns/b")}
    assert planned["ns/a"] != planned["ns/b"]
    h.lw["pod"].add(pod("a-0", "2", appwrapper="a", node_name=planned["ns/b"]))
    h.lw["pod"].add(pod("b-0", "3", appwrapper="b", node_name=planned["ns/a"]))
    wait_informed(lambda: h.dispatcher.pods.get("uid-b-0"), 5, "the pods")
    h.drain()
    plans = h.dispatcher.owners.accountant.plans
    assert plans.planned_nodes("ns/a") == [] == plans.planned_nodes("ns/b")
    assert plans.planned_by_node() == {}
    assert "c-cm" not in h.writer.applied


def test_priority_preemption_evicts_the_most_recent_lower_priority_only(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("low-a", 1, {"cpu": "2"})], preemption=True)
    h.drain()
    h.clock.advance(10)
    h.lw["aw"].add(gang_aw("low-b", 1, {"cpu": "2"}))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/low-b"), 5, "low-b")
    h.drain()
    for name in ("low-a", "low-b"):
        h.lw["pod"].add(pod(f"{name}-0", "2", appwrapper=name))
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-b-0"), 5, "the pods")
    h.drain()
    assert h.writer.applied == ["low-a-cm", "low-b-cm"]

    h.lw["aw"].add(gang_aw("high", 1, {"cpu": "2"}, priority=5))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/high"), 5, "high")
    h.drain()
    victim = last_status(h, "low-b")
    assert victim["state"] == "Pending"
    # Both hold 2 cpu: low-b, dispatched 10 s later, has run 10 s less.
    assert victim["message"] == "Preempted by AppWrapper ns/high (priority 5); chosen for the least work lost: 1 " \
                                "AppWrapper(s), 0 CPU-hours."
    assert [c["reason"] for c in victim["conditions"] if c["type"] in ("PreemptCandidate", "Backoff")] == [
        "PreemptedByHigherPriority", "PreemptionTriggered"]
    assert last_status(h, "low-a")["state"] == "Running", "one victim is enough"
    assert "high-cm" not in h.writer.applied, "it waits until the victim's pods are gone"
    assert h.dispatcher.preemptions == 1

    h.lw["pod"].delete("ns/low-b-0")
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-b-0") is None, 5, "the victim's pod to go")
    h.drain()
    assert h.writer.applied[-1] == "high-cm"
    waits = last_status(h, "low-b")
    assert waits["state"] == "Pending"
    # Now it waits like any other; its requeue stays in the log, as upstream keeps it.
    assert [c["reason"] for c in waits["conditions"] if c["type"] == "Backoff"] == [
        "PreemptionTriggered", "AppWrapperNotRunnable."]
    assert h.dispatcher.preemptions == 1, "the victim (lower priority) never preempts back"


def test_when_what_blocks_a_group_changes_its_skipped_members_are_told_too(harness_factory: Any) -> None:
    # Three identical 3-cpu AppWrappers on a 4-cpu node that is still tainted not-ready: all wait on the taint.
    tainted = {**node("n0", "4"), "spec": {"taints": [{"key": "node.kubernetes.io/not-ready",
                                                       "effect": "NoSchedule"}]}}
    h = harness_factory(nodes=[tainted], pods=[], aws=[aw("a", "3"), aw("b", "3"), aw("c", "3")])
    h.drain()
    messages = {name: st.get("message", "") for name, st in h.writer.statuses}
    assert all("not-ready" in messages[n] for n in "abc"), h.writer.statuses

    h.lw["node"].modify(node("n0", "4"))  # the taint goes: a fits, b and c are now short of cpu
    wait_informed(lambda: not h.dispatcher.nodes.get("n0").taints, 5, "the node informer to see the change")
    h.drain()
    latest = {name: st.get("message", "") for name, st in h.writer.statuses}
    assert [st["state"] for name, st in h.writer.statuses if name == "a"][-1] == "Running"
    for name in "bc":
        assert "not-ready" not in latest[name] and "too little cpu free" in latest[name], latest[name]
    writes = len(h.writer.statuses)
    h.dispatcher.queue.add(("dispatch", ""))
    h.drain()
    assert len(h.writer.statuses) == writes, "nothing changed: no member is rewritten again"


def test_a_key_of_no_known_kind_raises_and_is_dropped_not_retried(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")], fit="aggregate")
    h.drain()
    cycles = h.dispatcher.cycles
    with pytest.raises(UnknownKey, match="no handler for work-queue key"):
        h.dispatcher.process(("dispatch", ""))  # type: ignore[arg-type]  # what a key was before mcad.model.keys
    h.dispatcher.queue.add(("dispatch", ""))  # type: ignore[arg-type]
    assert h.dispatcher.process_next(timeout=0) == ("dispatch", "")
    assert h.dispatcher.cycles == cycles, "it never falls through to a dispatch cycle"
    h.clock.advance(3600)
    assert all(not isinstance(k, tuple) for k in iter(lambda: h.dispatcher.process_next(timeout=0), None)), \
        "dropped, not retried with backoff"


def test_a_write_outcome_of_no_known_kind_is_logged_as_a_bug_and_dropped(harness_factory: Any) -> None:
    """Outcomes go to their owners by kind (``Dispatcher._outcome_table``); one nobody reads is a bug where the job
    was written, told as such, and the loop carries on; a job with nothing to report returns None, which is fine."""
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")], fit="aggregate")
    h.drain()
    refused = ApiError(500, "InternalError", "refused")

    def raises() -> None:
        raise refused

    with structlog.testing.capture_logs() as logs:
        h.dispatcher.owners.writes.submit("ns/a", lambda: ("created", "ns/a"), tenant="ns")
        h.dispatcher.owners.writes.submit("ns/a", lambda: None, tenant="ns")
        h.dispatcher.owners.writes.submit("ns/a", raises, tenant="ns")
        h.drain()
    assert [(e["event"], e.get("outcome", e.get("error"))) for e in logs if e["log_level"] == "error"] == [
        ("a write outcome of no known kind: dropped", "('created', 'ns/a')"),
        ("background write failed", repr(refused))]
    assert last_status(h, "a")["state"] == "Running"


def test_a_backlog_found_at_start_is_told_why_it_waits_with_one_fit_check_per_group(
        harness_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold start announces every queued AppWrapper; a fit check costs O(nodes), so one per newcomer
    would be O(queue x nodes) (100,000 x 5,000). Members of a group are judged alike: one check per group."""
    from mcad.model import reservations

    checks = [0]
    real = reservations.fits

    def counted(*args: Any, **kwargs: Any) -> Any:
        checks[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(reservations, "fits", counted)
    backlog = [aw(f"big{i:03d}", "8") for i in range(200)] + [aw(f"mid{i:03d}", "6") for i in range(100)]
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[*backlog, aw("small", "1")])
    h.drain()
    assert last_status(h, "small")["state"] == "Running"
    for name in ("big000", "big199", "mid000", "mid099"):
        status = last_status(h, name)
        assert status["state"] == "Pending"
        assert "cpu" in status["message"], status["message"]
    assert last_status(h, "big199")["message"].endswith("position 200 in the queue")
    assert checks[0] < 20, f"{checks[0]} fit checks for 300 queued AppWrappers in 2 groups"
    # A later cycle (a new arrival) costs O(groups) too, not O(queue).
    checks[0] = 0
    h.lw["aw"].add(aw("later", "1"))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/later"), 5, "the new AppWrapper")
    h.drain()
    assert last_status(h, "later")["state"] == "Running"
    assert checks[0] < 10, f"{checks[0]} fit checks in a cycle over 300 queued AppWrappers in 2 groups"


def test_a_preemptor_whose_pods_name_another_scheduler_fails_and_evicts_nobody(harness_factory: Any) -> None:
    # Stored around the webhook: its pods would be placed by no scheduler mcad counts on, so it must not take room.
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("low", 1, {"cpu": "4"})], preemption=True)
    h.drain()
    h.lw["pod"].add(pod("low-0", "4", appwrapper="low"))
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-0"), 5, "low's pod")
    h.drain()
    nobody = gang_aw("nobody", 1, {"cpu": "4"}, priority=5)
    nobody["spec"]["resources"]["GenericItems"][0]["generictemplate"] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nobody-0"},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "i"}]}}
    h.lw["aw"].add(nobody)
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/nobody"), 5, "nobody")
    h.drain()
    failed = last_status(h, "nobody")
    assert failed["state"] == "Failed"
    assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["InvalidSpec"]
    assert "schedulerName 'nobody' is not a scheduler the cluster admin allows" in failed["message"]
    assert last_status(h, "low")["state"] == "Running" and h.dispatcher.preemptions == 0
    assert h.writer.applied == ["low-cm"]
