"""The controller's settings groups (``mcad.settings``) as its flags' parsers make them (``mcad.cli.settingsflags``):
a controller given no flag gets the groups' defaults, so tests that build a group naming only what they change run
what a default controller runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mcad.api.faulttolerance import DEFAULTS
from mcad.cli import controller, faultflags, settingsflags
from mcad.model.nodehealth import DEFAULT_RULES
from mcad.settings import ApiSettings, HubSettings, LeaderElectionSettings, SchedulingSettings


def options(*args: str) -> dict[str, Any]:
    """What click hands ``main`` for these arguments."""
    return dict(controller.main.make_context("mcad-controller", list(args)).params)


def test_a_controller_given_no_flag_gets_the_groups_defaults() -> None:
    given = options()
    scheduling = settingsflags.scheduling_settings(given, faultflags.fault_defaults(given))
    assert scheduling.node_health is not None and scheduling.node_health.rules == DEFAULT_RULES
    assert dataclasses.replace(scheduling, node_health=None) == SchedulingSettings()
    assert scheduling.fault_defaults == DEFAULTS
    # Quota trees are asked for by default; the controller turns them off when the CRD is not served.
    assert settingsflags.api_settings(given) == ApiSettings(quota_trees=True)
    assert settingsflags.leader_election_settings(given) == LeaderElectionSettings()
    assert settingsflags.hub_settings(given, scheduling) == HubSettings()


def test_flags_reach_their_group() -> None:
    given = options("--fit=aggregate", "--placement=advisory", "--strict-fifo", "--preemption",
                    "--preemption-victim-timeout=30", "--write-workers=4", "--no-node-health-rules",
                    "--max-items=5", "--allowed-scheduler-names=a,b", "--http-bind-address=0",
                    "--webhook-cert-hosts=127.0.0.1,,x", "--api-server-cidrs=10.0.0.1,")
    scheduling = settingsflags.scheduling_settings(given, DEFAULTS)
    assert (scheduling.fit, scheduling.placement, scheduling.strict_fifo, scheduling.preemption,
            scheduling.victim_timeout, scheduling.write_workers) == ("aggregate", "advisory", True, True, 30.0, 4)
    assert scheduling.node_health is not None and scheduling.node_health.rules == ()
    api = settingsflags.api_settings(given)
    assert (api.limits.max_items, api.limits.scheduler_names) == (5, frozenset({"a", "b"}))
    assert not settingsflags.serving_settings(given).served
    admission = settingsflags.admission_settings(given)
    assert (admission.cert_hosts, admission.api_server_cidrs) == (("127.0.0.1", "x"), ("10.0.0.1",))


def test_the_groups_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SchedulingSettings().fit = "aggregate"  # type: ignore[misc]
