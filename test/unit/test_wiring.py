"""The composition root: what ``mcad.wiring.build`` connects, and that building it starts nothing."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from mcad import wiring
from mcad.api.validation import Limits
from mcad.k8s import kube
from mcad.k8s.tenantstore import TenantAppWrappers
from mcad.settings import ApiSettings, SchedulingSettings
from test.support import unreachable_kubeconfig

PACKAGE = Path(wiring.__file__).parent


def test_building_the_dispatcher_starts_no_thread_and_starting_it_starts_the_write_pool(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    dispatcher, informers = wiring.build(kube.connect(str(unreachable_kubeconfig(tmp_path))),
                                         SchedulingSettings(write_workers=5),
                                         ApiSettings(legacy_api=True, quota_trees=True))
    assert set(threading.enumerate()) - before == set(), "informers, queue, wrapped objects and write pool wait"
    assert not any(i.has_synced() for i in informers), "no informer was started"

    dispatcher.start()  # over empty stores, as the controller's loop does once they have synced
    try:
        started = set(threading.enumerate()) - before
        assert sorted(t.name for t in started) == [f"mcad-write-{i}" for i in range(5)]
    finally:
        dispatcher.queue.shutdown()
        dispatcher.owners.writes.close()
    assert not any(t.is_alive() for t in started)


def test_controller_limits_reach_the_appwrapper_informers(tmp_path: Path) -> None:
    _, informers = wiring.build(kube.connect(str(unreachable_kubeconfig(tmp_path))),
                                api=ApiSettings(legacy_api=True, limits=Limits(max_items=1, max_bytes=4096)))
    raw = {"metadata": {"name": "a", "namespace": "n"}, "spec": {"resources": {"GenericItems": [
        {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}}} for n in "ab"]}}}
    for informer in informers[:2]:  # the current and the legacy group
        assert informer._transform(raw).demand_error == (
            "spec.resources.GenericItems has 2 items; at most 1 are allowed (--max-items)")


def test_the_dispatcher_reads_appwrappers_through_the_namespace_rules_with_the_default_ceiling(
        tmp_path: Path) -> None:
    dispatcher, informers = wiring.build(kube.connect(str(unreachable_kubeconfig(tmp_path))),
                                         api=ApiSettings(default_max_priority=7))
    assert isinstance(dispatcher.appwrappers, TenantAppWrappers)
    assert dispatcher.appwrappers.default_ceiling == 7
    assert {"namespaces", "priorityclasses"} <= {i.name for i in informers}, "started with the others"


def test_the_offline_debug_view_wires_through_mcad_wiring() -> None:
    """mcadctl --offline builds its dispatcher the way the controller does, not a copy of it, and hands its view to
    mcad.serve.debug's Reports. Who may import mcad.wiring (and mcad.cli) is a layer rule: test/unit/test_layers.py,
    the wiring and entry points rows."""
    tree = ast.parse((PACKAGE / "cli" / "offline.py").read_text())
    assert any(isinstance(node, ast.ImportFrom) and node.module == "mcad.wiring" and
               any(alias.name == "build" for alias in node.names) for node in ast.walk(tree))
