"""Where fair sharing's usage outlives the controller: one ConfigMap in the controller's own namespace.

Contract:
- ``FairShareStore(writer, namespace, name)`` reads and writes the ConfigMap ``namespace/name`` (the chart's
  ``<release>-fair-share``; its Role lets the controller create ConfigMaps there and get and patch that one). Only
  the controller and the namespace's admins may write there; tenants holding AppWrapper rights cannot.
- ``write(usage, saved_at)``: server-side apply (the controller owns the object), the usage of at most
  ``MAX_TENANTS`` tenants (the largest kept) as JSON under ``usage.json`` with the wall-clock time it was taken.
- ``read()``: (usage, saved_at), or None when there is no ConfigMap yet. What does not parse, or is larger than
  ``MAX_BYTES``, raises ``StoredUsageError`` naming why: the caller starts from zero and says so, nothing crashes.
  Values that are not finite non-negative numbers are dropped; so are tenants beyond ``MAX_TENANTS``.
- API errors (``ApiError``) are the caller's to bound and report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from mcad.api.appwrapper import FIELD_MANAGER
from mcad.errors import ApiError

KEY: Final = "usage.json"
MAX_TENANTS: Final = 10_000
MAX_BYTES: Final = 1 << 20


class StoredUsageError(ValueError):
    """The ConfigMap is there but says nothing fair sharing can use."""


class ConfigMapWriter(Protocol):
    def read(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any]: ...

    def apply(self, obj: Mapping[str, Any], *, field_manager: str, force: bool) -> Mapping[str, Any]: ...


class FairShareStore:
    def __init__(self, writer: ConfigMapWriter, namespace: str, name: str) -> None:
        self._writer = writer
        self.namespace = namespace
        self.name = name

    def write(self, usage: Mapping[str, float], saved_at: datetime) -> None:
        kept = sorted(((tenant, amount) for tenant, amount in usage.items() if math.isfinite(amount)),
                      key=lambda item: -item[1])[:MAX_TENANTS]
        body = json.dumps({"savedAt": saved_at.astimezone(UTC).isoformat(), "tenants": dict(kept)},
                          separators=(",", ":"), sort_keys=True)
        self._writer.apply({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": self.name, "namespace": self.namespace,
                                         "labels": {"app.kubernetes.io/managed-by": "mcad"}},
                            "data": {KEY: body}}, field_manager=FIELD_MANAGER, force=True)

    def read(self) -> tuple[dict[str, float], datetime] | None:
        try:
            raw = self._writer.read("v1", "ConfigMap", self.namespace, self.name)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        text = ((raw.get("data") or {}).get(KEY)) if isinstance(raw.get("data"), Mapping) else None
        return decode(text)


def decode(text: Any) -> tuple[dict[str, float], datetime]:
    """(usage, saved_at) from the ConfigMap's ``usage.json`` (see the module docstring)."""
    if not isinstance(text, str):
        raise StoredUsageError(f"it has no {KEY}")
    if len(text) > MAX_BYTES:
        raise StoredUsageError(f"its {KEY} is {len(text)} bytes, more than {MAX_BYTES}")
    try:
        doc = json.loads(text)
        saved_at = datetime.fromisoformat(doc["savedAt"])
        tenants = doc["tenants"]
    except (ValueError, KeyError, TypeError) as err:
        raise StoredUsageError(f"its {KEY} does not parse: {err}") from None
    if not isinstance(tenants, dict) or saved_at.tzinfo is None:
        raise StoredUsageError(f"its {KEY} has no tenants map or no time zone")
    usage = {str(tenant): float(amount) for tenant, amount in list(tenants.items())[:MAX_TENANTS]
             if isinstance(amount, (int, float)) and not isinstance(amount, bool)
             and math.isfinite(amount) and amount >= 0}
    return usage, saved_at
