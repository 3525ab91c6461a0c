"""The verdict of one fit check: whether a queued AppWrapper can be dispatched now, and if not, what blocks it.

Contract: ``about`` is what blocks it, compared between cycles to decide whether its Backoff message must be
rewritten; ``why`` builds that message only when it is written; ``plan`` (--fit=nodes) says how many pods of
which requests go on which node; ``cluster`` (hub mode) names the worker the whole gang goes to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mcad.api.resources import ResourceVector


@dataclass(frozen=True, slots=True)
class Fit:
    fits: bool
    about: frozenset[str] = frozenset()  # what blocks it (compared to decide whether to rewrite its status)
    why: Callable[[], str] = str  # the Backoff message, built only when it is written
    plan: tuple[tuple[str, ResourceVector, int], ...] = ()  # --fit=nodes: (node, pod requests, pods)
    cluster: str = ""  # hub mode: the worker it goes to
