"""The fault-test harness without a cluster: the injector's answers and records (test.faults), the parsing of
``apiserver_request_total`` (test.apiserver), and stopping and starting one component (hack/localcluster.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from test.apiserver import RequestKey, parse_request_totals
from test.faults import APPWRAPPER_STATUS, FAULT_MESSAGE, JOBS, FaultInjector
from test.support import load_hack_module, wait_until

lc = load_hack_module("localcluster")


def review(resource: str, name: str, *, group: str = "batch", sub: str = "", operation: str = "UPDATE",
           dry_run: bool = False, manager: str = "mcad-controller") -> dict[str, Any]:
    return {"uid": f"uid-{name}", "resource": {"group": group, "version": "v1", "resource": resource},
            "subResource": sub, "name": name, "operation": operation, "dryRun": dry_run,
            "userInfo": {"username": "someone"}, "options": {"fieldManager": manager}}


def status_review(name: str, **kw: Any) -> dict[str, Any]:
    return review("appwrappers", name, group="workload.codeflare.dev", sub="status", **kw)


def test_the_injector_allows_until_told_to_fail_and_again_after_heal() -> None:
    faults = FaultInjector("ns")
    assert faults.answer(status_review("a")) == {"uid": "uid-a", "allowed": True}
    faults.fail(APPWRAPPER_STATUS)
    refused = faults.answer(status_review("a"))
    assert refused["allowed"] is False
    assert refused["status"]["code"] == 500 and refused["status"]["message"] == FAULT_MESSAGE
    assert faults.answer(review("jobs", "a"))["allowed"] is True, "only the resource told to fail fails"
    faults.heal()
    assert faults.answer(status_review("a"))["allowed"] is True
    assert [(c.resource, c.code) for c in faults.seen(name="a")] == [
        (APPWRAPPER_STATUS, None), (APPWRAPPER_STATUS, 500), (JOBS, None), (APPWRAPPER_STATUS, None)]


def test_a_refusal_of_one_object_outlives_heal_and_spares_the_others() -> None:
    faults = FaultInjector("ns")
    faults.refuse(JOBS, "bad", code=422, message="no")
    faults.fail(JOBS)
    faults.heal()
    assert faults.answer(review("jobs", "bad"))["status"] == {"code": 422, "message": "no", "status": "Failure"}
    assert faults.answer(review("jobs", "good"))["allowed"] is True


def test_seen_filters_and_leaves_dry_runs_out() -> None:
    faults = FaultInjector("ns")
    faults.fail(JOBS)
    faults.answer(review("jobs", "a", operation="CREATE"))
    faults.answer(review("jobs", "a", manager="kube-controller-manager"))
    faults.answer(review("jobs", "a", dry_run=True))
    assert len(faults.seen(JOBS)) == 2
    assert [c.operation for c in faults.seen(JOBS, field_manager="mcad-controller")] == ["CREATE"]
    assert faults.seen(JOBS, refused=False) == []
    assert faults.seen(APPWRAPPER_STATUS) == []
    first = faults.seen(JOBS)[0].at
    assert len(faults.seen(JOBS, since=first + 3600)) == 0 and len(faults.seen(JOBS, until=first)) == 0


def test_request_totals_are_summed_over_other_labels_and_subtract() -> None:
    text = "\n".join([
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
        "# TYPE apiserver_request_total counter",
        'apiserver_request_total{code="500",component="apiserver",dry_run="",group="",resource="configmaps",'
        'scope="resource",subresource="",verb="APPLY",version="v1"} 7',
        'apiserver_request_total{code="500",component="apiserver",dry_run="All",group="",resource="configmaps",'
        'scope="resource",subresource="",verb="APPLY",version="v1"} 2',
        'apiserver_request_total{code="200",component="apiserver",dry_run="",group="workload.codeflare.dev",'
        'resource="appwrappers",scope="resource",subresource="status",verb="APPLY",version="v1beta1"} 3',
        'apiserver_request_duration_seconds_count{verb="APPLY"} 99',
    ])
    totals = parse_request_totals(text)
    assert totals[RequestKey("APPLY", "", "configmaps", "", "500")] == 9
    assert totals.count(resource="appwrappers", subresource="status") == 3
    assert totals.count(verb="APPLY") == 12
    assert (totals - parse_request_totals(text.replace("} 7", "} 1"))).count() == 6


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A "cluster" whose kwok is a sleeping process in its own session, as ``start`` makes them."""
    monkeypatch.setenv("MCAD_DEV_DIR", str(tmp_path))
    layout = lc.Layout("unit")
    layout.state.mkdir(parents=True)
    pid = lc.start("kwok", ["sleep", "600"], layout)
    layout.state_file.write_text(json.dumps({"name": "unit", "server": "https://127.0.0.1:9", "ports": {},
                                             "pids": {"kwok": pid}}))
    yield layout
    for pid in lc.read_state(layout)["pids"].values():
        subprocess.run(["kill", "-9", str(pid)], check=False)


@pytest.mark.parametrize("kill", [False, True])
def test_a_stopped_component_starts_again_with_its_command_line(cluster: Any, kill: bool) -> None:
    old = lc.read_state(cluster)["pids"]["kwok"]
    lc.stop_component("unit", "kwok", kill=kill)
    assert not lc.pid_alive(old)
    assert lc.read_state(cluster)["stopped"]["kwok"] == ["sleep", "600"]
    lc.start_component("unit", "kwok")
    state = lc.read_state(cluster)
    new = state["pids"]["kwok"]
    assert new != old and lc.pid_alive(new) and not state["stopped"]
    wait_until(lambda: Path(f"/proc/{new}/cmdline").read_bytes() == b"sleep\x00600\x00", 10, "the same command line")


def test_start_refuses_a_component_that_stop_did_not_stop(cluster: Any) -> None:
    with pytest.raises(lc.ClusterError, match="was not stopped"):
        lc.start_component("unit", "kwok")
