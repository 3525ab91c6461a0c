"""What the node-health rules say of a node, as the node's view carries it: an ``Effect`` and the ``Verdict``. Pure.

Contract:
- ``Effect`` names what a sick node means for the pods a rule concerns, as the taint effect of that meaning:
  ``PreferNoSchedule`` (used only when nothing else fits), ``NoSchedule`` (never planned, placed or pinned there),
  ``NoExecute`` (as NoSchedule, and a running AppWrapper with such pods there is reset onto other nodes).
  ``strength`` orders them (NoExecute over NoSchedule over PreferNoSchedule); ``keeps_off`` is True for the two
  that keep pods off the node.
- ``Verdict``: why a node is sick for pods that request ``resource``: the label and value that say so, and the
  effect. ``NodeView.health`` (``mcad.api.views``) holds a node's verdicts; the rules that make them are the
  controller's (``mcad.model.nodehealth``).
- ``Verdict.describe()`` says why in words a status message can carry: "labelled
  autopilot.ibm.com/gpuhealth=TESTING (no nvidia.com/gpu pods)".

These live with the views, below the model, because a node's view carries them: ``mcad.api`` imports nothing of
``mcad.model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Effect(StrEnum):
    PREFER_NOT = "PreferNoSchedule"
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"

    @property
    def strength(self) -> int:
        return _STRENGTH[self]

    @property
    def keeps_off(self) -> bool:
        """No pod of the rule's resource is planned, placed or pinned on such a node."""
        return self is not Effect.PREFER_NOT


_STRENGTH = {Effect.PREFER_NOT: 1, Effect.NO_SCHEDULE: 2, Effect.NO_EXECUTE: 3}


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a node is sick for a pod: the label and value that say so, and the effect."""

    effect: Effect
    label: str
    value: str
    resource: str = ""  # the pods it concerns: those that request this resource

    def describe(self) -> str:
        """Why a node is avoided, after "node n-1 is ...": the label that says so, and for which pods."""
        if self.effect is Effect.PREFER_NOT:
            return f"labelled {self.label}={self.value} ({self.resource} pods only when nothing else fits)"
        return f"labelled {self.label}={self.value} (no {self.resource} pods)"
