"""Topology annotations at admission: a value that is not a node label key is refused on create, naming the
annotation, where it is (the AppWrapper or a pod template's path) and why; an update is refused for a value it sets
or changes, never for one it leaves alone; valid levels are admitted, with a warning for a required level no node
carries yet, and a warning never refuses nor fails the review."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from mcad.admission import server, topology
from mcad.admission.request import Outcome
from mcad.admission.review import MAX_PROBLEM_CHARS, AdmissionConfig, build
from mcad.api.topologyasks import PODSET_PREFERRED, PODSET_REQUIRED, TOPOLOGY_PREFERRED, TOPOLOGY_REQUIRED
from test.unit.test_admission_review import (
    ADMIN,
    ALICE,
    FakeFacts,
    aw,
    cm,
    deleting,
    deployment,
    job,
    ray_cluster,
    refused,
    request,
    stored,
)

RACK = "topology.example.com/rack"
BLOCK = "topology.example.com/block"
NAME_RULE = "its name part must be letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"


class Nodes:
    """``NodeLabels`` over a fixed set of keys; ``answer`` replaces every answer (None: cannot tell)."""

    def __init__(self, *keys: str, answer: bool | str | None = "keys") -> None:
        self.keys = set(keys)
        self.answer = answer
        self.asked: list[str] = []

    def carried(self, key: str) -> bool | None:
        self.asked.append(key)
        if self.answer == "raise":
            raise RuntimeError("a bug in the node label keys")
        return key in self.keys if self.answer == "keys" else self.answer  # type: ignore[return-value]


def validate(obj: dict[str, Any], nodes: Any = None, **kw: Any) -> Outcome:
    _, check = build(FakeFacts({ALICE.username: "*", ADMIN.username: "*"}), AdmissionConfig(), node_labels=nodes)
    return check(request(obj, **kw))


def annotated(obj: dict[str, Any], **annotations: str) -> dict[str, Any]:
    obj["metadata"].setdefault("annotations", {}).update(annotations)
    return obj


def required(level: str, obj: dict[str, Any] | None = None) -> dict[str, Any]:
    return annotated(obj or aw(cm()), **{TOPOLOGY_REQUIRED: level})


def template_annotated(template: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """``template`` (a Job, a Deployment) with ``key: value`` in its pod template's annotations."""
    template["spec"]["template"].setdefault("metadata", {}).setdefault("annotations", {})[key] = value
    return template


# -- refused on create -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "why"), [
    ("bad key!", NAME_RULE),
    ("", "it is empty"),
    ("   ", "it is empty"),
    ("topology.example.com/", "the name part after the last '/' is empty"),
    ("Topology.Example.com/rack", "its prefix must be a DNS subdomain (lowercase letters, digits and '-', in parts "
                                  "joined by '.')"),
    ("/rack", "its prefix must be a DNS subdomain of 1 to 253 characters"),
    ("r" * 64, "its name part is 64 characters long (at most 63)"),
], ids=["punctuation", "empty", "blank", "no-name", "uppercase-prefix", "empty-prefix", "long-name"])
@pytest.mark.parametrize("annotation", [TOPOLOGY_REQUIRED, TOPOLOGY_PREFERRED])
def test_an_appwrapper_annotation_that_is_not_a_label_key_is_refused(annotation: str, value: str, why: str) -> None:
    message = refused(validate(annotated(aw(cm()), **{annotation: value})))
    quoted = repr(value) if len(value) <= topology.QUOTED_CHARS else repr(value[:topology.QUOTED_CHARS] + "...")
    assert message == f"annotation {annotation}: {quoted} is not a node label key: {why}"


def test_a_pod_template_annotation_is_refused_naming_the_item_and_the_template() -> None:
    message = refused(validate(aw(template_annotated(job(), PODSET_REQUIRED, "rack!"))))
    assert message == (f"GenericItems[0] (Job train): generictemplate.spec.template.metadata.annotations"
                       f"[{PODSET_REQUIRED}]: 'rack!' is not a node label key: {NAME_RULE}")


def test_every_template_the_controller_finds_pods_in_is_judged() -> None:
    ray = ray_cluster()
    ray["spec"]["workerGroupSpecs"][0]["template"]["metadata"] = {"annotations": {PODSET_PREFERRED: "a/b/c"}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {PODSET_REQUIRED: 5}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    message = refused(validate(aw(ray, pod)))
    assert message.split("; ")[:2] == [
        f"GenericItems[0] (RayCluster ray): generictemplate.spec.workerGroupSpecs[0].template.metadata.annotations"
        f"[{PODSET_PREFERRED}]: 'a/b/c' is not a node label key: its prefix must be a DNS subdomain (lowercase "
        f"letters, digits and '-', in parts joined by '.')",
        # A bare Pod's template is the Pod: its own annotations; a value that is not a string names no label.
        f"GenericItems[1] (Pod p): generictemplate.metadata.annotations[{PODSET_REQUIRED}]: 5 is not a node label "
        f"key: it is not a string",
    ]


def test_a_long_value_is_cut_so_the_reason_shows_within_the_bound() -> None:
    value = "x" * 5000
    message = refused(validate(required(value)))
    assert len(message) <= MAX_PROBLEM_CHARS
    assert message == (f"annotation {TOPOLOGY_REQUIRED}: '{'x' * topology.QUOTED_CHARS}...' is not a node label "
                       f"key: its name part is 5000 characters long (at most 63)")


def test_topology_problems_are_named_with_the_others_in_one_message() -> None:
    bad_job = template_annotated(job(), PODSET_PREFERRED, "-rack")
    elsewhere = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "team-b"}}
    obj = annotated(aw(bad_job, elsewhere), **{TOPOLOGY_REQUIRED: "a b"})
    problems = refused(validate(obj)).split("; ")
    assert problems[0] == f"annotation {TOPOLOGY_REQUIRED}: 'a b' is not a node label key: {NAME_RULE}"
    assert problems[1] == (f"GenericItems[0] (Job train): generictemplate.spec.template.metadata.annotations"
                           f"[{PODSET_PREFERRED}]: '-rack' is not a node label key: {NAME_RULE}")
    assert problems[2].startswith("GenericItems[1] (ConfigMap cfg): metadata.namespace 'team-b' differs")


# -- admitted --------------------------------------------------------------------------------------------------------


def test_valid_levels_are_admitted_wherever_they_are() -> None:
    # Required and preferred naming the same level: one domain of it, which both ask.
    same = annotated(aw(cm()), **{TOPOLOGY_REQUIRED: RACK, TOPOLOGY_PREFERRED: RACK})
    assert validate(same).allowed
    # Required on the AppWrapper and asks of its pod sets: the gang in one block, each pod set's ask inside it.
    nested = template_annotated(template_annotated(job(), PODSET_REQUIRED, RACK), PODSET_PREFERRED,
                                "kubernetes.io/hostname")
    assert validate(annotated(aw(nested, deployment()), **{TOPOLOGY_REQUIRED: BLOCK})).allowed
    # What the controller reads: the value stripped.
    assert validate(required(f" {RACK} ")).allowed
    # No annotation, and Kueue's annotations on a kind whose templates the controller does not read.
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
              "spec": {"template": {"metadata": {"annotations": {PODSET_REQUIRED: "not read!"}}}}}
    assert topology.judge(aw(cm(), widget)).problems == []


# -- update ----------------------------------------------------------------------------------------------------------


def test_an_update_that_sets_or_changes_a_level_to_a_refused_one_is_refused() -> None:
    old = stored(aw(cm()))
    new = required("rack!", copy.deepcopy(old))
    assert refused(validate(new, old=old)) == \
        f"annotation {TOPOLOGY_REQUIRED}: 'rack!' is not a node label key: {NAME_RULE}"
    old = required(RACK, old)
    new = annotated(copy.deepcopy(old), **{TOPOLOGY_PREFERRED: "a//b"})
    assert refused(validate(new, old=old)).startswith(f"annotation {TOPOLOGY_PREFERRED}: 'a//b' is not a node label")
    assert validate(required(BLOCK, copy.deepcopy(old)), old=old).allowed


def test_an_update_is_not_refused_for_a_value_it_leaves_alone() -> None:
    # Stored before admission judged the levels (or around the webhook).
    old = required("rack!", stored(aw(template_annotated(job(), PODSET_REQUIRED, "also bad"))))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    new["metadata"]["annotations"]["note"] = "edited"
    assert validate(new, old=old).allowed


def test_an_appwrapper_being_deleted_lets_its_finalizers_go_but_takes_no_refused_level() -> None:
    old = required("rack!", deleting(aw(cm())))
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    facts = FakeFacts(broken="down")
    _, check = build(facts, AdmissionConfig())
    assert check(request(new, old=old)).allowed
    new = annotated(new, **{TOPOLOGY_PREFERRED: "also bad"})
    assert refused(check(request(new, old=old))).startswith(f"annotation {TOPOLOGY_PREFERRED}: 'also bad'")
    assert facts.asked == []


# -- warnings --------------------------------------------------------------------------------------------------------


def test_a_required_level_no_node_carries_is_admitted_with_a_warning() -> None:
    outcome = validate(required(BLOCK), Nodes(RACK))
    assert outcome.allowed
    assert outcome.warnings == (f"no node has the label '{BLOCK}' yet: the AppWrapper waits until one does "
                                f"(annotation {TOPOLOGY_REQUIRED})",)
    # kubectl prints what the AdmissionReview answer carries.
    assert outcome.response("r-1")["response"]["warnings"] == list(outcome.warnings)
    # One a node carries: no warning.
    assert validate(required(RACK), Nodes(RACK)).warnings == ()


def test_a_pod_sets_required_level_is_warned_of_naming_its_template() -> None:
    obj = aw(template_annotated(job(), PODSET_REQUIRED, BLOCK))
    assert validate(obj, Nodes(RACK)).warnings == (
        f"no node has the label '{BLOCK}' yet: the AppWrapper waits until one does (annotation {PODSET_REQUIRED} of "
        f"GenericItems[0] (Job train) generictemplate.spec.template)",)


def test_preferred_levels_get_no_warning() -> None:
    # One no node carries falls back to larger levels, then to the whole cluster: nothing waits for it.
    obj = annotated(aw(template_annotated(job(), PODSET_PREFERRED, BLOCK)), **{TOPOLOGY_PREFERRED: BLOCK})
    nodes = Nodes()
    assert validate(obj, nodes).warnings == ()
    assert nodes.asked == []


def test_one_warning_per_level_and_a_bounded_number_of_them() -> None:
    levels = [f"topology.example.com/level-{i}" for i in range(topology.MAX_WARNINGS + 2)]
    jobs = [template_annotated(job(f"j{i}"), PODSET_REQUIRED, level) for i, level in enumerate(levels)]
    jobs.append(template_annotated(job("again"), PODSET_REQUIRED, levels[0]))
    obj = required(levels[0], aw(*jobs))
    nodes = Nodes()
    warnings = validate(obj, nodes).warnings
    assert sorted(set(nodes.asked)) == sorted(levels) and len(nodes.asked) == len(levels)
    assert len(warnings) == topology.MAX_WARNINGS + 1
    assert warnings[0].endswith(f"(annotation {TOPOLOGY_REQUIRED})")
    assert warnings[-1] == "and 2 more required levels that no node has yet"
    # Each within what the API server shows whole, however long the item's name.
    long_name = template_annotated(job("n" * 250), PODSET_REQUIRED, "r" * 63)
    (warning,) = validate(aw(long_name), nodes).warnings
    assert len(warning) <= topology.MAX_WARNING_CHARS
    assert warning.startswith(f"no node has the label '{'r' * 63}' yet: the AppWrapper waits until one does")


def test_no_warning_when_the_nodes_cannot_tell_and_a_failing_lookup_still_admits() -> None:
    assert validate(required(BLOCK), None).warnings == ()
    assert validate(required(BLOCK), Nodes(answer=None)).warnings == ()
    outcome = validate(required(BLOCK), Nodes(answer="raise"))
    assert outcome.allowed and outcome.warnings == ()


def test_an_update_warns_only_of_a_level_it_sets_or_changes() -> None:
    old = required(BLOCK, stored(aw(template_annotated(job(), PODSET_REQUIRED, BLOCK))))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    assert validate(new, Nodes(), old=old).warnings == ()
    new = required("topology.example.com/zone", copy.deepcopy(old))
    assert validate(new, Nodes(), old=old).warnings == (
        "no node has the label 'topology.example.com/zone' yet: the AppWrapper waits until one does (annotation "
        f"{TOPOLOGY_REQUIRED})",)
    # Nor while it is being deleted.
    going = required(BLOCK, deleting(aw(cm())))
    assert validate(required("topology.example.com/zone", copy.deepcopy(going)), Nodes(), old=going).warnings == ()


def test_the_webhook_answer_carries_the_warnings() -> None:
    _, check = build(FakeFacts({ALICE.username: "*"}), AdmissionConfig(), node_labels=Nodes())
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "operation": "CREATE", "kind": {"group": "workload.codeflare.dev"}, "namespace": "team-a",
        "name": "job", "userInfo": {"username": ALICE.username}, "object": required(BLOCK)}}
    code, answer = server.review("validate", check, json.dumps(review).encode())
    assert code == 200 and answer["response"]["allowed"] is True
    assert answer["response"]["warnings"] == [
        f"no node has the label '{BLOCK}' yet: the AppWrapper waits until one does (annotation {TOPOLOGY_REQUIRED})"]
