"""``make bench`` keeps working: every scenario runs end to end at a tiny scale and reports its figures.

This is not a performance test (figures at this scale mean nothing, and timings are never asserted); it stops the
benchmark suite from rotting between the occasional full runs, and checks the correctness properties the scenarios
observe: the deep-queue backlog is not rewritten while probes dispatch, a restarted controller re-dispatches
nothing, the noisy neighbour's AppWrappers and the other tenant's all run, and the memory scenario queues all of
its AppWrappers and measures the controller before and after a restart, admission asks one review per item of a new
user and nothing of a cached one, a tenant's creates go through the webhooks quiet and while admission_attack's attack
runs (which gets its forged reviews answered), and with the webhooks registered every AppWrapper of the throughput
run is reviewed by them (and none without), pollers get /debug/queue answered while probes dispatch, churn counts
the controller's API writes, churn_pods' workloads each end by their Job completing, starvation creates each
gang behind a full cluster and records whether it was dispatched (the figures, and so the starvation target, are
left to the real runs), the dashboard's queue view answers its first page of queued rows to each poll, and at the
shape of the scale scenario (a backlog created before the controller starts) nothing of the backlog is dispatched, no
AppWrapper kept Running across a restart is dispatched again, and the restarted controller writes nothing to the
queued ones.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ["ceiling", "throughput", "throughput_webhooks", "placement", "deep_queue", "churn", "churn_pods",
             "restart", "noisy_neighbour", "memory", "admission", "admission_attack", "pollers", "starvation",
             "starvation_spare", "dashboard", "scale"]
PERCENTILES = {"n", "p50_ms", "p90_ms", "p99_ms", "mean_ms"}


# The smoke's bench runs, in two lanes side by side: each scenario brings up a control plane of its own, and at this
# scale most of a scenario's wall time is that start and the scenario's waits, not CPU, so two lanes take little more
# than the longer one. A scenario's cluster is named after it, so every run of throughput_webhooks is in one lane;
# the ceiling stays with throughput, which reads it. Lanes of about equal wall time.
HALVES = (["ceiling", "throughput", "throughput_webhooks", "placement", "deep_queue", "churn", "churn_pods",
           "noisy_neighbour", "restart"],
          ["memory", "admission", "admission_attack", "pollers", "starvation", "starvation_spare", "dashboard",
           "scale"])
# The scale scenario's backlog at half the smoke scale (1,000 AppWrappers on 50 nodes): what its test checks is the
# shape (a backlog created before the controller starts, a restart), not a count.
HALF_ARGS = ((), ("--size", "scale=0.5"))
# throughput_webhooks alone, with what its own tests below ask of it; in the first lane, after its half.
WEBHOOK_RUNS = {"creator_policy": ("--webhook-creator", "policy", "--webhook-rounds", "2"),
                "null_webhook": ("--webhook-creator", "policy", "--webhook-server", "null")}


def bench(output: Path, *args: str) -> Path:
    """One ``test.perf.bench`` run at the smoke scale; its results file."""
    proc = subprocess.run([sys.executable, "-m", "test.perf.bench", "--scale", "0.02", *args, "--output",
                           str(output)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, " ".join(args) + "\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
    return output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every bench run of this module, by name: ``half-0``, ``half-1`` and the ``WEBHOOK_RUNS``."""
    folder = tmp_path_factory.mktemp("bench")
    lanes = [[(f"half-{i}", ("--scenarios", ",".join(half), *HALF_ARGS[i]))] for i, half in enumerate(HALVES)]
    lanes[0] += [(name, ("--scenarios", "throughput_webhooks", *args)) for name, args in WEBHOOK_RUNS.items()]

    def run_lane(lane: list[tuple[str, tuple[str, ...]]]) -> dict[str, Path]:
        return {name: bench(folder / f"{name}.json", *args) for name, args in lane}

    with concurrent.futures.ThreadPoolExecutor(len(lanes)) as pool:
        done: dict[str, Path] = {}
        for paths in pool.map(run_lane, lanes):
            done |= paths
        return done


@pytest.fixture(scope="module")
def results(runs: dict[str, Path]) -> dict[str, dict]:
    return {entry["scenario"]: entry for i in range(len(HALVES))
            for entry in json.loads(runs[f"half-{i}"].read_text())["scenarios"]}


def test_every_scenario_runs(results: dict[str, dict]) -> None:
    assert sorted(results) == sorted(SCENARIOS)
    assert [name for name, entry in results.items() if not entry["ok"]] == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_reports_wall_time_throughput_and_percentiles(results: dict[str, dict], scenario: str) -> None:
    entry = results[scenario]
    assert entry["wall_s"] > 0
    if "throughput" in entry:
        assert all(value > 0 for value in entry["throughput"].values())
    for name, figures in entry["latency"].items():
        assert set(figures) >= PERCENTILES, name
    if scenario not in ("ceiling", "admission"):  # these run no controller
        assert entry["controller"]["cpu_seconds"] > 0
        assert entry["controller"]["peak_rss_mib"] > 0


def test_deep_queue_backlog_is_not_rewritten_while_probes_dispatch(results: dict[str, dict]) -> None:
    backlog = results["deep_queue"]["backlog"]
    assert backlog["dispatched"] == 0
    assert backlog["events_during_probes"] == 0
    assert results["deep_queue"]["latency"]["new_cpu_appwrapper"]["n"] >= 10


def test_restarted_controller_redispatches_nothing(results: dict[str, dict]) -> None:
    restart = results["restart"]["restart"]
    assert restart["redispatched"] == 0
    assert restart["pods_replaced_or_new"] == 0
    assert restart["not_running"] == 0
    assert restart["start_to_first_dispatch_s"] > 0


@pytest.mark.parametrize("scenario", ["churn", "churn_pods"])
def test_churn_dispatches_every_class(results: dict[str, dict], scenario: str) -> None:
    latency = results[scenario]["latency"]
    for size in ("small", "medium", "large"):
        assert latency[f"time_to_dispatch_{size}"]["n"] == 30
        assert results[scenario]["per_class"][size]["n"] == 30


def test_churn_pods_workloads_finish_when_their_jobs_complete(results: dict[str, dict]) -> None:
    entry = results["churn_pods"]
    n = entry["params"]["workloads"]
    assert n == 90 and entry["params"]["wraps"].startswith("a Job"), entry["params"]
    # Every workload ended by its Job completing: mcad marked it Completed (only then does the load delete it).
    assert entry["completion"] == {"completed": n, "workloads": n}
    assert entry["latency"]["pod_run_time_to_completed"]["n"] == n
    # Each Job's pod was seen Running on a kwok node.
    assert entry["latency"]["dispatch_to_pod_running"]["n"] == n


def test_churn_counts_the_controllers_api_writes(results: dict[str, dict]) -> None:
    writes = results["churn"]["api_writes"]
    # At least a status write per dispatched workload, and the load process's own requests are not among them.
    assert writes["controller"] >= 90, writes
    assert writes["load_process"]["POST appwrappers.workload.codeflare.dev"] == 90
    assert "POST appwrappers.workload.codeflare.dev" not in writes["by_request"], writes
    counted = results["churn"]["controller_counted_writes"]["by_request"]
    # The controller's own count: one ConfigMap and one dispatched status per workload at least, and the ConfigMaps
    # of deleted AppWrappers left to the garbage collector (a DELETE per workload would be a write more under churn).
    assert counted["POST configmaps"] == 90, counted
    assert counted["PATCH appwrappers.workload.codeflare.dev/status"] >= 90, counted
    assert "DELETE configmaps" not in counted, counted


def test_placement_compares_binding_with_advisory_and_times_the_ungate(results: dict[str, dict]) -> None:
    entry = results["placement"]
    n = entry["params"]["appwrappers"]
    assert entry["phases"]["binding"]["throughput"]["dispatched"] == n == entry["phases"]["advisory"][
        "throughput"]["dispatched"]
    assert entry["pins"]["pinned"] >= n, "every pod (one per AppWrapper) pinned to a slot of its plan"
    assert entry["ungate"]["pods"] >= n and entry["ungate"]["p99_le_ms"] is not None
    names = {t["name"] for t in entry["targets"]}
    assert names >= {"dispatch rate, binding / advisory", "pod rate, binding / advisory"}


@pytest.mark.parametrize(("scenario", "cpus"), [("starvation", 16), ("starvation_spare", 24)])
def test_starvation_creates_each_gang_behind_a_full_cluster(results: dict[str, dict], scenario: str,
                                                            cpus: int) -> None:
    entry = results[scenario]
    assert len(entry["runs"]) == entry["params"]["gangs"] >= 1
    for run in entry["runs"]:
        assert run["blocking_small"] >= cpus - 4, run  # created once all cpus were taken; a few may end at once
        assert run["dispatched"] == (run["time_to_dispatch_s"] is not None), run
    assert entry["starvation"]["dispatched"] + entry["starvation"]["starved"] == len(entry["runs"])


def test_noisy_neighbour_dispatches_the_other_tenant_and_every_big_appwrapper(results: dict[str, dict]) -> None:
    entry = results["noisy_neighbour"]
    assert entry["params"]["big_appwrappers"] >= 1
    assert entry["latency"]["probe_create_to_running"]["n"] == 1
    assert entry["latency"]["probe_create_to_pod_running"]["n"] == 1
    assert entry["latency"]["big_create_to_running"]["n"] == entry["params"]["big_appwrappers"]


def test_memory_queues_everything_and_measures_each_phase(results: dict[str, dict]) -> None:
    entry = results["memory"]
    assert entry["latency"]["small_create_to_pending"]["n"] == entry["params"]["small_appwrappers"]
    assert entry["latency"]["big_create_to_pending"]["n"] == entry["params"]["big_appwrappers"]
    assert entry["small"]["appwrapper_bytes"] > 0 and entry["small"]["rss_after_mib"] > 0
    assert entry["big"]["peak_rss_mib"] > 0 and entry["restart"]["peak_rss_mib"] > 0


def test_admission_reviews_once_per_item_then_answers_from_its_cache(results: dict[str, dict]) -> None:
    entry = results["admission"]
    calls = entry["params"]["calls_per_case"]
    assert all(figures["n"] == calls for figures in entry["latency"].values())
    assert entry["requests_per_call"] == {"cold_sar": 3, "cached": 0}


def test_admission_attack_creates_through_the_webhooks_quiet_and_under_attack(results: dict[str, dict]) -> None:
    entry = results["admission_attack"]
    attack = entry["attack"]
    assert entry["latency"]["create_call, quiet"]["n"] == entry["params"]["quiet_creates"], entry["create_failures"]
    assert attack["creates_ok"] + attack["creates_failed"] > 0 and attack["health_probes"] > 0, attack
    counts = entry["attack_counts"]
    assert counts.get("big_200", 0) + counts.get("big_503", 0) > 0, counts


def test_pollers_are_answered_while_probes_dispatch(results: dict[str, dict]) -> None:
    entry = results["pollers"]
    assert entry["polls"]["answers"].get("200", 0) > 0, entry["polls"]
    assert entry["latency"]["create_to_running_16_pollers"]["n"] == entry["params"]["probes_each"]


def test_throughput_with_webhooks_reviews_every_appwrapper_and_reports_both_shares(results: dict[str, dict]) -> None:
    entry = results["throughput_webhooks"]
    n = entry["params"]["appwrappers"]
    assert entry["admitted_with_creator"] == {"off": 0, "on": n}
    assert {mode: phase["throughput"]["dispatched"] for mode, phase in entry["phases"].items()} == {"off": n, "on": n}
    assert {"share_of_ceiling_off_pct", "share_of_ceiling_on_pct", "on_over_off_pct"} <= set(entry["throughput"])
    # A mutating and a validating call per create, counted during the load.
    assert entry["phases"]["on"]["webhook_requests"]["total"] == 2 * n


def webhook_run(runs: dict[str, Path], name: str) -> tuple[Path, dict[str, Any]]:
    """The results file of one of the ``WEBHOOK_RUNS`` and its throughput_webhooks entry."""
    entry: dict[str, Any] = json.loads(runs[name].read_text())["scenarios"][0]
    return runs[name], entry


def test_throughput_with_the_creator_policy_in_alternating_rounds(runs: dict[str, Path]) -> None:
    """--webhook-creator policy --webhook-rounds 2: four fresh clusters (off, on, on, off); in the "on" ones the
    creator is recorded by the chart's MutatingAdmissionPolicy, with only the validating webhook registered, and
    every AppWrapper still carries it."""
    output, entry = webhook_run(runs, "creator_policy")
    n = entry["params"]["appwrappers"]
    assert (entry["params"]["creator"], entry["params"]["rounds"]) == ("policy", 2)
    assert entry["admitted_with_creator"] == {"off": 0, "on": n, "on-2": n, "off-2": 0}
    assert list(entry["phases"]) == ["off", "on", "on-2", "off-2"], "the second round runs on first"
    assert [sorted(r) for r in entry["rounds"]] == [["dispatched_per_s_off", "dispatched_per_s_on",
                                                     "on_over_off_pct", "pods_running_on_over_off_pct"]] * 2
    # The policy records the creator inside the API server: one webhook call per create, the validating one.
    for mode in ("on", "on-2"):
        assert entry["phases"][mode]["webhook_requests"]["total"] == n
    # Two pairs: the mean of their ratios and its 95 % interval, which test.perf.pairs pools the same way.
    for prefix in ("on_over_off", "pods_running_on_over_off"):
        low, high = entry["throughput"][f"{prefix}_95pct_interval"]
        assert low <= entry["throughput"][f"{prefix}_pairs_mean_pct"] <= high
    pooled = subprocess.run([sys.executable, "-m", "test.perf.pairs", str(output)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert pooled.returncode == 0, pooled.stderr
    assert "creator policy, dispatched: 2 pairs" in pooled.stdout, pooled.stdout
    assert "creator policy, pods running: 2 pairs" in pooled.stdout and "95 % interval" in pooled.stdout


def test_throughput_with_the_null_webhook_is_the_floor_and_judges_no_target(runs: dict[str, Path]) -> None:
    """--webhook-server null: the chart's configurations answered by the do-nothing Go server instead of the
    controller; every create reaches it (one validating call each, with the creator policy), the floor is
    reported with its note, and no target is judged on a figure that is not mcad's."""
    _, entry = webhook_run(runs, "null_webhook")
    n = entry["params"]["appwrappers"]
    assert entry["ok"] and entry["params"]["webhook_server"] == "null"
    assert entry["admitted_with_creator"] == {"off": 0, "on": n}
    on = entry["phases"]["on"]
    assert on["null_webhook"]["requests"] == n and on["webhook_requests"]["total"] == n
    assert on["null_webhook"]["connections"] >= 1
    assert on["cpu_seconds_until_dispatched"]["null webhook"] >= 0
    assert entry["targets"] == []
    assert any("the floor" in note for note in entry["notes"]), entry["notes"]
    assert "on_over_off_pct" in entry["throughput"]


def test_dashboard_queue_view_answers_every_poll_with_its_first_page(results: dict[str, dict]) -> None:
    entry = results["dashboard"]
    polls = entry["params"]["polls_each"]
    assert entry["page"]["total"] == entry["params"]["queued_appwrappers"]
    assert 0 < entry["page"]["rows"] <= entry["page"]["limit"]
    assert {name: figures["n"] for name, figures in entry["latency"].items()} == dict.fromkeys(
        ("first_page_polled_1_per_s", "first_page_back_to_back", "last_page_back_to_back",
         "first_page_round_trip_polled_1_per_s"), polls)
    assert entry["payload_bytes"]["first_page_max"] > 0


def test_scale_dispatches_nothing_twice_and_a_restart_rewrites_no_queued_status(results: dict[str, dict]) -> None:
    entry = results["scale"]
    restart = entry["restart"]
    assert restart["backlog_dispatched"] == 0
    assert restart["kept_probes_redispatched"] == 0
    assert restart["backlog_events_after_restart"] == 0, "the restarted controller wrote to the queued ones"
    # The probe's own create and its statuses; the backlog's own watch events (above) say none was for it.
    writes = restart["appwrapper_writes_after_restart"]
    assert writes.get("POST appwrappers.workload.codeflare.dev") == 1
    assert set(writes) <= {"POST appwrappers.workload.codeflare.dev",
                           "PATCH appwrappers.workload.codeflare.dev/status",
                           "PUT appwrappers.workload.codeflare.dev/status"}, writes
    assert entry["latency"]["new_appwrapper_create_to_running"]["n"] >= 10
    assert entry["reads"]["debug_queue_answers"].get("200", 0) > 0
    assert entry["reads"]["debug_queue_page_answers"].get("200", 0) > 0
    assert entry["restart"]["start_to_first_dispatch_s"] > 0
