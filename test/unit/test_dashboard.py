"""The dashboard's views and page (mcad.serve.dashboard) over a Source whose documents and rights the tests set."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from mcad.admission.request import UserInfo
from mcad.k8s.recentevents import RecentEvents
from mcad.serve.dashboard import CONTENT_SECURITY_POLICY, MAX_PAGE, Dashboard, Refusal, Source
from mcad.serve.queuereport import Entry, QueueReport
from mcad.serve.snapshots import Part, Snapshot

HEADER = {"controller": {"version": "test"}, "generatedAt": "2026-11-25T00:00:00Z"}
ALICE = UserInfo(username="alice", uid="", groups=(), extra={})


def queued(position: int, namespace: str = "team-a", state: str = "Queued") -> dict[str, Any]:
    return {"position": position, "namespace": namespace, "name": f"aw-{position}", "priority": 0,
            "created": None, "ageSeconds": 1.0, "state": state, "demand": {"cpu": "1"}, "pods": 1,
            "fitsNow": False, "why": "insufficient cpu", "requeuings": 0}


def dispatched(name: str, namespace: str = "team-a") -> dict[str, Any]:
    return {"namespace": namespace, "name": name, "priority": 0, "state": "Running", "demand": {"cpu": "2"},
            "dispatchedAt": "2026-11-25T00:00:00Z", "pods": {"pending": 0, "running": 2, "succeeded": 0, "failed": 0}}


class FakeSource(Source):
    def __init__(self, documents: dict[Part, Any]) -> None:
        self.documents = documents
        self.visible: frozenset[str] | None = None
        self.listable: set[str] | None = None  # None: every namespace
        self.rights: set[str] | None = None  # non-resource paths held; None: all
        self.refusal: Refusal | None = None

    def snapshot(self, parts: set[Part], user: UserInfo | None, *, fresh_within: float | None,
                 require: tuple[str, ...] = ()) -> Snapshot:
        if self.refusal is not None:
            raise self.refusal
        for path in require:
            if self.rights is not None and path not in self.rights:
                raise Refusal(403, {"error": f"alice may not get {path}"})
        return Snapshot(0.0, {part: self.documents.get(part) for part in parts}, frozenset({"team-a", "team-b"}))

    def visible_namespaces(self, user: UserInfo | None, shown: set[str],
                           known: frozenset[str]) -> frozenset[str] | None:
        return self.visible

    def may_list(self, user: UserInfo | None, namespace: str) -> bool:
        return self.listable is None or namespace in self.listable


def view(dashboard: Dashboard, view_name: str, **query: str) -> tuple[int, dict[str, Any]]:
    answer = dashboard.view(view_name, query, ALICE)
    assert answer.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.headers["Server-Timing"].startswith("app;dur=")
    return answer.status, json.loads(answer.body)


@pytest.fixture
def queue_source() -> FakeSource:
    rows = [queued(i, "team-a" if i % 3 else "team-b") for i in range(1, 121)]
    rows[4]["state"] = "Held"
    return FakeSource({"queue": {**HEADER, "queued": rows, "dispatched": [dispatched("big"), dispatched("b", "team-b")],
                                 "reservations": [{"appwrapper": "team-a/aw-1", "nodes": ["n1"]},
                                                  {"appwrapper": "team-b/aw-3", "nodes": ["n2"]}]}})


def test_the_page_and_its_files_carry_the_policy_and_a_relative_redirect() -> None:
    dashboard = Dashboard(FakeSource({}))
    redirect = dashboard.page("/ui")
    assert redirect is not None and redirect.status == 302 and redirect.headers["Location"] == "ui/"
    index = dashboard.page("/ui/")
    assert index is not None and index.status == 200 and index.content_type.startswith("text/html")
    assert index.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert index.headers["X-Content-Type-Options"] == "nosniff"
    html = index.body.decode()
    # Only its own files: nothing from another origin, no inline script or style for the policy to refuse.
    assert "http://" not in html and "https://" not in html and "<script>" not in html and "style=" not in html
    script = dashboard.page("/ui/app.js")
    assert script is not None and script.content_type.startswith("text/javascript")
    assert b"innerHTML" not in script.body and b"eval(" not in script.body  # values are inserted as text only
    assert dashboard.page("/ui/__init__.py") is None and dashboard.page("/ui/../server.py") is None


def test_the_queue_is_served_a_page_at_a_time_in_dispatch_order(queue_source: FakeSource) -> None:
    status, doc = view(Dashboard(queue_source), "queue", offset="50", limit="50")
    assert status == 200
    assert doc["total"] == 122 and doc["offset"] == 50 and doc["limit"] == 50
    assert [row["position"] for row in doc["rows"]] == list(range(51, 101))
    assert doc["counts"] == {"Held": 1, "Queued": 119, "Running": 2}
    assert doc["namespaces"] == ["team-a", "team-b"]
    status, last = view(Dashboard(queue_source), "queue", offset="100")
    assert [row["position"] for row in last["rows"]][:20] == list(range(101, 121))
    assert [row["position"] for row in last["rows"]][20:] == [None, None] and last["rows"][-1]["pods"] == 2
    assert last["rows"][-1]["podPhases"] == {"pending": 0, "running": 2, "succeeded": 0, "failed": 0}


def test_the_queue_view_formats_only_the_rows_of_its_page(queue_source: FakeSource) -> None:
    formatted: list[str] = []

    class Counting(QueueReport):
        def row(self, entry: Entry) -> dict[str, Any]:
            formatted.append(entry.facts["name"])
            return super().row(entry)

    report = Counting.of(queue_source.documents["queue"])
    _, doc = view(Dashboard(FakeSource({"queue": report})), "queue", offset="10", limit="5")
    assert doc["total"] == 122 and doc["counts"] == {"Held": 1, "Queued": 119, "Running": 2}
    assert formatted == ["aw-11", "aw-12", "aw-13", "aw-14", "aw-15"], "the rest were only counted"


def test_the_queue_filters_by_namespace_and_state_and_bounds_the_page(queue_source: FakeSource) -> None:
    dashboard = Dashboard(queue_source)
    _, doc = view(dashboard, "queue", namespace="team-b")
    assert {row["namespace"] for row in doc["rows"]} == {"team-b"} and doc["total"] == 41
    assert doc["counts"] == {"Queued": 40, "Running": 1}
    _, doc = view(dashboard, "queue", state="Held")
    assert [row["name"] for row in doc["rows"]] == ["aw-5"]
    _, doc = view(dashboard, "queue", limit="100000")
    assert doc["limit"] == MAX_PAGE and len(doc["rows"]) == 122
    for junk in ("-1", "²", "1" * 10):  # "²" passes str.isdigit and fails int()
        status, doc = view(dashboard, "queue", offset=junk)
        assert status == 400 and "offset must be a whole number" in doc["error"], junk


def test_a_tenant_sees_only_the_namespaces_it_may_list(queue_source: FakeSource) -> None:
    queue_source.visible = frozenset({"team-b"})
    _, doc = view(Dashboard(queue_source), "queue")
    assert {row["namespace"] for row in doc["rows"]} == {"team-b"}
    assert doc["namespaces"] == ["team-b"] and doc["total"] == 41
    assert doc["reservations"] == [{"appwrapper": "team-b/aw-3", "nodes": ["n2"]}]
    # Another namespace asked for by name shows nothing, not its AppWrappers.
    _, doc = view(Dashboard(queue_source), "queue", namespace="team-a")
    assert doc["rows"] == [] and doc["total"] == 0


def test_explain_adds_labels_annotations_and_the_recent_events_of_that_uid() -> None:
    part = ("explain", "team-a", "x")
    source = FakeSource({part: {"namespace": "team-a", "name": "x", "found": True, "state": "Queued",
                                "summary": "It is queued.", "details": [], "uid": "u2",
                                "labels": {"app": "x"}, "annotations": {"note": "<img src=x onerror=alert(1)>"}}})
    events = RecentEvents()
    at = datetime(2026, 11, 25, tzinfo=UTC)
    events.add("team-a", "x", "u1", "Normal", "Old", "the namesake's", at)
    events.add("team-a", "x", "u2", "Warning", "Backoff", "insufficient cpu", at)
    events.add("team-a", "x", "u2", "Warning", "Backoff", "insufficient cpu", at)
    status, doc = view(Dashboard(source, events=events), "explain", namespace="team-a", name="x")
    assert status == 200 and doc["annotations"] == {"note": "<img src=x onerror=alert(1)>"}
    assert doc["events"] == [{"type": "Warning", "reason": "Backoff", "message": "insufficient cpu", "count": 2,
                              "lastSeen": "2026-11-25T00:00:00Z"}]
    # One the caller may not list is answered exactly as one that does not exist.
    source.listable = {"team-b"}
    refused = view(Dashboard(source, events=events), "explain", namespace="team-a", name="x")
    source.listable = None
    missing = view(Dashboard(source, events=events), "explain", namespace="team-a", name="nope")
    assert refused == (404, {"error": "AppWrapper team-a/x not found"})
    assert missing == (404, {"error": "AppWrapper team-a/nope not found"})


def ledger_node(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "cluster": "", "schedulable": True, "ready": True,
            "allocatable": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "4", "pods": "110"},
            "used": {"cpu": "2", "memory": "4Gi"}, "planned": {"cpu": "2", "nvidia.com/gpu": "1"},
            "free": {"cpu": "4", "memory": "12Gi", "nvidia.com/gpu": "3"}, **extra}


def test_nodes_give_the_heat_map_its_fractions_and_flags() -> None:
    source = FakeSource({"ledger": {**HEADER, "nodes": [ledger_node("n1", pinned=3),
                                                         ledger_node("n2", schedulable=False)]},
                         "clusters": {**HEADER, "mode": "single", "clusters": []}})
    status, doc = view(Dashboard(source), "nodes")
    assert status == 200 and doc["mode"] == "single" and doc["resources"] == ["cpu", "memory", "nvidia.com/gpu"]
    n1, n2 = doc["groups"][0]["nodes"]
    assert n1["cells"]["cpu"] == {"allocatable": "8", "used": "2", "reserved": "2", "free": "4",
                                  "usedFraction": 0.25, "reservedFraction": 0.25}
    assert n1["cells"]["memory"]["usedFraction"] == 0.25 and n1["cells"]["nvidia.com/gpu"]["reservedFraction"] == 0.25
    assert "pods" not in n1["cells"] and n2["schedulable"] is False
    assert (n1["pinned"], n2["pinned"]) == (3, 0), "pods pinned there and not bound yet"
    source.rights = {"/debug/quota"}
    assert view(Dashboard(source), "nodes") == (403, {"error": "alice may not get /debug/ledger"})


def test_nodes_are_grouped_by_worker_cluster_in_hub_mode() -> None:
    nodes = [ledger_node("east-1", cluster="east"), ledger_node("west-1", cluster="west")]
    workers = [{"name": "east", "state": "Healthy", "usable": True, "message": ""},
               {"name": "west", "state": "Unreachable", "usable": False, "message": "no answer for 40s"}]
    source = FakeSource({"ledger": {**HEADER, "nodes": nodes}, "clusters": {**HEADER, "mode": "hub",
                                                                             "clusters": workers}})
    _, doc = view(Dashboard(source), "nodes")
    assert [(g["cluster"], g["state"], [n["name"] for n in g["nodes"]]) for g in doc["groups"]] == [
        ("east", "Healthy", ["east-1"]), ("west", "Unreachable", ["west-1"])]


BLOCK, RACK = "topology.example.com/block", "topology.example.com/rack"
TOPOLOGY_NODES = [ledger_node("a0", topology={BLOCK: "b2", RACK: "r1"}), ledger_node("a1", topology={BLOCK: "b1"}),
                  ledger_node("a2", topology={BLOCK: "b1", RACK: "r2"}), ledger_node("a3", topology={RACK: "r9"}),
                  ledger_node("a4", topology={BLOCK: "b1", RACK: "r1"}), ledger_node("a5", topology={})]


def test_with_topology_levels_nodes_are_grouped_by_the_largest_level_then_the_next() -> None:
    source = FakeSource({"ledger": {**HEADER, "nodes": TOPOLOGY_NODES, "topologyLevels": [BLOCK, RACK]},
                         "clusters": {**HEADER, "mode": "single", "clusters": []}})
    status, doc = view(Dashboard(source), "nodes")
    assert status == 200 and doc["levels"] == [BLOCK, RACK]
    group = doc["groups"][0]
    assert [n["name"] for n in group["nodes"]] == ["a0", "a1", "a2", "a3", "a4", "a5"], "every node, as before"
    assert group["nodes"][0]["topology"] == {BLOCK: "b2", RACK: "r1"}
    # Domains by value, the nodes in no domain of a level last in their own group (value None), at every level.
    assert group["domains"] == [
        {"level": BLOCK, "value": "b1", "domains": [
            {"level": RACK, "value": "r1", "nodes": ["a4"]}, {"level": RACK, "value": "r2", "nodes": ["a2"]},
            {"level": RACK, "value": None, "nodes": ["a1"]}]},
        {"level": BLOCK, "value": "b2", "domains": [{"level": RACK, "value": "r1", "nodes": ["a0"]}]},
        {"level": BLOCK, "value": None, "domains": [
            {"level": RACK, "value": "r9", "nodes": ["a3"]}, {"level": RACK, "value": None, "nodes": ["a5"]}]}]


def test_topology_domains_are_per_worker_cluster_and_absent_without_levels() -> None:
    nodes = [ledger_node("east-1", cluster="east", topology={RACK: "r1"}),
             ledger_node("west-1", cluster="west", topology={RACK: "r1"})]
    workers = [{"name": "east", "state": "Healthy", "usable": True, "message": ""},
               {"name": "west", "state": "Healthy", "usable": True, "message": ""}]
    source = FakeSource({"ledger": {**HEADER, "nodes": nodes, "topologyLevels": [RACK]},
                         "clusters": {**HEADER, "mode": "hub", "clusters": workers}})
    _, doc = view(Dashboard(source), "nodes")
    assert [(g["cluster"], g["domains"]) for g in doc["groups"]] == [
        ("east", [{"level": RACK, "value": "r1", "nodes": ["east-1"]}]),
        ("west", [{"level": RACK, "value": "r1", "nodes": ["west-1"]}])]
    # A controller without --topology-level, or from before it: the heat map as it was.
    for ledger in ({**HEADER, "nodes": TOPOLOGY_NODES, "topologyLevels": []}, {**HEADER, "nodes": TOPOLOGY_NODES}):
        source.documents["ledger"] = ledger
        source.documents["clusters"] = {**HEADER, "mode": "single", "clusters": []}
        _, doc = view(Dashboard(source), "nodes")
        assert doc["levels"] == [] and "domains" not in doc["groups"][0]


def test_quota_bars_and_the_summary_need_their_rights() -> None:
    tree = {"name": "t", "resources": ["cpu"], "errors": [], "nodes": [
        {"name": "root", "parent": None, "hardLimit": False, "disabled": False, "depth": 0, "limit": {"cpu": "10"},
         "used": {"cpu": "5"}, "borrowed": {}, "appwrappers": [], "definedBy": "x"},
        {"name": "team", "parent": "root", "hardLimit": False, "disabled": False, "depth": 1, "limit": {"cpu": "2"},
         "used": {"cpu": "3"}, "borrowed": {"cpu": "1"}, "appwrappers": [{"name": "a"}], "definedBy": "y"}]}
    summary = {"states": {"queued": 1}}
    source = FakeSource({"quota": {**HEADER, "enabled": True, "trees": [tree]}})
    dashboard = Dashboard(source, summary=lambda: summary)
    _, doc = view(dashboard, "quota")
    root, team = doc["trees"][0]["nodes"]
    assert root["bars"]["cpu"]["usedFraction"] == 0.5 and team["appwrappers"] == 1
    assert team["bars"]["cpu"] == {"limit": "2", "used": "3", "borrowed": "1", "usedFraction": 1.5,
                                   "borrowedFraction": 0.5}
    assert view(dashboard, "summary") == (200, summary)
    source.rights = set()
    assert view(dashboard, "summary") == (403, {"error": "alice may not get /metrics"})
    assert view(dashboard, "quota") == (403, {"error": "alice may not get /debug/quota"})


def test_a_standby_names_the_leader_and_the_port_to_reach_it_on() -> None:
    source = FakeSource({})
    source.refusal = Refusal(503, {"error": "not the leader", "leader": "mcad-0_abc"})
    dashboard = Dashboard(source)
    dashboard.port = 8080
    assert view(dashboard, "queue") == (503, {"error": "not the leader", "leader": "mcad-0_abc", "port": 8080})
    assert view(dashboard, "nope")[0] == 404


def test_recent_events_are_bounded() -> None:
    events = RecentEvents(per_object=3, max_objects=2)
    at = datetime(2026, 11, 25, tzinfo=UTC)
    for i in range(5):
        events.add("ns", "a", "u", "Normal", f"R{i}", "m", at)
    assert [e["reason"] for e in events.of("ns", "a", "u")] == ["R4", "R3", "R2"]
    events.add("ns", "b", "u", "Normal", "R", "m", at)
    events.add("ns", "c", "u", "Normal", "R", "m", at)
    assert len(events) == 2 and events.of("ns", "a", "u") == []


def test_recent_events_are_bounded_in_all() -> None:
    events = RecentEvents(per_object=3, max_objects=100, max_entries=5)
    at = datetime(2026, 11, 25, tzinfo=UTC)
    for name in ("a", "b"):
        for i in range(3):
            events.add("ns", name, "u", "Normal", f"R{i}", "m", at)
    # Six entries over five: the least recently updated AppWrapper goes whole.
    assert len(events) == 1 and events.of("ns", "a", "u") == []
    events.add("ns", "b", "other-uid", "Normal", "R", "m", at)  # a re-created namesake starts afresh
    events.add("ns", "c", "u", "Normal", "R", "m", at)
    assert len(events.of("ns", "b", "other-uid")) == 1 and len(events.of("ns", "c", "u")) == 1


def test_annotations_kept_for_display_are_bounded() -> None:
    from mcad.api.appwrapper import SHOWN_ANNOTATION_CHARS, SHOWN_ANNOTATIONS, shown_annotations
    many: Mapping[str, Any] = {f"k{i:02}": "v" * 1000 for i in range(40)}
    kept = shown_annotations({**many, "kubectl.kubernetes.io/last-applied-configuration": "{}", "n": 5})
    assert len(kept) == SHOWN_ANNOTATIONS and "kubectl.kubernetes.io/last-applied-configuration" not in kept
    assert all(len(v) == SHOWN_ANNOTATION_CHARS for v in kept.values())


def test_the_queue_view_lists_those_resetting_between_queued_and_dispatched_with_their_health() -> None:
    pausing = {"namespace": "team-a", "name": "flaky", "priority": 0, "state": "Resetting", "demand": {"cpu": "4"},
               "reason": "FailedPods", "resettingCount": 1, "retryLimit": 3, "pauseEndsAt": "2026-11-25T00:01:30Z",
               "message": "Resetting (reset 1 of 3): ..."}
    sick = {**dispatched("sick"), "health": "Unhealthy", "healthReason": "MissingComponent"}
    source = FakeSource({"queue": {**HEADER, "queued": [queued(1)], "resetting": [pausing, {**pausing,
                                                                                         "namespace": "team-b"}],
                                   "dispatched": [sick, dispatched("fine")], "reservations": []}})
    source.visible = frozenset({"team-a"})
    status, doc = view(Dashboard(source), "queue")
    assert status == 200
    assert [(row["name"], row["state"]) for row in doc["rows"]] == [
        ("aw-1", "Queued"), ("flaky", "Resetting"), ("sick", "Running"), ("fine", "Running")]
    assert doc["counts"] == {"Queued": 1, "Resetting": 1, "Running": 2}, "team-b's resetting one is not counted"
    resetting = doc["rows"][1]
    assert (resetting["resetReason"], resetting["resettingCount"], resetting["retryLimit"],
            resetting["pauseEndsAt"]) == ("FailedPods", 1, 3, "2026-11-25T00:01:30Z")
    assert (doc["rows"][2]["health"], doc["rows"][2]["healthReason"]) == ("Unhealthy", "MissingComponent")
    assert doc["rows"][3]["health"] is None  # a document from a controller without health: no mark
    _, only = view(Dashboard(source), "queue", state="Resetting")
    assert [row["name"] for row in only["rows"]] == ["flaky"]
