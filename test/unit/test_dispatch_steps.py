"""A dispatch job (``mcad.k8s.dispatchjob.create_objects``) takes one write-pool step per API request: the read of
its templates is a step of its own only when the API server answered it; read from the templates cache (an answer
without a resourceVersion, ``mcad.k8s.templates``), the first create comes in the same step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from mcad.api.appwrapper import KIND, AppWrapperView, appwrapper_view
from mcad.k8s import apply
from mcad.k8s.dispatchjob import Dispatched, create_objects
from mcad.k8s.templates import Templates, TemplatesFirst, object_key
from test.unit.test_apply import Writer, requests_per_step

AW_VERSION = "workload.codeflare.dev/v1beta1"


class AppWrapperReads(Writer):
    """``Writer``, which also answers the read of the AppWrapper ``aw`` as the API server does (a resourceVersion
    in its metadata), counting it as a request."""

    def __init__(self, aw: AppWrapperView, items: list[dict[str, Any]]) -> None:
        super().__init__()
        self.aw, self.items = aw, items

    def read(self, api_version: str, kind: str, namespace: str, name: str, *,  # type: ignore[override]
             not_older_than: str = "") -> Mapping[str, Any]:
        if kind != KIND:
            return super().read(api_version, kind, namespace, name)
        self.requests.append(("read", name))
        return {"apiVersion": api_version, "kind": kind,
                "metadata": {"name": name, "namespace": namespace, "uid": self.aw.uid,
                             "generation": self.aw.generation, "resourceVersion": "7"},
                "spec": {"resources": {"GenericItems": self.items}}}


class Here:
    """The sites of a single cluster, as far as a dispatch job uses them."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer

    def apply_steps(self, aw: AppWrapperView, items: Sequence[Mapping[str, Any]],
                    cluster: str) -> apply.Steps[tuple[str, ...]]:
        return apply.dispatch_steps(self.writer, aw, items)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cached", "steps"), [(True, [1, 1]), (False, [1, 1, 1])], ids=["cache", "api-server"])
def test_a_dispatch_of_two_objects_takes_a_step_per_request(cached: bool, steps: list[int]) -> None:
    items = [{"generictemplate": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm{i}"}}}
             for i in range(2)]
    # As the informer saw it: a dispatch reads its templates no older than this resourceVersion.
    aw = appwrapper_view({"metadata": {"name": "aw", "namespace": "team", "uid": "u-1", "generation": 1,
                                       "resourceVersion": "5"}, "spec": {"resources": {"GenericItems": items}}})
    writer = AppWrapperReads(aw, items)
    through: Any = writer
    if cached:
        templates = Templates()
        templates.keep(object_key(AW_VERSION, "team", "aw"), aw.uid, aw.generation,
                       {"spec": {"resources": {"GenericItems": items}}})
        through = TemplatesFirst(writer, templates)
    counts, outcome = requests_per_step(writer, create_objects(through, Here(writer), aw, {}))  # type: ignore[arg-type]
    assert isinstance(outcome, Dispatched) and outcome.error is None and not outcome.stale
    assert outcome.uids == ("uid-cm0", "uid-cm1")
    assert counts == steps
    assert writer.requests == ([] if cached else [("read", "aw")]) + [("create", "cm0"), ("create", "cm1")]
