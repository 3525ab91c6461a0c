"""A tenant's fair-share weight: what the cluster admin may set, and how a written value is read.

Contract:
- Fair sharing (``mcad.model.fairshare``) orders the tenants of one priority by usage / weight, so once two tenants
  are both busy, one of weight 2 ends up holding twice the share of one of weight 1.
- Only the admin sets a weight, on objects a tenant with rights only inside its namespaces cannot write: a namespace
  tenant's is its Namespace's label ``WEIGHT_LABEL`` (read by ``mcad.model.tenancy.namespace_policy``), a quota
  node's the field ``WEIGHT_FIELD`` of its child entry in the QuotaSubtree (read by ``mcad.model.quota``, with the
  node's limits). Nothing on an AppWrapper is ever read as a weight.
- ``parse_weight(value, where)`` -> (weight, problem): ``None`` (not set) is ``DEFAULT_WEIGHT`` with no problem; a
  JSON number, or ASCII decimal text (``2``, ``0.5``: a label's value is text), within [``MIN_WEIGHT``,
  ``MAX_WEIGHT``] is that weight; anything else is ``DEFAULT_WEIGHT`` and a problem naming ``where``, the value and
  the bounds, for the reader to report where the admin sees it. Never raises.
Pure.
"""

from __future__ import annotations

import math
import re
from typing import Final

WEIGHT_LABEL: Final = "mcad.codeflare.dev/fair-share-weight"
WEIGHT_FIELD: Final = "fairShareWeight"
DEFAULT_WEIGHT: Final = 1.0
# A ratio of 10,000 between the most and the least favoured tenant is more than any sharing policy asks for; a value
# outside is a slip (100000 for 1.00000, 0.0001 for "almost nothing", which would rather be a lower priority), and
# a weight near zero would make its tenant's score, usage / weight, outgrow every other's after a single dispatch.
MIN_WEIGHT: Final = 0.01
MAX_WEIGHT: Final = 100.0
# Text longer than this is not a weight (a label value is at most 63 characters anyway).
_TEXT = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6})?|\.[0-9]{1,6}")


def parse_weight(value: object, where: str) -> tuple[float, str]:
    """The weight ``value`` sets (see the module docstring), and why it was ignored ("" when it was not)."""
    if value is None:
        return DEFAULT_WEIGHT, ""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and _TEXT.fullmatch(value.strip()):
        # ASCII digits only: float() also reads other scripts' digits, "inf" and "1e9", which are not weights.
        number = float(value.strip())
    if number is not None and math.isfinite(number) and MIN_WEIGHT <= number <= MAX_WEIGHT:
        return number, ""
    return DEFAULT_WEIGHT, (f"{where}={value!r} is not a fair-share weight (a number from {MIN_WEIGHT:g} to "
                            f"{MAX_WEIGHT:g}); weight {DEFAULT_WEIGHT:g} applies")
