"""StatusSync's lanes in the write pool: a queued AppWrapper's Pending status is bookkeeping, written in
the pool's low lane; a decision that must not wait (a dispatch's Running status) made while such a write waits to
start hurries it, since that write will send the newest decision."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mcad.api.appwrapper import appwrapper_view
from mcad.api.statusview import StatusView
from mcad.loop.statussync import StatusSync
from mcad.model.retry import Backoff, Policy
from test.fakes import FakeClock


class Pool:
    """A write pool that runs nothing until told: records the lane of each submit and each hurry."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, bool]] = []
        self.hurried: list[str] = []
        self.jobs: list[Callable[[], Any]] = []

    def submit(self, key: str, job: Callable[[], Any], *, tenant: str, urgent: bool = True,
               priority: int = 0) -> None:
        self.submitted.append((key, urgent))
        self.jobs.append(job)

    def hurry(self, key: str) -> None:
        self.hurried.append(key)


class Writer:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def replace_status(self, api_version: str, kind: str, namespace: str, name: str, uid: str,
                       new_status: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        self.sent.append(str(new_status.get("state")))
        return {"metadata": {"resourceVersion": "2"}}


class Queue:
    def add_after(self, key: Any, delay: float) -> None:
        pass


def sync() -> tuple[StatusSync, Pool, Writer]:
    clock = FakeClock()
    pool, writer = Pool(), Writer()
    backoff = Backoff(clock, Policy(base=0.25, cap=4.0, rate=50.0, burst=500, give_up_attempts=20,
                                    give_up_seconds=300.0))
    return StatusSync(writer, pool, Queue(), backoff, clock), pool, writer


AW = appwrapper_view({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                      "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
                      "spec": {"resources": {"GenericItems": []}}})


def test_a_bookkeeping_status_goes_in_the_low_lane_and_an_urgent_one_hurries_it() -> None:
    statuses, pool, writer = sync()
    statuses.want(AW, StatusView.of({"state": "Pending"}), urgent=False)
    assert pool.submitted == [("ns/a", False)]
    statuses.want(AW, StatusView.of({"state": "Running"}))
    assert pool.submitted == [("ns/a", False)]  # still one write: it sends the newest decision when it starts
    assert pool.hurried == ["ns/a"]
    pool.jobs[0]()
    assert writer.sent == ["Running"]


def test_bookkeeping_decided_while_a_write_waits_hurries_nothing() -> None:
    statuses, pool, _ = sync()
    statuses.want(AW, StatusView.of({"state": "Pending"}), urgent=False)
    statuses.want(AW, StatusView.of({"state": "Pending", "message": "moved up"}), urgent=False)
    assert pool.submitted == [("ns/a", False)]
    assert pool.hurried == []
