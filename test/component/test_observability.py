"""What /debug and /metrics report, from a dispatcher stepped key by key (see harness.py):
the queue in dispatch order with why each one waits, the ledger, plain-words explanations, decision counters."""

from __future__ import annotations

from typing import Any

from mcad.metrics import PUBLISH_INTERVAL_SECONDS, Metrics
from mcad.model.keys import DISPATCH, PUBLISH
from mcad.serve import server
from mcad.serve.debug import Reports
from test.component.harness import aw, node, pod


def reports(h: Any) -> Reports:
    return Reports(h.dispatcher.view, lambda: {"identity": "test", "leader": True})


def test_the_queue_report_lists_waiting_appwrappers_in_order_with_why(harness_factory: Any) -> None:
    # 8 cpu: a (4) fits; b (6) waits and reserves 6, so c (2) waits behind it (and reserves the second); d (6)
    # waits. With --reservations 0, c goes ahead (best-effort FIFO).
    aws = [aw("a", "4"), aw("b", "6"), aw("c", "2"), aw("d", "6")]
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=aws, fit="aggregate", reservations=2)
    h.drain()
    doc = reports(h).queue()
    assert [(q["position"], q["name"], q["state"], q["fitsNow"]) for q in doc["queued"]] == [
        (1, "b", "Queued", False), (2, "c", "Queued", False), (3, "d", "Queued", False)]
    assert [q["why"] for q in doc["queued"]] == [
        "short of cpu 2 (needs 6, 4 free)",
        "waiting behind the reservation of ns/b of cpu=6",
        "short of cpu 2 (needs 6, 4 free)"]
    assert doc["reservations"] == [{"appwrapper": "ns/b", "nodes": [], "amount": "cpu=6", "startsBy": None},
                                   {"appwrapper": "ns/c", "nodes": [], "amount": "cpu=2", "startsBy": None}]
    assert doc["queued"][0]["demand"] == {"cpu": "6"}
    assert doc["queued"][0]["pods"] == 1
    assert [(d["name"], d["state"]) for d in doc["dispatched"]] == [("a", "Running")]
    assert doc["controller"] == {"identity": "test", "leader": True, "fit": "aggregate", "strictFifo": False,
                                 "preemption": False, "reservations": 2}

    best_effort = harness_factory(nodes=[node("n0", "8")], pods=[], aws=aws, fit="aggregate", reservations=0)
    best_effort.drain()
    doc = reports(best_effort).queue()
    assert [(q["name"], q["why"]) for q in doc["queued"]] == [("b", "short of cpu 4 (needs 6, 2 free)"),
                                                              ("d", "short of cpu 4 (needs 6, 2 free)")]
    assert [d["name"] for d in doc["dispatched"]] == ["a", "c"] and doc["reservations"] == []


def test_strict_fifo_reports_everything_behind_the_head_as_held(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "6"), aw("b", "4"), aw("c", "1")],
                        strict_fifo=True, fit="aggregate")
    h.drain()
    queued = reports(h).queue()["queued"]
    assert [(q["name"], q["fitsNow"]) for q in queued] == [("b", False), ("c", False)]
    assert queued[0]["why"].startswith("short of cpu")
    assert queued[1]["why"] == "waiting behind earlier AppWrappers (strict FIFO)", "c would fit, but FIFO holds it"


def test_the_ledger_report_shows_capacity_use_and_reservations(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8"), node("n1", "4")], pods=[], aws=[aw("a", "5")])
    h.drain()
    doc = reports(h).ledger()
    cpu = next(r for r in doc["resources"] if r["name"] == "cpu")
    assert cpu == {"name": "cpu", "capacity": "12", "used": "0", "reserved": "5", "free": "7"}
    assert doc["reservations"] == [{"namespace": "ns", "name": "a", "reserved": {"cpu": "5"}}]
    n0 = next(n for n in doc["nodes"] if n["name"] == "n0")
    # --fit=nodes planned the 5-cpu pod on n0 (the only node with room): held back there until it binds.
    assert n0["planned"] == {"cpu": "5"} and n0["free"]["cpu"] == "3"


def test_the_ledger_report_counts_each_bound_pod_in_its_nodes_pods(harness_factory: Any) -> None:
    # Requests carry no "pods", yet each pod takes one of its node's 110 slots, as the scheduler counts them: two
    # running pods of an AppWrapper and one of nobody's on n0, none on n1; a finished one takes none.
    nodes = [node("n0", "8"), node("n1", "8")]
    for n in nodes:
        n["status"]["allocatable"]["pods"] = "110"
    finished = pod("done", "1", node_name="n0")
    finished["status"]["phase"] = "Succeeded"
    pods = [pod("a-0", "1", appwrapper="a"), pod("a-1", "1", appwrapper="a"), pod("other", "500m"), finished]
    h = harness_factory(nodes=nodes, pods=pods, aws=[aw("a", "2")])
    h.drain()
    doc = reports(h).ledger()
    assert next(r for r in doc["resources"] if r["name"] == "pods") == {
        "name": "pods", "capacity": "220", "used": "3", "reserved": "0", "free": "217"}
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert by_name["n0"]["used"]["pods"] == "3" and by_name["n0"]["free"]["pods"] == "107"
    assert "pods" not in by_name["n1"]["used"] and by_name["n1"]["free"]["pods"] == "110"
    assert by_name["n0"]["used"]["cpu"] == "2500m"


def test_explain_says_in_words_why_an_appwrapper_is_where_it_is(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "4"), aw("b", "6")], fit="aggregate")
    h.drain()
    r = reports(h)
    waiting = r.explain("ns", "b")
    assert waiting is not None and waiting["found"]
    assert waiting["summary"] == "It is queued and cannot be dispatched yet: short of cpu 2 (needs 6, 4 free)."
    assert ("it holds a reservation of cpu=6: AppWrappers behind it may use that room only if they are sure to end "
            "first; when that room frees is unknown (what holds it has no dispatchDuration.limit)"
            in waiting["details"])
    assert "position 1 of 1 in the queue" in waiting["details"]
    running = r.explain("ns", "a")
    assert running is not None and running["summary"].startswith("It is dispatched (Running) since ")
    assert r.explain("ns", "nope") is None


def test_decisions_latency_and_cycles_are_counted_and_state_is_read_at_scrape_time(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "4"), aw("b", "6")], fit="aggregate")
    server.observe(h.dispatcher, h.informers, api_errors=lambda: {("patch", 409): 3},
                   api_writes=lambda: {("patch", "appwrappers.workload.codeflare.dev/status"): 2}, leading=lambda: True)
    h.drain()
    h.clock.advance(PUBLISH_INTERVAL_SECONDS)  # the loop publishes its state for scrapes at most this often
    h.drain()
    m = h.dispatcher.metrics
    assert m.value("mcad_dispatch_decisions_total", {"decision": "dispatched"}) == 1
    assert m.value("mcad_dispatch_decisions_total", {"decision": "queued"}) == 1
    assert m.value("mcad_dispatch_decisions_total", {"decision": "failed"}) == 0
    assert m.value("mcad_dispatch_latency_seconds_count") == 1
    assert m.value("mcad_dispatch_cycle_duration_seconds_count") == h.dispatcher.cycles
    assert m.value("mcad_capacity", {"resource": "cpu"}) == 8.0
    assert m.value("mcad_capacity_reserved", {"resource": "cpu"}) == 4.0
    assert m.value("mcad_capacity_free", {"resource": "cpu"}) == 4.0
    assert m.value("mcad_capacity_free", {"resource": "memory"}) == 8 * 2**30
    assert m.value("mcad_queue_length", {"state": "queued"}) == 1
    assert m.value("mcad_reservations") == 1, "b waits for room and holds a reservation"
    assert m.value("mcad_time_to_dispatch_seconds_count", {"priority_class": "0"}) == 1
    assert m.value("mcad_appwrappers", {"state": "Running"}) == 1
    assert m.value("mcad_api_errors_total", {"verb": "patch", "code": "409"}) == 3
    status_writes = {"verb": "patch", "resource": "appwrappers.workload.codeflare.dev/status"}
    assert m.value("mcad_api_writes_total", status_writes) == 2
    assert m.value("mcad_informer_synced", {"informer": "pods"}) == 1
    assert m.value("mcad_leader") == 1
    text = m.render().decode()
    assert '# TYPE mcad_dispatch_latency_seconds histogram' in text
    assert 'mcad_capacity_free{resource="cpu"} 4.0' in text
    assert (m.value("process_resident_memory_bytes") or 0) > 0


def test_time_to_dispatch_is_labelled_by_priority_class_with_a_bounded_number_of_labels() -> None:
    m = Metrics()
    m.dispatch_latency(2.0, "batch-high")
    for priority in range(100):  # a tenant choosing a new spec.priority for each AppWrapper
        m.dispatch_latency(1.0, str(priority))
    assert m.value("mcad_time_to_dispatch_seconds_count", {"priority_class": "batch-high"}) == 1
    assert m.value("mcad_time_to_dispatch_seconds_sum", {"priority_class": "batch-high"}) == 2.0
    assert m.value("mcad_time_to_dispatch_seconds_count", {"priority_class": "30"}) == 1
    assert m.value("mcad_time_to_dispatch_seconds_count", {"priority_class": "31"}) is None
    assert m.value("mcad_time_to_dispatch_seconds_count", {"priority_class": "other"}) == 69
    assert m.value("mcad_dispatch_latency_seconds_count") == 101


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def record(self, ref: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((ref.name, type_, reason, message))


def test_transitions_are_told_as_events_once_per_change_of_what_blocks(harness_factory: Any) -> None:
    sink = RecordingSink()
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "4"), aw("b", "6"), aw("c", "6")],
                        fit="aggregate", recorder=sink)
    h.drain()
    assert sorted(sink.events) == [
        ("a", "Normal", "Dispatched", "Its wrapped objects were created; it reserves cpu=4."),
        ("b", "Normal", "Queued", "Waiting: short of cpu 2 (needs 6, 4 free)."),
        ("c", "Normal", "Queued", "Waiting: short of cpu 2 (needs 6, 4 free)."),
    ]
    before = len(sink.events)
    h.dispatcher.queue.add(DISPATCH)
    h.drain()
    assert len(sink.events) == before, "another cycle with nothing changed tells nothing"


def test_a_key_that_holds_the_loop_100_ms_or_more_is_logged(harness_factory: Any) -> None:
    import structlog

    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[])
    h.drain()
    process = h.dispatcher.process

    def slowly(key: Any) -> None:
        h.clock.advance(0.25 if key == DISPATCH else 0.01)
        process(key)

    h.dispatcher.process = slowly
    with structlog.testing.capture_logs() as logs:
        h.dispatcher.queue.add(PUBLISH)
        h.dispatcher.process_next(timeout=0)
        h.dispatcher.queue.add(DISPATCH)
        h.dispatcher.process_next(timeout=0)
    slow = [line for line in logs if line["event"] == "slow work-queue key"]
    assert slow == [{"event": "slow work-queue key", "log_level": "info", "key": type(DISPATCH).__name__,
                     "ms": 250.0}]


def test_the_published_decisions_are_a_copy_read_as_asked(harness_factory: Any) -> None:
    # No fake informer event follows the recorded status writes: the decisions stay "under way".
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "4"), aw("b", "20")])
    h.drain()
    sync = h.dispatcher.owners.decisions.sync
    decided = sync.decided_states()
    assert dict(decided) == {"ns/a": ("uid-a", "Running"), "ns/b": ("uid-b", "Pending")}
    sync.forget("ns/b")
    assert "ns/b" in decided and len(decided) == 2, "who had a decision is the copy's, taken when published"
    assert "ns/b" not in sync.decided_states()


def test_the_ledger_report_names_the_levels_and_each_nodes_domain_of_them(harness_factory: Any) -> None:
    block, rack = "topology.example.com/block", "topology.example.com/rack"
    nodes = [node("n0", "8"), node("n1", "8"), node("n2", "8")]
    nodes[0]["metadata"]["labels"] = {block: "b1", rack: "r1", "secret.example.com/owner": "team-x"}
    nodes[1]["metadata"]["labels"] = {rack: "r2"}
    h = harness_factory(nodes=nodes, pods=[], aws=[], topology_levels=(block, rack))
    h.drain()
    doc = reports(h).ledger()
    assert doc["topologyLevels"] == [block, rack], "largest first, as configured"
    # Only the configured levels' labels: the ledger shows a reader no other label of the nodes.
    assert {n["name"]: n["topology"] for n in doc["nodes"]} == {
        "n0": {block: "b1", rack: "r1"}, "n1": {rack: "r2"}, "n2": {}}

    plain = harness_factory(nodes=nodes, pods=[], aws=[])
    plain.drain()
    doc = reports(plain).ledger()
    assert doc["topologyLevels"] == [] and all(n["topology"] == {} for n in doc["nodes"])


def test_dispatches_that_ask_for_a_topology_level_are_counted_by_level_and_ask(harness_factory: Any) -> None:
    block, rack = "topology.example.com/block", "topology.example.com/rack"
    n0 = node("n0", "16")
    n0["metadata"]["labels"] = {block: "b1", rack: "r1"}
    required = aw("required", "1")
    required["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-required": rack}
    # A level the controller is not configured with comes from a tenant: it counts as "other", never as itself.
    unconfigured = aw("unconfigured", "1")
    unconfigured["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-preferred": "tenant.example.com/zone"}
    # A pod set's own ask (Kueue's annotation on its template) counts as the AppWrapper's do.
    pod_set = aw("pod-set", "0")
    pod_set["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-preferred": rack}
    pod_set["spec"]["resources"]["GenericItems"] = [{"generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pod-set-job"},
        "spec": {"parallelism": 2, "completions": 2, "template": {
            "metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": block}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}}}}]
    h = harness_factory(nodes=[n0], pods=[], aws=[required, unconfigured, pod_set, aw("plain", "1")],
                        topology_levels=(block, rack))
    h.drain()
    assert set(h.dispatcher.owners.active.views) == {"ns/required", "ns/unconfigured", "ns/pod-set", "ns/plain"}
    m = h.dispatcher.metrics
    counted = {(level, ask): m.value("mcad_topology_gangs_placed_total", {"level": level, "ask": ask})
               for level in (block, rack, "other") for ask in ("required", "preferred")}
    assert counted == {(block, "required"): 1, (block, "preferred"): 0, (rack, "required"): 1,
                       (rack, "preferred"): 1, ("other", "required"): 0, ("other", "preferred"): 1}
    assert m.value("mcad_topology_gangs_placed_total", {"level": "tenant.example.com/zone", "ask": "preferred"}) is None


def test_topology_levels_not_configured_share_one_label_value_per_dispatch() -> None:
    m = Metrics()
    m.name_topology_levels(["example.com/rack"])
    m.topology_placed([("a.example.com/x", "preferred"), ("b.example.com/y", "preferred"),
                       ("example.com/rack", "required")])
    assert m.value("mcad_topology_gangs_placed_total", {"level": "other", "ask": "preferred"}) == 1
    assert m.value("mcad_topology_gangs_placed_total", {"level": "example.com/rack", "ask": "required"}) == 1
    assert m.value("mcad_topology_gangs_placed_total", {"level": "example.com/rack", "ask": "preferred"}) == 0
    text = m.render().decode()
    assert "a.example.com" not in text and "b.example.com" not in text
