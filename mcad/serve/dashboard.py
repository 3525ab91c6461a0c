"""The dashboard: a read-only page at /ui and the JSON views it polls, served by the controller's HTTP endpoint.

Contract:
- ``GET /ui`` redirects to ``ui/`` (relative, so it works behind the API server's service or pod proxy, which
  prefixes every path); ``/ui/`` is ``index.html`` and ``/ui/<file>`` the page's other files (``mcad/ui``, package
  data: hand-written HTML, CSS and one JavaScript module, no build chain, nothing fetched from elsewhere). They
  hold no data and are open to anyone, like the login page of any web console.
- Every /ui answer carries a Content-Security-Policy that lets the page load only its own script, style and data
  (no inline script, no eval, no frames, no forms posting anywhere), ``X-Content-Type-Options: nosniff`` and
  ``Referrer-Policy: no-referrer``. The page inserts every value as text (``textContent``), never as markup.
- The views (``/ui/api/<view>``) are read with the caller's rights, exactly as /debug (``mcad.serve.server``): bearer
  token, TokenReview, SubjectAccessReview; a standby answers 503 ``{"error": "not the leader", "leader": ...}``.
  - ``queue?namespace=&state=&offset=&limit=``: the AppWrappers of namespaces where the caller may list
    appwrappers, queued ones in dispatch order (``position`` is the place in the whole queue), then those in
    their retry pause after a reset (state Resetting, with their resets, retryLimit and when the pause ends), then
    dispatched ones (with their health: Healthy, Unhealthy or AtRisk and its reason), one page of them (``limit``
    at most ``MAX_PAGE``), with the counts by state and the namespaces (at most ``MAX_NAMESPACES``) the filters
    offer. The page never holds the whole backlog. A queued row carries its ``estimatedStart`` (None, with
    ``estimateWhy``, when unknown). ``fairShare`` and ``aheadOfYou`` say where the reader stands
    (``mcad.serve.queuereport.QueueReport.standing``): for one who may list some namespaces, its own tenants named
    and the others only counted; for a cluster-wide reader, every tenant, and ``aheadOfYou`` for the namespace it
    filters on (null without one).
  - ``explain?namespace=&name=``: ``/debug/explain``'s document (``mcadctl explain``'s text, and its fault
    tolerance: health, what is due and when, retry pause, resets, policy) with the labels,
    the annotations kept for display (``mcad.api.appwrapper.shown_annotations``) and the recent Events this
    controller recorded (``mcad.k8s.recentevents``); 404 for one the caller may not list, as for one that does not
    exist.
  - ``nodes``: per node, cpu / memory / nvidia.com/gpu allocatable, used (by bound pods), reserved (dispatched,
    not bound yet) and free, with the fractions the heat map colours; cordoned and not-Ready nodes flagged; in
    hub mode grouped by worker cluster with its health. With topology levels (the ledger's ``topologyLevels``,
    the controller's --topology-level) each node carries its ``topology`` (its value of each level) and each group
    its ``domains``: ``domain_tree``, the nodes by their domain of the largest level, then of the next, the nodes
    in no domain of a level in a group of their own (``value`` null). Needs ``get`` on ``/debug/ledger``.
  - ``quota``: every quota tree's nodes with limit, used and borrowed, and the fractions of the bars. Needs
    ``get`` on ``/debug/quota``.
  - ``summary``: the headline numbers of ``mcad.serve.history`` (counts by state, dispatches per minute, time to
    dispatch over the last hour, a sparkline). Needs ``get`` on ``/metrics``: they are the metrics' content.
- Views read the latest snapshot (``mcad.serve.snapshots``) when it is at most ``FRESH_WITHIN_SECONDS`` older than the
  freshest the snapshot spacing allows, so a polling page costs the loop at most one build per interval and gets
  its answer without waiting for one (with a small queue, state at most 1 s old).
  Answers are never cached by the browser and carry ``Server-Timing: app;dur=<ms>`` (the time spent here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from importlib import resources
from itertools import islice
from typing import Any

from mcad.admission.request import UserInfo
from mcad.api.resources import parse_quantity
from mcad.k8s.recentevents import RecentEvents
from mcad.serve.queuereport import as_report
from mcad.serve.snapshots import Part, Snapshot, encode

# The views' answers: status, JSON-ready document (or bytes), extra headers.
DEFAULT_PAGE = 50
MAX_PAGE = 200
MAX_NAMESPACES = 1000
HEATMAP_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
FRESH_WITHIN_SECONDS = 0.5
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
VIEWS = ("queue", "explain", "nodes", "quota", "summary")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


class Refusal(Exception):
    """A view that cannot be answered: its status and document."""

    def __init__(self, status: int, document: Mapping[str, Any]) -> None:
        super().__init__(document.get("error", ""))
        self.status = status
        self.document = dict(document)


class Source:
    """What the views read, with the caller's rights (``mcad.serve.server.DashboardSource``); every method raises
    ``Refusal`` where /debug would refuse."""

    def snapshot(self, parts: set[Part], user: UserInfo | None, *, fresh_within: float | None,
                 require: tuple[str, ...] = ()) -> Snapshot:
        """A snapshot holding ``parts``, once ``user`` is known to hold every right of ``require`` (non-resource
        paths); no parts: only the checks (leadership, readiness, rights)."""
        raise NotImplementedError

    def visible_namespaces(self, user: UserInfo | None, shown: set[str],
                           known: frozenset[str]) -> frozenset[str] | None:
        """The namespaces of ``shown`` whose AppWrappers ``user`` may see (None: all); ``Refusal`` 403 when none
        of ``known``."""
        raise NotImplementedError

    def may_list(self, user: UserInfo | None, namespace: str) -> bool:
        raise NotImplementedError


def static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files by name, read once from the package."""
    files = {}
    for entry in resources.files("mcad.ui").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


class Dashboard:
    def __init__(self, source: Source, *, events: RecentEvents | None = None,
                 summary: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.source = source
        self.events = events
        self.summary = summary
        self.files = static_files()
        # The port this controller serves on: a standby names it with the leader, so that a page behind the API
        # server's service proxy can reach the leader's pod through the pod proxy (every replica uses one port).
        self.port: int | None = None
        self._nodes_view: tuple[int, dict[str, Any]] | None = None  # (id of the ledger document, its view)

    def page(self, path: str) -> Answer | None:
        """The answer for a static path (``/ui``, ``/ui/``, ``/ui/<file>``); None when it is not one."""
        if path == "/ui":
            return Answer(302, b"", "text/plain; charset=utf-8", {**SECURITY_HEADERS, "Location": "ui/"})
        name = path.removeprefix("/ui/") or "index.html"
        found = self.files.get(name)
        if found is None:
            return None
        body, content_type = found
        return Answer(200, body, content_type, {**SECURITY_HEADERS, "Cache-Control": "no-cache"})

    def view(self, name: str, query: Mapping[str, str], user: UserInfo | None) -> Answer:
        started = time.perf_counter()
        try:
            status, document = 200, self._view(name, query, user)
        except Refusal as refusal:
            status, document = refusal.status, refusal.document
            if document.get("error") == "not the leader" and self.port is not None:
                document["port"] = self.port
        body = encode(document)
        took = (time.perf_counter() - started) * 1000
        return Answer(status, body, "application/json", {**SECURITY_HEADERS, "Cache-Control": "no-store",
                                                         "Server-Timing": f"app;dur={took:.1f}"})

    def _view(self, name: str, query: Mapping[str, str], user: UserInfo | None) -> dict[str, Any]:
        if name == "queue":
            return self._queue(query, user)
        if name == "explain":
            return self._explain(query, user)
        if name == "nodes":
            return self._nodes(user)
        if name == "quota":
            return self._quota(user)
        if name == "summary":
            return self._summary(user)
        raise Refusal(404, {"error": f"no such view {name!r}; the views are {', '.join(VIEWS)}"})

    # ------------------------------------------------------------------------------------------ queue

    def _queue(self, query: Mapping[str, str], user: UserInfo | None) -> dict[str, Any]:
        offset = _count(query, "offset", 0, None)
        limit = _count(query, "limit", DEFAULT_PAGE, MAX_PAGE) or DEFAULT_PAGE
        only_namespace, only_state = query.get("namespace", ""), query.get("state", "")
        snapshot = self.source.snapshot({"queue"}, user, fresh_within=FRESH_WITHIN_SECONDS)
        report = as_report(snapshot.documents["queue"])
        visible = self.source.visible_namespaces(user, report.namespaces(), snapshot.namespaces)
        # Counted by namespace and state without a row; only the rows of the page are made and formatted.
        namespaces, counts = report.counts(visible, only_namespace)
        total = counts.get(only_state, 0) if only_state else sum(counts.values())
        page = islice(report.select(visible, only_namespace, only_state, skip=offset), limit)
        # Where the reader stands: its own namespaces' (a cluster-wide reader's: the one it filters on, if any),
        # others named only to a cluster-wide reader.
        standing = (report.standing(visible, visible) if visible is not None else
                    report.standing(frozenset({only_namespace}) if only_namespace else None, None))
        return {"controller": report.header.get("controller"), "generatedAt": report.header.get("generatedAt"),
                "total": total, "offset": offset, "limit": limit, "counts": dict(sorted(counts.items())),
                "namespaces": sorted(namespaces)[:MAX_NAMESPACES],
                "rows": [_row(report.row(entry)) for entry in page], "reservations": report.reservations_in(visible),
                "fairShare": standing.get("fairShare"), "aheadOfYou": standing.get("aheadOfYou")}

    # ------------------------------------------------------------------------------------------ explain

    def _explain(self, query: Mapping[str, str], user: UserInfo | None) -> dict[str, Any]:
        namespace, name = query.get("namespace", ""), query.get("name", "")
        if not namespace or not name:
            raise Refusal(400, {"error": "explain needs ?namespace=NS&name=NAME"})
        unknown = Refusal(404, {"error": f"AppWrapper {namespace}/{name} not found"})
        if not self.source.may_list(user, "") and not self.source.may_list(user, namespace):
            raise unknown  # the same answer as for one that does not exist
        part = ("explain", namespace, name)
        document = self.source.snapshot({part}, user, fresh_within=FRESH_WITHIN_SECONDS).documents[part]
        if document is None:
            raise unknown
        events = self.events.of(namespace, name, document.get("uid", "")) if self.events is not None else []
        return {**document, "events": events}

    # ------------------------------------------------------------------------------------------ nodes

    def _nodes(self, user: UserInfo | None) -> dict[str, Any]:
        documents = self.source.snapshot({"ledger", "clusters"}, user, fresh_within=FRESH_WITHIN_SECONDS,
                                         require=("/debug/ledger",)).documents
        ledger, clusters = documents["ledger"], documents["clusters"]
        cached = self._nodes_view
        if cached is not None and cached[0] == id(ledger):
            nodes = cached[1]
        else:
            nodes = {"resources": list(HEATMAP_RESOURCES),
                     "nodes": [_node(node) for node in ledger["nodes"]]}
            self._nodes_view = (id(ledger), nodes)
        groups: list[dict[str, Any]]
        if clusters.get("mode") == "hub":
            by_cluster: dict[str, list[dict[str, Any]]] = {}
            for node in nodes["nodes"]:
                by_cluster.setdefault(node["cluster"], []).append(node)
            groups = [{"cluster": worker["name"], "state": worker["state"], "usable": worker["usable"],
                       "message": worker["message"], "nodes": by_cluster.get(worker["name"], [])}
                      for worker in clusters["clusters"]]
        else:
            groups = [{"cluster": None, "nodes": nodes["nodes"]}]
        # A ledger from a controller without topology levels (or from before them) has none: no domains.
        levels = [str(level) for level in ledger.get("topologyLevels") or []]
        if levels:
            for group in groups:
                group["domains"] = domain_tree(group["nodes"], levels)
        return {"controller": ledger["controller"], "generatedAt": ledger["generatedAt"],
                "mode": clusters.get("mode", "single"), "resources": nodes["resources"], "levels": levels,
                "groups": groups}

    # ------------------------------------------------------------------------------------------ quota

    def _quota(self, user: UserInfo | None) -> dict[str, Any]:
        quota = self.source.snapshot({"quota"}, user, fresh_within=FRESH_WITHIN_SECONDS,
                                     require=("/debug/quota",)).documents["quota"]
        trees = []
        for tree in quota["trees"]:
            nodes = []
            for node in tree["nodes"]:
                bars = {}
                for resource in tree["resources"]:
                    limit = _amount(node["limit"].get(resource))
                    used = _amount(node["used"].get(resource))
                    borrowed = _amount(node["borrowed"].get(resource))
                    bars[resource] = {"limit": node["limit"].get(resource), "used": node["used"].get(resource),
                                      "borrowed": node["borrowed"].get(resource, "0"),
                                      "usedFraction": _fraction(used, limit),
                                      "borrowedFraction": _fraction(borrowed, limit)}
                nodes.append({"name": node["name"], "parent": node["parent"], "depth": node["depth"],
                              "hardLimit": node["hardLimit"], "disabled": node["disabled"],
                              "appwrappers": len(node["appwrappers"]), "bars": bars})
            trees.append({"name": tree["name"], "resources": tree["resources"], "errors": tree["errors"],
                          "nodes": nodes})
        return {"controller": quota["controller"], "generatedAt": quota["generatedAt"],
                "enabled": quota["enabled"], "trees": trees}

    # ------------------------------------------------------------------------------------------ summary

    def _summary(self, user: UserInfo | None) -> dict[str, Any]:
        self.source.snapshot(set(), user, fresh_within=None, require=("/metrics",))
        if self.summary is None:
            raise Refusal(404, {"error": "this controller keeps no history of its metrics"})
        return dict(self.summary())


def domain_tree(nodes: Sequence[Mapping[str, Any]], levels: Sequence[str]) -> list[dict[str, Any]]:
    """``nodes`` grouped by their domain of ``levels[0]`` (by value; the nodes in none last, ``value`` None), each
    group by the next level, and so on: ``{"level", "value", "domains"}``, the last level's groups with ``nodes``
    (names, in the order given) instead of ``domains``. No levels: []."""
    if not levels:
        return []
    level, rest = levels[0], levels[1:]
    found: dict[str, list[Mapping[str, Any]]] = {}
    outside: list[Mapping[str, Any]] = []
    for node in nodes:
        value = (node.get("topology") or {}).get(level)
        if isinstance(value, str):
            found.setdefault(value, []).append(node)
        else:
            outside.append(node)
    branches: list[tuple[str | None, list[Mapping[str, Any]]]] = [*sorted(found.items())]
    if outside:
        branches.append((None, outside))
    return [{"level": level, "value": value,
             **({"domains": domain_tree(members, rest)} if rest else {"nodes": [node["name"] for node in members]})}
            for value, members in branches]


def whole_number(raw: str) -> int | None:
    """A query parameter's non-negative integer (ASCII digits, at most nine), None for anything else ("²" is a
    digit to ``str.isdigit`` and no number to ``int``)."""
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 else None


def _count(query: Mapping[str, str], name: str, default: int, most: int | None) -> int:
    raw = query.get(name, "")
    if not raw:
        return default
    number = whole_number(raw)
    if number is None:
        raise Refusal(400, {"error": f"{name} must be a whole number, not {raw[:20]!r}"})
    return number if most is None else min(number, most)


def _row(aw: Mapping[str, Any]) -> dict[str, Any]:
    pods = aw.get("pods")
    phases = pods if isinstance(pods, Mapping) else None
    return {"position": aw.get("position"), "namespace": aw["namespace"], "name": aw["name"], "state": aw["state"],
            "priority": aw["priority"], "demand": aw["demand"],
            "pods": sum(phases.values()) if phases is not None else pods, "podPhases": phases,
            "ageSeconds": aw.get("ageSeconds"), "why": aw.get("why", ""), "fitsNow": aw.get("fitsNow"),
            "requeuings": aw.get("requeuings", 0), "dispatchedAt": aw.get("dispatchedAt"),
            # A queued one's expected start (None: unknown, and estimateWhy says why).
            "estimatedStart": aw.get("estimatedStart"), "estimateWhy": aw.get("estimateWhy", ""),
            # Fault tolerance: a dispatched one's health, one in its retry pause's resets and when the pause ends.
            "health": aw.get("health"), "healthReason": aw.get("healthReason", ""),
            "resetReason": aw.get("reason", ""), "resettingCount": aw.get("resettingCount"),
            "retryLimit": aw.get("retryLimit"), "pauseEndsAt": aw.get("pauseEndsAt")}


def _amount(quantity: str | None) -> Fraction:
    if not quantity:
        return Fraction(0)
    try:
        return parse_quantity(quantity)
    except ValueError:
        return Fraction(0)


def _fraction(part: Fraction, whole: Fraction) -> float | None:
    if whole <= 0:
        return None
    return round(float(part / whole), 4)


def _node(node: Mapping[str, Any]) -> dict[str, Any]:
    cells = {}
    for resource in HEATMAP_RESOURCES:
        allocatable = node["allocatable"].get(resource)
        if allocatable is None:
            continue
        total = _amount(allocatable)
        used, reserved = node["used"].get(resource, "0"), node["planned"].get(resource, "0")
        cells[resource] = {"allocatable": allocatable, "used": used, "reserved": reserved,
                           "free": node["free"].get(resource, "0"),
                           "usedFraction": _fraction(_amount(used), total),
                           "reservedFraction": _fraction(_amount(reserved), total)}
    return {"name": node["name"], "cluster": node.get("cluster", ""), "schedulable": node["schedulable"],
            "ready": node["ready"], "pinned": node.get("pinned", 0), "cells": cells,
            "topology": dict(node.get("topology") or {})}
