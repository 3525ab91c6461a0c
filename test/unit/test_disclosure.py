"""mcad.model.disclosure: another namespace's AppWrappers are counted, never named; the reader's own are named."""

from __future__ import annotations

import pytest

from mcad.model.disclosure import ANOTHER, held_behind_preemptor, listed, named


def test_named_keeps_the_readers_own_and_hides_the_rest() -> None:
    assert named("team-a/x", "team-a") == "team-a/x"
    assert named("secret/x", "team-a") == ANOTHER == "an AppWrapper in another namespace"
    assert named("team-a-b/x", "team-a") == ANOTHER, "a namespace that merely starts with the reader's is another"


@pytest.mark.parametrize(("keys", "said"), [
    (["a/x"], "a/x"),
    (["a/y", "a/x"], "a/x, a/y"),
    (["b/x"], "an AppWrapper in another namespace"),
    (["b/x", "c/y", "c/z"], "3 AppWrappers in other namespaces"),
    (["a/x", "b/x"], "a/x and an AppWrapper in another namespace"),
    (["a/x", "a/y", "b/x", "c/x"], "a/x, a/y and 2 AppWrappers in other namespaces"),
])
def test_listed_names_own_keys_and_counts_the_others(keys: list[str], said: str) -> None:
    assert listed(keys, "a") == said


def test_listed_words_pods_too() -> None:
    assert listed(["b/p-0"], "a", noun="pod") == "a pod in another namespace"


def test_held_behind_a_preemptor() -> None:
    assert held_behind_preemptor("a/high", "a").startswith("held behind a/high, which is preempting")
    assert "b/" not in held_behind_preemptor("b/high", "a")
