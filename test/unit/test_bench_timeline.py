"""``test.perf.timeline``: churn's per-workload times, and the cpu each class held and how many of it waited."""

from __future__ import annotations

from pathlib import Path

import pytest

from test.perf import timeline


def two_workloads() -> list[timeline.Row]:
    # A large one created at 1 s, Running at 3 s, finished at 4 s; a small one created at 0.5 s, Running at once,
    # finished at 1.5 s; a third never created (the load failed before it).
    spec = {"large-00-000": ("large", 20.0), "small-00-000": ("small", 1.0), "small-00-001": ("small", 1.0)}
    t0 = 100.0
    return timeline.rows(spec, {"large-00-000": 101.0, "small-00-000": 100.5},
                         {"large-00-000": 103.0, "small-00-000": 100.5}, {"large-00-000": 104.0, "small-00-000": 101.5},
                         t0)


def test_rows_are_in_creation_order_in_seconds_from_the_start_and_a_missing_time_is_none() -> None:
    rows = two_workloads()
    assert [(r.name, r.created, r.running, r.finished) for r in rows] == [
        ("small-00-000", 0.5, 0.5, 1.5), ("large-00-000", 1.0, 3.0, 4.0), ("small-00-001", None, None, None)]


def test_a_written_timeline_reads_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "churn-timeline.jsonl"
    timeline.write(path, two_workloads())
    assert timeline.read(path) == two_workloads()


def test_samples_say_what_each_class_held_and_how_many_of_it_waited() -> None:
    found = {sample.at: sample for sample in timeline.samples(two_workloads(), 1.0)}
    assert sorted(found) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert (found[1.0].held_cpu, found[1.0].waiting) == ({"large": 0.0, "small": 1.0}, {"large": 1, "small": 0})
    assert (found[2.0].held_cpu, found[2.0].waiting) == ({"large": 0.0, "small": 0.0}, {"large": 1, "small": 0})
    assert (found[3.0].held_cpu, found[3.0].waiting) == ({"large": 20.0, "small": 0.0}, {"large": 0, "small": 0})
    assert found[4.0].held_cpu == {"large": 0.0, "small": 0.0}, "finished at 4 s: no longer held at 4 s"


def test_a_step_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        timeline.samples(two_workloads(), 0)


def test_the_command_names_the_line_that_is_not_a_row_and_exits_2(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    timeline.write(path, two_workloads())
    path.write_text(path.read_text() + "{\"name\": \"x\"}\n")
    assert timeline.main([str(path)]) == 2
    assert f"{path}:4: not a timeline row" in capsys.readouterr().err


def test_the_command_prints_a_line_per_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    timeline.write(path, two_workloads())
    assert timeline.main([str(path), "--step", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 3  # the header, then 0, 2 and 4 s
    assert lines[2].split()[:3] == ["2.0", "0", "0"]
