"""Kubernetes Events on AppWrappers: what happened to it, shown by ``kubectl describe appwrapper``.

Contract:

* ``EventRecorder.record(ref, type_, reason, message)`` never blocks on the API and never raises: it decides at
  once (under a lock held for microseconds, never during I/O) whether the event is written, and if so puts one
  write on a bounded in-memory queue; one background thread (``start()``/``stop()``) sends the queue in order.
  The dispatcher thread can call it on every transition.
* Events are core/v1 ``Event`` objects with ``involvedObject`` = the AppWrapper (apiVersion, kind, namespace,
  name, uid), ``count``/``firstTimestamp``/``lastTimestamp``, ``source.component``, ``reportingComponent`` and
  ``reportingInstance``; named ``<object name>.<hex>``, unique per recorder. core/v1 rather than
  events.k8s.io/v1: it is what upstream MCAD wrote (so ``kubectl get events --field-selector
  involvedObject.name=...`` keeps working), ``kubectl describe`` lists it the same way, and its
  count/lastTimestamp are exactly the aggregation below (events.k8s.io/v1 would need eventTime, action and
  series semantics for the same result).
* Aggregation: the same (object uid, type, reason, message) again within ``aggregation_window`` seconds of its
  last occurrence increments the existing Event's ``count`` and ``lastTimestamp`` (a JSON merge PATCH) instead
  of creating another Event; if that write has not been sent yet, it is folded into it at no extra API cost.
  A PATCH that finds the Event gone (the API server expires Events, one hour by default) creates it again.
* Rate limits (``mcad.k8s.eventlimits``: ``EventLimits`` and its buckets), so thousands of AppWrappers cannot
  flood the API server: each object has a token bucket (``per_object_burst`` events, then one per
  ``per_object_interval`` seconds), the whole recorder has one (``global_burst``, then ``global_rate`` per second),
  and the queue holds at most ``queue_size`` writes. An
  event over any limit is dropped and counted by reason; nothing is queued without bound. Folding into an
  unsent write costs no token (it costs no request either).
* Sending: transient failures (``ApiError.transient``) are retried ``send_retries`` times with exponential
  backoff, then the event is dropped; any other failure drops it at once. A failure is logged once per
  (namespace, HTTP status) per ``error_log_interval`` seconds, so a namespace being deleted (403/404 on every
  event) does not flood the log. Every failed request is counted by HTTP status (0: no response).
* ``counters()`` is a consistent snapshot, safe from any thread (for metrics). ``EventPlanner`` is the deciding
  part without threads or I/O (unit-tested with a stepped clock); ``EventRecorder`` adds the lock, the queue's
  thread and the requests.

RBAC: ``create`` and ``patch`` on ``events`` in the core group (""), in every namespace holding AppWrappers.
"""

from __future__ import annotations

import enum
import socket
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import structlog

from mcad.api.appwrapper import API_VERSION, KIND
from mcad.clock import Clock, RealClock
from mcad.errors import ApiError
from mcad.k8s import kube
from mcad.k8s.eventlimits import EventLimits, LogLimiter, TokenBucket
from mcad.k8s.recentevents import RecentEvents

log = structlog.get_logger("mcad.k8s.events")

EventType = Literal["Normal", "Warning"]
NORMAL: EventType = "Normal"
WARNING: EventType = "Warning"

# Reasons the dispatcher records, with the type each is recorded as (REASON_TYPES). Messages must be stable
# while the situation is: an event differing only in its message is a new Event, not a count increment.
QUEUED = "Queued"  # Normal; why it waits (what blocks it), never its queue position, which changes every cycle
DISPATCHED = "Dispatched"  # Normal; its wrapped objects are being created
PREEMPTED = "Preempted"  # Warning; names the AppWrapper it was preempted for
REQUEUED = "Requeued"  # Warning; why (too few pods running after the requeuing time, ...)
COMPLETED = "Completed"  # Normal
FAILED = "Failed"  # Warning; the failure's message, the one a person acts on
# Hub mode: the worker it runs in stopped answering or rejects the credentials (names the worker and why), and
# its return. Recorded with the ClusterAvailable condition, once per change.
CLUSTER_UNAVAILABLE = "ClusterUnavailable"  # Warning
CLUSTER_AVAILABLE = "ClusterAvailable"  # Normal
# --placement=binding (mcad.loop.pinning): a pod pinned to a node that then refused it (gone, not Ready, cordoned, the
# scheduler's Unschedulable) is placed again, recorded on its AppWrapper; a pod carrying mcad's gate that mcad will
# not place (no dispatched AppWrapper made it) is told so, recorded on the pod.
PLACEMENT_REPLANNED = "PlacementReplanned"  # Warning
PLACEMENT_REFUSED = "PlacementRefused"  # Warning
# A final state (Completed, Failed) mcad did not decide, while the AppWrapper's pods still run: its capacity and
# quota stay charged (mcad.loop.dispatcher). Names the state.
STATUS_NOT_DECIDED = "StatusNotDecided"  # Warning
# Fault tolerance (mcad.loop.health): a failure seen and its grace period started (names the pod, exit code and
# node, or the missing object), a reset (what failed, which reset of how many, the pause), cordoned or NotReady
# nodes under its running pods, its objects (or itself) deleted on time.
UNHEALTHY = "Unhealthy"  # Warning
RESET = "Reset"  # Warning
AT_RISK = "NodesAtRisk"  # Warning
CLEANED_UP = "CleanedUp"  # Normal
REASON_TYPES: Mapping[str, EventType] = {
    QUEUED: NORMAL, DISPATCHED: NORMAL, PREEMPTED: WARNING, REQUEUED: WARNING, COMPLETED: NORMAL, FAILED: WARNING,
    CLUSTER_UNAVAILABLE: WARNING, CLUSTER_AVAILABLE: NORMAL, PLACEMENT_REPLANNED: WARNING, PLACEMENT_REFUSED: WARNING,
    STATUS_NOT_DECIDED: WARNING, UNHEALTHY: WARNING, RESET: WARNING, AT_RISK: WARNING, CLEANED_UP: NORMAL,
}

# Why a record() call did not end up in an Event (the ``reason`` label of the dropped counter).
DROP_PER_OBJECT = "per_object_limit"
DROP_GLOBAL = "global_limit"
DROP_QUEUE_FULL = "queue_full"
DROP_SEND_FAILED = "send_failed"  # the API refused it, or kept failing transiently past the retries
DROP_STOPPED = "stopped"  # recorded after stop(), or still queued when stop() gave up waiting
DROP_INVALID = "invalid"  # a bad argument (unknown type, empty reason or name): a caller's bug, logged

# events.k8s.io/v1 limits the note (message) to 1 KiB; core/v1 does not, but nobody reads more in a describe.
MAX_MESSAGE_BYTES = 1024
_TRUNCATED = "…"
MAX_NAME_LENGTH = 253  # an Event name is a DNS subdomain
EVENTS_PATH = "/api/v1/namespaces/{namespace}/events"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (its ``involvedObject``). ``uid`` keeps a re-created namesake apart."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def appwrapper(cls, namespace: str, name: str, uid: str) -> ObjectRef:
        return cls(API_VERSION, KIND, namespace, name, uid)


AggregationKey = tuple[str, str, str, str]  # (object key, type, reason, message)


@dataclass(slots=True, eq=False)
class _Series:
    """One Event on the server (or about to be): what the next occurrence of its key updates."""

    name: str
    count: int
    first_timestamp: str
    last_seen: float  # monotonic time of the last occurrence written or folded
    pending: EventWrite | None = None  # its write still in the queue, which a repeat folds into


@dataclass(slots=True, eq=False)
class EventWrite:
    """One API request to make: create the Event, or patch its count and lastTimestamp.

    While queued, the planner may fold repeats into it (count, last_timestamp, calls); once taken by the sender
    it is the sender's alone.
    """

    create: bool
    ref: ObjectRef
    type_: EventType
    reason: str
    message: str
    name: str
    count: int
    first_timestamp: str
    last_timestamp: str
    key: AggregationKey
    series: _Series
    calls: int = 1  # record() calls this write carries (1 + those folded into it)

    @property
    def namespace(self) -> str:
        # An Event lives in its object's namespace; one about a cluster-scoped object in "default", as client-go.
        return self.ref.namespace or "default"


def event_body(write: EventWrite, *, component: str, instance: str) -> dict[str, Any]:
    """The core/v1 Event that ``write`` creates."""
    ref = write.ref
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": write.name, "namespace": write.namespace},
        "involvedObject": {"apiVersion": ref.api_version, "kind": ref.kind, "namespace": ref.namespace,
                           "name": ref.name, "uid": ref.uid},
        "type": write.type_,
        "reason": write.reason,
        "message": write.message,
        "count": write.count,
        "firstTimestamp": write.first_timestamp,
        "lastTimestamp": write.last_timestamp,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
    }


def patch_body(write: EventWrite) -> dict[str, Any]:
    """The JSON merge patch that makes an existing Event count one more occurrence (or several, folded)."""
    return {"count": write.count, "lastTimestamp": write.last_timestamp}


def truncate_message(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """``message`` cut to ``limit`` UTF-8 bytes (ending in an ellipsis when cut), never mid-character."""
    data = message.encode()
    if len(data) <= limit:
        return message
    room = limit - len(_TRUNCATED.encode())
    return data[:room].decode(errors="ignore") + _TRUNCATED


def event_name(object_name: str, stamp: int) -> str:
    """``<object name>.<stamp in hex>``, the object name shortened so the whole is a valid DNS subdomain."""
    suffix = f".{stamp:x}"
    base = object_name[: MAX_NAME_LENGTH - len(suffix)].rstrip("-.")
    return f"{base}{suffix}"


def timestamp(wall: datetime) -> str:
    """RFC 3339 in UTC to the second, the precision of core/v1 Event timestamps."""
    return wall.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class EventCounters:
    """A snapshot of what the recorder did since it was made (each field becomes a Prometheus metric).

    recorded: record() calls. aggregated: calls that incremented an existing Event's count instead of making a
    new one. sent: successful API writes (creates and patches). dropped: calls that never became (part of) an
    Event, by reason (DROP_*). send_errors: failed requests by HTTP status, 0 when no response came (each retry
    counts). queued: writes waiting now.
    """

    recorded: int = 0
    aggregated: int = 0
    sent: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    send_errors: Mapping[int, int] = field(default_factory=dict)
    queued: int = 0


class Outcome(enum.StrEnum):
    """What ``EventPlanner.plan`` did with one call, when it did not drop it."""

    QUEUED = "queued"  # a new write (create or patch) was queued
    FOLDED = "folded"  # added to a write already queued for the same Event


class EventPlanner:
    """The deciding part of the recorder: limits, aggregation and the queue, with no threads and no I/O.

    Not thread-safe: ``EventRecorder`` calls it under its lock. Times are passed in: ``monotonic`` seconds for
    limits and windows, ``wall`` for the timestamps written.
    """

    def __init__(self, limits: EventLimits | None = None, *, now: float = 0.0) -> None:
        self.limits = limits or EventLimits()
        self._global = TokenBucket(self.limits.global_rate, self.limits.global_burst, now)
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._series: OrderedDict[AggregationKey, _Series] = OrderedDict()
        self._queue: deque[EventWrite] = deque()
        self._log_limiter = LogLimiter(self.limits.error_log_interval)
        self._last_stamp = 0
        self._recorded = 0
        self._aggregated = 0
        self._sent = 0
        self._dropped: dict[str, int] = {}
        self._send_errors: dict[int, int] = {}

    # -- deciding (the caller's thread) --

    def plan(self, ref: ObjectRef, type_: str, reason: str, message: str, *, monotonic: float,
             wall: datetime) -> Outcome | str:
        """Decide about one event: an ``Outcome``, or the DROP_* reason it was dropped for."""
        self._recorded += 1
        if type_ not in (NORMAL, WARNING) or not reason or not ref.name:
            return self.drop(DROP_INVALID)
        type_checked: EventType = NORMAL if type_ == NORMAL else WARNING
        message = truncate_message(str(message))
        object_key = ref.uid or f"{ref.namespace}/{ref.kind}/{ref.name}"
        key: AggregationKey = (object_key, type_checked, reason, message)
        stamp = timestamp(wall)

        series = self._series.get(key)
        if series is not None and monotonic - series.last_seen > self.limits.aggregation_window:
            del self._series[key]
            series = None
        if series is not None and series.pending is not None:
            # Its write has not gone out yet: one more occurrence costs no request, so no token either.
            series.count += 1
            series.last_seen = monotonic
            write = series.pending
            write.count = series.count
            write.last_timestamp = stamp
            write.calls += 1
            self._series.move_to_end(key)
            self._aggregated += 1
            return Outcome.FOLDED

        if len(self._queue) >= self.limits.queue_size:
            return self.drop(DROP_QUEUE_FULL)
        bucket = self._object_bucket(object_key, monotonic)
        if not bucket.available(monotonic):
            return self.drop(DROP_PER_OBJECT)
        if not self._global.available(monotonic):
            return self.drop(DROP_GLOBAL)
        bucket.take(monotonic)
        self._global.take(monotonic)

        if series is None:
            series = _Series(self.new_name(ref.name, wall), 0, stamp, monotonic)
            self._series[key] = series
            if len(self._series) > self.limits.max_tracked:
                self._series.popitem(last=False)
            create = True
        else:
            self._series.move_to_end(key)
            self._aggregated += 1
            create = False
        series.count += 1
        series.last_seen = monotonic
        write = EventWrite(create, ref, type_checked, reason, message, series.name, series.count,
                           series.first_timestamp, stamp, key, series)
        series.pending = write
        self._queue.append(write)
        return Outcome.QUEUED

    def refuse(self, reason: str) -> str:
        """Count a call dropped without looking at it (the recorder is stopping)."""
        self._recorded += 1
        return self.drop(reason)

    def drop(self, reason: str, calls: int = 1) -> str:
        self._dropped[reason] = self._dropped.get(reason, 0) + calls
        return reason

    def new_name(self, object_name: str, wall: datetime) -> str:
        """A fresh Event name: the stamp is wall-clock nanoseconds, bumped to stay strictly increasing."""
        self._last_stamp = max(self._last_stamp + 1, int(wall.timestamp() * 1e9))
        return event_name(object_name, self._last_stamp)

    def _object_bucket(self, object_key: str, now: float) -> TokenBucket:
        bucket = self._buckets.get(object_key)
        if bucket is None:
            bucket = TokenBucket(1.0 / self.limits.per_object_interval, self.limits.per_object_burst, now)
            self._buckets[object_key] = bucket
            if len(self._buckets) > self.limits.max_tracked:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(object_key)
        return bucket

    # -- sending (the sender's thread, under the recorder's lock) --

    def take(self) -> EventWrite | None:
        """The next write to send, oldest first; repeats recorded from now on start a new write."""
        if not self._queue:
            return None
        write = self._queue.popleft()
        if write.series.pending is write:
            write.series.pending = None
        return write

    def __len__(self) -> int:
        return len(self._queue)

    def finished(self, write: EventWrite, ok: bool) -> None:
        """Account for a write the sender is done with (sent, or given up)."""
        if ok:
            self._sent += 1
            write.series.name = write.name  # a create renamed after a name clash
            return
        self.drop(DROP_SEND_FAILED, write.calls)
        if write.create and write.series.pending is None and self._series.get(write.key) is write.series:
            # Nothing on the server to patch: the next occurrence should create, not patch and then create.
            del self._series[write.key]

    def send_error(self, status: int) -> None:
        self._send_errors[status] = self._send_errors.get(status, 0) + 1

    def should_log(self, namespace: str, status: int, now: float) -> bool:
        return self._log_limiter.allow((namespace, status), now)

    def drop_queued(self, reason: str) -> int:
        """Drop every queued write (on stop); returns how many writes there were."""
        writes = len(self._queue)
        while (write := self.take()) is not None:
            self.drop(reason, write.calls)
        return writes

    def counters(self) -> EventCounters:
        return EventCounters(self._recorded, self._aggregated, self._sent, dict(self._dropped),
                             dict(self._send_errors), len(self._queue))


class Retry(enum.Enum):
    """What the sender does after a failed request."""

    BACKOFF = "backoff"  # transient: wait, then the same request again
    AS_CREATE = "as_create"  # a patch found no Event (expired): create it, with the full count
    RENAME = "rename"  # a create found the name taken: create under a fresh name
    GIVE_UP = "give_up"


def after_failure(status: int, *, create: bool, transient: bool, attempt: int, retries: int) -> Retry:
    """The sender's policy. ``attempt`` counts the retries already made of this write (renames included)."""
    if not create and status == 404:
        return Retry.AS_CREATE
    if attempt >= retries:
        return Retry.GIVE_UP
    if create and status == 409:
        return Retry.RENAME
    if transient:
        return Retry.BACKOFF
    return Retry.GIVE_UP


def retry_delay(attempt: int, base: float) -> float:
    return base * 2.0 ** attempt


class EventSink(Protocol):
    """What the dispatcher needs: ``EventRecorder``, or ``DiscardEvents`` where events are not wanted."""

    def record(self, ref: ObjectRef, type_: EventType, reason: str, message: str) -> None: ...


class DiscardEvents:
    def record(self, ref: ObjectRef, type_: EventType, reason: str, message: str) -> None:
        return None


class EventRecorder:
    """Records Events from any thread and sends them from one background thread; see the module contract.

    ``instance`` (``reportingInstance``) defaults to the host name, which in a pod is the pod's name.
    """

    def __init__(self, conn: kube.Connection, *, component: str = "mcad-controller", instance: str | None = None,
                 clock: Clock | None = None, limits: EventLimits | None = None,
                 recent: RecentEvents | None = None) -> None:
        """``recent`` also keeps every event asked for, for the dashboard (``mcad.k8s.recentevents``)."""
        self._conn = conn
        self.recent = recent
        self.component = component
        self.instance = (instance or socket.gethostname())[:128]  # reportingInstance's length limit
        self._clock = clock or RealClock()
        self._planner = EventPlanner(limits, now=self._clock.monotonic())
        self.limits = self._planner.limits
        self._cond = threading.Condition()
        self._stopping = False
        self._abort = threading.Event()  # stop() gave up waiting: no more retries, drop what is queued
        self._sending = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="mcad-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Refuse new events and send what is queued for up to ``timeout`` seconds; what is left then is
        dropped (``stopped``). True when the queue was sent out in time."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            with self._cond:
                self._planner.drop_queued(DROP_STOPPED)
            return True
        thread.join(timeout)
        if not thread.is_alive():
            return True
        self._abort.set()
        with self._cond:
            left = self._planner.drop_queued(DROP_STOPPED)
        log.warning("events still queued at shutdown were dropped", count=left)
        # The request in flight ends within its own timeout; the thread is a daemon, so exit does not wait.
        thread.join(self.limits.request_timeout)
        return False

    def record(self, ref: ObjectRef, type_: EventType, reason: str, message: str) -> None:
        """Queue an event about ``ref`` (or count why not); returns at once and never raises."""
        try:
            monotonic = self._clock.monotonic()
            wall = self._clock.now()
            with self._cond:
                if self._stopping:
                    self._planner.refuse(DROP_STOPPED)
                    return
                outcome = self._planner.plan(ref, type_, reason, message, monotonic=monotonic, wall=wall)
                if outcome is Outcome.QUEUED:
                    self._cond.notify()
            if self.recent is not None and outcome != DROP_INVALID:
                self.recent.add(ref.namespace, ref.name, ref.uid, type_, reason, truncate_message(message), wall)
            if outcome == DROP_INVALID:
                log.error("invalid event not recorded", reason=reason, type=type_,
                          object=f"{ref.namespace}/{ref.name}")
        except Exception:  # a bug must not take the dispatcher thread down with it
            log.exception("event not recorded", reason=reason)

    def counters(self) -> EventCounters:
        with self._cond:
            return self._planner.counters()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is queued or being sent (tests, shutdown); False at the timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._planner and not self._sending, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._planner) or self._stopping)
                write = self._planner.take()
                if write is None:
                    return  # stopping, and everything was sent
                self._sending = True
            ok = False
            try:
                ok = self._deliver(write)
            except Exception:
                log.exception("event not sent", appwrapper=f"{write.ref.namespace}/{write.ref.name}",
                              reason=write.reason)
            finally:
                with self._cond:
                    self._planner.finished(write, ok)
                    self._sending = False
                    self._cond.notify_all()

    def _deliver(self, write: EventWrite) -> bool:
        attempt = 0
        while True:
            try:
                self._send(write)
                return True
            except ApiError as err:
                step = after_failure(err.status, create=write.create, transient=err.transient, attempt=attempt,
                                     retries=0 if self._abort.is_set() else self.limits.send_retries)
                with self._cond:
                    if step is not Retry.AS_CREATE:  # an expired Event is routine, not an error
                        self._planner.send_error(err.status)
                    if step is Retry.RENAME:
                        write.name = self._planner.new_name(write.ref.name, self._clock.now())
                    should_log = step is Retry.GIVE_UP and self._planner.should_log(
                        write.namespace, err.status, self._clock.monotonic())
                if step is Retry.AS_CREATE:
                    write.create = True
                    continue
                if step is Retry.GIVE_UP:
                    if should_log:
                        log.warning("event not written", namespace=write.namespace, status=err.status,
                                    reason=write.reason, error=err.message,
                                    note="logged once per namespace and status per while")
                    return False
                if step is Retry.BACKOFF and self._abort.wait(retry_delay(attempt, self.limits.retry_base_delay)):
                    return False
                attempt += 1

    def _send(self, write: EventWrite) -> None:
        path = EVENTS_PATH.format(namespace=write.namespace)
        if write.create:
            kube.request_json(self._conn, "POST", path,
                              body=event_body(write, component=self.component, instance=self.instance),
                              timeout=self.limits.request_timeout)
        else:
            kube.request_json(self._conn, "PATCH", f"{path}/{write.name}", body=patch_body(write),
                              content_type="application/merge-patch+json", timeout=self.limits.request_timeout)
