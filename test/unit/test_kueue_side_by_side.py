"""test/perf/kueue.py without Go or a cluster: its parser and table on a recorded run, its config scaling, and the
pin. The fixture (test/unit/fixtures/kueue/) is a real run of Kueue v0.17.0's scheduler test at 1/50 of its baseline
and of churn at the same size, taken together by ``python -m test.perf.kueue --fraction 0.02 --with-churn``;
runner.log keeps only the lines the parser reads (the generator's and minimalkueue's end), run.json's paths are
shortened to OUT and CACHE."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from test.perf import kueue
from test.support import REPO

FIXTURE = Path(__file__).parent / "fixtures" / "kueue"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    out = tmp_path / "kueue-v0.17.0"
    shutil.copytree(FIXTURE, out)
    return out


def test_the_pin_the_cache_key_and_the_recorded_run_agree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MCAD_DEV_CACHE", raising=False)
    assert kueue.cache_dir(kueue.KUEUE_VERSION) == Path.home() / ".cache" / "mcad-dev" / f"kueue-{kueue.KUEUE_VERSION}"
    monkeypatch.setenv("MCAD_DEV_CACHE", str(tmp_path))
    assert kueue.cache_dir("v9.9.9") == tmp_path / "kueue-v9.9.9"
    # A new pin needs a new recorded run: the fixture says which version made it.
    assert json.loads((FIXTURE / "run.json").read_text())["version"] == kueue.KUEUE_VERSION
    assert kueue.parse_args([]).kueue_version == kueue.KUEUE_VERSION
    # The make target passes no version of its own.
    assert "--kueue-version" not in (REPO / "Makefile").read_text()


def test_the_summary_per_class_and_its_percentiles(run_dir: Path) -> None:
    figures = kueue.parse_kueue(run_dir)
    summary = yaml.safe_load((FIXTURE / "summary.yaml").read_text())["workloadClasses"]
    assert figures.version == "v0.17.0" and figures.fraction == 0.02
    assert {name: c["count"] for name, c in figures.classes.items()} == {"small": 210, "medium": 60, "large": 30}
    for name, cls in figures.classes.items():
        assert cls["n"] == cls["count"]
        # The summary divides integer milliseconds; the mean over wlStates.csv agrees within that.
        assert abs(cls["mean_ms"] - summary[name]["averageTimeToAdmissionMs"]) < 1
        assert cls["p50_ms"] <= cls["p90_ms"] <= cls["p99_ms"] <= cls["max_ms"]
        assert cls["evictions"] == summary[name]["totalEvictions"]
    assert figures.evictions == sum(c["totalEvictions"] for c in summary.values())
    assert figures.minimalkueue == {"wall_s": 9.125, "cpu_s": 1.342, "peak_rss_mib": 64.5}
    # 30 queues x 3 workload sets, every one matched to its count by its interval.
    assert figures.generator_lateness["sets"] == 90 == figures.generator_lateness["n"]
    assert 0 < figures.generator_lateness["mean_ms"] < figures.generator_lateness["max_ms"]
    by_class = figures.generator_lateness["by_class"]
    assert [by_class[c]["n"] for c in kueue.CLASSES] == [30, 30, 30]
    assert max(c["max_ms"] for c in by_class.values()) == figures.generator_lateness["max_ms"]


def test_a_run_without_a_log_has_no_lateness(run_dir: Path) -> None:
    (run_dir / "runner.log").unlink()
    assert kueue.parse_kueue(run_dir).generator_lateness == {}


def test_lateness_is_the_last_create_against_count_intervals() -> None:
    config = {"cohorts": [{"queuesSets": [{"workloadsSets": [
        {"count": 10, "creationIntervalMs": 100, "workloads": [{"className": "small"}]},
        {"count": 4, "creationIntervalMs": 1200, "workloads": [{"className": "large"}]}]}]}]}

    def line(stamp: str, what: str, delay: str, ns: str = "q") -> str:
        return (f'2026-01-01T00:00:{stamp}Z\tINFO\tgenerate workload group\tgenerator/generator.go:137\t{what} '
                f'generation\t{{"namespace": "{ns}", "localQueue": "{ns}", "delay": "{delay}"}}')

    log = "\n".join([line("00.000000001", "Start", "100ms"), line("00.5", "Start", "1.2s"),
                     line("01.250", "End", "100ms"), line("05.800", "End", "1.2s"),
                     line("00.0", "Start", "100ms", "other")])  # never ended: no lateness
    timings = {(t.namespace, t.class_name): t for t in kueue.set_timings(log, config)}
    assert timings[("q", "small")].lateness_ms == pytest.approx(250, abs=0.01)
    assert timings[("q", "large")].lateness_ms == pytest.approx(500, abs=0.01)
    assert timings[("other", "small")].lateness_ms is None
    # Two sets of one queue with one interval cannot be told apart in the log: both are left out.
    config["cohorts"][0]["queuesSets"][0]["workloadsSets"][1]["creationIntervalMs"] = 100
    assert kueue.set_timings(log, config) == []


@pytest.mark.parametrize(("text", "ms"), [("100ms", 100), ("1.2s", 1200), ("1m0s", 60_000), ("1m2.5s", 62_500)])
def test_go_durations(text: str, ms: float) -> None:
    assert kueue._duration_ms(text) == pytest.approx(ms)


def test_scaling_keeps_the_queues_and_scales_the_sets() -> None:
    baseline = yaml.safe_load((FIXTURE / "generator.yaml").read_text())
    before = json.dumps(baseline)
    half = kueue.scaled_config(baseline, 0.5)
    assert json.dumps(baseline) == before
    counts = [s["count"] for c in half["cohorts"] for q in c["queuesSets"] for s in q["workloadsSets"]]
    assert counts == [4, 1, 1]  # the fixture's 7, 2, 1 (the baseline's 350, 100, 50 at 1/50): never below 1
    assert half["cohorts"][0]["count"] == 5 and half["cohorts"][0]["queuesSets"][0]["count"] == 6
    assert kueue.scaled_config(baseline, 1.0) == baseline


def test_the_table_puts_both_side_by_side(run_dir: Path) -> None:
    churn = kueue.parse_churn(FIXTURE / "churn.json")
    text = kueue.table(kueue.parse_kueue(run_dir), churn)
    lines = text.splitlines()
    assert "Kueue v0.17.0 x0.02" in lines[0] and "mcad churn x0.02" in lines[0]
    small = next(x for x in lines if x.startswith("small: wait"))
    assert "1.8 / 1.1 / 3.9 / 4.5" in small and "0.6 / 0.6 / 1.0 / 1.4" in small
    assert any(x.startswith("wall s") and "9.1" in x and "6.2" in x for x in lines)
    assert any(x.startswith("controller peak RSS MiB") and " 64 " in x for x in lines)
    assert any(x.startswith("small: create lateness") and "each set's last create: " in x for x in lines)
    arrival = next(x for x in lines if x.startswith("large: from scheduled arrival"))
    assert "not recorded" in arrival and "3.1 / 3.1 / 4.0 / 4.0" in arrival
    # Either side alone still renders, '-' where the other would be.
    assert "churn (not run)" in kueue.table(kueue.parse_kueue(run_dir), None)
    assert "Kueue (not run)" in kueue.table(None, churn)


def test_churn_results_must_hold_a_finished_churn(tmp_path: Path) -> None:
    data = json.loads((FIXTURE / "churn.json").read_text())
    data["scenarios"][0]["ok"] = False
    data["scenarios"][0]["error"] = "BenchError: late"
    (tmp_path / "failed.json").write_text(json.dumps(data))
    with pytest.raises(kueue.KueueError, match="late"):
        kueue.parse_churn(tmp_path / "failed.json")
    data["scenarios"] = []
    (tmp_path / "none.json").write_text(json.dumps(data))
    with pytest.raises(kueue.KueueError, match="no churn"):
        kueue.parse_churn(tmp_path / "none.json")


def test_main_reads_a_past_run_and_churn_from_a_results_file(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = run_dir.parent
    argv = ["--skip-kueue", "--output", str(output), "--churn-results", str(FIXTURE / "churn.json")]
    assert kueue.main(argv) == 0
    printed = capsys.readouterr().out
    assert "Kueue v0.17.0 x0.02" in printed and "mcad churn x0.02" in printed
    assert (output / "side-by-side.txt").read_text().strip() == printed.strip()
    # A churn side that cannot be read still prints Kueue's figures, and the exit says something was missing.
    assert kueue.main([*argv[:-1], str(output / "missing.json")]) == 1
    assert "churn (not run)" in capsys.readouterr().out


def test_sets_of_one_size_at_one_interval_are_paired_by_length() -> None:
    """Kueue's TAS config runs three small sets at 100 ms in each queue: the log cannot name them, so the one of
    fewest creates takes the earliest end."""
    config = {"cohorts": [{"queuesSets": [{"workloadsSets": [
        {"count": 3, "creationIntervalMs": 100, "workloads": [{"className": "small-required-rack"}]},
        {"count": 3, "creationIntervalMs": 100, "workloads": [{"className": "small-preferred-rack"}]},
        {"count": 2, "creationIntervalMs": 100, "workloads": [{"className": "small-balanced-rack"}]}]}]}]}

    def line(stamp: str, what: str) -> str:
        return (f'2026-01-01T00:00:{stamp}Z\tINFO\tgenerate workload group\tgenerator/generator.go:137\t{what} '
                'generation\t{"namespace": "q", "localQueue": "q", "delay": "100ms"}')

    log = "\n".join([line("00.0", "Start")] * 3 + [line("00.40", "End"), line("00.25", "End"), line("00.35", "End")])
    timings = kueue.set_timings(log, config)
    assert sorted((t.count, round(t.lateness_ms or 0)) for t in timings) == [(2, 50), (3, 50), (3, 100)]
    assert {t.class_name for t in timings} == {"small"}
    # One set still running: none of the three can be told its end.
    unfinished = "\n".join([line("00.0", "Start")] * 3 + [line("00.25", "End"), line("00.35", "End")])
    assert [t.lateness_ms for t in kueue.set_timings(unfinished, config)] == [None, None, None]


def test_the_tas_table_has_a_row_per_class_grouped_by_size() -> None:
    latency = {f"time_to_dispatch_{size}-{ask}-rack": {"n": 1, "mean_ms": 1000.0, "p50_ms": 1000.0,
                                                       "p90_ms": 1000.0, "p99_ms": 1000.0}
               for size in kueue.CLASSES for ask in ("required", "preferred", "balanced")}
    churn = {"scenario": "churn_tas", "churn_fraction": 0.1, "commit": "abc", "params": {"workloads": 9},
             "latency": latency, "per_class": {name.removeprefix("time_to_dispatch_"): {} for name in latency},
             "wall_s": 1.0, "controller": {}, "decisions": {"preempted": 3}}
    lines = kueue.table(None, churn).splitlines()
    assert "mcad churn_tas x0.1" in lines[0]
    waits = [x.split(":")[0] for x in lines if ": wait mean" in x]
    assert waits == [f"{size}-{ask}-rack" for size in kueue.CLASSES for ask in ("required", "preferred", "balanced")]
    assert all("1.0 / 1.0 / 1.0 / 1.0" in x for x in lines if ": wait mean" in x)
