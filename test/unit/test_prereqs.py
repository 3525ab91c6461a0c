"""hack/prereqs.sh, which `make test`, `make demo` and the other targets run first: with a tool missing it says in one
line what to install and exits 1 before anything is built or started; with everything there it is silent.

Each case runs the script with a PATH made for it: links to every program of this machine's PATH except the ones the
case removes, plus stubs standing in for Go and openssl (so the cases hold on any machine, with or without them), an
empty binary cache (so Go is needed) unless a case says otherwise, and stand-ins for chromium and chromedriver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test.support import REPO

SCRIPT = REPO / "hack" / "prereqs.sh"


def stub(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def machine(tmp_path: Path, *, without: tuple[str, ...] = (), go_version: str = "go1.26.0") -> dict[str, str]:
    """The environment of a machine that has everything (stubs for Go, openssl, chromium and chromedriver, this
    Python), less the programs named in ``without``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not Path(directory).is_dir():
            continue
        for program in Path(directory).iterdir():
            target = bin_dir / program.name
            if program.name in without or target.exists() or target.is_symlink():
                continue
            if os.access(program, os.X_OK) and not program.is_dir():
                target.symlink_to(program)
    for name, body in (("go", f'[ "$1 $2" = "env GOVERSION" ] && echo {go_version}'), ("openssl", "exit 0")):
        (bin_dir / name).unlink(missing_ok=True)
        if name not in without:
            stub(bin_dir / name, body)
    browser = tmp_path / "browser"
    browser.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCAD_")}
    return {**env, "PATH": str(bin_dir), "PYTHON": sys.executable, "MCAD_DEV_CACHE": str(tmp_path / "empty-cache"),
            "MCAD_CHROMIUM": str(stub(browser / "chromium", "exit 0")),
            "MCAD_CHROMEDRIVER": str(stub(browser / "chromedriver", "exit 0"))}


def prereqs(target: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), target], env=env, cwd=REPO, text=True, capture_output=True,
                          timeout=60, check=False)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("target", ["install", "unit", "tools", "cluster", "demo", "demo-hub", "test", "screenshots",
                                    "bench"])
def test_a_machine_with_everything_passes_silently(tmp_path: Path, target: str) -> None:
    result = prereqs(target, machine(tmp_path))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_make_test_without_chromium_says_what_to_install_at_once(tmp_path: Path) -> None:
    env = machine(tmp_path)
    env["MCAD_CHROMIUM"] = str(tmp_path / "no" / "chromium")
    env["MCAD_CHROMEDRIVER"] = str(tmp_path / "no" / "chromedriver")
    line = one_error_line(prereqs("test", env))
    assert line.startswith("error: make test needs what this machine lacks: chromium chromium-driver ")
    assert "apt-get install --no-install-recommends chromium chromium-driver" in line
    # The demo has no browser tests: it needs neither.
    assert prereqs("demo", env).returncode == 0


def test_a_path_without_openssl_is_named_for_the_cluster_targets_only(tmp_path: Path) -> None:
    env = machine(tmp_path, without=("openssl",))
    for target in ("demo", "test", "cluster"):
        line = one_error_line(prereqs(target, env))
        assert f"error: make {target} needs" in line and "openssl (" in line and "apt-get install openssl" in line
    assert prereqs("unit", env).returncode == 0


def test_go_is_needed_only_while_the_binaries_are_not_built(tmp_path: Path) -> None:
    env = machine(tmp_path, without=("go",))
    line = one_error_line(prereqs("demo", env))
    assert "Go >= 1.26" in line and "https://go.dev/dl" in line
    # Every missing thing goes on the same line.
    env["MCAD_CHROMIUM"] = str(tmp_path / "no" / "chromium")
    line = one_error_line(prereqs("test", env))
    assert "Go >= 1.26" in line and "chromium" in line

    old = machine(tmp_path / "old", go_version="go1.22.5")
    assert "found go1.22.5" in one_error_line(prereqs("tools", old))


def test_with_the_binaries_built_go_is_not_asked_for(tmp_path: Path) -> None:
    built = subprocess.run([str(REPO / "hack" / "build-tools.sh"), "--print"], capture_output=True, timeout=60,
                           check=False)
    if built.returncode != 0:
        pytest.skip("the pinned Kubernetes binaries are not built on this machine (make tools)")
    env = machine(tmp_path, without=("go",))
    env["MCAD_DEV_CACHE"] = os.environ.get("MCAD_DEV_CACHE", str(Path.home() / ".cache" / "mcad-dev"))
    result = prereqs("demo", env)
    assert (result.returncode, result.stderr) == (0, "")


def test_a_python_too_old_or_missing_is_named(tmp_path: Path) -> None:
    env = machine(tmp_path)
    env["PYTHON"] = str(stub(tmp_path / "python3.9", "echo 3.9"))
    assert "Python >= 3.11 (" in one_error_line(prereqs("install", env))
    assert "is 3.9" in one_error_line(prereqs("unit", env))
    env["PYTHON"] = "no-such-python"
    assert "no-such-python not found" in one_error_line(prereqs("test", env))


def test_an_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    result = prereqs("everything", machine(tmp_path))
    assert result.returncode == 2 and "usage:" in result.stderr


@pytest.mark.parametrize("target", ["install", "unit", "tools", "cluster", "demo", "demo-hub", "test", "screenshots",
                                    "bench"])
def test_the_makefile_checks_first(target: str) -> None:
    """Make runs a target's prerequisites in the order listed: the check comes before the venv, the binaries and the
    cluster."""
    rule = next((line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith(f"{target}:")), "")
    assert rule.split("##")[0].split(":", 1)[1].split()[:1] == [f"prereqs-{target}"], rule


def test_make_runs_the_check_with_its_python(tmp_path: Path) -> None:
    env = machine(tmp_path)
    env["MCAD_CHROMIUM"] = str(tmp_path / "no" / "chromium")
    result = subprocess.run(["make", "--no-print-directory", "prereqs-test", "PYTHON=no-such-python"], cwd=REPO,
                            env=env, text=True, capture_output=True, timeout=60, check=False)
    assert result.returncode != 0
    line = result.stderr.splitlines()[0]
    assert line.startswith("error: make test needs") and "no-such-python not found" in line and "chromium" in line
