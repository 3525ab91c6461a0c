"""The apply body encoding: UTF-8 JSON that a YAML decoder reads back exactly (mcad.k8s.kube.yaml_safe_json)."""

from __future__ import annotations

import json

import pytest
import yaml

from mcad.k8s.kube import yaml_safe_json


@pytest.mark.parametrize("text", [
    "ok \U0001f600",                      # outside the BMP: json.dumps alone writes a surrogate pair YAML refuses
    "\x7f \x80 \x9f",                     # DEL and C1 controls, not printable in YAML
    "a\x85b\u2028c\u2029d",               # line breaks to a YAML 1.1 decoder, folded if sent raw
    "\ufeff bom \ufffe \uffff",           # the byte-order mark and non-characters
    "tab\tnew\nline\x00nul \"quoted\" \\ back",
    "日本語 é ß",
])
def test_text_reads_back_unchanged_through_a_yaml_decoder(text: str) -> None:
    body = {"metadata": {"annotations": {"k": text}}, "data": {text: text}, "n": [1, 2.5, None, True]}
    encoded = yaml_safe_json(body)
    assert yaml.safe_load(encoded.decode("utf-8")) == body
    assert json.loads(encoded) == body


def test_readable_text_is_sent_raw_not_escaped() -> None:
    assert yaml_safe_json({"m": "ok \U0001f600 é"}) == '{"m":"ok \U0001f600 é"}'.encode()
