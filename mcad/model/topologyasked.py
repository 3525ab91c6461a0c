"""What an AppWrapper asks of the network topology, as the metrics count it: each level and how it is asked.

Contract:
- ``asked(aw)``: ``(level, ask)`` for each level the AppWrapper or one of its pod sets names (``mcad.api.topologyasks``:
  the AppWrapper's annotations and Kueue's pod-set ones), ``ask`` being ``REQUIRED`` or ``PREFERRED``; each pair
  once, required ones first, then in the order the AppWrapper names them (itself, then its pod sets). A level both
  required and preferred is listed under each. () for an AppWrapper that asks nothing.
- Pure. Kept apart from ``mcad.model.topology`` (the placement), which says nothing of how it is asked.
"""

from __future__ import annotations

from typing import Final

from mcad.api.appwrapper import AppWrapperView

REQUIRED: Final = "required"
PREFERRED: Final = "preferred"
ASKS: Final = (REQUIRED, PREFERRED)


def asked(aw: AppWrapperView) -> tuple[tuple[str, str], ...]:
    """Each (level, ask) ``aw`` names once (see the module docstring)."""
    required = [aw.topology_required, *(group.topology_required for group in aw.gang)]
    preferred = [aw.topology_preferred, *(group.topology_preferred for group in aw.gang)]
    pairs = [(level, REQUIRED) for level in required if level] + [(level, PREFERRED) for level in preferred if level]
    return tuple(dict.fromkeys(pairs))
