"""Priority preemption that does not thrash, stepped with a fake clock: an AppWrapper dispatched less than its
minimum run time ago (``mcad.codeflare.dev/min-runtime``, else the cluster's default, at most its ceiling) is no
victim, nor is one preempted before and dispatched again less than the cooldown ago; the preemptor says whom it
spares and the spared are counted. Of the victim sets that make it fit, the one that loses the least work
(run time so far x GPUs, else cpu) goes, and each victim is told so."""

from __future__ import annotations

from typing import Any

from mcad.api.minruntime import MinRuntime
from mcad.metrics import Metrics
from test.component.harness import Harness, gang_aw, gpu_node, last_status, node, pod
from test.component.test_preemption_bounds import add_aw, run_pods, states
from test.fakes import wait_informed

MIN_RUNTIME = "mcad.codeflare.dev/min-runtime"


def annotated(raw: dict[str, Any], min_runtime: str) -> dict[str, Any]:
    raw["metadata"]["annotations"] = {MIN_RUNTIME: min_runtime}
    return raw


def spared(metrics: Metrics, reason: str) -> float:
    return metrics.registry.get_sample_value("mcad_preemption_spared_total", {"reason": reason}) or 0.0


def assessed_before_each_cycle(h: Harness, key: str) -> list[str]:
    """What explain says of ``key`` just before each dispatch cycle runs (its ``why``)."""
    told: list[str] = []
    cycle = h.dispatcher.owners.cycle
    run = cycle.run

    def assess_then_run() -> None:
        found = h.dispatcher.view.assess_queue().of(key)
        if found is not None:
            told.append(found.why)
        run()

    cycle.run = assess_then_run  # type: ignore[method-assign]
    return told


def old_and_young(harness_factory: Any, young_min_runtime: str | None, **options: Any) -> tuple[Harness, Metrics]:
    """On a 4-cpu node low-old (2 cpu) runs 10 minutes before low-young (2 cpu, with ``young_min_runtime``) is
    dispatched; a minute later both run. low-young, having run the least, loses the least work."""
    metrics = Metrics()
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[gang_aw("low-old", 1, {"cpu": "2"})],
                        preemption=True, fit="aggregate", metrics=metrics, **options)
    h.drain()
    h.clock.advance(600)
    young = gang_aw("low-young", 1, {"cpu": "2"})
    add_aw(h, annotated(young, young_min_runtime) if young_min_runtime is not None else young)
    run_pods(h, ("low-old", "2"), ("low-young", "2"))
    h.clock.advance(60)
    return h, metrics


def test_without_a_minimum_run_time_the_youngest_goes(harness_factory: Any) -> None:
    h, metrics = old_and_young(harness_factory, None)
    add_aw(h, gang_aw("high", 1, {"cpu": "2"}, priority=10))
    assert states(h)["low-young"] == "Pending" and states(h)["low-old"] == "Running"
    assert spared(metrics, "min-runtime") == 0


def test_one_younger_than_its_minimum_run_time_is_spared_and_the_preemptor_says_so(harness_factory: Any) -> None:
    h, metrics = old_and_young(harness_factory, "1h")
    told = assessed_before_each_cycle(h, "ns/high")
    add_aw(h, gang_aw("high", 1, {"cpu": "2"}, priority=10))
    assert states(h)["low-old"] == "Pending", "the old one goes instead"
    assert states(h)["low-young"] == "Running"
    # low-old ran 11 minutes on 2 cpu.
    assert last_status(h, "low-old")["message"] == \
        "Preempted by AppWrapper ns/high (priority 10); chosen for the least work lost: 1 AppWrapper(s), " \
        "0.37 CPU-hours."
    spares = "it spares 1 AppWrapper(s) that ran less than their minimum run time"
    assert "the next dispatch cycle preempts 1 lower-priority AppWrapper(s) to make room: ns/low-old; " + spares \
        in told, told
    assert "preempting 1 lower-priority AppWrapper(s) to make room, losing the least work (0.37 CPU-hours): " \
        f"ns/low-old; {spares}" in last_status(h, "high")["message"]
    assert spared(metrics, "min-runtime") == 1
    h.drain()
    assert spared(metrics, "min-runtime") == 1, "counted once per preemptor"


def test_the_clusters_default_minimum_holds_until_it_is_over_then_a_cycle_preempts(harness_factory: Any) -> None:
    # Every AppWrapper's default: 15 minutes. low-old ran 11, low-young 1: neither may go for 4 minutes.
    h, metrics = old_and_young(harness_factory, None, min_runtime=MinRuntime(default=900))
    add_aw(h, gang_aw("high", 1, {"cpu": "2"}, priority=10))
    assert states(h) == {"low-old": "Running", "low-young": "Running", "high": "Pending"}
    message = last_status(h, "high")["message"]
    assert "it evicts nobody for now: it would fit only by evicting AppWrappers it spares 1 AppWrapper(s) that ran " \
        "less than their minimum run time; it looks again in 240 s, when the first AppWrapper it spares may be " \
        "evicted" in message, message
    assert spared(metrics, "min-runtime") == 1

    h.clock.advance(239)
    h.drain()
    assert states(h)["low-young"] == "Running" and h.dispatcher.preemptions == 0
    h.clock.advance(1)  # no event: the cycle due when low-old's minimum is over
    h.drain()
    assert h.dispatcher.preemptions == 1 and states(h)["low-old"] == "Pending"
    assert states(h)["low-young"] == "Running"


def test_a_minimum_above_the_ceiling_is_cut_to_it(harness_factory: Any) -> None:
    # Stored around the webhook: 5 hours asked, the ceiling is 10 minutes. low-old runs 11 minutes by now (no
    # minimum of its own, and no default): with low-young spared only 9 minutes more, low-old is the victim...
    h, _ = old_and_young(harness_factory, "5h", min_runtime=MinRuntime(ceiling=600))
    add_aw(h, gang_aw("high", 1, {"cpu": "2"}, priority=10))
    assert states(h)["low-old"] == "Pending" and states(h)["low-young"] == "Running"
    # ...and once low-young has run 10 minutes, the next preemptor may take it.
    h.lw["pod"].delete("ns/low-old-0")
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-old-0") is None, 5, "low-old's pod to go")
    h.drain()
    assert states(h)["high"] == "Running"
    add_aw(h, gang_aw("high-2", 1, {"cpu": "2"}, priority=10))
    assert h.dispatcher.preemptions == 1, "low-young ran 1 minute of its 10"
    h.clock.advance(540)
    h.drain()
    assert h.dispatcher.preemptions == 2 and states(h)["low-young"] == "Pending"


def bounced(harness_factory: Any, **options: Any) -> tuple[Harness, Metrics]:
    """low (2 cpu) runs on a 2-cpu node; high-1 preempts it, runs and ends; low is dispatched again; high-2
    arrives a minute later."""
    metrics = Metrics()
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=[gang_aw("low", 1, {"cpu": "2"})],
                        preemption=True, fit="aggregate", metrics=metrics, preemption_backoff=0.0, **options)
    h.drain()
    run_pods(h, ("low", "2"))
    h.clock.advance(60)
    add_aw(h, gang_aw("high-1", 1, {"cpu": "2"}, priority=10))
    assert states(h)["low"] == "Pending" and h.dispatcher.preemptions == 1
    h.lw["pod"].delete("ns/low-0")
    wait_informed(lambda: h.dispatcher.pods.get("uid-low-0") is None, 5, "low's pod to go")
    h.drain()
    assert states(h)["high-1"] == "Running"
    h.clock.advance(60)
    h.lw["aw"].delete("ns/high-1")  # it finished; its owner deleted it
    h.drain()
    assert states(h)["low"] == "Running", "dispatched again"
    run_pods(h, ("low", "2"))
    h.clock.advance(60)
    add_aw(h, gang_aw("high-2", 1, {"cpu": "2"}, priority=10))
    return h, metrics


def test_an_appwrapper_preempted_before_is_spared_for_the_cooldown_after_it_runs_again(
        harness_factory: Any) -> None:
    h, metrics = bounced(harness_factory, preemption_cooldown=600)
    assert states(h)["low"] == "Running" and h.dispatcher.preemptions == 1
    message = last_status(h, "high-2")["message"]
    assert "it would fit only by evicting AppWrappers it spares 1 AppWrapper(s) preempted before and dispatched " \
        "again less than the preemption cooldown ago; it looks again in 540 s" in message, message
    assert spared(metrics, "cooldown") == 1
    h.clock.advance(539)
    h.drain()
    assert h.dispatcher.preemptions == 1
    h.clock.advance(1)
    h.drain()
    assert h.dispatcher.preemptions == 2 and states(h)["low"] == "Pending"
    assert len(h.dispatcher.owners.evictions.cooldowns) == 1, "evicted again: a new cooldown, once it runs"
    h.lw["aw"].delete("ns/low")
    h.drain()
    assert len(h.dispatcher.owners.evictions.cooldowns) == 0, "gone: forgotten"


def test_with_no_cooldown_it_is_bounced_at_once(harness_factory: Any) -> None:
    h, metrics = bounced(harness_factory, preemption_cooldown=0)
    assert states(h)["low"] == "Pending" and h.dispatcher.preemptions == 2
    assert spared(metrics, "cooldown") == 0


def test_the_victims_that_lose_the_least_gpu_work_go_not_the_most_recent(harness_factory: Any) -> None:
    # small (1 GPU) runs 30 minutes by the time high asks for 1 GPU, big (4 GPUs) 10: evicting small loses 0.5
    # GPU-hours, big 0.67. The most recently dispatched, big, would go by recency.
    h = harness_factory(nodes=[gpu_node("n0", 5)], pods=[], aws=[gang_aw("small", 1, {"nvidia.com/gpu": "1"})],
                        preemption=True, fit="aggregate")
    h.drain()
    h.clock.advance(1200)
    add_aw(h, gang_aw("big", 1, {"nvidia.com/gpu": "4"}))
    for name, gpus in (("small", "1"), ("big", "4")):
        raw = pod(f"{name}-0", "0", appwrapper=name)
        raw["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": gpus}
        h.lw["pod"].add(raw)
    wait_informed(lambda: h.dispatcher.pods.get("uid-big-0"), 5, "the pods")
    h.clock.advance(600)
    add_aw(h, gang_aw("high", 1, {"nvidia.com/gpu": "1"}, priority=10))
    assert states(h)["small"] == "Pending" and states(h)["big"] == "Running"
    assert last_status(h, "small")["message"] == \
        "Preempted by AppWrapper ns/high (priority 10); chosen for the least work lost: 1 AppWrapper(s), " \
        "0.5 GPU-hours."
