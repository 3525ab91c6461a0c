"""A gang's home (``mcad.model.fit.Homes``), the domain of its required topology level it was dispatched into, is
written only by ``Targets.dispatched``: a fit, whether it fits or not, leaves the homes as they were. Once
dispatched, the gang goes back to its home while that still holds it, though another domain now fits better. The
home belongs to one AppWrapper (its uid) and one required level; the homes are bounded, the last dispatched kept."""

from __future__ import annotations

import dataclasses

from mcad.api.appwrapper import AppWrapperView
from mcad.api.views import node_view
from mcad.model.accounting import Accountant, Snapshot
from mcad.model.fit import Fit, Homes, SingleCluster, fits
from test.unit.nodes_and_pods import raw_node, running, v
from test.unit.test_fit import appwrapper

RACK = "example.com/rack"


def racked_cluster(**racks: tuple[str, str]) -> Accountant:
    """Nodes by name: (rack, cpu)."""
    acc = Accountant()
    for name, (rack, cpu) in racks.items():
        raw = raw_node(name, cpu)
        raw["metadata"]["labels"] = {RACK: rack}
        acc.observe_node(node_view(raw))
    return acc


def in_rack(aw: AppWrapperView, level: str = RACK) -> AppWrapperView:
    return dataclasses.replace(aw, topology_required=level)


def domain_of(fit: Fit, snapshot: Snapshot) -> set[str]:
    racks = {node.name: node.labels[RACK] for node in snapshot.nodes}
    return {racks[name] for name, _, _ in fit.plan}


def test_fits_leave_no_home_whether_they_fit_or_not_and_a_dispatch_records_one() -> None:
    targets = SingleCluster()
    acc = racked_cluster(a0=("rack-a", "4"), b0=("rack-b", "8"))
    aw = in_rack(appwrapper("g", 1, "3"))
    snap = acc.snapshot(by_nodes=True)
    short = fits(aw, v(cpu=13000), snap, targets)  # its pods pack; more than the free total is needed
    assert not short.fits and len(targets.homes) == 0
    fit = fits(aw, aw.demand, snap, targets)
    assert fit.fits and fit.domain == "rack-a" and domain_of(fit, snap) == {"rack-a"}  # 1 cpu left, not 5
    assert len(targets.homes) == 0, "a fit remembers nothing"
    # Another pod takes 5 cpu of b0: rack-b now fits it best (none left).
    acc.observe_pod(running("busy", node_name="b0", cpu="5"))
    assert fits(aw, aw.demand, acc.snapshot(by_nodes=True), targets).domain == "rack-b"
    targets.dispatched(aw, fit)  # it was dispatched into rack-a
    again = fits(aw, aw.demand, acc.snapshot(by_nodes=True), targets)
    assert again.domain == "rack-a", "back to its home, which still holds it"
    acc.observe_pod(running("busy-a", node_name="a0", cpu="2"))
    assert fits(aw, aw.demand, acc.snapshot(by_nodes=True), targets).domain == "rack-b", "home full: best fit"
    targets.forget(aw.key)
    assert len(targets.homes) == 0


def test_a_home_is_one_appwrappers_for_one_level() -> None:
    homes = Homes()
    aw = in_rack(appwrapper("g", 1, "1"))
    homes.record(aw, Fit(True, domain="rack-a"))
    home = homes.of(aw)
    assert home is not None and (home.cluster, home.domain) == ("", "rack-a")
    assert homes.of(dataclasses.replace(aw, uid="uid-other")) is None, "re-created under the same name"
    assert homes.of(in_rack(aw, "example.com/block")) is None, "its required level changed"
    homes.record(aw, Fit(True))  # dispatched with no plan (its pods existed already): the home stays
    assert homes.of(aw) == home
    homes.record(appwrapper("plain", 1, "1"), Fit(True, domain="x"))  # requires no level: nothing to remember
    assert len(homes) == 1


def test_the_homes_are_bounded_keeping_the_last_dispatched() -> None:
    homes = Homes(size=2)
    gangs = [in_rack(appwrapper(f"g{i}", 1, "1")) for i in range(3)]
    for aw in gangs[:2]:
        homes.record(aw, Fit(True, domain="rack-a"))
    assert homes.of(gangs[0]) is not None  # reading changes no order
    homes.record(gangs[2], Fit(True, domain="rack-b"))
    assert len(homes) == 2 and homes.of(gangs[0]) is None
    assert homes.of(gangs[1]) is not None and homes.of(gangs[2]) is not None
