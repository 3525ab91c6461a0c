"""What the controller knows, as documents for people: the queue, the ledger, and why one AppWrapper is where it is.

Contract:
- ``Reports`` turns what the loop answers (``mcad.loop.view.LoopView``: never an owner) into JSON-ready dicts:
  ``queue()`` (``/debug/queue``), ``ledger()`` (``/debug/ledger``) and ``explain(namespace, name)``
  (``/debug/explain``; None when the AppWrapper is unknown). The methods read dispatcher state, so they run on the
  dispatcher thread (``mcad.serve.snapshots`` builds them there) or on a dispatcher nobody else runs (``offline``).
  Inside ``shared_assessments()`` the queue is assessed once for every document built.
- The queue document lists ``queued`` (in dispatch order), ``resetting`` (in their retry pause after a reset:
  neither queued nor dispatched, holding their room; with their resets, retryLimit and when the pause ends) and
  ``dispatched`` (with ``health``: Healthy, or Unhealthy / AtRisk while that condition is True, and its reason);
  each entry names its namespace, and ``QUEUE_LISTS`` names the lists a reader's rights filter.
- An explain document also holds its fault tolerance (``mcad.serve.healthreport``): ``health`` (with what the
  controller does next and when), ``faultTolerance`` (the effective policy; ``defaults`` "built-in" offline, where
  the controller's flags are unknown), ``resets`` and, in a retry pause, ``pause`` (until when, and where its room
  is held: the nodes of its hold plan, else in aggregate). One in its retry pause is explained as such.
- The ledger document names the configured topology levels (``topologyLevels``, largest first: the controller's
  --topology-level) and, per node, its ``topology``: the value of each of those labels it carries (none other), so a
  reader can add up the room of each domain (``mcadctl ledger --topology``, the dashboard's heat map).
- The queue document carries ``fairShare`` (each tenant's fair-share usage, or that fair sharing is off) and, for a
  reader of some namespaces, ``aheadOfYou`` (``mcad.serve.queuereport.QueueReport.standing``).
- The queue's "why" is computed now, by the dispatch cycle's own pass run dry (``LoopView.assess_queue``), not read
  back from the Backoff condition (which is rewritten only when what blocks an AppWrapper changes).
- ``mcadctl --offline`` builds the same ``Reports`` over a dispatcher nobody runs (``mcad.cli.offline``): the same
  answers when the controller cannot be reached.
- Quantities are Kubernetes quantity strings; times are RFC 3339 UTC.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from mcad.api.appwrapper import ACTIVE_STATES, FINAL_STATES, AppWrapperView, State
from mcad.api.faulttolerance import FaultPolicy, format_duration
from mcad.api.resources import ResourceVector, format_amount
from mcad.api.statusview import StatusView
from mcad.hub.connections import Hub
from mcad.hub.placement import WorkerPlacement, nodes_in
from mcad.loop.view import LoopView
from mcad.model import lifecycle, status
from mcad.model.assess import QueueAssessment
from mcad.model.estimate import ESTIMATED, Estimate
from mcad.serve import healthreport
from mcad.serve.queuereport import QueueReport, quantities

Document = dict[str, Any]


def rfc3339(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Reports:
    def __init__(self, view: LoopView, info: Callable[[], Mapping[str, Any]], hub: Hub | None = None) -> None:
        self.view = view
        self.hub = hub
        self.info = info
        self._assessments: QueueAssessment | None = None
        self._sharing = False

    @contextlib.contextmanager
    def shared_assessments(self) -> Iterator[None]:
        """Inside: the queue is assessed once and every document built meanwhile uses that assessment (one
        snapshot of the queue, explains of many AppWrappers, at the cost of one assessment)."""
        self._assessments = None
        self._sharing = True
        try:
            yield
        finally:
            self._sharing = False
            self._assessments = None

    def _assess_queue(self) -> QueueAssessment:
        if not self._sharing:
            return self.view.assess_queue()
        if self._assessments is None:
            self._assessments = self.view.assess_queue()
        return self._assessments

    def _header(self) -> Document:
        v = self.view
        return {"controller": {**self.info(), **v.header()}, "generatedAt": rfc3339(v.clock.now())}

    # ------------------------------------------------------------------------------------------ queue

    def queue(self) -> Document:
        return self.queue_deferred().document()

    def queue_deferred(self) -> QueueReport:
        """What /debug/queue needs from dispatcher state, read now (on its thread) in O(groups + dispatched): the
        report resolves and formats the queued ones anywhere (``mcad.serve.queuereport``)."""
        v = self.view
        now = v.clock.now()
        assessed = self._assess_queue()
        reservations = [dict(a.reservation) for a in assessed.judged() if a.reservation is not None]
        dispatched = []
        resetting = []
        # Queued ones are the most (100,000 in the bench's scale run): left out by key before anything is read of them.
        for key in set(v.appwrappers.keys()).difference(assessed.keys()):
            aw = v.appwrappers.get(key)
            if aw is None or aw.deleting:
                continue
            current = v.status(aw)
            if current.resetting_since and not v.dispatching(key):
                # In its retry pause: in no queue and not dispatched, yet holding its room.
                resetting.append((aw.order(), self._resetting_row(aw, current, now)))
                continue
            state = "Dispatching" if v.dispatching(key) else current.state
            if state != "Dispatching" and (state not in ACTIVE_STATES or not current.canrun):
                continue
            phases = v.phases(key)
            dispatched.append((aw.order(), {
                "namespace": aw.namespace, "name": aw.name, "priority": aw.priority, "state": state,
                "demand": quantities(aw.demand), "dispatchedAt": rfc3339(lifecycle.dispatched_at(current)),
                "pods": {"pending": phases.count("Pending"), "running": phases.count("Running"),
                         "succeeded": phases.count("Succeeded"), "failed": phases.count("Failed")},
                **_health_mark(current),
            }))
        return QueueReport(self._header(), now, assessed, v.appwrappers.get, v.intents(),
                           reservations, [row for _, row in sorted(resetting, key=lambda r: r[0])],
                           [row for _, row in sorted(dispatched, key=lambda r: r[0])], v.fair_usage())

    def _resetting_row(self, aw: AppWrapperView, current: StatusView, now: datetime) -> Document:
        policy = self.view.health_policy(aw)
        raw = current.raw()
        pause = healthreport.pause_document(raw, policy, now, (), {}) or {}
        return {"namespace": aw.namespace, "name": aw.name, "priority": aw.priority, "state": "Resetting",
                "demand": quantities(aw.demand), "reason": pause.get("reason", ""),
                "resettingCount": current.resetting_count, "retryLimit": policy.retry_limit,
                "pauseEndsAt": pause.get("until"), "message": raw.get("message", "")}

    # ------------------------------------------------------------------------------------------ ledger

    def ledger(self) -> Document:
        v = self.view
        capacity, used, reserved, free = v.totals()
        # Requests leave out the pod slot each bound pod takes of its node's allocatable "pods": counted apart, on
        # the nodes that have pod slots (every real node; a test's node may declare none).
        slotted = {node.name for node in v.nodes() if node.allocatable.get("pods")}
        pods_on = {name: n for name, n in v.pods_by_node().items() if name in slotted}
        schedulable = {node.name for node in v.nodes() if node.schedulable}
        slots = ResourceVector({"pods": sum(n for name, n in pods_on.items() if name in schedulable)})
        used, free = used + slots, free - slots
        names = sorted(set(capacity) | set(used) | set(reserved))
        resources = [{"name": name, "capacity": format_amount(name, capacity.get(name)),
                      "used": format_amount(name, used.get(name)),
                      "reserved": format_amount(name, reserved.get(name)),
                      "free": format_amount(name, free.get(name))} for name in names]
        room = v.room_by_node()
        planned = v.planned_by_node()
        pinned = v.pinned_by_node()
        levels = v.topology_levels()
        nodes = []
        for node in sorted(v.nodes(), key=lambda n: n.name):
            node_room = room.get(node.name, ResourceVector()) - ResourceVector({"pods": pods_on.get(node.name, 0)})
            node_planned = planned.get(node.name, ResourceVector())
            nodes.append({"name": node.name, "cluster": node.cluster, "schedulable": node.schedulable,
                          "ready": node.ready,
                          "allocatable": quantities(node.allocatable),
                          "used": quantities((node.allocatable - node_room).clamp()),
                          "planned": quantities(node_planned),
                          # --placement=binding: pods pinned there, not bound yet (their room is in "planned").
                          "pinned": pinned.get(node.name, 0),
                          "free": quantities(node_room - node_planned),
                          # What the node-health rules say of it (mcad.model.nodehealth): empty when healthy.
                          "health": [{"resource": m.resource, "label": m.label, "value": m.value,
                                      "effect": m.effect.value} for m in node.health],
                          # Its domain of each configured level (``mcad.model.topology``): only those labels, so
                          # a node adds at most one label value (63 characters) per level, whatever it carries.
                          "topology": {level: node.labels[level] for level in levels if level in node.labels}})
        reservations = []
        for key, outstanding in v.reservations().items():
            namespace, _, name = key.partition("/")
            reservations.append({"namespace": namespace, "name": name, "reserved": quantities(outstanding)})
        return {**self._header(), "resources": resources, "nodes": nodes, "reservations": reservations,
                "topologyLevels": list(levels)}

    # ------------------------------------------------------------------------------------------ clusters

    def clusters(self) -> Document:
        """Hub mode: every worker with its health, capacity and free room (as placement sees them: room held for
        dispatched pods not bound yet is not free), and the AppWrappers placed there. Single mode: no workers."""
        v = self.view
        hub, placement = self.hub, v.targets()
        if hub is None or not isinstance(placement, WorkerPlacement):
            return {**self._header(), "mode": "single", "clusters": []}
        room = v.room_by_node()
        planned = v.planned_by_node()
        placed: dict[str, list[str]] = {}
        for key, cluster in sorted(v.placed().items()):
            placed.setdefault(cluster, []).append(key)
        workers = []
        for worker in hub.workers:
            health = worker.health.status
            capacity = free = ResourceVector()
            nodes = nodes_in(worker.name, v.nodes())
            for node in nodes:
                if node.schedulable:
                    capacity = capacity + node.allocatable
                    free = free + room.get(node.name, ResourceVector()) - planned.get(node.name, ResourceVector())
            # A worker's health keeps monotonic time from the same source as the dispatcher's clock
            # (time.monotonic in the controller, one stepped clock in tests): read both from that clock.
            since = v.clock.now() - timedelta(seconds=max(0.0, v.clock.monotonic() - health.since))
            usable = worker.name in placement.usable  # what placement uses, not the prober's latest word
            workers.append({"name": worker.name, "labels": dict(worker.spec.labels), "state": health.state.value,
                            "message": "" if usable else hub.describe(worker.name),
                            "since": rfc3339(since), "synced": worker.synced, "usable": usable,
                            "nodes": len(nodes), "capacity": quantities(capacity), "free": quantities(free.clamp()),
                            "appwrappers": placed.get(worker.name, [])})
        return {**self._header(), "mode": "hub", "policy": placement.policy.value,
                "unreachableTimeoutSeconds": hub.config.unreachable_timeout_seconds, "clusters": workers}

    # ------------------------------------------------------------------------------------------ quota

    def quota(self) -> Document:
        v = self.view
        if not v.quota_enabled:
            return {**self._header(), "enabled": False, "trees": []}

        def describe(key: str) -> dict[str, Any]:
            demand = v.quota_demand(key)
            namespace, _, name = key.partition("/")
            return {"namespace": namespace, "name": name, "demand": quantities(demand) if demand is not None else {}}

        return {**self._header(), "enabled": True, "trees": v.quota_report(describe)}

    # ------------------------------------------------------------------------------------------ explain

    def explain(self, namespace: str, name: str) -> Document | None:
        v = self.view
        key = f"{namespace}/{name}"
        aw = v.appwrappers.get(key)
        if aw is None:
            return None
        current = v.status(aw)
        state = current.state
        policy = v.health_policy(aw)
        summary, details = self._explain(aw, current, state, policy)
        details += [f"demand: {aw.demand.format() or 'nothing'}", f"priority: {aw.priority}",
                    f"created: {aw.created}"]
        if current.requeuings:
            details.append(f"requeued {current.requeuings} time(s) so far")
        for condition in (current.raw().get("conditions") or [])[-5:]:
            if isinstance(condition, Mapping):
                line = f"condition {condition.get('type')}={condition.get('status')}"
                if condition.get("reason"):
                    line += f" ({condition['reason']})"
                if condition.get("message"):
                    line += f": {condition['message']}"
                details.append(line)
        return {"namespace": namespace, "name": name, "found": True, "state": state or State.NEW,
                "summary": summary, "details": details, "uid": aw.uid, "labels": dict(aw.labels),
                "annotations": dict(aw.annotations), **self._fault_tolerance(aw, current, policy)}

    def _fault_tolerance(self, aw: AppWrapperView, current: StatusView, policy: FaultPolicy) -> Document:
        """Its health, what is due and when, its resets and retry pause (``mcad.serve.healthreport``)."""
        v = self.view
        raw = current.raw()
        now = v.clock.now()
        running = (v.dispatching(aw.key) or (current.state in ACTIVE_STATES and current.canrun
                                              and not v.queued(aw.key)))
        pods = [pod for pod in v.pods(aw.key) if not pod.deleting]
        facts = healthreport.Facts(running=running, expected_pods=sum(group.count for group in aw.gang),
                                   ready_pods=sum(1 for pod in pods if pod.phase in ("Running", "Succeeded")),
                                   existing_pods=len(pods), min_available=aw.scheduling.min_available)
        held_on = self._held_on(aw.key)
        # What it holds is its whole demand: its pods' room while they exist, a reservation for the rest.
        held = quantities(aw.demand) if v.holds(aw.key) else {}
        pause = healthreport.pause_document(raw, policy, now, held_on, held)
        return {"health": healthreport.health_document(raw, policy, now, facts),
                "faultTolerance": healthreport.policy_document(policy, aw.fault_annotations,
                                                               defaults_known=not self.info().get("offline")),
                "resets": healthreport.resets_document(raw, policy), "pause": pause}

    def _explain(self, aw: AppWrapperView, current: StatusView, state: str,
                 policy: FaultPolicy) -> tuple[str, list[str]]:
        v = self.view
        if aw.deleting:
            return "It is being deleted; its wrapped objects are being removed.", []
        if aw.demand_error:
            return f"It failed before dispatch: its spec is invalid ({aw.demand_error}).", []
        if v.dispatching(aw.key):
            return "It is being dispatched: its wrapped objects are being created now.", []
        if current.resetting_since and not v.queued(aw.key):
            return self._paused(aw, current, policy), []
        if v.queued(aw.key):
            assessed = self._assess_queue()
            place, mine = assessed.position(aw.key), assessed.of(aw.key)
            details = [f"position {place} of {len(assessed)} in the queue"]
            fitting_ahead = assessed.fitting_ahead(aw.key)
            if fitting_ahead:
                details.append(f"{fitting_ahead} AppWrapper(s) ahead of it fit now and go first")
            if mine is None:
                return "It is queued.", details
            if mine.fits_now:
                return "It is queued and fits now: the next dispatch cycle dispatches it.", details
            if mine.reservation is not None:
                details.append(_reservation_line(mine.reservation))
            details.append(_estimate_line(assessed.estimate(aw.key)))
            if mine.state == "Draining":
                left = len(v.phases(aw.key))
                return (f"It was requeued and waits for the {left} pod(s) of its previous dispatch to go before it "
                        "can be dispatched again.", details)
            return f"It is queued and cannot be dispatched yet: {mine.why}.", details
        if state in FINAL_STATES:
            if state == State.FAILED:
                failed = status.latest(current.raw().get("conditions"), status.FAILED) or {}
                reason, message = failed.get("reason") or "", failed.get("message") or ""
                return f"It failed ({reason}): {message}".rstrip(": "), []
            return "It completed: its reservation is released; its objects are kept.", []
        if state in ACTIVE_STATES and current.canrun:
            phases = v.phases(aw.key)
            counts = ", ".join(f"{phases.count(p)} {p.lower()}" for p in ("Pending", "Running", "Succeeded", "Failed")
                               if phases.count(p))
            since = lifecycle.dispatched_at(current)
            summary = (f"It is dispatched ({state}) since {rfc3339(since) or 'an unknown time'}; "
                       f"its pods: {counts or 'none yet'}.")
            details = []
            outstanding = v.reservation(aw.key)
            if outstanding:
                details.append(f"still reserved for pods not placed yet: {outstanding.format()}")
            spec = aw.scheduling
            if spec.min_available > 0:
                due = lifecycle.requeue_due(spec, current)
                details.append(f"minAvailable {spec.min_available}: checked at {rfc3339(due) or 'dispatch + wait'}; "
                               "fewer Running+Succeeded pods then requeue it")
            if spec.dispatch_limit_seconds > 0:
                details.append(f"dispatch deadline: {rfc3339(lifecycle.deadline_due(spec, current))}")
            return summary, details
        return "The controller has not decided about it yet (it arrived a moment ago).", []

    def _held_on(self, key: str) -> list[str]:
        """The nodes where an AppWrapper's room is held by its plan (a retry pause's hold, with --fit=nodes)."""
        return sorted({node for node, _ in self.view.planned_nodes(key)})

    def _paused(self, aw: AppWrapperView, current: StatusView, policy: FaultPolicy) -> str:
        v = self.view
        raw = current.raw()
        resetting = status.latest(raw.get("conditions"), status.RESETTING) or {}
        history = raw.get("resets")
        last = history[-1] if isinstance(history, list) and history and isinstance(history[-1], Mapping) else {}
        counted = (f"reset {current.resetting_count} of {policy.retry_limit} so far" if last.get("counted", True)
                   else f"not counted against retryLimit; {current.resetting_count} of {policy.retry_limit} used")
        pause = healthreport.pause_document(raw, policy, v.clock.now(), (), {}) or {}
        left = pause.get("inSeconds")
        when = ("now" if not left else f"in {format_duration(left)}, at {pause.get('until')}") \
            if left is not None else "when its pause ends"
        held_on = self._held_on(aw.key)
        room = ("meanwhile its room is held " + (f"on node(s) {', '.join(held_on)}" if held_on else
                                                 f"in aggregate ({aw.demand.format() or 'nothing'})")
                if v.holds(aw.key) else "its room is not held now")
        return (f"It is in its retry pause after a reset ({resetting.get('reason') or 'unknown cause'}; "
                f"{counted}): it is queued again at its place {when}; {room}.")


def _health_mark(current: StatusView) -> Document:
    """A dispatched AppWrapper's health for the queue's lists: Unhealthy or AtRisk while such a condition is True
    (with its reason), else Healthy. The status view says which without unpacking the status; only an AtRisk one's
    reason is read from it."""
    if current.unhealthy:
        return {"health": status.UNHEALTHY, "healthReason": current.unhealthy}
    if current.at_risk:
        at_risk = status.latest(current.raw().get("conditions"), status.AT_RISK) or {}
        return {"health": status.AT_RISK, "healthReason": str(at_risk.get("reason", ""))}
    return {"health": "Healthy", "healthReason": ""}


def _estimate_line(estimate: Estimate | None) -> str:
    """Its expected start, for explain (``mcad.model.estimate``)."""
    if estimate is None:
        return f"expected start: not estimated (more than {ESTIMATED} AppWrappers are ahead of it)"
    if estimate.at is None:
        return f"expected start: unknown ({estimate.why})"
    return (f"expected start: {estimate.at.isoformat()} (from the run-time limits of what holds the room it needs "
            "and of the AppWrappers ahead of it; an estimate, not a promise)")


def _reservation_line(reservation: Mapping[str, Any]) -> str:
    nodes = reservation.get("nodes") or []
    where = f"on nodes {', '.join(map(str, nodes))}" if nodes else f"of {reservation.get('amount')}"
    starts = reservation.get("startsBy")
    when = (f"what holds that room now is sure to be gone by {starts}" if starts else
            "when that room frees is unknown (what holds it has no dispatchDuration.limit)")
    return (f"it holds a reservation {where}: AppWrappers behind it may use that room only if they are sure to "
            f"end first; {when}")

