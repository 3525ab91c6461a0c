"""Serving pre-1.34 MCAD's ``mcad.ibm.com/v1beta1`` AppWrappers next to ``workload.codeflare.dev/v1beta1``.

Contract:
- ``MergedAppWrappers(current, legacy)`` is one ``Store`` over two AppWrapper informers, so the dispatcher queues,
  accounts and dispatches both kinds as one population, with identical behaviour. Each view keeps its
  ``api_version``; status writes and owner references go back to the group it came from.
- Keys are ``namespace/name`` in both groups (pods find their AppWrapper by that label). If the same name exists in
  both groups in one namespace, the ``workload.codeflare.dev`` one is the AppWrapper and the legacy one is ignored
  (never dispatched) with a warning: one name, one gang.
- Reads are as thread-safe as the informers'; handlers get the events of both, in each informer's order.
"""

from __future__ import annotations

from typing import Any

import structlog

from mcad.api.appwrapper import AppWrapperView
from mcad.k8s.informer import Handler, Informer

log = structlog.get_logger("mcad.k8s.legacy")


class MergedAppWrappers:
    def __init__(self, current: Informer[AppWrapperView], legacy: Informer[AppWrapperView]) -> None:
        self.current = current
        self.legacy = legacy
        self._warned: set[str] = set()

    def get(self, key: str) -> AppWrapperView | None:
        found = self.current.get(key)
        if found is not None:
            if key not in self._warned and self.legacy.get(key) is not None:
                self._warned.add(key)
                log.warning("an mcad.ibm.com AppWrapper has the name of a workload.codeflare.dev one; ignoring it",
                            appwrapper=key)
            return found
        return self.legacy.get(key)

    def keys(self) -> list[str]:
        current = self.current.keys()
        return current + list(set(self.legacy.keys()).difference(current))

    def list(self) -> list[AppWrapperView]:
        current = self.current.list()
        names = {aw.key for aw in current}
        return current + [aw for aw in self.legacy.list() if aw.key not in names]

    def __len__(self) -> int:
        return len(self.list())

    def has_synced(self) -> bool:
        return self.current.has_synced() and self.legacy.has_synced()

    def add_handler(self, handler: Handler[Any]) -> None:
        self.current.add_handler(handler)
        self.legacy.add_handler(handler)
