"""docs/reference/appwrapper.md cannot drift from the CRD, from the table of what mcad does, or from the code.

- Every field path of the CRD's schema has a row in hack/api-reference.yaml, and every row names a field the CRD has.
- Every fault tolerance annotation of ``mcad.api.faulttolerance`` has a row.
- The committed page is what hack/gen-api-reference.py writes (``make api-reference`` regenerates it).

The checks run on synthetic input too, to show each one reporting: a field added to the CRD without a row, a row
left behind by a field removed, a page edited by hand.
"""

from __future__ import annotations

import copy
from types import ModuleType
from typing import Any

import pytest

from test.support import load_hack_module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return load_hack_module("gen-api-reference")


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_every_crd_field_has_a_row_and_every_row_a_field(gen: ModuleType) -> None:
    assert gen.problems(gen.fields(gen.load_crd()), gen.load_table()) == []


def test_the_walk_reaches_spec_status_and_nested_items(gen: ModuleType) -> None:
    paths = [f.path for f in gen.fields(gen.load_crd())]
    for expected in ("metadata.name", "spec.resources.GenericItems[].custompodresources[].requests",
                     "spec.schedulingSpec.requeuing.maxNumRequeuings", "status.Succeeded",
                     "status.conditions[].lastTransitionMicroTime", "status.pendingpodconditions[].conditions"):
        assert expected in paths
    assert len(paths) == len(set(paths))


def test_the_committed_page_is_what_the_generator_writes(gen: ModuleType) -> None:
    expected = gen.render(gen.load_crd(), gen.load_table())
    assert gen.OUTPUT.read_text() == expected, "docs/reference/appwrapper.md is out of date: run make api-reference"


def test_a_crd_field_without_a_row_is_reported(gen: ModuleType) -> None:
    crd = copy.deepcopy(gen.load_crd())
    _schema(crd)["properties"]["spec"]["properties"]["schedulingSpec"]["properties"]["gangTimeout"] = {
        "type": "integer", "minimum": 0}
    assert gen.problems(gen.fields(crd), gen.load_table()) == [
        "CRD field spec.schedulingSpec.gangTimeout has no row in api-reference.yaml"]


def test_a_field_nested_in_array_items_without_a_row_is_reported(gen: ModuleType) -> None:
    crd = copy.deepcopy(gen.load_crd())
    _schema(crd)["properties"]["status"]["properties"]["resets"]["items"]["properties"]["node"] = {"type": "string"}
    assert gen.problems(gen.fields(crd), gen.load_table()) == [
        "CRD field status.resets[].node has no row in api-reference.yaml"]


def test_a_row_naming_a_field_the_crd_lacks_is_reported(gen: ModuleType) -> None:
    crd = copy.deepcopy(gen.load_crd())
    del _schema(crd)["properties"]["spec"]["properties"]["priorityslope"]
    assert gen.problems(gen.fields(crd), gen.load_table()) == [
        "api-reference.yaml has a row for spec.priorityslope, which the CRD lacks"]


def test_a_row_without_a_use_or_with_the_wrong_one_is_reported(gen: ModuleType) -> None:
    table = copy.deepcopy(gen.load_table())
    table["fields"]["spec.priority"] = {"use": "maybe", "does": "x"}
    table["fields"]["status.state"]["use"] = "acts"
    found = gen.problems(gen.fields(gen.load_crd()), table)
    assert any("row of spec.priority needs a use" in problem for problem in found)
    assert any("status.state has use 'acts'" in problem for problem in found)


def test_a_fault_tolerance_annotation_without_a_row_is_reported(gen: ModuleType) -> None:
    table = copy.deepcopy(gen.load_table())
    del table["annotations"]["workload.codeflare.dev.appwrapper/retryLimit"]
    assert gen.problems(gen.fields(gen.load_crd()), table) == [
        "annotation workload.codeflare.dev.appwrapper/retryLimit (mcad.api.faulttolerance) has no row in "
        "api-reference.yaml"]


def test_a_changed_crd_or_table_changes_the_page(gen: ModuleType) -> None:
    crd, table = gen.load_crd(), gen.load_table()
    page = gen.render(crd, table)
    bumped = copy.deepcopy(crd)
    _schema(bumped)["properties"]["metadata"]["properties"]["name"]["maxLength"] = 40
    assert gen.render(bumped, table) != page
    edited = copy.deepcopy(table)
    edited["fields"]["spec.priority"]["does"] = "Something else."
    assert gen.render(crd, edited) != page


def test_the_page_shows_bounds_defaults_and_the_code_s_numbers(gen: ModuleType) -> None:
    page = gen.render(gen.load_crd(), gen.load_table())
    assert "| `spec.schedulingSpec.requeuing.timeInSeconds` | integer | min 1; max 604800 | `300` |" in page
    assert "| `metadata.name` | string | maxLength 63 |" in page
    # The annotations' defaults, floors and ceilings come from mcad.api.faulttolerance.
    assert ("| `workload.codeflare.dev.appwrapper/retryPausePeriodDuration` | a Go duration (`90s`, `5m`, `1h30m`) | "
            "`1m30s` (`--retry-pause-period`) | `10s` (`--retry-pause-floor`) | `24h` (`--grace-period-ceiling`) |"
            in page)
    assert "$" not in page.split("## Patterns")[0]  # every $NAME was substituted


def test_an_unknown_constant_in_the_prose_fails(gen: ModuleType) -> None:
    table = copy.deepcopy(gen.load_table())
    table["fields"]["spec.priority"]["does"] = "At most $NO_SUCH_CONSTANT."
    with pytest.raises(KeyError):
        gen.render(gen.load_crd(), table)


def test_check_mode_reports_a_stale_page(gen: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "appwrapper.md"
    stale.write_text("# edited by hand\n")
    monkeypatch.setattr(gen, "OUTPUT", stale)
    monkeypatch.setattr(gen, "REPO", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert stale.read_text() == "# edited by hand\n"
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
