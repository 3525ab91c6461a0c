"""The bench's ``--tenants N`` (test/perf): its parsing, how it spreads AppWrappers over namespaces, and churn's
per-tenant fairness figures, on values in memory: no cluster."""

from __future__ import annotations

import pytest

from test.perf import bench, onoff
from test.perf.harness import NAMESPACE, Tracker, aw_collection_of, aw_path, jain_index, tenant_namespace
from test.perf.scenarios import (
    TENANT_SCENARIOS,
    Options,
    churn_body,
    churn_stream,
    tenant_fairness,
    throughput_tenant_body,
)


def test_tenants_default_to_one_and_are_passed_to_the_scenarios() -> None:
    assert bench.parse_args(["--scenarios", "throughput"]).tenants == 1
    args = bench.parse_args(["--scenarios", "churn,ceiling", "--tenants", "30"])
    assert args.tenants == 30
    opts = Options(tenants=args.tenants)
    assert opts.tenants_for("churn") == 30
    assert opts.tenants_for("ceiling") == 1  # only the scenarios that spread their AppWrappers
    assert set(TENANT_SCENARIOS) == {"throughput", "deep_queue", "churn"}


@pytest.mark.parametrize("argv", [["--tenants", "0", "--scenarios", "churn"],
                                  ["--tenants", "3", "--scenarios", "ceiling,restart"]])
def test_tenants_below_one_or_for_no_scenario_that_spreads_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_tenants_are_round_robin_with_tenant_zero_the_bench_namespace() -> None:
    assert [tenant_namespace(i, 3) for i in range(7)] == [
        NAMESPACE, f"{NAMESPACE}-t01", f"{NAMESPACE}-t02", NAMESPACE, f"{NAMESPACE}-t01", f"{NAMESPACE}-t02", NAMESPACE]
    assert {tenant_namespace(i, 1) for i in range(5)} == {NAMESPACE}
    assert len({tenant_namespace(q, 30) for q in range(30)}) == 30  # churn: one tenant per Kueue queue


def test_each_body_is_created_in_its_tenants_namespace() -> None:
    body = throughput_tenant_body(("tp-00004", "bench-t04"))
    assert body["metadata"] == {"name": "tp-00004", "namespace": "bench-t04"}
    assert aw_collection_of(body) == aw_path(namespace="bench-t04")
    churn = churn_body(("small-07-003", 50, 1, 0.2, "configmap", tenant_namespace(churn_stream("small-07-003"), 30)))
    assert churn["metadata"]["namespace"] == "bench-t07"
    assert aw_collection_of({"metadata": {"name": "x"}}) == aw_path()  # no namespace: the bench's
    assert aw_path(namespace=None).endswith("/appwrappers") and "/namespaces/" not in aw_path(namespace=None)


def test_jains_index_is_one_when_equal_and_one_over_n_when_one_has_everything() -> None:
    assert jain_index([2.0, 2.0, 2.0]) == 1.0
    assert jain_index([5.0, 0.0, 0.0, 0.0]) == 0.25
    assert jain_index([]) is None
    assert jain_index([0.0, 0.0]) is None


def test_fairness_gives_each_tenants_mean_wait_and_the_work_it_had_by_half_time() -> None:
    # Tenant a's two workloads dispatched at once, tenant b's 9 s later: b waited ten times longer, and by the time
    # half the work had been dispatched only a had any.
    plan = [(0.1, "small-00-000", "small", 1.0, 50, 1.0), (0.1, "small-00-001", "small", 1.0, 50, 1.0),
            (0.1, "small-01-000", "small", 1.0, 50, 1.0), (0.1, "small-01-001", "small", 1.0, 50, 1.0)]
    tracker = Tracker()
    for _, name, *_ in plan:
        tracker.created[name] = 0.0
    tracker.running.update({"small-00-000": 1.0, "small-00-001": 1.0, "small-01-000": 10.0, "small-01-001": 10.0})
    fair = tenant_fairness(plan, tracker, lambda name: tenant_namespace(churn_stream(name), 2))
    assert fair["tenants"] == 2
    assert fair["mean_wait_ms"] == {NAMESPACE: 1000.0, f"{NAMESPACE}-t01": 10000.0}
    assert fair["mean_wait_max_over_min"] == 10.0
    assert fair["work_at_half_min_cpu_s"] == 0.0 and fair["work_at_half_max_cpu_s"] == 2.0
    assert fair["work_at_half_jain"] == 0.5
    assert tenant_fairness(plan, Tracker(), lambda name: NAMESPACE) == {}  # nothing dispatched: no figures


def _run(argv: list[str], **throughput: float) -> dict:
    return {"argv": argv, "scenarios": [
        {"scenario": "throughput", "ok": True, "throughput": {"dispatched_per_s": throughput["rate"]},
         "cycles": {"count": 10, "mean_ms": throughput["cycle"]}},
        {"scenario": "deep_queue", "ok": False, "error": "BenchError: timed out"}]}


def test_onoff_pools_runs_by_the_flag_in_their_controller_args(capsys: pytest.CaptureFixture[str]) -> None:
    runs = [("off-1.json", _run(["--scenarios", "throughput"], rate=100.0, cycle=2.0)),
            ("on-1.json", _run(["--controller-args", "--fair-sharing --fair-sharing-configmap="], rate=90.0,
                               cycle=3.0)),
            ("on-2.json", _run(["--controller-args=--fair-sharing"], rate=94.0, cycle=3.0)),
            ("off-2.json", _run(["--controller-args", "--fair-sharing-half-life=1h"], rate=104.0, cycle=2.0))]
    table = onoff.pooled(runs, "--fair-sharing")
    assert set(table) == {"throughput"}  # deep_queue failed in every run: left out, and said so
    assert "deep_queue left out" in capsys.readouterr().err
    entry = table["throughput"]
    assert entry["off"] == ["off-1.json", "off-2.json"] and entry["on"] == ["on-1.json", "on-2.json"]
    rate = next(row for row in entry["rows"] if row["measure"] == "dispatched / s")
    assert (rate["off"], rate["on"]) == (102.0, 92.0)
    assert rate["on_over_off"] == pytest.approx(92 / 102)
    cycle = next(row for row in entry["rows"] if row["measure"] == "cycle mean ms")
    assert cycle["on_over_off"] == 1.5


def test_onoff_needs_runs_on_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    assert onoff.pooled([("on.json", _run(["--controller-args", "--fair-sharing"], rate=1.0, cycle=1.0))],
                        "--fair-sharing") == {}
    assert "no run off" in capsys.readouterr().err


def test_onoff_reads_a_mean_from_a_sum_and_a_count() -> None:
    result = {"dispatch_cycles": {"count": 4, "seconds": 0.1}, "wall_s": 12}
    assert onoff.dig(result, (("dispatch_cycles", "seconds"), ("dispatch_cycles", "count"))) == pytest.approx(25.0)
    assert onoff.dig(result, ("wall_s",)) == 12.0
    assert onoff.dig(result, ("fairness", "mean_wait_jain")) is None
    assert onoff.dig({"dispatch_cycles": {"count": 0, "seconds": 0.0}},
                     (("dispatch_cycles", "seconds"), ("dispatch_cycles", "count"))) is None
