"""mcad.api.statusview: the typed fields decisions read, the whole status packed, equality by content."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from mcad.api.statusview import EMPTY, StatusView, status_view


def queued_status(position: int = 3) -> dict[str, Any]:
    stamp = "2026-11-24T14:00:00.123456Z"
    return {"state": "Pending", "canrun": False, "queuejobstate": "Backoff", "controllerfirsttimestamp": stamp,
            "numberOfRequeueings": 2, "requeueingTimeInSeconds": 600, "message": f"short; position {position}",
            "conditions": [
                {"type": "Init", "status": "True", "lastUpdateMicroTime": stamp, "lastTransitionMicroTime": stamp},
                {"type": "Backoff", "status": "True", "reason": "PreemptionTriggered", "message": "requeued",
                 "lastUpdateMicroTime": stamp, "lastTransitionMicroTime": stamp},
                {"type": "Dispatched", "status": "True", "reason": "AppWrapperRunnable",
                 "lastUpdateMicroTime": stamp, "lastTransitionMicroTime": "2026-11-24T14:01:00.000000Z"},
                {"type": "Backoff", "status": "True", "reason": "AppWrapperNotRunnable.", "message": "short 😀",
                 "lastUpdateMicroTime": stamp, "lastTransitionMicroTime": stamp}]}


def test_typed_fields_are_what_decisions_read_and_the_last_entry_of_a_type_counts() -> None:
    view = status_view({**queued_status(), "controllerfirstdispatchtimestamp": "2026-11-24T14:01:00.000000Z",
                        "targetClusterName": "west"})
    assert (view.state, view.canrun, view.requeuings, view.requeue_wait) == ("Pending", False, 2, 600)
    assert view.first_dispatch == "2026-11-24T14:01:00.000000Z"
    assert view.dispatched_since == "2026-11-24T14:01:00.000000Z"
    assert view.backoff == "AppWrapperNotRunnable.", "the latest Backoff, not the first"
    assert view.target_cluster == "west"
    assert view.state is sys.intern("Pending"), "one copy of each state among thousands of AppWrappers"


def test_raw_gives_back_the_whole_status_as_a_new_dict_each_time() -> None:
    raw = queued_status()
    view = status_view(raw)
    assert view.raw() == raw
    copy = view.raw()
    copy["state"] = "Running"
    assert view.raw()["state"] == "Pending"


def test_equal_statuses_make_equal_views_whatever_the_key_order() -> None:
    raw = queued_status()
    assert status_view(raw) == status_view(json.loads(json.dumps(raw)[::1]))
    assert status_view(dict(reversed(list(raw.items())))) == status_view(raw)
    assert status_view(queued_status(4)) != status_view(raw)
    assert len({status_view(raw), status_view(dict(raw))}) == 1


@pytest.mark.parametrize("raw", [None, {}, {"state": 3, "canrun": "yes", "numberOfRequeueings": True,
                                             "conditions": "not a list"}])
def test_absent_or_ill_typed_fields_read_as_absent(raw: Any) -> None:
    view = status_view(raw)
    assert (view.state, view.canrun, view.requeuings, view.backoff, view.dispatched_since) == ("", False, 0, "", "")
    if not raw:
        assert view is EMPTY and view.raw() == {}


def test_a_queued_status_is_kept_in_a_fraction_of_its_size() -> None:
    raw = queued_status()
    view = StatusView.of(raw)
    assert len(view.packed) < len(json.dumps(raw)) / 2


def test_a_status_larger_than_the_packing_window_comes_back_whole() -> None:
    # The packer's window is 8 KiB (packing is on every AppWrapper's path at start-up, so kept cheap); a status of
    # a long message, or of many conditions, spans several windows and must still come back byte for byte.
    raw = queued_status()
    raw["message"] = "".join(f"{i:05d} " for i in range(6000))  # 36 KB, no long repeats
    raw["conditions"] = [dict(raw["conditions"][-1], message=f"condition {i}") for i in range(200)]
    view = StatusView.of(raw)
    assert view.raw() == raw
    assert len(view.packed) < len(json.dumps(raw))
