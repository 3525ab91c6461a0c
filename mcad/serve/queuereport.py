"""The queue document (``/debug/queue``, the dashboard's queue view), read on the dispatcher thread in O(groups +
dispatched) and formatted elsewhere, only as far as a reader asks: a page of 50 rows never formats 100,000.

Contract:
- ``QueueReport(...)`` is made on the dispatcher thread (``mcad.serve.debug.Reports.queue_deferred``) from copies:
  the queue's assessment (``mcad.model.assess.QueueAssessment``), the facts of the resetting and dispatched ones,
  the header, and a lookup of the decisions the informer may not show yet.
- ``finish()`` (the snapshot publisher, off the loop; O(queue)) resolves every queued AppWrapper in dispatch order:
  what it is told, its view read from the informer's store (thread-safe; a queued one deleted meanwhile is left
  out), its requeuings. Until then ``entries`` is empty. Calling it again does nothing.
- ``entries``: one ``Entry`` per AppWrapper, queued (dispatch order) then resetting then dispatched, with its
  namespace and state: what a reader's rights and filters select. ``row(entry)``: that entry as the document has
  it. ``document()``: the whole document (``header``, ``queued``, ``resetting``, ``dispatched``,
  ``reservations``), formatted on the first call, by whichever reader asks, and kept; ``formatted_seconds`` is what
  that cost (the snapshot spacing counts it, so readers of large documents are paced as builds are).
- ``QueueReport.of(document)``: the same interface over a document formatted already (an offline report, tests);
  ``as_report`` takes either.
- Quantities are Kubernetes quantity strings; times RFC 3339 UTC (``mcad.serve.debug``'s helpers).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mcad.api.appwrapper import AppWrapperView
from mcad.api.resources import ResourceVector, format_amount
from mcad.api.statusview import StatusView
from mcad.model import lifecycle
from mcad.model.assess import Assessment, QueueAssessment

Document = dict[str, Any]
# The lists of AppWrappers in the queue document, each entry with its namespace: what a reader's rights filter.
QUEUE_LISTS = ("queued", "resetting", "dispatched")


@dataclass(frozen=True, slots=True)
class Entry:
    namespace: str
    state: str
    listed_in: str  # one of QUEUE_LISTS
    facts: Any  # what ``row`` formats: a queued one's (position, assessment, view, requeuings), else its entry


def quantities(vector: ResourceVector) -> dict[str, str]:
    return {name: format_amount(name, amount) for name, amount in sorted(vector.items())}


class QueueReport:
    def __init__(self, header: Mapping[str, Any], now: datetime, assessed: QueueAssessment | None,
                 get: Callable[[str], AppWrapperView | None], intent: Callable[[AppWrapperView], StatusView | None],
                 reservations: Sequence[Mapping[str, Any]], resetting: Sequence[Document],
                 dispatched: Sequence[Document], *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.header = dict(header)
        self.reservations = [dict(r) for r in reservations]
        self.formatted_seconds = 0.0
        self._now = now
        self._assessed = assessed
        self._get = get
        self._intent = intent
        self._resetting = resetting
        self._dispatched = dispatched
        self.entries: list[Entry] = []
        self._finished = assessed is None
        self._document: Document | None = None
        self._lock = threading.Lock()
        self._monotonic = monotonic  # the controller's clock, to time the formatting

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> QueueReport:
        report = cls({key: value for key, value in document.items() if key not in (*QUEUE_LISTS, "reservations")},
                     datetime.min, None, lambda key: None, lambda aw: None, document.get("reservations", []), (), ())
        report.entries = [Entry(aw["namespace"], aw["state"], listed, aw)
                          for listed in QUEUE_LISTS for aw in document.get(listed, [])]
        report._document = dict(document)
        return report

    def finish(self) -> None:
        with self._lock:
            if self._finished:
                return
            assert self._assessed is not None
            entries = []
            for position, assessment in enumerate(self._assessed, start=1):
                aw = self._get(assessment.key)
                if aw is None:
                    continue
                current = self._intent(aw) or aw.status
                entries.append(Entry(aw.namespace, assessment.state, "queued",
                                     (position, assessment, aw, current.requeuings)))
            entries.extend(Entry(aw["namespace"], aw["state"], "resetting", aw) for aw in self._resetting)
            entries.extend(Entry(aw["namespace"], aw["state"], "dispatched", aw) for aw in self._dispatched)
            self.entries = entries
            self._finished = True

    def row(self, entry: Entry) -> Document:
        if entry.listed_in != "queued" or isinstance(entry.facts, Mapping):
            return dict(entry.facts)
        position, assessment, aw, requeuings = entry.facts
        return self._queued_row(position, assessment, aw, requeuings)

    def document(self) -> Document:
        self.finish()
        with self._lock:
            if self._document is None:
                started = self._monotonic()
                lists: dict[str, list[Document]] = {listed: [] for listed in QUEUE_LISTS}
                for entry in self.entries:
                    lists[entry.listed_in].append(self.row(entry))
                self._document = {**self.header, **lists, "reservations": self.reservations}
                self.formatted_seconds = self._monotonic() - started
            return self._document

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
        }


def as_report(document: QueueReport | Mapping[str, Any]) -> QueueReport:
    """A snapshot's queue part as a report, whether deferred or formatted already."""
    return document if isinstance(document, QueueReport) else QueueReport.of(document)
