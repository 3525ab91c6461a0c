"""The informer's cache of AppWrapper templates (mcad.k8s.templates): what a dispatch finds there, and its bounds."""

from __future__ import annotations

import json
from typing import Any

from mcad.k8s.templates import ENTRY_OVERHEAD, Templates, object_key
from test.fakes import FakeClock


def key(name: str) -> tuple[str, str, str]:
    return object_key("workload.codeflare.dev/v1beta1", "ns", name)


def raw(name: str, *, pad: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [
                {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {"name": f"{name}-cm"}, "data": {"pad": "x" * pad, "é": "😀"}}},
                "not an object"]}}}


def test_items_are_taken_once_with_their_uid_and_generation() -> None:
    templates = Templates()
    templates.keep(key("a"), "u1", 3, raw("a"))
    assert templates.take(key("b")) is None
    assert templates.take(object_key("mcad.ibm.com/v1beta1", "ns", "a")) is None  # the legacy kind's namesake
    assert templates.take(key("a")) == ("u1", 3, [raw("a")["spec"]["resources"]["GenericItems"][0], {}])
    assert templates.take(key("a")) is None  # taken: the next dispatch of it reads the API server
    assert templates.size == (0, 0)


def test_taken_items_are_the_callers_to_change() -> None:
    templates = Templates()
    source = raw("a")
    templates.keep(key("a"), "u1", 1, source)
    found = templates.take(key("a"))
    assert found is not None
    items = found[2]
    items[0]["generictemplate"]["metadata"]["name"] = "changed"  # type: ignore[index]
    assert source["spec"]["resources"]["GenericItems"][0]["generictemplate"]["metadata"]["name"] == "a-cm"


def test_a_new_generation_or_a_forget_drops_what_was_kept() -> None:
    templates = Templates()
    templates.keep(key("a"), "u1", 1, raw("a"))
    templates.keep(key("a"), "u1", 2, raw("b"))
    assert templates.take(key("a")) == ("u1", 2, [raw("b")["spec"]["resources"]["GenericItems"][0], {}])
    templates.keep(key("c"), "u2", 1, raw("c"))
    templates.forget(key("c"), "another uid")  # a namesake deleted: this one's items stay
    templates.forget(key("c"), "u2")
    assert templates.take(key("c")) is None
    # A new generation too large to keep still drops the old one: a dispatch of the old one must read, and find it
    # stale.
    small = Templates(max_item_bytes=400)
    small.keep(key("d"), "u3", 1, raw("d"))
    small.keep(key("d"), "u3", 2, raw("d", pad=1000))
    assert small.size == (0, 0)


def test_nothing_without_items_or_too_large_is_kept() -> None:
    templates = Templates(max_item_bytes=1000)
    templates.keep(key("a"), "u1", 1, {"spec": {}})
    templates.keep(key("b"), "u2", 1, {"spec": {"resources": {"GenericItems": "no list"}}})
    templates.keep(key("c"), "u3", 1, raw("big", pad=1000))
    templates.keep(key("d"), "", 1, raw("no uid"))
    assert templates.size == (0, 0)


def test_the_bounds_hold_over_100000_appwrappers_and_the_oldest_are_kept() -> None:
    clock = FakeClock()
    templates = Templates(max_bytes=1024 * 1024, max_entries=2000, clock=clock.monotonic)
    items = raw("aw-00000")["spec"]["resources"]["GenericItems"]
    cost = len(json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode()) + ENTRY_OVERHEAD
    for i in range(100_000):
        templates.keep(key(f"aw-{i:05d}"), f"u{i}", 1, raw(f"aw-{i:05d}"))
        entries, counted = templates.size
        assert entries <= 2000 and counted <= 1024 * 1024
    assert templates.size == (min(2000, 1024 * 1024 // cost), min(2000, 1024 * 1024 // cost) * cost)
    assert templates.take(key("aw-00000")) is not None  # the first come are served first: they are the ones kept
    assert templates.take(key("aw-99999")) is None
    bytes_bound = Templates(max_bytes=10 * cost, clock=clock.monotonic)
    for i in range(100):
        bytes_bound.keep(key(f"aw-{i:05d}"), f"u{i}", 1, raw(f"aw-{i:05d}"))
    assert bytes_bound.size == (10, 10 * cost)


def test_when_full_an_entry_kept_long_enough_makes_room() -> None:
    clock = FakeClock()
    templates = Templates(max_entries=2, stale_after=300.0, clock=clock.monotonic)
    templates.keep(key("a"), "u1", 1, raw("a"))
    clock.advance(100)
    templates.keep(key("b"), "u2", 1, raw("b"))
    templates.keep(key("c"), "u3", 1, raw("c"))  # full, and the oldest was kept 100 s ago: not kept
    assert templates.take(key("c")) is None
    clock.advance(200)
    templates.keep(key("c"), "u3", 1, raw("c"))  # the oldest is 300 s old now: it makes room
    assert templates.take(key("a")) is None
    assert templates.take(key("b")) is not None
    assert templates.take(key("c")) is not None
