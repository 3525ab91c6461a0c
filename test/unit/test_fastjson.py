"""JSON at orjson's speed: the same documents as Python's ``json`` module, read and written."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcad.api import deepjson, fastjson

SAMPLES = sorted((Path(__file__).parents[2] / "config" / "samples").glob("*.yaml"))


def api_objects() -> list[Any]:
    """The sample AppWrappers as the API server would send them, in a watch event and a list."""
    objects = [doc for path in SAMPLES for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert objects, "the samples are there"
    return [{"type": "ADDED", "object": obj} for obj in objects] + [{"kind": "List", "items": objects}]


EDGES = [
    '{"a": 1, "a": 2}',  # the last wins
    '[1.0, -0.0, 1E-400, 5e-324, 1.7976931348623157e308, 0.1]',
    '[9223372036854775807, -9223372036854775808, 18446744073709551615]',
    '{"s": "\\u00e9\\u2028\\ud83d\\ude00 \\"q\\" \\\\ \\/ \\u0000", "t": "é \u2028 😀"}',
    ' { "spaced" : [ 1 , true , false , null ] } ',
    '"\\ud800"',  # a lone surrogate: orjson refuses, json reads it
    'NaN', '[Infinity, -Infinity]', '1e400',  # not JSON, yet json reads them
    '[' * 900 + ']' * 900,
]
INVALID = ['[]x', '{"a": }', '"\x01"', '', '[1, 2']


@pytest.mark.parametrize("text", EDGES)
def test_what_it_reads_is_what_json_reads(text: str) -> None:
    expected = json.loads(text)
    for data in (text, text.encode("utf-8", "surrogatepass")):
        got = fastjson.loads(data)
        assert repr(got) == repr(expected)  # repr: tells -0.0 from 0.0 and 1 from 1.0, and sees NaN as itself


def test_api_objects_read_alike() -> None:
    for doc in api_objects():
        text = json.dumps(doc)
        assert fastjson.loads(text.encode()) == json.loads(text) == doc


@pytest.mark.parametrize("text", INVALID)
def test_what_json_refuses_it_refuses_as_json_does(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        fastjson.loads(text)


def test_nesting_deeper_than_both_parsers_is_still_cut_by_deepjson() -> None:
    text = '{"kind": "x", "spec": ' + "[" * 5000 + "]" * 5000 + "}"
    assert deepjson.loads(text)["kind"] == "x"


def test_an_integer_beyond_64_bits_reads_as_a_float_as_the_api_server_stores_it() -> None:
    # The documented difference: the API server never sends one (it keeps such a number as a float64).
    assert fastjson.loads("123456789012345678901234567890") == pytest.approx(1.2345678901234568e29)


VALUES: list[Any] = [
    *api_objects(),
    {"é": "\u2028 😀 \x7f \x01", "n": [0, -1, 2**63 - 1, 1.5, -0.0, True, None], "nested": {"b": 1, "a": [{}]}},
    {"big": 2**70},  # orjson cannot: json writes it
    {"lone": "\ud800"},  # orjson cannot: json escapes it
    ("a", "tuple"),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_what_it_writes_reads_back_as_the_value(value: Any) -> None:
    data = fastjson.dumps(value)
    data.decode("utf-8")  # valid UTF-8 whichever encoder wrote it
    back = json.loads(data)
    expected = json.loads(json.dumps(value))
    assert back == expected
    text = fastjson.dumps_text(value)
    assert json.loads(text) == expected
    assert "\\u00e9" not in text and "\\u2028" not in text, "non-ASCII characters are raw"


def test_sorted_keys_and_a_default_as_json_dumps_has_them() -> None:
    value = {"b": {"y": 1, "x": 2}, "a": object.__new__(Path)}
    assert fastjson.dumps(value, sort_keys=True, default=lambda _: "p") == b'{"a":"p","b":{"x":2,"y":1}}'
    assert fastjson.dumps({"k": 2**70, "a": 1}, sort_keys=True) == b'{"a":1,"k":%d}' % 2**70  # via json
    with pytest.raises(TypeError):
        fastjson.dumps({"x": object()})
    with pytest.raises(TypeError):
        fastjson.dumps({"x": object(), "big": 2**70})  # json's own error, once orjson gave up


def test_a_float_json_has_no_text_for_is_written_as_null() -> None:
    # Documented: nothing the API server sends holds one.
    assert fastjson.dumps({"x": math.nan, "y": math.inf}) == b'{"x":null,"y":null}'
