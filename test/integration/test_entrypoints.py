"""The console scripts work against a real API server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from mcad.cli import mcadctl

BIN = Path(sys.executable).parent


def test_controller_connects_and_logs_the_server_version(kubeconfig: str, crd: None) -> None:
    proc = subprocess.run([str(BIN / "mcad-controller"), "--kubeconfig", kubeconfig, "--connect-only"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    event = json.loads(proc.stderr.strip().splitlines()[-1])
    assert event["event"] == "connected"
    assert event["server_version"].startswith("v1.")


def test_mcadctl_version_shows_the_server(kubeconfig: str) -> None:
    result = CliRunner().invoke(mcadctl.main, ["--kubeconfig", kubeconfig, "version"])
    assert result.exit_code == 0, result.output
    assert "kubernetes server: v1." in result.output
