"""Admission of the topology annotations: levels that are not node label keys are refused, required levels that no
node carries yet are admitted with a warning.

Contract:
- What is judged (``mcad.api.topologyasks``): ``TOPOLOGY_REQUIRED`` and ``TOPOLOGY_PREFERRED`` in the AppWrapper's
  own annotations, and Kueue's ``PODSET_REQUIRED`` and ``PODSET_PREFERRED`` in the metadata annotations of every pod
  template the controller finds pods in (``mcad.api.workloads.pod_sets``: Pods, the workload kinds, Jobs,
  RayClusters, PyTorchJobs; an item whose replica count cannot be read is skipped, the demand computation names
  it). Templates of other kinds are not read by the controller, so their annotations are not judged.
- ``judge(obj, old)`` returns ``Judged``. Its ``problems``: each annotation present whose value is not a valid
  node label key once stripped (what the controller reads, ``topologyasks.level``): not a string, empty, or
  ``topologyasks.label_key_error`` says why. Messages: ``annotation <key>: <value> is not a node label key: <why>``
  for the AppWrapper's own, and ``GenericItems[i] (Kind name): generictemplate.<template
  path>.metadata.annotations[<key>]: <value> is not a node label key: <why>`` for a pod template's; the value
  quoted is cut to ``QUOTED_CHARS``, so the reason always shows within the refusal's bound. ``old`` None (CREATE):
  all of them. On UPDATE (``old`` the stored object): an AppWrapper annotation the update sets or changes to a
  refused value, and any pod-template problem the stored object did not have (``spec.resources`` cannot change
  after create anyway); one left unchanged is never refused, so an update that removes a finalizer or edits a
  label is never refused for what was stored before this rule.
- Not refused: required and preferred naming the same level (one domain of it, which both ask), and a required
  level on the AppWrapper with pod-set asks inside it: the controller honours both, the whole gang in one domain
  of the AppWrapper's level and each pod set's ask within that domain (``mcad.model.topology``).
- ``Judged.required``: the required levels (the AppWrapper's, or a pod set's) that are valid keys, each with the
  first place it is asked; on UPDATE only the AppWrapper's, when the update sets or changes it.
- ``warnings(required, nodes)``: for each of those that ``nodes`` says no node carries (``NodeLabels.carried`` is
  False), one warning: ``no node has the label '<level>' yet: the AppWrapper waits until one does (annotation
  <key>)``, a pod set's naming its template (``... (annotation <key> of GenericItems[i] (Kind name)
  generictemplate.<template path>)``). At most ``MAX_WARNINGS`` (then how many more); each cut to
  ``MAX_WARNING_CHARS``, which the API server shows whole. Preferred levels get none: one no node carries falls
  back to larger levels. ``nodes`` None, or answering None (not synced, too many keys, busy), gives no warning.
- ``judge`` is pure and never raises on any JSON value; it walks the pod templates once (and the stored object's
  only when the new one has a problem in them). ``warnings`` reads only ``nodes``: its caller keeps a failure
  there from refusing anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from mcad.admission.facts import NodeLabels
from mcad.api import topologyasks
from mcad.api.raw import as_list, as_mapping
from mcad.api.validation import describe_item
from mcad.api.workloads import WorkloadError, format_path, join_path, pod_sets

# A value quoted in a refusal or a warning: label keys are at most 317 characters, but a refusal is cut at 400 and
# its reason must show.
QUOTED_CHARS: Final = 63
MAX_WARNINGS: Final = 3
# The API server may cut a warning longer than 256 characters; kubectl prints each on its own line.
MAX_WARNING_CHARS: Final = 256

_AW_ANNOTATIONS: Final = topologyasks.ANNOTATIONS
_PODSET_ANNOTATIONS: Final = topologyasks.PODSET_ANNOTATIONS


def _quote(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text if len(text) <= QUOTED_CHARS else f"{text[:QUOTED_CHARS]}..."
    return repr(text) if isinstance(value, str) else text


def _why(value: Any) -> str:
    """Why ``value`` is not a level the controller can act on, or "" when it is one."""
    if not isinstance(value, str):
        return "it is not a string"
    return topologyasks.label_key_error(value.strip())


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return as_mapping(as_mapping(as_mapping(obj).get("metadata")).get("annotations"))


def _pod_set_asks(obj: Mapping[str, Any]) -> Iterator[tuple[str, str, str, Any]]:
    """(item, template, annotation, value) for each Kueue annotation of each pod template: the item as
    ``describe_item`` names it, the template's path from ``generictemplate``."""
    items = as_list(as_mapping(as_mapping(obj.get("spec")).get("resources")).get("GenericItems"))
    for index, item in enumerate(items):
        template = as_mapping(as_mapping(item).get("generictemplate"))
        try:
            sets = pod_sets(template)
        except WorkloadError:
            continue  # the demand computation names the bad count
        for pod_set in sets:
            annotations = as_mapping(as_mapping(pod_set.template.get("metadata")).get("annotations"))
            for key in _PODSET_ANNOTATIONS:
                if key in annotations:
                    yield (describe_item(index, item), format_path(("generictemplate", *pod_set.path)), key,
                           annotations[key])


def _pod_set_problems(asks: list[tuple[str, str, str, Any]]) -> list[str]:
    return [f"{item}: {join_path(template, 'metadata.annotations')}[{key}]: {_quote(value)} is not a node label "
            f"key: {why}" for item, template, key, value in asks if (why := _why(value))]


def _changed(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The AppWrapper's topology annotations that this request sets or changes (all present ones on CREATE)."""
    annotations, stored = _annotations(obj), _annotations(old)
    return tuple(key for key in _AW_ANNOTATIONS
                 if key in annotations and (old is None or annotations.get(key) != stored.get(key)))


@dataclass(frozen=True)
class Judged:
    """What ``judge`` found: the refusals, and the valid required levels the request asks for (level, where
    asked: the first place of each), which ``warnings`` checks against the nodes."""

    problems: list[str]
    required: list[tuple[str, str]]


def judge(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> Judged:
    """The refused topology annotations and the required levels asked (see the module docstring): one walk of
    the pod templates (and one of the stored object's only when the new one has a problem there)."""
    annotations = _annotations(obj)
    changed = _changed(obj, old)
    found = [f"annotation {key}: {_quote(annotations[key])} is not a node label key: {why}"
             for key in changed if (why := _why(annotations[key]))]
    asks = list(_pod_set_asks(obj))
    in_templates = _pod_set_problems(asks)
    if old is not None and in_templates:
        before = set(_pod_set_problems(list(_pod_set_asks(old))))
        in_templates = [problem for problem in in_templates if problem not in before]
    required: dict[str, str] = {}
    if topologyasks.TOPOLOGY_REQUIRED in changed and not _why(value := annotations[topologyasks.TOPOLOGY_REQUIRED]):
        required[value.strip()] = topologyasks.TOPOLOGY_REQUIRED
    if old is None:  # the templates cannot change after create
        for item, template, key, value in asks:
            if key == topologyasks.PODSET_REQUIRED and not _why(value):
                required.setdefault(value.strip(), f"{key} of {item} {template}")
    return Judged(found + in_templates, list(required.items()))


def warnings(required: list[tuple[str, str]], nodes: NodeLabels | None) -> list[str]:
    """The required levels (``Judged.required``) no node carries yet (see the module docstring)."""
    if nodes is None:
        return []
    missing = [(level, where) for level, where in required if nodes.carried(level) is False]
    found = [_bounded(f"no node has the label {_quote(level)} yet: the AppWrapper waits until one does "
                      f"(annotation {where})") for level, where in missing[:MAX_WARNINGS]]
    more = len(missing) - MAX_WARNINGS
    if more > 0:
        found.append(f"and {more} more required level{'s' if more > 1 else ''} that no node has yet")
    return found


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_WARNING_CHARS else f"{text[:MAX_WARNING_CHARS - 3]}..."
