"""Leader election on a ``coordination.k8s.io/v1`` Lease, so several controller replicas run and one dispatches.

Contract:
- ``LeaderElector(conn, namespace=, name=, identity=, lease_duration=, renew_deadline=, retry_period=)`` competes
  for the Lease ``namespace/name``; ``run(stop, on_started_leading, on_stopped_leading)`` blocks in the calling
  thread. It polls the Lease every ``retry_period`` until it acquires it, calls ``on_started_leading()``, then
  renews every ``retry_period``. It returns when ``stop`` is set or leadership is lost, calling
  ``on_stopped_leading()`` first if it was leading.
- A candidate takes the Lease when it does not exist, names no holder, or its record has not changed for the
  record's ``leaseDurationSeconds`` as measured on the candidate's own monotonic clock from when it first saw that
  record. ``renewTime`` written by another host is never compared with our clock, so clock skew between
  machines cannot make two leaders.
- Every write is a create (POST) or an update (PUT) carrying the resourceVersion that was read: when two
  candidates race, the API server accepts one and answers 409 Conflict to the other, which stays a standby.
- The leader has lost leadership when no renewal succeeded within ``renew_deadline`` of sending the last one
  that did, or when a read shows another holder. ``renew_deadline < lease_duration``, so a leader that cannot
  renew gives up before any standby may take over (a margin of ``lease_duration - renew_deadline``).
- On ``stop`` while leading, ``on_stopped_leading()`` runs first (the caller quiets its writers there) and then
  the Lease is released (no holder, a 1 s duration), so a standby takes over at its next poll instead of
  waiting out the lease. ``release_on_stop=False`` leaves the Lease to expire (what a crash looks like).
- ``try_acquire_or_renew()`` is one read-decide-write round and ``release()`` gives a held Lease up; ``run``
  is built from them (they are public for callers that schedule rounds themselves, and for tests).
- ``is_leader``, ``leader``, ``settled`` and ``transitions`` may be read from any thread.
- The decision itself (``observe``, ``decide``, ``next_poll_in``, ``next_record``, ``released_record``) is pure
  and unit-tested.

Durations are seconds (floats). The Lease stores ``leaseDurationSeconds`` as an integer: ``lease_duration`` is
rounded up when written (never shortened). Polls have no jitter: with a handful of replicas the API load of
synchronized polls is irrelevant, and a standby then takes over within ``lease_duration + retry_period`` of the
leader's last renewal (it wakes exactly when the lease it watches expires).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

import structlog

from mcad.clock import Clock, RealClock
from mcad.errors import ApiError
from mcad.k8s import kube

log = structlog.get_logger("mcad.k8s.leader")

LEASE_API = "/apis/coordination.k8s.io/v1"
DEFAULT_NAMESPACE = "mcad-system"
IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# How long a released Lease is said to last: the smallest value the API server accepts. Standbys take a lease with
# no holder at once anyway; this only bounds what an old candidate that ignores an empty holder would wait.
RELEASED_DURATION_SECONDS = 1
# Below this much time left before the renew deadline a request is not worth sending: leadership is lost.
MIN_REQUEST_SECONDS = 0.05


# ------------------------------------------------------------------------------------------------ pure decision


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease spec fields the election reads and writes (the times as the MicroTime text written)."""

    holder: str = ""
    duration_seconds: int = 0
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> LeaseRecord:
        spec = spec or {}

        def integer(field: str) -> int:
            value = spec.get(field)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        return cls(holder=str(spec.get("holderIdentity") or ""), duration_seconds=integer("leaseDurationSeconds"),
                   acquire_time=str(spec.get("acquireTime") or ""), renew_time=str(spec.get("renewTime") or ""),
                   transitions=integer("leaseTransitions"))

    def to_spec(self) -> dict[str, Any]:
        """The spec fields to write; other fields of a read spec are kept by the caller."""
        return {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_seconds,
                "acquireTime": self.acquire_time or None, "renewTime": self.renew_time or None,
                "leaseTransitions": self.transitions}


@dataclass(frozen=True)
class Observation:
    """A Lease record and when (our monotonic clock) we first saw it with exactly these values."""

    record: LeaseRecord
    at: float

    def expires_at(self, fallback_duration: float) -> float:
        """When the holder's claim lapses unless the record changes; ``fallback_duration`` if it states none."""
        duration = self.record.duration_seconds if self.record.duration_seconds > 0 else fallback_duration
        return self.at + duration


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """The observation after reading ``record`` at ``now``: the clock restarts only when the record changed."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


class Decision(Enum):
    CREATE = "create"  # no Lease exists: create it naming us
    TAKE = "take"  # no holder, or the holder's claim lapsed: update it to name us
    RENEW = "renew"  # we hold it: update renewTime
    WAIT = "wait"  # someone else holds a live claim


def decide(observed: Observation | None, *, identity: str, now: float, fallback_duration: float) -> Decision:
    """What a candidate does after a read (``observed`` None: the Lease does not exist)."""
    if observed is None:
        return Decision.CREATE
    holder = observed.record.holder
    if holder == identity:
        return Decision.RENEW
    if not holder or now >= observed.expires_at(fallback_duration):
        return Decision.TAKE
    return Decision.WAIT


def next_poll_in(observed: Observation | None, *, identity: str, now: float, retry_period: float,
                 fallback_duration: float) -> float:
    """How long a standby waits before reading the Lease again: a retry period, or less when the claim it
    watches lapses sooner (so it takes over right then, not up to a retry period later)."""
    if observed is None or not observed.record.holder or observed.record.holder == identity:
        return retry_period
    return max(0.0, min(retry_period, observed.expires_at(fallback_duration) - now))


def next_record(current: LeaseRecord | None, *, identity: str, duration_seconds: int, now: str) -> LeaseRecord:
    """The record that claims or renews the Lease for ``identity`` at wall time ``now`` (MicroTime text).

    Renewing keeps the acquire time and the transition count; taking over from anyone else (or from nobody)
    counts one transition; a Lease created now starts at zero.
    """
    if current is not None and current.holder == identity:
        return replace(current, duration_seconds=duration_seconds, renew_time=now)
    transitions = current.transitions + 1 if current is not None else 0
    return LeaseRecord(holder=identity, duration_seconds=duration_seconds, acquire_time=now, renew_time=now,
                       transitions=transitions)


def released_record(current: LeaseRecord, *, now: str) -> LeaseRecord:
    """The record that gives the Lease up: no holder, the shortest duration, the transition count kept."""
    return LeaseRecord(holder="", duration_seconds=RELEASED_DURATION_SECONDS, acquire_time=now, renew_time=now,
                       transitions=current.transitions)


def micro_time(moment: datetime) -> str:
    """A UTC datetime as the API's MicroTime text (RFC 3339, microseconds, Z)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def validate_timings(lease_duration: float, renew_deadline: float, retry_period: float) -> None:
    """Raise ``ValueError`` naming the rule when the three durations cannot give one leader at a time."""
    if min(lease_duration, renew_deadline, retry_period) <= 0:
        raise ValueError("leader election durations must be positive "
                         f"(lease duration {lease_duration}, renew deadline {renew_deadline}, "
                         f"retry period {retry_period})")
    if renew_deadline >= lease_duration:
        raise ValueError(f"the renew deadline ({renew_deadline} s) must be shorter than the lease duration "
                         f"({lease_duration} s): a leader that cannot renew must give up before a standby "
                         "may take over")
    if retry_period >= renew_deadline:
        raise ValueError(f"the retry period ({retry_period} s) must be shorter than the renew deadline "
                         f"({renew_deadline} s): the leader needs more than one try to renew in time")


# ------------------------------------------------------------------------------------------------ defaults


def default_identity() -> str:
    """``<pod name or hostname>_<random>``: unique even when a pod restarts under the same name."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def default_namespace(namespace_file: Path = IN_CLUSTER_NAMESPACE_FILE) -> str:
    """$POD_NAMESPACE, else the namespace of the in-cluster service account, else ``mcad-system``."""
    from_env = os.environ.get("POD_NAMESPACE", "").strip()
    if from_env:
        return from_env
    try:
        from_file = namespace_file.read_text().strip()
    except OSError:
        from_file = ""
    return from_file or DEFAULT_NAMESPACE


# ------------------------------------------------------------------------------------------------ the elector


class LeaderElector:
    def __init__(self, conn: kube.Connection, *, namespace: str, name: str, identity: str,
                 lease_duration: float = 15.0, renew_deadline: float = 10.0, retry_period: float = 2.0,
                 release_on_stop: bool = True, clock: Clock | None = None) -> None:
        validate_timings(lease_duration, renew_deadline, retry_period)
        if not identity:
            raise ValueError("a leader election identity must not be empty (it would read as 'no holder')")
        self._conn = conn
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_stop = release_on_stop
        self._clock = clock or RealClock()
        self._duration_seconds = max(1, math.ceil(lease_duration))
        self._path = f"{LEASE_API}/namespaces/{namespace}/leases/{name}"
        self._lock = threading.Lock()
        # Guarded by _lock (read by other threads through the properties).
        self._observed: Observation | None = None
        self._leading = False
        self._renewed_at = 0.0  # monotonic time our last successful claim or renewal was sent
        # The Lease as last read or written (metadata with its resourceVersion, and spec), for the next update.
        self._lease: dict[str, Any] | None = None
        self._last_error = ""
        self._waiting_for: str | None = None  # holder named in the last "waiting for leadership" line
        self.conflicts = 0  # 409 answers to our writes: another candidate wrote first

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    # -- read from any thread --------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """We hold the Lease and the renew deadline of our last successful renewal has not passed."""
        with self._lock:
            return self._leading and self._clock.monotonic() < self._renewed_at + self.renew_deadline

    @property
    def leader(self) -> str | None:
        """The holder named by the Lease as last read or written (None: no Lease, or no holder)."""
        with self._lock:
            return (self._observed.record.holder or None) if self._observed else None

    @property
    def settled(self) -> bool:
        """We know who leads: we do, or another holder whose record we saw change (or first saw) within its
        duration. False before the first read and while a lapsed or released Lease waits for a new holder."""
        if self.is_leader:
            return True
        with self._lock:
            observed = self._observed
            if observed is None or not observed.record.holder or observed.record.holder == self.identity:
                return False
            return self._clock.monotonic() < observed.expires_at(self.lease_duration)

    @property
    def transitions(self) -> int:
        """``leaseTransitions`` of the Lease as last read or written: how often its holder has changed."""
        with self._lock:
            return self._observed.record.transitions if self._observed else 0

    # -- the loop --------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event, on_started_leading: Callable[[], None],
            on_stopped_leading: Callable[[], None]) -> None:
        """Compete for the Lease, lead until ``stop`` or lost leadership; see the module contract."""
        while not stop.is_set():
            if self.try_acquire_or_renew():
                break
            stop.wait(self._standby_wait())
        else:
            return
        with self._lock:
            holder, transitions = self.identity, self._observed.record.transitions if self._observed else 0
        log.info("became leader", identity=holder, lease=self.lease, transitions=transitions)
        on_started_leading()
        lost_reason = self._renew_until(stop)
        with self._lock:
            self._leading = False
        if lost_reason:
            log.error("lost leadership", identity=self.identity, lease=self.lease, reason=lost_reason)
            on_stopped_leading()
            return
        on_stopped_leading()
        if self.release_on_stop:
            self.release()
        else:
            log.info("stopped leading; the lease is left to expire", identity=self.identity, lease=self.lease)

    def try_acquire_or_renew(self) -> bool:
        """One read-decide-write round; True when we hold the Lease afterwards."""
        try:
            current = self._get(self.renew_deadline)
        except ApiError as err:
            self._request_failed("read", err)
            return False
        now = self._clock.monotonic()
        with self._lock:
            observed = self._observed = (observe(self._observed, LeaseRecord.from_spec(current.get("spec")), now)
                                         if current else None)
            self._lease = current
        decision = decide(observed, identity=self.identity, now=now, fallback_duration=self.lease_duration)
        if decision is Decision.WAIT:
            assert observed is not None
            self._log_waiting(observed.record.holder)
            return False
        record = next_record(observed.record if observed else None, identity=self.identity,
                             duration_seconds=self._duration_seconds, now=micro_time(self._clock.now()))
        return self._write(record, create=decision is Decision.CREATE, timeout=self.renew_deadline) is None

    def release(self) -> bool:
        """Give the Lease up if we still hold it (best effort; True when the release was written)."""
        with self._lock:
            lease = self._lease
        for _ in range(2):  # a second try after a 409, from a fresh read, if we still hold it then
            if lease is None or LeaseRecord.from_spec(lease.get("spec")).holder != self.identity:
                return False
            record = released_record(LeaseRecord.from_spec(lease.get("spec")), now=micro_time(self._clock.now()))
            try:
                written = kube.request_json(self._conn, "PUT", self._path, body=_with_spec(lease, record),
                                            timeout=self.renew_deadline)
            except ApiError as err:
                if err.status != 409:
                    log.warning("could not release the lease", lease=self.lease, status=err.status,
                                reason=err.message)
                    return False
                try:
                    lease = self._get(self.renew_deadline)
                except ApiError:
                    return False
                continue
            with self._lock:
                self._lease = written
                self._observed = Observation(LeaseRecord.from_spec(written.get("spec")), self._clock.monotonic())
            log.info("released leadership", identity=self.identity, lease=self.lease)
            return True
        return False

    # -- internals -------------------------------------------------------------------------------------------

    def _renew_until(self, stop: threading.Event) -> str:
        """Renew every ``retry_period`` until ``stop`` ("" returned) or leadership is lost (the reason)."""
        next_try = self._renewed_at + self.retry_period
        while True:
            deadline = self._renewed_at + self.renew_deadline
            if stop.wait(max(0.0, min(next_try, deadline) - self._clock.monotonic())):
                return ""
            left = deadline - self._clock.monotonic()
            if left < MIN_REQUEST_SECONDS:
                return f"no renewal succeeded within the renew deadline ({self.renew_deadline} s)"
            attempt = self._clock.monotonic()
            taken_by = self._renew(timeout=left)
            if taken_by:
                return f"the lease is held by {taken_by}"
            # After a success the next renewal is due a retry period after it; after a failure, try again a
            # retry period after this try.
            next_try = max(self._renewed_at, attempt) + self.retry_period

    def _renew(self, timeout: float) -> str:
        """One renewal from the Lease as last known (no read first: one request per period). Returns the other
        holder when the Lease turns out to name one, else "" (renewed, or failed and worth retrying)."""
        with self._lock:
            lease = self._lease
            observed = self._observed
        current = observed.record if observed else None
        record = next_record(current, identity=self.identity, duration_seconds=self._duration_seconds,
                             now=micro_time(self._clock.now()))
        if lease is not None and current is not None and current.holder == self.identity:
            failure = self._write(record, create=False, timeout=timeout, log_conflict=False)
            if failure is None:
                return ""
            if failure.status not in (409, 0):
                return ""  # refused (say 403 or 500): the copy is still good, try again next period
        # A conflict, no answer (the update may have landed: our copy is stale), or no usable copy: read the
        # Lease to learn who holds it now.
        left = self._renewed_at + self.renew_deadline - self._clock.monotonic()
        if left < MIN_REQUEST_SECONDS:
            return ""  # out of time: the caller sees the deadline has passed
        try:
            fresh = self._get(left)
        except ApiError as err:
            self._request_failed("read", err)
            return ""
        fresh_record = LeaseRecord.from_spec(fresh.get("spec")) if fresh else None
        with self._lock:
            self._lease = fresh
            if fresh_record is not None:
                self._observed = observe(self._observed, fresh_record, self._clock.monotonic())
        if fresh_record is None:
            return "nobody (the lease was deleted)"
        if fresh_record.holder != self.identity:
            return fresh_record.holder or "nobody (the lease was released)"
        return ""  # still ours (someone touched other fields): the next try uses the fresh copy

    def _write(self, record: LeaseRecord, *, create: bool, timeout: float,
               log_conflict: bool = True) -> ApiError | None:
        """Create or update the Lease with ``record``; None on success, else the error (409: a lost race)."""
        with self._lock:
            lease = self._lease
        sent = self._clock.monotonic()
        try:
            if create:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace}, "spec": record.to_spec()}
                written = kube.request_json(self._conn, "POST", f"{LEASE_API}/namespaces/{self.namespace}/leases",
                                            body=body, timeout=timeout)
            else:
                assert lease is not None
                written = kube.request_json(self._conn, "PUT", self._path, body=_with_spec(lease, record),
                                            timeout=timeout)
        except ApiError as err:
            if err.status == 409:
                self.conflicts += 1
                if log_conflict:
                    log.debug("another candidate wrote the lease first", lease=self.lease, identity=self.identity)
            else:
                self._request_failed("create" if create else "update", err)
            return err
        with self._lock:
            self._lease = written
            self._observed = Observation(LeaseRecord.from_spec(written.get("spec")), self._clock.monotonic())
            self._leading = True
            self._renewed_at = sent
            self._last_error = ""
        return None

    def _get(self, timeout: float) -> dict[str, Any]:
        """The Lease, or {} when it does not exist."""
        try:
            return kube.request_json(self._conn, "GET", self._path, timeout=timeout)
        except ApiError as err:
            if err.status == 404:
                return {}
            raise

    def _standby_wait(self) -> float:
        with self._lock:
            observed = self._observed
        return next_poll_in(observed, identity=self.identity, now=self._clock.monotonic(),
                            retry_period=self.retry_period, fallback_duration=self.lease_duration)

    def _log_waiting(self, holder: str) -> None:
        if holder != self._waiting_for:
            self._waiting_for = holder
            log.info("waiting for leadership", identity=self.identity, lease=self.lease, holder=holder)

    def _request_failed(self, action: str, err: ApiError) -> None:
        # A standby polling an unreachable server would log every retry period; say it when the error changes.
        message = f"{err.status} {err.message}"
        with self._lock:
            repeated = message == self._last_error and not self._leading
            self._last_error = message
        if repeated:
            return
        hint = "check the controller's Role on coordination.k8s.io leases" if err.status == 403 else None
        log.warning("lease request failed", lease=self.lease, action=action, status=err.status,
                    reason=err.message, hint=hint)


def _with_spec(lease: dict[str, Any], record: LeaseRecord) -> dict[str, Any]:
    """``lease`` (as read: its resourceVersion makes the update conditional) with ``record`` in its spec."""
    return {**lease, "spec": {**(lease.get("spec") or {}), **record.to_spec()}}
