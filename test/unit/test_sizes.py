"""Size budgets that keep control with the owners (mcad.loop.owners), checked by reading the source with ``ast``.

- No class in ``mcad`` has more than 32 methods: a class past that owns more than one concept (the largest,
  ``ResourceVector``, has 30; the ``Accountant`` came down from 40 when its plans and pins became ``Plans``).
- The ``Dispatcher`` stays a router of keys: under 30 methods and 400 lines; it builds nothing (``mcad.wiring``
  does) and no owner reaches back into it: no module of ``mcad.loop`` but ``mcad.loop.dispatcher`` names the
  ``Dispatcher``, and none declares a ``Host`` protocol standing for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from test.support import write_tree

REPO = Path(__file__).resolve().parents[2]
MAX_METHODS = 32
DISPATCHER_MAX_METHODS = 30
DISPATCHER_MAX_LINES = 400


def classes(root: Path) -> dict[str, tuple[int, int]]:
    """``module:Class`` -> (methods, lines) of every class under ``root/mcad``, nested ones included."""
    found = {}
    for path in sorted((root / "mcad").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                assert node.end_lineno is not None
                found[f"{path.relative_to(root)}:{node.name}"] = (len(methods), node.end_lineno - node.lineno + 1)
    return found


def over_budget(root: Path) -> list[str]:
    problems = [f"{name} has {methods} methods (at most {MAX_METHODS})"
                for name, (methods, _) in classes(root).items() if methods > MAX_METHODS]
    methods, lines = classes(root).get("mcad/loop/dispatcher.py:Dispatcher", (0, 0))
    if methods >= DISPATCHER_MAX_METHODS or lines >= DISPATCHER_MAX_LINES:
        problems.append(f"Dispatcher has {methods} methods and {lines} lines (under {DISPATCHER_MAX_METHODS} and "
                        f"{DISPATCHER_MAX_LINES})")
    return problems


def back_references(root: Path) -> list[str]:
    """Owners of ``mcad.loop`` that name the Dispatcher, or declare a protocol called Host."""
    found = []
    for path in sorted((root / "mcad" / "loop").glob("*.py")):
        if path.name in ("dispatcher.py", "__init__.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "Host":
                found.append(f"{path.relative_to(root)}:{node.lineno} declares a Host protocol")
            elif isinstance(node, ast.ImportFrom) and node.module == "mcad.loop.dispatcher":
                found.append(f"{path.relative_to(root)}:{node.lineno} imports mcad.loop.dispatcher")
    return found


def test_mcad_keeps_its_size_budgets() -> None:
    assert over_budget(REPO) == []


def test_no_owner_reaches_back_into_the_dispatcher() -> None:
    assert back_references(REPO) == []


@pytest.mark.parametrize(("files", "expected"), [
    ({"mcad/big.py": "class Big:\n" + "".join(f"    def m{i}(self): ...\n" for i in range(33))},
     ["mcad/big.py:Big has 33 methods (at most 32)"]),
    ({"mcad/loop/dispatcher.py": "class Dispatcher:\n" + "".join(f"    def m{i}(self): ...\n" for i in range(30))},
     ["Dispatcher has 30 methods and 31 lines (under 30 and 400)"]),
    ({"mcad/loop/dispatcher.py": "class Dispatcher:\n" + "    x = 1\n" * 400},
     ["Dispatcher has 0 methods and 401 lines (under 30 and 400)"]),
])
def test_the_budgets_report_a_class_past_them(tmp_path: Path, files: dict[str, str], expected: list[str]) -> None:
    assert over_budget(write_tree(tmp_path, files)) == expected


def test_a_host_protocol_or_a_dispatcher_import_in_an_owner_is_reported(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {
        "mcad/loop/notices.py": "from typing import Protocol\nclass Host(Protocol):\n    pass\n",
        "mcad/loop/follower.py": "from mcad.loop.dispatcher import Dispatcher\n",
        "mcad/loop/dispatcher.py": "class Host:\n    pass\n",  # the dispatcher itself is not an owner
    })
    assert back_references(root) == ["mcad/loop/follower.py:1 imports mcad.loop.dispatcher",
                                     "mcad/loop/notices.py:2 declares a Host protocol"]
