"""The controller's fault tolerance flags: the cluster's default for each AppWrapper annotation of
``mcad.api.faulttolerance`` and the ceilings the annotations may not exceed.

Contract: ``options`` adds the flags to a click command (named after upstream AppWrapper's knobs:
``--failure-grace-period`` is the default of ``failureGracePeriodDuration``); they reach the command as keyword
arguments named after ``FaultDefaults``' fields, and ``fault_defaults(values)`` makes the ``FaultDefaults`` of them.
Durations are written as Go writes them (``90s``, ``1h30m``; a bare number is not a duration): ``DURATION``
refuses anything ``faulttolerance.parse_duration`` refuses, as a usage error naming the flag. Defaults that do not
hold together (``FaultDefaults.problems()``: a default above its ceiling or below its floor, a floor above the
grace period ceiling, a zero success TTL, an admission grace longer than the warmup grace) are a usage error naming
each flag concerned: the controller does not start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click

from mcad.api import faulttolerance as ft

F = TypeVar("F", bound=Callable[..., Any])


# click's ParamType is generic from 8.2 on; setup.cfg allows 8.1, where subscripting it fails at import.
if TYPE_CHECKING:
    _ParamType = click.ParamType[float, Any]
else:
    _ParamType = click.ParamType


class GoDuration(_ParamType):
    """A Go duration (``5m``, ``1h30m``, ``0``) as seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return ft.parse_duration(str(value))
        except ValueError as err:
            self.fail(f"{value!r}: {err}", param, ctx)


DURATION = GoDuration()

# flag -> (the FaultDefaults field it sets, the annotation it is the default of, help).
_PERIODS: Mapping[str, tuple[str, str, str]] = {
    "--admission-grace-period": (
        "admission_grace", ft.ADMISSION_GRACE,
        "How long a dispatched AppWrapper (with schedulingSpec.minAvailable 0) may have fewer pods than it "
        "expects before it is reset."),
    "--warmup-grace-period": (
        "warmup_grace", ft.WARMUP_GRACE,
        "How long a dispatched AppWrapper (with schedulingSpec.minAvailable 0) may have pods that are not all "
        "Running or Succeeded before it is reset. At least the admission grace period."),
    "--failure-grace-period": (
        "failure_grace", ft.FAILURE_GRACE,
        "How long a failed pod or wrapped object is left to its own controller to recover before the AppWrapper "
        "is reset (or Failed once its retries are used up)."),
    "--retry-pause-period": (
        "retry_pause", ft.RETRY_PAUSE,
        "How long a reset AppWrapper waits, keeping its room, between deleting its objects and dispatching "
        "again."),
    "--forceful-deletion-grace-period": (
        "forceful_deletion_grace", ft.FORCEFUL_DELETION_GRACE,
        "How long pods of a reset or deleted AppWrapper may stay terminating before they are force-deleted."),
    "--deletion-on-failure-grace-period": (
        "deletion_on_failure_grace", ft.DELETION_ON_FAILURE_GRACE,
        "How long a Failed AppWrapper's objects are kept (to debug) before they are deleted. 0s: at once."),
    "--success-ttl": (
        "success_ttl", ft.SUCCESS_TTL,
        "How long a Completed AppWrapper's objects are kept before they are deleted. Must be positive."),
}
_CEILINGS: Mapping[str, tuple[str, str]] = {
    "--grace-period-ceiling": (
        "grace_ceiling",
        "The longest any grace or pause period may be, by flag or by annotation: a longer annotation is refused "
        "at admission (and one stored before is cut to this)."),
    "--success-ttl-ceiling": (
        "success_ttl_ceiling",
        "The longest successTTLDuration may be, by flag or by annotation (longer is refused at admission)."),
}
_FLOORS: Mapping[str, tuple[str, str]] = {
    "--retry-pause-floor": (
        "retry_pause_floor",
        "The shortest retryPausePeriodDuration may be, by flag or by annotation: a shorter annotation is refused at "
        "admission, and one that got past admission is raised to this. Paces how often one AppWrapper can be "
        "reset."),
    "--grace-period-floor": (
        "grace_floor",
        "The shortest admissionGracePeriodDuration, warmupGracePeriodDuration and failureGracePeriodDuration may "
        "be, by flag or by annotation: a shorter annotation is refused at admission, and one that got past "
        "admission is raised to this."),
}
# The flag of each FaultDefaults field, for messages.
FLAGS: Mapping[str, str] = {
    **{name: flag for flag, (name, _, _) in _PERIODS.items()},
    **{name: flag for flag, (name, _) in _CEILINGS.items()},
    **{name: flag for flag, (name, _) in _FLOORS.items()},
    "retry_limit": "--retry-limit", "delete_when_finished": "--delete-finished-appwrappers",
    "max_namespace_resets_per_minute": "--max-resets-per-namespace-per-minute",
}


def options(command: F) -> F:
    """Add the fault tolerance flags to ``command`` (see the module docstring)."""
    decorators = [
        *(click.option(flag, name, type=DURATION, default=ft.format_duration(getattr(ft.DEFAULTS, name)),
                       help=f"{text} The default of the AppWrapper annotation {annotation}; at most "
                            f"{'--success-ttl-ceiling' if annotation == ft.SUCCESS_TTL else '--grace-period-ceiling'}"
                            f"{_floor_flag(annotation)}. A Go duration (90s, 5m, 1h30m).")
          for flag, (name, annotation, text) in _PERIODS.items()),
        click.option("--retry-limit", "retry_limit", type=click.IntRange(0, ft.MAX_RETRY_LIMIT),
                     default=ft.DEFAULTS.retry_limit,
                     help=f"How many times an unhealthy AppWrapper is reset before it is Failed (a reset for a sick "
                          f"node is not counted). The default of the AppWrapper annotation {ft.RETRY_LIMIT}."),
        *(click.option(flag, name, type=DURATION, default=ft.format_duration(getattr(ft.DEFAULTS, name)),
                       help=f"{text} A Go duration.")
          for flag, (name, text) in {**_CEILINGS, **_FLOORS}.items()),
        click.option("--max-resets-per-namespace-per-minute", "max_namespace_resets_per_minute",
                     type=click.IntRange(min=0), default=ft.DEFAULTS.max_namespace_resets_per_minute,
                     help="At most this many resets of one namespace's AppWrappers in any minute: a reset beyond it "
                          "waits (its AppWrapper's status says so) until the namespace has room. Bounds what a "
                          "namespace's failing AppWrappers cost the controller and the API server. 0: no bound."),
        click.option("--delete-finished-appwrappers/--keep-finished-appwrappers", "delete_when_finished",
                     default=ft.DEFAULTS.delete_when_finished,
                     help=f"Whether a finished AppWrapper is itself deleted once its objects are (after "
                          f"--success-ttl when Completed, --deletion-on-failure-grace-period when Failed). The "
                          f"default of the AppWrapper annotation {ft.DELETE_WHEN_FINISHED}."),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def _floor_flag(annotation: str) -> str:
    name = ft.FLOORED.get(annotation)
    return f", at least {FLAGS[name]}" if name is not None else ""


def fault_defaults(values: Mapping[str, Any]) -> ft.FaultDefaults:
    """The ``FaultDefaults`` of the flags' values (keyword arguments named after its fields); a usage error naming
    the flags when they do not hold together."""
    defaults = ft.FaultDefaults(**{name: values[name] for name in FLAGS})
    found = defaults.problems()
    if found:
        raise click.UsageError("the fault tolerance flags do not hold together: " + "; ".join(
            _name_flags(problem) for problem in found))
    return defaults


def described(defaults: ft.FaultDefaults) -> dict[str, object]:
    """Each flag (without its dashes) and its value as the flag is written (Go durations), for the start-up log."""
    counts = ("retry_limit", "delete_when_finished", "max_namespace_resets_per_minute")
    return {flag.lstrip("-"): getattr(defaults, name) if name in counts else ft.format_duration(getattr(defaults, name))
            for name, flag in FLAGS.items()}


def _name_flags(problem: str) -> str:
    """A problem of ``FaultDefaults.problems()`` with the flag of each annotation it names, and of its ceiling."""
    for annotation, name in ft.DURATIONS.items():
        marker = f"default {ft.short(annotation)}"
        if marker in problem:
            ceiling = "--success-ttl-ceiling" if annotation == ft.SUCCESS_TTL else "--grace-period-ceiling"
            problem = problem.replace(marker, f"{marker} ({FLAGS[name]})").replace(
                "exceeds its ceiling", f"exceeds its ceiling ({ceiling})")
            if (floor := ft.FLOORED.get(annotation)) is not None:
                problem = problem.replace("is below its floor", f"is below its floor ({FLAGS[floor]})")
    for name in set(ft.FLOORED.values()):
        problem = problem.replace(f"the {name.replace('_', ' ')}", f"the {name.replace('_', ' ')} ({FLAGS[name]})")
    return problem.replace("the grace period ceiling", "the grace period ceiling (--grace-period-ceiling)")
