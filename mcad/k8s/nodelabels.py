"""The label keys the cluster's nodes carry, kept from the node informer's events, for admission's warnings.

Contract:
- ``NodeLabelKeys.watch(nodes)`` registers a handler on ``nodes`` (a ``Store`` of ``NodeView``; before it starts,
  as every handler). From then on the informer's thread keeps, for each label key, how many nodes carry it: each
  event replaces what was counted for that node (by name) with its new labels, so the counts follow the store
  whatever ``old`` an event carries.
- ``carried(key)`` (any thread; ``mcad.admission.facts.NodeLabels``): True when a node carries ``key``, False when
  none does, None when it cannot tell: before the store has synced (its first list), once more than ``max_keys``
  distinct keys were seen (then it stops counting for good, drops what it held and logs it once: memory stays
  bounded whatever the nodes carry), or when the lock is not had within ``lock_wait`` seconds (a reader never
  waits longer for a warning).
- Memory: one dict entry per node (the labels mapping the view already holds) and one per distinct key, at most
  ``max_keys`` of them.
- A handler never raises (the informer would log and go on, but the counts would be off).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Final

import structlog

from mcad.api.views import NodeView
from mcad.k8s.informer import EventType, Store

_log = structlog.get_logger("mcad.k8s.nodelabels")

# Distinct node label keys counted. Clusters with node-feature-discovery carry a few hundred; each key is at most
# 317 characters, so this bounds the keys held to about 1.3 MB.
MAX_KEYS: Final = 4096
# How long a reader waits for the informer's thread to let go of the counts: it holds them for one event at a time.
LOCK_WAIT_SECONDS: Final = 0.05


class NodeLabelKeys:
    """How many nodes carry each label key (see the module docstring)."""

    def __init__(self, *, max_keys: int = MAX_KEYS, lock_wait: float = LOCK_WAIT_SECONDS) -> None:
        self._max_keys = max_keys
        self._lock_wait = lock_wait
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._nodes: dict[str, Mapping[str, str]] = {}
        self._overflowed = False
        self._synced: Callable[[], bool] = lambda: False

    def watch(self, nodes: Store[NodeView]) -> None:
        nodes.add_handler(self._on_event)
        self._synced = nodes.has_synced

    def carried(self, key: str) -> bool | None:
        if not self._synced():
            return None
        if not self._lock.acquire(timeout=self._lock_wait):
            return None
        try:
            return None if self._overflowed else key in self._counts
        finally:
            self._lock.release()

    def _on_event(self, _etype: EventType, old: NodeView | None, new: NodeView | None) -> None:
        node = new if new is not None else old
        if node is None:
            return
        labels = new.labels if new is not None else None
        with self._lock:
            if self._overflowed:
                return
            before = self._nodes.pop(node.name, None)
            if before is not None and labels is not None and before.keys() == labels.keys():
                self._nodes[node.name] = labels  # the same keys (most node updates: status, other values)
                return
            if before is not None:
                for key in before:
                    left = self._counts.get(key, 0) - 1
                    if left > 0:
                        self._counts[key] = left
                    else:
                        self._counts.pop(key, None)
            if labels is None:
                return
            for key in labels:
                if key not in self._counts and len(self._counts) >= self._max_keys:
                    self._overflow()
                    return
                self._counts[key] = self._counts.get(key, 0) + 1
            self._nodes[node.name] = labels

    def _overflow(self) -> None:
        """More distinct keys than ``max_keys``: stop counting (``carried`` answers None from now on)."""
        self._overflowed = True
        self._counts.clear()
        self._nodes.clear()
        _log.warning("node label keys not counted any more: admission will not warn of required topology levels "
                     "no node has", distinct_keys_over=self._max_keys)
