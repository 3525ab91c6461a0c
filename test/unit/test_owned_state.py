"""State owned by its writer: a record one owner of the loop writes reaches the others only as a read-only view.

- ``mcad.wiring`` builds each owned record (``OWNED``: the record's class -> the one owner that writes it, and the
  read-only faces others get) and hands the record itself to that owner alone; every other use of it reads through
  one of its faces. Checked by reading ``mcad/wiring.py`` with ``ast``.
- A record class defined beside its writer (``InFlight`` in ``mcad.loop.dispatches``) is named by no other module
  of ``mcad.loop``: no other owner can be handed it by type.
- The rule for what a final state releases is in one place, ``Active.release_final``: no module of ``mcad`` but
  ``mcad/loop/active.py`` calls what it reads of ``Decisions`` (``RELEASE_RULE``).
- The faces cannot be written through (the in-flight view is a ``Mapping`` proxy, the dispatch retries' reader a
  ``RetryReader`` with nothing that records), and the readers' parameters are typed as those faces (mypy holds the
  rest).
"""

from __future__ import annotations

import ast
import typing
from collections.abc import Mapping
from pathlib import Path

import pytest

from mcad.loop.dispatches import DISPATCH_RETRY, InFlight
from mcad.loop.evictions import EvictionOwners
from mcad.loop.notices import Notices
from mcad.loop.queued import Queued
from mcad.model.retry import FailureKind, RetryReader, RetryTimes
from test.fakes import FakeClock
from test.support import write_tree

REPO = Path(__file__).resolve().parents[2]


class Owned(typing.NamedTuple):
    writer: str  # the owner's class, the only one handed the record
    faces: frozenset[str]  # the record's attributes that give a read-only face
    module: str = ""  # the writer's module, when the record's class is defined there (others may not name it)


OWNED = {
    "InFlight": Owned("Dispatches", frozenset({"view"}), "mcad/loop/dispatches.py"),
    # The only retry times wiring builds are the dispatches': a new one with another writer earns a row of its own.
    "RetryTimes": Owned("Dispatches", frozenset({"reader"})),
}


# What the rule for releasing a final state reads and tells, and the one module that may call it.
RELEASE_RULE = (frozenset({"decided_final", "tell_undecided"}), "mcad/loop/active.py")


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _called(node: ast.AST) -> str:
    """The name a call calls: ``Cls(...)`` -> "Cls"; "" for anything else."""
    return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""


def _names(node: ast.AST) -> list[str]:
    """The names a node says: a name, an attribute, or what an import imports."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.ImportFrom):
        return [alias.name for alias in node.names]
    return []


def leaks(root: Path) -> list[str]:
    """Where ``mcad/wiring.py`` hands an owned record itself to anyone but its writer, or a module of ``mcad.loop``
    other than the writer's names a record's class."""
    found = []
    wiring = root / "mcad" / "wiring.py"
    tree = ast.parse(wiring.read_text())
    parents = _parents(tree)
    records: dict[str, str] = {}  # variable -> the record class it holds
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _called(node.value) in OWNED:
            records.update({t.id: _called(node.value) for t in node.targets if isinstance(t, ast.Name)})
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in records):
            continue
        owned = OWNED[records[node.id]]
        parent = parents[node]
        if isinstance(parent, ast.Attribute) and parent.attr in owned.faces:
            continue
        call = parents.get(parent) if isinstance(parent, ast.keyword) else parent  # an argument of which call
        if call is not None and _called(call) == owned.writer:
            continue
        found.append(f"mcad/wiring.py:{node.lineno} hands the {records[node.id]} record `{node.id}` to another than "
                     f"{owned.writer}")
    for path in sorted((root / "mcad" / "loop").glob("*.py")):
        relative = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            for cls in _names(node):
                if cls in OWNED and OWNED[cls].module and relative != OWNED[cls].module:
                    found.append(f"{relative}:{node.lineno} names {cls}, which only {OWNED[cls].writer} writes")
    return found


def test_owned_records_reach_readers_only_as_views() -> None:
    assert leaks(REPO) == []


WIRING = """
def loop():
    in_flight = InFlight()
    retries = RetryTimes(clock, DISPATCH_RETRY)
    queued = Queued(in_flight=in_flight.view)
    notices = Notices(queued, dispatch_retries=retries.reader())
    dispatches = Dispatches(queued, in_flight=in_flight, retries=retries)
    evictions = Evictions(in_flight=dispatches.in_flight)
"""


@pytest.mark.parametrize(("files", "expected"), [
    ({"mcad/wiring.py": WIRING}, []),
    ({"mcad/wiring.py": WIRING.replace("in_flight=in_flight.view", "in_flight=in_flight")},
     ["mcad/wiring.py:5 hands the InFlight record `in_flight` to another than Dispatches"]),
    ({"mcad/wiring.py": WIRING + "    shared = in_flight\n"},
     ["mcad/wiring.py:9 hands the InFlight record `in_flight` to another than Dispatches"]),
    ({"mcad/wiring.py": WIRING.replace("dispatch_retries=retries.reader()", "dispatch_retries=retries")},
     ["mcad/wiring.py:6 hands the RetryTimes record `retries` to another than Dispatches"]),
    ({"mcad/wiring.py": WIRING, "mcad/loop/queued.py": "from mcad.loop.dispatches import InFlight\n",
      "mcad/loop/dispatches.py": "class InFlight:\n    pass\n"},
     ["mcad/loop/queued.py:1 names InFlight, which only Dispatches writes"]),
])
def test_a_record_handed_beyond_its_writer_is_reported(tmp_path: Path, files: dict[str, str],
                                                      expected: list[str]) -> None:
    files.setdefault("mcad/loop/__init__.py", "")
    assert leaks(write_tree(tmp_path, files)) == expected


def test_the_in_flight_view_cannot_be_written_through() -> None:
    record = InFlight()
    view = record.view
    with pytest.raises(TypeError):
        view["ns/a"] = None  # type: ignore[index]
    assert not any(hasattr(view, name) for name in ("pop", "clear", "update", "setdefault", "popitem"))


@pytest.mark.parametrize("reader", [Queued.__init__, EvictionOwners])
def test_readers_of_the_in_flight_record_take_a_read_only_mapping(reader: typing.Any) -> None:
    hint = typing.get_type_hints(reader)["in_flight"]
    assert typing.get_origin(hint) is Mapping, f"{reader.__qualname__} takes in_flight as {hint}, not a Mapping"


def test_the_dispatch_retries_reader_records_nothing() -> None:
    times = RetryTimes(FakeClock(), DISPATCH_RETRY)
    reader = times.reader()
    times.failed("ns/a", FailureKind.TRANSIENT)
    assert reader.waiting("ns/a") and reader.attempts("ns/a") == 1, "the reader reads the owner's times live"
    assert not any(hasattr(reader, name) for name in ("failed", "succeeded", "forget", "release_all", "remaining"))
    with pytest.raises(AttributeError):
        reader.backoff = None  # type: ignore[attr-defined]


def test_notices_take_the_dispatch_retries_as_a_reader() -> None:
    assert typing.get_type_hints(Notices.__init__)["dispatch_retries"] is RetryReader


def release_rule_callers(root: Path) -> list[str]:
    """Calls, outside the module that holds the rule, of what the rule for releasing a final state reads."""
    methods, home = RELEASE_RULE
    found = []
    for path in sorted((root / "mcad").rglob("*.py")):
        relative = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods \
                    and relative != home:
                found.append(f"{relative}:{node.lineno} calls {node.func.attr}: only {home} applies that rule")
    return found


def test_the_rule_for_releasing_a_final_state_is_in_one_place() -> None:
    assert release_rule_callers(REPO) == []


def test_a_second_place_applying_the_release_rule_is_reported(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {
        "mcad/loop/active.py": "def release_final(self, aw):\n    return self._decisions.decided_final(aw)\n",
        "mcad/loop/dispatcher.py": "def sync(self, aw):\n    if not self.decisions.decided_final(aw):\n        pass\n",
    })
    assert release_rule_callers(root) == [
        "mcad/loop/dispatcher.py:2 calls decided_final: only mcad/loop/active.py applies that rule"]
