"""Fault tolerance annotations at admission: each refused value is refused on create with the
annotation named; an update is refused for the values it sets or changes, never for one it leaves alone; the
cluster's ceilings come from the admission config; the legacy group is judged the same."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mcad.admission.request import AdmissionRequest, Outcome
from mcad.admission.review import AdmissionConfig, build
from mcad.api import faulttolerance as ft
from test.unit.test_admission_review import ALICE, FakeFacts, aw, cm, deleting, refused, stored, validate

GRACE = ft.FAILURE_GRACE


def annotated(**annotations: str) -> dict[str, Any]:
    obj = aw(cm())
    obj["metadata"]["annotations"] = {getattr(ft, key): value for key, value in annotations.items()}
    return obj


@pytest.mark.parametrize(("annotations", "expected"), [
    ({"RETRY_LIMIT": "three"}, f"annotation {ft.RETRY_LIMIT}: 'three' must be an integer in 0..1000"),
    ({"RETRY_LIMIT": "1001"}, f"annotation {ft.RETRY_LIMIT}: '1001' must be an integer in 0..1000"),
    ({"FAILURE_GRACE": "5 minutes"}, f"annotation {GRACE}: '5 minutes' not a duration (write it as Go does"),
    ({"WARMUP_GRACE": "-1m"}, f"annotation {ft.WARMUP_GRACE}: '-1m' a duration may not be negative"),
    ({"RETRY_PAUSE": "25h"}, f"annotation {ft.RETRY_PAUSE}: '25h' exceeds the cluster's ceiling of 24h"),
    ({"SUCCESS_TTL": "169h"}, f"annotation {ft.SUCCESS_TTL}: '169h' exceeds the cluster's ceiling of 168h"),
    ({"SUCCESS_TTL": "0s"}, f"annotation {ft.SUCCESS_TTL}: '0s' must be positive"),
    ({"TERMINAL_EXIT_CODES": "1,256"}, f"annotation {ft.TERMINAL_EXIT_CODES}: '1,256' holds '256', not an exit code"),
    ({"RETRYABLE_EXIT_CODES": "0"}, f"annotation {ft.RETRYABLE_EXIT_CODES}: '0' holds '0', not an exit code"),
    ({"TERMINAL_EXIT_CODES": "1,2", "RETRYABLE_EXIT_CODES": "2,137"},
     f"annotation {ft.RETRYABLE_EXIT_CODES}: lists 2, also in terminalExitCodes"),
    ({"DELETE_WHEN_FINISHED": "yes"}, f"annotation {ft.DELETE_WHEN_FINISHED}: 'yes' must be \"true\" or \"false\""),
    ({"RETRY_PAUSE": "1ns"}, f"annotation {ft.RETRY_PAUSE}: '1ns' is below the cluster's floor of 10s"),
    ({"RETRY_PAUSE": "0"}, f"annotation {ft.RETRY_PAUSE}: '0' is below the cluster's floor of 10s"),
    ({"FAILURE_GRACE": "0s"}, f"annotation {GRACE}: '0s' is below the cluster's floor of 10s"),
    ({"ADMISSION_GRACE": "9s"}, f"annotation {ft.ADMISSION_GRACE}: '9s' is below the cluster's floor of 10s"),
    ({"WARMUP_GRACE": "500ms"}, f"annotation {ft.WARMUP_GRACE}: '500ms' is below the cluster's floor of 10s"),
    ({"RETRY_LIMIT": "\u0661\u0662"}, f"annotation {ft.RETRY_LIMIT}: '\u0661\u0662' must be an integer in 0..1000 (in "
                                      f"ASCII digits)"),
    ({"RETRY_LIMIT": "\uff11"}, f"annotation {ft.RETRY_LIMIT}: '\uff11' must be an integer"),
    ({"RETRY_PAUSE": "\u0661\u0662m"}, f"annotation {ft.RETRY_PAUSE}: '\u0661\u0662m' not a duration"),
    ({"TERMINAL_EXIT_CODES": "\u0661"},
     f"annotation {ft.TERMINAL_EXIT_CODES}: '\u0661' holds '\u0661', not an exit code"),
], ids=["limit-word", "limit-high", "malformed", "negative", "above-ceiling", "ttl-above-ceiling", "ttl-zero",
        "exit-code-range", "exit-code-zero", "lists-overlap", "delete-when-finished", "pause-1ns", "pause-0",
        "failure-grace-0", "admission-grace-9s", "warmup-grace-500ms", "limit-arabic-indic-digits",
        "limit-fullwidth-digit", "duration-arabic-indic-digits", "exit-code-arabic-indic-digit"])
def test_a_refused_value_is_refused_at_create_naming_the_annotation(annotations: dict[str, str],
                                                                    expected: str) -> None:
    assert refused(validate(annotated(**annotations))).startswith(expected)


def test_good_values_are_admitted() -> None:
    assert validate(annotated(ADMISSION_GRACE="1m", WARMUP_GRACE="10m", FAILURE_GRACE="90s", RETRY_PAUSE="10s",
                              RETRY_LIMIT="0", FORCEFUL_DELETION_GRACE="1h30m", DELETION_ON_FAILURE_GRACE="24h",
                              SUCCESS_TTL="168h", TERMINAL_EXIT_CODES="1, 2", RETRYABLE_EXIT_CODES="137,143",
                              DELETE_WHEN_FINISHED="True")).allowed


def test_every_refused_annotation_is_named_in_one_message_with_the_other_problems() -> None:
    obj = annotated(RETRY_LIMIT="-1", FAILURE_GRACE="1d")
    obj["spec"]["priority"] = 2**40
    message = refused(validate(obj))
    assert ft.RETRY_LIMIT in message and GRACE in message and "spec.priority" in message


def test_the_ceilings_are_the_clusters() -> None:
    config = AdmissionConfig(fault_defaults=ft.FaultDefaults(failure_grace=60, grace_ceiling=3600,
                                                             success_ttl_ceiling=86400))
    assert refused(validate(annotated(FAILURE_GRACE="61m"), config=config)) == \
        f"annotation {GRACE}: '61m' exceeds the cluster's ceiling of 1h"
    assert validate(annotated(FAILURE_GRACE="1h"), config=config).allowed
    assert refused(validate(annotated(SUCCESS_TTL="25h"), config=config)).endswith("ceiling of 24h")


def test_the_floors_are_the_clusters_and_the_refusal_states_the_floor() -> None:
    config = AdmissionConfig(fault_defaults=ft.FaultDefaults(retry_pause_floor=60, grace_floor=30))
    assert refused(validate(annotated(RETRY_PAUSE="59s"), config=config)) == \
        f"annotation {ft.RETRY_PAUSE}: '59s' is below the cluster's floor of 1m (the shortest this period may be)"
    assert refused(validate(annotated(FAILURE_GRACE="29s"), config=config)).endswith(
        "below the cluster's floor of 30s (the shortest this period may be)")
    assert validate(annotated(RETRY_PAUSE="1m", FAILURE_GRACE="30s"), config=config).allowed
    # Periods that pace no reset have no floor.
    assert validate(annotated(FORCEFUL_DELETION_GRACE="0s", DELETION_ON_FAILURE_GRACE="0s"), config=config).allowed
    lifted = AdmissionConfig(fault_defaults=ft.FaultDefaults(retry_pause_floor=0, grace_floor=0))
    assert validate(annotated(RETRY_PAUSE="1ns", FAILURE_GRACE="0s"), config=lifted).allowed


def update(old: dict[str, Any], config: AdmissionConfig | None = None, **annotations: str) -> Outcome:
    new = copy.deepcopy(old)
    for key, value in annotations.items():
        new["metadata"]["annotations"][getattr(ft, key)] = value
    return validate(new, config=config, old=old)


def test_an_update_that_sets_or_changes_a_value_to_a_refused_one_is_refused() -> None:
    old = stored(aw(cm()))
    assert refused(update(old, RETRY_LIMIT="many")).startswith(f"annotation {ft.RETRY_LIMIT}: 'many'")
    old["metadata"]["annotations"][ft.RETRY_LIMIT] = "3"
    assert refused(update(old, RETRY_LIMIT="1001")).startswith(f"annotation {ft.RETRY_LIMIT}: '1001'")
    assert update(old, RETRY_LIMIT="5").allowed


def test_an_update_is_not_refused_for_a_value_it_leaves_alone() -> None:
    # Stored under a ceiling of 48h, which the admin has since lowered to the default 24h.
    old = stored(aw(cm()))
    old["metadata"]["annotations"][GRACE] = "36h"
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    new["metadata"]["annotations"]["note"] = "edited"
    assert validate(new, old=old).allowed
    # ... but changing it to another value above the ceiling is refused, even with the same start.
    assert refused(update(old, FAILURE_GRACE="36h0m")).startswith(f"annotation {GRACE}: '36h0m' exceeds")
    assert update(old, FAILURE_GRACE="1h").allowed


def test_changing_one_exit_code_list_to_overlap_the_other_is_refused() -> None:
    old = stored(aw(cm()))
    old["metadata"]["annotations"][ft.RETRYABLE_EXIT_CODES] = "137"
    assert refused(update(old, TERMINAL_EXIT_CODES="1,137")) == \
        f"annotation {ft.RETRYABLE_EXIT_CODES}: lists 137, also in terminalExitCodes"


def test_an_appwrapper_being_deleted_lets_its_finalizers_go_but_takes_no_refused_value() -> None:
    old = deleting(aw(cm()))
    old["metadata"]["annotations"][GRACE] = "48h"  # stored before the ceiling was lowered
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    facts = FakeFacts(broken="down")
    assert validate(new, facts, old=old).allowed
    new["metadata"]["annotations"][ft.FORCEFUL_DELETION_GRACE] = "forever"
    assert refused(validate(new, facts, old=old)).startswith(f"annotation {ft.FORCEFUL_DELETION_GRACE}: 'forever'")
    assert facts.asked == []


def test_the_legacy_group_is_judged_the_same() -> None:
    obj = annotated(RETRY_LIMIT="x")
    obj["apiVersion"] = "mcad.ibm.com/v1beta1"
    _, check = build(FakeFacts({ALICE.username: "*"}), AdmissionConfig())
    outcome = check(AdmissionRequest(uid="r", operation="CREATE", group="mcad.ibm.com", namespace="team-a",
                                     name="job", user=ALICE, obj=obj, old=None))
    assert refused(outcome).startswith(f"annotation {ft.RETRY_LIMIT}: 'x'")
