"""The topology scenarios keep working: ``churn_tas`` and ``deep_queue_racks`` end to end at a tiny size.

Like test_bench_smoke.py (whose run leaves these opt-in scenarios out), not a performance test: no timing is
asserted. It checks what the scenarios rely on: churn_tas's nodes carry Kueue's block, rack and host labels, the
controller gets the three levels, every one of the nine classes is dispatched and nothing waits for ever under the
quota tree of Kueue's cohorts; deep_queue_racks runs a flat and a racks phase, the backlog is never dispatched or
rewritten, and both phases report their dispatch cycles, so the ratio the target is about exists.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test.perf import scenarios

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    output = tmp_path_factory.mktemp("bench") / "bench-results.json"
    # --scale 0.01: 10 nodes of Kueue's TAS layout (a host per rack) and the workload's smallest plan (one of
    # each of the nine workload sets per queue); deep_queue_racks with 100 queued on 50 nodes in 2 racks.
    proc = subprocess.run([sys.executable, "-m", "test.perf.bench", "--scale", "0.01", "--scenarios",
                           "churn_tas,deep_queue_racks", "--output", str(output)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    document = json.loads(output.read_text())
    return {entry["scenario"]: entry for entry in document["scenarios"]}


def test_churn_tas_dispatches_every_class_on_kueues_labels(results: dict[str, dict]) -> None:
    entry = results["churn_tas"]
    assert entry["ok"], entry.get("error")
    params = entry["params"]
    assert params["nodes"] == 10 and params["capacity_cpu"] == scenarios.TAS_QUOTA_CPU
    for _, _, label in scenarios.TAS_LEVELS:
        assert f"--topology-level {label}" in params["controller_args"]
    for cls in scenarios.TAS_CLASSES:
        assert entry["per_class"][cls.name]["n"] == scenarios.KUEUE_QUEUES, cls.name
    assert entry["latency"]["time_to_dispatch_all"]["n"] == params["workloads"]


def test_tas_nodes_are_labelled_as_kueues_generator_labels_them() -> None:
    names, labels = scenarios.tas_nodes()
    assert len(names) == 640 and names[0] == "node-b0-r0-n0" and names[-1] == "node-b0-r9-n63"
    assert labels[70] == {"tas-node-group": "tas", scenarios.TAS_BLOCK_LABEL: "block-0",
                          scenarios.TAS_RACK_LABEL: "rack-1", scenarios.TAS_HOST_LABEL: "node-6"}


def test_deep_queue_racks_measures_both_phases(results: dict[str, dict]) -> None:
    entry = results["deep_queue_racks"]
    assert entry["ok"], entry.get("error")
    for topology in ("flat", "racks"):
        phase = entry["phases"][topology]
        assert phase["params"]["topology"] == topology and phase["params"]["racks"] == 2
        assert phase["backlog"]["dispatched"] == 0 and phase["backlog"]["events_during_probes"] == 0
        assert phase["latency"]["new_cpu_appwrapper"]["n"] >= 10
        assert phase["cycles"]["count"] > 0
    assert entry["cycles"]["racks_over_flat"] is not None
