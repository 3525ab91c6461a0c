"""The mcad.ibm.com CRD is the current one under the old group: same schema, same printer columns, same status
subresource; only the names and the missing short name differ. A field added to one and not the other fails here."""

from __future__ import annotations

from typing import Any

import yaml

from mcad.api.appwrapper import appwrapper_view
from test.support import REPO

CURRENT = REPO / "config" / "crd" / "workload.codeflare.dev_appwrappers.yaml"
LEGACY = REPO / "config" / "crd" / "legacy" / "mcad.ibm.com_mcadappwrappers.yaml"


def test_the_legacy_crd_is_the_current_one_under_the_old_group() -> None:
    current: dict[str, Any] = yaml.safe_load(CURRENT.read_text())
    legacy: dict[str, Any] = yaml.safe_load(LEGACY.read_text())
    assert legacy["metadata"] == {"name": "mcadappwrappers.mcad.ibm.com"}
    assert legacy["spec"]["group"] == "mcad.ibm.com"
    # A resource name of its own, no short name, no category: plain kubectl names keep meaning the current group.
    assert legacy["spec"]["names"] == {"kind": "AppWrapper", "listKind": "AppWrapperList",
                                       "plural": "mcadappwrappers", "singular": "mcadappwrapper"}
    assert legacy["spec"]["versions"] == current["spec"]["versions"]
    assert legacy["spec"]["scope"] == current["spec"]["scope"]


def test_a_view_remembers_the_api_it_came_from() -> None:
    raw = {"apiVersion": "mcad.ibm.com/v1beta1", "kind": "AppWrapper",
           "metadata": {"name": "a", "namespace": "ns"}, "spec": {"resources": {"GenericItems": [
               {"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}}]}}}
    assert appwrapper_view(raw).api_version == "mcad.ibm.com/v1beta1"
    assert appwrapper_view({**raw, "apiVersion": None}).api_version == "workload.codeflare.dev/v1beta1"
