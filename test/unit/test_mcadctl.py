"""mcadctl without a cluster: how the /debug documents print, argument errors, and how the leader is named.

The CLI tests stand in for the controller by replacing ``reach.fetch`` (our own function, not the Kubernetes API);
test/integration/test_mcadctl.py runs the same commands against a real controller and API server.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from mcad.cli import mcadctl, reach, render, topologyroom
from mcad.errors import ApiError
from test.support import unreachable_kubeconfig

CONTROLLER = {"version": "0.4.0", "identity": "mcad-controller-5f7c9-x2x7q_1b2c", "leader": True, "fit": "nodes",
              "strictFifo": False, "preemption": False}
LONG_WHY = ("needs 4 pods of cpu=6 memory=1Gi; too little cpu free on every node: kwok-node-0 has cpu=2, "
            "kwok-node-1 has cpu=2")
QUEUE: dict[str, Any] = {
    "controller": CONTROLLER, "generatedAt": "2025-03-01T12:00:00Z",
    "queued": [
        {"position": 1, "namespace": "team-a", "name": "urgent", "priority": 10, "created": "2025-03-01T11:59:15Z",
         "ageSeconds": 45.2, "state": "Queued", "demand": {"cpu": "2", "memory": "1Gi"}, "pods": 2,
         "fitsNow": False, "why": "short of cpu 2 (needs 4, 2 free)", "requeuings": 0,
         "estimatedStart": "2025-03-01T12:30:00+00:00"},
        {"position": 2, "namespace": "team-b", "name": "big", "priority": 0, "created": "2025-03-01T09:00:00Z",
         "ageSeconds": 3 * 3600 + 5, "state": "Draining",
         "demand": {"nvidia.com/gpu": "4", "memory": "4Gi", "cpu": "24"}, "pods": 4, "fitsNow": False,
         "why": LONG_WHY, "requeuings": 2, "estimatedStart": None,
         "estimateWhy": "the room it needs is held by AppWrappers with no dispatchDuration.limit"},
        {"position": 3, "namespace": "team-a", "name": "small", "priority": 0, "created": "2025-02-27T12:00:00Z",
         "ageSeconds": 2 * 86400 + 60, "state": "Queued", "demand": {"cpu": "500m"}, "pods": 1, "fitsNow": True,
         "why": "", "requeuings": 0},
    ],
    "dispatched": [
        {"namespace": "team-a", "name": "train", "priority": 5, "state": "Running", "demand": {"cpu": "4"},
         "dispatchedAt": "2025-03-01T11:48:00Z", "pods": {"pending": 0, "running": 3, "succeeded": 1, "failed": 0},
         "health": "Unhealthy", "healthReason": "FailedPods"},
    ],
}
LEDGER: dict[str, Any] = {
    "controller": CONTROLLER, "generatedAt": "2025-03-01T12:00:00Z",
    # The controller sorts resource names; mcadctl prints cpu and memory first.
    "resources": [{"name": "cpu", "capacity": "16", "used": "4", "reserved": "2", "free": "10"},
                  {"name": "ephemeral-storage", "capacity": "200Gi", "used": "0", "reserved": "0", "free": "200Gi"},
                  {"name": "memory", "capacity": "32Gi", "used": "2Gi", "reserved": "1Gi", "free": "29Gi"}],
    "nodes": [{"name": "node-a", "schedulable": True, "ready": True,
               "allocatable": {"cpu": "8", "memory": "16Gi", "ephemeral-storage": "100Gi", "pods": "110"},
               "used": {"cpu": "4", "memory": "2Gi"}, "planned": {"cpu": "1"}, "free": {"cpu": "3", "memory": "14Gi"},
               "pinned": 2},
              {"name": "node-b", "schedulable": False, "ready": True,
               "allocatable": {"cpu": "8", "memory": "16Gi"}, "used": {}, "planned": {}, "free": {}}],
    "reservations": [{"namespace": "team-a", "name": "train", "reserved": {"memory": "1Gi", "cpu": "2"}},
                     {"namespace": "team-a", "name": "placed", "reserved": {}}],
}
QUOTA: dict[str, Any] = {
    "controller": CONTROLLER, "generatedAt": "2025-03-01T12:00:00Z", "enabled": True,
    "trees": [
        {"name": "quota_context", "resources": ["memory", "cpu"], "errors": [], "nodes": [
            {"name": "context-root", "parent": None, "hardLimit": False, "disabled": False,
             "limit": {"cpu": "2", "memory": "4Gi"}, "used": {"cpu": "1500m", "memory": "1Gi"},
             "borrowed": {"cpu": "0", "memory": "0"}, "appwrappers": [], "definedBy": "ops/context-root"},
            {"name": "gold", "parent": "context-root", "hardLimit": False, "disabled": False,
             "limit": {"cpu": "1", "memory": "2Gi"}, "used": {"cpu": "1500m", "memory": "1Gi"},
             "borrowed": {"cpu": "500m", "memory": "0"},
             "appwrappers": [{"namespace": "team-a", "name": "train", "demand": {"cpu": "1", "memory": "512Mi"}},
                             {"namespace": "team-a", "name": "tune-with-a-long-name",
                              "demand": {"cpu": "500m", "memory": "512Mi"}}],
             "definedBy": "ops/context-children"},
            {"name": "gold-east", "parent": "gold", "hardLimit": True, "disabled": False,
             "limit": {"cpu": "500m", "memory": "1Gi"}, "used": {"cpu": "0", "memory": "0"},
             "borrowed": {"cpu": "0", "memory": "0"}, "appwrappers": [], "definedBy": "ops/gold-children"},
            {"name": "bronze", "parent": "context-root", "hardLimit": True, "disabled": False,
             "limit": {"cpu": "500m", "memory": "1Gi"}, "used": {"cpu": "0", "memory": "0"},
             "borrowed": {"cpu": "0", "memory": "0"}, "appwrappers": [], "definedBy": "ops/context-children"},
            {"name": "scratch", "parent": "context-root", "hardLimit": False, "disabled": True,
             "limit": {"cpu": "0", "memory": "0"}, "used": {"cpu": "0", "memory": "0"},
             "borrowed": {"cpu": "0", "memory": "0"}, "appwrappers": [], "definedBy": "ops/context-children"},
        ]},
        {"name": "quota_service", "resources": ["cpu"],
         "errors": ["node orphan (ops/service-children) names parent nowhere, which is not a node of the tree"],
         "nodes": [
             {"name": "orphan", "parent": "nowhere", "hardLimit": False, "disabled": False, "limit": {"cpu": "1"},
              "used": {"cpu": "0"}, "borrowed": {"cpu": "0"}, "appwrappers": [], "definedBy": "ops/service-children"},
         ]},
    ],
}
EXPLAIN = {"namespace": "team-b", "name": "big", "found": True, "state": "Pending",
           "summary": "It is queued and cannot be dispatched yet: short of cpu 8 (needs 24, 16 free).",
           "details": ["position 2 of 3 in the queue", "demand: cpu=24 memory=4Gi nvidia.com/gpu=4"]}


# -- ages and small pieces -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (45.9, "45s"), (59.99, "59s"), (60, "1m"), (12 * 60 + 59, "12m"), (3600, "1h"),
    (3 * 3600 + 3599, "3h"), (86400, "1d"), (2 * 86400 + 5, "2d"), (364 * 86400, "364d"), (400 * 86400, "1y"),
    (-3, "0s"), (None, "-"),
])
def test_ages_print_like_kubectl(seconds: float | None, shown: str) -> None:
    assert render.age(seconds) == shown


def test_demand_prints_cpu_and_memory_first_without_spaces() -> None:
    assert render.quantities({"nvidia.com/gpu": "4", "memory": "4Gi", "cpu": "24"}) == \
        "cpu=24,memory=4Gi,nvidia.com/gpu=4"
    assert render.quantities({}) == "-"


def test_cut_keeps_short_text_and_marks_what_it_drops() -> None:
    assert render.cut("abc", 3) == "abc"
    assert render.cut("abcdefgh", 6) == "abc..."
    assert len(render.cut("x" * 100, 20)) == 20


# -- queue -----------------------------------------------------------------------------------------------------------


def test_queue_lists_reservations_and_the_policy_names_them() -> None:
    doc = {**QUEUE, "controller": {**CONTROLLER, "reservations": 2},
           "reservations": [{"appwrapper": "team-a/urgent", "nodes": ["n1", "n2"], "amount": "cpu=4",
                             "startsBy": "2025-03-01T12:05:00+00:00"},
                            {"appwrapper": "team-b/big", "nodes": [], "amount": "cpu=24", "startsBy": None}]}
    lines = render.queue_lines(doc)
    assert "fit=nodes, reservations 2, preemption off" in lines[0]
    at = lines.index("Reservations (room those behind may not take unless sure to end first):")
    assert lines[at + 1:at + 3] == [
        "  team-a/urgent: nodes n1, n2; room sure to be free by 2025-03-01T12:05:00+00:00",
        "  team-b/big: cpu=24; room sure to be free by unknown (what holds the room has no dispatchDuration.limit)"]


def test_queue_table_lists_queued_appwrappers_in_dispatch_order() -> None:
    lines = render.queue_lines(QUEUE)
    assert lines[0] == ("controller mcad-controller-5f7c9-x2x7q_1b2c 0.4.0 (leader; fit=nodes, best-effort FIFO, "
                        "preemption off): 3 queued, 1 dispatched")
    header, *rows = lines[2:]
    assert header.split() == ["POSITION", "NAMESPACE", "NAME", "PRIORITY", "AGE", "STATE", "DEMAND", "WHY"]
    assert [row.split()[:7] for row in rows] == [
        ["1", "team-a", "urgent", "10", "45s", "Queued", "cpu=2,memory=1Gi"],
        ["2", "team-b", "big", "0", "3h", "Draining", "cpu=24,memory=4Gi,nvidia.com/gpu=4"],
        ["3", "team-a", "small", "0", "2d", "Queued", "cpu=500m"],
    ]
    # No width to fit: the why is printed in full; an empty why prints as "-".
    assert rows[1].endswith(LONG_WHY)
    assert rows[2].endswith("-")
    # Columns line up: every row's WHY starts where the header's does.
    start = header.index("WHY")
    assert rows[0][start:] == "short of cpu 2 (needs 4, 2 free)"


def test_queue_why_is_cut_to_the_terminal_width() -> None:
    lines = render.queue_lines(QUEUE, width=140)
    table = lines[2:]
    assert all(len(line) <= 140 for line in table), [len(line) for line in table]
    big = next(line for line in table if " big " in line)
    assert big.endswith("...")
    assert LONG_WHY not in big
    # A narrow terminal still shows MIN_WHY characters of the why rather than nothing.
    narrow = next(line for line in render.queue_lines(QUEUE, width=40) if " big " in line)
    assert narrow.endswith(render.cut(LONG_WHY, render.MIN_WHY))


def test_wide_queue_adds_pods_requeuings_fits_now_and_never_cuts() -> None:
    header, *rows = render.queue_lines(QUEUE, wide=True, width=60)[2:]
    assert header.split() == ["POSITION", "NAMESPACE", "NAME", "PRIORITY", "AGE", "STATE", "PODS", "REQUEUINGS",
                              "FITS-NOW", "EXPECTED-START", "DEMAND", "WHY"]
    assert rows[0].split()[6:10] == ["2", "0", "no", "2025-03-01T12:30:00+00:00"]
    assert rows[1].split()[6:10] == ["4", "2", "no", "unknown"]
    assert rows[2].split()[6:10] == ["1", "0", "yes", "-"]
    assert rows[1].endswith(LONG_WHY)


def test_queue_dispatched_table_shows_pod_counts_and_time_since_dispatch() -> None:
    lines = render.queue_lines(QUEUE, width=200, dispatched=True)
    at = lines.index(next(line for line in lines if line.startswith("NAMESPACE")))
    assert lines[at].split() == ["NAMESPACE", "NAME", "PRIORITY", "STATE", "HEALTH", "DISPATCHED", "PODS", "DEMAND"]
    assert lines[at + 1].split() == ["team-a", "train", "5", "Running", "Unhealthy(FailedPods)", "12m", "0/3/1/0",
                                     "cpu=4"]


def test_empty_queue_says_so() -> None:
    lines = render.queue_lines({**QUEUE, "queued": [], "dispatched": []})
    assert lines[-1] == "No AppWrappers are queued."
    assert "0 queued, 0 dispatched" in lines[0]


def test_queue_tells_a_tenant_what_is_ahead_and_its_fair_share_without_naming_others() -> None:
    doc = {**QUEUE, "aheadOfYou": [{"namespace": "team-a", "name": "urgent", "position": 7, "ahead": 6,
                                    "named": {"team-c": 1},
                                    "others": {"appwrappers": 5, "namespaces": 2, "counts": [4, 1]}}],
           "fairShare": {"enabled": True, "halfLifeSeconds": 3600.0, "tenants": 4,
                         "named": [{"tenant": "namespace:team-a", "usage": 10.0, "fraction": 0.125, "rank": 2}],
                         "others": {"tenants": 3, "leastFraction": 0.0, "medianFraction": 0.25,
                                    "mostFraction": 0.625}}}
    lines = render.queue_lines(doc)
    assert lines[1] == "" and lines[2].split()[0] == "POSITION", "the table first, where scripts find it"
    start = lines.index("team-a/urgent is at position 7, 6 ahead of it: 1 in team-c; 5 in 2 other namespace(s) (4, 1)")
    assert lines[start - 1] == "" and lines[start + 1:start + 4] == [
        "Fair sharing: 4 tenant(s) with usage (decaying with a half-life of 1h; rank 1 used least and goes first "
        "among equal priorities)",
        "  namespace:team-a: 12.5% of all usage, rank 2 of 4",
        "  3 other tenant(s): least 0.0%, median 25.0%, most 62.5% of all usage"]
    off = render.queue_lines({**QUEUE, "aheadOfYou": [], "fairShare": {"enabled": False}})
    assert off[-2:] == ["None of your AppWrappers is queued.",
                        "Fair sharing is off (the controller's --fair-sharing): priority, then creation time."]
    assert not any("Fair sharing" in line for line in render.queue_lines(QUEUE)), "a controller that does not say"


def test_namespace_filter_keeps_global_positions() -> None:
    doc = render.only_namespace(QUEUE, "team-a")
    assert [(aw["position"], aw["name"]) for aw in doc["queued"]] == [(1, "urgent"), (3, "small")]
    assert [aw["name"] for aw in doc["dispatched"]] == ["train"]
    assert QUEUE["queued"][1]["name"] == "big"  # the input is left alone


def test_missing_fields_print_as_dashes_not_errors() -> None:
    sparse = {"queued": [{"name": "x"}]}
    row = render.queue_lines(sparse, wide=True)[-1].split()
    assert row == ["-", "-", "x", "-", "-", "-", "-", "-", "-", "-", "-", "-"]
    assert "controller ? (leader; fit=?" in render.queue_lines(sparse)[0]


# -- ledger ----------------------------------------------------------------------------------------------------------


def test_ledger_prints_resources_cpu_memory_first_then_reservations() -> None:
    lines = render.ledger_lines(LEDGER)
    start = lines.index(next(line for line in lines if line.startswith("RESOURCE")))
    assert [line.split() for line in lines[start:start + 4]] == [
        ["RESOURCE", "CAPACITY", "USED", "RESERVED", "FREE"],
        ["cpu", "16", "4", "2", "10"],
        ["memory", "32Gi", "2Gi", "1Gi", "29Gi"],
        ["ephemeral-storage", "200Gi", "0", "0", "200Gi"],
    ]
    assert lines[start + 5].split() == ["NAMESPACE", "NAME", "RESERVED"]
    assert lines[start + 6].split() == ["team-a", "train", "cpu=2,memory=1Gi"]
    assert len(lines) == start + 7  # "placed" has nothing outstanding: not listed
    assert not any(line.startswith("NODE") for line in lines)


def test_ledger_nodes_table_has_one_row_per_node_and_counted_resource() -> None:
    lines = render.ledger_lines(LEDGER, nodes=True)
    start = lines.index(next(line for line in lines if line.startswith("NODE")))
    rows = [line.split() for line in lines[start:]]
    assert rows[0] == ["NODE", "STATUS", "RESOURCE", "ALLOCATABLE", "USED", "PLANNED", "FREE", "PINNED"]
    assert rows[1] == ["node-a", "Ready", "cpu", "8", "4", "1", "3", "2"]
    assert rows[2] == ["node-a", "Ready", "memory", "16Gi", "2Gi", "0", "14Gi", "2"]
    assert rows[3] == ["node-a", "Ready", "ephemeral-storage", "100Gi", "0", "0", "0", "2"]
    assert rows[4][:2] == ["node-b", "Ready,SchedulingDisabled"]
    assert len(rows) == 1 + 2 * 3  # "pods" is allocatable but not counted by the ledger: not shown


def test_ledger_without_nodes_or_reservations_says_so() -> None:
    lines = render.ledger_lines({"resources": [], "nodes": [], "reservations": []}, nodes=True)
    assert "No capacity: no Ready, schedulable nodes." in lines
    assert lines[-1] == "No nodes."
    assert "No outstanding reservations: the pods of every dispatched AppWrapper are placed." in lines
    only_placed = render.ledger_lines({**LEDGER, "reservations": [{"namespace": "a", "name": "b", "reserved": {}}]})
    assert "No outstanding reservations: the pods of every dispatched AppWrapper are placed." in only_placed


# -- explain, json, yaml ---------------------------------------------------------------------------------------------


def test_explain_prints_the_summary_then_the_details() -> None:
    assert render.explain_lines(EXPLAIN) == [
        "team-b/big [Pending]: It is queued and cannot be dispatched yet: short of cpu 8 (needs 24, 16 free).",
        "  - position 2 of 3 in the queue",
        "  - demand: cpu=24 memory=4Gi nvidia.com/gpu=4",
    ]


@pytest.mark.parametrize("doc", [QUEUE, LEDGER, EXPLAIN, QUOTA], ids=["queue", "ledger", "explain", "quota"])
def test_json_and_yaml_print_the_document_unchanged(doc: dict[str, Any]) -> None:
    assert json.loads(render.dump(doc, "json")) == doc
    assert yaml.safe_load(render.dump(doc, "yaml")) == doc
    # Keys keep the controller's order (yaml would sort them by default).
    assert render.dump(doc, "yaml").splitlines()[0].split(":")[0] == next(iter(doc))


# -- quota -----------------------------------------------------------------------------------------------------------


def test_quota_prints_each_tree_with_nodes_indented_under_their_parents() -> None:
    lines = render.quota_lines(QUOTA)
    assert lines[0] == ("controller mcad-controller-5f7c9-x2x7q_1b2c 0.4.0 (leader; fit=nodes, best-effort FIFO, "
                        "preemption off): 2 quota tree(s)")
    start = lines.index("TREE quota_context (resources: cpu, memory)")
    header, *rows = lines[start + 1:start + 7]
    assert header.split() == ["NODE", "HARD", "LIMIT", "USED", "BORROWED", "APPWRAPPERS"]
    assert [row.split() for row in rows] == [
        ["context-root", "root", "cpu=2,memory=4Gi", "cpu=1500m,memory=1Gi", "-", "-"],
        ["gold", "no", "cpu=1,memory=2Gi", "cpu=1500m,memory=1Gi", "cpu=500m",
         "team-a/train,team-a/tune-with-a-long-name"],
        ["gold-east", "yes", "cpu=500m,memory=1Gi", "cpu=0,memory=0", "-", "-"],
        ["bronze", "yes", "cpu=500m,memory=1Gi", "cpu=0,memory=0", "-", "-"],
        ["scratch", "no", "disabled", "cpu=0,memory=0", "-", "-"],
    ]
    # Two spaces per level below the root, and the other columns still line up.
    assert [row[:len(row) - len(row.lstrip())] for row in rows] == ["", "  ", "    ", "  ", "  "]
    assert {row.index(" root ") if " root " in row else row.index(" no ") if " no " in row else row.index(" yes ")
            for row in rows} == {header.index("HARD") - 1}


def test_quota_shows_a_trees_errors_before_its_table() -> None:
    lines = render.quota_lines(QUOTA)
    start = lines.index("TREE quota_service (resources: cpu)")
    assert lines[start + 1] == ("  error: node orphan (ops/service-children) names parent nowhere, which is not a "
                                "node of the tree")
    assert lines[start + 2].split()[0] == "NODE"
    # A parent the document does not list: the node is printed as a root rather than lost.
    assert lines[start + 3].startswith("orphan ")


def test_quota_appwrappers_are_cut_to_the_terminal_unless_wide() -> None:
    narrow = render.quota_lines(QUOTA, width=110)
    gold = next(line for line in narrow if line.lstrip().startswith("gold "))
    assert len(gold) <= 110 and gold.endswith("...")
    wide = render.quota_lines(QUOTA, wide=True, width=90)
    header = next(line for line in wide if line.startswith("NODE"))
    assert header.split() == ["NODE", "HARD", "LIMIT", "USED", "BORROWED", "DEFINED-BY", "APPWRAPPERS"]
    gold = next(line for line in wide if line.lstrip().startswith("gold "))
    assert gold.split()[5:] == ["ops/context-children",
                                "team-a/train(cpu=1,memory=512Mi),team-a/tune-with-a-long-name(cpu=500m,memory=512Mi)"]


def test_no_quota_trees_says_so() -> None:
    lines = render.quota_lines({**QUOTA, "trees": []})
    assert lines[0].endswith(": 0 quota tree(s)")
    assert lines[-1] == "No quota trees: no QuotaSubtree objects with a `tree` label in the cluster."
    assert render.quota_lines({"trees": [{"name": "t"}]})[-2:] == ["TREE t (resources: none)", "No nodes."]


def test_quota_off_in_the_controller_says_so_and_why() -> None:
    lines = render.quota_lines({**QUOTA, "enabled": False, "trees": []})
    assert lines[0].endswith(": quota trees are off")
    assert "--no-quota" in lines[-1] and "QuotaSubtree CRD" in lines[-1]


def test_quota_missing_fields_print_as_dashes() -> None:
    lines = render.quota_lines({"trees": [{"name": "t", "nodes": [{"name": "n"}, {"appwrappers": [{}]}]}]})
    assert [line.split() for line in lines[-2:]] == [["n", "root", "-", "-", "-", "-"],
                                                     ["-", "root", "-", "-", "-", "-/-"]]
    hard_unknown = render.quota_lines({"trees": [{"name": "t", "nodes": [{"name": "r"},
                                                                          {"name": "c", "parent": "r"}]}]})
    assert hard_unknown[-1].split() == ["c", "-", "-", "-", "-", "-"]


# -- where the leader is ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("identity", "pod"), [
    ("mcad-controller-5f7c9-x2x7q_8d0e6c1a-51b4-4be4-9d71-0c7c2a0f1a7e", "mcad-controller-5f7c9-x2x7q"),
    ("mcad-controller-0_x", "mcad-controller-0"),
    ("just-a-pod", "just-a-pod"),
    ("", ""),
])
def test_leader_pod_is_the_holder_identity_before_the_first_underscore(identity: str, pod: str) -> None:
    assert reach.pod_of_holder(identity) == pod


def test_proxy_paths() -> None:
    assert reach.pod_proxy_path("mcad-system", "mcad-controller-0", 8080, "queue") == \
        "/api/v1/namespaces/mcad-system/pods/mcad-controller-0:8080/proxy/debug/queue"
    assert reach.service_proxy_path("mcad-system", "mcad-controller", "ledger") == \
        "/api/v1/namespaces/mcad-system/services/mcad-controller:http/proxy/debug/ledger"
    assert reach.lease_path("ns", "l") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"


# -- the commands ----------------------------------------------------------------------------------------------------


class Controller:
    """Stands in for ``reach.fetch``: answers from the sample documents and records what was asked."""

    def __init__(self, **answers: Any) -> None:
        self.answers = {"queue": QUEUE, "ledger": LEDGER, "explain": EXPLAIN, "quota": QUOTA, **answers}
        self.asked: list[tuple[reach.Where, str, list[tuple[str, str]]]] = []

    def __call__(self, where: reach.Where, endpoint: str, query: reach.Query = ()) -> dict[str, Any]:
        self.asked.append((where, endpoint, list(query)))
        answer = self.answers[endpoint]
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)


@pytest.fixture
def controller(monkeypatch: pytest.MonkeyPatch) -> Controller:
    fake = Controller()
    monkeypatch.setattr(reach, "fetch", fake)
    return fake


def mcadctl_(*args: str, columns: int | None = 200) -> Result:
    """mcadctl in a terminal of ``columns`` (None: stdout is not a terminal and $COLUMNS is unset)."""
    return CliRunner(env={"COLUMNS": None if columns is None else str(columns)}).invoke(mcadctl.main, list(args))


def test_queue_command_prints_the_table_and_passes_where_to_look(controller: Controller) -> None:
    result = mcadctl_("--controller-namespace", "ops", "--controller-name", "mcad", "--port", "9090",
                      "--timeout", "3", "queue")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2].split()[0] == "POSITION"
    assert "urgent" in result.stdout and "train" not in result.stdout
    where, endpoint, query = controller.asked[0]
    assert (endpoint, query) == ("queue", [("limit", str(mcadctl.DEFAULT_QUEUE_LIMIT))])
    assert (where.namespace, where.name, where.port, where.timeout, where.url) == ("ops", "mcad", 9090, 3.0, None)


def test_queue_command_cuts_why_to_columns_unless_wide(controller: Controller) -> None:
    narrow = mcadctl_("queue", columns=120)
    assert all(len(line) <= 120 for line in narrow.stdout.splitlines()[2:])
    assert LONG_WHY not in narrow.stdout
    wide = mcadctl_("queue", "-o", "wide", columns=120)
    assert LONG_WHY in wide.stdout and "FITS-NOW" in wide.stdout
    # Into a pipe or a file, nothing is cut (CliRunner's stdout is not a terminal), and no extra columns appear.
    piped = mcadctl_("queue", columns=None)
    assert LONG_WHY in piped.stdout and "FITS-NOW" not in piped.stdout


def test_queue_command_json_filters_by_namespace(controller: Controller) -> None:
    result = mcadctl_("queue", "-n", "team-b", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [aw["name"] for aw in doc["queued"]] == ["big"]
    assert doc["dispatched"] == []
    assert doc["controller"] == CONTROLLER


def test_queue_command_yaml_round_trips(controller: Controller) -> None:
    controller.answers["queue"] = {**QUEUE, "resetting": [], "reservations": [],
                                   "page": {"offset": 0, "limit": 1000, "queuedTotal": 3}}
    result = mcadctl_("queue", "-o", "yaml")
    assert yaml.safe_load(result.stdout) == controller.answers["queue"]


def test_queue_command_asks_for_a_page_and_says_where_the_next_one_starts(controller: Controller) -> None:
    controller.answers["queue"] = {**QUEUE, "queued": QUEUE["queued"][1:2], "resetting": [], "reservations": [],
                                   "page": {"offset": 1, "limit": 1, "queuedTotal": 3}}
    result = mcadctl_("queue", "--limit", "1", "--offset", "1")
    assert result.exit_code == 0, result.output
    assert controller.asked[0][1:] == ("queue", [("limit", "1"), ("offset", "1")])
    lines = result.stdout.splitlines()
    assert lines[0].endswith(": 3 queued, 1 dispatched")
    assert [line.split()[0] for line in lines[3:-1]] == ["2"]
    assert lines[-1] == "(queued rows 2-2 of 3; --offset 2 for the next 1; --limit 0 for all)"
    controller.answers["queue"] = QUEUE
    whole = mcadctl_("queue", "--limit", "0")
    assert controller.asked[1][1:] == ("queue", [])
    assert "--limit 0 for all" not in whole.stdout


def test_queue_command_cuts_the_page_itself_from_a_controller_that_does_not_page(controller: Controller) -> None:
    result = mcadctl_("queue", "--limit", "2", "-o", "json")
    doc = json.loads(result.stdout)
    assert [aw["name"] for aw in doc["queued"]] == ["urgent", "big"]
    assert doc["page"] == {"offset": 0, "limit": 2, "queuedTotal": 3}
    assert doc["dispatched"] == QUEUE["dispatched"]
    past = mcadctl_("queue", "--offset", "5")
    assert "No queued rows from place 6 on (3 queued; --offset 0 for the first)." in past.stdout


def test_queue_command_refuses_a_page_larger_than_the_controller_serves(controller: Controller) -> None:
    result = mcadctl_("queue", "--limit", "10001")
    assert result.exit_code == 2 and "--limit" in result.output
    assert controller.asked == []


def test_ledger_command_nodes_via_flag_or_wide(controller: Controller) -> None:
    plain = mcadctl_("ledger")
    assert "RESOURCE" in plain.stdout and "NODE" not in plain.stdout
    assert "node-a" in mcadctl_("ledger", "--nodes").stdout
    assert "node-a" in mcadctl_("ledger", "-o", "wide").stdout
    assert json.loads(mcadctl_("ledger", "-o", "json").stdout) == LEDGER


def test_explain_command_asks_for_the_appwrapper(controller: Controller) -> None:
    result = mcadctl_("explain", "team-b/big")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("team-b/big [Pending]: It is queued")
    assert controller.asked[0][1:] == ("explain", [("namespace", "team-b"), ("name", "big")])


def test_explain_of_an_unknown_appwrapper_is_an_error(controller: Controller) -> None:
    controller.answers["explain"] = reach.ControllerRefused(404, {"error": "AppWrapper a/b not found"}, "404")
    result = mcadctl_("explain", "team-b/nope")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: AppWrapper team-b/nope not found (the controller does not know it)")
    assert "kubectl get appwrappers -n team-b" in result.stderr


def test_other_controller_errors_are_reported_as_they_came(controller: Controller) -> None:
    controller.answers["ledger"] = reach.ControllerRefused(
        503, {"error": "not ready"}, "the controller (x) answered 503: not ready")
    result = mcadctl_("ledger")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: the controller (x) answered 503: not ready"
    controller.answers["queue"] = reach.DebugUnavailable("no Lease or Service mcad-controller in mcad-system")
    result = mcadctl_("queue")
    assert (result.exit_code, result.stderr.strip()) == (1, "error: no Lease or Service mcad-controller in "
                                                            "mcad-system")


def test_quota_command_prints_every_tree_or_the_ones_asked_for(controller: Controller) -> None:
    result = mcadctl_("quota")
    assert result.exit_code == 0, result.output
    assert "TREE quota_context" in result.stdout and "TREE quota_service" in result.stdout
    assert controller.asked[0][1:] == ("quota", [])
    one = mcadctl_("quota", "--tree", "quota_service")
    assert "TREE quota_service" in one.stdout and "quota_context" not in one.stdout
    doc = json.loads(mcadctl_("quota", "--tree", "quota_context", "-o", "json").stdout)
    assert [tree["name"] for tree in doc["trees"]] == ["quota_context"]
    assert doc["controller"] == CONTROLLER
    assert yaml.safe_load(mcadctl_("quota", "-o", "yaml").stdout) == QUOTA


def test_quota_command_cuts_appwrappers_to_columns_unless_wide_or_piped(controller: Controller) -> None:
    narrow = mcadctl_("quota", columns=110)
    assert "tune-with-a-long-name" not in narrow.stdout
    assert all(len(line) <= 110 for line in narrow.stdout.splitlines()[2:] if not line.startswith("  error"))
    assert "tune-with-a-long-name(cpu=500m" in mcadctl_("quota", "-o", "wide", columns=90).stdout
    piped = mcadctl_("quota", columns=None)
    assert "team-a/tune-with-a-long-name" in piped.stdout and "DEFINED-BY" not in piped.stdout


def test_quota_command_of_an_unknown_tree_is_an_error_naming_the_trees(controller: Controller) -> None:
    result = mcadctl_("quota", "--tree", "quota_context", "--tree", "nope")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.strip() == ("error: no quota tree named nope (the trees are: quota_context, "
                                     "quota_service); a tree is the `tree` label of its QuotaSubtree objects")


@pytest.mark.parametrize("argument", ["big", "team-b/", "/big", "a/b/c"])
def test_explain_needs_namespace_slash_name(controller: Controller, argument: str) -> None:
    result = mcadctl_("explain", argument)
    assert result.exit_code == 2
    assert "is not NAMESPACE/NAME" in result.stderr
    assert controller.asked == []


@pytest.mark.parametrize("args", [
    ["--url", "http://x", "--offline", "queue"], ["queue", "-o", "table"], ["explain", "a/b", "-o", "wide"],
    ["--port", "0", "queue"], ["--fit", "best", "--offline", "queue"], ["quota", "-o", "table"],
    ["quota", "--tree"],
])
def test_bad_usage_exits_2_without_asking_anyone(controller: Controller, args: list[str]) -> None:
    result = mcadctl_(*args)
    assert result.exit_code == 2, result.output
    assert controller.asked == []


def test_every_command_explains_itself() -> None:
    for command, words in [([], "--offline"), (["queue"], "/debug/queue"), (["ledger"], "/debug/ledger"),
                           (["explain"], "/debug/explain"), (["quota"], "/debug/quota")]:
        result = mcadctl_(*command, "--help")
        assert result.exit_code == 0
        assert words in result.stdout


def test_url_nobody_listens_on_is_a_clear_error() -> None:
    # Port 9 (discard) on loopback: nothing listens, so the connection is refused at once.
    result = mcadctl_("--url", "http://127.0.0.1:9", "queue")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot reach the controller at http://127.0.0.1:9/debug/queue")
    assert "--offline" in result.stderr


def test_missing_kubeconfig_is_a_clear_error(tmp_path: Any) -> None:
    result = mcadctl_("--kubeconfig", str(tmp_path / "nope"), "queue")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: kubeconfig '{tmp_path / 'nope'}' does not exist"


def test_offline_documents_say_they_were_computed_here() -> None:
    offline = {**QUEUE, "controller": {"identity": "offline", "leader": False, "offline": True, "fit": "aggregate",
                                       "strictFifo": True, "preemption": True}}
    assert render.queue_lines(offline)[0] == ("computed offline from cluster state (fit=aggregate, strict FIFO, "
                                              "preemption on): 3 queued, 1 dispatched")


def test_unreachable_api_server_is_named_with_its_kubeconfig(tmp_path: Any) -> None:
    config = unreachable_kubeconfig(tmp_path)
    for command in (["queue"], ["ledger"], ["explain", "a/b"], ["quota"], ["--offline", "queue"],
                    ["--offline", "quota"]):
        result = mcadctl_("--kubeconfig", str(config), "--timeout", "5", *command)
        assert result.exit_code == 1, (command, result.output)
        assert result.stderr.startswith(f"error: cannot reach the API server https://127.0.0.1:9 (from kubeconfig "
                                        f"{config})"), (command, result.stderr)


# -- clusters (hub mode) ---------------------------------------------------------------------------------------------

CLUSTERS: dict[str, Any] = {
    "controller": CONTROLLER, "generatedAt": "2026-11-21T22:00:00Z", "mode": "hub", "policy": "best",
    "unreachableTimeoutSeconds": 300,
    "clusters": [
        {"name": "east", "labels": {"region": "us-east", "gpu": "a100"}, "state": "Healthy", "message": "",
         "since": "2026-11-21T21:59:00Z", "synced": True, "usable": True, "nodes": 2,
         "capacity": {"memory": "16Gi", "cpu": "8"}, "free": {"cpu": "5", "memory": "12Gi"},
         "appwrappers": ["default/job-a", "team/b"]},
        {"name": "west", "labels": {}, "state": "Unreachable", "message": "GET /version: connection refused",
         "since": "2026-11-21T19:00:00Z", "synced": True, "usable": False, "nodes": 3,
         "capacity": None, "free": None, "appwrappers": ["team/c"]},
        {"name": "north", "labels": {"region": "eu"}, "state": "Unauthorized",
         "message": "401 Unauthorized: the token was rejected", "since": "2026-11-21T21:59:30Z", "synced": False,
         "usable": False, "nodes": 0, "capacity": {}, "free": {}, "appwrappers": []},
        {"name": "south", "labels": {}, "state": "Healthy", "message": "", "since": "2026-11-21T21:59:58Z",
         "synced": False, "usable": False, "nodes": 1, "capacity": {"cpu": "4"}, "free": {"cpu": "4"},
         "appwrappers": []},
    ],
}
SINGLE: dict[str, Any] = {"controller": CONTROLLER, "generatedAt": "2026-11-21T22:00:00Z", "mode": "single",
                          "policy": "best", "unreachableTimeoutSeconds": 300, "clusters": []}


def test_clusters_table_lists_workers_in_config_order_with_state_room_and_count() -> None:
    lines = render.clusters_lines(CLUSTERS)
    assert lines[0] == ("controller mcad-controller-5f7c9-x2x7q_1b2c 0.4.0 (leader; fit=nodes, best-effort FIFO, "
                        "preemption off): hub mode, policy best, requeue from an unreachable worker after 5m; "
                        "1 of 4 worker(s) usable")
    header, *rows = lines[2:]
    assert header.split() == ["NAME", "STATE", "CAPACITY", "FREE", "APPWRAPPERS"]
    assert [row.split() for row in rows] == [
        ["east", "Healthy", "cpu=8,memory=16Gi", "cpu=5,memory=12Gi", "2"],
        # Capacity unknown (not zero): printed as "-", the AppWrappers still placed there are still counted.
        ["west", "Unreachable", "-", "-", "1"],
        # Synced only matters for a worker that answers: Unauthorized says all there is to say.
        ["north", "Unauthorized", "-", "-", "0"],
        ["south", "Healthy,NotSynced", "cpu=4", "cpu=4", "0"],
    ]
    assert "LABELS" not in header and "connection refused" not in "\n".join(lines)


def test_wide_clusters_add_labels_time_in_state_and_message() -> None:
    header, *rows = render.clusters_lines(CLUSTERS, wide=True)[2:]
    assert header.split() == ["NAME", "STATE", "CAPACITY", "FREE", "APPWRAPPERS", "LABELS", "SINCE", "MESSAGE"]
    east, west, north, south = rows
    assert east.split()[5:] == ["gpu=a100,region=us-east", "1m", "-"]
    assert west.split()[5:7] == ["-", "3h"] and west.endswith("GET /version: connection refused")
    assert north.endswith("401 Unauthorized: the token was rejected") and "region=eu" in north
    assert south.split()[5:] == ["-", "2s", "-"]
    # Columns line up: each MESSAGE starts under its header.
    start = header.index("MESSAGE")
    assert west[start:] == "GET /version: connection refused"


def test_single_cluster_mode_is_one_line() -> None:
    lines = render.clusters_lines(SINGLE)
    assert len(lines) == 1
    assert "single-cluster mode" in lines[0] and "--clusters-config" in lines[0]


def test_clusters_missing_fields_print_as_dashes() -> None:
    lines = render.clusters_lines({"mode": "hub", "clusters": [{"name": "bare"}, {}]}, wide=True)
    assert lines[0].endswith("hub mode, policy -; 0 of 2 worker(s) usable")
    assert [row.split() for row in lines[3:]] == [["bare", *["-"] * 7], ["-"] * 8]
    assert render.clusters_lines({"mode": "hub", "clusters": []})[-1] == "No worker clusters."


def test_clusters_command_prints_the_table_from_debug_clusters(controller: Controller) -> None:
    controller.answers["clusters"] = CLUSTERS
    result = mcadctl_("--url", "http://localhost:8080", "clusters")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == render.clusters_lines(CLUSTERS)
    where, endpoint, query = controller.asked[0]
    assert (where.url, endpoint, query) == ("http://localhost:8080", "clusters", [])
    for explicit in ("table", "wide"):
        shown = mcadctl_("clusters", "-o", explicit)
        assert shown.exit_code == 0, shown.output
        assert shown.stdout.splitlines() == render.clusters_lines(CLUSTERS, wide=explicit == "wide")


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_clusters_command_json_and_yaml_print_the_document(controller: Controller, output: str) -> None:
    controller.answers["clusters"] = CLUSTERS
    result = mcadctl_("clusters", "-o", output)
    assert result.exit_code == 0, result.output
    assert (json.loads if output == "json" else yaml.safe_load)(result.stdout) == CLUSTERS


def test_clusters_command_in_single_cluster_mode_says_so_and_succeeds(controller: Controller) -> None:
    controller.answers["clusters"] = SINGLE
    result = mcadctl_("clusters")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 1 and "single-cluster mode" in result.stdout


def test_clusters_offline_is_a_usage_error_that_asks_nobody(controller: Controller) -> None:
    result = mcadctl_("--offline", "clusters")
    assert result.exit_code == 2
    assert "needs the running controller" in result.stderr and "worker clusters" in result.stderr
    assert controller.asked == []


def test_clusters_from_a_controller_without_the_endpoint_says_so(controller: Controller) -> None:
    controller.answers["clusters"] = reach.ControllerRefused(404, {"error": "not found"},
                                                             "the controller answered 404: not found")
    result = mcadctl_("clusters")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: the controller answered 404") and "before hub mode" in result.stderr
    controller.answers["clusters"] = reach.DebugUnavailable("no Lease and no Service")
    result = mcadctl_("clusters")
    assert (result.exit_code, result.stderr) == (1, "error: no Lease and no Service\n")


# -- the token shown to the controller --------------------------------------------------------------------------------


def _kubeconfig(tmp_path: Path, user: dict[str, Any]) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": user}], "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return str(path)


def test_the_kubeconfig_token_is_resolved_as_the_client_does(tmp_path: Path) -> None:
    from mcad.k8s import kube

    assert kube.bearer_token(kube.connect(_kubeconfig(tmp_path, {"token": "abc"}))) == "abc"
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert kube.bearer_token(kube.connect(_kubeconfig(tmp_path, {"tokenFile": str(token_file)}))) == "from-file"
    cert = _kubeconfig(tmp_path, {"client-certificate-data": "eA==", "client-key-data": "eA=="})
    assert kube.bearer_token(kube.connect(cert)) is None


def test_a_kubeconfig_token_goes_to_a_url_only_on_this_machine(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("KUBECONFIG", _kubeconfig(tmp_path, {"token": "abc"}))
    where = reach.Where(url="http://10.0.0.1:8080")
    assert reach._direct_token(where, "http://10.0.0.1:8080/debug/queue") is None
    assert reach._direct_token(where, "http://127.0.0.1:8080/debug/queue") == "abc"
    assert reach._direct_token(where, "http://localhost:8080/debug/queue") == "abc"
    assert reach._direct_token(reach.Where(token="given"), "http://10.0.0.1:8080/debug/queue") == "given"


def test_a_client_certificate_kubeconfig_through_the_api_server_says_how_to_get_a_token(tmp_path: Path) -> None:
    cert = _kubeconfig(tmp_path, {"client-certificate-data": "eA==", "client-key-data": "eA=="})
    result = CliRunner(env={"MCAD_TOKEN": None}).invoke(mcadctl.main, ["--kubeconfig", cert, "queue"])
    assert result.exit_code == 1
    assert f"kubeconfig {cert} authenticates with a client certificate" in result.stderr
    assert "--token" in result.stderr and "kubectl create token" in result.stderr


# -- the route through the API server, without pods/proxy ---------------------------------------------------------


def _through(monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> tuple[reach._ThroughApiServer, list[str]]:
    """A fetch whose API server answers each request with the next of ``answers`` (a dict, or an ApiError to
    raise); the paths asked are recorded."""
    asked: list[str] = []
    pending = iter(answers)

    def request_json(conn: Any, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        asked.append(path)
        answer = next(pending)
        if isinstance(answer, ApiError):
            raise answer
        return dict(answer)

    monkeypatch.setattr(reach.kube, "request_json", request_json)
    conn = SimpleNamespace(server="https://api", source="kubeconfig")
    return reach._ThroughApiServer(conn, reach.Where(), "queue", [], "t"), asked  # type: ignore[arg-type]


def _standby() -> ApiError:
    return ApiError(503, "Service Unavailable", "not the leader",
                    body={"error": "not the leader", "leader": "mcad-controller-1_x", "port": 8080})


def _forbidden() -> ApiError:
    return ApiError(403, "Forbidden", 'cannot get resource "pods/proxy"', body={"kind": "Status", "code": 403})


LEADER_SERVICE = reach.service_proxy_path("mcad-system", "mcad-controller-leader", "queue")


def _no_leader_service() -> ApiError:
    return ApiError(404, "NotFound", 'services "mcad-controller-leader" not found', body={"kind": "Status"})


def test_the_leaders_service_is_asked_first(monkeypatch: pytest.MonkeyPatch) -> None:
    through, asked = _through(monkeypatch, [{"queued": []}])
    assert through.fetch() == {"queued": []}
    assert asked == [LEADER_SERVICE]


def test_a_standby_behind_the_leaders_service_or_its_refusal_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """During a handover the old leader's pod may still carry the label; an older Role may not name the Service."""
    lease = {"spec": {"holderIdentity": "mcad-controller-1_x"}}
    refused = ApiError(403, "Forbidden", 'cannot get resource "services/proxy"', body={"kind": "Status"})
    for first in (_standby(), refused):
        through, asked = _through(monkeypatch, [first, lease, {"queued": []}])
        assert through.fetch() == {"queued": []}
        assert asked[0] == LEADER_SERVICE and asked[2] == reach.pod_proxy_path("mcad-system", "mcad-controller-1",
                                                                               8080, "queue")


def test_without_pods_proxy_the_service_is_asked_again_until_the_leader_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lease = {"spec": {"holderIdentity": "mcad-controller-1_x"}}
    through, asked = _through(monkeypatch, [_no_leader_service(), lease, _forbidden(), _standby(), _standby(),
                                            {"queued": []}])
    assert through.fetch() == {"queued": []}
    pod = reach.pod_proxy_path("mcad-system", "mcad-controller-1", 8080, "queue")
    service = reach.service_proxy_path("mcad-system", "mcad-controller", "queue")
    assert asked == [LEADER_SERVICE, reach.lease_path("mcad-system", "mcad-controller"), pod, service, service,
                     service]


def test_with_pods_proxy_a_standby_is_followed_to_the_leaders_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    no_lease = ApiError(404, "Not Found", "leases not found", body={"kind": "Status", "code": 404})
    through, asked = _through(monkeypatch, [_no_leader_service(), no_lease, _standby(), {"queued": []}])
    assert through.fetch() == {"queued": []}
    assert asked[2:] == [reach.service_proxy_path("mcad-system", "mcad-controller", "queue"),
                         reach.pod_proxy_path("mcad-system", "mcad-controller-1", 8080, "queue")]


def test_the_service_is_asked_at_most_service_tries_times(monkeypatch: pytest.MonkeyPatch) -> None:
    lease = {"spec": {"holderIdentity": "mcad-controller-1_x"}}
    through, asked = _through(monkeypatch, [_no_leader_service(), lease, _forbidden(),
                                            *[_standby()] * reach.SERVICE_TRIES])
    with pytest.raises(reach.DebugUnavailable, match=f"answered from a standby replica {reach.SERVICE_TRIES} times"):
        through.fetch()
    assert len(asked) == 3 + reach.SERVICE_TRIES


# -- ledger --topology -----------------------------------------------------------------------------------------------

BLOCK, RACK = "topology.example.com/block", "topology.example.com/rack"


def topology_node(name: str, labels: dict[str, str], *, cpu: str = "8", gpu: str = "4", free_cpu: str = "6",
                  schedulable: bool = True, cluster: str = "") -> dict[str, Any]:
    return {"name": name, "cluster": cluster, "schedulable": schedulable, "ready": True,
            "allocatable": {"cpu": cpu, "memory": "16Gi", "nvidia.com/gpu": gpu, "pods": "110"},
            "used": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}, "planned": {"cpu": "1"},
            "free": {"cpu": free_cpu, "memory": "15Gi", "nvidia.com/gpu": "3"}, "pinned": 0, "health": [],
            "topology": labels}


TOPOLOGY_LEDGER: dict[str, Any] = {
    **LEDGER, "topologyLevels": [BLOCK, RACK],
    "nodes": [topology_node("a0", {BLOCK: "b1", RACK: "r2"}), topology_node("a1", {BLOCK: "b1", RACK: "r1"}),
              topology_node("c0", {BLOCK: "b0", RACK: "r3"}, free_cpu="500m"),
              topology_node("c1", {BLOCK: "b0", RACK: "r3"}, schedulable=False),
              topology_node("loose", {})]}


def test_topology_adds_up_each_domain_of_each_level_by_value_and_the_nodes_in_none() -> None:
    doc = topologyroom.domains(TOPOLOGY_LEDGER, [BLOCK, RACK])
    assert doc["resources"] == ["cpu", "memory", "nvidia.com/gpu"]
    blocks = doc["levels"][0]
    assert blocks["level"] == BLOCK
    assert [(d["value"], d["nodes"], d["schedulable"]) for d in blocks["domains"]] == [("b0", 2, 1), ("b1", 2, 2)]
    b0, b1 = blocks["domains"]
    # Only schedulable nodes count, as the ledger's totals do: c1 is cordoned.
    assert b0["capacity"] == {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "4"}
    assert b0["free"] == {"cpu": "500m", "memory": "15Gi", "nvidia.com/gpu": "3"}
    assert b1["free"] == {"cpu": "12", "memory": "30Gi", "nvidia.com/gpu": "6"}
    assert b1["used"] == {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "2"}
    assert b1["planned"] == {"cpu": "2", "memory": "0", "nvidia.com/gpu": "0"}
    assert blocks["none"]["nodes"] == 1 and blocks["none"]["free"]["cpu"] == "6"
    assert [d["value"] for d in doc["levels"][1]["domains"]] == ["r1", "r2", "r3"]

    lines = topologyroom.lines(doc)
    assert lines[0] == render.controller_line(TOPOLOGY_LEDGER)
    start = lines.index(f"LEVEL {BLOCK}: 2 domain(s); 1 node(s) in none")
    rows = [line.split() for line in lines[start + 1:start + 11]]
    assert rows[0] == ["DOMAIN", "NODES", "RESOURCE", "CAPACITY", "USED", "PLANNED", "FREE"]
    assert rows[1] == ["b0", "1/2", "cpu", "8", "1", "1", "500m"]
    assert rows[4] == ["b1", "2/2", "cpu", "16", "2", "2", "12"]
    assert rows[6] == ["b1", "2/2", "nvidia.com/gpu", "8", "2", "0", "6"]
    assert rows[7] == ["(none)", "1/1", "cpu", "8", "1", "1", "6"]
    assert f"LEVEL {RACK}: 3 domain(s); 1 node(s) in none" in lines


def test_topology_domains_are_per_worker_cluster_in_hub_mode() -> None:
    ledger = {**TOPOLOGY_LEDGER, "nodes": [topology_node("e0", {RACK: "r1"}, cluster="east"),
                                           topology_node("w0", {RACK: "r1"}, cluster="west"),
                                           topology_node("e1", {RACK: "r0"}, cluster="east")]}
    doc = topologyroom.domains(ledger, [RACK])
    assert [(d["cluster"], d["value"], d["nodes"]) for d in doc["levels"][0]["domains"]] == [
        ("east", "r0", 1), ("east", "r1", 1), ("west", "r1", 1)]
    lines = topologyroom.lines(doc)
    assert lines[2] == f"LEVEL {RACK}: 3 domain(s); every node is in one"
    assert lines[3].split()[:2] == ["CLUSTER", "DOMAIN"] and lines[4].split()[:3] == ["east", "r0", "1/1"]


def test_topology_of_a_sparse_document_prints_dashes_and_zeros_not_errors() -> None:
    doc = topologyroom.domains({"nodes": [{"name": "x", "topology": {RACK: 7}, "free": {"cpu": "lots"}}, "junk"]},
                               [RACK])
    assert doc["levels"][0]["domains"] == [] and doc["levels"][0]["none"]["nodes"] == 1
    assert topologyroom.lines(doc)[3].split() == ["DOMAIN", "NODES", "RESOURCE", "CAPACITY", "USED", "PLANNED",
                                                  "FREE"]
    assert "No nodes." in topologyroom.lines(topologyroom.domains({}, [RACK]))


def test_ledger_topology_command_groups_by_the_controllers_levels_or_those_asked(controller: Controller) -> None:
    controller.answers["ledger"] = TOPOLOGY_LEDGER
    result = mcadctl_("ledger", "--topology")
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.stdout.splitlines() if line.startswith("LEVEL")] == [
        f"LEVEL {BLOCK}", f"LEVEL {RACK}"]
    assert controller.asked[-1][1:] == ("ledger", [])
    only = json.loads(mcadctl_("ledger", "--topology", "--level", RACK, "-o", "json").stdout)
    assert [level["level"] for level in only["levels"]] == [RACK]
    assert [d["value"] for d in only["levels"][0]["domains"]] == ["r1", "r2", "r3"]
    assert yaml.safe_load(mcadctl_("ledger", "--topology", "-o", "yaml").stdout) == topologyroom.domains(
        TOPOLOGY_LEDGER, [BLOCK, RACK])


def test_ledger_topology_refuses_a_level_the_controller_does_not_report(controller: Controller) -> None:
    controller.answers["ledger"] = TOPOLOGY_LEDGER
    result = mcadctl_("ledger", "--topology", "--level", "secret.example.com/owner")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: the controller reports the domains of its --topology-level levels only "
                                    f"({BLOCK}, {RACK}), not of secret.example.com/owner")
    controller.answers["ledger"] = {**TOPOLOGY_LEDGER, "topologyLevels": []}
    unconfigured = mcadctl_("ledger", "--topology")
    assert unconfigured.exit_code == 1 and "runs without --topology-level" in unconfigured.stderr
    controller.answers["ledger"] = LEDGER  # a controller from before topology levels
    older = mcadctl_("ledger", "--topology")
    assert older.exit_code == 1 and "reports no topology levels" in older.stderr


@pytest.mark.parametrize("args", [
    ["ledger", "--level", RACK], ["ledger", "--topology", "--nodes"], ["ledger", "--topology", "-o", "wide"],
    ["--offline", "ledger", "--topology"], ["--offline", "ledger", "--topology", "--level", "not a key"],
])
def test_ledger_topology_usage_errors_ask_nobody(controller: Controller, args: list[str]) -> None:
    result = mcadctl_(*args)
    assert result.exit_code == 2, result.output
    assert controller.asked == []
