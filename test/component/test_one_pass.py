"""What explain says is what the next cycle does: a seeded simulation of a queue under churn.

Before every dispatch cycle the harness's dispatcher runs, the dry run behind explain, ``/debug/queue`` and the
dashboard (``Dispatcher.assess_queue``) is asked first, over the very state that cycle then sees; the cycle then
runs, and what it did is read back from the dispatcher's own records (the queue, the ledger's reservations, who
waits for which victims): every AppWrapper the dry run said fits now was dispatched and no other, each one it said
preempts or reclaims for evicted exactly the victims it named, and the reservations it listed are the ones held.
Between cycles the simulation adds AppWrappers of mixed sizes and priorities, deletes some, starts and ends the
pods of dispatched ones, and moves the clock on, with and without reservations, per-node fit, strict FIFO,
priority preemption, gangs that require one rack, gangs with a bounded run time (which may backfill), and
AppWrappers spared by preemption for a minimum run time (the cluster's default or their own) or a cooldown.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from mcad.api.minruntime import MIN_RUNTIME, MinRuntime
from mcad.metrics import Metrics
from test.component.harness import gang_aw, node, pod

ROUNDS = 40
RACK = "topology.example.com/rack"


class Recorded:
    """Each cycle's forecast (taken just before it ran) beside what it did."""

    def __init__(self, h: Any) -> None:
        self.h = h
        self.cycles: list[dict[str, Any]] = []
        cycle = h.dispatcher.owners.cycle
        run = cycle.run

        def forecast_then_run() -> None:
            d = h.dispatcher
            assessed = d.view.assess_queue()
            told = {a.key: a for a in assessed}
            queued_before = set(d.owners.queued.pending.ordered())
            victims_before = d.owners.cycle._preemptors.waiters()
            run()
            victims_after = d.owners.cycle._preemptors.waiters()
            self.cycles.append({
                "fits_now": {k for k, a in told.items() if a.fits_now},
                "left_queue": {k for k in queued_before - set(d.owners.queued.pending.ordered())
                               if d.appwrappers.get(k) is not None},
                "would_evict": {k: set(a.evicts) for k, a in told.items()
                                if a.state == "Queued" and a.evicts},
                "evicted": {k: set(v) for k, v in victims_after.items() if victims_before.get(k) != v},
                "reservations_told": {str(a.reservation["appwrapper"]): list(a.reservation["nodes"])  # type: ignore[index, call-overload]
                                      for a in assessed.judged() if a.reservation is not None},
                "reservations_held": {k: list(r.nodes)
                                      for k, r in d.owners.cycle._reservations.held.items()},
            })

        cycle.run = forecast_then_run  # type: ignore[method-assign]


def churn(h: Any, rng: random.Random, limits: random.Random, round_: int, live_pods: dict[str, list[str]],
          racks: bool = False, spares: random.Random | None = None, tenants: int = 1) -> None:
    """One round of changes, as a busy cluster makes them (``racks``: some new gangs require one rack; ``limits``
    draws which have a bounded run time, ``spares`` which ask for a minimum run time of their own, each apart from
    ``rng`` so the rest of the churn stays as it was)."""
    d = h.dispatcher
    for i in range(rng.randint(0, 4)):
        raw = gang_aw(f"r{round_:02d}-{i}-{rng.randrange(10**4):04d}", rng.choice([1, 1, 2]),
                      {"cpu": rng.choice(["1", "2", "3", "5"])}, priority=rng.choice([0, 0, 1, 5]))
        if tenants > 1:  # fair sharing orders the tenants (namespaces here) by their usage
            raw["metadata"]["namespace"] = f"team-{limits.randrange(tenants)}"
        if racks and rng.random() < 0.4:
            raw["metadata"]["annotations"] = {"mcad.codeflare.dev/topology-required": RACK}
        if spares is not None and spares.random() < 0.3:
            raw["metadata"].setdefault("annotations", {})[MIN_RUNTIME] = spares.choice(["0", "1m", "5m"])
        if limits.random() < 0.3:  # a bounded run time: it may backfill reserved room it leaves in time
            raw["spec"]["schedulingSpec"] = {"dispatchDuration": {"limit": limits.choice([60, 600])}}
        h.lw["aw"].add(raw)
    dispatched = sorted(key for key in d.owners.active.views)
    for key in dispatched:
        name = key.partition("/")[2]
        if key not in live_pods and rng.random() < 0.5:
            # Its pods start, on the nodes of its plan (the ledger's pins) or the first node.
            aw = d.appwrappers.get(key)
            if aw is None:
                continue
            cpu = str(int(aw.demand.get("cpu") / 1000) if aw.demand.get("cpu") else 1)
            h.lw["pod"].add(pod(f"{name}-p", cpu, appwrapper=name, node_name="n0"))
            live_pods[key] = [f"ns/{name}-p"]
    for key in sorted(live_pods):
        aw = d.appwrappers.get(key)
        requeued = aw is None or key not in d.owners.active.views
        if requeued or rng.random() < 0.15:
            for name in live_pods.pop(key):  # its pods end (a victim's, or a finished gang's)
                h.lw["pod"].delete(name)
    queued = sorted(d.owners.queued.pending.ordered())
    if queued and rng.random() < 0.3:
        h.lw["aw"].delete(rng.choice(queued))
    if dispatched and rng.random() < 0.5:
        key = rng.choice(dispatched)  # it finished and its owner deleted it; its pods go with it
        h.lw["aw"].delete(key)
        for name in live_pods.pop(key, []):
            h.lw["pod"].delete(name)
    h.clock.advance(rng.choice([0, 1, 30, 120]))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("fit", "reservations", "strict_fifo", "racks", "spared", "fair"), [
    ("aggregate", 0, False, False, False, False), ("aggregate", 2, False, False, False, False),
    ("nodes", 2, False, False, False, False), ("nodes", 0, True, False, False, False),
    ("nodes", 2, False, True, False, False), ("nodes", 2, False, False, True, False),
    ("aggregate", 2, False, False, False, True)])
def test_explain_foretells_what_the_next_cycle_does(harness_factory: Any, seed: int, fit: str, reservations: int,
                                                    strict_fifo: bool, racks: bool, spared: bool, fair: bool) -> None:
    rng, limits = random.Random(seed), random.Random(-seed - 1)
    # Spared: a minimum run time of 30 s for all, some asking for more (or none), and a 5-minute cooldown; else
    # the controller's defaults (no minimum, a 10-minute cooldown).
    spares = random.Random(seed + 1000) if spared else None
    sparing: dict[str, Any] = {"min_runtime": MinRuntime(default=30), "preemption_cooldown": 300.0} if spared else {}
    metrics = Metrics()
    aws = [gang_aw(f"start-{i:02d}", rng.choice([1, 2]), {"cpu": rng.choice(["1", "2", "3"])},
                   priority=rng.choice([0, 0, 1])) for i in range(12)]
    nodes = [node("n0", "6"), node("n1", "4")]
    if racks:  # two racks: n0 and n2 in rack-a, n1 and n3 in rack-b
        nodes += [node("n2", "3"), node("n3", "5")]
        for raw, rack in zip(nodes, ("rack-a", "rack-b", "rack-a", "rack-b"), strict=True):
            raw["metadata"]["labels"] = {RACK: rack}
    h = harness_factory(nodes=nodes, pods=[], aws=aws, fit=fit,
                        reservations=reservations, strict_fifo=strict_fifo, preemption=True, fair_sharing=fair,
                        preemption_backoff=0.0, metrics=metrics, **sparing)
    recorded = Recorded(h)
    h.drain()
    live_pods: dict[str, list[str]] = {}
    for round_ in range(ROUNDS):
        churn(h, rng, limits, round_, live_pods, racks, spares, tenants=3 if fair else 1)
        h.drain()
    assert len(recorded.cycles) >= ROUNDS // 2, "the churn brought cycles"
    for number, cycle in enumerate(recorded.cycles):
        assert cycle["left_queue"] == cycle["fits_now"], (number, cycle)
        assert cycle["evicted"] == cycle["would_evict"], (number, cycle)
        assert cycle["reservations_held"] == cycle["reservations_told"], (number, cycle)
    dispatches = sum(len(c["fits_now"]) for c in recorded.cycles)
    preemptions = sum(len(c["would_evict"]) for c in recorded.cycles)
    assert dispatches > 0
    assert preemptions > 0, "the simulation exercised preemption"
    if spared:
        assert sum(metrics.registry.get_sample_value("mcad_preemption_spared_total", {"reason": reason}) or 0
                   for reason in ("min-runtime", "cooldown")) > 0, "and sparing"
    if reservations:
        assert any(c["reservations_held"] for c in recorded.cycles), "and reservations"
