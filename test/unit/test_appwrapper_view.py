"""Parsing AppWrappers into views, dispatch order, and the shortfall message."""

from __future__ import annotations

from typing import Any

from mcad.api.appwrapper import appwrapper_view
from mcad.api.resources import ResourceVector
from mcad.model.fit import describe_shortfall


def raw(name: str, *, priority: Any = None, created: str = "2026-01-01T00:00:00Z", status: Any = None,
        items: Any = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"GenericItems": [{"custompodresources": [
        {"replicas": 2, "requests": {"cpu": "500m"}}]}] if items == "default" else items}}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "creationTimestamp": created},
            "spec": spec, "status": status or {}}


def test_order_is_priority_then_age_then_name() -> None:
    views = [appwrapper_view(r) for r in (
        raw("b", created="2026-01-01T00:00:02Z"), raw("a", created="2026-01-01T00:00:02Z"),
        raw("old", created="2026-01-01T00:00:01Z"), raw("urgent", priority=5, created="2026-01-01T00:00:09Z"),
        raw("neg", priority=-1))]
    assert [v.name for v in sorted(views, key=lambda v: v.order())] == ["urgent", "old", "a", "b", "neg"]


def test_demand_and_a_new_status() -> None:
    aw = appwrapper_view(raw("x"))
    assert aw.demand == ResourceVector({"cpu": 1000})
    assert aw.status.state == "" and not aw.status.canrun and aw.demand_error is None


def test_the_status_says_state_and_canrun() -> None:
    running = appwrapper_view(raw("x", status={"state": "Running", "canrun": True})).status
    assert (running.state, running.canrun) == ("Running", True)
    assert not appwrapper_view(raw("x", status={"state": "Running", "canrun": False})).status.canrun


def test_empty_items_and_bad_quantities_become_demand_errors_not_exceptions() -> None:
    assert "GenericItems is empty" in (appwrapper_view(raw("x", items=[])).demand_error or "")
    bad = appwrapper_view(raw("x", items=[{"custompodresources": [{"replicas": 1, "requests": {"cpu": "lots"}}]}]))
    assert "invalid quantity 'lots'" in (bad.demand_error or "")


def test_a_malformed_priority_counts_as_zero() -> None:
    assert appwrapper_view(raw("x", priority="high")).priority == 0


def test_shortfall_names_each_short_resource_and_a_demand_larger_than_the_cluster() -> None:
    demand = ResourceVector({"cpu": 4000, "nvidia.com/gpu": 2, "memory": 1 << 30})
    free = ResourceVector({"cpu": 1500, "nvidia.com/gpu": 0, "memory": 4 << 30})
    capacity = ResourceVector({"cpu": 8000, "memory": 8 << 30})
    assert describe_shortfall(demand, free, capacity) == (
        "short of cpu 2500m (needs 4, 1500m free), nvidia.com/gpu 2 (needs 2, 0 free); "
        "more than the whole cluster has")


def test_a_priority_beyond_int32_is_refused_and_ordered_as_the_int32_bound() -> None:
    huge = appwrapper_view(raw("x", priority=2**40))
    assert huge.priority == 2**31 - 1
    assert huge.demand_error == "spec.priority is 1099511627776; it must be between -2147483648 and 2147483647"
    assert appwrapper_view(raw("x", priority=-(2**40))).priority == -(2**31)
