"""The dashboard's heat map grouped by topology domain, in headless chromium (test/browser.py): the real page and
the real nodes view (``mcad.serve.dashboard.Dashboard``), served on loopback over a ledger document the test sets
(no cluster: what is checked is how the page writes down the domains the view hands it).

Levels block then rack: a heading per block by value, under it (indented) a heading per rack, the node rows under
their rack; the nodes in no domain of a level under "no <level>", last. Without levels the rows are as before."""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from mcad.serve.dashboard import Dashboard
from test import browser as chromium
from test.support import serving
from test.unit.test_dashboard import HEADER, FakeSource, ledger_node

BLOCK, RACK = "topology.example.com/block", "topology.example.com/rack"
NODES = [ledger_node("a0", topology={BLOCK: "b2", RACK: "r1"}), ledger_node("a1", topology={BLOCK: "b1"}),
         ledger_node("a2", topology={BLOCK: "b1", RACK: "r2"}), ledger_node("a3", topology={RACK: "r9"}),
         ledger_node("a4", topology={BLOCK: "b1", RACK: "r1"}), ledger_node("a5", topology={})]


def serve(dashboard: Dashboard) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path.startswith("/ui/api/"):
                answer = dashboard.view(url.path.removeprefix("/ui/api/"), dict(parse_qsl(url.query)), None)
            else:
                found = dashboard.page(url.path)
                if found is None:
                    self.send_error(404)
                    return
                answer = found
            self.send_response(answer.status)
            for name, value in {**answer.headers, "Content-Type": answer.content_type}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, *args: object) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture
def source() -> FakeSource:
    return FakeSource({"ledger": {**HEADER, "nodes": NODES, "topologyLevels": [BLOCK, RACK]},
                       "clusters": {**HEADER, "mode": "single", "clusters": []},
                       "queue": {**HEADER, "queued": [], "dispatched": [], "reservations": []}})


@pytest.fixture
def page(source: FakeSource) -> Iterator[str]:
    with serving(serve(Dashboard(source)), "/ui/#nodes") as url:
        yield url


def heat_map_rows(browser: chromium.Browser) -> list[str]:
    """Each row of the heat map's body: ``# <heading>`` (with its depth) or the node's name. Read in one script:
    the page rebuilds the table on every poll."""
    return list(browser.script("""
        return [...document.querySelectorAll("#nodes tbody tr")].map((tr) => {
          const heading = tr.querySelector("th.domain");
          if (!heading) return tr.dataset.node;
          const depth = [...heading.classList].find((c) => c.startsWith("depth"));
          return `# ${depth} ${heading.textContent} [${heading.dataset.level}=${heading.dataset.domain}]`;
        });"""))


def test_the_heat_map_groups_nodes_by_block_then_rack_with_those_in_none_last(page: str,
                                                                                source: FakeSource) -> None:
    with chromium.running() as browser:
        browser.get(page)
        rows: list[str] = browser.wait(lambda _: (found := heat_map_rows(browser)) and found,
                                       "the heat map's rows")
        assert rows == [
            f"# depth0 block b1 [{BLOCK}=b1]",
            f"# depth1 rack r1 [{RACK}=r1]", "a4",
            f"# depth1 rack r2 [{RACK}=r2]", "a2",
            f"# depth1 no rack [{RACK}=]", "a1",
            f"# depth0 block b2 [{BLOCK}=b2]",
            f"# depth1 rack r1 [{RACK}=r1]", "a0",
            f"# depth0 no block [{BLOCK}=]",
            f"# depth1 rack r9 [{RACK}=r9]", "a3",
            f"# depth1 no rack [{RACK}=]", "a5",
        ]
        # Without levels (a controller without --topology-level) the next poll draws the plain rows again.
        source.documents["ledger"] = {**HEADER, "nodes": NODES, "topologyLevels": []}
        plain: Any = browser.wait(lambda _: (found := heat_map_rows(browser)) and found[0] == "a0" and found,
                                  "the rows without headings")
        assert plain == ["a0", "a1", "a2", "a3", "a4", "a5"]
        assert browser.csp_violations() == [] and browser.console_errors() == []
