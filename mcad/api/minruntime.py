"""An AppWrapper's minimum run time: how long after its dispatch priority preemption leaves it alone. Pure.

Contract:
- ``MIN_RUNTIME`` (``mcad.codeflare.dev/min-runtime``) on an AppWrapper is a duration written as Go writes one
  (``30m``, ``1h``, ``0``; ``faulttolerance.parse_duration``): while it has been dispatched for less than that, it
  is not a priority preemption victim. Quota reclaim does not read it (a borrower gives back what it borrowed).
- ``MinRuntime(default, ceiling)`` are the controller's flags (``--preemption-min-runtime``,
  ``--preemption-min-runtime-ceiling``), in seconds: the minimum of an AppWrapper that sets none, and the longest
  one may ask for. The ceiling is what bounds how long a tenant can shield its work from every higher priority.
  ``MinRuntime.problems()`` names what does not hold together (a negative value, a default above the ceiling),
  for the controller to refuse to start.
- ``problems(annotations, ceiling)`` lists, for admission, the annotation refused, naming it, its value (cut) and
  why: not a string, not a duration, negative, or above the ceiling.
- ``MinRuntime.seconds(value)`` is what the controller acts on for the value an AppWrapper's view kept (``kept``):
  the default when there is none, or when it is not a duration (stored around the webhook); the ceiling when it is
  above it (stored before the ceiling was lowered, or around the webhook).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from mcad.api.faulttolerance import QUOTED_CHARS, format_duration, parse_duration

MIN_RUNTIME: Final = "mcad.codeflare.dev/min-runtime"
# An hour: long enough for a job to checkpoint once, short enough that a higher priority never waits longer for it.
DEFAULT_CEILING: Final = 3600.0
# What of the annotation's value an AppWrapperView keeps (a duration is a few characters; more is refused anyway).
KEPT_CHARS: Final = 64


@dataclass(frozen=True, slots=True)
class MinRuntime:
    """The cluster's default minimum run time and its ceiling, in seconds (see the module docstring)."""

    default: float = 0.0
    ceiling: float = DEFAULT_CEILING

    def problems(self) -> list[str]:
        found = []
        if self.default < 0 or self.ceiling < 0:
            found.append("the minimum run time and its ceiling may not be negative")
        elif self.default > self.ceiling:
            found.append(f"the default minimum run time {format_duration(self.default)} exceeds its ceiling "
                         f"{format_duration(self.ceiling)}")
        return found

    def seconds(self, value: str) -> float:
        """What the controller acts on for an AppWrapper whose annotation is ``value`` ("" when unset)."""
        read = _read(value) if value else None
        return self.default if read is None else min(read, self.ceiling)


DEFAULT = MinRuntime()


@lru_cache(maxsize=256)  # a cluster's AppWrappers share a few values; each is read at every preemption judgement
def _read(value: str) -> float | None:
    try:
        return parse_duration(value)
    except ValueError:
        return None


def problems(annotations: Mapping[str, object], ceiling: float) -> list[str]:
    """The annotation refused, as ``annotation <name>: <value> <why>``; [] when it is absent or accepted."""
    value = annotations.get(MIN_RUNTIME)
    if value is None:
        return []
    if not isinstance(value, str):
        return [f"annotation {MIN_RUNTIME}: must be a string"]
    quoted = repr(value if len(value) <= QUOTED_CHARS else value[:QUOTED_CHARS] + "...")
    try:
        seconds = parse_duration(value)
    except ValueError as err:
        return [f"annotation {MIN_RUNTIME}: {quoted} {err}"]
    if seconds > ceiling:
        return [f"annotation {MIN_RUNTIME}: {quoted} exceeds the cluster's ceiling of {format_duration(ceiling)} "
                f"(--preemption-min-runtime-ceiling)"]
    return []


def kept(annotations: Mapping[str, object]) -> str:
    """The annotation's value as an AppWrapper's view keeps it ("" when unset or not a string), cut to
    ``KEPT_CHARS`` (a longer one is no duration: the default applies)."""
    value = annotations.get(MIN_RUNTIME)
    if not isinstance(value, str):
        return ""
    return value if len(value) <= KEPT_CHARS else value[:KEPT_CHARS] + "..."
