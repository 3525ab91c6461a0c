"""The docs check: README.md and docs/ cannot drift from the tree or from the code.

- Every relative link and image in README.md, CHANGELOG.md and docs/**/*.md names a file or directory of the
  repository, and every ``#anchor`` names a heading of the target page under GitHub's slug rules (lower case,
  punctuation dropped, each space a hyphen, ``-1``, ``-2``... for repeated headings). External ``http(s)`` links
  are not fetched (no network in unit tests); they must be well formed: a scheme, a host, no whitespace.
- Every option of ``mcad-controller`` (read from its click command) appears in docs/configuration.md, and every
  leaf key path of charts/mcad/values.yaml (``webhook.clientAuth.enabled``, written in backticks) appears there too.
- Every ``mcadctl`` command and option appears in docs/mcadctl.md.
- Every figure the README quotes on a line that links to docs/performance.md (its "what works now" rows on
  throughput, scale and Kueue) is a figure of docs/performance.md: the README quotes the performance page, never a
  figure of its own.

Each checker is a function over text (and the files the links name), so the tests at the bottom show it reporting
a broken link, a missing anchor, a malformed URL, an undocumented flag and an undocumented value on synthetic
input: a check that cannot fail would prove nothing. Links and headings inside fenced code blocks and inline code
are not links and not headings, as on GitHub.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

from mcad.cli import controller, mcadctl
from test.support import write_tree

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = REPO / "docs" / "configuration.md"
MCADCTL_PAGE = REPO / "docs" / "mcadctl.md"
PERFORMANCE = REPO / "docs" / "performance.md"
VALUES = REPO / "charts" / "mcad" / "values.yaml"


def doc_pages(root: Path = REPO) -> list[Path]:
    return [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").rglob("*.md"))]


# --- Markdown, as far as links and headings go -----------------------------------------------------------------

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_LINK = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
_HTML_ANCHOR = re.compile(r"""<[a-z]+\b[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fence = ""
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if match:
            marker = match.group(1)
            if not fence:
                fence = marker
                continue
            if marker[0] == fence[0] and len(marker) >= len(fence):
                fence = ""
                continue
        if not fence:
            yield number, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (links as their text, code without backticks), lower case,
    characters other than letters, digits, spaces, hyphens and underscores dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (repeats numbered as GitHub does) and explicit HTML ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(text):
        heading = _HEADING.match(line)
        if heading:
            slug = github_slug(heading.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(_HTML_ANCHOR.findall(line))
    return found


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line number, target) of every inline link, image and HTML href/src outside code."""
    for number, line in prose_lines(text):
        if _HEADING.match(line) is None or "](" in line:
            prose = _CODE_SPAN.sub("", line)
            for target in _INLINE_LINK.findall(prose):
                yield number, target
            for target in _HTML_LINK.findall(prose):
                yield number, target


_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"^(?:{_LABEL}\.)*{_LABEL}$|^\[[0-9a-f:.]+\]$")


def external_link_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if any(c.isspace() for c in url):
        return "has whitespace"
    host = parts.hostname or ""
    if not host:
        return "has no host"
    if not _HOST.match(host if not host.count(":") else f"[{host}]"):
        return f"has a malformed host {host!r}"
    return None


def link_problems(page: Path, root: Path, read: Any = None) -> list[str]:
    """What is wrong with the links of ``page`` (a file under ``root``): one line per broken link, naming the
    page, the line and the target. ``read`` reads a page's text (default: from disk)."""
    read = read or (lambda path: path.read_text(encoding="utf-8"))
    text = read(page)
    where = page.relative_to(root)
    problems: list[str] = []
    anchor_cache: dict[Path, set[str]] = {}

    def anchors_of(path: Path) -> set[str]:
        if path not in anchor_cache:
            anchor_cache[path] = anchors(read(path))
        return anchor_cache[path]

    for number, target in links(text):
        scheme = urlsplit(target).scheme
        if scheme in ("http", "https"):
            problem = external_link_problem(target)
            if problem:
                problems.append(f"{where}:{number}: external link {target!r} {problem}")
            continue
        if scheme == "mailto":
            continue
        if scheme:
            problems.append(f"{where}:{number}: link {target!r}: scheme {scheme!r} is neither http(s) nor relative")
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        try:
            destination.relative_to(root.resolve() if path_part else root)
        except ValueError:
            problems.append(f"{where}:{number}: link {target!r} leaves the repository")
            continue
        if not destination.exists():
            problems.append(f"{where}:{number}: link {target!r}: {path_part} does not exist")
            continue
        if anchor:
            if destination.suffix != ".md" or destination.is_dir():
                problems.append(f"{where}:{number}: link {target!r}: an anchor into {path_part}, which is no page")
            elif anchor not in anchors_of(destination):
                name = path_part or str(where)
                problems.append(f"{where}:{number}: link {target!r}: no heading of {name} has the anchor #{anchor}")
    return problems


# --- Flags and values -------------------------------------------------------------------------------------------

def long_options(command: click.Command) -> list[str]:
    """Every long option of a click command (``--x`` and its ``--no-x``), in declaration order."""
    return [opt for param in command.params if isinstance(param, click.Option)
            for opt in (*param.opts, *param.secondary_opts) if opt.startswith("--")]


def mentioned(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def undocumented_options(command: click.Command, text: str) -> list[str]:
    return [opt for opt in long_options(command) if not mentioned(opt, text)]


def undocumented_commands(group: click.Group, text: str, program: str = "mcadctl") -> list[str]:
    """Subcommands the page does not name as `` `PROGRAM NAME``, and their options it does not mention."""
    missing: list[str] = []
    for name, command in sorted(group.commands.items()):
        if not re.search(rf"`{re.escape(program)} {re.escape(name)}\b", text):
            missing.append(f"{program} {name}")
        missing += [f"{program} {name} {opt}" for opt in undocumented_options(command, text)]
    return missing


def leaf_paths(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of a values file's leaves: every value that is not a non-empty mapping (lists, scalars, ``{}``)."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from leaf_paths(value, f"{path}.")
        else:
            yield path


def undocumented_values(values: Mapping[str, Any], text: str) -> list[str]:
    return [path for path in leaf_paths(values) if f"`{path}`" not in text]


# --- Figures the README quotes from the performance page -------------------------------------------------------

_FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")


def figures(text: str) -> set[float]:
    """Every number written in the text (``1,000`` is 1000, ``126.0`` is 126), link targets left out."""
    prose = re.sub(r"\]\([^)]*\)", "]", text)
    return {float(number.replace(",", "")) for number in _FIGURE.findall(prose)}


def unquoted_figures(readme: str, page: str, page_path: str = "docs/performance.md") -> list[str]:
    """``README.md:LINE: N`` for each number on a README line that links to the performance page which that page
    does not state."""
    stated = figures(page)
    problems: list[str] = []
    for number, line in enumerate(readme.splitlines(), start=1):
        if f"]({page_path}" not in line:
            continue
        problems += [f"README.md:{number}: {figure:g}" for figure in sorted(figures(line) - stated)]
    return problems


def _report(what: str, missing: Iterable[str], where: str) -> str:
    return f"{what} missing from {where}: " + ", ".join(missing)


# --- The tree -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page: Path) -> None:
    assert link_problems(page, REPO) == []


def test_the_docs_have_pages_and_the_checks_see_links() -> None:
    pages = doc_pages()
    assert len(pages) > 10, "docs/ should hold the pages the README links to"
    assert sum(1 for _ in links((REPO / "README.md").read_text())) > 10, "the link reader finds no links"


def test_every_controller_flag_is_documented() -> None:
    assert isinstance(controller.main, click.Command)
    assert len(long_options(controller.main)) > 40
    missing = undocumented_options(controller.main, CONFIGURATION.read_text())
    assert not missing, _report("controller flags", missing, "docs/configuration.md")


def test_every_chart_value_is_documented() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert len(list(leaf_paths(values))) > 50
    missing = undocumented_values(values, CONFIGURATION.read_text())
    assert not missing, _report("chart values", missing, "docs/configuration.md")


def test_every_mcadctl_command_and_option_is_documented() -> None:
    assert isinstance(mcadctl.main, click.Group)
    text = MCADCTL_PAGE.read_text()
    missing = undocumented_options(mcadctl.main, text) + undocumented_commands(mcadctl.main, text)
    assert not missing, _report("mcadctl commands and options", missing, "docs/mcadctl.md")


def test_the_readme_quotes_only_figures_of_the_performance_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert sum(1 for line in readme.splitlines() if "](docs/performance.md" in line) >= 3, \
        "the README's performance rows no longer link to docs/performance.md: this check would see nothing"
    assert unquoted_figures(readme, PERFORMANCE.read_text()) == []


# --- The checks, shown failing on synthetic input --------------------------------------------------------------

def _site(tmp_path: Path, pages: Mapping[str, str]) -> Path:
    return write_tree(tmp_path, pages)


def test_slugs_follow_githubs_rules() -> None:
    assert github_slug("Fit: per node by default") == "fit-per-node-by-default"
    assert github_slug("`make e2e`: the suite on KinD (machines with Docker)") == \
        "make-e2e-the-suite-on-kind-machines-with-docker"
    assert github_slug("Reaching the controller: the leader's Service, no pods/proxy") == \
        "reaching-the-controller-the-leaders-service-no-podsproxy"
    assert github_slug("Preemption's bounds") == "preemptions-bounds"
    assert github_slug("A [linked](x.md) heading") == "a-linked-heading"
    assert anchors("# Same\n## Same\n### Same\n") == {"same", "same-1", "same-2"}


def test_a_missing_file_is_reported(tmp_path: Path) -> None:
    root = _site(tmp_path, {"README.md": "# Top\nSee [the guide](docs/guide.md) and [ok](README.md).\n"})
    assert link_problems(root / "README.md", root) == [
        "README.md:2: link 'docs/guide.md': docs/guide.md does not exist"]


def test_a_missing_anchor_is_reported_in_another_page_and_in_the_same_one(tmp_path: Path) -> None:
    root = _site(tmp_path, {
        "README.md": "# Top\n[a](docs/a.md#fit) [b](docs/a.md#gone) [c](#top) [d](#nowhere)\n",
        "docs/a.md": "# A\n## Fit\n"})
    assert link_problems(root / "README.md", root) == [
        "README.md:2: link 'docs/a.md#gone': no heading of docs/a.md has the anchor #gone",
        "README.md:2: link '#nowhere': no heading of README.md has the anchor #nowhere"]


def test_a_relative_link_from_a_docs_page_resolves_from_that_page(tmp_path: Path) -> None:
    root = _site(tmp_path, {"README.md": "# Quick start\n",
                            "docs/a.md": "[up](../README.md#quick-start) [wrong](README.md) ![pic](images/x.png)\n"})
    assert link_problems(root / "docs" / "a.md", root) == [
        "docs/a.md:1: link 'README.md': README.md does not exist",
        "docs/a.md:1: link 'images/x.png': images/x.png does not exist"]


def test_malformed_external_links_are_reported_without_fetching(tmp_path: Path) -> None:
    root = _site(tmp_path, {"README.md": "[ok](https://kwok.sigs.k8s.io) [no host](https:///path) "
                                         "[bad](http://exa_mple..com) [ftp](ftp://example.com/x)\n"})
    assert link_problems(root / "README.md", root) == [
        "README.md:1: external link 'https:///path' has no host",
        "README.md:1: external link 'http://exa_mple..com' has a malformed host 'exa_mple..com'",
        "README.md:1: link 'ftp://example.com/x': scheme 'ftp' is neither http(s) nor relative"]


def test_links_in_code_are_not_links(tmp_path: Path) -> None:
    root = _site(tmp_path, {"README.md": "# T\n```md\n[x](missing.md)\n```\n`[y](missing.md)` and [z](gone.md)\n"
                                         "<img src=\"nope.png\" alt=\"\">\n"})
    assert link_problems(root / "README.md", root) == [
        "README.md:5: link 'gone.md': gone.md does not exist",
        "README.md:6: link 'nope.png': nope.png does not exist"]


def test_a_link_out_of_the_repository_is_reported(tmp_path: Path) -> None:
    root = _site(tmp_path, {"repo/README.md": "[out](../secret.md)\n", "secret.md": "x\n"})
    assert link_problems(root / "repo" / "README.md", root / "repo") == [
        "README.md:1: link '../secret.md' leaves the repository"]


def test_an_undocumented_flag_is_named() -> None:
    @click.command()
    @click.option("--documented")
    @click.option("--quota/--no-quota", default=True)
    @click.option("--brand-new-flag", is_flag=True)
    def command(**_: Any) -> None: ...

    text = "| `--documented` | ... |\n| `--quota/--no-quota` | on |\n| `--brand-new` | a prefix is not the flag |"
    assert undocumented_options(command, text) == ["--brand-new-flag"]
    assert undocumented_options(command, text + "\n`--brand-new-flag`") == []


def test_an_undocumented_mcadctl_command_is_named() -> None:
    @click.group()
    def group() -> None: ...

    @group.command()
    @click.option("--nodes", is_flag=True)
    def ledger(**_: Any) -> None: ...

    @group.command()
    def fresh() -> None: ...

    assert undocumented_commands(group, "`mcadctl ledger`: `--nodes`") == ["mcadctl fresh"]
    assert undocumented_commands(group, "`mcadctl ledger`") == ["mcadctl fresh", "mcadctl ledger --nodes"]


def test_an_undocumented_chart_value_is_named() -> None:
    values = yaml.safe_load("webhook:\n  clientAuth:\n    enabled: false\n    names: []\n  extra: {}\n"
                            "resources:\n  requests: {cpu: 200m}\n")
    assert list(leaf_paths(values)) == ["webhook.clientAuth.enabled", "webhook.clientAuth.names", "webhook.extra",
                                        "resources.requests.cpu"]
    text = "`webhook.clientAuth.enabled`, `webhook.clientAuth`, `webhook.extra`, resources.requests.cpu"
    assert undocumented_values(values, text) == ["webhook.clientAuth.names", "resources.requests.cpu"]


def test_a_readme_figure_the_performance_page_does_not_state_is_named() -> None:
    readme = ("# T\n| throughput | 96\u2013164 AppWrappers/s; 87.4 % (85.7-89.0, 29 pairs) "
              "| [P](docs/performance.md#x) |\n"
              "| other | 7 s, not a performance line | [C](docs/concepts.md) |\n")
    page = "121.9 AppWrappers/s ... 87.4 % (85.7-89.0, 29 pairs), 1,000 queued"
    assert unquoted_figures(readme, page) == ["README.md:2: 96", "README.md:2: 164"]
    assert figures("1,000 and 126.0 ms, [x](docs/performance.md#a-100000)") == {1000.0, 126.0}
