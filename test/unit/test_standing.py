"""Where a reader stands (mcad.model.standing): what is ahead of its AppWrappers and its fair-share usage, with other
namespaces and tenants counted, never named."""

from __future__ import annotations

import json

from mcad.model.standing import MAX_AHEAD, MAX_LISTED, FairTable, FairUsage, ahead, off


def orders(*keys: str) -> list[tuple[int, str, str]]:
    return [(0, f"2024-01-01T00:00:{i:02d}Z", key) for i, key in enumerate(keys)]


def per_namespace(queue: list[tuple[int, str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, _, key in queue:
        namespace = key.partition("/")[0]
        counts[namespace] = counts.get(namespace, 0) + 1
    return counts


QUEUE = orders("secret-x/a", "secret-y/b", "secret-x/c", "mine/first", "secret-z/d", "mine/second", "ours/one")


def test_others_ahead_are_counts_by_namespace_without_names() -> None:
    told = ahead(QUEUE, {"mine"}, frozenset({"mine"}), per_namespace(QUEUE))
    assert told == [{"namespace": "mine", "name": "first", "position": 4, "ahead": 3, "named": {},
                     "others": {"appwrappers": 3, "namespaces": 2, "counts": [2, 1]}}]
    assert "secret" not in json.dumps(told)


def test_namespaces_the_reader_may_list_are_named_and_each_gets_its_first() -> None:
    told = ahead(QUEUE, ["ours", "mine"], frozenset({"mine", "ours"}), per_namespace(QUEUE))
    assert [(t["namespace"], t["name"], t["position"]) for t in told] == [("mine", "first", 4), ("ours", "one", 7)]
    assert told[1]["named"] == {"mine": 2}
    assert told[1]["others"] == {"appwrappers": 4, "namespaces": 3, "counts": [2, 1, 1]}
    assert "secret" not in json.dumps(told)


def test_a_reader_of_every_name_sees_them_all() -> None:
    told = ahead(QUEUE, {"mine"}, None, per_namespace(QUEUE))
    assert told[0]["named"] == {"secret-x": 2, "secret-y": 1}
    assert told[0]["others"] == {"appwrappers": 0, "namespaces": 0, "counts": []}


def test_none_queued_none_told_and_the_walk_stops_at_the_last_first_one() -> None:
    assert ahead(QUEUE, {"elsewhere"}, frozenset({"elsewhere"}), per_namespace(QUEUE)) == []

    class Counted(list):  # type: ignore[type-arg]
        read = 0

        def __iter__(self):  # type: ignore[no-untyped-def]
            for item in super().__iter__():
                Counted.read += 1
                yield item

    long = Counted(orders("x/a", "mine/a", *(f"y/{i}" for i in range(1000))))
    ahead(long, {"mine"}, frozenset({"mine"}), {"mine": 1, "x": 1, "y": 1000})
    assert Counted.read == 2, "nothing past the reader's first one is read"


def test_bounded_namespaces_and_counts() -> None:
    many = orders(*(f"other-{i:03d}/a" for i in range(100)), *(f"mine-{i:02d}/a" for i in range(MAX_AHEAD + 5)))
    mine = {f"mine-{i:02d}" for i in range(MAX_AHEAD + 5)}
    told = ahead(many, mine, frozenset(mine), per_namespace(many))
    assert len(told) == MAX_AHEAD
    assert told[0]["others"]["namespaces"] == 100 and len(told[0]["others"]["counts"]) == MAX_LISTED
    everyone = ahead(many, {"mine-00"}, None, per_namespace(many))[0]
    assert len(everyone["named"]) == MAX_LISTED and everyone["others"]["appwrappers"] == 100 - MAX_LISTED


USAGE = FairUsage(3600.0, {"namespace:mine": 10.0, "namespace:secret-a": 30.0, "quota:tree/secret-node": 60.0,
                           "quota:tree/shared": 0.0, "namespace:secret-b": 0.0},
                  {"quota:tree/secret-node": frozenset({"secret-a"}), "quota:tree/shared": frozenset({"mine", "x"})})


def test_fair_share_names_only_the_readers_tenants() -> None:
    told = FairTable(USAGE).told(frozenset({"mine"}))
    assert told["enabled"] is True and told["halfLifeSeconds"] == 3600.0 and told["tenants"] == 5
    assert told["named"] == [{"tenant": "quota:tree/shared", "usage": 0.0, "fraction": 0.0, "rank": 1},
                             {"tenant": "namespace:mine", "usage": 10.0, "fraction": 0.1, "rank": 3}]
    assert told["others"] == {"tenants": 3, "leastFraction": 0.0, "medianFraction": 0.3, "mostFraction": 0.6}
    assert "secret" not in json.dumps(told)


def test_fair_share_for_a_cluster_wide_reader_and_when_off() -> None:
    told = FairTable(USAGE).told(None)
    assert [t["tenant"] for t in told["named"]] == ["namespace:secret-b", "quota:tree/shared", "namespace:mine",
                                                    "namespace:secret-a", "quota:tree/secret-node"]
    assert [t["rank"] for t in told["named"]] == [1, 1, 3, 4, 5], "ties share a rank"
    assert told["others"]["tenants"] == 0 and told["others"]["medianFraction"] is None
    empty = FairTable(FairUsage(60.0, {})).told(frozenset({"mine"}))
    assert empty["named"] == [] and empty["tenants"] == 0
    assert off() == {"enabled": False}
