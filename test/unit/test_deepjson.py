"""JSON nested deeper than Python's decoder goes (mcad.api.deepjson): parsed, the deep parts cut, nothing else lost."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcad.api import deepjson
from mcad.api.validation import problems


def nested(depth: int, leaf: Any = "leaf") -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def test_what_pythons_decoder_parses_is_parsed_as_it_does() -> None:
    doc = {"a": [1, 2.5, None, True, {"s": "x\"]}[{\\"}], "deep": nested(150)}
    text = json.dumps(doc).encode()
    assert deepjson.loads(text) == json.loads(text) == doc
    assert deepjson.cut(text) == text, "nothing is cut that is not nested deeper than the cut"


def test_an_admission_review_nested_3000_deep_keeps_its_uid_and_is_refused_as_too_deep() -> None:
    appwrapper = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                  "metadata": {"name": "deep", "namespace": "ns"},
                  "spec": {"resources": {"GenericItems": [{"generictemplate": {
                      "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": "DEEP"}}]}}}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u-1", "object": appwrapper}, "after": "kept"}
    # Built as text: Python's encoder recurses as its decoder does.
    text = json.dumps(review).replace('"DEEP"', "[" * 3000 + '"\\"]}"' + "]" * 3000).encode()
    with pytest.raises(RecursionError):
        json.loads(text)
    parsed = deepjson.loads(text)
    assert parsed["request"]["uid"] == "u-1" and parsed["after"] == "kept"
    assert problems(parsed["request"]["object"]) == [
        "the AppWrapper nests objects and arrays more than 100 levels deep; at most 100 are allowed"]


def test_the_cut_replaces_each_too_deep_container_with_the_marker() -> None:
    text = b'{"a": [[[1]]], "b": [["]]]"], {"c": []}], "d": 2}'
    assert json.loads(deepjson.cut(text, depth_limit=2)) == {
        "a": [deepjson.CUT_MARKER], "b": [deepjson.CUT_MARKER, deepjson.CUT_MARKER], "d": 2}


def test_deep_text_that_is_not_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested more than 200 levels deep is not closed"):
        deepjson.loads(b"[" * 5000)
    with pytest.raises(ValueError):
        deepjson.loads(b"[" * 3000 + b"1" + b"]" * 2999 + b"}")
