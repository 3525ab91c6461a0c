"""A queued AppWrapper's expected start in its status, on a real cluster with the controller as a process.

Two AppWrappers hold a fake node's 4 slots (``mcad.test/slot``, which no other node has), with run-time limits of
30 s and 60 s; their pods would run for an hour, so it is mcad ending them at their ``dispatchDuration.limit`` (failed,
their objects deleted) that frees the room. A third needs all 4 slots: its ``status.estimatedStart`` is written
while it waits, names the end of the 60 s limit, and is within 10 % (of the time from when it was written) of when it
is dispatched; a fourth, behind the third which has no limit, says why its start is unknown. A tenant holding
AppWrapper rights and ``appwrappers/status`` may not write the estimate: status is the controller's.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes.client as k8s

from mcad.k8s import kube
from mcad.model.estimate import UNKNOWN_HELD
from test.e2e.conftest import AppWrappers, Controller, appwrapper, fake_node
from test.e2e.test_admission import APPWRAPPER_RIGHTS, account, kubectl, token_kubeconfig
from test.e2e.test_reservations import SLOT, running_pods, slot_job
from test.e2e.test_status_ownership import REFUSED, STATUS_RIGHTS
from test.support import wait_until

SHORT, LONG = 30, 60  # the holders' dispatchDuration.limit, seconds
ACCURACY = 0.10


def stamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def limited(name: str, slots: int, seconds: int) -> dict[str, Any]:
    return appwrapper(name, slot_job(name, 1, slots, 3600), scheduling={"dispatchDuration": {"limit": seconds}})


def test_a_queued_appwrapper_is_told_when_it_starts_within_ten_percent(
        controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api, kubeconfig: str, tmp_path: Path) -> None:
    with fake_node(core, cpu="8", memory="16Gi", **{SLOT: "4"}):
        aws.create(limited("short", 2, SHORT))
        aws.create(limited("long", 2, LONG))
        wait_until(lambda: running_pods(aws, "short") + running_pods(aws, "long") == 2, 60, "short and long Running")
        aws.create(appwrapper("whole", slot_job("whole", 1, 4, 3600)))
        # Behind whole (a lower priority: created in the same second, the name would order them).
        aws.create(appwrapper("after", slot_job("after", 1, 2, 3600), priority=-1))

        try:
            status = wait_until(lambda: (s := aws.status("whole")).get("estimatedStart") and s, 60,
                                "whole's status.estimatedStart")
        except AssertionError as err:
            raise AssertionError(f"{err}; its status: {aws.status('whole')!r}") from None
        written = time.time()
        estimate = stamp(status["estimatedStart"])
        assert status["state"] == "Pending" and "estimateWhy" not in status
        long_ends = stamp(aws.status("long")["controllerfirstdispatchtimestamp"]).timestamp() + LONG
        assert abs(estimate.timestamp() - long_ends) <= 1, "when long's limit runs out"
        wait_until(lambda: aws.status("after").get("estimateWhy") == UNKNOWN_HELD, 60,
                   "after's status.estimateWhy: whole, ahead of it, has no run-time limit")
        assert "estimatedStart" not in aws.status("after")

        # The estimate is the controller's: a tenant with status rights may not write it.
        admin = kube.connect(kubeconfig)
        account(admin, aws.namespace, "carol", APPWRAPPER_RIGHTS + STATUS_RIGHTS)
        carol = token_kubeconfig(kubeconfig, admin, aws.namespace, "carol", tmp_path / "carol")
        wait_until(lambda: kubectl(carol, "auth", None, "can-i", "patch", "appwrappers", "--subresource=status")
                   .stdout.strip() == "yes", 30, "carol's Role to count")
        proc = kubectl(carol, "patch", None, "appwrapper", "whole", "--subresource=status", "--type=merge",
                       "-p", '{"status": {"estimatedStart": "2000-01-01T00:00:00Z"}}')
        assert proc.returncode != 0 and REFUSED in proc.stderr, proc.stderr
        assert aws.status("whole")["estimatedStart"] == status["estimatedStart"]

        dispatched_status = aws.wait_state("whole", "Running", timeout=LONG + 30)
        dispatched = stamp(dispatched_status["controllerfirstdispatchtimestamp"]).timestamp()
        assert aws.status("long")["state"] == "Failed", "long was ended at its limit"
        off, ahead = dispatched - estimate.timestamp(), dispatched - written
        print(f"whole: estimate written {ahead:.1f} s before its dispatch, off by {off:+.1f} s")
        assert abs(off) <= ACCURACY * ahead, (off, ahead)
        assert "estimatedStart" not in dispatched_status and "estimateWhy" not in dispatched_status
