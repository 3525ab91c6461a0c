"""The layer rules of mcad, checked by reading the source with ``ast`` (nothing is imported or run).

mcad is built in layers, one package each; a layer uses those below it, never those above:

    mcad.cli                      entry points: build everything through mcad.wiring and run it
    mcad.serve, mcad.admission    what is served over HTTP: API, dashboard, debug; the admission webhook
    mcad.hub                      hub mode: the worker clusters, their connections and health
    mcad.loop                     the dispatcher loop and the owners that run on its thread
    mcad.k8s                      Kubernetes I/O: the client, informers, the work queue, the write pool, Events
    mcad.model, mcad.api          pure decisions and the views they decide over (and PURE's other members, below)
    mcad.errors, clock, log, metrics   shared by every layer

| Rule         | Modules bound                                        | May not ...                                  |
|--------------|------------------------------------------------------|----------------------------------------------|
| pure         | PURE: mcad.model, mcad.api, mcad.hub.placement,      | reach threading, concurrent.futures, asyncio,|
|              | mcad.serve.history, mcad.admission.facts and .request| socket, kubernetes, urllib3, mcad.k8s,       |
|              |                                                      | mcad.loop, mcad.hub, mcad.serve,             |
|              |                                                      | mcad.admission, mcad.cli, mcad.wiring,       |
|              |                                                      | mcad.metrics                                 |
| api          | mcad.api                                             | reach mcad (any module outside mcad.api: the |
|              |                                                      | views are the ground floor)                  |
| model        | mcad.model                                           | reach mcad.k8s, mcad.loop, mcad.hub,         |
|              |                                                      | mcad.serve, mcad.admission, mcad.cli,        |
|              |                                                      | mcad.wiring, mcad.metrics (PURE's other      |
|              |                                                      | members too: it states what it reads)        |
| k8s          | mcad.k8s                                             | reach mcad.loop, mcad.hub, mcad.serve,       |
|              |                                                      | mcad.admission, mcad.cli, mcad.wiring        |
| loop         | mcad.loop                                            | reach mcad.hub,                              |
|              |                                                      | mcad.serve, mcad.admission, mcad.cli,        |
|              |                                                      | mcad.wiring                                  |
| hub          | mcad.hub                                             | reach mcad.serve, mcad.admission, mcad.cli,  |
|              |                                                      | mcad.wiring                                  |
| serve        | mcad.serve                                           | reach mcad.cli, mcad.wiring                  |
| admission    | mcad.admission                                       | reach mcad.cli, mcad.wiring                  |
| shared       | mcad, mcad.errors, mcad.clock, mcad.log, mcad.metrics| reach mcad.loop, mcad.hub, mcad.serve,       |
|              |                                                      | mcad.admission, mcad.cli, mcad.wiring        |
| client       | every mcad module except mcad.k8s.kube               | import kubernetes, urllib3                   |
| entry points | every mcad module except mcad.cli.*                  | import mcad.cli                              |
| wiring       | every mcad module except mcad.cli.*                  | import mcad.wiring                           |
| settings     | mcad.settings                                        | reach mcad.serve, mcad.admission, mcad.cli,  |
|              |                                                      | mcad.wiring                                  |
| settings readers | every mcad module except mcad.cli.*, mcad.wiring | import mcad.settings                         |
| readers      | mcad.serve.*, mcad.metrics                           | import of mcad.loop anything but             |
|              |                                                      | mcad.loop.view (mcad.serve.server: and       |
|              |                                                      | mcad.loop.dispatcher)                        |
| circles      | every mcad module                                    | import anything that imports it back         |
| error types  | every mcad module except mcad.k8s.kube               | import ApiError & co. via mcad.k8s.kube      |
|              |                                                      | (use mcad.errors)                            |
| error types  | mcad.errors                                          | import anything outside the standard library |

How to read it:

- A name under "May not" forbids that module and everything under it, except the PURE modules, which every layer above
  the model may reach wherever they sit (mcad.serve.history computes figures, it serves nothing). The api and model
  rules hold the ground floors on their own: mcad.api reaches nothing of mcad but itself (mcad.api.nodemarks holds
  what a node's view carries of the node-health rules), and mcad.model reaches no PURE module of another layer
  (what admission asks the cluster for it is mcad.model.tenancy.NamespaceFacts, which mcad.admission.facts.Facts
  extends). The loop may not reach mcad.hub.placement either: mcad.wiring hands the loop hub
  mode's owners, the loop does not name them. EXEMPT would list a breach a rule tolerates for now (it is empty: hub
  mode's owners are built by mcad.wiring); test_every_exemption_is_still_needed fails once one of them is no
  longer reached, so the list only shrinks.
- "Reach" is any chain of imports of mcad modules: ``a`` imports ``b``, which imports ``c``, which has ``import
  threading``. The message names the chain, with the file:line and statement of each step. A chain ends at the first
  forbidden module on it (one message per breach, not one per module behind it) and does not pass through another
  module the same rule binds (that one is checked on its own, so a breach is reported once, from the last bound module
  on the way). Packages outside mcad are not followed: the rules are about mcad's own structure (prometheus_client
  runs threads of its own; that makes no pure module less pure).
- "Import" is a direct import: the client, entry point and wiring rules cannot be reach rules, since everything reaches
  mcad.k8s.kube, and the entry points reach everything.
- An import counts however it is spelt (``import x.y``, ``from x import y``, ``from . import y``), at module level or
  inside a function, class or ``if``; ``from x import y`` imports the module x.y when there is one, else x. Package
  ``__init__`` modules, which hold only docstrings, are not counted as imported along the way.
- Imports under ``if TYPE_CHECKING:`` count for every rule, the reach and circle rules included (messages mark them).
  The rules state what a module depends on to be read and type-checked, and mypy follows those imports; a pure module
  that names a type of mcad.k8s only for annotations still cannot be understood without it, and a circle closed only
  for annotations is still a circle to its reader. Counting them also leaves no way round a rule: a lower layer that
  must name what a higher one passes it states what it reads as a Protocol (``mcad.api.podgroups.MatchedNode``,
  ``mcad.metrics.PortCounters``, ``mcad.hub.placement.WorkerDirectory``, ``mcad.model.tenancy.NamespaceFacts``).
- Only the entry points build the controller (the wiring rule, and mcad.wiring under the serve and admission rules):
  mcadctl's offline view builds its dispatcher in mcad.cli.offline and hands its view to mcad.serve.debug's Reports.
- What is served reads the loop through mcad.loop.view (the readers rule): the reports behind /debug, the
  dashboard and mcadctl, and the metrics, name no owner of the loop; only mcad.serve.server, which wires the
  endpoints to the running dispatcher (its thread, its published state), names mcad.loop.dispatcher.
- mcad.settings holds the controller's flags as typed, frozen values, one group per consumer; it does no I/O and
  starts nothing itself, but names the values of the layers it configures (the hub's parsed clusters file, the
  loop's eviction defaults), so it sits above them and below what serves and builds. Only the entry points, which
  parse the flags into it, and mcad.wiring, which hands each owner its part, read it (the settings readers rule):
  every other module is handed plain values.

The table is checked against the rules below (test_the_docstring_table_states_each_rule). A new module is bound by
its package's patterns (fnmatch over dotted names); a module the issue plans but nobody has written yet goes in
NOT_WRITTEN_YET, so that a typo in a pattern still fails.
"""

from __future__ import annotations

import ast
import dataclasses
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
    modules: tuple[str, ...]  # fnmatch patterns over dotted module names: the modules it binds
    forbidden: tuple[str, ...]  # a module name forbids itself and everything under it
    reach: bool = True  # any chain of imports counts; False: only the bound module's own imports
    unbound: tuple[str, ...] = ()  # patterns of modules it does not bind, though ``modules`` matches them
    allowed: tuple[str, ...] = ()  # patterns of modules under a forbidden name that may still be reached
    exempt: tuple[tuple[str, str], ...] = ()  # (bound module, forbidden module it still reaches, by any chain)


PURE: tuple[str, ...] = (
    "mcad.model",
    "mcad.model.*",
    "mcad.api",
    "mcad.api.*",
    "mcad.hub.placement",  # which worker a gang goes to: a fit over a snapshot
    "mcad.serve.history",  # the dashboard's figures, computed from what the server recorded
    "mcad.admission.facts",  # what admission may ask the cluster, as a Protocol (the webhook's event loop asks it)
    "mcad.admission.request",  # an AdmissionReview request, parsed
)
NOT_WRITTEN_YET: frozenset[str] = frozenset()

ABOVE_THE_LOOP = ("mcad.serve", "mcad.admission", "mcad.cli", "mcad.wiring")
PURE_RULE = Rule(
    "pure: the model decides without I/O, threads or the layers that do them",
    modules=PURE,
    forbidden=("threading", "concurrent.futures", "asyncio", "socket", "kubernetes", "urllib3",
               "mcad.k8s", "mcad.loop", "mcad.hub", "mcad.metrics", *ABOVE_THE_LOOP),
    allowed=PURE,
)
API_RULE = Rule(
    "api: the views are the ground floor: they reach no mcad module outside mcad.api",
    modules=("mcad.api", "mcad.api.*"),
    forbidden=("mcad",),
    allowed=("mcad.api", "mcad.api.*"),
)
MODEL_RULE = Rule(
    "model: the decisions reach the views and the shared modules, not another layer's pure modules",
    modules=("mcad.model", "mcad.model.*"),
    forbidden=("mcad.k8s", "mcad.loop", "mcad.hub", "mcad.serve", "mcad.admission", "mcad.cli", "mcad.wiring",
               "mcad.metrics"),
)
K8S_RULE = Rule(
    "k8s: Kubernetes I/O knows nothing of the loop, the hub or what is served",
    modules=("mcad.k8s", "mcad.k8s.*"),
    forbidden=("mcad.loop", "mcad.hub", *ABOVE_THE_LOOP),
    allowed=PURE,
)
# What mcad.loop.dispatcher may still reach of mcad.hub: nothing (mcad.wiring builds
# hub mode's owners and hands them to the loop): (module, what it may still reach, by any chain). What it reaches
# through these is checked as usual. test_every_exemption_is_still_needed says when a line can go. Add none.
EXEMPT: tuple[tuple[str, str], ...] = ()
LOOP_RULE = Rule(
    "loop: the loop's owners are handed what they use, never what serves or builds them",
    modules=("mcad.loop", "mcad.loop.*"),
    forbidden=("mcad.hub", *ABOVE_THE_LOOP),
    allowed=tuple(p for p in PURE if not p.startswith("mcad.hub")),
    exempt=EXEMPT,
)
HUB_RULE = Rule(
    "hub: hub mode's workers know nothing of what is served",
    modules=("mcad.hub", "mcad.hub.*"),
    forbidden=ABOVE_THE_LOOP,
    allowed=PURE,
)
SERVE_RULE = Rule(
    "serve: what is served does not reach the entry points or build the controller",
    modules=("mcad.serve", "mcad.serve.*"),
    forbidden=("mcad.cli", "mcad.wiring"),
    allowed=PURE,
)
ADMISSION_RULE = Rule(
    "admission: the webhook does not reach the entry points or build the controller",
    modules=("mcad.admission", "mcad.admission.*"),
    forbidden=("mcad.cli", "mcad.wiring"),
    allowed=PURE,
)
SHARED_RULE = Rule(
    "shared: what every layer uses reaches no layer above the Kubernetes I/O",
    modules=("mcad", "mcad.errors", "mcad.clock", "mcad.log", "mcad.metrics"),
    forbidden=("mcad.loop", "mcad.hub", *ABOVE_THE_LOOP),
    allowed=PURE,
)
CLIENT_RULE = Rule(
    "client: only mcad.k8s.kube imports the Kubernetes client library",
    modules=("*",),
    unbound=("mcad.k8s.kube",),
    forbidden=("kubernetes", "urllib3"),
    reach=False,
)
ENTRY_POINTS_RULE = Rule(
    "entry points: only the entry points import the entry points",
    modules=("*",),
    unbound=("mcad.cli", "mcad.cli.*"),
    forbidden=("mcad.cli",),
    reach=False,
)
WIRING_RULE = Rule(
    "wiring: only the entry points build the controller",
    modules=("*",),
    unbound=("mcad.cli", "mcad.cli.*"),
    forbidden=("mcad.wiring",),
    reach=False,
)
SETTINGS_RULE = Rule(
    "settings: the controller's settings are values: they reach nothing that serves, admits or builds",
    modules=("mcad.settings",),
    forbidden=("mcad.serve", "mcad.admission", "mcad.cli", "mcad.wiring"),
    allowed=PURE,
)
SETTINGS_READERS_RULE = Rule(
    "settings readers: only the entry points and the composition root read the settings",
    modules=("*",),
    unbound=("mcad.cli", "mcad.cli.*", "mcad.wiring"),
    forbidden=("mcad.settings",),
    reach=False,
)
READERS_RULE = Rule(
    "readers: what is served reads the loop through mcad.loop.view, never an owner",
    modules=("mcad.serve.*", "mcad.metrics"),
    forbidden=("mcad.loop",),
    allowed=("mcad.loop.view",),
    reach=False,
    exempt=(("mcad.serve.server", "mcad.loop.dispatcher"),),
)
# Each checked by test_mcad_keeps_the_rule.
RULES: tuple[Rule, ...] = (PURE_RULE, API_RULE, MODEL_RULE, K8S_RULE, LOOP_RULE, HUB_RULE, SERVE_RULE, ADMISSION_RULE,
                           SHARED_RULE, CLIENT_RULE, ENTRY_POINTS_RULE, WIRING_RULE, SETTINGS_RULE,
                           SETTINGS_READERS_RULE, READERS_RULE)


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
        under = " (under TYPE_CHECKING)" if self.type_checking_only else ""
        return f"{self.file}:{self.line} `{self.statement}`{under}"


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


def _read(root: Path, package: str) -> tuple[dict[str, Path], dict[str, list[Import]]]:
    """The modules under ``root`` and the imports of each."""
    modules = module_files(root, package)
    return modules, {module: imports_of(root, module, path) for module, path in modules.items()}


def all_imports(root: Path, package: str) -> list[Import]:
    return [imp for imports in _read(root, package)[1].values() for imp in imports]


def targets(imp: Import, modules: dict[str, Path] | set[str]) -> list[str]:
    """What one import statement brings in: the modules of the tree it loads (``from x import y`` loads x.y when that
    is a module, else x), then the names it spells outside the tree (``threading``, ``concurrent.futures.Future``)."""
    if imp.from_import:
        inside = [n for n in imp.names[1:] if n in modules] or [n for n in imp.names[:1] if n in modules]
    else:
        inside = [n for n in imp.names if n in modules]
    outside = [n for n in imp.names if n not in modules and not any(_under(n, m) for m in inside)]
    return [*inside, *outside]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _matches(module: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)


def _bound(rule: Rule, module: str) -> bool:
    return _matches(module, rule.modules) and not _matches(module, rule.unbound)


def _forbidden_by(rule: Rule, target: str) -> str | None:
    """The forbidden name ``target`` falls under, if the rule forbids it."""
    if _matches(target, rule.allowed):
        return None
    return next((f for f in rule.forbidden if _under(target, f)), None)


@dataclass(frozen=True)
class Breach:
    start: str  # the bound module
    reached: str  # the forbidden module it reaches, or the forbidden name outside the tree (``threading``)
    steps: tuple[Import, ...]  # the imports from ``start`` to ``reached``, in order

    def message(self, rule: Rule) -> str:
        chain = " -> ".join([*(step.module for step in self.steps), self.reached])
        return f"{chain}: {'; '.join(step.where() for step in self.steps)}: {rule.name}"


def breaches(root: Path, package: str, rule: Rule) -> list[Breach]:
    """Every forbidden module each bound module reaches (imports, for a rule that is not about reach), by a shortest
    chain (breadth first), ending at the first forbidden module and passing through no other bound module."""
    modules, imports = _read(root, package)
    found = []
    for start in sorted(m for m in modules if _bound(rule, m)):
        came_by: dict[str, Import | None] = {start: None}  # module -> the import that first reached it
        frontier = [start]
        while frontier:
            following = []
            for module in frontier:
                path: list[Import] = []
                step = came_by[module]
                while step is not None:
                    path.insert(0, step)
                    step = came_by[step.module]
                for imp in imports[module]:
                    reported: set[str] = set()
                    for target in targets(imp, modules):
                        if target == module:
                            continue
                        hit = _forbidden_by(rule, target)
                        if hit is not None and (start, target) not in rule.exempt:
                            reached = target if target in modules else hit
                            if reached not in reported:
                                reported.add(reached)
                                found.append(Breach(start, reached, (*path, imp)))
                        elif rule.reach and target in modules and target not in came_by and not _bound(rule, target):
                            came_by[target] = imp
                            following.append(target)
            frontier = following
    return found


def rule_violations(root: Path, package: str, rule: Rule) -> list[str]:
    """One message per breach of ``rule``: the chain of modules, and the file, line and statement of each step."""
    return [breach.message(rule) for breach in breaches(root, package, rule)]


def reached(root: Path, package: str, rule: Rule, start: str) -> set[str]:
    """Every module ``start`` reaches the way ``rule`` follows chains (through no other module it binds), forbidden
    ones included."""
    modules, imports = _read(root, package)
    seen = {start}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for imp in imports[module]:
                for target in targets(imp, modules):
                    if target in modules and target not in seen and not _bound(rule, target):
                        seen.add(target)
                        following.append(target)
        frontier = following
    return seen - {start}


def stale_exemptions(root: Path, package: str, rule: Rule) -> list[tuple[str, str]]:
    """The exemptions of ``rule`` that nothing needs any more: the module no longer reaches the one it may reach."""
    return [(start, target) for start, target in rule.exempt if target not in reached(root, package, rule, start)]


def import_graph(root: Path, package: str) -> dict[str, dict[str, Import]]:
    """module -> {imported mcad module: the import that brings it}, ``if TYPE_CHECKING:`` imports included."""
    modules, imports = _read(root, package)
    graph: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for module, found in imports.items():
        for imp in found:
            for target in targets(imp, modules):
                if target in modules and target != module:
                    graph[module].setdefault(target, imp)
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


def _short(rule: Rule) -> str:
    return rule.name.partition(":")[0]


@pytest.mark.parametrize("rule", RULES, ids=_short)
def test_mcad_keeps_the_rule(rule: Rule) -> None:
    assert rule_violations(REPO, PACKAGE, rule) == []


@pytest.mark.parametrize("rule", RULES, ids=_short)
def test_every_exemption_is_still_needed(rule: Rule) -> None:
    assert stale_exemptions(REPO, PACKAGE, rule) == [], "nothing reaches these any more: take them out of EXEMPT"


def test_no_import_circle_among_mcad_modules() -> None:
    assert circles(REPO, PACKAGE) == []


def test_the_error_types_deciding_code_catches_live_outside_the_client_module() -> None:
    assert error_type_violations(REPO, PACKAGE) == []


def test_every_module_in_the_tables_exists_unless_not_written_yet() -> None:
    modules = module_files(REPO, PACKAGE)
    patterns = {p for rule in RULES for p in (*rule.modules, *rule.unbound, *rule.allowed)}
    patterns |= {module for rule in RULES for pair in rule.exempt for module in pair}
    patterns |= {name for rule in RULES for name in rule.forbidden if _under(name, PACKAGE)}
    unmatched = {p for p in patterns if not any(fnmatch.fnmatchcase(m, p) for m in modules)}
    assert unmatched <= NOT_WRITTEN_YET, f"no such module: {sorted(unmatched - NOT_WRITTEN_YET)}"
    assert not NOT_WRITTEN_YET & set(modules), "written now: take it out of NOT_WRITTEN_YET"
    assert "mcad.k8s.kube" in modules and "mcad.errors" in modules


def _table() -> dict[str, str]:
    """The docstring's table: rule -> its "May not" cell, continuation rows joined."""
    rows: dict[str, str] = {}
    last = ""
    for line in (__doc__ or "").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or cells[0] == "Rule" or set(cells[0]) == {"-"}:
            continue
        last = cells[0] or last  # a row without a rule continues the one above
        rows[last] = f"{rows.get(last, '')} {cells[2]}".strip()
    return rows


def test_the_docstring_table_states_each_rule() -> None:
    table = _table()
    for rule in RULES:
        cell = table.get(_short(rule))
        assert cell is not None, f"no row for {_short(rule)}"
        words = set(cell.replace(",", " ").split())
        assert cell.split()[0] == ("reach" if rule.reach else "import"), (rule.name, cell)
        assert set(rule.forbidden) <= words, (rule.name, sorted(set(rule.forbidden) - words))


# --- the checker can fail: each rule broken on purpose in a package of a few files ---------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"mcad/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (path.parent / "__init__.py").exists() and path.name != "__init__.py":
            (path.parent / "__init__.py").write_text("")
        path.write_text(text)
    return root


def _module(name: str) -> str:
    return name.removesuffix(".py").replace("/", ".")


TC = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    "


@pytest.mark.parametrize(("name", "text", "statement", "reached"), [
    ("mcad/model/ledger.py", "import kubernetes.client\n", "import kubernetes.client", "kubernetes"),
    ("mcad/api/views.py", "def f():\n    from urllib3 import util\n", "from urllib3 import util", "urllib3"),
    ("mcad/cli/controller.py", f"{TC}import urllib3\n", "import urllib3", "urllib3"),
])
def test_the_client_rule_reports_a_client_import_outside_kube(tmp_path: Path, name: str, text: str,
                                                              statement: str, reached: str) -> None:
    root = _package(tmp_path, {"mcad/k8s/kube.py": "import kubernetes\nimport urllib3\n", name: text})
    found = rule_violations(root, PACKAGE, CLIENT_RULE)
    assert len(found) == 1, found
    assert found[0].startswith(f"{_module(name)} -> {reached}: {name}:")
    assert f"`{statement}`" in found[0]


_PURE_NEIGHBOURS = {
    "mcad/k8s/kube.py": "import threading\n",  # not a pure module: may use threads
    "mcad/loop/dispatcher.py": "import threading\nfrom mcad import kube\n",
    "mcad/hub/clusters.py": "import threading\n",
    "mcad/admission/review.py": "",
    "mcad/metrics.py": "",
    "mcad/wiring.py": "",
    "mcad/errors.py": "",
    # Allowed: the standard library and other packages but the forbidden ones, mcad.errors, the pure modules of
    # mcad.admission and mcad.serve.
    "mcad/model/lifecycle.py": ("from mcad.errors import ApiError\nimport structlog\nimport time\n"
                                "from mcad.admission.facts import Facts\nfrom mcad.serve import history\n"),
    "mcad/admission/facts.py": "from mcad.admission.request import UserInfo\n",
    "mcad/admission/request.py": "",
    "mcad/serve/history.py": "",
}


@pytest.mark.parametrize(("name", "text", "statement", "reached"), [
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
    ("mcad/model/fit.py", "import asyncio\n", "import asyncio", "asyncio"),
    ("mcad/api/raw.py", "from socket import create_connection\n", "from socket import create_connection", "socket"),
    ("mcad/model/assess.py", "from mcad.loop.dispatcher import BEHIND\n", "from mcad.loop.dispatcher import BEHIND",
     "mcad.loop.dispatcher"),
    ("mcad/hub/placement.py", "from mcad.hub import clusters\n", "from mcad.hub import clusters", "mcad.hub.clusters"),
    ("mcad/model/tenancy.py", "from mcad.admission import review\n", "from mcad.admission import review",
     "mcad.admission.review"),
    ("mcad/model/keys.py", f"{TC}from mcad.metrics import Metrics\n", "from mcad.metrics import Metrics",
     "mcad.metrics"),
    ("mcad/serve/history.py", "from mcad import wiring\n", "from mcad import wiring", "mcad.wiring"),
    ("mcad/admission/facts.py", "import threading\n", "import threading", "threading"),
])
def test_the_pure_rule_reports_an_import_of_io_threads_or_a_higher_layer(tmp_path: Path, name: str, text: str,
                                                                         statement: str, reached: str) -> None:
    root = _package(tmp_path, {**_PURE_NEIGHBOURS, name: text})
    line = text.count("\n", 0, text.index(statement)) + 1
    under = " (under TYPE_CHECKING)" if text.startswith(TC) else ""
    assert rule_violations(root, PACKAGE, PURE_RULE) == [
        f"{_module(name)} -> {reached}: {name}:{line} `{statement}`{under}: {PURE_RULE.name}"]


def test_the_pure_rule_follows_every_chain_and_names_each_step(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        # Through a shared module: the breach is two steps away.
        "mcad/model/ledger.py": "from mcad import clock\n",
        "mcad/clock.py": "import time\nimport threading\n",
        # Stops at the first forbidden module (not also at the threads and client mcad.k8s.wrapped imports), and
        # does not go through mcad.model.status, which the rule checks on its own.
        "mcad/model/lifecycle.py": "from mcad.model.status import view\nfrom mcad.k8s.wrapped import NotSynced\n",
        "mcad/k8s/wrapped.py": "import threading\nfrom mcad.k8s import kube\n",
        "mcad/k8s/kube.py": "import kubernetes\n",
        # Three steps, the last one only for annotations.
        "mcad/model/status.py": "from mcad.errors import ApiError\n",
        "mcad/errors.py": "from mcad.log import log\n",
        "mcad/log.py": f"{TC}from mcad.loop.notices import Notices\n",
        "mcad/loop/notices.py": "",
        # The pure facts of admission may be reached; they are checked as pure modules themselves.
        "mcad/model/tenancy.py": "from mcad.admission.facts import Facts\n",
        "mcad/admission/facts.py": ("from mcad.admission.request import UserInfo\n"
                                    "from mcad.admission import kubefacts\n"),
        "mcad/admission/request.py": "",
        "mcad/admission/kubefacts.py": "from mcad.k8s import kube\n",
    })
    assert rule_violations(root, PACKAGE, PURE_RULE) == [
        "mcad.admission.facts -> mcad.admission.kubefacts: mcad/admission/facts.py:2 "
        f"`from mcad.admission import kubefacts`: {PURE_RULE.name}",
        "mcad.model.ledger -> mcad.clock -> threading: mcad/model/ledger.py:1 `from mcad import clock`; "
        f"mcad/clock.py:2 `import threading`: {PURE_RULE.name}",
        "mcad.model.lifecycle -> mcad.k8s.wrapped: mcad/model/lifecycle.py:2 `from mcad.k8s.wrapped import NotSynced`: "
        f"{PURE_RULE.name}",
        "mcad.model.status -> mcad.errors -> mcad.log -> mcad.loop.notices: mcad/model/status.py:1 "
        "`from mcad.errors import ApiError`; mcad/errors.py:1 `from mcad.log import log`; mcad/log.py:3 "
        f"`from mcad.loop.notices import Notices` (under TYPE_CHECKING): {PURE_RULE.name}",
    ]


# One case per layer rule: a package of a few files, and what the rule says of it (everything else in it is allowed).
_LAYER_CASES = [
    pytest.param(API_RULE, {
        # The views named the node-health verdict where the model kept it: api and model imported each other.
        "mcad/api/views.py": "from mcad.api.podgroups import PodGroup\nfrom mcad.model.nodehealth import Verdict\n",
        "mcad/model/nodehealth.py": "from mcad.api.resources import ResourceVector\n",
        "mcad/api/podgroups.py": "from mcad.api.resources import ResourceVector\n",  # the api's own: allowed
        "mcad/api/resources.py": "",
        "mcad/api/raw.py": f"{TC}from mcad.errors import ApiError\n",  # not even the shared modules
        "mcad/errors.py": "",
    }, [
        "mcad.api.raw -> mcad.errors: mcad/api/raw.py:3 `from mcad.errors import ApiError` (under TYPE_CHECKING)",
        "mcad.api.views -> mcad.model.nodehealth: mcad/api/views.py:2 `from mcad.model.nodehealth import Verdict`",
    ], id="api"),
    pytest.param(MODEL_RULE, {
        # The namespace rules named admission's Facts: the model reached the layer above it, though a pure module.
        "mcad/model/tenancy.py": "from mcad.admission.facts import Facts\nfrom mcad.model.quota import BINDING\n",
        "mcad/admission/facts.py": "from mcad.model.tenancy import NamespaceFacts\n",  # admission may use the model
        "mcad/model/quota.py": "from mcad.errors import TIMED_OUT\nfrom mcad.api.raw import as_list\n",  # allowed
        "mcad/errors.py": "",
        "mcad/api/raw.py": "",
        "mcad/model/fit.py": "from mcad.hub.placement import WorkerPlacement\n",
        "mcad/hub/placement.py": "",
        "mcad/model/assess.py": "from mcad.serve import history\n",
        "mcad/serve/history.py": "",
    }, [
        "mcad.model.assess -> mcad.serve.history: mcad/model/assess.py:1 `from mcad.serve import history`",
        "mcad.model.fit -> mcad.hub.placement: mcad/model/fit.py:1 `from mcad.hub.placement import WorkerPlacement`",
        "mcad.model.tenancy -> mcad.admission.facts: mcad/model/tenancy.py:1 `from mcad.admission.facts import Facts`",
    ], id="model"),
    pytest.param(K8S_RULE, {
        "mcad/k8s/wrapped.py": "from mcad.loop.sites import Sites\n",
        "mcad/loop/sites.py": "",
        "mcad/k8s/events.py": "from mcad import metrics\n",
        "mcad/metrics.py": "from mcad.serve.frontdoor import Stats\n",
        "mcad/serve/frontdoor.py": "",
        # Allowed: the model, and what it reaches of the pure modules of other layers.
        "mcad/k8s/tenantstore.py": "from mcad.model import tenancy\nfrom mcad.hub.placement import Policy\n",
        "mcad/model/tenancy.py": "from mcad.admission.facts import Facts\n",
        "mcad/admission/facts.py": "",
        "mcad/hub/placement.py": "",
    }, [
        "mcad.k8s.events -> mcad.metrics -> mcad.serve.frontdoor: mcad/k8s/events.py:1 `from mcad import metrics`; "
        "mcad/metrics.py:1 `from mcad.serve.frontdoor import Stats`",
        "mcad.k8s.wrapped -> mcad.loop.sites: mcad/k8s/wrapped.py:1 `from mcad.loop.sites import Sites`",
    ], id="k8s"),
    pytest.param(dataclasses.replace(LOOP_RULE, exempt=(("mcad.loop.dispatcher", "mcad.hub.sites"),)), {
        # Exempt, and followed further: what the exempt module reaches is still checked.
        "mcad/loop/dispatcher.py": "from mcad.hub.sites import WorkerSites\nfrom mcad.hub.placement import Policy\n",
        "mcad/hub/sites.py": "from mcad.loop import sites\nfrom mcad.serve import server\n",
        "mcad/hub/placement.py": "",
        "mcad/loop/sites.py": "from mcad.k8s import apply\n",
        "mcad/k8s/apply.py": "from mcad.model import retry\n",
        "mcad/model/retry.py": "",
        "mcad/serve/server.py": "",
        "mcad/loop/notices.py": "from mcad.metrics import Metrics\n",
        "mcad/metrics.py": "from mcad.serve.frontdoor import Stats\n",
        "mcad/serve/frontdoor.py": "",
        "mcad/loop/evictions.py": "from mcad.admission.facts import Facts\nfrom mcad.admission import server\n",
        "mcad/admission/facts.py": "",
        "mcad/admission/server.py": "",
    }, [
        "mcad.loop.dispatcher -> mcad.hub.placement: mcad/loop/dispatcher.py:2 `from mcad.hub.placement import Policy`",
        "mcad.loop.dispatcher -> mcad.hub.sites -> mcad.serve.server: mcad/loop/dispatcher.py:1 "
        "`from mcad.hub.sites import WorkerSites`; mcad/hub/sites.py:2 `from mcad.serve import server`",
        "mcad.loop.evictions -> mcad.admission.server: mcad/loop/evictions.py:2 `from mcad.admission import server`",
        "mcad.loop.notices -> mcad.metrics -> mcad.serve.frontdoor: mcad/loop/notices.py:1 "
        "`from mcad.metrics import Metrics`; mcad/metrics.py:1 `from mcad.serve.frontdoor import Stats`",
    ], id="loop"),
    pytest.param(HUB_RULE, {
        "mcad/hub/connections.py": "from mcad.serve import server\n",
        "mcad/serve/server.py": "",
        "mcad/hub/sites.py": "from mcad.loop.sites import Host\nfrom mcad.k8s import kube\n",  # below the hub
        "mcad/loop/sites.py": "",
        "mcad/k8s/kube.py": "",
        "mcad/hub/clusters.py": "def f():\n    from mcad import wiring\n",
        "mcad/wiring.py": "",
    }, [
        "mcad.hub.clusters -> mcad.wiring: mcad/hub/clusters.py:2 `from mcad import wiring`",
        "mcad.hub.connections -> mcad.serve.server: mcad/hub/connections.py:1 `from mcad.serve import server`",
    ], id="hub"),
    pytest.param(SERVE_RULE, {
        # The offline view built its own dispatcher: what is served reached the composition root.
        "mcad/serve/debug.py": "from mcad.wiring import build, quota_served\n",
        "mcad/wiring.py": "from mcad.cli.render import table\n",
        "mcad/cli/render.py": "",
        "mcad/serve/server.py": "from mcad.serve import debug\nfrom mcad.admission import callers\n",
        "mcad/admission/callers.py": "",
        "mcad/serve/dashboard.py": "from mcad.k8s import kube\n",
        "mcad/k8s/kube.py": "from mcad.cli import render\n",
    }, [
        "mcad.serve.dashboard -> mcad.k8s.kube -> mcad.cli.render: mcad/serve/dashboard.py:1 "
        "`from mcad.k8s import kube`; mcad/k8s/kube.py:1 `from mcad.cli import render`",
        "mcad.serve.debug -> mcad.wiring: mcad/serve/debug.py:1 `from mcad.wiring import build, quota_served`",
    ], id="serve"),
    pytest.param(ADMISSION_RULE, {
        "mcad/admission/server.py": "from mcad.serve import server\n",
        "mcad/serve/server.py": "from mcad.serve import debug\n",
        "mcad/serve/debug.py": "from mcad import wiring\n",
        "mcad/wiring.py": "from mcad.cli.render import table\n",
        "mcad/cli/render.py": "",
    }, [
        "mcad.admission.server -> mcad.serve.server -> mcad.serve.debug -> mcad.wiring: "
        "mcad/admission/server.py:1 `from mcad.serve import server`; mcad/serve/server.py:1 "
        "`from mcad.serve import debug`; mcad/serve/debug.py:1 `from mcad import wiring`",
    ], id="admission"),
    pytest.param(SHARED_RULE, {
        "mcad/metrics.py": "from mcad.serve.frontdoor import Stats\nfrom mcad.k8s.events import EventCounters\n",
        "mcad/serve/frontdoor.py": "",
        "mcad/k8s/events.py": "",
        "mcad/clock.py": "def f():\n    import mcad.loop.dispatcher\n",
        "mcad/loop/dispatcher.py": "",
        "mcad/errors.py": "",
        "mcad/log.py": "import structlog\n",
    }, [
        "mcad.clock -> mcad.loop.dispatcher: mcad/clock.py:2 `import mcad.loop.dispatcher`",
        "mcad.metrics -> mcad.serve.frontdoor: mcad/metrics.py:1 `from mcad.serve.frontdoor import Stats`",
    ], id="shared"),
    pytest.param(ENTRY_POINTS_RULE, {
        "mcad/serve/debug.py": "from mcad.cli import controller\n",
        "mcad/cli/controller.py": "",
        "mcad/cli/mcadctl.py": "from mcad.cli import render\n",  # the entry points import each other
        "mcad/cli/render.py": "",
        "mcad/loop/dispatcher.py": "from mcad.serve import debug\n",  # a direct rule: reaching is not importing
    }, [
        "mcad.serve.debug -> mcad.cli.controller: mcad/serve/debug.py:1 `from mcad.cli import controller`",
    ], id="entry points"),
    pytest.param(WIRING_RULE, {
        "mcad/wiring.py": "",
        "mcad/cli/controller.py": "from mcad import wiring\n",
        "mcad/cli/offline.py": "from mcad.wiring import build\n",
        "mcad/serve/debug.py": "from mcad.wiring import build\n",  # the offline view is handed its dispatcher
        "mcad/serve/server.py": "import mcad.wiring\nfrom mcad.serve import debug\n",
    }, [
        "mcad.serve.debug -> mcad.wiring: mcad/serve/debug.py:1 `from mcad.wiring import build`",
        "mcad.serve.server -> mcad.wiring: mcad/serve/server.py:1 `import mcad.wiring`",
    ], id="wiring"),
    pytest.param(SETTINGS_RULE, {
        "mcad/settings.py": "from mcad.hub.clusters import HubConfig\nfrom mcad.serve.server import Server\n",
        "mcad/hub/clusters.py": "",  # the values of the layers it configures
        "mcad/serve/server.py": "",
    }, [
        "mcad.settings -> mcad.serve.server: mcad/settings.py:2 `from mcad.serve.server import Server`",
    ], id="settings"),
    pytest.param(SETTINGS_READERS_RULE, {
        "mcad/settings.py": "",
        "mcad/wiring.py": "from mcad.settings import SchedulingSettings\n",
        "mcad/cli/controller.py": "from mcad import settings\n",
        "mcad/loop/cycle.py": "from mcad.settings import SchedulingSettings\n",  # owners are handed plain values
    }, [
        "mcad.loop.cycle -> mcad.settings: mcad/loop/cycle.py:1 `from mcad.settings import SchedulingSettings`",
    ], id="settings readers"),
]


@pytest.mark.parametrize(("rule", "files", "expected"), _LAYER_CASES)
def test_each_layer_rule_reports_what_its_modules_reach(tmp_path: Path, rule: Rule, files: dict[str, str],
                                                        expected: list[str]) -> None:
    root = _package(tmp_path, files)
    assert rule_violations(root, PACKAGE, rule) == [f"{message}: {rule.name}" for message in expected]


def test_the_loop_exemptions_let_through_what_they_name_and_say_when_they_are_not_needed(tmp_path: Path) -> None:
    # The list the dispatcher would need if it built hub mode's owners itself.
    rule = dataclasses.replace(LOOP_RULE, exempt=(("mcad.loop.dispatcher", "mcad.hub.clusters"),
                                                  ("mcad.loop.dispatcher", "mcad.hub.placement"),
                                                  ("mcad.loop.dispatcher", "mcad.hub.sites")))
    root = _package(tmp_path, {
        "mcad/loop/dispatcher.py": ("from mcad.hub.placement import WorkerPlacement\n"
                                    "from mcad.hub.sites import WorkerSites\n"),
        "mcad/hub/clusters.py": "",
        "mcad/hub/placement.py": "",
        "mcad/hub/sites.py": "from mcad.hub import clusters, placement\n",
        "mcad/loop/evictions.py": "from mcad.hub import clusters\n",  # not exempt: only the dispatcher is
    })
    assert rule_violations(root, PACKAGE, rule) == [
        f"mcad.loop.evictions -> mcad.hub.clusters: mcad/loop/evictions.py:1 `from mcad.hub import clusters`: "
        f"{rule.name}"]
    assert stale_exemptions(root, PACKAGE, rule) == []
    # The refactor takes WorkerSites out of the dispatcher: it reaches mcad.hub.clusters only through the import left.
    (root / "mcad/loop/dispatcher.py").write_text("from mcad.hub.placement import WorkerPlacement\n")
    assert stale_exemptions(root, PACKAGE, rule) == [("mcad.loop.dispatcher", "mcad.hub.clusters"),
                                                          ("mcad.loop.dispatcher", "mcad.hub.sites")]
    assert rule_violations(root, PACKAGE, rule) == [
        f"mcad.loop.evictions -> mcad.hub.clusters: mcad/loop/evictions.py:1 `from mcad.hub import clusters`: "
        f"{rule.name}"]


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


def test_the_circle_rule_counts_imports_under_type_checking(tmp_path: Path) -> None:
    # A circle met in practice: mcad.api.podgroups named mcad.api.views' types for annotations only.
    root = _package(tmp_path, {
        "mcad/api/appwrapper.py": "from mcad.api.podgroups import PodGroup, gang\n",
        "mcad/api/podgroups.py": f"{TC}from mcad.api.views import NodeView, Taint\n",
        "mcad/api/views.py": "from mcad.api.appwrapper import APPWRAPPER_LABEL\n",
    })
    assert circles(root, PACKAGE) == [
        "import circle mcad.api.appwrapper -> mcad.api.podgroups -> mcad.api.views -> mcad.api.appwrapper "
        "(among mcad.api.appwrapper, mcad.api.podgroups, mcad.api.views): mcad/api/appwrapper.py:1 "
        "`from mcad.api.podgroups import PodGroup, gang`; mcad/api/podgroups.py:3 "
        "`from mcad.api.views import NodeView, Taint` (under TYPE_CHECKING); mcad/api/views.py:1 "
        "`from mcad.api.appwrapper import APPWRAPPER_LABEL`"
    ]
    # Nested in a class, or spelt typing.TYPE_CHECKING, it counts the same; its else branch runs, so it counts too.
    for text in ("import typing\nclass A:\n    if typing.TYPE_CHECKING:\n        from mcad.api import views\n",
                 "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    import mcad.api.views\n"):
        (root / "mcad/api/podgroups.py").write_text(text)
        assert len(circles(root, PACKAGE)) == 1, text


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
