"""Turn the controller's ``/debug`` documents into what ``mcadctl`` prints. Pure: documents in, lines out.

Contract:
- ``queue_lines(doc, wide=, width=)``: a one-line summary of the controller, then the queued AppWrappers as a table
  POSITION NAMESPACE NAME PRIORITY AGE STATE DEMAND WHY, in the document's (dispatch) order. WHY is cut with
  "..." so each line fits ``width`` columns (never below ``MIN_WHY`` characters; ``width=None`` cuts nothing);
  ``wide`` adds PODS, REQUEUINGS and FITS-NOW and never cuts. AppWrappers in their retry pause after a reset
  (``resetting``) follow in a table NAMESPACE NAME PRIORITY RESETS (count/retryLimit) REASON PAUSE-ENDS.
  ``dispatched=True`` adds a table of the dispatched AppWrappers, with HEALTH (Healthy, Unhealthy(reason),
  AtRisk(reason)).
- ``ledger_lines(doc, nodes=)``: per resource CAPACITY USED RESERVED FREE, the outstanding reservations (those
  with something left to reserve), and with ``nodes`` one row per node and resource (ALLOCATABLE USED PLANNED
  FREE).
- ``explain_lines(doc)``: the summary sentence, then each detail indented, then (``health_lines``) its fault
  tolerance: ``Health:`` its state and what is due when, the current Unhealthy / Resetting / AtRisk /
  DeletingResources conditions, the retry pause (until when, where its room is held); ``Resets:`` the count
  against retryLimit and a table TIME REASON COUNTED MESSAGE of the history; ``Fault tolerance:`` the effective
  periods, retryLimit, exit codes, which annotations set them and those ignored because refused. A document
  without these fields (an older controller) prints none of them.
- ``quota_lines(doc, wide=, width=)``: a one-line summary of the controller, then per quota tree a ``TREE`` line
  (its resources), its errors, and a table NODE HARD LIMIT USED BORROWED APPWRAPPERS in the document's (tree)
  order, each NODE indented two spaces per level below its root. HARD is yes/no, and ``root`` for a root (its
  limit always holds). A disabled node's LIMIT reads ``disabled``; BORROWED lists only what is above 0.
  APPWRAPPERS (those charged directly to the node, ``namespace/name``) is cut with "..." to fit ``width``, like
  WHY; ``wide`` adds DEFINED-BY (the QuotaSubtree that defines the node), each AppWrapper's demand, and never cuts.
  A document saying ``"enabled": false`` prints that quota trees are off, and why that may be.
  ``only_trees(doc, names)``: the quota document with only those trees.
- ``clusters_lines(doc, wide=)``: a one-line summary of the controller (mode, policy, unreachable timeout, how many
  workers are usable), then a table NAME STATE CAPACITY FREE APPWRAPPERS (their count) in the document's (config)
  order; STATE gains ",NotSynced" for a worker whose caches are still loading. ``wide`` adds LABELS, SINCE (the
  age of the current state at ``generatedAt``) and MESSAGE. A document with ``"mode": "single"`` prints one line
  saying the controller runs in single-cluster mode.
- ``dump(doc, "json"|"yaml")``: the document unchanged, as text that parses back to an equal document.
- ``only_namespace(doc, ns)``: the queue document with only that namespace's AppWrappers (positions kept: they are
  places in the whole queue).
- ``age(seconds)``: kubectl's short form (45s, 12m, 3h, 2d, 1y). Missing fields print as "-", never raise: the
  documents come from another process, maybe of another version.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import yaml

MIN_WHY = 20
ELLIPSIS = "..."
_GAP = "   "  # between columns, as kubectl prints them
_RANK = {"cpu": 0, "memory": 1}  # printed first, the rest by name


def age(seconds: float | None) -> str:
    """A duration as kubectl prints ages: the largest whole unit (s, m, h, d, y)."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 0:
        return "0s"  # clocks of two machines disagree a little; a negative age means "just now"
    if s < 60:
        return f"{s}s"
    if s < 60 * 60:
        return f"{s // 60}m"
    if s < 24 * 60 * 60:
        return f"{s // 3600}h"
    if s < 365 * 24 * 60 * 60:
        return f"{s // 86400}d"
    return f"{s // (365 * 86400)}y"


def resource_order(names: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """cpu, memory, then the rest by name (the order mcad prints resource vectors in)."""
    return sorted(names, key=lambda n: (_RANK.get(n, len(_RANK)), n))


def quantities(values: Mapping[str, Any] | None) -> str:
    """``cpu=2,memory=1Gi``; commas, so a table cell never holds a space."""
    if not values:
        return "-"
    return ",".join(f"{name}={values[name]}" for name in resource_order(values))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, three spaces apart, the last column unpadded."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append(_GAP.join(cells).rstrip())
    return lines


def cut(text: str, limit: int) -> str:
    """``text`` shortened to ``limit`` characters, the last three replaced by "..." when anything was dropped."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(ELLIPSIS))] + ELLIPSIS


# -- queue -----------------------------------------------------------------------------------------------------------


def controller_line(doc: Mapping[str, Any]) -> str:
    """``controller mcad-controller-abc (leader; fit=nodes, best-effort FIFO, preemption off)``, or for an offline
    document ``computed offline from cluster state (fit=nodes, ...)``."""
    c = doc.get("controller") or {}
    if c.get("strictFifo"):
        order = "strict FIFO"
    elif c.get("reservations"):
        order = f"reservations {c['reservations']}"
    else:
        order = "best-effort FIFO"
    policy = f"fit={c.get('fit') or '?'}, {order}, preemption {'on' if c.get('preemption') else 'off'}"
    if c.get("offline"):
        return f"computed offline from cluster state ({policy})"
    role = "leader" if c.get("leader", True) else "standby"
    version = f" {c['version']}" if c.get("version") else ""
    return f"controller {c.get('identity') or '?'}{version} ({role}; {policy})"


def queue_lines(doc: Mapping[str, Any], *, wide: bool = False, width: int | None = None,
                dispatched: bool = False) -> list[str]:
    queued = list(doc.get("queued") or [])
    running = list(doc.get("dispatched") or [])
    paused = len(doc.get("resetting") or [])
    given = doc.get("page")
    page: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    total = page.get("queuedTotal", len(queued))
    lines = [f"{controller_line(doc)}: {total} queued, {len(running)} dispatched"
             + (f", {paused} resetting" if paused else ""), ""]
    offset = page.get("offset", 0)
    if queued:
        lines += _queued_table(queued, width=width, wide=wide)
        if offset or len(queued) < total:
            last = offset + len(queued)
            lines.append(f"(queued rows {offset + 1}-{last} of {total}"
                         + (f"; --offset {last} for the next {page.get('limit')}" if last < total else "")
                         + "; --limit 0 for all)")
    elif total:
        lines.append(f"No queued rows from place {offset + 1} on ({total} queued; --offset 0 for the first).")
    else:
        lines.append("No AppWrappers are queued.")
    standing = standing_lines(doc)
    if standing:  # after the table, so that its header stays the third line whatever the controller says
        lines += ["", *standing]
    reservations = list(doc.get("reservations") or [])
    if reservations:
        lines += ["", "Reservations (room those behind may not take unless sure to end first):"]
        for held in reservations:
            where = f"nodes {', '.join(held.get('nodes') or [])}" if held.get("nodes") else held.get("amount")
            starts = held.get("startsBy") or "unknown (what holds the room has no dispatchDuration.limit)"
            lines.append(f"  {held.get('appwrapper')}: {where}; room sure to be free by {starts}")
    resetting = [r for r in doc.get("resetting") or [] if isinstance(r, Mapping)]
    if resetting:
        lines += ["", "Resetting (in their retry pause after a reset: their room is held, then they are queued again):"]
        lines += table(["NAMESPACE", "NAME", "PRIORITY", "RESETS", "REASON", "PAUSE-ENDS"],
                       [[_text(r.get("namespace")), _text(r.get("name")), _text(r.get("priority")),
                         f"{_text(r.get('resettingCount'))}/{_text(r.get('retryLimit'))}", _text(r.get("reason")),
                         _text(r.get("pauseEndsAt"))] for r in resetting])
    if dispatched:
        lines.append("")
        lines += _dispatched_table(running, generated_at=doc.get("generatedAt")) if running else [
            "No AppWrappers are dispatched."]
    return lines


# Tenants `mcadctl queue` names one line each (a cluster-wide reader may see hundreds; -o json has them all).
MAX_TENANT_LINES = 10


def standing_lines(doc: Mapping[str, Any]) -> list[str]:
    """Where the reader stands (``aheadOfYou``, ``fairShare``; none from a controller that does not say): what is
    ahead of its first queued AppWrapper of each namespace, others' only as counts, and fair-share usage."""
    lines = []
    for first in doc.get("aheadOfYou") or []:
        if not isinstance(first, Mapping):
            continue
        parts = [f"{n} in {namespace}" for namespace, n in (first.get("named") or {}).items()]
        others = first.get("others") or {}
        if others.get("appwrappers"):
            counts = ", ".join(str(n) for n in others.get("counts") or [])
            parts.append(f"{others['appwrappers']} in {others.get('namespaces')} other namespace(s)"
                         + (f" ({counts})" if counts else ""))
        lines.append(f"{_text(first.get('namespace'))}/{_text(first.get('name'))} is at position "
                     f"{_text(first.get('position'))}, {_text(first.get('ahead'))} ahead of it"
                     + (f": {'; '.join(parts)}" if parts else ""))
    if "aheadOfYou" in doc and not doc.get("aheadOfYou"):
        lines.append("None of your AppWrappers is queued.")
    fair = doc.get("fairShare")
    if not isinstance(fair, Mapping):
        return lines
    if not fair.get("enabled"):
        return [*lines, "Fair sharing is off (the controller's --fair-sharing): priority, then creation time."]
    named = [t for t in fair.get("named") or [] if isinstance(t, Mapping)]
    others = fair.get("others") or {}
    lines.append(f"Fair sharing: {_text(fair.get('tenants'))} tenant(s) with usage (decaying with a half-life of "
                 f"{age(fair.get('halfLifeSeconds'))}; rank 1 used least and goes first among equal priorities)")
    for tenant in named[:MAX_TENANT_LINES]:
        lines.append(f"  {_text(tenant.get('tenant'))}: {_percent(tenant.get('fraction'))} of all usage, rank "
                     f"{_text(tenant.get('rank'))} of {_text(fair.get('tenants'))}")
    if len(named) > MAX_TENANT_LINES:
        lines.append(f"  ... and {len(named) - MAX_TENANT_LINES} more (-o json lists them all)")
    if not named and "aheadOfYou" in doc:
        lines.append("  none of your tenants has usage recorded: they go first")
    if others.get("tenants"):
        lines.append(f"  {others['tenants']} other tenant(s): least {_percent(others.get('leastFraction'))}, median "
                     f"{_percent(others.get('medianFraction'))}, most {_percent(others.get('mostFraction'))} of all "
                     "usage")
    return lines


def _percent(fraction: Any) -> str:
    return f"{fraction * 100:.1f}%" if isinstance(fraction, (int, float)) else "-"


def _queued_table(queued: Sequence[Mapping[str, Any]], *, width: int | None, wide: bool) -> list[str]:
    headers = ["POSITION", "NAMESPACE", "NAME", "PRIORITY", "AGE", "STATE"]
    if wide:
        headers += ["PODS", "REQUEUINGS", "FITS-NOW", "EXPECTED-START"]
    headers += ["DEMAND", "WHY"]
    rows = []
    for aw in queued:
        row = [_text(aw.get("position")), _text(aw.get("namespace")), _text(aw.get("name")),
               _text(aw.get("priority")), age(aw.get("ageSeconds")), _text(aw.get("state"))]
        if wide:
            fits = aw.get("fitsNow")
            row += [_text(aw.get("pods")), _text(aw.get("requeuings")),
                    "-" if fits is None else ("yes" if fits else "no"), _expected_start(aw)]
        row += [quantities(aw.get("demand")), _text(aw.get("why"))]
        rows.append(row)
    if width is not None and not wide:
        _cut_last_column(headers, rows, width)
    return table(headers, rows)


def _expected_start(aw: Mapping[str, Any]) -> str:
    """Its estimated start (``estimatedStart``), or "unknown" (``estimateWhy`` says why, in explain)."""
    at = aw.get("estimatedStart")
    return str(at) if at else ("-" if "estimateWhy" not in aw else "unknown")


def _cut_last_column(headers: Sequence[str], rows: Sequence[list[str]], width: int) -> None:
    """Every column but the last keeps its full width; the last gets what is left of the line, at least
    MIN_WHY characters."""
    used = sum(max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1]))
    room = max(MIN_WHY, width - used - len(_GAP) * (len(headers) - 1))
    for row in rows:
        row[-1] = cut(row[-1], room)


def _dispatched_table(running: Sequence[Mapping[str, Any]], *, generated_at: Any) -> list[str]:
    headers = ["NAMESPACE", "NAME", "PRIORITY", "STATE", "HEALTH", "DISPATCHED", "PODS", "DEMAND"]
    now = _time(generated_at)
    rows = []
    for aw in running:
        at = _time(aw.get("dispatchedAt"))
        since = age((now - at).total_seconds()) if now and at else "-"
        pods = aw.get("pods") or {}
        counts = "/".join(_text(pods.get(k, 0)) for k in ("pending", "running", "succeeded", "failed"))
        health = _text(aw.get("health")) + (f"({aw['healthReason']})" if aw.get("healthReason") else "")
        rows.append([_text(aw.get("namespace")), _text(aw.get("name")), _text(aw.get("priority")),
                     _text(aw.get("state")), health, since, counts, quantities(aw.get("demand"))])
    return [*table(headers, rows), "(PODS: pending/running/succeeded/failed)"]


def only_namespace(doc: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    kept = dict(doc)
    for key in ("queued", "dispatched", "resetting"):
        if key in doc:
            kept[key] = [aw for aw in doc.get(key) or [] if aw.get("namespace") == namespace]
    return kept


# -- ledger ----------------------------------------------------------------------------------------------------------


def ledger_lines(doc: Mapping[str, Any], *, nodes: bool = False) -> list[str]:
    by_name = {str(r.get("name")): r for r in doc.get("resources") or []}
    resources = [by_name[name] for name in resource_order(by_name)]
    lines = [controller_line(doc), ""]
    if resources:
        lines += table(["RESOURCE", "CAPACITY", "USED", "RESERVED", "FREE"],
                       [[_text(r.get("name")), _text(r.get("capacity")), _text(r.get("used")),
                         _text(r.get("reserved")), _text(r.get("free"))] for r in resources])
    else:
        lines.append("No capacity: no Ready, schedulable nodes.")
    # A dispatched AppWrapper whose pods are all placed reserves nothing more: listing it would say nothing.
    reservations = [r for r in doc.get("reservations") or [] if r.get("reserved")]
    lines.append("")
    if reservations:
        lines += table(["NAMESPACE", "NAME", "RESERVED"],
                       [[_text(r.get("namespace")), _text(r.get("name")), quantities(r.get("reserved"))]
                        for r in reservations])
    else:
        lines.append("No outstanding reservations: the pods of every dispatched AppWrapper are placed.")
    if nodes:
        lines.append("")
        lines += _node_table(doc.get("nodes") or [], [str(r.get("name")) for r in resources])
    return lines


def node_status(node: Mapping[str, Any]) -> str:
    """Ready / NotReady, plus SchedulingDisabled, as ``kubectl get nodes`` says it; plus each node-health label
    that makes it sick for some pods (``autopilot.ibm.com/gpuhealth=TESTING``)."""
    status = "Ready" if node.get("ready") else "NotReady"
    if not node.get("schedulable", True):
        status += ",SchedulingDisabled"
    sick = dict.fromkeys(f"{h.get('label')}={h.get('value')}" for h in node.get("health") or []
                         if isinstance(h, Mapping))
    return ",".join([status, *sick])


def _node_table(node_docs: Sequence[Mapping[str, Any]], counted: Sequence[str]) -> list[str]:
    if not node_docs:
        return ["No nodes."]
    rows = []
    for node in node_docs:
        allocatable = node.get("allocatable") or {}
        # The resources the ledger counts, in its order (a node's "pods" or hugepages would only add noise).
        names = list(counted) or resource_order(allocatable)
        for name in names:
            rows.append([_text(node.get("name")), node_status(node), name,
                         *(_text((node.get(part) or {}).get(name, "0"))
                           for part in ("allocatable", "used", "planned", "free")),
                         _text(node.get("pinned", 0))])
    return table(["NODE", "STATUS", "RESOURCE", "ALLOCATABLE", "USED", "PLANNED", "FREE", "PINNED"], rows)


# -- explain ---------------------------------------------------------------------------------------------------------


def explain_lines(doc: Mapping[str, Any]) -> list[str]:
    name = f"{doc.get('namespace', '?')}/{doc.get('name', '?')}"
    state = f" [{doc['state']}]" if doc.get("state") else ""
    lines = [f"{name}{state}: {doc.get('summary') or 'no explanation given'}"]
    lines += [f"  - {detail}" for detail in doc.get("details") or []]
    lines += health_lines(doc)
    return lines


def health_lines(doc: Mapping[str, Any]) -> list[str]:
    """The fault tolerance sections of an explain document (absent from a controller without fault tolerance)."""
    lines: list[str] = []
    health = doc.get("health")
    if isinstance(health, Mapping):
        due = health.get("next")
        what = f": {_text(due.get('text'))}" if isinstance(due, Mapping) and due.get("text") else ""
        lines += ["", f"Health: {_text(health.get('state'))}{what}"]
        for condition in health.get("conditions") or []:
            if not isinstance(condition, Mapping):
                continue
            reason = f" ({condition['reason']})" if condition.get("reason") else ""
            since = f" since {condition['since']}" if condition.get("since") else ""
            message = f": {condition['message']}" if condition.get("message") else ""
            lines.append(f"  {_text(condition.get('type'))}={_text(condition.get('status'))}{reason}{since}{message}")
    pause = doc.get("pause")
    if isinstance(pause, Mapping):
        nodes = pause.get("heldOn") or []
        where = (f"on node(s) {', '.join(map(str, nodes))}" if nodes
                 else f"in aggregate ({quantities(pause.get('held'))})")
        lines.append(f"  retry pause: since {_text(pause.get('since'))}, until {_text(pause.get('until'))}; "
                     f"its room is held {where}")
    resets = doc.get("resets")
    if isinstance(resets, Mapping):
        history = [r for r in resets.get("history") or [] if isinstance(r, Mapping)]
        lines += ["", f"Resets: {_text(resets.get('count'))} counted of retryLimit {_text(resets.get('retryLimit'))}"
                      + ("" if history else "; none so far")]
        if history:
            rows = [[_text(r.get("time")), _text(r.get("reason")), "yes" if r.get("counted") else "no",
                     _text(r.get("message"))] for r in history]
            lines += ["  " + line for line in table(["TIME", "REASON", "COUNTED", "MESSAGE"], rows)]
    policy = doc.get("faultTolerance")
    if isinstance(policy, Mapping):
        lines += ["", "Fault tolerance" + (" (the controller's defaults are not known offline: built-in ones shown)"
                                           if policy.get("defaults") == "built-in" else "") + ":"]
        lines.append("  " + ", ".join(f"{name} {_text(policy.get(name))}" for name in (
            "admissionGracePeriod", "warmupGracePeriod", "failureGracePeriod", "retryPausePeriod", "retryLimit",
            "forcefulDeletionGracePeriod", "deletionOnFailureGracePeriod", "successTTL")))
        terminal, retryable = policy.get("terminalExitCodes") or [], policy.get("retryableExitCodes") or []
        codes = (f"terminal exit codes: {','.join(map(str, terminal)) or 'none'}; "
                 + (f"retryable: only {','.join(map(str, retryable))}" if retryable else "retryable: every other"))
        lines.append(f"  {codes}; delete when finished: {'yes' if policy.get('deleteWhenFinished') else 'no'}")
        own = policy.get("fromAnnotations") or []
        lines.append(f"  set by its annotations: {', '.join(map(str, own)) or 'none (the cluster defaults)'}")
        lines += [f"  ignored (refused value, the default stands): {entry}" for entry in policy.get("ignored") or []]
    return lines


# -- quota -----------------------------------------------------------------------------------------------------------


def quota_lines(doc: Mapping[str, Any], *, wide: bool = False, width: int | None = None) -> list[str]:
    trees = list(doc.get("trees") or [])
    if doc.get("enabled") is False:
        return [f"{controller_line(doc)}: quota trees are off", "",
                "The controller does not charge quota: it runs with --no-quota, or the QuotaSubtree CRD "
                "(quota.codeflare.dev) was not installed when it started."]
    lines = [f"{controller_line(doc)}: {len(trees)} quota tree(s)"]
    if not trees:
        return [*lines, "", "No quota trees: no QuotaSubtree objects with a `tree` label in the cluster."]
    for tree in trees:
        resources = ", ".join(resource_order([str(r) for r in tree.get("resources") or []])) or "none"
        lines += ["", f"TREE {_text(tree.get('name'))} (resources: {resources})"]
        lines += [f"  error: {error}" for error in tree.get("errors") or []]
        nodes = list(tree.get("nodes") or [])
        lines += _quota_table(nodes, wide=wide, width=width) if nodes else ["No nodes."]
    return lines


def _quota_table(nodes: Sequence[Mapping[str, Any]], *, wide: bool, width: int | None) -> list[str]:
    headers = ["NODE", "HARD", "LIMIT", "USED", "BORROWED"]
    if wide:
        headers.append("DEFINED-BY")
    headers.append("APPWRAPPERS")
    depth: dict[str, int] = {}
    rows = []
    for node in nodes:
        name, parent = _text(node.get("name")), node.get("parent")
        # Parents come first in the document; a parent it does not list (the tree's errors say why) is a root.
        depth[name] = depth[parent] + 1 if isinstance(parent, str) and parent in depth else 0
        hard = node.get("hardLimit")
        # A root never goes over its limit, whatever its hardLimit says: "no" would promise borrowing.
        hard_text = "root" if not parent else "-" if hard is None else "yes" if hard else "no"
        row = ["  " * depth[name] + name, hard_text,
               "disabled" if node.get("disabled") else quantities(node.get("limit")),
               quantities(node.get("used")), quantities(_nonzero(node.get("borrowed")))]
        if wide:
            row.append(_text(node.get("definedBy")))
        charged = [aw for aw in node.get("appwrappers") or [] if isinstance(aw, Mapping)]
        names = [f"{_text(aw.get('namespace'))}/{_text(aw.get('name'))}" for aw in charged]
        if wide:
            names = [f"{name}({quantities(aw.get('demand'))})" for name, aw in zip(names, charged, strict=True)]
        row.append(",".join(names) or "-")
        rows.append(row)
    if width is not None and not wide:
        _cut_last_column(headers, rows, width)
    return table(headers, rows)


def _nonzero(values: Any) -> dict[str, Any] | None:
    """Only the resources a node actually borrows: ``cpu=0,memory=0`` would read as something borrowed."""
    if not isinstance(values, Mapping):
        return None
    return {name: amount for name, amount in values.items() if str(amount) not in ("0", "")}


def only_trees(doc: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    kept = dict(doc)
    kept["trees"] = [tree for tree in doc.get("trees") or [] if tree.get("name") in names]
    return kept


# -- clusters --------------------------------------------------------------------------------------------------------


def clusters_lines(doc: Mapping[str, Any], *, wide: bool = False) -> list[str]:
    if doc.get("mode") != "hub":
        return [f"{controller_line(doc)}: single-cluster mode (started without --clusters-config): "
                "no worker clusters; AppWrappers run in the cluster the controller watches"]
    workers = [w for w in doc.get("clusters") or [] if isinstance(w, Mapping)]
    usable = sum(1 for w in workers if w.get("usable"))
    timeout = doc.get("unreachableTimeoutSeconds")
    requeue = f", requeue from an unreachable worker after {age(timeout)}" if isinstance(timeout, (int, float)) else ""
    lines = [f"{controller_line(doc)}: hub mode, policy {_text(doc.get('policy'))}{requeue}; "
             f"{usable} of {len(workers)} worker(s) usable", ""]
    if not workers:
        return [*lines, "No worker clusters."]
    headers = ["NAME", "STATE", "CAPACITY", "FREE", "APPWRAPPERS"]
    if wide:
        headers += ["LABELS", "SINCE", "MESSAGE"]
    now = _time(doc.get("generatedAt"))
    rows = []
    for worker in workers:
        state = _text(worker.get("state"))
        # Healthy but still listing: not usable for placement yet, and a person should see why.
        if worker.get("synced") is False and worker.get("state") == "Healthy":
            state += ",NotSynced"
        placed = worker.get("appwrappers")
        row = [_text(worker.get("name")), state, quantities(worker.get("capacity")), quantities(worker.get("free")),
               str(len(placed)) if isinstance(placed, list) else "-"]
        if wide:
            labels = worker.get("labels")
            since = _time(worker.get("since"))
            row += [",".join(f"{k}={v}" for k, v in sorted(labels.items())) if isinstance(labels, Mapping) and labels
                    else "-",
                    age((now - since).total_seconds()) if now and since else "-",
                    _text(worker.get("message"))]
        rows.append(row)
    return [*lines, *table(headers, rows)]


# -- json / yaml -----------------------------------------------------------------------------------------------------


def dump(doc: Mapping[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(doc, indent=2)
    if output == "yaml":
        return yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False).rstrip("\n")
    raise ValueError(f"unknown output format {output!r}")


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
