"""The queue report read from a stepped dispatcher (mcad.serve.queuereport): counts and pages agree with the whole
document, and a page reads and formats only its own rows, whatever the queue's length."""

from __future__ import annotations

import json
from itertools import islice
from typing import Any

from mcad.admission.request import UserInfo
from mcad.k8s.informer import Informer
from mcad.model.quota import subtree_view
from mcad.serve.dashboard import Dashboard, Source
from mcad.serve.debug import Reports
from mcad.serve.queuereport import QUEUE_LISTS, QueueReport
from mcad.serve.snapshots import Part, Snapshot
from test.component.harness import Harness, gang_aw, node
from test.component.test_quota_dispatch import labelled, subtree
from test.fakes import FakeListerWatcher


def in_namespace(raw: dict[str, Any], namespace: str) -> dict[str, Any]:
    raw["metadata"]["namespace"] = namespace
    return raw


def queue_of(harness_factory: Any) -> Any:
    # 4 cpu: "run" dispatches; 300 that never fit queue in two namespaces; "mid" (2 cpu) waits behind nobody.
    aws = [in_namespace(gang_aw("run", 1, {"cpu": "3"}), "team-a")]
    aws += [in_namespace(gang_aw(f"big-{i:03d}", 1, {"cpu": "20"}), "team-a" if i % 3 else "team-b")
            for i in range(300)]
    aws.append(in_namespace(gang_aw("mid", 1, {"cpu": "2"}), "team-b"))
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=aws, fit="nodes", reservations=0)
    h.drain()
    return h


def test_counts_and_pages_agree_with_the_whole_document(harness_factory: Any) -> None:
    h = queue_of(harness_factory)
    report = Reports(h.dispatcher.view, lambda: {}).queue_deferred()
    document = report.document()
    everyone = [row for listed in QUEUE_LISTS for row in document[listed]]
    for visible in (None, frozenset({"team-b"}), frozenset({"team-a", "nobody"})):
        for namespace in ("", "team-a"):
            rows = [row for row in everyone if (visible is None or row["namespace"] in visible)
                    and (not namespace or row["namespace"] == namespace)]
            namespaces, counts = report.counts(visible, namespace)
            assert namespaces == {row["namespace"] for row in everyone
                                  if visible is None or row["namespace"] in visible}
            expected: dict[str, int] = {}
            for row in rows:
                expected[row["state"]] = expected.get(row["state"], 0) + 1
            assert counts == expected
            assert [report.row(entry) for entry in report.select(visible, namespace)] == rows
            running = [report.row(entry) for entry in report.select(visible, namespace, "Running")]
            assert running == [row for row in rows if row["state"] == "Running"]
    assert [row["position"] for row in document["queued"]] == list(range(1, 302))
    assert document["dispatched"][0]["name"] == "run"


def test_a_page_reads_only_its_own_rows(harness_factory: Any) -> None:
    h = queue_of(harness_factory)
    report = Reports(h.dispatcher.view, lambda: {}).queue_deferred()
    read: list[str] = []
    store_get = report._get
    report._get = lambda key: (read.append(key), store_get(key))[1]
    namespaces, counts = report.counts(None)
    assert counts == {"Queued": 301, "Running": 1} and namespaces == {"team-a", "team-b"}
    assert read == [], "counting reads no AppWrapper"
    page = [report.row(entry) for entry in islice(report.select(frozenset({"team-b"}), skip=10), 5)]
    assert [row["namespace"] for row in page] == ["team-b"] * 5
    assert page == [report.row(entry) for entry in islice(report.select(frozenset({"team-b"})), 10, 15)]
    assert len(read) == 5 + 15, "the page's rows; the rows above it are skipped unread (then 15 read to compare)"
    past_the_queue = list(report.select(None, skip=301))
    assert [entry.listed_in for entry in past_the_queue] == ["dispatched"], "the skip goes on into the other lists"
    assert list(report.select(None, skip=302)) == []


def test_a_page_of_the_document_cuts_the_queued_list_only(harness_factory: Any) -> None:
    """page_in: limit queued rows from offset (positions of the whole queue), every dispatched one, the queued total
    of what the reader sees; the same from a formatted document (an offline report) as from the dispatcher's."""
    h = queue_of(harness_factory)
    report = Reports(h.dispatcher.view, lambda: {}).queue_deferred()
    whole = report.document()
    team_b = [row for row in whole["queued"] if row["namespace"] == "team-b"]
    read: list[str] = []
    store_get = report._get
    report._get = lambda key: (read.append(key), store_get(key))[1]
    page = report.page_in(None, 10, 5)
    assert [row["position"] for row in page["queued"]] == [11, 12, 13, 14, 15]
    assert page["page"] == {"offset": 10, "limit": 5, "queuedTotal": 301}
    assert page["dispatched"] == whole["dispatched"] and page["reservations"] == whole["reservations"]
    assert len(read) == 5, "the page's rows only: the ten above it are skipped unread"
    assert report.page_in(None, 295, 10)["queued"] == whole["queued"][295:]
    page = report.page_in(frozenset({"team-b"}), 5, 3)
    assert page["queued"] == team_b[5:8] and page["page"]["queuedTotal"] == len(team_b)
    assert page["dispatched"] == [], "team-a's"
    assert {key: value for key, value in page.items() if key not in (*QUEUE_LISTS, "page", "aheadOfYou")} == {
        key: value for key, value in whole.items() if key not in QUEUE_LISTS}
    formatted = QueueReport.of(whole)
    assert formatted.page_in(frozenset({"team-b"}), 5, 3) == {
        key: value for key, value in page.items() if key != "aheadOfYou"}, "a formatted document cannot tell it"
    assert formatted.page_in(None, 0, 1000)["queued"] == whole["queued"]


def test_a_reader_of_one_namespace_is_told_what_is_ahead_as_counts(harness_factory: Any) -> None:
    """aheadOfYou: team-b's first queued AppWrapper, its place in the whole queue and how many are ahead, counted
    but never named (team-a is another tenant's); a cluster-wide reader who asked for team-b sees team-a named, and
    one reading everything is told no aheadOfYou at all. Fair sharing is off here, and the document says so."""
    h = queue_of(harness_factory)
    report = Reports(h.dispatcher.view, lambda: {}).queue_deferred()
    whole = report.document()
    first_b = next(row for row in whole["queued"] if row["namespace"] == "team-b")
    ahead = first_b["position"] - 1
    assert ahead > 0 and all(row["namespace"] == "team-a" for row in whole["queued"][:ahead])
    for told in (report.page_in(frozenset({"team-b"}), 0, 5), report.document_in(frozenset({"team-b"}))):
        assert told["aheadOfYou"] == [{"namespace": "team-b", "name": first_b["name"],
                                       "position": first_b["position"], "ahead": ahead, "named": {},
                                       "others": {"appwrappers": ahead, "namespaces": 1, "counts": [ahead]}}]
        assert told["fairShare"] == {"enabled": False}
        assert "team-a" not in json.dumps(told), "another namespace's name, or its AppWrappers' names"
    named = report.page_in(frozenset({"team-b"}), 0, 5, all_named=True)["aheadOfYou"][0]
    assert named["named"] == {"team-a": ahead} and named["others"]["appwrappers"] == 0
    assert "aheadOfYou" not in report.page_in(None, 0, 5) and "aheadOfYou" not in whole
    assert whole["fairShare"] == report.page_in(None, 0, 5)["fairShare"] == {"enabled": False}
    assert report.page_in(frozenset({"nobody"}), 0, 5)["aheadOfYou"] == []


def test_fair_share_usage_of_the_readers_tenant_against_the_others(harness_factory: Any) -> None:
    """With fair sharing: a reader of team-b is told its tenant's usage, share of the total and rank by name and
    the others' as a distribution; a cluster-wide reader every tenant by name."""
    aws = [in_namespace(gang_aw(f"a{i}", 1, {"cpu": "1"}), "team-a") for i in range(3)]
    aws.append(in_namespace(gang_aw("b0", 1, {"cpu": "1"}), "team-b"))
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=aws, fit="aggregate", fair_sharing=True)
    h.drain()
    h.lw["aw"].add(in_namespace(gang_aw("waits", 1, {"cpu": "1"}), "team-b"))
    h.clock.advance(600)
    h.drain()
    report = Reports(h.dispatcher.view, lambda: {}).queue_deferred()
    fair = report.page_in(frozenset({"team-b"}), 0, 5)["fairShare"]
    assert fair["enabled"] and fair["tenants"] == 2 and fair["halfLifeSeconds"] > 0
    assert [(t["tenant"], t["fraction"], t["rank"]) for t in fair["named"]] == [("namespace:team-b", 0.25, 1)]
    assert fair["others"] == {"tenants": 1, "leastFraction": 0.75, "medianFraction": 0.75, "mostFraction": 0.75}
    assert "team-a" not in json.dumps(report.page_in(frozenset({"team-b"}), 0, 5))
    everyone = report.document()["fairShare"]
    assert [(t["tenant"], t["rank"]) for t in everyone["named"]] == [("namespace:team-b", 1), ("namespace:team-a", 2)]
    assert everyone["others"]["tenants"] == 0


class OneReport(Source):
    """The dashboard's source over one report, for a reader who may list ``visible`` (None: everything)."""

    def __init__(self, report: QueueReport, visible: frozenset[str] | None) -> None:
        self.report, self.visible = report, visible

    def snapshot(self, parts: set[Part], user: UserInfo | None, *, fresh_within: float | None,
                 require: tuple[str, ...] = ()) -> Snapshot:
        return Snapshot(0.0, {"queue": self.report}, frozenset(self.report.namespaces()))

    def visible_namespaces(self, user: UserInfo | None, shown: set[str],
                           known: frozenset[str]) -> frozenset[str] | None:
        return self.visible

    def may_list(self, user: UserInfo | None, namespace: str) -> bool:
        return self.visible is None or namespace in self.visible


def test_the_dashboard_queue_view_shows_standing_and_the_estimated_start(harness_factory: Any) -> None:
    h = queue_of(harness_factory)
    report = Reports(h.dispatcher.view, lambda: {}).queue_deferred()
    whole = report.document()

    def queue_view(visible: frozenset[str] | None, **query: str) -> dict[str, Any]:
        answer = Dashboard(OneReport(report, visible)).view("queue", query, None)
        assert answer.status == 200
        return json.loads(answer.body)

    tenant = queue_view(frozenset({"team-b"}))
    assert tenant["aheadOfYou"] == report.page_in(frozenset({"team-b"}), 0, 1)["aheadOfYou"]
    assert tenant["aheadOfYou"][0]["named"] == {} and tenant["fairShare"] == {"enabled": False}
    assert "team-a" not in json.dumps(tenant)
    queued = [row for row in tenant["rows"] if row["position"] is not None]
    by_position = {row["position"]: row for row in whole["queued"]}
    assert queued and all(row["estimatedStart"] == by_position[row["position"]]["estimatedStart"]
                          and row["estimateWhy"] == by_position[row["position"]].get("estimateWhy", "")
                          for row in queued)
    everyone = queue_view(None)
    assert everyone["aheadOfYou"] is None and everyone["fairShare"] == {"enabled": False}
    one = queue_view(None, namespace="team-b")["aheadOfYou"][0]
    assert one["namespace"] == "team-b" and set(one["named"]) == {"team-a"}, "a cluster-wide reader sees names"


def test_one_judged_as_another_namespaces_alike_one_is_not_told_its_objects(harness_factory: Any) -> None:
    """A group of alike AppWrappers is judged once, by the one ahead; the reason names that one's wrapped objects,
    so a member in another namespace is told only that an AppWrapper in another namespace that asks for the same
    does not fit. One in the same namespace is told the reason itself, as before."""
    def aw(name: str, namespace: str, priority: int) -> dict[str, Any]:
        raw = in_namespace(gang_aw(name, 2, {"cpu": "500"}), namespace)
        raw["spec"]["priority"] = priority
        return raw

    aws = [aw("secret-job", "team-x", 5), aw("mine", "team-b", 0), aw("sibling", "team-x", 0)]
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=aws, fit="nodes", reservations=0)
    h.drain()
    report = Reports(h.dispatcher.view, lambda: {}).queue_deferred()
    mine = report.document_in(frozenset({"team-b"}))
    assert [row["why"] for row in mine["queued"]] == [
        "it cannot be dispatched now: an AppWrapper in another namespace ahead of it, which asks for the same, "
        "does not fit"]
    assert "secret" not in json.dumps(mine) and "team-x" not in json.dumps(mine)
    sibling = next(row for row in report.document_in(frozenset({"team-x"}))["queued"] if row["name"] == "sibling")
    assert "secret-job" in sibling["why"], "its own namespace's objects may be named"
    explained = Reports(h.dispatcher.view, lambda: {}).explain("team-b", "mine")
    assert explained is not None and "secret" not in json.dumps(explained)


def test_a_quota_tenant_is_named_only_to_readers_of_namespaces_dispatched_under_it() -> None:
    """Fair sharing with quota trees: a tenant is the quota node an AppWrapper is charged to. team-b's reader sees
    quota:t/gold, under which its AppWrapper ran (with team-a's usage in it), and silver only as a count; a reader
    of a namespace that ran nothing sees no tenant named."""
    tree = [subtree("root", "t", {"root": "4"}), subtree("kids", "t", {"gold": "2", "silver": "2"}, parent="root")]
    lw = FakeListerWatcher()
    for obj in tree:
        lw.add(obj)
    aws = [in_namespace(labelled(name, "1", t=node_name), namespace)
           for name, namespace, node_name in (("a", "team-a", "gold"), ("b", "team-b", "gold"),
                                              ("x", "team-x", "silver"))]
    h = Harness(nodes=[node("n0", "8")], pods=[], aws=aws, fit="aggregate", fair_sharing=True,
                quota_subtrees=Informer("quotasubtrees", lw, transform=subtree_view))
    try:
        h.drain()
        assert set(h.dispatcher.owners.active.views) == {"team-a/a", "team-b/b", "team-x/x"}
        h.clock.advance(600)
        report = Reports(h.dispatcher.view, lambda: {}).queue_deferred()
        fair = report.page_in(frozenset({"team-b"}), 0, 5)["fairShare"]
        assert [(t["tenant"], t["fraction"]) for t in fair["named"]] == [("quota:t/gold", 0.6667)]
        assert fair["others"]["tenants"] == 1 and fair["others"]["mostFraction"] == 0.3333
        assert "silver" not in json.dumps(fair) and "team-" not in json.dumps(fair)
        nobody = report.page_in(frozenset({"team-c"}), 0, 5)["fairShare"]
        assert nobody["named"] == [] and nobody["others"]["tenants"] == 2
    finally:
        h.stop()
