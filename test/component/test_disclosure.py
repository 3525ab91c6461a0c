"""What an AppWrapper's status, Events and explain say about other AppWrappers (mcad.model.disclosure), stepped key by
key: another namespace's AppWrapper is never named, nor the nodes or pods it holds, while one of the reader's own
namespace is. The secret project's AppWrapper is ``secret-project/acquisition-x`` on nodes ``n-secret-*``: none
of those words may reach a tenant of ``team-a``."""

from __future__ import annotations

from typing import Any

from mcad.serve.debug import Reports
from test.component.harness import Harness, gang_aw, node, pod
from test.component.test_observability import RecordingSink
from test.component.test_tenancy import in_namespace
from test.fakes import wait_informed

SECRETS = ("secret-project", "acquisition-x", "n-secret")


def add(h: Harness, raw: dict[str, Any]) -> None:
    h.lw["aw"].add(raw)
    key = f"{raw['metadata']['namespace']}/{raw['metadata']['name']}"
    wait_informed(lambda: h.dispatcher.appwrappers.get(key), 5, f"the informer to see {key}")
    h.drain()


def delete(h: Harness, key: str) -> None:
    h.lw["aw"].delete(key)
    wait_informed(lambda: h.dispatcher.appwrappers.get(key) is None, 5, f"the informer to drop {key}")
    h.drain()


def messages_of(h: Harness, sink: RecordingSink, name: str) -> list[str]:
    """Every status message and condition message written for ``name``, and every Event message about it."""
    out = [status.get("message", "") for n, status in h.writer.statuses if n == name]
    out += [c.get("message", "") for n, status in h.writer.statuses if n == name
            for c in status.get("conditions") or []]
    out += [message for n, _, _, message in sink.events if n == name]
    return [m for m in out if m]


def leaks(texts: list[str]) -> list[str]:
    return [text for text in texts if any(secret in text for secret in SECRETS)]


def explained(h: Harness, namespace: str, name: str) -> str:
    doc = Reports(h.dispatcher.view, lambda: {"identity": "test", "leader": True}).explain(namespace, name)
    assert doc is not None
    return " ".join([doc["summary"], *doc["details"]])


def test_a_reservation_of_another_namespace_is_not_named_nor_its_nodes(harness_factory: Any) -> None:
    # Two nodes full of team-a's small AppWrappers; the secret gang needs both empty and reserves them; team-a's
    # next small one waits behind that reservation.
    sink = RecordingSink()
    h = harness_factory(nodes=[node("n-secret-0", "2"), node("n-secret-1", "2")], pods=[], aws=[], recorder=sink)
    for i in range(4):
        add(h, in_namespace(gang_aw(f"small-{i}", 1, {"cpu": "1"}), "team-a"))
    add(h, in_namespace(gang_aw("acquisition-x", 2, {"cpu": "2"}, priority=10), "secret-project"))
    add(h, in_namespace(gang_aw("mine", 2, {"cpu": "2"}, priority=10), "team-a"))  # behind it, same priority
    delete(h, "team-a/small-0")  # room frees on one node: the reservation keeps it for the gang
    add(h, in_namespace(gang_aw("late", 1, {"cpu": "1"}), "team-a"))

    told = messages_of(h, sink, "late")
    assert any("waiting behind the reservation of an AppWrapper in another namespace" in m for m in told), told
    assert leaks(told) == [], "the reservation's holder and nodes are another namespace's business"
    assert leaks(messages_of(h, sink, "mine")) == []
    why = explained(h, "team-a", "late")
    assert "waiting behind the reservation of an AppWrapper in another namespace" in why, why
    assert not leaks([why]), why
    # The cluster-wide list still names the holder (for those who may list its namespace: mcad.serve.server filters).
    queue = Reports(h.dispatcher.view, lambda: {}).queue()
    assert "secret-project/acquisition-x" in [r["appwrapper"] for r in queue["reservations"]]

    # The same wait behind a reservation of the reader's own namespace names it and its nodes.
    delete(h, "secret-project/acquisition-x")
    add(h, in_namespace(gang_aw("late-2", 1, {"cpu": "1"}), "team-a"))
    own = messages_of(h, sink, "late-2")
    assert any("waiting behind the reservation of team-a/mine on nodes n-secret-0, n-secret-1" in m
               for m in own), own


def _running(h: Harness, namespace: str, name: str, cpu: str) -> None:
    raw = pod(f"{name}-0", cpu, appwrapper=name)
    raw["metadata"]["namespace"] = namespace
    raw["metadata"]["uid"] = f"uid-{namespace}-{name}-0"
    h.lw["pod"].add(raw)
    wait_informed(lambda: h.dispatcher.pods.get(f"uid-{namespace}-{name}-0"), 5, "the pod")
    h.drain()


def test_preemption_across_namespaces_names_neither_side_to_the_other(harness_factory: Any) -> None:
    sink = RecordingSink()
    # 5 cpu: the two low ones take 4; the high one needs all 5, so both go; 1 cpu stays free meanwhile.
    h = harness_factory(nodes=[node("n0", "5")], pods=[], aws=[], preemption=True, recorder=sink)
    add(h, in_namespace(gang_aw("low-mine", 1, {"cpu": "2"}), "team-a"))
    h.clock.advance(10)
    add(h, in_namespace(gang_aw("acquisition-x", 1, {"cpu": "2"}), "secret-project"))
    _running(h, "team-a", "low-mine", "2")
    _running(h, "secret-project", "acquisition-x", "2")
    add(h, in_namespace(gang_aw("high", 1, {"cpu": "5"}, priority=5), "team-a"))
    add(h, in_namespace(gang_aw("waiter", 1, {"cpu": "1"}), "team-a"))  # fits the free cpu, held behind the preemptor

    high = messages_of(h, sink, "high")
    # Why these victims: how many, and the work lost in the reader's own namespace only (low-mine ran 10 s on 2
    # cpu; acquisition-x, just dispatched, lost none, and its size and age are not told to team-a).
    assert any("preempting 2 lower-priority AppWrapper(s) to make room, losing the least work (0.0056 CPU-hours of "
               "it in this namespace): team-a/low-mine and an AppWrapper in another namespace" in m for m in high), high
    assert leaks(high) == []
    assert "Preempted by AppWrapper team-a/high (priority 5); chosen for the least work lost: 2 AppWrapper(s), " \
        "0.0056 CPU-hours of it in this namespace." in messages_of(h, sink, "low-mine")
    victim = messages_of(h, sink, "acquisition-x")
    assert "Preempted by an AppWrapper in another namespace (priority 5); chosen for the least work lost: 2 " \
        "AppWrapper(s), 0 CPU-hours of it in this namespace." in victim, victim
    assert not any("team-a" in m for m in victim), "the victim is not told who preempted it either"
    waiter = messages_of(h, sink, "waiter")
    assert any("held behind team-a/high, which is preempting" in m for m in waiter), waiter

    # A tenant of the secret project queued behind team-a's preemptor is not told its name.
    add(h, in_namespace(gang_aw("other-waiter", 1, {"cpu": "1"}), "secret-project"))
    behind = messages_of(h, sink, "other-waiter")
    assert any("held behind an AppWrapper in another namespace, which is preempting" in m for m in behind), behind
    assert not any("team-a" in m for m in behind)
    assert "team-a" not in explained(h, "secret-project", "other-waiter")
    why_high = explained(h, "team-a", "high")
    assert "an AppWrapper in another namespace" in why_high and not leaks([why_high]), why_high
