"""A dispatch takes its AppWrapper's templates from the informer's cache (``mcad.k8s.templates.TemplatesFirst``)
when it holds that AppWrapper, and reads the AppWrapper otherwise; items of another generation or uid than the one
decided about make the dispatch stale, as a read of them from the API server does."""

from __future__ import annotations

from typing import Any

from mcad.k8s.templates import Templates, TemplatesFirst, object_key
from test.component.harness import RecordingWriter, aw, node


def key(name: str) -> tuple[str, str, str]:
    return object_key("workload.codeflare.dev/v1beta1", "ns", name)


def test_a_dispatch_found_in_the_cache_reads_nothing(harness_factory: Any) -> None:
    templates = Templates()
    writer = RecordingWriter()
    first, second = aw("a", "1"), aw("b", "1")
    templates.keep(key("a"), "uid-a", 1, first)
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[first, second], writer=writer,
                        write_through=TemplatesFirst(writer, templates))
    h.drain()
    assert sorted(writer.applied) == ["a-cm", "b-cm"]
    assert writer.reads == 1  # b's: not in the cache
    assert templates.size == (0, 0)  # a's taken


def test_items_of_another_generation_make_the_dispatch_stale(harness_factory: Any) -> None:
    templates = Templates()
    writer = RecordingWriter()
    templates.keep(key("a"), "uid-a", 2, aw("a", "1"))  # the informer has seen generation 2 by now
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[aw("a", "1")], writer=writer,
                        write_through=TemplatesFirst(writer, templates))
    h.drain()
    assert writer.applied == []  # decided about generation 1: decided again after a backoff
    assert writer.reads == 0
