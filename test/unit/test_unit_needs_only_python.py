"""`make unit` needs only Python (README.md): no test it runs (test/unit, test/component) drives a browser or needs
another program. The browser's tests live where `make test` runs them with chromium at hand: the dashboard's in
test/e2e, the harness's own (test/browser.py against a loopback page) in test/integration. Checked by reading the
sources, so a browser test put back under test/unit fails here, naming the file and line, even on a machine that
has chromium (where it would pass and hide the dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNIT_DIRECTORIES = (REPO / "test" / "unit", REPO / "test" / "component")
# Modules that start or drive a browser.
BROWSER_MODULES = ("selenium", "test.browser")


def browser_imports(source: str, name: str) -> list[str]:
    """``name:line: statement`` for each import of a browser module in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(module == wanted or module.startswith(wanted + ".") for module in modules for wanted in BROWSER_MODULES):
            found.append(f"{name}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_no_unit_or_component_test_drives_a_browser() -> None:
    found = [line for directory in UNIT_DIRECTORIES for path in sorted(directory.rglob("*.py"))
             for line in browser_imports(path.read_text(), str(path.relative_to(REPO)))]
    assert found == [], "browser tests belong in test/integration or test/e2e"


def test_a_browser_import_is_named_with_its_line() -> None:
    source = ("import os\nfrom test import browser as chromium\nfrom selenium.webdriver import Chrome\n"
              "import seleniumx\n")
    assert browser_imports(source, "t.py") == ["t.py:2: from test import browser as chromium",
                                               "t.py:3: from selenium.webdriver import Chrome"]
