"""The mcad.ibm.com CRD is the current one under the old group: same schema, same printer columns, same status
subresource; only the names and the missing short name differ. A field added to one and not the other fails here."""

from __future__ import annotations

from typing import Any

import yaml

from mcad.api.appwrapper import appwrapper_view
from test.support import REPO

CURRENT = REPO / "config" / "crd" / "workload.codeflare.dev_appwrappers.yaml"
LEGACY = REPO / "config" / "crd" / "legacy" / "mcad.ibm.com_appwrappers.yaml"


def test_the_legacy_crd_is_the_current_one_under_the_old_group() -> None:
    current: dict[str, Any] = yaml.safe_load(CURRENT.read_text())
    legacy: dict[str, Any] = yaml.safe_load(LEGACY.read_text())
    assert legacy["metadata"] == {"name": "appwrappers.mcad.ibm.com"}
    assert legacy["spec"]["group"] == "mcad.ibm.com"
    assert "shortNames" not in legacy["spec"]["names"] and "categories" not in legacy["spec"]["names"]
    expected_names = {k: v for k, v in current["spec"]["names"].items() if k not in ("shortNames", "categories")}
    assert legacy["spec"]["names"] == expected_names
    assert legacy["spec"]["versions"] == current["spec"]["versions"]
    assert legacy["spec"]["scope"] == current["spec"]["scope"]


def test_a_view_remembers_the_api_it_came_from() -> None:
    raw = {"apiVersion": "mcad.ibm.com/v1beta1", "kind": "AppWrapper",
           "metadata": {"name": "a", "namespace": "ns"}, "spec": {"resources": {"GenericItems": [
               {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}}]}}}
    assert appwrapper_view(raw).api_version == "mcad.ibm.com/v1beta1"
    assert appwrapper_view({**raw, "apiVersion": None}).api_version == "workload.codeflare.dev/v1beta1"
