"""JSON text from the API server or a webhook caller, parsed whatever its nesting: what Python's decoder cannot.

Contract:
- ``loads(data)`` is ``json.loads(data)`` for every document Python's decoder parses (``mcad.api.fastjson.loads``,
  which is that at orjson's speed). The decoder recurses once per nested object or array and gives up with
  ``RecursionError`` near 1,000 levels, while the API server stores objects nested up to 10,000 deep (its own
  decoder's limit): a tenant's AppWrapper so nested would break every list and watch of AppWrappers, and every
  admission review of it, for everyone. So on ``RecursionError`` the text is parsed again with each object or array
  deeper than ``CUT_DEPTH`` replaced by the string ``CUT_MARKER``: the document keeps every field up to that depth (an
  AdmissionReview its uid, a list its other items), and what judges an AppWrapper's nesting (``mcad.api.validation``,
  which allows far less than ``CUT_DEPTH``) refuses it as nested too deep.
- Finding the cuts runs over the text once, without recursion: strings are skipped whole by one regular
  expression, brackets outside them are counted. Invalid JSON still raises ``ValueError`` (from the second
  parse), as ``json.loads`` does.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from mcad.api import fastjson

# Deeper containers are cut on the slow path; well above the deepest real Kubernetes object (a pod template inside a
# RayCluster inside an AppWrapper is some 20 levels) and well below where Python's decoder gives up.
CUT_DEPTH: Final = 200
CUT_MARKER: Final = "<nested more than 200 levels deep: cut>"
_TOKENS: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_OPEN: Final = frozenset(b"[{")


def loads(data: bytes | str) -> Any:
    try:
        return fastjson.loads(data)
    except RecursionError:
        raw = data.encode() if isinstance(data, str) else data
        try:
            return json.loads(cut(raw))
        except RecursionError as err:  # brackets that never close: not JSON
            raise ValueError(f"JSON nested more than {CUT_DEPTH} levels deep is not closed") from err


def cut(data: bytes, depth_limit: int = CUT_DEPTH) -> bytes:
    """``data`` with each object or array nested deeper than ``depth_limit`` replaced by ``CUT_MARKER`` (quoted)."""
    marker = json.dumps(CUT_MARKER).encode()
    pieces: list[bytes] = []
    kept_from = 0
    depth = 0
    cut_at = -1  # where the container being cut starts, -1 when none is
    for token in _TOKENS.finditer(data):
        first = token.group()[0]
        if first == 0x22:  # '"': a string, skipped whole
            continue
        if first in _OPEN:
            depth += 1
            if depth == depth_limit + 1 and cut_at < 0:
                cut_at = token.start()
            continue
        if depth == depth_limit + 1 and cut_at >= 0:
            pieces += [data[kept_from:cut_at], marker]
            kept_from = token.end()
            cut_at = -1
        depth -= 1
    pieces.append(data[kept_from:])
    return b"".join(pieces)
