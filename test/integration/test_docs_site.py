"""The documentation site (mkdocs.yml, `make docs`) builds with ``mkdocs build --strict``: every page of the nav
exists, every link and anchor resolves, and the links GitHub follows out of docs/ (``../README.md``,
``../test/perf/README.md``) work in the site too (hack/mkdocs_hooks.py copies their targets under ``repo/``).

The tests on a small site of their own show the strict build failing on a broken link inside docs/, a missing
anchor, a missing file outside docs/ and a directory outside docs/ with no README: exempting links that leave docs/
must not exempt anything else."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from test.support import REPO, write_tree


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.fail("mkdocs is not installed in this environment: `make install` installs the docs extra")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, text=True, capture_output=True, timeout=120,
                          check=False)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    build = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert build.returncode == 0, build.stderr[-8000:]
    assert (tmp_path / "site" / "index.html").is_file()
    # The README and the bench README, which docs/ pages link to, are pages of the site.
    assert (tmp_path / "site" / "repo" / "index.html").is_file()
    assert (tmp_path / "site" / "repo" / "test" / "perf" / "index.html").is_file()


def test_every_docs_page_is_in_the_nav() -> None:
    """A page left out of the nav is reachable only by a link: the strict build warns (omitted_files: warn), and
    this says which pages at once."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def entries(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, Mapping):
            return [uri for value in nav.values() for uri in entries(value)]
        if isinstance(nav, list):
            return [uri for item in nav for uri in entries(item)]
        return []

    listed = set(entries(config["nav"]))
    pages = {path.relative_to(REPO / "docs").as_posix() for path in (REPO / "docs").rglob("*.md")}
    assert pages - listed == set(), "docs pages missing from mkdocs.yml's nav"


# --- A small site of its own, to show the strict build failing -------------------------------------------------

GOOD = {
    "README.md": "# Project\n\nSee [the docs](docs/README.md) and [a page](docs/a.md#fit-per-node).\n",
    "charts/values.yaml": "replicas: 2\n",
    "tools/README.md": "# Tools\n\nBack to [the docs](../docs/a.md).\n",
    "docs/README.md": "# Docs\n\n[Top](../README.md), [values](../charts/values.yaml), [tools](../tools/),\n"
                      "[a](a.md#churn-with-real-pods---churn-pods-binding), `[code](../nowhere.md)`.\n",
    "docs/a.md": "# A\n\n## Fit: per node\n\n## Churn with real pods (`--churn-pods`, binding)\n\n"
                 "[home](README.md#docs)\n",
}


def small_site(tmp_path: Path, pages: Mapping[str, str]) -> Path:
    root = write_tree(tmp_path / "repo", pages)
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config["nav"] = [{"Docs": "README.md"}, {"A": "a.md"}]
    (root / "mkdocs.yml").write_text(yaml.safe_dump(config))
    (root / "hack").mkdir()
    shutil.copy(REPO / "hack" / "mkdocs_hooks.py", root / "hack" / "mkdocs_hooks.py")
    return root


def test_links_out_of_docs_and_github_anchors_work_in_the_site(tmp_path: Path) -> None:
    root = small_site(tmp_path, GOOD)
    build = mkdocs_build(root / "mkdocs.yml", tmp_path / "site")
    assert build.returncode == 0, build.stderr
    site = tmp_path / "site"
    index = (site / "index.html").read_text()
    assert 'href="repo/"' in index and 'href="repo/charts/values.yaml"' in index and 'href="repo/tools/"' in index
    assert (site / "repo" / "charts" / "values.yaml").read_text() == "replicas: 2\n"
    # The README's links into docs/ go back to the site's own pages.
    assert 'href="../a/#fit-per-node"' in (site / "repo" / "index.html").read_text()
    assert 'href="../../a/"' in (site / "repo" / "tools" / "index.html").read_text()


@pytest.mark.parametrize(("link", "warning"), [
    ("[x](nowhere.md)", "contains a link 'nowhere.md', but the target is not found"),
    ("[x](a.md#no-such-heading)", "does not contain an anchor '#no-such-heading'"),
    ("[x](../charts/gone.yaml)", "contains a link '../charts/gone.yaml', but the target"),
    ("[x](../charts/)", "unrecognized relative link '../charts/'"),
])
def test_the_strict_build_fails_on_a_broken_link(tmp_path: Path, link: str, warning: str) -> None:
    root = small_site(tmp_path, {**GOOD, "docs/README.md": GOOD["docs/README.md"] + f"\n{link}\n"})
    build = mkdocs_build(root / "mkdocs.yml", tmp_path / "site")
    assert build.returncode != 0 and warning in build.stderr, build.stderr
