"""A gang that requires a topology level has a home, the domain it was dispatched into, only once the dispatch cycle
dispatched it: a dry run (explain) and a fit that does not dispatch (a gang that waits behind a reservation, whose
what-if fits it elsewhere) leave it none, so when it goes it is placed best fit; in hub mode a reset gang goes back
to the worker and domain it ran in when they still hold it, else it is placed as a fresh gang.

Nodes are labelled with ``topology.example.com/rack`` (hub mode: ``example.com/rack``, per worker)."""

from __future__ import annotations

from typing import Any

from mcad.api import faulttolerance
from mcad.hub.placement import Policy
from mcad.model import keys
from mcad.model.keys import AppWrapperEvent
from test.component.harness import gang_aw, pod
from test.component.test_hub_placement import gang, hub_harness, in_one_rack, racked, worker_pod  # noqa: F401
from test.component.test_topology_required import in_rack, plan_nodes
from test.component.test_topology_required import racked as racked_node
from test.fakes import settle


def informed(h: Any) -> None:
    """Every change made so far handled by the informers, no key processed."""
    settle(informer._lw for informer in h.informers)


def step_until(h: Any, key: object) -> None:
    """Process keys, in order, until ``key`` was."""
    for _ in range(100):
        if h.dispatcher.process_next(timeout=0) == key:
            return
    raise AssertionError(f"{key!r} was never processed")


def test_explain_gives_a_queued_gang_no_home(harness_factory: Any) -> None:
    # When explain runs, a 3-cpu gang fits rack-a best (1 cpu left; rack-b would leave 5). Before the cycle runs, a
    # pod takes 5 cpu of b0: rack-b then leaves none, rack-a still 1, and the cycle places it best fit, in rack-b.
    # Had explain remembered rack-a as its home, the gang would go there.
    nodes = [racked_node("a0", "4", "rack-a"), racked_node("b0", "8", "rack-b")]
    h = harness_factory(nodes=nodes, pods=[], aws=[])
    h.drain()
    h.lw["aw"].add(in_rack(gang_aw("g", 1, {"cpu": "3"})))
    informed(h)
    step_until(h, AppWrapperEvent("ns/g"))  # queued; the cycle it asked for has not run
    told = h.dispatcher.view.assess_queue().of("ns/g")
    assert told is not None and told.fits_now, told
    assert "ns/g" not in h.dispatcher.owners.active.views
    h.lw["pod"].add(pod("busy", "5", node_name="b0"))
    informed(h)
    h.dispatcher.process(keys.PodEvent("uid-busy"))  # counted before the cycle that is due
    h.drain()
    assert plan_nodes(h, "ns/g") == {"b0"}, "placed best fit, not in the rack explain saw"


def test_a_gang_that_waited_behind_a_reservation_has_no_home_from_its_what_if(harness_factory: Any) -> None:
    # on-a and on-b run 2 cpu each, on a0 and b0. "big" (6 cpu, one rack) fits only b0: it reserves rack-b. "g"
    # (3 cpu, one rack) fits neither a0 (2 free) nor b0 (reserved); without the reservation it would fit rack-b,
    # the what-if that says why it waits, in the cycle as in explain. Then big is deleted and on-a ends together:
    # a0 and b0 have 4 free each, a tie that best fit takes by value, rack-a. Had the what-if remembered rack-b as
    # g's home, g would go there.
    nodes = [racked_node("a0", "4", "rack-a"), racked_node("b0", "6", "rack-b")]
    h = harness_factory(nodes=nodes, pods=[], reservations=1,
                        aws=[gang_aw("on-a", 1, {"cpu": "2"}), gang_aw("on-b", 1, {"cpu": "2"})])
    h.drain()
    h.lw["pod"].add(pod("on-a-0", "2", appwrapper="on-a", node_name="a0"))
    h.lw["pod"].add(pod("on-b-0", "2", appwrapper="on-b", node_name="b0"))
    h.drain()
    h.lw["aw"].add(in_rack(gang_aw("big", 1, {"cpu": "6"})))
    h.drain()
    h.lw["aw"].add(in_rack(gang_aw("g", 1, {"cpu": "3"})))
    h.drain()
    [held] = h.dispatcher.owners.reservations.held.values()
    assert held.key == "ns/big" and held.nodes == ("b0",), held
    told = h.dispatcher.view.assess_queue().of("ns/g")
    assert told is not None and not told.fits_now and "ns/big" in told.why, told
    h.lw["aw"].delete("ns/big")
    h.lw["pod"].delete("ns/on-a-0")
    h.lw["aw"].delete("ns/on-a")
    h.drain()
    assert plan_nodes(h, "ns/g") == {"a0"}, "placed best fit, not where the what-if fitted it"


def test_the_home_is_forgotten_when_the_appwrapper_is_deleted(harness_factory: Any) -> None:
    nodes = [racked_node("a0", "4", "rack-a"), racked_node("b0", "8", "rack-b")]
    h = harness_factory(nodes=nodes, pods=[], aws=[in_rack(gang_aw("g", 1, {"cpu": "3"}))])
    h.drain()
    homes = h.dispatcher.owners.targets.homes
    assert plan_nodes(h, "ns/g") == {"a0"} and len(homes) == 1
    h.lw["aw"].delete("ns/g")
    h.drain()
    assert len(homes) == 0


# -- hub mode: the worker and the domain --------------------------------------------------------------------------

FAST_RESET = {faulttolerance.FAILURE_GRACE: "10s", faulttolerance.RETRY_PAUSE: "10s",
              faulttolerance.RETRY_LIMIT: "3"}  # the floors


def reset_in_worker(h: Any, name: str, node: str) -> None:
    """``name``'s pod fails in the worker (no controller re-creates it): after the failure grace the gang is
    reset; the failed pod goes, and when the retry pause ends the gang is queued and dispatched again."""
    failed = worker_pod(f"{name}-p", node, "0", appwrapper=name)
    failed["status"] = {"phase": "Failed"}
    h.add_pod(failed)
    h.clock.advance(10)
    h.drain()
    assert h.last_status(name)["state"] == "Pending" and h.last_status(name)["resettingCount"] == 1
    h.lw["pod"].delete(f"ns/{name}-p")
    h.drain()
    h.clock.advance(10)
    h.drain()
    assert h.last_status(name)["state"] == "Running", "dispatched again"


def hub_gang(name: str, cpu: str) -> dict[str, Any]:
    raw = in_one_rack(gang(name, 1, cpu))
    raw["metadata"]["annotations"].update(FAST_RESET)
    return raw


def gang_in_east(make: Any) -> Any:
    """Two workers with one rack each, east (one 4-cpu node) and west (8 cpu, 2 busy): a 3-cpu gang that requires a
    rack is dispatched best fit, into east (1/4 left, against west's 3/8)."""
    nodes = [racked("east/n0", "4", "rack-a"), racked("west/n0", "8", "rack-a")]
    h = make(workers=[("east", {}), ("west", {})], nodes=nodes, aws=[], policy=Policy.BEST,
                    pods=(worker_pod("w-1", "west/n0", "2"),))
    h.add_appwrapper(hub_gang("g", "3"))
    assert h.dispatcher.view.placed() == {"ns/g": "east"}
    return h


def test_hub_mode_a_reset_gang_goes_back_to_its_worker_and_rack(hub_harness: Any) -> None:  # noqa: F811
    # Best fit by the workers' whole free room: east (one 4-cpu node) would have 1/4 left, west (8 cpu, 2 busy) 3/8:
    # a 3-cpu gang goes to east. More work lands on west (4 of 8 busy): a fresh placement would now take west (1/8
    # left). One of the gang's pods fails, the gang is reset: it goes back to east's rack-a, which still holds it.
    h = gang_in_east(hub_harness)
    h.add_pod(worker_pod("w-2", "west/n0", "2"))
    reset_in_worker(h, "g", "east/n0")
    assert h.dispatcher.view.placed() == {"ns/g": "east"}, "back in its worker, though west fits best now"
    assert h.applied()["east"] == ["g-cm", "g-cm"] and h.applied()["west"] == []


def test_hub_mode_a_reset_gang_whose_home_is_full_is_placed_as_a_fresh_gang(hub_harness: Any) -> None:  # noqa: F811
    h = gang_in_east(hub_harness)
    h.add_pod(worker_pod("e-1", "east/n0", "2"))  # east's rack-a no longer holds it
    reset_in_worker(h, "g", "east/n0")
    assert h.dispatcher.view.placed() == {"ns/g": "west"}

