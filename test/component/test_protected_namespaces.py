"""Protected namespaces: an AppWrapper in one fails at once with the namespace named, nothing of it is created, and
it takes no place in the queue; whatever admission let through (the webhook may be bypassed or down)."""

from __future__ import annotations

from typing import Any

from mcad.cli.controller import protected_namespaces
from test.component.harness import aw, last_status, node
from test.fakes import wait_informed


def test_an_appwrapper_in_a_protected_namespace_fails_and_creates_nothing(harness_factory: Any) -> None:
    # Listed before the controller starts (its restart path, rebuild), and one created while it runs.
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("early", "1")],
                        protected_namespaces=frozenset({"ns"}))
    h.drain()
    h.lw["aw"].add(aw("late", "1"))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/late"), 5, "the new AppWrapper")
    h.drain()
    for name in ("early", "late"):
        status = last_status(h, name)
        assert status["state"] == "Failed", status
        failed = status["conditions"][-1]
        assert failed["reason"] == "ProtectedNamespace"
        assert failed["message"] == ("namespace ns is protected: mcad creates nothing there unless the controller "
                                     "runs with --allow-protected-namespace=ns")
    assert h.writer.applied == []
    assert h.dispatcher.owners.accountant.ledger.free().get("cpu") == 8000
    assert len(h.dispatcher.owners.queued.pending) == 0


def test_other_namespaces_dispatch_as_usual(harness_factory: Any) -> None:
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[aw("a", "1")],
                        protected_namespaces=frozenset({"kube-system"}))
    h.drain()
    assert h.writer.applied == ["a-cm"]


def test_the_kube_namespaces_and_the_controllers_are_protected_unless_allowed() -> None:
    kube_namespaces = {"kube-system", "kube-public", "kube-node-lease"}
    assert protected_namespaces("mcad-system") == {*kube_namespaces, "mcad-system"}
    assert protected_namespaces("ops", ("kube-system", "kube-public", "kube-node-lease")) == {"ops"}
    assert protected_namespaces("ops", ("kube-public",)) == {"kube-system", "kube-node-lease", "ops"}
    assert protected_namespaces("ops", hub=True) == {*kube_namespaces, "ops", "mcad-system"}
