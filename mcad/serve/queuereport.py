"""The queue document (``/debug/queue``, the dashboard's queue view), read on the dispatcher thread in O(groups +
dispatched) and formatted elsewhere, only as far as a reader asks: a page of 50 rows formats 50 rows.

Contract:
- ``QueueReport(...)`` is made on the dispatcher thread (``mcad.serve.debug.Reports.queue_deferred``) from copies:
  the queue's assessment (``mcad.model.assess.QueueAssessment``: the orders, what each is told, the counts by
  namespace), the rows of the resetting and dispatched ones, the header, and a lookup of the decisions the
  informer may not show yet. Nothing more is read of dispatcher state; a queued AppWrapper's view is read from the
  informer's store (thread-safe) when its row is made, and one deleted meanwhile is left out of the rows.
- ``namespaces()``: every namespace with an AppWrapper in the report. ``counts(visible, namespace)``: the
  namespaces among ``visible`` (None: all) and the count of AppWrappers by state there (only ``namespace``'s, if
  given), in O(namespaces + judged + dispatched), whatever the queue's length.
- ``select(visible, namespace, state, skip)``: the entries that match, in list order (queued in dispatch order, then
  resetting, then dispatched), less the first ``skip``, made as they are taken: a page of 50 costs 50 rows, plus a
  scan of the orders above it and of those a filter leaves out (a dictionary lookup each: a queued one skipped is
  counted as the walk saw it, not read from the informer, so one deleted since still counts). ``row(entry)``: that
  entry as the document has it; a queued one's ``position`` is its place in the whole queue.
- ``reservations_in(visible)`` and ``document_in(visible)``: what a reader who may list only ``visible`` sees.
- ``page_in(visible, offset, limit)``: the document with only ``limit`` queued rows from place ``offset`` on
  (among the queued ones ``visible`` holds; None: all), every resetting and dispatched one, and ``page``:
  ``{"offset", "limit", "queuedTotal"}``. Costs the rows it makes plus a scan of the orders it skips (as
  ``select``'s ``skip``), never a formatted whole queue (what a whole-cluster reader of a deep queue asks for).
- ``standing(visible, names)``: where the reader stands (``mcad.model.standing``), which ``document_in``,
  ``page_in`` and ``document`` carry: ``fairShare`` (fair sharing's usage: the tenants of ``names`` by name, the
  others as a distribution; ``{"enabled": false}`` without --fair-sharing), ranked once per report in
  O(tenants log tenants), then O(tenants) a reader; and for a reader of some namespaces (``visible`` not None)
  ``aheadOfYou``: for each of them, its first queued AppWrapper, its position and what is ahead of it, by
  namespace for those of ``names`` (None: every one), else only counted. ``document_in`` and ``page_in`` name
  ``visible``'s alone unless told ``all_named`` (a reader with cluster-wide rights who asked for one namespace).
  Costs a walk of the orders up to the last of those first AppWrappers. A report ``of`` a document keeps that
  document's.
- ``entries()``: every entry (O(queue), kept). ``document()``: the whole document (``header``, ``queued``,
  ``resetting``, ``dispatched``, ``reservations``), formatted on the first call and kept (``mcad.serve.snapshots``
  decides who calls it, and counts what it cost).
- ``QueueReport.of(document)``: the same interface over a document formatted already (an offline report, tests);
  ``as_report`` takes either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, islice
from typing import Any

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector, format_amount
from mcad.api.statusview import StatusView
from mcad.model import lifecycle
from mcad.model.assess import Assessment, QueueAssessment
from mcad.model.estimate import Estimate
from mcad.model.pending import Order
from mcad.model.standing import FairTable, FairUsage, ahead, off

Document = dict[str, Any]
# The lists of AppWrappers in the queue document, each entry with its namespace: what a reader's rights filter.
QUEUE_LISTS = ("queued", "resetting", "dispatched")
MAX_QUEUE_PAGE = 10_000  # queued rows in one page of the document (/debug/queue?limit=; about 4 MB)
STANDING = ("fairShare", "aheadOfYou")  # what ``standing`` adds to a document
QUEUED = "Queued"  # what a queued AppWrapper's state is unless the walk judged it otherwise (Preempting, Draining)


@dataclass(frozen=True, slots=True)
class Entry:
    namespace: str
    state: str
    listed_in: str  # one of QUEUE_LISTS
    facts: Any  # what ``row`` formats: a queued one's (position, assessment, view, requeuings), else its row


def quantities(vector: ResourceVector) -> dict[str, str]:
    return {name: format_amount(name, amount) for name, amount in sorted(vector.items())}


def _namespace(key: str) -> str:
    return key.partition("/")[0]


def _sees(visible: frozenset[str] | None, namespace: str) -> bool:
    """Does a reader who may list ``visible``'s AppWrappers (None: every namespace's) see ``namespace``'s?"""
    return visible is None or namespace in visible


class QueueReport:
    def __init__(self, header: Mapping[str, Any], now: datetime, assessed: QueueAssessment | None,
                 get: Callable[[str], AppWrapperView | None], intent: Callable[[AppWrapperView], StatusView | None],
                 reservations: Sequence[Mapping[str, Any]], resetting: Sequence[Document],
                 dispatched: Sequence[Document], fair: FairUsage | None = None, *, formatted: bool = False) -> None:
        self.header = dict(header)
        self._fair = fair
        self._fair_table: FairTable | None = None
        self._formatted = formatted  # made ``of`` a document: what it told of standing is in ``_told``
        self._told: Document = {}
        self.reservations = [dict(r) for r in reservations]
        self._now = now
        self._assessed = assessed
        self._estimate = assessed.estimate if assessed is not None else (lambda _key: None)
        self._get = get
        self._intent = intent
        self._others = [Entry(row["namespace"], row["state"], listed, row)
                        for listed, rows in (("resetting", resetting), ("dispatched", dispatched)) for row in rows]
        self._entries: list[Entry] | None = None
        self._document: Document | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> QueueReport:
        report = cls({key: value for key, value in document.items()
                      if key not in (*QUEUE_LISTS, "reservations", *STANDING)},
                     datetime.min, None, lambda key: None, lambda aw: None, document.get("reservations", []), (), (),
                     formatted=True)
        report._told = {key: document[key] for key in STANDING if key in document}
        report._others = [Entry(aw["namespace"], aw["state"], listed, aw)
                          for listed in QUEUE_LISTS for aw in document.get(listed, [])]
        report._document = dict(document)
        return report

    # -------------------------------------------------------------------------------------- what readers select

    def namespaces(self) -> set[str]:
        queued = set(self._assessed.per_namespace) if self._assessed is not None else set()
        return queued | {entry.namespace for entry in self._others}

    def counts(self, visible: frozenset[str] | None, namespace: str = "") -> tuple[set[str], dict[str, int]]:
        namespaces: set[str] = set()
        counts: dict[str, int] = {}

        def count(name: str, state: str, n: int = 1) -> None:
            if not namespace or name == namespace:
                counts[state] = counts.get(state, 0) + n

        if self._assessed is not None:
            for name, n in self._assessed.per_namespace.items():
                if _sees(visible, name):
                    namespaces.add(name)
                    count(name, QUEUED, n)
            for judged in self._assessed.judged():
                if judged.state != QUEUED and _sees(visible, _namespace(judged.key)):
                    count(_namespace(judged.key), QUEUED, -1)
                    count(_namespace(judged.key), judged.state)
        for entry in self._others:
            if _sees(visible, entry.namespace):
                namespaces.add(entry.namespace)
                count(entry.namespace, entry.state)
        return namespaces, {state: n for state, n in counts.items() if n > 0}

    def select(self, visible: frozenset[str] | None, namespace: str = "", state: str = "",
               skip: int = 0) -> Iterator[Entry]:
        def wanted(name: str, its_state: str) -> bool:
            return (_sees(visible, name) and (not namespace or name == namespace)
                    and (not state or its_state == state))

        return self._skipping(self._listed(visible, namespace, state),
                              (entry for entry in self._others if wanted(entry.namespace, entry.state)), skip)

    def reservations_in(self, visible: frozenset[str] | None) -> list[Mapping[str, Any]]:
        """The reservations of AppWrappers in ``visible`` (None: all): they name their holders and nodes."""
        return [held for held in self.reservations
                if _sees(visible, _namespace(held["appwrapper"]))]

    def document_in(self, visible: frozenset[str], *, all_named: bool = False) -> Document:
        """The document as a reader who may list only ``visible``'s AppWrappers sees it (made anew each time);
        ``all_named``: the reader may see every namespace named (cluster-wide rights; see ``standing``)."""
        return {**self._document_of(self.select(visible), self.reservations_in(visible)),
                **self.standing(visible, None if all_named else visible)}

    def page_in(self, visible: frozenset[str] | None, offset: int, limit: int, *,
                all_named: bool = False) -> Document:
        """The document as ``visible`` sees it (None: everything), its queued list cut to ``limit`` rows from
        ``offset`` (positions stay those of the whole queue); ``all_named``: as for ``document_in``."""
        others = [entry for entry in self._others if _sees(visible, entry.namespace)]
        queued = self._skipping(self._listed(visible, "", ""),
                                (entry for entry in others if entry.listed_in == "queued"), offset)
        rest = (entry for entry in others if entry.listed_in != "queued")
        document = self._document_of(chain(islice(queued, limit), rest), self.reservations_in(visible))
        document.update(self.standing(visible, None if all_named else visible))
        document["page"] = {"offset": offset, "limit": limit, "queuedTotal": self._queued_total(visible)}
        return document

    def standing(self, visible: frozenset[str] | None, names: frozenset[str] | None) -> Document:
        """``fairShare`` and, for a reader of some namespaces, ``aheadOfYou`` (see the module docstring)."""
        if self._formatted:
            # What the document said, to a reader of everything; another is told only that fair sharing is off,
            # if so (the names in it cannot be told apart any more).
            if names is None:
                return dict(self._told)
            return {"fairShare": off()} if self._told.get("fairShare") == off() else {}
        told: Document = {"fairShare": self._fair_told(names)}
        if visible is not None:
            assessed = self._assessed
            told["aheadOfYou"] = [] if assessed is None else ahead(assessed.in_dispatch_order(), sorted(visible), names,
                                                                   assessed.per_namespace)
        return told

    def _fair_told(self, names: frozenset[str] | None) -> Document:
        if self._fair is None:
            return off()
        with self._lock:
            if self._fair_table is None:
                self._fair_table = FairTable(self._fair)
            table = self._fair_table
        return table.told(names)

    def _queued_total(self, visible: frozenset[str] | None) -> int:
        assessed = self._assessed
        total = 0 if assessed is None else sum(n for name, n in assessed.per_namespace.items() if _sees(visible, name))
        return total + sum(1 for entry in self._others
                           if entry.listed_in == "queued" and _sees(visible, entry.namespace))

    def row(self, entry: Entry) -> Document:
        if entry.listed_in != "queued" or isinstance(entry.facts, Mapping):
            return dict(entry.facts)
        position, assessment, aw, requeuings = entry.facts
        return self._queued_row(position, assessment, aw, requeuings)

    def entries(self) -> list[Entry]:
        with self._lock:
            if self._entries is None:
                self._entries = list(self.select(None))
            return self._entries

    def document(self) -> Document:
        entries = self.entries()
        with self._lock:
            if self._document is None:
                self._document = {**self._document_of(entries, self.reservations), **self._whole_standing()}
            return self._document

    def _whole_standing(self) -> Document:
        """``standing`` for a reader of everything, made under the lock already held."""
        if self._formatted:
            return dict(self._told)
        if self._fair is None:
            return {"fairShare": off()}
        if self._fair_table is None:
            self._fair_table = FairTable(self._fair)
        return {"fairShare": self._fair_table.told(None)}

    def _document_of(self, entries: Iterable[Entry], reservations: Sequence[Mapping[str, Any]]) -> Document:
        lists: dict[str, list[Document]] = {listed: [] for listed in QUEUE_LISTS}
        for entry in entries:
            lists[entry.listed_in].append(self.row(entry))
        return {**self.header, **lists, "reservations": reservations}

    # -------------------------------------------------------------------------------------- the queued ones

    def _skipping(self, listed: Iterator[tuple[int, Order]], others: Iterator[Entry],
                  skip: int) -> Iterator[Entry]:
        """The entries of ``listed`` (the queued ones) then ``others``, less the first ``skip``. The queued ones
        skipped are passed over as the walk saw them, never read from the informer nor formatted: a deep page
        costs a dictionary lookup per row above it (one deleted since the walk is still counted there)."""
        passed = sum(1 for _ in islice(listed, skip))  # consumes them from ``listed``
        return chain(self._queued_entries(listed), islice(others, skip - passed, None))

    def _listed(self, visible: frozenset[str] | None, namespace: str, state: str) -> Iterator[tuple[int, Order]]:
        """(position, order) of each queued one that matches, in dispatch order, as the walk saw it."""
        assessed = self._assessed
        if assessed is None:
            return
        judged_states = {a.state for a in assessed.judged()}
        if state and state != QUEUED and state not in judged_states:
            return  # no queued one is in that state: no need to scan the queue
        for index, order in enumerate(assessed.in_dispatch_order()):
            name = _namespace(order[2])
            if not _sees(visible, name) or (namespace and name != namespace):
                continue
            if state:
                assessment = assessed.told(order)
                if assessment is None or assessment.state != state:
                    continue
            elif not assessed.is_told(order):
                continue
            yield index + 1, order

    def _queued_entries(self, listed: Iterable[tuple[int, Order]]) -> Iterator[Entry]:
        assessed = self._assessed
        if assessed is None:
            return  # only a report with a walk lists queued ones
        for position, order in listed:
            assessment = assessed.told(order)
            aw = self._get(order[2])
            if assessment is None or aw is None:
                continue  # deleted since the walk
            current = self._intent(aw) or aw.status
            yield Entry(aw.namespace, assessment.state, "queued", (position, assessment, aw, current.requeuings))

    def _queued_row(self, position: int, assessment: Assessment, aw: AppWrapperView, requeuings: int) -> Document:
        created = lifecycle.parse_time(aw.created)
        return {
            "position": position, "namespace": aw.namespace, "name": aw.name, "priority": aw.priority,
            "created": aw.created or None,
            "ageSeconds": round((self._now - created).total_seconds(), 3) if created else None,
            "state": assessment.state, "demand": quantities(aw.demand),
            "pods": sum(group.count for group in aw.gang),
            "fitsNow": assessment.fits_now, "why": assessment.why,
            "requeuings": requeuings,
            **_estimate_fields(self._estimate(aw.key)),
        }


def _estimate_fields(estimate: Estimate | None) -> dict[str, Any]:
    """``estimatedStart`` (RFC 3339, or None) and, when it is not known, ``estimateWhy``."""
    if estimate is None:
        return {"estimatedStart": None, "estimateWhy": "not estimated: too far back in the queue"}
    if estimate.at is None:
        return {"estimatedStart": None, "estimateWhy": estimate.why}
    return {"estimatedStart": estimate.at.isoformat()}


def as_report(document: QueueReport | Mapping[str, Any]) -> QueueReport:
    """A snapshot's queue part as a report, whether deferred or formatted already."""
    return document if isinstance(document, QueueReport) else QueueReport.of(document)
