"""The two entry points parse flags and fail with a clear message when no cluster can be reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcad import __version__
from mcad.cli import controller, mcadctl
from test.support import unreachable_kubeconfig


def test_mcadctl_client_version_needs_no_cluster() -> None:
    result = CliRunner().invoke(mcadctl.main, ["version", "--client"])
    assert result.exit_code == 0
    assert result.output.strip() == f"mcadctl: {__version__}"


def test_mcadctl_version_names_the_missing_kubeconfig(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = CliRunner().invoke(mcadctl.main, ["--kubeconfig", str(missing), "version"])
    assert result.exit_code == 1
    assert f"kubeconfig '{missing}' does not exist" in result.output


def test_mcadctl_version_reports_an_unreachable_server(tmp_path: Path) -> None:
    config = unreachable_kubeconfig(tmp_path)
    result = CliRunner().invoke(mcadctl.main, ["--kubeconfig", str(config), "version"])
    assert result.exit_code == 1
    assert "cannot reach the API server https://127.0.0.1:9" in result.output


def test_controller_help_documents_its_flags() -> None:
    result = CliRunner().invoke(controller.main, ["--help"])
    assert result.exit_code == 0
    for flag in ("--kubeconfig", "--log-format", "--connect-only", "--webhook-bind-address", "--webhook-cert-dir",
                 "--webhook-cert-hosts", "--no-webhook"):
        assert flag in result.output


def test_controller_exits_2_with_the_reason_when_it_cannot_connect(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = CliRunner().invoke(controller.main, ["--kubeconfig", str(missing), "--connect-only"])
    assert result.exit_code == 2
    event = json.loads(result.stderr.strip().splitlines()[-1])
    assert event["level"] == "error"
    assert event["event"] == "cannot connect to the API server"
    assert str(missing) in event["reason"]


def test_malformed_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    result = CliRunner().invoke(mcadctl.main, ["--kubeconfig", str(config), "version"])
    assert result.exit_code == 1
    assert "invalid Kubernetes configuration" in result.output


def test_a_bad_webhook_bind_address_is_a_usage_error() -> None:
    result = CliRunner().invoke(controller.main, ["--webhook-bind-address", "9443", "--connect-only"])
    assert result.exit_code == 2
    assert "--webhook-bind-address: bind address must be host:port" in result.output
    # Without the webhooks, the address is not looked at.
    result = CliRunner().invoke(controller.main, ["--no-webhook", "--webhook-bind-address", "9443",
                                                  "--kubeconfig", "/nonexistent", "--connect-only"])
    assert result.exit_code == 2 and "webhook" not in result.output + result.stderr


def test_api_server_cidrs_that_are_not_addresses_are_a_usage_error() -> None:
    result = CliRunner().invoke(controller.main, ["--api-server-cidrs", "10.0.0.10/32,the-api-server",
                                                  "--connect-only"])
    assert result.exit_code == 2
    assert "--api-server-cidrs: 'the-api-server' is not an IP address or CIDR" in result.output
    # Addresses and CIDRs of both families pass (and the run goes on to fail connecting, exit 2 with no usage text).
    result = CliRunner().invoke(controller.main, ["--api-server-cidrs", "10.0.0.10/32, 10.1.0.0/16,fd00::1",
                                                  "--kubeconfig", "/nonexistent", "--connect-only"])
    assert result.exit_code == 2 and "api-server-cidrs" not in result.output + result.stderr


def test_max_items_cannot_go_above_the_crds_ceiling() -> None:
    result = CliRunner().invoke(controller.main, ["--max-items", "1001", "--connect-only"])
    assert result.exit_code == 2
    assert "--max-items" in result.output and "1001 is not in the range 1<=x<=1000" in result.output


def test_the_controller_caps_glibcs_malloc_arenas_unless_the_environment_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert controller.limit_malloc_arenas() is True, "glibc's mallopt accepts M_ARENA_MAX"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert controller.limit_malloc_arenas() is False, "an operator's own setting wins"


def test_default_max_priority_is_an_int32() -> None:
    result = CliRunner().invoke(controller.main, ["--default-max-priority", str(2**31), "--connect-only"])
    assert result.exit_code == 2 and "--default-max-priority" in result.output


@pytest.mark.parametrize("value", ["-1", "1001", "two"])
def test_reservations_out_of_range_is_a_usage_error(value: str) -> None:
    result = CliRunner().invoke(controller.main, ["--reservations", value, "--connect-only"])
    assert result.exit_code == 2 and "--reservations" in result.output
