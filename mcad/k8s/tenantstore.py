"""The AppWrappers as the namespace admins' rules make them: the ``Store`` the dispatcher reads
(``mcad.model.tenancy``).

Contract:
- ``TenantAppWrappers(appwrappers, namespaces, priority_classes, default_ceiling)`` is a ``Store`` of
  ``AppWrapperView`` over an AppWrapper store, a store of ``NamespacePolicy`` (``namespace_policy`` of each
  Namespace, by name) and a store of PriorityClass values (``priority_class_value``, by name). Each view it gives
  has its quota labels replaced by its namespace's bindings (``charged_labels``), its priority resolved and capped
  (``effective_priority``), and ``held`` set when its ``priorityClassName`` names no PriorityClass. A view the
  rules do not change is returned as it is (no copy); a changed one is kept until its AppWrapper, its namespace's
  policy or a PriorityClass changes, so a read costs two dict lookups.
- An AppWrapper whose namespace the Namespace store does not hold (yet) is held, saying so: its binding is not
  known, and its own label is the tenant's to forge, so it is not charged by that. The Namespace event re-judges it.
- A Namespace event that changes a policy (a binding, the ceiling) or a PriorityClass event re-judges the
  AppWrappers concerned: the handlers registered here get a MODIFIED event for each (the dispatcher re-queues or
  re-sorts it). Charges of AppWrappers already dispatched stay where they were made until they finish.
- ``has_synced`` waits for all three stores (nothing is decided on a partial view of the rules). Thread-safe as
  the stores are; the cache tolerates racing readers (an entry is checked against the generation it was made in).
- Bounded: one entry per AppWrapper whose view the rules change, dropped with its AppWrapper; the Namespace and
  PriorityClass stores hold a few fields per object.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from mcad.api.appwrapper import AppWrapperView
from mcad.api.validation import INT32_MAX, INT32_MIN
from mcad.k8s.informer import EventType, Handler, Store
from mcad.model.tenancy import NamespacePolicy, charged_labels, effective_priority

log = structlog.get_logger("mcad.k8s.tenantstore")


def priority_class_value(raw: Mapping[str, Any]) -> int:
    """A PriorityClass's value (the API server requires it; int32)."""
    value = raw.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return min(max(value, INT32_MIN), INT32_MAX)


class TenantAppWrappers:
    def __init__(self, appwrappers: Store[AppWrapperView], namespaces: Store[NamespacePolicy],
                 priority_classes: Store[int], default_ceiling: int) -> None:
        self.appwrappers = appwrappers
        self.namespaces = namespaces
        self.priority_classes = priority_classes
        self.default_ceiling = default_ceiling
        self._handlers: list[Handler[Any]] = []
        self._generation = 0
        self._lock = threading.Lock()  # generation bumps only; reads of it are atomic
        # key -> (the inner view it was made from, the generation, the resolved view)
        self._resolved: dict[str, tuple[AppWrapperView, int, AppWrapperView]] = {}
        appwrappers.add_handler(self._on_appwrapper)
        namespaces.add_handler(self._on_namespace)
        priority_classes.add_handler(self._on_priority_class)

    # -- Store ---------------------------------------------------------------------------------------------------

    def get(self, key: str) -> AppWrapperView | None:
        inner = self.appwrappers.get(key)
        return None if inner is None else self.resolve(inner)

    def keys(self) -> list[str]:
        return self.appwrappers.keys()

    def list(self) -> Sequence[AppWrapperView]:
        return [self.resolve(aw) for aw in self.appwrappers.list()]

    def __len__(self) -> int:
        return len(self.appwrappers)

    def has_synced(self) -> bool:
        return self.appwrappers.has_synced() and self.namespaces.has_synced() and self.priority_classes.has_synced()

    def add_handler(self, handler: Handler[Any]) -> None:
        self._handlers.append(handler)

    # -- the rules -----------------------------------------------------------------------------------------------

    def resolve(self, aw: AppWrapperView) -> AppWrapperView:
        generation = self._generation  # read before the rules: a change after this makes the entry stale
        cached = self._resolved.get(aw.key)
        if cached is not None and cached[0] is aw and cached[1] == generation:
            return cached[2]
        policy = self.namespaces.get(aw.namespace)
        if policy is None:
            held = (f"namespace {aw.namespace} is not known to the controller yet: its quota binding and priority "
                    f"ceiling cannot be read")
            resolved = dataclasses.replace(aw, held=held)
        else:
            class_value = self.priority_classes.get(aw.spec.priority_class) if aw.spec.priority_class else None
            priority, held = effective_priority(aw.spec.priority, aw.spec.priority_class, class_value,
                                                policy.ceiling(self.default_ceiling))
            labels = charged_labels(aw.labels, policy)
            if priority == aw.priority and labels is aw.labels and not held:
                self._resolved.pop(aw.key, None)
                return aw
            spec = aw.spec if priority == aw.priority else dataclasses.replace(aw.spec, priority=priority)
            resolved = dataclasses.replace(aw, spec=spec, labels=labels, held=held)
        self._resolved[aw.key] = (aw, generation, resolved)
        return resolved

    def _bump(self) -> None:
        with self._lock:
            self._generation += 1

    def _notify(self, keys: Sequence[str]) -> None:
        for key in keys:
            aw = self.get(key)
            if aw is None:
                continue
            for handler in self._handlers:
                try:
                    handler("MODIFIED", aw, aw)
                except Exception:
                    log.exception("handler failed", appwrapper=key)

    def _on_appwrapper(self, event: EventType, old: AppWrapperView | None, new: AppWrapperView | None) -> None:
        if new is None and old is not None:
            self._resolved.pop(old.key, None)
        for handler in self._handlers:
            handler(event, old, new)

    def _on_namespace(self, _event: EventType, old: NamespacePolicy | None, new: NamespacePolicy | None) -> None:
        if new is not None and new.problem and (old is None or old.problem != new.problem):
            log.warning("namespace policy ignored", reason=new.problem)
        if old is not None and new is not None and (old.bindings, old.max_priority) == (new.bindings,
                                                                                        new.max_priority):
            return
        self._bump()
        name = (new or old).name  # type: ignore[union-attr]
        self._notify([aw.key for aw in self.appwrappers.list() if aw.namespace == name])

    def _on_priority_class(self, _event: EventType, old: int | None, new: int | None) -> None:
        if old is not None and new is not None and old == new:
            return
        self._bump()
        # The store is keyed by name and holds only values: every AppWrapper naming some class is judged again
        # (a PriorityClass's value is immutable; classes come and go rarely).
        self._notify([aw.key for aw in self.appwrappers.list() if aw.spec.priority_class])
