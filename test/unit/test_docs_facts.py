"""Facts the docs state about the chart and the code, checked against them so that they cannot drift apart.

- The wrapped kinds the chart lists and watches by default (``rbac.wrappedKinds`` entries with ``watch: true``) are
  the ones docs/install.md, docs/security.md and docs/concepts.md name where they say so.
- Wherever a doc says a sick node's reset (NodeUnhealthy) is not counted against retryLimit, it also says when it is
  (``mcad.loop.health.MAX_UNCOUNTED_IN_A_ROW`` uncounted resets in a row make the next one count).
- Every owner of the loop (``mcad.loop.owners.Owners``) defined under ``mcad/loop/`` has a row in
  docs/architecture.md's table of owners.
- A page with a list of contents (links to its own headings before its first section) lists every section.
- Every metric family of mcad's own (``mcad.metrics.Metrics``: those it counts and those of its ports) is in
  docs/operating.md's table, counters with their ``_total``.
- Every controller flag is set by the chart's templates or is one the chart deliberately leaves alone (``UNSET``),
  as charts/mcad/values.yaml's header says.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import click
import yaml

from mcad.cli import controller
from mcad.loop import owners
from mcad.loop.health import MAX_UNCOUNTED_IN_A_ROW
from mcad.metrics import Metrics
from test.unit.test_docs import doc_pages, github_slug, long_options, prose_lines

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
CHART = REPO / "charts" / "mcad"

# Controller flags the chart does not set, and why; the values.yaml header and docs/configuration.md say the same.
UNSET = {
    "--kubeconfig": "in a cluster the controller uses its ServiceAccount",
    "--context": "likewise",
    "--connect-only": "a check for running outside a cluster",
    "--version": "prints the version and exits",
    "--webhook-share-port": "several processes on one host share the port: tests",
    "--webhook-drain-seconds": "left at its default",
    "--leader-elect-namespace": "the pod's namespace, from $POD_NAMESPACE",
    "--webhook-cert-namespace": "the controller's namespace",
}
# Flags a template spells in pieces, and the piece it writes literally.
TEMPLATED = {"--delete-finished-appwrappers": "}}-finished-appwrappers",
             "--keep-finished-appwrappers": "}}-finished-appwrappers"}
# Other spellings the docs use for a resource's plural.
ALIASES = {"persistentvolumeclaims": ("persistentvolumeclaims", "pvcs")}
ORDINALS = {1: "second", 2: "third", 3: "fourth", 4: "fifth"}


def _squashed(text: str) -> str:
    return re.sub(r"[\s`*]+", "", text).lower()


def watched_kinds(values: dict[str, typing.Any]) -> list[str]:
    """The resources of the chart's default wrapped kinds that are listed and watched."""
    return [resource for entry in values["rbac"]["wrappedKinds"] if entry.get("watch")
            for resource in entry["resources"]]


def kinds_missing_after_watch_true(text: str, kinds: list[str]) -> list[str]:
    """Kinds not named in the sentence that follows the first "`watch: true`" of ``text`` (to its first ". ")."""
    joined = " ".join(line.strip() for line in text.splitlines())
    at = joined.find("`watch: true`")
    assert at >= 0, "no `watch: true` on the page"
    sentence = joined[at:].split(". ", 1)[0]
    squashed = _squashed(sentence)
    return [kind for kind in kinds if not any(name in squashed for name in ALIASES.get(kind, (kind,)))]


def test_the_docs_name_the_kinds_the_chart_watches() -> None:
    kinds = watched_kinds(yaml.safe_load((CHART / "values.yaml").read_text()))
    assert "pods" in kinds and "jobs" in kinds, kinds
    # docs/install.md's list of what the chart installs, and docs/security.md's "What the controller watches".
    install = (DOCS / "install.md").read_text()
    install = install[install.index("two ClusterRoles with only the verbs the controller uses"):]
    security = (DOCS / "security.md").read_text()
    security = security[security.index("### What the controller watches, and where it writes"):]
    concepts = (DOCS / "concepts.md").read_text()
    concepts = concepts[concepts.index("- **Completion.**"):]
    for page, text in (("install.md", install), ("security.md", security), ("concepts.md", concepts)):
        assert kinds_missing_after_watch_true(text, kinds) == [], page


def test_a_doc_naming_fewer_watched_kinds_is_caught() -> None:
    text = "list/watch the wrapped kinds `watch: true`: Deployments and Jobs by default. Pods are written."
    assert kinds_missing_after_watch_true(text, ["pods", "deployments", "jobs", "persistentvolumeclaims"]) == [
        "pods", "persistentvolumeclaims"]
    assert kinds_missing_after_watch_true("`watch: true`: Pods, PVCs.", ["pods", "persistentvolumeclaims"]) == []


def uncounted_without_exception(text: str) -> list[str]:
    """Lines saying a sick node's reset is not counted without saying when it is."""
    found = []
    for number, line in prose_lines(text):
        if "not counted" in line and ("NodeUnhealthy" in line or "sick node" in line):
            number_said = f"{MAX_UNCOUNTED_IN_A_ROW} " in line or ORDINALS[MAX_UNCOUNTED_IN_A_ROW] in line
            if not (number_said and ("in a row" in line or "before it" in line)):
                found.append(f"{number}: {line.strip()}")
    return found


def test_every_doc_saying_a_sick_nodes_reset_is_not_counted_says_when_it_is() -> None:
    assert MAX_UNCOUNTED_IN_A_ROW in ORDINALS
    found = {str(page.relative_to(REPO)): lines for page in doc_pages()
             if (lines := uncounted_without_exception(page.read_text()))}
    assert found == {}
    said = [page.name for page in doc_pages() if "NodeUnhealthy" in page.read_text()]
    assert {"fault-tolerance.md", "operating.md"} <= set(said)


def test_a_sick_node_line_without_the_exception_is_caught() -> None:
    assert uncounted_without_exception("reset, reason `NodeUnhealthy`, **not counted** against `retryLimit` |\n")


def loop_owner_rows() -> list[str]:
    """"`Class` (`loop/module.py`" for each owner of ``Owners`` whose class is defined under ``mcad/loop/``."""
    hints = typing.get_type_hints(owners.Owners)
    rows = []
    for field in dataclasses.fields(owners.Owners):
        for cls in (typing.get_args(hints[field.name]) or (hints[field.name],)):
            module = getattr(cls, "__module__", "")
            if module.startswith("mcad.loop."):
                rows.append(f"| `{cls.__name__}` (`loop/{module.rsplit('.', 1)[1]}.py`")
    return rows


def test_every_loop_owner_has_a_row_in_the_architecture_table() -> None:
    rows = loop_owner_rows()
    assert "| `Health` (`loop/health.py`" in rows and "| `Ownership` (`loop/ownership.py`" in rows
    text = (DOCS / "architecture.md").read_text()
    assert [row for row in rows if row not in text] == []


def sections_missing_from_contents(text: str) -> list[str]:
    """The ``## `` headings of a page with a list of contents that the list does not link to."""
    head, _, _ = text.partition("\n## ")
    contents = set(re.findall(r"^- \[[^\]]*\]\(#([^)]+)\)", head, re.MULTILINE))
    if not contents:
        return []
    headings = [line[3:].strip() for _, line in prose_lines(text) if line.startswith("## ")]
    return [heading for heading in headings if github_slug(heading) not in contents]


def test_every_list_of_contents_lists_every_section() -> None:
    found = {page.name: missing for page in doc_pages()
             if (missing := sections_missing_from_contents(page.read_text()))}
    assert found == {}
    assert sections_missing_from_contents((DOCS / "scheduling.md").read_text()) == []
    assert "- [Sick nodes" in (DOCS / "scheduling.md").read_text()


def test_a_section_left_out_of_the_contents_is_caught() -> None:
    page = "# T\n\n- [One](#one)\n\n## One\n\ntext\n\n## Two: more\n\n```\n## not a heading\n```\n"
    assert sections_missing_from_contents(page) == ["Two: more"]


def test_every_controller_flag_is_set_by_the_chart_or_left_alone_on_purpose() -> None:
    command = controller.main
    assert isinstance(command, click.Command)
    templates = "".join(path.read_text() for path in sorted((CHART / "templates").iterdir()) if path.is_file())
    pairs = {option: tuple(o for o in param.opts + param.secondary_opts if o.startswith("--"))
             for param in command.params for option in param.opts + param.secondary_opts}
    unset = [option for option in long_options(command)
             if not any(re.search(re.escape(o) + r"(?![\w-])", templates) for o in pairs[option])
             and not (option in TEMPLATED and TEMPLATED[option] in templates) and option not in UNSET]
    assert unset == [], "give these a value in charts/mcad/values.yaml, or add them to UNSET with the reason"
    assert [option for option in UNSET if option not in long_options(command)] == []


def test_every_metric_mcad_counts_is_in_the_operating_table() -> None:
    table = (DOCS / "operating.md").read_text()
    names = [family.name + ("_total" if family.type == "counter" else "")
             for family in Metrics().registry.collect() if family.name.startswith("mcad_")]
    assert "mcad_dispatch_decisions_total" in names
    assert [name for name in names if f"`{name}" not in table] == []
