"""A dispatched AppWrapper whose wrapped kind is still being discovered: the dispatcher does not poll for it, and it
is visited again, through ``on_change``, once the kind's discovery has answered (stepped, fake clock)."""

from __future__ import annotations

from typing import Any

from mcad.api.wrappedview import WrappedView, wrapped_view
from mcad.errors import ApiError
from mcad.k8s.informer import Informer
from mcad.k8s.wrapped import WrappedObjects
from mcad.model.keys import AppWrapperEvent, Publish
from test.component.harness import aw, last_status, node
from test.fakes import FakeClock, FakeListerWatcher, wait_informed
from test.support import wait_until


def completing_aw(name: str) -> dict[str, Any]:
    raw = aw(name, "1")
    raw["spec"]["resources"]["GenericItems"][0]["completionstatus"] = "Complete"
    return raw


def configmap(name: str, *, complete: bool) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True"}] if complete else []
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": {"workload.codeflare.dev/appwrapper": "a"},
                         "ownerReferences": [{"uid": "uid-a", "controller": True}]},
            "status": {"conditions": conditions}}


def test_an_appwrapper_waiting_on_discovery_is_not_polled_and_is_woken_by_the_answer(harness_factory: Any) -> None:
    objects = FakeListerWatcher()
    objects.add(configmap("a-cm", complete=True))
    watched: Informer[WrappedView] = Informer("wrapped-configmap", objects, transform=wrapped_view)
    answers: list[Any] = [ApiError(503, "ServiceUnavailable", "discovery is down"), watched]
    asked: list[tuple[str, str]] = []

    def factory(api_version: str, kind: str) -> Any:
        asked.append((api_version, kind))
        answer = answers.pop(0)
        if isinstance(answer, ApiError):
            raise answer
        return answer

    wake: list[Any] = []  # the dispatcher's queue, once the harness has built it
    discovery_clock = FakeClock()
    wrapped = WrappedObjects(factory, lambda key: wake[0].add(AppWrapperEvent(key)), clock=discovery_clock,
                             background=False)
    h = harness_factory(nodes=[node("n0", "8")], pods=[], aws=[completing_aw("a")], wrapped=wrapped)
    wake.append(h.dispatcher.queue)
    try:
        h.drain()
        assert last_status(h, "a")["state"] == "Running"
        wait_informed(lambda: h.informers[0].resource_version == h.lw["aw"].resource_version or None, 5,
                   "the Running status' own event")
        h.drain()  # that event: the AppWrapper's lifecycle is followed, and its kind is asked about
        assert asked == [], "the dispatcher thread asked the API server nothing"
        h.clock.advance(1.0)  # well past the 0.2 s poll there was, before any other timer of the dispatcher
        assert next_work(h) is None, "nothing polls the AppWrapper while its kind is unknown"

        assert wrapped.discover_next() is True
        assert asked == [("v1", "ConfigMap")]
        assert next_work(h) is None, "a failed discovery is no answer: nobody woken"
        discovery_clock.advance(0.5)
        assert wrapped.discover_next() is True
        # Woken by the ConfigMap's ADDED event (the informer's first list) and, once it has synced, as a waiter:
        # whichever visit comes after the sync reads the ConfigMap's condition. The ConfigMap reports Complete and
        # the pod it declares has not run yet, so the AppWrapper holds: read without any polling.
        wait_until(lambda: (h.dispatcher.process_next(timeout=0.1) == AppWrapperEvent("ns/a")
                            and last_status(h, "a")["state"] == "RunningHoldCompletion") or None, 5,
                   "the AppWrapper woken and its wrapped object read, once the kind has synced")
    finally:
        wrapped.stop()


def next_work(h: Any) -> Any:
    """The next key the dispatcher processes now, leaving out its own Publish (its state for metrics: no poll)."""
    while isinstance(key := h.dispatcher.process_next(timeout=0), Publish):
        pass
    return key
