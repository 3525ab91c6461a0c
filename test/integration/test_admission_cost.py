"""``python -m test.perf.admission_cost`` keeps working: at a tiny size it measures every piece and reports a figure
for each. The script itself fails the run when the chart's creator policy did not record the creator (so a figure
"with the policy" would be one without it), when a create of the validating variant did not reach the webhook server,
or when a status write went to the webhook the status rule should skip (its URL is a closed port); this test sees
that as a non-zero exit. No figure is asserted: at this size they mean
nothing, and timings are never tested."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_admission_cost_measures_every_piece(tmp_path: Path) -> None:
    output = tmp_path / "admission-cost.json"
    proc = subprocess.run([sys.executable, "-m", "test.perf.admission_cost", "--requests", "20", "--rounds", "1",
                           "--threads", "4", "--output", str(output)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(output.read_text())
    assert sorted(figures["ms_per_request"]) == ["create/creator-policy", "create/none", "create/validating-call",
                                                 "status/none", "status/status-rule"]
    assert sorted(figures["added_ms_per_request"]) == ["creator-policy", "status-rule", "validating-call"]
    for name, rounds in figures["rounds"].items():
        assert len(rounds) == 1, name
        assert rounds[0]["apiserver_cpu_s"] > 0, name
    assert "creator-policy adds" in proc.stdout
