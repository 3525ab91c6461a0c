"""The mutating and validating reviewers of AppWrappers: what a user may ask the controller to create for them.

Contract: ``build(facts, config, node_labels=)`` returns ``(mutate, validate)``, two ``Reviewer``s (the controller's
``facts`` are ``mcad.admission.kubefacts.KubeFacts``; its ``node_labels``, ``mcad.k8s.nodelabels.NodeLabelKeys``,
None in hub mode). Neither raises on any request (but ``WouldAsk`` within
``facts.at_hand_only()``, for a fact not at hand); a fact that cannot be had
(``FactUnavailable``) refuses the request saying what could not be checked, and so does a review that has spent
``REVIEW_BUDGET_SECONDS`` asking: nothing is admitted unchecked.

validate, CREATE, refuses (every problem found, in one message: the first ``MAX_REPORTED`` joined with "; ", then
how many more, each cut to ``MAX_PROBLEM_CHARS``; items named ``GenericItems[i] (Kind name)``):
- an AppWrapper in a protected namespace (``config.protected_namespaces`` and the controller's own, unless listed
  in ``config.allowed_namespaces``);
- what the controller would refuse at dispatch, moved forward: ``mcad.api.validation.problems`` (size, name
  length, ranges of priority and durations, item names that are not Kubernetes names, items naming one object,
  quantities too large to count, pod templates naming a scheduler ``config.limits`` does not allow), no items,
  the demand computation's errors per item (quantities that do not parse, replica counts that are negative or not
  integers, in any kind whose pods it counts, named by item and field, malformed ``custompodresources``), and
  ``mcad.k8s.apply.check_item``'s, which are ``manifest``'s refusals (no template, no apiVersion/kind/name, another
  namespace, metadata, labels, ownerReferences or pod-template metadata that are not what they must be);
- an AppWrapper name that is not a valid label value (it labels every wrapped object);
- an item that is an AppWrapper (nested: the inner one would be queued with nobody's rights checked, and its demand
  counted twice);
- an item of a kind the API server does not serve, or of a cluster-scoped kind;
- ``DENYLIST``: RBAC kinds, Secrets that are or ask for ServiceAccount tokens, Events (core and events.k8s.io),
  Services with ``spec.externalIPs``. Refused for everyone: no config lifts it, whatever rights the user holds;
- a kind outside ``config.allowed_kinds`` (as (group, resource); empty allows every kind);
- an item the requesting user may not ``create`` themselves in the AppWrapper's namespace (a SubjectAccessReview
  for the user, groups, uid and extra of the request), naming the item and the missing right;
- a creator annotation that is not the requesting user's (the mutating reviewer sets them);
- a fault tolerance annotation (``mcad.api.faulttolerance``: upstream's ``workload.codeflare.dev.appwrapper/...``
  and ``delete-when-finished``) whose value ``faulttolerance.problems`` refuses under ``config.fault_defaults`` (the
  cluster's ceilings): malformed or negative durations, a period above its ceiling, a bad ``retryLimit`` or exit
  code list; each message names the annotation. Pure: needs no facts;
- a topology annotation (``mcad.admission.topology``: ``mcad.codeflare.dev/topology-required`` and
  ``-preferred`` on the AppWrapper, Kueue's ``podset-required-topology`` and ``podset-preferred-topology`` on a pod
  template inside an item) whose value is not a node label key, naming the annotation, where it is and why. Pure;
- a ``mcad.codeflare.dev/min-runtime`` annotation that ``minruntime.problems`` refuses (not a duration, or above
  ``config.min_runtime_ceiling``); on update only when the update sets or changes it. Pure;
- ``tenancy.admission_problems`` (quota binding, priority ceiling and classes, of the AppWrapper and of every pod
  template inside its items, understated demand).
More than ``MAX_KINDS`` distinct kinds in one AppWrapper are refused before anything is asked (each kind costs
discovery and a review).

validate, UPDATE: ``spec.resources`` (items and ``custompodresources``) and ``IMMUTABLE_SCHEDULING`` are frozen;
the creator annotations may not change; a fault tolerance or topology annotation is refused when the update sets or
changes it to a refused value (or makes the two exit-code lists overlap), whatever else the update does, the
AppWrapper being deleted included; one left unchanged is never refused (the ceiling may have been lowered since it
was stored, and the controller cuts it to the ceiling; a topology value may have been stored before this rule); any
other problem above is refused only if the stored object did not have it already (an update that removes a
finalizer or edits a label is never refused for what it did not change).
Labels, annotations, priority and requeuing may change. On an AppWrapper being deleted (``deletionTimestamp`` set on
the stored object) ``spec`` (priority included) and ``metadata.labels`` (quota nodes are labels) may not change any
more; what deletion needs (finalizers coming off, other annotations) is never refused, and needs no facts (a fault
tolerance or topology annotation changed to a refused value excepted, as above).

validate, warnings: an admitted CREATE or UPDATE (not of an AppWrapper being deleted) carries
``topology.warnings``: a required topology level it asks for (``topology.judge``) that no node carries yet
(``node_labels``), so the AppWrapper will wait. A warning never refuses: one that cannot be made (no
``node_labels``, nodes not known yet, a bug) is left out.

validate, UPDATE of the ``status`` subresource: refused unless the user is one of ``config.status_writers`` (the
controller's own identity, found at startup, and any the admin adds): status is the controller's record of what it
decided (dispatched, completed, how often requeued), and a tenant that could write it could, say, mark running
work Completed. The controller does not trust status alone either (``mcad.loop.dispatcher``: a final state it did not
decide releases nothing while the AppWrapper's pods run). Any other subresource is not judged.

mutate: CREATE sets ``CREATOR_ANNOTATION`` (username) and ``CREATOR_UID_ANNOTATION`` (uid, removed when the request
has none) whatever the user sent; UPDATE restores the stored values (or removes them when the stored object has
none); both add ``tenancy.admission_patch``. JSON patch operations with keys escaped per RFC 6901.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from mcad.admission import topology
from mcad.admission.facts import Facts, FactUnavailable, NodeLabels, Resource, WouldAsk, asked_for
from mcad.admission.request import AdmissionRequest, Outcome, Reviewer, UserInfo
from mcad.api import faulttolerance, minruntime
from mcad.api.appwrapper import GROUP, KIND, LEGACY_GROUP
from mcad.api.raw import as_list, as_mapping
from mcad.api.validation import DEFAULT_LIMITS, MAX_REPORTED, Limits, describe_item, problems
from mcad.api.workloads import WorkloadError, item_demand
from mcad.k8s.apply import ItemError, check_item
from mcad.model import tenancy

_log = structlog.get_logger("mcad.admission")

CREATOR_ANNOTATION: Final = "workload.codeflare.dev/creator"
CREATOR_UID_ANNOTATION: Final = "workload.codeflare.dev/creator-uid"
CREATOR_ANNOTATIONS: Final = (CREATOR_ANNOTATION, CREATOR_UID_ANNOTATION)
# A problem message longer than this is cut: a name or value the user chose must not make the refusal huge.
MAX_PROBLEM_CHARS: Final = 400
# Distinct kinds looked up for one AppWrapper: each costs a discovery request and a review when not cached, and the
# API server waits for the webhook only so long.
MAX_KINDS: Final = 32
# The time one review may spend asking questions, after which it refuses: below the webhooks' timeoutSeconds (10 s in
# the chart) less one request's bound (kubefacts.REQUEST_TIMEOUT), so the user reads the reason, not a timeout.
REVIEW_BUDGET_SECONDS: Final = 7.0
# schedulingSpec fields frozen after create: the gang size and the run time bound are what the controller reserved
# capacity and backfilled against, and the clusters it may go to are where it went.
IMMUTABLE_SCHEDULING: Final = ("minAvailable", "dispatchDuration", "clusterScheduling")
# Above the priorities batch users give each other, below the PriorityClasses platforms preempt with; the tenancy
# rules (namespace annotation) decide per namespace.
DEFAULT_PRIORITY_CEILING: Final = 1000
# A label value: what the AppWrapper's name becomes on every wrapped object (length is validation's business).
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_APPWRAPPER_GROUPS: Final = frozenset({GROUP, LEGACY_GROUP})
_SA_TOKEN_TYPE: Final = "kubernetes.io/service-account-token"
_SA_NAME_ANNOTATION: Final = "kubernetes.io/service-account.name"


# The cluster's own namespaces, protected by default: kube-system (its controllers' credentials), kube-public (read
# by everyone, unauthenticated clients included: what is created there is published) and kube-node-lease (the
# nodes' heartbeats: a planted Lease could pass for a node's).
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


@dataclass(frozen=True)
class AdmissionConfig:
    """What the admin decides (flags and chart values)."""

    # Kinds users may wrap, as (group, resource); empty means any kind the user may create themselves.
    allowed_kinds: frozenset[tuple[str, str]] = frozenset()
    # Namespaces where AppWrappers are refused unless listed in allowed_namespaces (controller_namespace too).
    protected_namespaces: frozenset[str] = frozenset(SYSTEM_NAMESPACES)
    allowed_namespaces: frozenset[str] = frozenset()
    # The controller's own namespace: protected like protected_namespaces.
    controller_namespace: str = ""
    # The operator's bounds (--max-items, --max-appwrapper-bytes), as the controller judges them at dispatch.
    limits: Limits = DEFAULT_LIMITS
    # The priority ceiling of namespaces that set none (tenancy).
    default_priority_ceiling: int = DEFAULT_PRIORITY_CEILING
    # Usernames that may write AppWrapper status: the controller's own (SelfSubjectReview at startup) and those of
    # --status-writer. Empty: nobody may (through the webhook).
    status_writers: frozenset[str] = frozenset()
    # The cluster's fault tolerance defaults and ceilings (the controller's --*-grace-period, --*-ceiling flags):
    # what the annotations are judged against.
    fault_defaults: faulttolerance.FaultDefaults = faulttolerance.DEFAULTS
    # The longest minimum run time an AppWrapper may ask for (--preemption-min-runtime-ceiling).
    min_runtime_ceiling: float = minruntime.DEFAULT_CEILING

    def protected(self, namespace: str) -> bool:
        return (namespace in self.protected_namespaces or namespace == self.controller_namespace) \
            and namespace not in self.allowed_namespaces


def bounded_message(found: list[str]) -> str:
    """One message for all problems: the first ``MAX_REPORTED``, each cut to ``MAX_PROBLEM_CHARS``, then a count."""
    shown = [p if len(p) <= MAX_PROBLEM_CHARS else f"{p[:MAX_PROBLEM_CHARS - 3]}..." for p in found[:MAX_REPORTED]]
    more = len(found) - MAX_REPORTED
    text = "; ".join(shown)
    return f"{text}; and {more} more problem{'s' if more > 1 else ''}" if more > 0 else text


def pointer(*parts: str) -> str:
    """An RFC 6901 JSON pointer: ``~`` as ``~0`` and ``/`` as ``~1`` in each part."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


# -- the denylist ----------------------------------------------------------------------------------------------------


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def denied(group: str, kind: str, template: Mapping[str, Any]) -> str | None:
    """Why an object of this group and kind is refused for everyone, or None. No configuration lifts these: each
    gives whoever creates it more than the right to create it (a role, a token, a forged event, traffic of other
    addresses)."""
    if group == "rbac.authorization.k8s.io":
        return "RBAC objects cannot be wrapped (an AppWrapper must not grant rights)"
    if group in ("", "events.k8s.io") and kind == "Event":
        return "Events cannot be wrapped (they would be reported as the controller's)"
    if group == "" and kind == "Secret":
        meta = as_mapping(template.get("metadata"))
        if template.get("type") == _SA_TOKEN_TYPE:
            return f"Secrets of type {_SA_TOKEN_TYPE} cannot be wrapped (the token controller fills them in)"
        if _SA_NAME_ANNOTATION in as_mapping(meta.get("annotations")):
            return f"Secrets annotated {_SA_NAME_ANNOTATION} cannot be wrapped (they ask for a ServiceAccount token)"
    if group == "" and kind == "Service" and as_list(as_mapping(template.get("spec")).get("externalIPs")):
        return "Services with spec.externalIPs cannot be wrapped (they capture traffic to those addresses)"
    return None


def _plural(resource: Resource) -> str:
    return f"{resource.resource}.{resource.group}" if resource.group else resource.resource


# -- the checks ------------------------------------------------------------------------------------------------------


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return as_mapping(as_mapping(as_mapping(obj).get("metadata")).get("annotations"))


def _items(obj: Mapping[str, Any]) -> list[Any]:
    return as_list(as_mapping(as_mapping(obj.get("spec")).get("resources")).get("GenericItems"))


def shape_problems(obj: Mapping[str, Any], namespace: str, limits: Limits) -> list[str]:
    """What the controller would refuse at dispatch, and the admission-only shape rules (no cluster facts)."""
    found = list(problems(obj, limits))
    name = as_mapping(obj.get("metadata")).get("name")
    if isinstance(name, str) and not _LABEL_VALUE.match(name):
        found.append(f"metadata.name {name!r} cannot be a label value (letters, digits, '-', '_' and '.', starting "
                     f"and ending with a letter or digit): it labels every wrapped object")
    items = _items(obj)
    if not items:
        found.append("spec.resources.GenericItems is empty: there is nothing to dispatch")
    for index, item in enumerate(items):
        where = describe_item(index, item)
        if not isinstance(item, Mapping):
            found.append(f"{where}: must be an object")
            continue
        try:
            check_item(namespace, index, item)  # what manifest() would refuse, without building the object
        except ItemError as err:
            found.append(str(err))
        except WorkloadError:
            pass  # a bad replica count: item_demand below names the item and the field
        try:
            item_demand(item)
        except WorkloadError as err:
            found.append(f"{where}: {err}")
        template = as_mapping(item.get("generictemplate"))
        api_version, kind = template.get("apiVersion"), template.get("kind")
        if kind == KIND and isinstance(api_version, str) and _group(api_version) in _APPWRAPPER_GROUPS:
            found.append(f"{where}: an AppWrapper cannot wrap another AppWrapper")
    return found


class _Lookups:
    """The facts one review asks: no question after one went unanswered (the API server is in trouble: one "could
    not check" is the answer)."""

    def __init__(self, facts: Facts, budget: float = REVIEW_BUDGET_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.facts = facts
        self.unavailable: str | None = None
        self._clock = clock
        self._budget = budget
        self._deadline = clock() + budget

    def ask(self, question: Callable[..., Any], *args: Any) -> Any:
        if self.unavailable is not None:
            return None
        if self._clock() > self._deadline:
            self.unavailable = (f"could not check the AppWrapper within {self._budget:g} s: the API server answers "
                                f"too slowly")
            return None
        try:
            return question(*args)
        except FactUnavailable as err:
            self.unavailable = str(err)
            return None


def item_problems(obj: Mapping[str, Any], namespace: str, user: UserInfo, config: AdmissionConfig,
                  lookups: _Lookups) -> list[str]:
    """Denylist, allowlist, discovery (served, namespaced) and the user's right to create, per item."""
    found: list[str] = []
    kinds = {(t.get("apiVersion"), t.get("kind")) for t in
             (as_mapping(as_mapping(item).get("generictemplate")) for item in _items(obj))}
    if len(kinds) > MAX_KINDS:
        # Refused before asking anything: each kind would cost a discovery request and a review.
        return [f"the AppWrapper wraps {len(kinds)} kinds (API version and kind); at most {MAX_KINDS} are allowed"]
    for index, item in enumerate(_items(obj)):
        template = as_mapping(as_mapping(item).get("generictemplate"))
        api_version, kind = template.get("apiVersion"), template.get("kind")
        if not (isinstance(api_version, str) and api_version and isinstance(kind, str) and kind):
            continue  # shape_problems names it
        where = describe_item(index, item)
        reason = denied(_group(api_version), kind, template)
        if reason is not None:
            found.append(f"{where}: {reason}")
            continue
        resource = lookups.ask(lookups.facts.resource_for, api_version, kind)
        if lookups.unavailable is not None:
            break
        if resource is None:
            found.append(f"{where}: the API server does not serve {api_version} {kind} (is its CRD installed?)")
            continue
        # Again with the discovered group: the kind of a denied resource could be reached by another name.
        reason = denied(resource.group, resource.kind, template)
        if reason is not None:
            found.append(f"{where}: {reason}")
            continue
        if not resource.namespaced:
            found.append(f"{where}: {kind} is cluster-scoped; an AppWrapper can only wrap namespaced objects")
            continue
        if config.allowed_kinds and (resource.group, resource.resource) not in config.allowed_kinds:
            found.append(f"{where}: {_plural(resource)} is not among the kinds the cluster admin allows in "
                         f"AppWrappers")
            continue
        decision = lookups.ask(lookups.facts.may, user, "create", resource, namespace)
        if lookups.unavailable is not None:
            break
        if not decision.allowed:
            because = f" ({decision.reason})" if decision.reason else ""
            found.append(f'{where}: user "{user.username}" may not create {_plural(resource)} in namespace '
                         f"{namespace}{because}")
    return found


def creator_problems(request: AdmissionRequest) -> list[str]:
    """Creator annotations that are not the ones the mutating reviewer sets (it runs first; this is the check that
    it did)."""
    found: list[str] = []
    annotations = _annotations(request.obj)
    if request.operation == "UPDATE":
        before = _annotations(request.old)
        for key in CREATOR_ANNOTATIONS:
            if annotations.get(key) != before.get(key):
                found.append(f"metadata.annotations[{key}] may not change: it records who created the AppWrapper")
        return found
    expected = {CREATOR_ANNOTATION: request.user.username, CREATOR_UID_ANNOTATION: request.user.uid or None}
    for key, value in expected.items():
        if key in annotations and annotations[key] != value:
            found.append(f"metadata.annotations[{key}] is set by admission to the requesting user; "
                         f"{_short(annotations[key])} is not")
    return found


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def fault_problems(obj: Mapping[str, Any], old: Mapping[str, Any] | None,
                   defaults: faulttolerance.FaultDefaults) -> list[str]:
    """The fault tolerance annotations refused (``faulttolerance.problems``): all of them on create; on update those
    the update sets or changes, and any problem the stored object did not have (an exit-code list changed so that
    the other, unchanged one, overlaps it)."""
    annotations = _annotations(obj)
    found = faulttolerance.problems(annotations, defaults)
    if old is None or not found:
        return found
    stored = _annotations(old)
    before = set(faulttolerance.problems(stored, defaults))
    changed = tuple(f"annotation {key}: " for key in faulttolerance.ANNOTATIONS
                    if annotations.get(key) != stored.get(key))
    return [problem for problem in found if problem not in before or problem.startswith(changed)]


def min_runtime_problems(obj: Mapping[str, Any], old: Mapping[str, Any] | None, ceiling: float) -> list[str]:
    """The min-runtime annotation refused (``minruntime.problems``): on create; on update only when the update sets or
    changes it (one admitted under a higher ceiling stays; the controller cuts it to the ceiling)."""
    annotations = _annotations(obj)
    if old is not None and annotations.get(minruntime.MIN_RUNTIME) == _annotations(old).get(minruntime.MIN_RUNTIME):
        return []
    return minruntime.problems(annotations, ceiling)


def immutable_problems(obj: Mapping[str, Any], old: Mapping[str, Any]) -> list[str]:
    spec, before = as_mapping(obj.get("spec")), as_mapping(old.get("spec"))
    found: list[str] = []
    if spec.get("resources") != before.get("resources"):
        found.append("spec.resources may not change once the AppWrapper is created (its items and "
                     "custompodresources are what was checked and what is dispatched); delete it and create "
                     "another")
    scheduling, scheduling_before = as_mapping(spec.get("schedulingSpec")), as_mapping(before.get("schedulingSpec"))
    for key in IMMUTABLE_SCHEDULING:
        if scheduling.get(key) != scheduling_before.get(key):
            found.append(f"spec.schedulingSpec.{key} may not change once the AppWrapper is created")
    return found


def status_problems(request: AdmissionRequest, config: AdmissionConfig) -> list[str]:
    """A write of the status subresource by anyone but the controller."""
    if request.user.username in config.status_writers:
        return []
    return [f'user "{request.user.username}" may not write the status of AppWrappers: only the mcad controller '
            f"does (status records what it decided: the state, when it dispatched, how often it requeued)"]


def terminating_problems(obj: Mapping[str, Any], old: Mapping[str, Any]) -> list[str]:
    """Changes to an AppWrapper being deleted beyond what its deletion needs (finalizers, status)."""
    changed = []
    if obj.get("spec") != old.get("spec"):
        changed.append("spec (priority included)")
    # An absent labels map and an empty one are the same labels.
    if as_mapping(as_mapping(obj.get("metadata")).get("labels")) != \
            as_mapping(as_mapping(old.get("metadata")).get("labels")):
        changed.append("metadata.labels (quota nodes included)")
    return [f"the AppWrapper is being deleted (metadata.deletionTimestamp is set): {what} may not change any more; "
            f"only its finalizers may come off" for what in changed]


def _judged_parts(obj: Mapping[str, Any]) -> tuple[Any, Any]:
    """What the rules judge: an update that changes neither (finalizers, other annotations, status) needs no facts,
    so it goes through even while the API server cannot answer admission's questions."""
    return obj.get("spec"), as_mapping(obj.get("metadata")).get("labels")


def build(facts: Facts, config: AdmissionConfig, *, clock: Callable[[], float] = time.monotonic,
          node_labels: NodeLabels | None = None) -> tuple[Reviewer, Reviewer]:
    def judged(request: AdmissionRequest, obj: Mapping[str, Any], lookups: _Lookups) -> list[str]:
        """Every rule that holds for an object whatever came before it (CREATE's rules)."""
        found: list[str] = []
        if config.protected(request.namespace):
            found.append(f"namespace {request.namespace} is protected: AppWrappers are not allowed in it unless the "
                         f"cluster admin allows that namespace")
        found += shape_problems(obj, request.namespace, config.limits)
        found += item_problems(obj, request.namespace, request.user, config, lookups)
        tenancy_found = lookups.ask(tenancy.admission_problems, obj, facts, config.default_priority_ceiling)
        found += tenancy_found or []
        return found

    def validate(request: AdmissionRequest) -> Outcome:
        required: list[tuple[str, str]] = []
        try:
            with asked_for(request.source):  # the facts charge their costly questions to the request's sender
                found = _validate(request, required)
        except WouldAsk:
            raise  # judged where a question may be asked (facts.at_hand_only)
        except Exception as err:  # a reviewer never raises: a bug refuses, visibly, rather than fail the server
            _log.exception("admission check failed", appwrapper=f"{request.namespace}/{request.name}",
                           reason="Bug")
            found = [f"could not check the AppWrapper: {type(err).__name__}: {err}"]
        if not found:
            return Outcome.allow(warnings=_warnings(request, required))
        # Not logged here: the webhook server logs refusals, at a bounded rate for callers that may be anyone.
        return Outcome.deny(bounded_message(found))

    def _warnings(request: AdmissionRequest, required: list[tuple[str, str]]) -> list[str]:
        """What an admitted request is told (``topology.warnings``); a warning that cannot be made is left out."""
        try:
            return topology.warnings(required, node_labels)
        except Exception:  # a warning must never refuse, nor fail the review
            _log.exception("admission warning failed", appwrapper=f"{request.namespace}/{request.name}",
                           reason="Bug")
            return []

    def _validate(request: AdmissionRequest, required: list[tuple[str, str]]) -> list[str]:
        """Every problem found; ``required`` gets the topology levels to warn of (CREATE, and UPDATE of an
        AppWrapper not being deleted)."""
        lookups = _Lookups(facts, clock=clock)
        if request.sub_resource:
            if request.sub_resource == "status" and request.operation == "UPDATE":
                return status_problems(request, config)
            return []  # no other subresource is registered
        if request.operation == "CREATE":
            levels = topology.judge(request.obj)
            required += levels.required
            found = creator_problems(request) + fault_problems(request.obj, None, config.fault_defaults) + \
                levels.problems + min_runtime_problems(request.obj, None, config.min_runtime_ceiling) + \
                judged(request, request.obj, lookups)
        elif request.operation == "UPDATE":
            if request.old is None:
                return ["the update carries no stored AppWrapper (oldObject) to compare with"]
            if as_mapping(request.old.get("metadata")).get("deletionTimestamp"):
                # Finalizers must come off, whatever the API server can answer: judged without facts.
                return creator_problems(request) + terminating_problems(request.obj, request.old) + \
                    fault_problems(request.obj, request.old, config.fault_defaults) + \
                    topology.judge(request.obj, request.old).problems
            levels = topology.judge(request.obj, request.old)
            required += levels.required
            found = creator_problems(request) + immutable_problems(request.obj, request.old) + \
                fault_problems(request.obj, request.old, config.fault_defaults) + levels.problems + \
                min_runtime_problems(request.obj, request.old, config.min_runtime_ceiling)
            if not found and _judged_parts(request.obj) != _judged_parts(request.old):
                # Only what this update makes worse: the stored object was judged when it came in (or before the
                # rules existed); refusing an update for what it did not change would wedge finalizers and labels.
                before = set(judged(request, request.old, lookups))
                found = [p for p in judged(request, request.obj, lookups) if p not in before]
        else:
            return []  # DELETE/CONNECT are not registered; nothing to judge
        if lookups.unavailable is not None:
            found.append(lookups.unavailable)
        return found

    def mutate(request: AdmissionRequest) -> Outcome:
        if request.sub_resource:
            return Outcome.allow()  # a subresource write cannot change metadata: nothing to set
        try:
            operations = creator_patch(request)
            # On update only when what the rules judge changed: a finalizer or status write must not depend on
            # the API server answering admission's questions.
            if request.operation == "CREATE" or (
                    request.operation == "UPDATE" and request.old is not None
                    and not as_mapping(request.old.get("metadata")).get("deletionTimestamp")
                    and _judged_parts(request.obj) != _judged_parts(request.old)):
                with asked_for(request.source):
                    operations += tenancy.admission_patch(request.obj, facts)
        except FactUnavailable as err:
            return Outcome.deny(str(err))
        except WouldAsk:
            raise  # judged where a question may be asked (facts.at_hand_only)
        except Exception as err:  # a reviewer never raises
            _log.exception("admission mutation failed", appwrapper=f"{request.namespace}/{request.name}",
                           reason="Bug")
            return Outcome.deny(f"could not record the creator of the AppWrapper: {type(err).__name__}: {err}")
        return Outcome.allow(patch=operations)

    return mutate, validate


def creator_patch(request: AdmissionRequest) -> list[dict[str, Any]]:
    """JSON patch operations that make the creator annotations what they must be (see the module docstring)."""
    meta = as_mapping(request.obj.get("metadata"))
    annotations = meta.get("annotations")
    if request.operation == "CREATE":
        wanted: dict[str, str | None] = {CREATOR_ANNOTATION: request.user.username,
                                         CREATOR_UID_ANNOTATION: request.user.uid or None}
    elif request.operation == "UPDATE":
        before = _annotations(request.old)
        wanted = {key: before.get(key) if isinstance(before.get(key), str) else None for key in CREATOR_ANNOTATIONS}
    else:
        return []
    if not isinstance(annotations, Mapping):
        values = {k: v for k, v in wanted.items() if v is not None}
        if not values:
            return []
        # "add" of a whole map: replaces a null or absent annotations field alike.
        return [{"op": "add", "path": pointer("metadata", "annotations"), "value": values}]
    operations: list[dict[str, Any]] = []
    for key, value in wanted.items():
        if value is None:
            if key in annotations:
                operations.append({"op": "remove", "path": pointer("metadata", "annotations", key)})
        elif annotations.get(key) != value:
            operations.append({"op": "add", "path": pointer("metadata", "annotations", key), "value": value})
    return operations
