"""JSON in and out at orjson's speed where its answer is Python's ``json`` module's, with that module where not.

With Python's ``json``, parsing watch events and answers and encoding request bodies and kept statuses take about a
tenth of the controller's CPU under churn; orjson does the same work in a half (parsing) to a ninth (encoding) of
the time.

Contract:
- ``loads(data)`` (bytes or str) is ``json.loads(data)`` for every document the API server sends. orjson parses
  it; what orjson refuses (NaN or Infinity, numbers beyond a float's range, lone surrogates, nesting deeper than
  its limit, invalid JSON) is handed to ``json.loads``, whose answer or error stands (``mcad.api.deepjson`` parses
  deeper nesting). One difference remains, and the API server never shows it: orjson reads an integer beyond 64
  bits as a float, where ``json.loads`` keeps an int. The API server stores such a number as a float already
  (Kubernetes' JSON decoding keeps a number as an int64 when it fits, else as a float64), so what it sends holds
  none.
- ``dumps(value, *, sort_keys=False, default=None)`` is the UTF-8 bytes of compact JSON text that ``json.loads``
  reads back as ``value``, keys sorted if asked, ``default(obj)`` standing for what JSON has no type for (as in
  ``json.dumps``). orjson writes it, non-ASCII characters raw. What orjson cannot encode (an integer beyond 64
  bits, a key that is not a string, a string with a lone surrogate, nesting deeper than its limit) is encoded by
  ``json.dumps`` instead, as ASCII with every other character escaped; its ``TypeError``, ``ValueError`` or
  ``RecursionError`` then stand. A float that is NaN or infinite, which no JSON parser accepts, is written as
  ``null`` by orjson (``NaN`` by ``json.dumps``); nothing the API server sends holds one.
- ``dumps_text(value)`` is the same text as a ``str`` whose every non-ASCII character is raw, from either encoder
  (``json.dumps`` with ``ensure_ascii=False``), lone surrogates included: for a caller that escapes some
  characters its own way before encoding (``mcad.k8s.kube.yaml_safe_json``).
- Pure functions; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(value: Any, *, sort_keys: bool = False, default: Callable[[Any], Any] | None = None) -> bytes:
    try:
        return orjson.dumps(value, default=default, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys, default=default).encode("ascii")


def dumps_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode("utf-8")
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
