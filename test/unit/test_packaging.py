"""The packaging metadata (setup.cfg; the build system in pyproject.toml) builds an sdist and a wheel without a single
warning from the build backend:
`make install` must not print setuptools deprecation warnings (a ``License ::`` classifier caused some 40). The
build runs offline, in a copy of what the Dockerfile copies, with the venv's setuptools (the test extra pins it to the
same floor as [build-system]) and every warning turned into an error."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from test.support import REPO

# One hook per process, as a build frontend calls them (setuptools keeps state between hooks in one process).
BUILD = """
import sys
import setuptools
import setuptools.build_meta as backend

if int(setuptools.__version__.split(".")[0]) < 77:
    sys.exit(f"setuptools {setuptools.__version__} is older than [build-system] asks (>=77): run make install")
print("built:", getattr(backend, sys.argv[1])(sys.argv[2]))
"""


def build(hook: str, source: Path, dist: Path) -> str:
    """Run the backend's ``hook`` (build_sdist, build_wheel) with every warning an error; the file it built."""
    run = subprocess.run([sys.executable, "-W", "error", "-c", BUILD, hook, str(dist)], cwd=source, text=True,
                         capture_output=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-6000:]
    assert "Warning" not in run.stderr, run.stderr[-6000:]
    return run.stdout.splitlines()[-1].removeprefix("built: ")


def test_sdist_and_wheel_build_without_warnings_and_carry_an_spdx_license(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "mcad", source / "mcad", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    dist.mkdir()
    sdist, wheel = build("build_sdist", source, dist), build("build_wheel", source, dist)
    assert sdist.endswith(".tar.gz") and wheel.endswith(".whl"), (sdist, wheel)

    with zipfile.ZipFile(dist / wheel) as archive:
        names = archive.namelist()
        metadata = email.message_from_bytes(archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
    assert metadata["License-Expression"] == "Apache-2.0"
    assert not [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    # What the controller needs at run time is in the wheel: the dashboard's page and both commands.
    assert {"mcad/ui/index.html", "mcad/ui/app.js", "mcad/ui/app.css", "mcad/ui/icon.svg"} <= set(names)
    entry_points = archive_text(dist / wheel, ".dist-info/entry_points.txt")
    assert "mcad-controller = mcad.cli.controller:main" in entry_points
    assert "mcadctl = mcad.cli.mcadctl:main" in entry_points


def archive_text(wheel: Path, suffix: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith(suffix))).decode()
