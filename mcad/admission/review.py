"""The mutating and validating reviewers of AppWrappers (placeholder: admits everything until the checks land).

Contract: ``facts_for(conn)`` the cached kube-backed ``Facts``; ``build(facts, config)`` returns
``(mutate, validate)``, two ``Reviewer``s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcad.admission.facts import Facts
from mcad.admission.request import AdmissionRequest, Outcome, Reviewer


@dataclass(frozen=True)
class AdmissionConfig:
    """What the admin decides (flags and chart values)."""

    # Kinds users may wrap, as (group, resource); empty means any kind the user may create themselves.
    allowed_kinds: frozenset[tuple[str, str]] = frozenset()
    # Namespaces where AppWrappers are refused unless listed in allowed_namespaces.
    protected_namespaces: frozenset[str] = frozenset({"kube-system"})
    allowed_namespaces: frozenset[str] = frozenset()
    extra: dict[str, str] = field(default_factory=dict)


def facts_for(conn: object) -> Facts:
    """The kube-backed Facts of the controller (placeholder until the checks land)."""
    raise NotImplementedError("admission facts land with issue 15")


def build(facts: Facts, config: AdmissionConfig) -> tuple[Reviewer, Reviewer]:
    def mutate(request: AdmissionRequest) -> Outcome:
        return Outcome.allow()

    def validate(request: AdmissionRequest) -> Outcome:
        return Outcome.allow()

    return mutate, validate
