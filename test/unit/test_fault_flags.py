"""The controller's fault tolerance flags: Go durations, each bad value a usage error naming its flag, defaults that
do not hold together refused before the controller connects, and the values landing in ``FaultDefaults``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from mcad.api import faulttolerance as ft
from mcad.cli import controller, faultflags


@click.command()
@faultflags.options
def show(**values: Any) -> None:
    click.echo(repr(faultflags.fault_defaults(values)))


def defaults_of(*args: str) -> ft.FaultDefaults:
    seen: list[ft.FaultDefaults] = []

    @click.command()
    @faultflags.options
    def command(**values: Any) -> None:
        seen.append(faultflags.fault_defaults(values))

    result = CliRunner().invoke(command, list(args))
    assert result.exit_code == 0, result.output
    return seen[0]


def test_without_flags_the_defaults_are_upstreams() -> None:
    assert defaults_of() == ft.DEFAULTS
    assert (ft.DEFAULTS.admission_grace, ft.DEFAULTS.warmup_grace, ft.DEFAULTS.failure_grace,
            ft.DEFAULTS.retry_pause, ft.DEFAULTS.retry_limit, ft.DEFAULTS.forceful_deletion_grace,
            ft.DEFAULTS.deletion_on_failure_grace, ft.DEFAULTS.success_ttl, ft.DEFAULTS.grace_ceiling,
            ft.DEFAULTS.success_ttl_ceiling, ft.DEFAULTS.delete_when_finished) == (
        60, 300, 60, 90, 3, 600, 0, 168 * 3600, 24 * 3600, 168 * 3600, False)


def test_every_flag_lands_in_its_field() -> None:
    assert defaults_of(
        "--admission-grace-period", "30s", "--warmup-grace-period", "1h", "--failure-grace-period", "2m",
        "--retry-pause-period", "0", "--retry-limit", "7", "--forceful-deletion-grace-period", "1h30m",
        "--deletion-on-failure-grace-period", "500ms", "--success-ttl", "48h", "--grace-period-ceiling", "2h",
        "--success-ttl-ceiling", "72h", "--delete-finished-appwrappers", "--retry-pause-floor", "0",
        "--grace-period-floor", "15s") == ft.FaultDefaults(
        admission_grace=30, warmup_grace=3600, failure_grace=120, retry_pause=0, retry_limit=7,
        forceful_deletion_grace=5400, deletion_on_failure_grace=0.5, success_ttl=48 * 3600, grace_ceiling=7200,
        success_ttl_ceiling=72 * 3600, delete_when_finished=True, retry_pause_floor=0, grace_floor=15)
    assert defaults_of("--keep-finished-appwrappers").delete_when_finished is False


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--failure-grace-period", "60", "not a duration"),
    ("--retry-pause-period", "5 minutes", "not a duration"),
    ("--warmup-grace-period", "-1m", "may not be negative"),
    ("--grace-period-ceiling", "", "not a duration"),
    ("--success-ttl", "11000d", "not a duration"),
])
def test_a_bad_duration_is_a_usage_error_naming_the_flag(flag: str, value: str, why: str) -> None:
    result = CliRunner().invoke(controller.main, [flag, value, "--connect-only"])
    assert result.exit_code == 2
    assert f"Invalid value for '{flag}': {value!r}: " in result.output and why in result.output, result.output


def test_a_retry_limit_out_of_range_is_a_usage_error() -> None:
    for value in ("-1", "1001", "three"):
        result = CliRunner().invoke(controller.main, ["--retry-limit", value, "--connect-only"])
        assert result.exit_code == 2 and "'--retry-limit'" in result.output, result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--failure-grace-period", "25h"],
     "the default failureGracePeriodDuration (--failure-grace-period) 25h exceeds its ceiling "
     "(--grace-period-ceiling) 24h"),
    (["--grace-period-ceiling", "4m"],
     "the default warmupGracePeriodDuration (--warmup-grace-period) 5m exceeds its ceiling (--grace-period-ceiling) "
     "4m; the default forcefulDeletionGracePeriodDuration (--forceful-deletion-grace-period) 10m exceeds"),
    (["--success-ttl", "200h"],
     "the default successTTLDuration (--success-ttl) 200h exceeds its ceiling (--success-ttl-ceiling) 168h"),
    (["--success-ttl", "0s"], "the default successTTLDuration (--success-ttl) must be positive"),
    (["--admission-grace-period", "10m"],
     "the default admissionGracePeriodDuration (--admission-grace-period) exceeds warmupGracePeriodDuration"),
    (["--retry-pause-period", "5s"],
     "the default retryPausePeriodDuration (--retry-pause-period) 5s is below its floor (--retry-pause-floor) 10s"),
    (["--grace-period-floor", "2m"],
     "the default admissionGracePeriodDuration (--admission-grace-period) 1m is below its floor "
     "(--grace-period-floor) 2m"),
    (["--retry-pause-floor", "27h", "--grace-period-ceiling", "26h"],
     "the retry pause floor (--retry-pause-floor) 27h exceeds the grace period ceiling (--grace-period-ceiling) 26h"),
])
def test_defaults_that_do_not_hold_together_stop_the_controller_before_it_connects(
        tmp_path: Path, args: list[str], message: str) -> None:
    missing = tmp_path / "missing"
    result = CliRunner().invoke(controller.main, ["--kubeconfig", str(missing), *args, "--connect-only"])
    assert result.exit_code == 2
    assert "the fault tolerance flags do not hold together: " in result.output, result.output
    assert message in result.output, result.output
    assert "cannot connect" not in result.output + result.stderr


def test_good_fault_flags_let_the_controller_go_on_to_connect(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = CliRunner().invoke(controller.main, ["--kubeconfig", str(missing), "--grace-period-ceiling", "48h",
                                                  "--failure-grace-period", "36h", "--delete-finished-appwrappers",
                                                  "--connect-only"])
    assert result.exit_code == 2
    assert json.loads(result.stderr.strip().splitlines()[-1])["event"] == "cannot connect to the API server"


def test_the_flags_reach_the_admission_config() -> None:
    defaults = ft.FaultDefaults(grace_ceiling=7200)
    config = controller.admission_config("", frozenset(), fault_defaults=defaults)
    assert config.fault_defaults is defaults
    assert controller.admission_config("", frozenset()).fault_defaults == ft.DEFAULTS


def test_the_start_up_log_shows_the_flags_as_written() -> None:
    shown = faultflags.described(ft.FaultDefaults(retry_pause=90, delete_when_finished=True))
    assert shown["retry-pause-period"] == "1m30s" and shown["success-ttl-ceiling"] == "168h"
    assert shown["retry-limit"] == 3 and shown["delete-finished-appwrappers"] is True
    assert shown["retry-pause-floor"] == "10s" and shown["grace-period-floor"] == "10s"
    assert shown["max-resets-per-namespace-per-minute"] == 20
    assert len(shown) == 14
