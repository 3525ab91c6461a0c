"""The quota trees as QuotaSubtree objects: read their definitions into the quota ledger, write their usage back
into their status, and keep the rows that metrics read.

Contract:
- ``QuotaStatusWriter(quota, subtrees, writer, writes)`` is the only owner of what was last written to each
  QuotaSubtree's status and of the metric rows. ``read_forest`` and ``write`` run on the dispatcher thread (the only
  one that changes the quota ledger); ``samples`` may be read from any thread (a tuple, replaced whole).
- ``read_forest()``: the forest built from the QuotaSubtree objects as listed now (``quota.Forest.build``); the quota
  ledger re-derives its charges from it.
- ``write()``: for every QuotaSubtree whose tree is in the forest, the status is what each of its nodes has
  allocated (the demand of dispatched AppWrappers charged to it or below it), and their total, in the tree's
  limited resources; node definitions the tree ignored (see its errors) get none. It is submitted to the write
  pool (low lane, key ``quota:<namespace>/<name>``, server-side apply of the status subresource) only when it
  differs both from what this writer last submitted for that object and from the status the object shows.
- A write refused because the object is gone (404) is nothing to say; another refusal is logged and not retried:
  the next change of usage writes again. So at most one write per QuotaSubtree per ``write()``.
- The dispatcher calls ``write()`` at most once per ``QUOTA_STATUS_WINDOW_SECONDS`` (a coalesced ``QUOTA_STATUS``
  key after charges change): usage moves with every dispatch, its status need not.
- ``samples``: one row (tree, node, resource, limit, used, borrowed) per node of every tree and resource it
  limits, in base units, refreshed by every ``write()``.

Bounds: one remembered status per QuotaSubtree that exists (forgotten once it is no longer listed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, Protocol

import structlog

from mcad.api.appwrapper import FIELD_MANAGER
from mcad.api.resources import ResourceVector, format_amount
from mcad.errors import ApiError
from mcad.k8s.informer import Store
from mcad.k8s.writes import Writes
from mcad.metrics import base_units
from mcad.model import quota as quota_trees

# QuotaSubtree statuses are brought up to date at most once per this window after charges change.
QUOTA_STATUS_WINDOW_SECONDS = 2.0
log = structlog.get_logger("mcad.loop.quotastatus")

# (tree, node, resource, limit, used, borrowed), in base units
Sample = tuple[str, str, str, float, float, float]


class StatusApplier(Protocol):
    def apply_status(self, api_version: str, kind: str, namespace: str, name: str, new_status: Mapping[str, Any],
                     *, field_manager: str) -> Mapping[str, Any]:
        """Server-side apply of an object's status subresource."""
        ...


def _quantities(vector: ResourceVector, resources: Iterable[str]) -> dict[str, str]:
    return {name: format_amount(name, vector.get(name)) for name in sorted(resources)}


class QuotaStatusWriter:
    def __init__(self, quota: quota_trees.QuotaLedger, subtrees: Store[quota_trees.SubtreeView],
                 writer: StatusApplier, writes: Writes) -> None:
        self.quota = quota
        self.subtrees = subtrees
        self.writer = writer
        self.writes = writes
        self.samples: tuple[Sample, ...] = ()
        self._written: dict[str, Mapping[str, Any]] = {}

    def read_forest(self) -> None:
        self.quota.set_forest(quota_trees.Forest.build(self.subtrees.list()))

    def write(self) -> None:
        self.samples = self._samples()
        listed = self.subtrees.list()
        for view in listed:
            new = self.status_of(view)
            if new is None or new == self._written.get(view.key) or new == {k: view.status.get(k) for k in new}:
                continue
            self._written[view.key] = new
            self.writes.submit(f"quota:{view.key}", partial(self._apply, view, new), tenant=view.namespace,
                               urgent=False)
        if len(self._written) > len(listed):
            keys = {view.key for view in listed}
            self._written = {key: new for key, new in self._written.items() if key in keys}

    def status_of(self, view: quota_trees.SubtreeView) -> dict[str, Any] | None:
        """The status ``view`` should show now; None when its tree is not in the forest (it has no status to
        show: the tree's errors say why)."""
        own_tree = self.quota.forest.trees.get(view.tree)
        if own_tree is None:
            return None
        limited = own_tree.resources
        children, total = [], ResourceVector()
        for node in view.nodes:
            if own_tree.nodes.get(node.name) is not node:
                continue  # a definition the tree ignored (see its errors)
            used = self.quota.usage(view.tree, node.name)
            total = total + used
            children.append({"name": node.name, "allocated": {"requests": _quantities(used, limited)}})
        return {"totalAllocation": {"requests": _quantities(total, limited)}, "children": children}

    def _samples(self) -> tuple[Sample, ...]:
        samples = []
        for tree_name, tree in sorted(self.quota.forest.trees.items()):
            for node_name in tree.ordered():
                node = tree.nodes[node_name]
                used, borrowed = self.quota.usage(tree_name, node_name), self.quota.borrowed(tree_name, node_name)
                for resource in sorted(tree.resources):
                    samples.append((tree_name, node_name, resource, base_units(resource, node.limit.get(resource)),
                                    base_units(resource, used.get(resource)),
                                    base_units(resource, borrowed.get(resource))))
        return tuple(samples)

    def _apply(self, view: quota_trees.SubtreeView, new: Mapping[str, Any]) -> None:
        """Write thread."""
        try:
            self.writer.apply_status(view.api_version, quota_trees.KIND, view.namespace, view.name, new,
                                     field_manager=FIELD_MANAGER)
        except ApiError as err:
            if err.status != 404:
                log.warning("quota status write refused", subtree=view.key, status_code=err.status,
                            reason=err.message)
