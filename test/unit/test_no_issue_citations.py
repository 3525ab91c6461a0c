"""No comment, docstring or doc line cites an issue by number: a reader cannot open "issue N" and learns nothing from
it. Say what it means instead (the behaviour or constraint it refers to), or drop it where the sentence says it
already. A full URL is a citation a reader can open, so one is allowed (an upstream project's issue, for a fact).

The scan covers the source, tests, scripts, chart, config and docs as text: every file there that decodes as
UTF-8 (images and other binaries are skipped), caches left out."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("mcad", "test", "hack", "charts", "config", "docs", "README.md")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}

# The word "issue" or "issues" (any case), then an optional "#", then digits, spaces allowed between them.
CITATION = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)
URL = re.compile(r"https?://\S+")


def _files(root: Path) -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        path = root / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(p for p in sorted(path.rglob("*"))
                         if p.is_file() and not SKIPPED_DIRS.intersection(p.relative_to(root).parts))
    return found


def citations(root: Path) -> list[str]:
    """Every issue-number citation under ``root``'s scanned paths outside a URL, as ``file:line: text``."""
    found: list[str] = []
    for path in _files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if CITATION.search(URL.sub(" ", line)):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_file_cites_an_issue_by_number() -> None:
    found = citations(ROOT)
    assert not found, ("say what the issue meant instead of citing its number (a full URL is fine):\n"
                       + "\n".join(found))


def test_a_planted_citation_is_found_with_its_file_and_line(tmp_path: Path) -> None:
    issue = "issue"  # spelled apart, so that this file holds no citation itself
    (tmp_path / "mcad").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "mcad" / "x.py").write_text(f"a = 1\n# kept for the reason of {issue.title()}  #7\n")
    (tmp_path / "docs" / "y.md").write_text(f"as before {issue}s 3 and 4.\nSee https://github.com/o/r/{issue}s/5.\n")
    (tmp_path / "docs" / "z.png").write_bytes(b"\x89PNG\xff\xfe " + f"{issue} 9".encode())
    (tmp_path / "README.md").write_text(f"No citation here: {issue}d 3 items, t{issue} 4.\n")
    assert citations(tmp_path) == [f"mcad/x.py:2: # kept for the reason of {issue.title()}  #7",
                                   f"docs/y.md:1: as before {issue}s 3 and 4."]
