"""The controller's flags parsed into its settings groups (``mcad.settings``), one function per group.

Contract: each parser takes click's options for ``mcad-controller`` (the mapping ``mcad.cli.controller.main`` is
given, named as click names them) and returns its group, validated: what does not hold together is a
``click.UsageError`` with the message the controller has always given, naming the flag. ``main`` calls them in a
fixed order (fault tolerance, api, leader election, serving, admission, scheduling, hub), so that of several wrong
flags the same one is reported first as before. They do no I/O but one: ``hub_settings`` reads the clusters file,
so a bad one is refused before anything connects.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import click

from mcad.admission import callers
from mcad.api import minruntime
from mcad.api.faulttolerance import FaultDefaults
from mcad.api.topologyasks import label_key_error
from mcad.api.validation import Limits
from mcad.hub.clusters import ConfigError, load_config
from mcad.hub.placement import Policy
from mcad.k8s.leader import validate_timings
from mcad.model.nodehealth import NO_RULES, NodeHealth, parse_rule
from mcad.serve import server
from mcad.settings import (
    AdmissionSettings,
    ApiSettings,
    HubSettings,
    LeaderElectionSettings,
    SchedulingSettings,
    ServingSettings,
)

Options = Mapping[str, Any]


def api_settings(options: Options) -> ApiSettings:
    """``--legacy-api``, ``--quota``, ``--max-items``, ``--max-appwrapper-bytes``, ``--allowed-scheduler-names``,
    ``--default-max-priority``, ``--allow-protected-namespace``."""
    limits = Limits(max_items=options["max_items"], max_bytes=options["max_appwrapper_bytes"],
                    scheduler_names=scheduler_names_of(options["allowed_scheduler_names"]))
    return ApiSettings(legacy_api=options["legacy_api"], quota_trees=options["quota_trees"], limits=limits,
                       default_max_priority=options["default_max_priority"],
                       allowed_protected=tuple(options["allowed_protected"]))


def leader_election_settings(options: Options) -> LeaderElectionSettings:
    """``--leader-elect*``: timings that do not hold together, or a pod label without a pod, are a usage error."""
    settings = LeaderElectionSettings(
        enabled=options["leader_elect"], lease_name=options["leader_elect_lease_name"],
        namespace=options["leader_elect_namespace"], lease_duration=options["leader_elect_lease_duration"],
        renew_deadline=options["leader_elect_renew_deadline"], retry_period=options["leader_elect_retry_period"],
        label_pod=options["leader_elect_label_pod"])
    if settings.enabled:
        try:
            validate_timings(settings.lease_duration, settings.renew_deadline, settings.retry_period)
        except ValueError as err:
            raise click.UsageError(str(err)) from err
    if settings.label_pod and not (settings.enabled and os.environ.get("POD_NAME")):
        raise click.UsageError("--leader-elect-label-pod needs --leader-elect and $POD_NAME (the pod to label)")
    return settings


def serving_settings(options: Options) -> ServingSettings:
    """``--http-bind-address``, ``--insecure-debug-endpoints``, ``--unknown-tokens-*``."""
    settings = ServingSettings(bind_address=options["http_bind_address"],
                               insecure=options["insecure_debug_endpoints"],
                               unknown_tokens_per_second=options["unknown_tokens_per_second"],
                               unknown_tokens_burst=options["unknown_tokens_burst"])
    if settings.served:
        try:
            server.parse_bind_address(settings.bind_address)
        except ValueError as err:
            raise click.UsageError(str(err)) from err
    return settings


def admission_settings(options: Options) -> AdmissionSettings:
    """``--webhook*``, ``--api-server-cidrs``, ``--admission-allowed-kinds``, ``--status-writer``."""
    settings = AdmissionSettings(
        enabled=options["webhook_enabled"], bind_address=options["webhook_bind_address"],
        share_port=options["webhook_share_port"], cert_dir=options["webhook_cert_dir"],
        cert_secret=options["webhook_cert_secret"], cert_namespace=options["webhook_cert_namespace"],
        service_name=options["webhook_service_name"],
        cert_hosts=tuple(h for h in options["webhook_cert_hosts"].split(",") if h.strip()),
        configuration_name=options["webhook_configuration_name"], creator=options["webhook_creator"],
        cert_poll_seconds=options["webhook_cert_poll_seconds"], drain_seconds=options["webhook_drain_seconds"],
        client_ca=options["webhook_client_ca"], client_names=tuple(options["webhook_client_names"]),
        token_file=options["webhook_token_file"],
        access_reviews_per_second=options["webhook_access_reviews_per_second"],
        access_reviews_burst=options["webhook_access_reviews_burst"],
        access_reviews_total=options["webhook_access_reviews_total"],
        api_server_cidrs=tuple(c for c in options["api_server_cidrs"].split(",") if c.strip()),
        allowed_kinds=options["admission_allowed_kinds"], status_writers=tuple(options["status_writers"]))
    if settings.client_names and not settings.client_ca:
        raise click.UsageError("--webhook-client-name needs --webhook-client-ca")
    api_server_networks(settings)  # refused here, before anything starts
    if settings.enabled:
        try:
            server.parse_bind_address(settings.bind_address)
        except ValueError as err:
            raise click.UsageError(f"--webhook-bind-address: {err}") from err
    return settings


def api_server_networks(settings: AdmissionSettings) -> callers.SourceNetworks:
    """The API server's addresses (``--api-server-cidrs``); a usage error for one that does not parse."""
    try:
        return callers.SourceNetworks(settings.api_server_cidrs)
    except ValueError as err:
        raise click.UsageError(f"--api-server-cidrs: {err}") from err


def scheduling_settings(options: Options, fault_defaults: FaultDefaults) -> SchedulingSettings:
    """What the dispatcher decides by: ``--fit``, ``--placement``, ``--strict-fifo``, ``--reservations``,
    ``--preemption*`` (a minimum run time default above its ceiling is a usage error),
    ``--node-health-rule``/``--no-node-health-rules``, ``--write-workers``, ``--backoff-status-rate``,
    ``--cycle-interval``, ``--topology-level`` and the fault tolerance flags. The protected namespaces are known
    once connected."""
    try:
        node_health = node_health_from_flags(options["node_health_rules"], options["no_node_health_rules"])
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    levels = topology_levels(options["topology_levels"])
    least = minruntime.MinRuntime(options["min_runtime"], options["min_runtime_ceiling"])
    for problem in least.problems():
        raise click.UsageError(f"--preemption-min-runtime, --preemption-min-runtime-ceiling: {problem}")
    return SchedulingSettings(
        fit=options["fit"], placement=options["placement"], strict_fifo=options["strict_fifo"],
        reservations=options["reservations"], preemption=options["preemption"],
        victim_timeout=options["victim_timeout"], preemption_backoff=options["preemption_backoff"],
        max_evictions_per_minute=options["max_evictions_per_minute"], min_runtime=least,
        preemption_cooldown=options["preemption_cooldown"], node_health=node_health,
        write_workers=options["write_workers"], backoff_status_rate=options["backoff_status_rate"],
        cycle_interval=options["cycle_interval"], topology_levels=levels, fair_sharing=options["fair_sharing"],
        fair_sharing_half_life=fair_sharing_half_life(options["fair_sharing_half_life"]),
        fair_sharing_configmap=options["fair_sharing_configmap"],
        fault_defaults=fault_defaults)


def fair_sharing_half_life(seconds: float) -> float:
    """``--fair-sharing-half-life``: a usage error unless positive."""
    if not seconds > 0:
        raise click.UsageError(f"--fair-sharing-half-life must be longer than 0, not {seconds:g} s")
    return seconds


def topology_levels(levels: tuple[str, ...]) -> tuple[str, ...]:
    """``--topology-level`` in the order given (largest first): a usage error names one that is not a valid node
    label key or is given twice."""
    for level in levels:
        error = label_key_error(level)
        if error:
            raise click.UsageError(f"--topology-level {level!r} is not a node label key: {error}")
    if len(set(levels)) != len(levels):
        raise click.UsageError(f"--topology-level names a level twice: {', '.join(levels)}")
    return levels


def node_health_from_flags(rules: tuple[str, ...], none: bool) -> NodeHealth:
    """The node-health rules of ``--node-health-rule`` (all of them, in place of the defaults) or
    ``--no-node-health-rules``; Autopilot's without either. ValueError names a rule that does not parse."""
    if none and rules:
        raise ValueError("--no-node-health-rules and --node-health-rule contradict each other: give one")
    if none:
        return NO_RULES
    if not rules:
        return NodeHealth()
    return NodeHealth(parse_rule(rule) for rule in rules)


def hub_settings(options: Options, scheduling: SchedulingSettings) -> HubSettings:
    """``--clusters-config`` (read and checked now), ``--cluster-policy``, ``--cluster-probe-period``."""
    if options["clusters_config"] is None:
        return HubSettings(probe_period=options["cluster_probe_period"])
    try:
        config = load_config(options["clusters_config"])
    except ConfigError as err:
        raise click.UsageError(str(err)) from err
    if options["cluster_policy"] is not None:
        config = dataclasses.replace(config, policy=Policy(options["cluster_policy"]))
    if scheduling.fit != "nodes":
        raise click.UsageError("--clusters-config places each gang on one worker's nodes: use --fit=nodes")
    return HubSettings(config=config, probe_period=options["cluster_probe_period"])


def scheduler_names_of(values: tuple[str, ...]) -> frozenset[str]:
    """The names of ``--allowed-scheduler-names`` (repeated, comma-separated); a usage error for one that is not a
    name a pod could give (a DNS-1123 subdomain)."""
    names = frozenset(name.strip() for value in values for name in value.split(",") if name.strip())
    for name in sorted(names):
        if len(name) > 253 or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name):
            raise click.UsageError(f"--allowed-scheduler-names: {name!r} is not a scheduler name (a DNS-1123 "
                                   f"subdomain)")
    return names
