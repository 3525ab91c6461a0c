"""Fault tolerance knobs of an AppWrapper: its annotations (upstream AppWrapper v1beta2's names), the cluster's
defaults and ceilings, and the policy they make. Pure.

Contract:
- The annotations are upstream's (project-codeflare/appwrapper, ``workload.codeflare.dev.appwrapper/...``), so
  that users moving between the two find the same knobs: seven durations (``DURATIONS``), ``retryLimit`` and two
  exit-code lists. ``DELETE_WHEN_FINISHED`` (mcad's own) asks for the AppWrapper itself to be deleted once its
  objects are (after ``successTTLDuration`` on success, ``deletionOnFailureGracePeriodDuration`` on failure).
- A duration is written as Go writes one (``90s``, ``1h30m``, ``500ms``, ``0``): ``parse_duration`` reads it, in
  seconds, and refuses a negative, empty or malformed one with the reason.
- ``FaultDefaults`` are the controller's flags: a default per knob, ``grace_ceiling`` that bounds every grace and
  pause period, ``success_ttl_ceiling`` that bounds the success TTL, and two floors (``FLOORED``):
  ``retry_pause_floor``, the shortest retry pause, and ``grace_floor``, the shortest admission, warmup and failure
  grace period. The floors bound how fast one AppWrapper can be reset: each reset deletes and re-creates its
  objects, and a tenant who set every period to ``0s`` could make the controller and the API server do that many
  times a second, at the cost of every other tenant's dispatch latency. ``FaultDefaults.problems()`` names what is
  inconsistent (a default above its ceiling or below its floor, a floor above the ceiling), for the controller to
  refuse to start. ``max_namespace_resets_per_minute`` bounds the resets of each namespace's AppWrappers
  (``mcad.model.resetbudget``, ``mcad.loop.health``); admission does not use it.
- ``problems(annotations, defaults)`` lists, for admission, every annotation whose value is refused, each message
  naming the annotation, its value (cut) and why: malformed, negative, above its ceiling, below its floor (the
  message states the floor), a ``retryLimit`` that is not an integer in 0..``MAX_RETRY_LIMIT``, an exit code that
  is not an integer in 1..255, more than ``MAX_EXIT_CODES`` codes, a code in both lists, a ``delete-when-finished``
  that is not true or false. Numbers are ASCII digits only: ``int()`` and ``\\d`` also take other scripts' digits
  (``'١٢'`` is 12 to Python), which no other reader of the annotation (kubectl users, upstream's controller, the
  dashboard) would read as a number.
- ``policy(annotations, defaults)`` is what the controller acts on: each annotation that ``problems`` accepts
  overrides its default; one it refuses (stored before the webhook checked it, or with the webhook off) is ignored
  for the default and named in ``FaultPolicy.ignored``, so the status can say so. A value above its ceiling is
  cut to the ceiling (the ceiling may have been lowered since admission); one below its floor (admitted before the
  floor was raised, or with the webhook off, or in a namespace the webhook does not review) is raised to the floor
  and named in ``FaultPolicy.ignored`` with the floor used. A default below a floor cannot happen
  (``FaultDefaults.problems``).
- ``FaultPolicy.terminal(code)``: whether a container's non-zero exit code ends the AppWrapper at once: a code in
  ``terminalExitCodes``, or, when ``retryableExitCodes`` is set, any code not in it. Exit code 0 never is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

PREFIX = "workload.codeflare.dev.appwrapper/"
ADMISSION_GRACE = PREFIX + "admissionGracePeriodDuration"
WARMUP_GRACE = PREFIX + "warmupGracePeriodDuration"
FAILURE_GRACE = PREFIX + "failureGracePeriodDuration"
RETRY_PAUSE = PREFIX + "retryPausePeriodDuration"
RETRY_LIMIT = PREFIX + "retryLimit"
FORCEFUL_DELETION_GRACE = PREFIX + "forcefulDeletionGracePeriodDuration"
DELETION_ON_FAILURE_GRACE = PREFIX + "deletionOnFailureGracePeriodDuration"
SUCCESS_TTL = PREFIX + "successTTLDuration"
TERMINAL_EXIT_CODES = PREFIX + "terminalExitCodes"
RETRYABLE_EXIT_CODES = PREFIX + "retryableExitCodes"
DELETE_WHEN_FINISHED = "mcad.codeflare.dev/delete-when-finished"

# The duration annotations, by the FaultPolicy field each sets.
DURATIONS: Mapping[str, str] = {
    ADMISSION_GRACE: "admission_grace",
    WARMUP_GRACE: "warmup_grace",
    FAILURE_GRACE: "failure_grace",
    RETRY_PAUSE: "retry_pause",
    FORCEFUL_DELETION_GRACE: "forceful_deletion_grace",
    DELETION_ON_FAILURE_GRACE: "deletion_on_failure_grace",
    SUCCESS_TTL: "success_ttl",
}
ANNOTATIONS = (*DURATIONS, RETRY_LIMIT, TERMINAL_EXIT_CODES, RETRYABLE_EXIT_CODES, DELETE_WHEN_FINISHED)
# The periods with a floor, by the FaultDefaults field that holds it: those that pace resets. The others do not:
# forcefulDeletionGracePeriod and deletionOnFailureGracePeriod act once per reset or failure, and the success TTL
# once per AppWrapper.
FLOORED: Mapping[str, str] = {
    ADMISSION_GRACE: "grace_floor",
    WARMUP_GRACE: "grace_floor",
    FAILURE_GRACE: "grace_floor",
    RETRY_PAUSE: "retry_pause_floor",
}

# retryLimit above this is refused: at the shortest pause a gang that always fails would cycle for days.
MAX_RETRY_LIMIT = 1000
# An exit-code list longer than this is refused (an exit code is 1..255: more would only repeat).
MAX_EXIT_CODES = 255
_NONE: Mapping[str, str] = MappingProxyType({})
# How much of a refused value a message quotes.
QUOTED_CHARS = 40
# What of each annotation's value an AppWrapperView keeps (the informer holds every view in memory).
KEPT_CHARS = 1024

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
# Longer than any period could usefully be (and than a timer is set for): refused as malformed.
_MAX_SECONDS = 10 * 365 * 86400.0


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string (``1h30m``, ``90s``, ``0``); ValueError saying why it is not one."""
    text = text.strip()
    if text in ("0", "+0"):
        return 0.0
    if text.startswith("-"):
        raise ValueError("a duration may not be negative")
    body = text[1:] if text.startswith("+") else text
    if not body:
        raise ValueError("not a duration (write it as Go does: 90s, 5m, 1h30m)")
    total, at = 0.0, 0
    for match in _PART.finditer(body):
        if match.start() != at:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        at = match.end()
    if at != len(body):
        raise ValueError("not a duration (write it as Go does: 90s, 5m, 1h30m)")
    if total > _MAX_SECONDS:
        raise ValueError("longer than ten years")
    return total


def format_duration(seconds: float) -> str:
    """``1h30m``, ``90s`` → ``1m30s``, ``0s``: how messages show a period."""
    whole = round(seconds)
    if whole == 0 and seconds > 0:
        return f"{int(seconds * 1000)}ms"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return out or "0s"


@dataclass(frozen=True, slots=True)
class FaultDefaults:
    """The cluster's defaults and ceilings (controller flags, chart values ``faultTolerance``), in seconds."""

    admission_grace: float = 60.0
    warmup_grace: float = 300.0
    failure_grace: float = 60.0
    retry_pause: float = 90.0
    retry_limit: int = 3
    forceful_deletion_grace: float = 600.0
    deletion_on_failure_grace: float = 0.0
    success_ttl: float = 7 * 86400.0
    delete_when_finished: bool = False
    grace_ceiling: float = 86400.0
    success_ttl_ceiling: float = 7 * 86400.0
    # Floors (FLOORED). 10 s each: a gang that always fails is then reset at most once per 20 s (grace, then
    # pause), a few a minute, where 0s let one AppWrapper reset several times a second; 10 s is still far below
    # upstream's defaults (60 s, 5 m, 60 s, 90 s), so no reasonable setting is refused.
    retry_pause_floor: float = 10.0
    grace_floor: float = 10.0
    # Resets of one namespace's AppWrappers in any minute; more wait (mcad.model.resetbudget). With the default
    # floors one AppWrapper that always fails is reset about three times a minute: 20 lets several of them retry at
    # their own pace, while a namespace with hundreds costs the cluster one reset every 3 s, not hundreds a minute.
    # 0: no bound.
    max_namespace_resets_per_minute: int = 20

    def ceiling(self, annotation: str) -> float:
        return self.success_ttl_ceiling if annotation == SUCCESS_TTL else self.grace_ceiling

    def floor(self, annotation: str) -> float:
        """The shortest the period of ``annotation`` may be (0 for a period without a floor)."""
        name = FLOORED.get(annotation)
        return float(getattr(self, name)) if name is not None else 0.0

    def problems(self) -> list[str]:
        """What makes these defaults inconsistent (the controller refuses to start with any)."""
        found = []
        for annotation, name in DURATIONS.items():
            value = getattr(self, name)
            if value < 0:
                found.append(f"the default {short(annotation)} may not be negative")
            elif value > self.ceiling(annotation):
                found.append(f"the default {short(annotation)} {format_duration(value)} exceeds its ceiling "
                             f"{format_duration(self.ceiling(annotation))}")
            elif value < self.floor(annotation):
                found.append(f"the default {short(annotation)} {format_duration(value)} is below its floor "
                             f"{format_duration(self.floor(annotation))}")
        for name in sorted(set(FLOORED.values())):
            value = getattr(self, name)
            if value < 0:
                found.append(f"the {name.replace('_', ' ')} may not be negative")
            elif value > self.grace_ceiling:
                found.append(f"the {name.replace('_', ' ')} {format_duration(value)} exceeds the grace period "
                             f"ceiling {format_duration(self.grace_ceiling)}")
        if self.success_ttl <= 0:
            found.append("the default successTTLDuration must be positive")
        if self.admission_grace > self.warmup_grace:
            found.append("the default admissionGracePeriodDuration exceeds warmupGracePeriodDuration")
        if not 0 <= self.retry_limit <= MAX_RETRY_LIMIT:
            found.append(f"the default retryLimit must be in 0..{MAX_RETRY_LIMIT}")
        if self.max_namespace_resets_per_minute < 0:
            found.append("the resets per namespace per minute may not be negative")
        return found


DEFAULTS = FaultDefaults()


@dataclass(frozen=True, slots=True)
class FaultPolicy:
    """What the controller does for one AppWrapper (seconds); see the module docstring."""

    admission_grace: float
    warmup_grace: float
    failure_grace: float
    retry_pause: float
    retry_limit: int
    forceful_deletion_grace: float
    deletion_on_failure_grace: float
    success_ttl: float
    terminal_exit_codes: frozenset[int] = frozenset()
    retryable_exit_codes: frozenset[int] = frozenset()
    delete_when_finished: bool = False
    ignored: tuple[str, ...] = field(default=())  # annotations whose value was refused, each with why

    def terminal(self, exit_code: int) -> bool:
        if exit_code == 0:
            return False
        if exit_code in self.terminal_exit_codes:
            return True
        return bool(self.retryable_exit_codes) and exit_code not in self.retryable_exit_codes


def short(annotation: str) -> str:
    """The annotation's name without upstream's prefix, as flags and messages about defaults say it."""
    return annotation.removeprefix(PREFIX)


def _quote(value: str) -> str:
    return repr(value if len(value) <= QUOTED_CHARS else value[:QUOTED_CHARS] + "...")


def _exit_codes(value: str) -> frozenset[int]:
    parts = [part.strip() for part in value.split(",")]
    if len(parts) > MAX_EXIT_CODES:
        raise ValueError(f"more than {MAX_EXIT_CODES} exit codes")
    codes = set()
    for part in parts:
        if not re.fullmatch(r"[0-9]{1,3}", part) or not 1 <= int(part) <= 255:
            raise ValueError(f"holds {_quote(part)}, not an exit code: write a comma-separated list of integers "
                             "in 1..255")
        codes.add(int(part))
    return frozenset(codes)


def _read(annotation: str, value: str, defaults: FaultDefaults) -> object:
    """The value the annotation sets, or ValueError with why it is refused."""
    if annotation in DURATIONS:
        seconds = parse_duration(value)
        if seconds > defaults.ceiling(annotation):
            raise ValueError(f"exceeds the cluster's ceiling of {format_duration(defaults.ceiling(annotation))}")
        if seconds < defaults.floor(annotation):
            raise ValueError(f"is below the cluster's floor of {format_duration(defaults.floor(annotation))} (the "
                             f"shortest this period may be)")
        if annotation == SUCCESS_TTL and seconds <= 0:
            raise ValueError("must be positive (omit the annotation for the cluster's default)")
        return seconds
    if annotation == RETRY_LIMIT:
        if not re.fullmatch(r"[0-9]{1,4}", value.strip()) or int(value) > MAX_RETRY_LIMIT:
            ascii_only = "" if value.isascii() else " (in ASCII digits)"
            raise ValueError(f"must be an integer in 0..{MAX_RETRY_LIMIT}{ascii_only}")
        return int(value)
    if annotation in (TERMINAL_EXIT_CODES, RETRYABLE_EXIT_CODES):
        return _exit_codes(value)
    if annotation == DELETE_WHEN_FINISHED:
        if value.strip().lower() not in ("true", "false"):
            raise ValueError('must be "true" or "false"')
        return value.strip().lower() == "true"
    raise KeyError(annotation)


def _values(annotations: Mapping[str, object],
            defaults: FaultDefaults) -> tuple[dict[str, object], list[tuple[str, str]]]:
    read: dict[str, object] = {}
    refused: list[tuple[str, str]] = []
    for annotation in ANNOTATIONS:
        value = annotations.get(annotation)
        if value is None:
            continue
        if not isinstance(value, str):
            refused.append((annotation, "must be a string"))
            continue
        try:
            read[annotation] = _read(annotation, value, defaults)
        except ValueError as err:
            refused.append((annotation, f"{_quote(value)} {err}"))
    terminal, retryable = read.get(TERMINAL_EXIT_CODES), read.get(RETRYABLE_EXIT_CODES)
    if isinstance(terminal, frozenset) and isinstance(retryable, frozenset) and (both := terminal & retryable):
        refused.append((RETRYABLE_EXIT_CODES, f"lists {', '.join(map(str, sorted(both)))}, also in "
                                              f"{short(TERMINAL_EXIT_CODES)}"))
        read.pop(RETRYABLE_EXIT_CODES)
    return read, refused


def problems(annotations: Mapping[str, object], defaults: FaultDefaults = DEFAULTS) -> list[str]:
    """Each refused annotation, as ``<annotation>: <value> <why>`` (see the module docstring)."""
    return [f"annotation {annotation}: {why}" for annotation, why in _values(annotations, defaults)[1]]


def policy(annotations: Mapping[str, object], defaults: FaultDefaults = DEFAULTS) -> FaultPolicy:
    read, refused = _values(annotations, _unbounded(defaults))
    durations = {}
    for annotation, name in DURATIONS.items():
        value = read.get(annotation)
        seconds = float(value) if isinstance(value, float) else float(getattr(defaults, name))
        if seconds < (floor := defaults.floor(annotation)):
            # Admission refuses this; it got here around the webhook (or before the floor was raised).
            refused.append((annotation, f"{_quote(str(annotations.get(annotation)))} is below the cluster's floor "
                                        f"of {format_duration(floor)}: {format_duration(floor)} is used"))
            seconds = floor
        durations[name] = min(seconds, defaults.ceiling(annotation))
    retry_limit = read.get(RETRY_LIMIT)
    terminal, retryable = read.get(TERMINAL_EXIT_CODES), read.get(RETRYABLE_EXIT_CODES)
    delete = read.get(DELETE_WHEN_FINISHED)
    return FaultPolicy(
        **durations,
        retry_limit=retry_limit if isinstance(retry_limit, int) else defaults.retry_limit,
        terminal_exit_codes=terminal if isinstance(terminal, frozenset) else frozenset(),
        retryable_exit_codes=retryable if isinstance(retryable, frozenset) else frozenset(),
        delete_when_finished=delete if isinstance(delete, bool) else defaults.delete_when_finished,
        ignored=tuple(f"{annotation}: {why}" for annotation, why in refused),
    )


def _unbounded(defaults: FaultDefaults) -> FaultDefaults:
    """The defaults with no ceiling and no floor: ``policy`` cuts a value above its ceiling and raises one below its
    floor instead of ignoring it."""
    return dataclasses.replace(defaults, grace_ceiling=_MAX_SECONDS, success_ttl_ceiling=_MAX_SECONDS,
                               retry_pause_floor=0.0, grace_floor=0.0)


def kept(annotations: Mapping[str, object]) -> Mapping[str, str]:
    """The fault tolerance annotations of an object, values cut to ``KEPT_CHARS``, for its view."""
    found = {key: value[:KEPT_CHARS] for key in ANNOTATIONS if isinstance(value := annotations.get(key), str)}
    return found or _NONE  # most AppWrappers set none: they share one empty mapping
