"""Worker clusters of a hub: their configuration, how to connect to each, and whether each is usable.

Contract (the first brick of multi-cluster dispatch; nothing here starts threads or watches, so single-cluster
mode pays nothing for it):

* ``load_config(path)`` reads a YAML file naming the worker clusters and returns a frozen ``HubConfig``.
  Every problem raises ``ConfigError`` whose message names the file, the worker (index and name) and the
  field. Unknown keys are errors, so a typo (``kubeconfg``) never passes silently; worker names are DNS labels
  and unique; each worker has exactly one of ``kubeconfig`` (a file; a relative path is taken relative to the
  config file) or ``secret`` (a Secret in the hub; its namespace defaults to the controller's). Defaults:
  ``unreachableTimeoutSeconds`` 300, ``policy`` best.
* ``WorkerConnector(hub).connect(spec)`` returns a ``kube.Connection`` to the worker. A file is handed to
  ``kube.connect``; kubeconfig text read from a Secret (through ``kube.request_json`` on the hub connection) is
  written to a private temporary file (mode 0600), loaded, and the file removed at once. Failures raise
  ``WorkerConnectError`` naming the worker and carrying the HTTP status when there was one.
  ``fingerprint(spec)`` is a digest of the credentials as they are now (the kubeconfig text and every
  credential file it names by path: ``tokenFile``, ``client-certificate``, ``client-key``,
  ``certificate-authority``), to notice a rotation; ``connect_fingerprinted(spec)`` returns the connection with
  the digest taken just before it was built, so a rotation racing the load is seen at the next check.
* ``WorkerHealth`` is one worker's health as a state machine, pure logic with an injectable clock:
  ``Unknown`` (never probed) -> ``Healthy`` on a success; ``Healthy`` -> ``Unreachable`` after
  ``failure_threshold`` consecutive failed probes; a 401/403 -> ``Unauthorized`` at once (the credentials
  stopped working: a condition to report, not a reason to crash); any success -> ``Healthy``. ``since`` is when
  the current state began and ``down_since`` when the worker last stopped being Healthy, so a caller applies
  ``unreachableTimeoutSeconds`` with ``down_for()``/``timed_out()``. ``probe(conn)`` is the check: one list of
  a single Node, without retries; ``check(health, conn)`` probes and records the outcome.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import hashlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from mcad.api.names import is_dns_label
from mcad.errors import ApiError, KubeConnectError
from mcad.hub.placement import Policy
from mcad.k8s import kube

DEFAULT_UNREACHABLE_TIMEOUT_SECONDS = 300.0
DEFAULT_SECRET_KEY = "kubeconfig"
DEFAULT_FAILURE_THRESHOLD = 3
DEFAULT_PROBE_TIMEOUT_SECONDS = 2.0

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


class ConfigError(Exception):
    """The hub configuration file is missing, not YAML, or wrong; the message says where and what."""


@dataclass(frozen=True)
class SecretRef:
    """A key of a Secret in the hub cluster holding kubeconfig text; namespace "" means the controller's."""

    name: str
    namespace: str = ""
    key: str = DEFAULT_SECRET_KEY


@dataclass(frozen=True)
class WorkerSpec:
    """One worker cluster: exactly one of ``kubeconfig`` (a file path) or ``secret`` is set."""

    name: str
    kubeconfig: str | None = None
    secret: SecretRef | None = None
    context: str | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def source(self) -> str:
        """Where the credentials come from, for messages."""
        if self.secret is not None:
            ns = self.secret.namespace or "<controller namespace>"
            return f"Secret {ns}/{self.secret.name} key {self.secret.key}"
        return f"kubeconfig {self.kubeconfig}"


@dataclass(frozen=True)
class HubConfig:
    workers: tuple[WorkerSpec, ...]
    unreachable_timeout_seconds: float = DEFAULT_UNREACHABLE_TIMEOUT_SECONDS
    policy: Policy = Policy.BEST

    def worker(self, name: str) -> WorkerSpec:
        """The worker named ``name``; ``KeyError`` when there is none."""
        for spec in self.workers:
            if spec.name == name:
                return spec
        raise KeyError(name)


# ---------------------------------------------------------------------------------------------- config

_TOP_KEYS = {"workers", "unreachableTimeoutSeconds", "policy"}
_WORKER_KEYS = {"name", "kubeconfig", "secret", "context", "labels"}
_SECRET_KEYS = {"namespace", "name", "key"}


def load_config(path: str | os.PathLike[str]) -> HubConfig:
    """Read and validate the hub configuration file at ``path``."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"{source}: cannot read the cluster configuration: {err.strerror or err}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from err
    return parse_config(data, source=source, base_dir=Path(path).resolve().parent)


def parse_config(data: Any, *, source: str = "<config>", base_dir: Path | None = None) -> HubConfig:
    """Validate an already parsed document; ``source`` names it in errors, ``base_dir`` anchors relative paths."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with a 'workers' list, got {_kind(data)}")
    _refuse_unknown(data, _TOP_KEYS, source)
    raw_workers = data.get("workers")
    if not isinstance(raw_workers, list) or not raw_workers:
        raise ConfigError(f"{source}: 'workers' must be a non-empty list, got {_kind(raw_workers)}")
    workers: list[WorkerSpec] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_workers):
        spec = _parse_worker(raw, index, source, base_dir)
        if spec.name in seen:
            raise ConfigError(f"{source}: workers[{index}] ({spec.name}): field 'name': duplicate of "
                              f"workers[{seen[spec.name]}]")
        seen[spec.name] = index
        workers.append(spec)

    timeout = data.get("unreachableTimeoutSeconds", DEFAULT_UNREACHABLE_TIMEOUT_SECONDS)
    # bool is an int in Python; "true" seconds is a typo, not 1.
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"{source}: field 'unreachableTimeoutSeconds': must be a positive number of seconds, "
                          f"got {timeout!r}")
    raw_policy = data.get("policy", Policy.BEST.value)
    try:
        policy = Policy(raw_policy)
    except ValueError:
        choices = "|".join(p.value for p in Policy)
        raise ConfigError(f"{source}: field 'policy': must be one of {choices}, got {raw_policy!r}") from None
    return HubConfig(tuple(workers), float(timeout), policy)


def _parse_worker(raw: Any, index: int, source: str, base_dir: Path | None) -> WorkerSpec:
    where = f"{source}: workers[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {_kind(raw)}")
    name = raw.get("name")
    if isinstance(name, str) and name:
        where = f"{where} ({name})"
    _refuse_unknown(raw, _WORKER_KEYS, where)
    if not isinstance(name, str) or not is_dns_label(name):
        raise ConfigError(f"{where}: field 'name': required, a DNS label (lower-case letters, digits, '-', at most "
                          f"63 characters), got {name!r}")

    kubeconfig = raw.get("kubeconfig")
    raw_secret = raw.get("secret")
    if (kubeconfig is None) == (raw_secret is None):
        raise ConfigError(f"{where}: exactly one of 'kubeconfig' (a file) or 'secret' (a Secret in the hub) "
                          "is required")
    secret: SecretRef | None = None
    if kubeconfig is not None:
        if not isinstance(kubeconfig, str) or not kubeconfig:
            raise ConfigError(f"{where}: field 'kubeconfig': must be a file path, got {kubeconfig!r}")
        expanded = Path(os.path.expanduser(kubeconfig))
        if not expanded.is_absolute() and base_dir is not None:
            expanded = base_dir / expanded
        kubeconfig = str(expanded)
    else:
        secret = _parse_secret(raw_secret, where)

    context = raw.get("context")
    if context is not None and (not isinstance(context, str) or not context):
        raise ConfigError(f"{where}: field 'context': must be a context name, got {context!r}")

    raw_labels = raw.get("labels") or {}
    if not isinstance(raw_labels, dict):
        raise ConfigError(f"{where}: field 'labels': must be a mapping of label names to values, "
                          f"got {_kind(raw_labels)}")
    labels: dict[str, str] = {}
    for key, value in raw_labels.items():
        if not isinstance(key, str) or not _valid_label_key(key):
            raise ConfigError(f"{where}: field 'labels': {key!r} is not a valid label name")
        # YAML reads `gpu: true` or `zone: 1` as non-strings; a label value must be a string, say so.
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise ConfigError(f"{where}: field 'labels.{key}': {value!r} is not a valid label value "
                              "(a string of at most 63 letters, digits, '-', '_', '.'; quote numbers and booleans)")
        labels[key] = value
    return WorkerSpec(name, kubeconfig, secret, context, MappingProxyType(labels))


def _parse_secret(raw: Any, where: str) -> SecretRef:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: field 'secret': must be a mapping with 'name' (and optional 'namespace', "
                          f"'key'), got {_kind(raw)}")
    _refuse_unknown(raw, _SECRET_KEYS, f"{where}: field 'secret'")
    name = raw.get("name")
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name):
        raise ConfigError(f"{where}: field 'secret.name': required, a Secret name, got {name!r}")
    namespace = raw.get("namespace", "")
    if not isinstance(namespace, str) or (namespace and not is_dns_label(namespace)):
        raise ConfigError(f"{where}: field 'secret.namespace': must be a namespace name, got {namespace!r}")
    key = raw.get("key", DEFAULT_SECRET_KEY)
    if not isinstance(key, str) or not re.match(r"^[-._A-Za-z0-9]+$", key):
        raise ConfigError(f"{where}: field 'secret.key': must be a Secret data key, got {key!r}")
    return SecretRef(name, namespace, key)


def _valid_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_LABEL_NAME.match(name))


def _refuse_unknown(raw: Mapping[Any, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(repr(k) for k in unknown)} "
                          f"(allowed: {', '.join(sorted(allowed))})")


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


# ---------------------------------------------------------------------------------------------- connecting


class WorkerConnectError(Exception):
    """A worker's credentials could not be read or loaded. ``status``: the HTTP code of the failed hub request
    (403: the controller may not read the Secret, 404: no such Secret), 0 otherwise."""

    def __init__(self, worker: str, message: str, status: int = 0) -> None:
        super().__init__(f"worker cluster {worker}: {message}")
        self.worker = worker
        self.status = status


# Kubeconfig fields that name a file holding a credential; the client reads them once, when it loads.
_USER_FILE_FIELDS = ("tokenFile", "client-certificate", "client-key")
_CLUSTER_FILE_FIELDS = ("certificate-authority",)


def _credential_files(text: bytes, base_dir: Path | None) -> list[Path]:
    """The files a kubeconfig names for credentials, in every user and cluster entry (not only the current
    context's: a spurious reload is harmless, a missed rotation is not). A relative path is taken relative to
    ``base_dir``, as the client does, and skipped when there is none (kubeconfig text from a Secret)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return []  # loading it reports the problem better than a digest could
    if not isinstance(doc, dict):
        return []
    found: set[Path] = set()
    for section, body_key, fields in (("users", "user", _USER_FILE_FIELDS),
                                      ("clusters", "cluster", _CLUSTER_FILE_FIELDS)):
        entries = doc.get(section)
        for entry in entries if isinstance(entries, list) else []:
            body = entry.get(body_key) if isinstance(entry, dict) else None
            if not isinstance(body, dict):
                continue
            for name in fields:
                value = body.get(name)
                if not isinstance(value, str) or not value:
                    continue
                path = Path(value)
                if not path.is_absolute():
                    if base_dir is None:
                        continue
                    path = base_dir / path
                found.add(Path(os.path.normpath(path)))
    return sorted(found)


def _digest(text: bytes, base_dir: Path | None) -> str:
    """sha256 over the kubeconfig text and the bytes of each credential file it names; a file that cannot be
    read counts as such, so its appearing later is a change too."""
    digest = hashlib.sha256(text)
    for path in _credential_files(text, base_dir):
        digest.update(b"\0" + os.fsencode(path) + b"\0")
        try:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()


class WorkerConnector:
    """Builds ``kube.Connection``s to workers. ``hub`` reads Secrets (may be None when every worker uses a
    file); ``namespace`` is where a Secret without a namespace lives (the controller's own namespace)."""

    def __init__(self, hub: kube.Connection | None, *, namespace: str = "mcad-system",
                 request_timeout: float = 10.0) -> None:
        self._hub = hub
        self._namespace = namespace
        self._timeout = request_timeout

    def connect(self, spec: WorkerSpec) -> kube.Connection:
        return self.connect_fingerprinted(spec)[0]

    def connect_fingerprinted(self, spec: WorkerSpec) -> tuple[kube.Connection, str]:
        """A connection, and the ``fingerprint`` of the credentials it was built from (a Secret is read once)."""
        if spec.secret is None:
            # Digest first: a rotation between the two then shows up as a change at the next check.
            fingerprint = ""  # unreadable now: any later digest differs, so the next check reloads
            with contextlib.suppress(WorkerConnectError):  # the load's own error says more than a failed read
                fingerprint = self.fingerprint(spec)
            conn = self._load(spec, spec.kubeconfig or "", spec.source)
            return conn, fingerprint
        text = self.read_secret(spec)
        fingerprint = _digest(text.encode("utf-8"), None)
        # The client library loads kubeconfigs from files only; the file lives just long enough to be read
        # (embedded certificates are copied into the client's own temp files while loading).
        fd, path = tempfile.mkstemp(prefix=f"mcad-worker-{spec.name}-", suffix=".kubeconfig")  # mode 0600
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            conn = self._load(spec, path, spec.source)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        # Messages should point at the Secret, not at a file that no longer exists.
        return kube.Connection(conn.api, spec.source, conn.server, conn.errors), fingerprint

    def fingerprint(self, spec: WorkerSpec) -> str:
        """A digest of the worker's credentials as they are now (the kubeconfig file's bytes, or the text in its
        Secret, with the bytes of every credential file it names by path), so a caller can tell that they were
        rotated: a projected token file or a renewed client certificate counts as much as a new kubeconfig."""
        if spec.secret is not None:
            return _digest(self.read_secret(spec).encode("utf-8"), None)
        path = Path(spec.kubeconfig or "")
        try:
            return _digest(path.read_bytes(), path.absolute().parent)
        except OSError as err:
            raise WorkerConnectError(spec.name, f"{spec.source}: cannot read it: {err.strerror}") from err

    def read_secret(self, spec: WorkerSpec) -> str:
        """The kubeconfig text in the worker's Secret."""
        ref = spec.secret
        if ref is None:
            raise WorkerConnectError(spec.name, "has no secret configured")
        if self._hub is None:
            raise WorkerConnectError(spec.name, f"{spec.source} cannot be read without a hub connection")
        namespace = ref.namespace or self._namespace
        path = f"/api/v1/namespaces/{namespace}/secrets/{ref.name}"
        try:
            secret = kube.request_json(self._hub, "GET", path, timeout=self._timeout)
        except ApiError as err:
            raise WorkerConnectError(spec.name, f"cannot read Secret {namespace}/{ref.name}: {err}",
                                     err.status) from err
        encoded = (secret.get("data") or {}).get(ref.key)
        if not encoded:
            raise WorkerConnectError(spec.name, f"Secret {namespace}/{ref.name} has no key {ref.key!r}")
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as err:
            raise WorkerConnectError(spec.name, f"Secret {namespace}/{ref.name} key {ref.key!r} is not "
                                     f"kubeconfig text: {err}") from err

    @staticmethod
    def _load(spec: WorkerSpec, path: str, source: str) -> kube.Connection:
        if not path:  # kube.connect would fall back to $KUBECONFIG: a worker must never silently become the hub
            raise WorkerConnectError(spec.name, "has no kubeconfig configured")
        try:
            return kube.connect(path, spec.context)
        except KubeConnectError as err:
            raise WorkerConnectError(spec.name, f"{source}: {err}") from err


# ---------------------------------------------------------------------------------------------- health


class HealthState(enum.StrEnum):
    UNKNOWN = "Unknown"  # not probed yet: its capacity is unknown, so it is not used for placement
    HEALTHY = "Healthy"
    UNREACHABLE = "Unreachable"
    UNAUTHORIZED = "Unauthorized"


_AUTH_FAILURES = (401, 403)


@dataclass(frozen=True)
class HealthStatus:
    """A snapshot; times are readings of the health's clock."""

    state: HealthState
    since: float  # when the current state began
    # When the worker last stopped being Healthy, None while it is Healthy; a worker not yet seen Healthy counts
    # from the health's creation (after a restart AppWrappers may already sit on a worker that stays away).
    down_since: float | None
    message: str
    consecutive_failures: int


class WorkerHealth:
    """One worker's health (see the module docstring for the transitions). Safe to update from several threads
    (a prober and the worker's informers); each ``record_*`` returns True when the state changed, so the caller
    emits an event or condition only then."""

    def __init__(self, name: str, *, failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self.name = name
        self._threshold = failure_threshold
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._status = HealthStatus(HealthState.UNKNOWN, now, now, "not probed yet", 0)

    @property
    def status(self) -> HealthStatus:
        with self._lock:
            return self._status

    @property
    def state(self) -> HealthState:
        return self.status.state

    def usable(self) -> bool:
        """Only a Healthy worker's capacity is known; anything else is kept out of placement."""
        return self.state is HealthState.HEALTHY

    def down_for(self) -> float:
        """Seconds since the worker stopped being Healthy; 0 while it is Healthy."""
        down_since = self.status.down_since
        return 0.0 if down_since is None else max(0.0, self._clock() - down_since)

    def timed_out(self, timeout_seconds: float) -> bool:
        """True once it has been Unreachable or Unauthorized for ``timeout_seconds`` (AppWrappers placed there
        may then be requeued elsewhere)."""
        status = self.status
        if status.state not in (HealthState.UNREACHABLE, HealthState.UNAUTHORIZED):
            return False
        return self.down_for() >= timeout_seconds

    def record_success(self) -> bool:
        with self._lock:
            if self._status.state is HealthState.HEALTHY:
                if self._status.consecutive_failures:
                    self._status = HealthStatus(HealthState.HEALTHY, self._status.since, None, "", 0)
                return False
            self._status = HealthStatus(HealthState.HEALTHY, self._clock(), None, "", 0)
            return True

    def record_probe_failure(self, err: ApiError) -> bool:
        """A failed probe: 401/403 means Unauthorized at once; anything else counts towards the threshold."""
        if err.status in _AUTH_FAILURES:
            return self._enter(HealthState.UNAUTHORIZED, _auth_message(err), failures=1)
        with self._lock:
            failures = self._status.consecutive_failures + 1
            state = self._status.state
            if state is HealthState.HEALTHY and failures < self._threshold:
                self._status = HealthStatus(state, self._status.since, None, self._status.message, failures)
                return False
        # Not yet Healthy (Unknown) there is no earlier success to give the benefit of the doubt to.
        return self._enter(HealthState.UNREACHABLE, _unreachable_message(err), failures=failures)

    def _enter(self, state: HealthState, message: str, *, failures: int) -> bool:
        with self._lock:
            old = self._status
            now = self._clock()
            down_since = old.down_since if old.down_since is not None else now
            if old.state is state:
                self._status = HealthStatus(state, old.since, down_since, message, failures)
                return False
            self._status = HealthStatus(state, now, down_since, message, failures)
            return True


def _auth_message(err: ApiError) -> str:
    return f"credentials rejected ({err.status} {err.reason}): {err.message}"


def _unreachable_message(err: ApiError) -> str:
    return f"no answer: {err.message}" if err.status == 0 else f"failing ({err.status} {err.reason}): {err.message}"


def probe(conn: kube.Connection, timeout_seconds: float = DEFAULT_PROBE_TIMEOUT_SECONDS) -> None:
    """List one Node, once (no client retries: "no answer in 2 s" must not take 8). It needs a server that answers
    and credentials that are still accepted and may read Nodes, as placement does. Raises ``ApiError``
    (status 0: no answer in time; 401/403: credentials rejected)."""
    kube.request_once(conn, "/api/v1/nodes", query=[("limit", "1")], timeout=timeout_seconds)


def check(health: WorkerHealth, conn: kube.Connection,
          timeout_seconds: float = DEFAULT_PROBE_TIMEOUT_SECONDS) -> bool:
    """Probe once and record the outcome in ``health``; True when the state changed."""
    try:
        probe(conn, timeout_seconds)
    except ApiError as err:
        return health.record_probe_failure(err)
    return health.record_success()
