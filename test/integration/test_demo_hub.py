"""`make demo-hub`, run as a user would: three local control planes come up, the walk-through ends 0 and shows
what docs/development.md promises (pinning, a gang that fits only in west, a gang no single worker holds), and
`make demo-hub-down` leaves none of the three clusters behind."""

from __future__ import annotations

import re
import subprocess

from test.support import REPO

CLUSTERS = ("demo-hub", "demo-east", "demo-west")


def make(target: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", target], cwd=REPO, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=timeout, check=False)


def test_demo_hub_dispatches_to_the_workers_and_tears_down() -> None:
    try:
        demo = make("demo-hub", timeout=900)
        out = demo.stdout
        assert demo.returncode == 0, out[-4000:]
        # kubectl get appwrappers -o wide, in the hub: where each one runs.
        assert re.search(r"^pinned-west\s+Running\b.*\bwest\b", out, re.MULTILINE), out[-4000:]
        assert re.search(r"^fits-only-west\s+Running\b.*\bwest\b", out, re.MULTILINE), out[-4000:]
        # Its pods exist in west only.
        assert re.search(r"^pod/fits-only-west-\S+\s+1/1\s+Running", out, re.MULTILINE), out[-4000:]
        assert "does not fit in any worker cluster: east: " in out
        # mcadctl clusters: both workers healthy, and at the end west holds the two placed AppWrappers.
        assert re.search(r"^east\s+Healthy\b", out, re.MULTILINE) and re.search(r"^west\s+Healthy\b.*\s2$", out,
                                                                                  re.MULTILINE), out[-4000:]
    finally:
        down = make("demo-hub-down", timeout=300)
    assert down.returncode == 0, down.stdout[-2000:]
    assert not [name for name in CLUSTERS if (REPO / ".dev" / "clusters" / name / "state.json").exists()]
    assert not (REPO / ".dev" / "demo-hub-controller.pid").exists()
