"""The layer rules of mcad, checked by reading the source with ``ast`` (nothing is imported or run).

| Rule            | Modules bound                        | May not import                                  |
|-----------------|--------------------------------------|-------------------------------------------------|
| client          | every mcad module except mcad.k8s.kube   | kubernetes, urllib3                             |
| model           | MODEL_MODULES below                  | mcad.k8s.kube, threading, concurrent.futures        |
| circles         | every mcad module                    | anything that imports it back, directly or not  |
| error types     | every mcad module except mcad.k8s.kube   | ApiError & co. via mcad.k8s.kube (use mcad.errors)  |
| error types     | mcad.errors                          | anything outside the standard library           |

A name in "May not import" forbids that module and everything under it, however it is spelt (``import x.y``,
``from x import y``, ``from . import y``), at module level or inside a function, class or ``if``. The client and
model rules count imports under ``if TYPE_CHECKING:`` too (a model module does not even name the client); the
circle rule does not, since such an import never runs. An edge of the circle rule is an explicit import of a mcad
module; the package ``__init__`` modules, which hold only docstrings, are not counted as imported along the way.

To bind a new module, add it to MODEL_MODULES (fnmatch patterns over dotted names); a module the issue plans but
nobody has written yet goes in NOT_WRITTEN_YET as well, so that a typo in the table still fails.
"""

from __future__ import annotations

import ast
import fnmatch
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "mcad"


@dataclass(frozen=True)
class Rule:
    name: str
    modules: tuple[str, ...]  # fnmatch patterns over dotted module names
    forbidden: tuple[str, ...]  # a module name forbids itself and everything under it
    exempt: tuple[str, ...] = ()


MODEL_MODULES: tuple[str, ...] = (
    "mcad.api",
    "mcad.api.*",
    "mcad.model.ledger",
    "mcad.model.reservations",
    "mcad.model.pending",
    "mcad.model.placement",
    "mcad.model.quota",
    "mcad.model.lifecycle",
    "mcad.model.status",
    "mcad.model.fit",
    "mcad.model.accounting",
    "mcad.model.preemption",
    "mcad.hub.placement",
    "mcad.model.keys",
    "mcad.model.assess",
    "mcad.serve.history",
    "mcad.model.fifo",
    "mcad.model.disclosure",
)
NOT_WRITTEN_YET: frozenset[str] = frozenset()

CLIENT_RULE = Rule(
    "only mcad.k8s.kube imports the Kubernetes client library",
    modules=("*",),
    exempt=("mcad.k8s.kube",),
    forbidden=("kubernetes", "urllib3"),
)
MODEL_RULE = Rule(
    "model code imports neither the API client nor threads",
    modules=MODEL_MODULES,
    forbidden=("mcad.k8s.kube", "threading", "concurrent.futures"),
)
RULES: tuple[Rule, ...] = (CLIENT_RULE, MODEL_RULE)  # each is checked over mcad by test_mcad_keeps_the_import_rule


# --- the checker ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One import statement of one module, with every dotted name it may bring in."""

    module: str  # the importing module
    file: str  # its path relative to the root, for messages
    line: int
    statement: str  # as written (normalised by ast.unparse)
    names: tuple[str, ...]  # "x" and "x.y" for ``from x import y``: y may be a module or an attribute
    from_import: bool
    type_checking_only: bool

    def where(self) -> str:
        return f"{self.file}:{self.line} `{self.statement}`"


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name (a package by its own name, for __init__.py)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, under_type_checking: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import at or below ``node``, however nested, with whether only ``if TYPE_CHECKING:`` reaches it."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node, under_type_checking
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
        for statement in node.body:
            yield from _walk(statement, True)
        for statement in node.orelse:
            yield from _walk(statement, under_type_checking)
    else:
        for child in ast.iter_child_nodes(node):
            yield from _walk(child, under_type_checking)


def imports_of(root: Path, module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found = []
    for node, type_checking in _walk(tree, False):
        if isinstance(node, ast.Import):
            names: tuple[str, ...] = tuple(alias.name for alias in node.names)
        else:
            if node.level:
                # Relative: level 1 is the package the module is in (a package's __init__ is in itself).
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            names = (source, *(f"{source}.{alias.name}" for alias in node.names if alias.name != "*"))
        found.append(Import(module, str(path.relative_to(root)), node.lineno, ast.unparse(node), names,
                            isinstance(node, ast.ImportFrom), type_checking))
    return found


def all_imports(root: Path, package: str) -> list[Import]:
    return [imp for module, path in module_files(root, package).items() for imp in imports_of(root, module, path)]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _bound(rule: Rule, module: str) -> bool:
    return any(fnmatch.fnmatchcase(module, p) for p in rule.modules) and module not in rule.exempt


def rule_violations(root: Path, package: str, rule: Rule) -> list[str]:
    """One message per import that breaks ``rule``, naming the file, the line, the statement and what it brings."""
    messages = []
    for imp in all_imports(root, package):
        if not _bound(rule, imp.module):
            continue
        hits = sorted({f for f in rule.forbidden for name in imp.names if _under(name, f)})
        if hits:
            messages.append(f"{imp.where()} imports {', '.join(hits)}: {rule.name}")
    return messages


def import_graph(root: Path, package: str) -> dict[str, dict[str, Import]]:
    """module -> {imported mcad module: the import that brings it}; ``if TYPE_CHECKING:`` imports left out."""
    modules = module_files(root, package)
    graph: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for imp in all_imports(root, package):
        if imp.type_checking_only:
            continue
        if imp.from_import:  # ``from x import y`` imports x.y when that is a module, else only x
            targets = [n for n in imp.names[1:] if n in modules] or [n for n in imp.names[:1] if n in modules]
        else:
            targets = [n for n in imp.names if n in modules]
        for target in targets:
            if target != imp.module:
                graph[imp.module].setdefault(target, imp)
    return graph


def _strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; only components of more than one module (a module never imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _a_circle(graph: dict[str, dict[str, Import]], members: list[str]) -> list[str]:
    """One circle through the first member, by breadth-first search inside the component (so a shortest one)."""
    inside = set(members)
    start = members[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child not in inside:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {start} in {members}")  # cannot happen in a strong component


def circles(root: Path, package: str) -> list[str]:
    """One message per import circle: its modules, and one way round it with the import (file:line) of each step."""
    graph = import_graph(root, package)
    messages = []
    for members in _strongly_connected(graph):
        circle = _a_circle(graph, members)
        steps = "; ".join(graph[a][b].where() for a, b in itertools.pairwise(circle))
        messages.append(f"import circle {' -> '.join(circle)} (among {', '.join(members)}): {steps}")
    return messages


ERROR_TYPES = ("ApiError", "GoneError", "KubeConnectError", "error_from_status")


def error_type_violations(root: Path, package: str) -> list[str]:
    """mcad.errors imports only the standard library, and no module but mcad.k8s.kube names an error type via kube."""
    modules = module_files(root, package)
    messages = [f"{imp.where()} imports {imp.names[0]}: mcad.errors imports only the standard library"
                for imp in imports_of(root, "mcad.errors", modules["mcad.errors"])
                if imp.names[0].split(".")[0] not in sys.stdlib_module_names]
    for module, path in modules.items():
        if module == "mcad.k8s.kube":
            continue
        messages += [f"{imp.where()} takes an error type from mcad.k8s.kube: import it from mcad.errors"
                     for imp in imports_of(root, module, path)
                     if any(n == f"mcad.k8s.kube.{e}" for e in ERROR_TYPES for n in imp.names)]
        messages += [f"{path.relative_to(root)}:{node.lineno} `{ast.unparse(node)}`: name it from mcad.errors"
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                     and node.value.id == "kube" and node.attr in ERROR_TYPES]
    return messages


# --- the rules over mcad itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_mcad_keeps_the_import_rule(rule: Rule) -> None:
    assert rule_violations(REPO, PACKAGE, rule) == []


def test_no_import_circle_among_mcad_modules() -> None:
    assert circles(REPO, PACKAGE) == []


def test_the_error_types_deciding_code_catches_live_outside_the_client_module() -> None:
    assert error_type_violations(REPO, PACKAGE) == []


def test_every_module_in_the_tables_exists_unless_not_written_yet() -> None:
    modules = module_files(REPO, PACKAGE)
    unmatched = {p for p in MODEL_MODULES if not any(fnmatch.fnmatchcase(m, p) for m in modules)}
    assert unmatched <= NOT_WRITTEN_YET, f"no such module: {sorted(unmatched - NOT_WRITTEN_YET)}"
    assert not NOT_WRITTEN_YET & set(modules), "written now: take it out of NOT_WRITTEN_YET"
    assert "mcad.k8s.kube" in modules and "mcad.errors" in modules


# --- the checker can fail: each rule broken on purpose in a package of a few files ---------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"mcad/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (path.parent / "__init__.py").exists() and path.name != "__init__.py":
            (path.parent / "__init__.py").write_text("")
        path.write_text(text)
    return root


@pytest.mark.parametrize(("name", "text", "statement"), [
    ("mcad/model/ledger.py", "import kubernetes.client\n", "import kubernetes.client"),
    ("mcad/api/views.py", "def f():\n    from urllib3 import util\n", "from urllib3 import util"),
    ("mcad/cli/controller.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import urllib3\n",
     "import urllib3"),
])
def test_the_client_rule_reports_a_client_import_outside_kube(tmp_path: Path, name: str, text: str,
                                                              statement: str) -> None:
    root = _package(tmp_path, {"mcad/k8s/kube.py": "import kubernetes\nimport urllib3\n", name: text})
    found = rule_violations(root, PACKAGE, CLIENT_RULE)
    assert len(found) == 1, found
    assert found[0].startswith(f"{name}:")
    assert f"`{statement}`" in found[0]


@pytest.mark.parametrize(("name", "text", "statement", "forbidden"), [
    ("mcad/model/ledger.py", "import threading\n", "import threading", "threading"),
    ("mcad/model/quota.py", "from threading import Lock\n", "from threading import Lock", "threading"),
    ("mcad/model/pending.py", "def f():\n    from mcad.k8s import kube\n", "from mcad.k8s import kube",
     "mcad.k8s.kube"),
    ("mcad/api/views.py", "from ..k8s import kube\n", "from ..k8s import kube", "mcad.k8s.kube"),
    ("mcad/api/views.py", "from mcad.k8s.kube import ApiError\n", "from mcad.k8s.kube import ApiError",
     "mcad.k8s.kube"),
    ("mcad/model/status.py", "import concurrent.futures\n", "import concurrent.futures", "concurrent.futures"),
    ("mcad/model/fit.py", "from concurrent import futures\n", "from concurrent import futures", "concurrent.futures"),
    ("mcad/model/preemption.py", "from concurrent.futures import ThreadPoolExecutor\n",
     "from concurrent.futures import ThreadPoolExecutor", "concurrent.futures"),
])
def test_the_model_rule_reports_a_client_or_thread_import(tmp_path: Path, name: str, text: str, statement: str,
                                                          forbidden: str) -> None:
    root = _package(tmp_path, {
        "mcad/k8s/kube.py": "import threading\n",  # not a model module: may use threads
        "mcad/loop/dispatcher.py": "import threading\nfrom mcad import kube\n",
        "mcad/model/lifecycle.py": "from mcad.errors import ApiError\nimport structlog\n",  # allowed neighbours
        "mcad/errors.py": "",
        name: text,
    })
    found = rule_violations(root, PACKAGE, MODEL_RULE)
    assert found == [f"{name}:{text.count(chr(10), 0, text.index(statement)) + 1} `{statement}` imports {forbidden}: "
                     f"{MODEL_RULE.name}"]


def test_the_circle_rule_reports_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "mcad/a.py": "from mcad import b\n",
        "mcad/b.py": "import mcad.c\n",
        "mcad/c.py": "def later():\n    from mcad.a import thing\n",
        "mcad/d.py": "import mcad.a\n",  # leads into the circle, is not on it
    })
    assert circles(root, PACKAGE) == [
        "import circle mcad.a -> mcad.b -> mcad.c -> mcad.a (among mcad.a, mcad.b, mcad.c): "
        "mcad/a.py:1 `from mcad import b`; mcad/b.py:1 `import mcad.c`; mcad/c.py:2 `from mcad.a import thing`"
    ]


def test_the_circle_rule_follows_relative_imports_and_reports_each_circle(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "mcad/cli/controller.py": "from mcad.serve import debug\n",
        "mcad/serve/debug.py": "from ..cli.controller import build\n",
        "mcad/api/x.py": "from . import y\n",
        "mcad/api/y.py": "from .x import z\n",
    })
    assert circles(root, PACKAGE) == [
        "import circle mcad.api.x -> mcad.api.y -> mcad.api.x (among mcad.api.x, mcad.api.y): "
        "mcad/api/x.py:1 `from . import y`; mcad/api/y.py:1 `from .x import z`",
        "import circle mcad.cli.controller -> mcad.serve.debug -> mcad.cli.controller (among mcad.cli.controller, "
        "mcad.serve.debug): mcad/cli/controller.py:1 `from mcad.serve import debug`; mcad/serve/debug.py:1 "
        "`from ..cli.controller import build`",
    ]


def test_the_circle_rule_leaves_out_imports_under_type_checking_only(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "mcad/loop/dispatcher.py": "from mcad.hubdispatch import HubMode\n",
        "mcad/hubdispatch.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from mcad.loop.dispatcher import Dispatcher\n"
            "class HubMode:\n    if TYPE_CHECKING:\n        from mcad.loop import dispatcher\n"
        ),
    })
    assert circles(root, PACKAGE) == []
    # The else branch of the same ``if`` runs, so it counts.
    (root / "mcad/hubdispatch.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    import mcad.loop.dispatcher\n")
    assert circles(root, PACKAGE) == [
        "import circle mcad.hubdispatch -> mcad.loop.dispatcher -> mcad.hubdispatch (among mcad.hubdispatch, "
        "mcad.loop.dispatcher): mcad/hubdispatch.py:5 `import mcad.loop.dispatcher`; mcad/loop/dispatcher.py:1 "
        "`from mcad.hubdispatch import HubMode`"
    ]


def test_the_error_type_rule_reports_kube_spellings_and_a_heavy_errors_module(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "mcad/k8s/kube.py": "from mcad.errors import ApiError as ApiError\n",
        "mcad/errors.py": "from typing import Any\nimport urllib3\n",
        "mcad/hub.py": "from mcad.k8s import kube\ntry:\n    pass\nexcept kube.ApiError:\n    pass\n",
        "mcad/k8s/apply.py": "from mcad.k8s.kube import Client, GoneError\n",
        "mcad/k8s/leader.py": "from mcad.k8s import kube\nfrom mcad.errors import ApiError\nkube.Client\n",  # fine
    })
    assert error_type_violations(root, PACKAGE) == [
        "mcad/errors.py:2 `import urllib3` imports urllib3: mcad.errors imports only the standard library",
        "mcad/hub.py:4 `kube.ApiError`: name it from mcad.errors",
        "mcad/k8s/apply.py:1 `from mcad.k8s.kube import Client, GoneError` takes an error type from mcad.k8s.kube: "
        "import it from mcad.errors",
    ]
