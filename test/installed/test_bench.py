"""`make bench-installed` runs against the installation and a local process and writes what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test.installed.conftest import Installation
from test.support import REPO

pytestmark = pytest.mark.this_machine


def test_the_installed_bench_measures_both_sides(installation: Installation, tmp_path: Path) -> None:
    output = tmp_path / "installed.json"
    proc = subprocess.run([sys.executable, "-m", "test.perf.installed", "--seconds", "2", "--threads", "1",
                           "--output", str(output)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(output.read_text())
    assert len(result["installed"]["pod_start_to_ready_s"]) == 2
    for side in ("installed", "local_process"):
        admission = result[side]["admission"]
        assert admission["requests"] > 0 and admission["refused"] == 0, admission
        assert admission["latency"]["p99_ms"] >= admission["latency"]["p50_ms"] > 0
    assert "p50" in proc.stderr and "local_process" in proc.stderr
