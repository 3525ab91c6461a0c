"""The minimum run time annotation (``mcad.codeflare.dev/min-runtime``): what admission refuses (not a duration,
above the cluster's ceiling; on update only a value the update sets or changes), what the controller acts on (the
default when unset or malformed, cut to the ceiling), and its flags (a default above the ceiling stops the
controller; the ceiling reaches admission)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mcad.admission.review import AdmissionConfig
from mcad.api import minruntime
from mcad.api.appwrapper import appwrapper_view
from mcad.api.minruntime import MIN_RUNTIME, MinRuntime
from mcad.cli import controller
from test.unit.test_admission_review import aw, cm, refused, stored, validate


def annotated(value: object) -> dict[str, Any]:
    obj = aw(cm())
    obj["metadata"]["annotations"] = {MIN_RUNTIME: value}
    return obj


@pytest.mark.parametrize(("value", "expected"), [
    ("30 minutes", f"annotation {MIN_RUNTIME}: '30 minutes' not a duration (write it as Go does"),
    ("-5m", f"annotation {MIN_RUNTIME}: '-5m' a duration may not be negative"),
    ("1h1s", f"annotation {MIN_RUNTIME}: '1h1s' exceeds the cluster's ceiling of 1h "
             f"(--preemption-min-runtime-ceiling)"),
    (30, f"annotation {MIN_RUNTIME}: must be a string"),
], ids=["malformed", "negative", "above-ceiling", "not-a-string"])
def test_a_refused_value_is_refused_at_create_naming_the_annotation(value: object, expected: str) -> None:
    assert refused(validate(annotated(value))).startswith(expected)


def test_good_values_are_admitted_and_the_ceiling_is_the_clusters() -> None:
    for value in ("0", "30m", "1h", "59m59s"):
        assert validate(annotated(value)).allowed, value
    assert refused(validate(annotated("2h"))).startswith(f"annotation {MIN_RUNTIME}: '2h' exceeds")
    assert validate(annotated("2h"), config=AdmissionConfig(min_runtime_ceiling=7200)).allowed
    assert refused(validate(annotated("1m"), config=AdmissionConfig(min_runtime_ceiling=30))).startswith(
        f"annotation {MIN_RUNTIME}: '1m' exceeds the cluster's ceiling of 30s")


def test_an_update_is_refused_only_for_a_value_it_sets_or_changes() -> None:
    old = stored(aw(cm()))
    old["metadata"]["annotations"][MIN_RUNTIME] = "3h"  # admitted under a higher ceiling, since lowered
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    assert validate(new, old=old).allowed
    new["metadata"]["annotations"][MIN_RUNTIME] = "2h"
    assert refused(validate(new, old=old)).startswith(f"annotation {MIN_RUNTIME}: '2h' exceeds")
    new["metadata"]["annotations"][MIN_RUNTIME] = "45m"
    assert validate(new, old=old).allowed


def test_the_controller_reads_the_default_when_unset_or_malformed_and_cuts_to_the_ceiling() -> None:
    bounds = MinRuntime(default=60, ceiling=600)
    assert bounds.seconds("") == 60
    assert bounds.seconds("5m") == 300
    assert bounds.seconds("0") == 0
    assert bounds.seconds("forever") == 60, "stored around the webhook: the default"
    assert bounds.seconds("5h") == 600, "above the ceiling: cut to it"
    assert minruntime.DEFAULT.seconds("") == 0, "no minimum unless the cluster or the AppWrapper sets one"


def test_the_view_keeps_the_annotation_bounded() -> None:
    assert appwrapper_view(annotated("30m")).min_runtime == "30m"
    assert appwrapper_view(aw(cm())).min_runtime == ""
    assert appwrapper_view(annotated(["30m"])).min_runtime == ""
    long = appwrapper_view(annotated("1" * 10_000 + "s")).min_runtime
    assert len(long) <= minruntime.KEPT_CHARS + 3 and MinRuntime().seconds(long) == 0, "cut: no duration"


def test_defaults_that_do_not_hold_together_are_named() -> None:
    assert MinRuntime(default=7200, ceiling=3600).problems() == [
        "the default minimum run time 2h exceeds its ceiling 1h"]
    assert MinRuntime(default=-1).problems() == ["the minimum run time and its ceiling may not be negative"]
    assert MinRuntime().problems() == []


def test_a_default_above_the_ceiling_stops_the_controller_before_it_connects(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = CliRunner().invoke(controller.main, ["--kubeconfig", str(missing), "--preemption-min-runtime", "2h",
                                                  "--connect-only"])
    assert result.exit_code == 2
    assert "the default minimum run time 2h exceeds its ceiling 1h" in result.output, result.output
    result = CliRunner().invoke(controller.main, ["--kubeconfig", str(missing), "--preemption-cooldown", "ten",
                                                  "--connect-only"])
    assert result.exit_code == 2 and "--preemption-cooldown" in result.output, result.output


def test_the_ceiling_reaches_the_admission_config() -> None:
    assert controller.admission_config("", frozenset(), min_runtime_ceiling=120).min_runtime_ceiling == 120
    assert controller.admission_config("", frozenset()).min_runtime_ceiling == minruntime.DEFAULT_CEILING
