"""test/perf's pooling of webhooks off/on pairs (test.perf.pairs) and the interval it quotes
(test.perf.harness.mean_interval), on hand-made results files: no cluster."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from test.perf import pairs
from test.perf.harness import mean_interval


def test_mean_interval_is_students_t_and_needs_two_values() -> None:
    assert mean_interval([]) is None and mean_interval([90.0]) is None
    mean, low, high = mean_interval([88.0, 92.0])  # type: ignore[misc]
    # sd 2.828, n 2, t(0.975, 1) 12.706: half-width 12.706 * 2.828 / 1.414 = 25.41
    assert mean == 90.0 and (low, high) == pytest.approx((64.59, 115.41), abs=0.01)
    mean, low, high = mean_interval([90.0] * 40)  # type: ignore[misc]
    assert (mean, low, high) == (90.0, 90.0, 90.0)
    values = [82.5, 94.1, 85.0, 88.1, 92.7, 87.4, 96.0]
    mean, low, high = mean_interval(values)  # type: ignore[misc]
    assert mean == pytest.approx(89.4, abs=0.05) and (low, high) == pytest.approx((84.79, 94.01), abs=0.01)


def phase(rate: float, pods: float | None) -> dict[str, Any]:
    return {"throughput": {"dispatched_per_s": rate, **({"pods_running_per_s": pods} if pods else {})}}


def run(creator: str, rates: dict[str, float], ok: bool = True, pods: dict[str, float] | None = None,
        server: str | None = None) -> dict[str, Any]:
    params = {"creator": creator, **({"webhook_server": server} if server else {})}
    return {"scenarios": [{"scenario": "throughput_webhooks", "ok": ok, "params": params,
                           "phases": {name: phase(rate, (pods or {}).get(name)) for name, rate in rates.items()}}]}


def test_pairs_are_matched_by_suffix_and_a_lone_or_failed_phase_is_left_out() -> None:
    found = pairs.pairs_of(run("policy", {"off": 100.0, "on": 90.0, "on-2": 95.0, "off-2": 100.0, "off-3": 99.0}),
                           "a.json")
    assert [(p.source, p.off, p.on) for p in found] == [("a.json on", 100.0, 90.0), ("a.json on-2", 100.0, 95.0)]
    assert [p.ratio_pct for p in found] == [90.0, 95.0]
    assert pairs.pairs_of(run("policy", {"off": 100.0, "on": 90.0}, ok=False), "b.json") == []
    assert pairs.pairs_of({"scenarios": [{"scenario": "throughput", "ok": True}]}, "c.json") == []


def test_the_verdict_says_met_only_when_the_whole_interval_clears_the_target() -> None:
    assert pairs.verdict(90.5, 95.0) == "met"
    assert pairs.verdict(80.0, 89.9) == "missed"
    assert pairs.verdict(85.0, 93.0).startswith("not shown")


def test_the_command_pools_files_keeps_creators_apart_and_names_what_it_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p1.json").write_text(json.dumps(run("policy", {"off": 100.0, "on": 91.0},
                                                     pods={"off": 50.0, "on": 48.0})))
    (tmp_path / "p2.json").write_text(json.dumps(run("policy", {"off": 100.0, "on": 93.0, "on-2": 95.0,
                                                                "off-2": 100.0},
                                                     pods={"off": 50.0, "on": 47.0, "on-2": 46.0, "off-2": 50.0})))
    (tmp_path / "w.json").write_text(json.dumps(run("webhook", {"off": 100.0, "on": 80.0})))
    (tmp_path / "broken.json").write_text("{")
    files = [str(tmp_path / name) for name in ("p1.json", "p2.json", "w.json", "broken.json")]
    assert pairs.main(files) == 0
    out, err = capsys.readouterr()
    assert "broken.json: left out" in err
    assert ("creator policy, dispatched: 3 pairs, off 100.0/s, on 93.0/s, ratio of means 93.0 %; "
            "mean of ratios 93.0 %") in out
    assert "creator policy, pods running: 3 pairs, off 50.0/s, on 47.0/s, ratio of means 94.0 %" in out
    assert "creator webhook, dispatched: 1 pairs, off 100.0/s, on 80.0/s, ratio of means 80.0 %" in out
    assert "creator webhook, pods running" not in out, "a run from before the end-to-end rate was recorded"
    assert pairs.main([*files, "--creator", "webhook"]) == 0
    assert "creator policy" not in capsys.readouterr().out
    assert pairs.main([str(tmp_path / "broken.json")]) == 1


def test_the_report_prints_every_pair(capsys: pytest.CaptureFixture[str]) -> None:
    buffer = io.StringIO()
    pairs.report([pairs.Pair("x.json on", "policy", 120.0, 108.0, 50.0, 46.0)], out=buffer)
    lines = buffer.getvalue().splitlines()
    assert lines[1].split() == ["x.json", "on", "policy", "mcad", "120.0", "108.0", "90.0", "92.0"]
    assert lines[2] == "creator policy, dispatched: 1 pairs, off 120.0/s, on 108.0/s, ratio of means 90.0 %"
    assert lines[3] == "creator policy, pods running: 1 pairs, off 50.0/s, on 46.0/s, ratio of means 92.0 %"


def test_a_null_webhooks_pairs_are_the_floor_pooled_apart_and_never_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--webhook-server null answers with a do-nothing server: its pairs must not be pooled into mcad's figure, nor
    say that the target is met."""
    (tmp_path / "mcad.json").write_text(json.dumps(run("policy", {"off": 100.0, "on": 80.0, "on-2": 82.0,
                                                                  "off-2": 100.0})))
    (tmp_path / "null.json").write_text(json.dumps(run("policy", {"off": 100.0, "on": 97.0, "on-2": 98.0,
                                                                  "off-2": 100.0}, server="null")))
    assert pairs.main([str(tmp_path / "mcad.json"), str(tmp_path / "null.json")]) == 0
    out = capsys.readouterr().out
    mcad_line = next(line for line in out.splitlines() if line.startswith("creator policy, dispatched"))
    null_line = next(line for line in out.splitlines() if line.startswith("creator policy, server null, dispatched"))
    assert "2 pairs" in mcad_line and "ratio of means 81.0 %" in mcad_line and "target >= 90 %" in mcad_line
    assert "2 pairs" in null_line and "ratio of means 97.5 %" in null_line
    assert "the floor (no target judged)" in null_line and "target >=" not in null_line
    assert [p.server for p in pairs.pairs_of(json.loads((tmp_path / "null.json").read_text()), "n")] == ["null"] * 2
