"""Where the controller's writes go (``mcad.k8s.requestcounts.resource_of``, ``ApiWriteCounts``): named as the API
server's own metrics name them, so that the two counts can be set side by side (the churn benchmark does)."""

from __future__ import annotations

import pytest

from mcad.k8s.requestcounts import ApiWriteCounts, resource_of


@pytest.mark.parametrize(("path", "resource"), [
    ("/api/v1/namespaces/team/configmaps", "configmaps"),
    ("/api/v1/namespaces/team/configmaps/cm-1", "configmaps"),
    ("/api/v1/namespaces/team/pods/p-1/binding", "pods/binding"),
    ("/api/v1/namespaces/team/events/aw.17a", "events"),
    ("/api/v1/namespaces/team", "namespaces"),
    ("/api/v1/nodes/n-1/status", "nodes/status"),
    ("/apis/workload.codeflare.dev/v1beta1/namespaces/team/appwrappers/aw/status",
     "appwrappers.workload.codeflare.dev/status"),
    ("/apis/batch/v1/namespaces/team/jobs/train?fieldManager=mcad", "jobs.batch"),
    ("/apis/coordination.k8s.io/v1/namespaces/mcad-system/leases/mcad-controller", "leases.coordination.k8s.io"),
    ("/", "unknown"),
])
def test_a_path_names_its_resource_as_the_api_server_does(path: str, resource: str) -> None:
    assert resource_of(path) == resource


def test_writes_are_counted_by_verb_and_resource() -> None:
    counts = ApiWriteCounts()
    counts.add("create", "configmaps")
    counts.add("create", "configmaps")
    counts.add("patch", "appwrappers.workload.codeflare.dev/status")
    assert counts.snapshot() == {("create", "configmaps"): 2, ("patch", "appwrappers.workload.codeflare.dev/status"): 1}
