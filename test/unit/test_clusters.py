"""mcad.hub.clusters without a cluster: the hub configuration file and the worker health state machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mcad.hub.clusters import (
    ConfigError,
    HealthState,
    SecretRef,
    WorkerConnectError,
    WorkerConnector,
    WorkerHealth,
    WorkerSpec,
    load_config,
)
from mcad.hub.placement import Policy
from mcad.k8s import kube

GOOD = """
workers:
  - name: east
    kubeconfig: east.kubeconfig
    context: east-admin
    labels: {region: us-east, gpu: a100, example.com/tier: "1"}
  - name: west
    secret: {namespace: mcad-system, name: west-kubeconfig, key: config}
  - name: north
    secret: {name: north-kubeconfig}
unreachableTimeoutSeconds: 120
policy: spread
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(text)
    return path


def test_good_file_parses_with_relative_paths_anchored_at_the_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert [w.name for w in config.workers] == ["east", "west", "north"]
    east = config.worker("east")
    assert east.kubeconfig == str(tmp_path / "east.kubeconfig")
    assert east.secret is None and east.context == "east-admin"
    assert dict(east.labels) == {"region": "us-east", "gpu": "a100", "example.com/tier": "1"}
    assert config.worker("west").secret == SecretRef("west-kubeconfig", "mcad-system", "config")
    assert config.worker("north").secret == SecretRef("north-kubeconfig", "", "kubeconfig")
    assert config.unreachable_timeout_seconds == 120.0
    assert config.policy is Policy.SPREAD
    with pytest.raises(KeyError):
        config.worker("south")


def test_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "workers: [{name: a, kubeconfig: /k}]"))
    assert config.unreachable_timeout_seconds == 300.0
    assert config.policy is Policy.BEST
    assert config.workers[0].kubeconfig == "/k" and dict(config.workers[0].labels) == {}


@pytest.mark.parametrize(("text", "expected"), [
    ("workers: []", "'workers' must be a non-empty list"),
    ("- a", "expected a mapping with a 'workers' list, got list"),
    ("workers: [{name: a, kubeconfig: /k}]\npolicies: best", "unknown field(s) 'policies'"),
    ("workers: [{name: a, kubeconfg: /k}]", "workers[0] (a): unknown field(s) 'kubeconfg'"),
    ("workers: [{kubeconfig: /k}]", "workers[0]: field 'name': required"),
    ("workers: [{name: East, kubeconfig: /k}]", "workers[0] (East): field 'name': required, a DNS label"),
    ("workers: [{name: a, kubeconfig: /k}, {name: a, kubeconfig: /j}]",
     "workers[1] (a): field 'name': duplicate of workers[0]"),
    ("workers: [{name: a}]", "workers[0] (a): exactly one of 'kubeconfig' (a file) or 'secret'"),
    ("workers: [{name: a, kubeconfig: /k, secret: {name: s}}]", "workers[0] (a): exactly one of"),
    ("workers: [{name: a, kubeconfig: 7}]", "workers[0] (a): field 'kubeconfig': must be a file path"),
    ("workers: [{name: a, secret: s}]", "workers[0] (a): field 'secret': must be a mapping"),
    ("workers: [{name: a, secret: {nmae: s}}]", "workers[0] (a): field 'secret': unknown field(s) 'nmae'"),
    ("workers: [{name: a, secret: {namespace: x}}]", "workers[0] (a): field 'secret.name': required"),
    ("workers: [{name: a, secret: {name: s, namespace: X_Y}}]", "field 'secret.namespace'"),
    ("workers: [{name: a, secret: {name: s, key: 'a b'}}]", "field 'secret.key'"),
    ("workers: [{name: a, kubeconfig: /k, context: ''}]", "workers[0] (a): field 'context'"),
    ("workers: [{name: a, kubeconfig: /k, labels: [x]}]", "workers[0] (a): field 'labels': must be a mapping"),
    ("workers: [{name: a, kubeconfig: /k, labels: {gpu: true}}]",
     "workers[0] (a): field 'labels.gpu': True is not a valid label value"),
    ("workers: [{name: a, kubeconfig: /k, labels: {'-bad': x}}]", "field 'labels': '-bad' is not a valid label"),
    ("workers: [{name: a, kubeconfig: /k}]\nunreachableTimeoutSeconds: 0",
     "field 'unreachableTimeoutSeconds': must be a positive number"),
    ("workers: [{name: a, kubeconfig: /k}]\nunreachableTimeoutSeconds: true", "unreachableTimeoutSeconds"),
    ("workers: [{name: a, kubeconfig: /k}]\npolicy: random", "field 'policy': must be one of first|best|spread"),
    ("workers: [\n", "not valid YAML"),
])
def test_each_error_names_file_worker_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: ")
    assert expected in str(err.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the cluster configuration"):
        load_config(tmp_path / "absent.yaml")


def test_connector_names_the_worker_when_the_file_is_missing_or_no_hub_is_given(tmp_path: Path) -> None:
    connector = WorkerConnector(None)
    with pytest.raises(WorkerConnectError, match=r"worker cluster east: kubeconfig .* does not exist"):
        connector.connect(WorkerSpec("east", kubeconfig=str(tmp_path / "nothing")))
    with pytest.raises(WorkerConnectError, match=r"worker cluster west: .* without a hub connection"):
        connector.connect(WorkerSpec("west", secret=SecretRef("s")))


def test_fingerprint_follows_the_kubeconfig_file_and_matches_what_was_loaded(tmp_path: Path) -> None:
    path = tmp_path / "east.kubeconfig"
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "east",
              "clusters": [{"name": "east", "cluster": {"server": "https://east.example:6443"}}],
              "users": [{"name": "mcad", "user": {"token": "first"}}],
              "contexts": [{"name": "east", "context": {"cluster": "east", "user": "mcad"}}]}
    path.write_text(yaml.safe_dump(config))
    spec = WorkerSpec("east", kubeconfig=str(path))
    connector = WorkerConnector(None)
    conn, loaded = connector.connect_fingerprinted(spec)
    assert conn.server == "https://east.example:6443"
    assert loaded == connector.fingerprint(spec)

    config["users"][0]["user"]["token"] = "rotated"
    path.write_text(yaml.safe_dump(config))
    assert connector.fingerprint(spec) != loaded
    path.unlink()
    with pytest.raises(WorkerConnectError, match=r"worker cluster east: kubeconfig .*: cannot read it"):
        connector.fingerprint(spec)


def test_fingerprint_follows_the_credential_files_a_kubeconfig_names(tmp_path: Path) -> None:
    """A projected token file or a renewed certificate is a rotation although the kubeconfig is unchanged; a
    relative path is read relative to the kubeconfig, as the client reads it."""
    (tmp_path / "token").write_text("first")
    ca = tmp_path / "elsewhere" / "ca.crt"
    ca.parent.mkdir()
    ca.write_text("ca one")
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "east",
              "clusters": [{"name": "east", "cluster": {"server": "https://east.example:6443",
                                                          "certificate-authority": str(ca)}}],
              "users": [{"name": "mcad", "user": {"tokenFile": "token"}},
                        {"name": "unused", "user": {"client-certificate": "absent.crt"}}],
              "contexts": [{"name": "east", "context": {"cluster": "east", "user": "mcad"}}]}
    path = tmp_path / "east.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    spec = WorkerSpec("east", kubeconfig=str(path))
    connector = WorkerConnector(None)
    conn, loaded = connector.connect_fingerprinted(spec)
    assert conn.api.configuration.api_key["BearerToken"] == "Bearer first"
    assert connector.fingerprint(spec) == loaded

    (tmp_path / "token").write_text("second")
    after_token = connector.fingerprint(spec)
    assert after_token != loaded
    fresh, digest = connector.connect_fingerprinted(spec)
    assert fresh.api.configuration.api_key["BearerToken"] == "Bearer second"
    assert digest == after_token

    ca.write_text("ca two")
    assert connector.fingerprint(spec) != after_token
    after_ca = connector.fingerprint(spec)
    (tmp_path / "absent.crt").write_text("now it exists")  # named by an unused user: still a change
    assert connector.fingerprint(spec) != after_ca


# ---------------------------------------------------------------------------------------------- health


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


NO_ANSWER = kube.ApiError(0, "MaxRetryError", "GET /version: connection refused")
REJECTED = kube.ApiError(401, "Unauthorized", "GET /version: Unauthorized")
FORBIDDEN = kube.ApiError(403, "Forbidden", "GET /version: forbidden")


def state_of(health: WorkerHealth) -> HealthState:
    """Read afresh: mypy would otherwise keep the narrowed state of an earlier assert across record_* calls."""
    return health.state


def healthy(clock: FakeClock, threshold: int = 3) -> WorkerHealth:
    health = WorkerHealth("east", failure_threshold=threshold, clock=clock)
    assert health.state is HealthState.UNKNOWN and not health.usable()
    assert health.record_success()
    assert state_of(health) is HealthState.HEALTHY and health.usable()
    return health


def test_unreachable_after_threshold_consecutive_failures_and_back_on_success() -> None:
    clock = FakeClock()
    health = healthy(clock)
    clock.now += 5
    assert not health.record_probe_failure(NO_ANSWER)
    clock.now += 5
    assert not health.record_probe_failure(NO_ANSWER)
    assert health.state is HealthState.HEALTHY and health.status.consecutive_failures == 2
    clock.now += 5
    assert health.record_probe_failure(NO_ANSWER)
    status = health.status
    assert status.state is HealthState.UNREACHABLE and not health.usable()
    assert status.since == 1015.0 and status.down_since == 1015.0
    assert "connection refused" in status.message
    clock.now += 100
    assert not health.record_probe_failure(NO_ANSWER)  # still down: since stays put
    assert health.status.since == 1015.0 and health.down_for() == 100.0
    assert health.record_success()
    assert health.status == health.status.__class__(HealthState.HEALTHY, 1115.0, None, "", 0)
    assert health.down_for() == 0.0


def test_a_success_resets_the_failure_count() -> None:
    clock = FakeClock()
    health = healthy(clock)
    health.record_probe_failure(NO_ANSWER)
    health.record_probe_failure(NO_ANSWER)
    assert not health.record_success()
    assert health.status.consecutive_failures == 0
    health.record_probe_failure(NO_ANSWER)
    health.record_probe_failure(NO_ANSWER)
    assert health.state is HealthState.HEALTHY


def test_never_reached_worker_is_unreachable_at_its_first_failure() -> None:
    clock = FakeClock()
    health = WorkerHealth("east", clock=clock)
    clock.now += 1
    assert health.record_probe_failure(NO_ANSWER)
    # Counted from creation: after a restart, AppWrappers may already sit on a worker that never answers.
    assert health.status.since == 1001.0 and health.status.down_since == 1000.0


@pytest.mark.parametrize("err", [REJECTED, FORBIDDEN])
def test_rejected_credentials_are_unauthorized_at_once_with_the_message(err: kube.ApiError) -> None:
    clock = FakeClock()
    health = healthy(clock)
    clock.now += 7
    assert health.record_probe_failure(err)
    status = health.status
    assert status.state is HealthState.UNAUTHORIZED and not health.usable()
    assert status.message.startswith(f"credentials rejected ({err.status} ")
    assert status.since == 1007.0
    assert not health.record_probe_failure(err)  # no second transition to report
    assert health.record_success()
    assert health.state is HealthState.HEALTHY


def test_down_since_spans_unreachable_then_unauthorized_for_the_timeout() -> None:
    clock = FakeClock()
    health = healthy(clock, threshold=1)
    clock.now += 10
    health.record_probe_failure(NO_ANSWER)
    clock.now += 200
    assert health.record_probe_failure(REJECTED)  # it came back with credentials that no longer work
    assert health.status.since == 1210.0 and health.status.down_since == 1010.0
    assert not health.timed_out(300)
    clock.now += 100
    assert health.timed_out(300)
    health.record_success()
    assert not health.timed_out(0)


def test_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError):
        WorkerHealth("east", failure_threshold=0)
