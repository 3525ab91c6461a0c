"""The usage ledger of fair sharing (``mcad.model.fairshare``): usage is the share of the cluster held, integrated
and decayed with a half-life; a pass's scores grow with what it dispatches; tenants and shares are named as the
module says."""

from __future__ import annotations

import math

import pytest

from mcad.api.resources import ResourceVector
from mcad.model.fairshare import ENTRY_SECONDS, FairPass, FairShare, projected_order, share

HOUR = 3600.0


def v(**amounts: int) -> ResourceVector:
    return ResourceVector({("nvidia.com/gpu" if k == "gpu" else k): a for k, a in amounts.items()})


def test_an_hour_of_the_whole_cluster_an_hour_ago_counts_half() -> None:
    ledger = FairShare(half_life=HOUR)
    ledger.change(0.0, "a", 1.0)
    ledger.change(HOUR, "a", -1.0)  # held the whole cluster for an hour
    at_end = ledger.usage_at(HOUR)["a"]
    assert at_end == pytest.approx(HOUR / math.log(2) * 0.5)  # the integral of 2^-(t/h) over the hour
    assert ledger.usage_at(2 * HOUR)["a"] == pytest.approx(at_end / 2)


def test_usage_read_without_changing_it_equals_what_a_change_computes() -> None:
    ledger = FairShare(half_life=HOUR)
    ledger.change(0.0, "a", 0.5)
    read = ledger.usage_at(600.0)["a"]
    ledger.change(600.0, "b", 0.25)  # another tenant's change brings nobody else up to date
    ledger.change(600.0, "a", 0.0)
    assert ledger.usage_at(600.0)["a"] == pytest.approx(read)
    assert ledger.usage_at(600.0)["b"] == 0.0


def test_a_tenant_that_holds_nothing_and_decayed_away_is_forgotten() -> None:
    ledger = FairShare(half_life=60.0)
    ledger.change(0.0, "a", 1.0)
    ledger.change(1.0, "a", -1.0)
    ledger.change(60.0 * 40, "a", 0.0)  # forty half-lives later
    assert "a" not in ledger.usage_at(60.0 * 40)
    ledger.change(0.0, "nobody", -1.0)  # letting go of what was never held is nothing
    assert "nobody" not in ledger.usage_at(0.0)


def test_restore_adds_what_was_saved() -> None:
    ledger = FairShare(half_life=HOUR)
    ledger.restore({"a": 100.0, "bad": float("nan"), "tiny": 1e-9}, 10.0)
    assert ledger.usage_at(10.0) == {"a": 100.0}
    with pytest.raises(ValueError):
        FairShare(half_life=0)


def test_a_pass_adds_a_second_of_each_dispatch_to_its_tenant() -> None:
    fair = FairPass({"a": 5.0})
    assert fair.score("b") == 0.0  # asked before it took anything: what it took after still counts
    fair.took("b", 0.5)
    assert fair.score("b") == pytest.approx(0.5 * ENTRY_SECONDS)
    fair.took("b", 0.25)
    assert fair.score("a") == 5.0 and fair.score("b") == pytest.approx(0.75 * ENTRY_SECONDS)
    assert fair.score("c") == 0.0


def test_a_pass_asks_the_weight_of_a_tenant_that_used_something_once_and_of_an_idle_one_never() -> None:
    asked: list[str] = []

    def weights(tenant: str) -> float:
        asked.append(tenant)
        return 2.0

    fair = FairPass({"busy": 4.0}, weights)
    assert [fair.score("idle"), fair.score("busy"), fair.score("busy")] == [0.0, 2.0, 2.0]
    assert asked == ["busy"]
    fair.took("idle", 1.0)
    fair.took("busy", 1.0)
    assert fair.score("idle") == pytest.approx(ENTRY_SECONDS / 2) and fair.score("busy") == pytest.approx(2.5)
    assert asked == ["busy", "idle"]


@pytest.mark.parametrize(("demand", "capacity", "expected"), [
    (v(gpu=2, cpu=1), v(gpu=8, cpu=100), 0.25),  # GPUs dominate when asked for
    (v(cpu=4, memory=1), v(cpu=8, memory=100), 0.5),  # else the larger of cpu and memory
    (v(cpu=1, memory=50), v(cpu=8, memory=100), 0.5),
    (v(gpu=1), v(cpu=8), 1.0),  # GPUs the cluster has none of: all of it
    (v(), v(cpu=8), 0.0),
])
def test_share(demand: ResourceVector, capacity: ResourceVector, expected: float) -> None:
    assert share(demand, capacity) == pytest.approx(expected)


def _orders(*queued: tuple[int, str, str]) -> list[tuple[int, str, str]]:
    """(priority, created, key) -> orders as the queue keeps them (priority first, then age)."""
    return sorted((-priority, created, key) for priority, created, key in queued)


def test_the_projection_lets_a_tenant_that_queued_later_take_turns_with_one_that_queued_first() -> None:
    # a queued four at 9:00, b two at 9:01; neither used anything: they take turns, a first (older).
    orders = _orders(*[(0, f"09:00:0{i}", f"a/a{i}") for i in range(4)],
                     *[(0, f"09:01:0{i}", f"b/b{i}") for i in range(2)])
    order = projected_order(orders, lambda key: key[0], lambda key: 1.0, {})
    assert order == ["a/a0", "b/b0", "a/a1", "b/b1", "a/a2", "a/a3"]


def test_the_projection_puts_the_tenant_that_used_more_after_until_the_others_catch_up() -> None:
    orders = _orders(*[(0, f"09:00:0{i}", f"a/a{i}") for i in range(3)],
                     *[(0, f"09:01:0{i}", f"b/b{i}") for i in range(3)])
    # a's score is 1.5: b's first two (score 0, then 1) go before a's first; at 2 b is behind a's 1.5.
    order = projected_order(orders, lambda key: key[0], lambda key: 1.0, {"a": 1.5})
    assert order == ["b/b0", "b/b1", "a/a0", "b/b2", "a/a1", "a/a2"]


def test_the_projection_keeps_priority_first_and_weighs_what_each_takes() -> None:
    orders = _orders((0, "09:00:00", "a/a0"), (0, "09:00:01", "a/a1"), (0, "09:01:00", "b/b0"),
                     (0, "09:01:01", "b/b1"), (5, "10:00:00", "b/urgent"))
    # b weighs 2 (each of its takes adds half); a's score is 0.6: b's two go first (0 and 0.5 are below 0.6).
    order = projected_order(orders, lambda key: key[0], lambda key: 0.5 if key[0] == "b" else 1.0, {"a": 0.6})
    assert order == ["b/urgent", "b/b0", "b/b1", "a/a0", "a/a1"]
