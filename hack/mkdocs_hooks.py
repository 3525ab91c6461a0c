"""MkDocs hooks for the documentation site (mkdocs.yml): the site is built from the same Markdown GitHub renders.

Two things differ between GitHub and MkDocs, and these hooks make the site follow GitHub:

- **Links that leave docs/.** A page may link to any file of the repository (``../README.md``,
  ``../test/perf/README.md``, ``../charts/mcad/values.yaml``), as GitHub resolves it. MkDocs sees only docs/, so
  such a link would be "not found" and fail ``mkdocs build --strict``. Every repository file a page links to
  outside docs/ is added to the site under ``repo/`` (``repo/README.md``, ``repo/charts/mcad/values.yaml``):
  Markdown is rendered as a page, anything else is copied as it is, so the site works offline. The link is
  rewritten to that copy only when its target exists; a link to a file that does not exist is left as written, and
  the strict build fails on it as on a broken link inside docs/. A link to a directory outside docs/ goes to its
  README.md; a directory without one is no page, and the strict build fails on it. The pages added this way are
  followed in turn (the README's links to ``docs/...`` go back to the site's own pages). A ``repo/...`` entry of
  the nav adds that file too.
- **Anchors.** Headings get GitHub's anchors (lower case, punctuation dropped, each space a hyphen, repeats not
  collapsed), so ``page.md#a-heading`` links that work on GitHub work in the site, and a wrong anchor is a
  warning (``validation.anchors: warn`` in mkdocs.yml), which fails the strict build.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

REPOSITORY_PREFIX = "repo"

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_MD_LINK = re.compile(r"(\]\(\s*<?)([^)\s>]+)")
_HTML_LINK = re.compile(r"""(<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["'])([^"']+)""", re.IGNORECASE)


def github_slug(value: str, separator: str = "-") -> str:
    """The anchor GitHub gives a heading of this text: lower case, characters other than letters, digits, spaces,
    hyphens and underscores dropped, each space a hyphen (Python-Markdown's toc ``slugify`` signature)."""
    text = re.sub(r"[^\w\- ]", "", value.strip().lower())
    return text.replace(" ", separator)


def _prose_segments(line: str) -> Iterator[tuple[bool, str]]:
    """(is prose, text) pieces of a line: inline code spans are not prose."""
    at = 0
    for match in _CODE_SPAN.finditer(line):
        yield True, line[at:match.start()]
        yield False, match.group(0)
        at = match.end()
    yield True, line[at:]


def _rewrite_links(markdown: str, rewrite: Any) -> str:
    """The Markdown with every inline link and HTML href/src outside code passed through ``rewrite``."""
    out: list[str] = []
    fence = ""
    for line in markdown.splitlines(keepends=True):
        match = _FENCE.match(line)
        if match:
            marker = match.group(1)
            if not fence:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = ""
            out.append(line)
            continue
        if fence:
            out.append(line)
            continue
        pieces = []
        for is_prose, text in _prose_segments(line):
            if is_prose:
                text = _MD_LINK.sub(lambda m: m.group(1) + rewrite(m.group(2)), text)
                text = _HTML_LINK.sub(lambda m: m.group(1) + rewrite(m.group(2)), text)
            pieces.append(text)
        out.append("".join(pieces))
    return "".join(out)


def _link_targets(markdown: str) -> list[str]:
    found: list[str] = []

    def keep(target: str) -> str:
        found.append(target)
        return target

    _rewrite_links(markdown, keep)
    return found


class _Site:
    """Where a repository file is in the site: docs/X is X, any other file F is repo/F."""

    def __init__(self, config: MkDocsConfig) -> None:
        self.docs = Path(config.docs_dir).resolve()
        self.root = self.docs.parent

    def repository_path(self, src_uri: str) -> str:
        """The repository path of a site file (``concepts.md`` -> ``docs/concepts.md``)."""
        prefix = f"{REPOSITORY_PREFIX}/"
        if src_uri.startswith(prefix):
            return src_uri[len(prefix):]
        return posixpath.join(self.docs.relative_to(self.root).as_posix(), src_uri)

    def site_uri(self, repository_path: str) -> str:
        docs = self.docs.relative_to(self.root).as_posix() + "/"
        if repository_path.startswith(docs):
            return repository_path[len(docs):]
        return f"{REPOSITORY_PREFIX}/{repository_path}"

    def resolve(self, src_uri: str, target: str) -> str | None:
        """The repository path an in-repository relative link of a site file names, if that file exists (a
        directory stands for its README.md); None for external links, anchors alone, and what does not exist."""
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path or target.startswith(("/", "\\")):
            return None
        joined = posixpath.normpath(posixpath.join(posixpath.dirname(self.repository_path(src_uri)), parts.path))
        if joined.startswith("../") or joined == "..":
            return None
        path = self.root / joined
        if path.is_dir() and (path / "README.md").is_file():
            return posixpath.join(joined, "README.md")
        return joined if path.is_file() else None


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    toc = config.mdx_configs.setdefault("toc", {})
    toc["slugify"] = github_slug
    return config


def _nav_uris(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_uris(value)
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_uris(item)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Adds under repo/ every repository file outside docs/ that a page (or the nav) links to, transitively."""
    site = _Site(config)
    in_nav = {uri for uri in _nav_uris(config.nav) if uri.startswith(f"{REPOSITORY_PREFIX}/")}
    wanted = list(in_nav)
    pages = [file for file in files if file.is_documentation_page()]
    for file in pages:
        text = Path(file.abs_src_path or "").read_text(encoding="utf-8") if file.abs_src_path else ""
        wanted += [site.site_uri(path) for target in _link_targets(text)
                   if (path := site.resolve(file.src_uri, target)) is not None]
    while wanted:
        uri = wanted.pop()
        if not uri.startswith(f"{REPOSITORY_PREFIX}/") or files.get_file_from_path(uri) is not None:
            continue
        source = site.root / site.repository_path(uri)
        if not source.is_file():
            continue
        # A file only linked to is no page the nav must list (validation.nav.omitted_files).
        inclusion = InclusionLevel.UNDEFINED if uri in in_nav else InclusionLevel.NOT_IN_NAV
        added = File.generated(config, uri, abs_src_path=str(source), inclusion=inclusion)
        files.append(added)
        if added.is_documentation_page():
            text = source.read_text(encoding="utf-8")
            wanted += [site.site_uri(path) for target in _link_targets(text)
                       if (path := site.resolve(uri, target)) is not None]
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Points each link that GitHub resolves outside the page's own directory tree at the file's place in the
    site; links within docs/ from a docs page are left to MkDocs, which checks them."""
    site = _Site(config)
    src_uri = page.file.src_uri
    in_repository_copy = src_uri.startswith(f"{REPOSITORY_PREFIX}/")

    def rewrite(target: str) -> str:
        path = site.resolve(src_uri, target)
        if path is None:
            return target
        uri = site.site_uri(path)
        if not in_repository_copy and not uri.startswith(f"{REPOSITORY_PREFIX}/"):
            return target
        relative = posixpath.relpath(uri, posixpath.dirname(src_uri) or ".")
        fragment = urlsplit(target).fragment
        return f"{relative}#{fragment}" if fragment else relative

    return _rewrite_links(markdown, rewrite)
