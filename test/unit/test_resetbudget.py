"""The per-namespace bound on resets (``mcad.model.resetbudget``): times are handed in, nothing waits."""

from __future__ import annotations

import pytest

from mcad.model.resetbudget import WINDOW, ResetBudget


def test_a_namespace_has_its_resets_of_the_minute_then_waits_for_the_oldest_to_leave_the_window() -> None:
    budget = ResetBudget(3)
    assert [budget.take("a", at) for at in (0.0, 10.0, 20.0)] == [0.0, 0.0, 0.0]
    assert budget.take("a", 30.0) == pytest.approx(30.0)  # the reset at 0 leaves the window at 60
    assert budget.take("a", 59.0) == pytest.approx(1.0)
    assert budget.recent("a", 59.0) == 3, "a deferred reset is not counted"
    assert budget.take("a", 60.0) == 0.0
    assert budget.take("a", 60.5) == pytest.approx(9.5)


def test_namespaces_do_not_share_their_bound() -> None:
    budget = ResetBudget(1)
    assert budget.take("a", 0.0) == 0.0
    assert budget.take("a", 1.0) > 0
    assert budget.take("b", 1.0) == 0.0


def test_zero_is_no_bound_and_remembers_nothing() -> None:
    budget = ResetBudget(0)
    assert all(budget.take("a", float(at)) == 0.0 for at in range(1000))
    assert len(budget) == 0


def test_memory_holds_only_namespaces_with_a_reset_in_the_window_and_at_most_the_bound_each() -> None:
    budget = ResetBudget(2)
    for index in range(1000):
        budget.take(f"ns-{index}", float(index))
        for _ in range(5):
            budget.take(f"ns-{index}", float(index))
    assert len(budget) <= WINDOW + 1
    assert budget.recent("ns-999", 999.0) == 2


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="may not be negative"):
        ResetBudget(-1)
