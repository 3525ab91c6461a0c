"""The node label keys admission warns with, kept from a real informer's events over a fake API: what nodes come,
change and go says, relists included; no answer before the first list, past the bound on keys, or while the counts
are held."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from mcad.api.views import NodeView, node_view
from mcad.k8s.informer import Informer
from mcad.k8s.nodelabels import NodeLabelKeys
from test.fakes import FakeListerWatcher, settle, wait_informed

RACK = "topology.example.com/rack"
BLOCK = "topology.example.com/block"


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def rack(name: str, value: str, **more: str) -> dict[str, Any]:
    return node(name, **{RACK: value, **more})


@pytest.fixture
def fake() -> FakeListerWatcher:
    return FakeListerWatcher()


@pytest.fixture
def informers() -> Iterator[list[Informer[NodeView]]]:
    started: list[Informer[NodeView]] = []
    yield started
    for informer in started:
        informer.stop()


def watched(fake: FakeListerWatcher, informers: list[Informer[NodeView]], **kwargs: Any) -> NodeLabelKeys:
    informer: Informer[NodeView] = Informer("nodes", fake, transform=node_view, rng=random.Random(7),
                                            watch_timeout=(5, 10))
    keys = NodeLabelKeys(**kwargs)
    keys.watch(informer)
    informer.start()
    informers.append(informer)
    fake.wait_for_watches(1)
    return keys


def test_a_key_counts_while_one_node_carries_it(fake: FakeListerWatcher,
                                                 informers: list[Informer[NodeView]]) -> None:
    fake.add_silently(rack("a0", "rack-a"))
    keys = watched(fake, informers)
    assert keys.carried(RACK) is True
    assert keys.carried(BLOCK) is False
    fake.add(rack("a1", "rack-a", **{BLOCK: "b1"}))
    settle([fake])
    assert keys.carried(BLOCK) is True
    # a1 loses the block label (its rack label stays): nobody carries block any more, rack still counts.
    fake.modify(rack("a1", "rack-a"))
    settle([fake])
    assert keys.carried(BLOCK) is False
    fake.delete("a1")
    settle([fake])
    assert keys.carried(RACK) is True  # a0 still has it
    fake.delete("a0")
    settle([fake])
    assert keys.carried(RACK) is False


def test_changes_seen_only_by_a_relist_count_too(fake: FakeListerWatcher,
                                                  informers: list[Informer[NodeView]]) -> None:
    fake.add_silently(rack("a0", "rack-a"))
    fake.add_silently(node("n1", **{BLOCK: "b1"}))
    keys = watched(fake, informers)
    assert keys.carried(BLOCK) is True
    # While the watch is away: n1 is relabelled and a0 goes; the 410 that follows makes the informer relist.
    fake.modify_silently(node("n1", **{RACK: "rack-b"}))
    fake.delete_silently("a0")
    fake.send_error(410)
    wait_informed(lambda: keys.carried(BLOCK) is False, what="the relist to drop the block label")
    assert keys.carried(RACK) is True


def test_nothing_is_said_before_the_first_list(fake: FakeListerWatcher) -> None:
    informer: Informer[NodeView] = Informer("nodes", fake, transform=node_view)
    keys = NodeLabelKeys()
    keys.watch(informer)
    assert keys.carried(RACK) is None  # never started: not synced


def test_past_the_bound_on_keys_nothing_is_said_any_more(fake: FakeListerWatcher,
                                                         informers: list[Informer[NodeView]]) -> None:
    fake.add_silently(node("n0", a="1", b="2"))
    keys = watched(fake, informers, max_keys=3)
    assert keys.carried("a") is True and keys.carried("c") is False
    fake.add(node("n1", c="3", d="4"))  # a fourth distinct key
    settle([fake])
    assert keys.carried("a") is None and keys.carried("c") is None
    # Nodes leaving does not bring it back: what it dropped cannot be rebuilt from later events alone.
    fake.delete("n1")
    settle([fake])
    assert keys.carried("a") is None


def test_a_reader_does_not_wait_while_the_counts_are_held(fake: FakeListerWatcher,
                                                          informers: list[Informer[NodeView]]) -> None:
    fake.add_silently(rack("a0", "rack-a"))
    keys = watched(fake, informers, lock_wait=0)
    assert keys.carried(RACK) is True
    with keys._lock:  # as the informer's thread holds them while it counts an event
        assert keys.carried(RACK) is None
