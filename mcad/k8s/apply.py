"""Creating what an AppWrapper wraps: all of it, or none of it.

Contract:
- ``manifest(aw, index, item)`` (pure) turns a GenericItem's generictemplate into the object to create: namespace
  defaulted to the AppWrapper's (a different one is an error), both AppWrapper labels on the object and on every
  pod template nested in it (Deployment, Job, RayCluster groups, PyTorchJob replicas...), and a controller
  ownerReference to the AppWrapper so that deleting the AppWrapper garbage-collects everything. With
  ``remote=True`` (hub mode: the object goes into a worker cluster, where the AppWrapper does not exist) there is no
  ownerReference; the label ``APPWRAPPER_UID_LABEL`` carries the AppWrapper's uid instead. With ``gate=True``
  (``--placement=binding``) every pod template, and a bare Pod, also gets mcad's scheduling gate
  (``PLACEMENT_GATE``): its pods wait until ``mcad.loop.pinning`` pins each one to the node of its plan. With
  ``health`` (the controller's node-health rules, ``mcad.model.nodehealth``) every pod template, and a bare Pod,
  whose pods request a rule's resource gets a required node affinity keeping them off the nodes its NoSchedule and
  NoExecute rules name (``LABEL NotIn [VALUE, ...]``, added to each of its terms, or a term of its own), so the
  kube-scheduler keeps them off too: with ``--placement=advisory``, or a pod released without a pin. An empty term
  (which matches no node) is left empty. The items come
  from the AppWrapper as read from the API server for the dispatch (``generic_items``): the controller's view of an
  AppWrapper keeps no templates, only ``ItemRef``s, which is all the deletes need.
- ``check_item(namespace, index, item)`` raises ``ItemError`` for every item ``manifest`` refuses or could not
  build (metadata, labels, ownerReferences, a pod template's metadata or labels, schedulingGates of the wrong
  type), without copying anything; ``manifest`` runs it first, ``dispatch`` runs it on every item before it
  creates any, and admission runs only it.
- ``delete_remote(writer, aw)`` deletes, in a worker, every item that carries ``aw``'s uid label; it raises on
  failure, because no garbage collector will finish the job there.
- ``dispatch(writer, aw, items)`` creates every item (POST, never an apply over what exists), under a field manager
  of its own per AppWrapper (``field_manager(uid)``). An item whose name is taken is kept, and brought up to date
  by server-side apply conditioned on its uid, only if ``aw`` controls it (a controller ownerReference with its
  uid; in a worker cluster the uid label): an earlier attempt of the same dispatch, say before a restart. Anyone
  else's object fails the dispatch, PERMANENT, with "GenericItems[i] (Kind name) exists and is not controlled by
  this AppWrapper", and is neither written nor deleted; so does one the controller may not read (the chart grants
  Secrets create and delete only), saying so; one left by a deleted AppWrapper of the same name (about to
  be deleted), or being deleted, fails it TRANSIENT. If an item fails, what this dispatch created or kept is
  deleted, each delete conditioned on that object's uid, and ``DispatchFailed`` is raised with a message naming
  the item and the API's reason, and the ``kind`` of the failure (``mcad.model.retry.classify``): PERMANENT for a
  refusal that would repeat (invalid object, unknown kind, forbidden, too large), else UNAVAILABLE, TIMEOUT or
  TRANSIENT, which the caller retries with backoff.
  Every item is checked before the first is created: an invalid one means nothing is created.
- Every delete (undo, ``delete_wrapped``, ``delete_remote``) names the uid of the object it means, or first reads
  the object and checks it is ``aw``'s: an object someone else created since under the same name is never deleted.
- Every write of many requests comes in two forms: ``dispatch`` and ``dispatch_steps``, ``delete_wrapped`` and
  ``delete_wrapped_steps``, ``delete_remote`` and ``delete_remote_steps``. The ``_steps`` form returns ``Steps``,
  a generator making one API request per step (the undo after a failure too), for the write pool to interleave
  with other AppWrappers' writes; the plain form runs every step at once. Both have the same effects, results,
  exceptions and messages.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Generator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from mcad.api.appwrapper import (
    APPWRAPPER_LABEL,
    APPWRAPPER_UID_LABEL,
    KIND,
    LEGACY_APPWRAPPER_LABEL,
    AppWrapperView,
    field_manager,
)
from mcad.api.validation import describe_item
from mcad.api.views import PLACEMENT_GATE
from mcad.api.workloads import format_path, makes_no_pods, pod_requests, pod_sets
from mcad.errors import ApiError
from mcad.model.nodehealth import NodeHealth
from mcad.model.retry import FailureKind, classify


class ItemError(ValueError):
    """A GenericItem cannot be turned into an object; the message names the item and the cause."""


class DispatchFailed(Exception):
    """The items could not all be created (what was created or kept is deleted again); ``kind`` says whether trying
    again can help (``mcad.model.retry.classify`` of the API server's answer)."""

    def __init__(self, message: str, *, kind: FailureKind) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind

    @property
    def transient(self) -> bool:
        return self.kind is not FailureKind.PERMANENT


class ObjectWriter(Protocol):
    def is_namespaced(self, api_version: str, kind: str) -> bool:
        """Raises ApiError(404) when the API server does not serve that kind."""
        ...

    def create(self, obj: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        """POST: ApiError(409, "AlreadyExists") when an object of that name exists."""
        ...

    def read(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any]: ...

    def apply(self, obj: Mapping[str, Any], *, field_manager: str, force: bool) -> Mapping[str, Any]:
        """Server-side apply; a ``metadata.uid`` in ``obj`` is a precondition (409/422 when it differs)."""
        ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, owner_uid: str = "",
               uid: str = "", label: tuple[str, str] | None = None) -> None:
        """Background propagation; an object already gone is not an error. With ``uid``, only that object is
        deleted; with ``owner_uid``, only an object controlled by that owner."""
        ...


_T = TypeVar("_T")
# What a stepwise write returns: a generator that makes one API request per step (from one ``yield`` to the next)
# and returns its result; the write pool (mcad.k8s.writes) runs other keys' steps in between.
Steps = Generator[None, None, _T]


class _Applied(NamedTuple):
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str


def complete(steps: Steps[_T]) -> _T:
    """Run every step of ``steps`` at once and return its result."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]


def check_item(namespace: str, index: int, item: Mapping[str, Any]) -> None:
    """Raise ``ItemError`` for whatever in GenericItems[``index``] ``manifest`` would refuse or could not build
    into an object in ``namespace``, without copying the template: admission judges every item of every create
    with it. (``WorkloadError`` for a bad replica count comes out of ``pod_sets`` as it is.)"""
    template = item.get("generictemplate")
    where = describe_item(index, item)
    if not isinstance(template, Mapping) or not template:
        raise ItemError(f"{where}: generictemplate is missing")
    if not template.get("apiVersion") or not template.get("kind"):
        raise ItemError(f"{where}: generictemplate needs apiVersion and kind")
    meta = template.get("metadata", {})
    if not isinstance(meta, Mapping):
        raise ItemError(f"{where}: metadata must be an object")
    if not meta.get("name"):
        raise ItemError(f"{where}: metadata.name is required (generateName cannot be used: the name is how "
                        f"mcad finds the object again)")
    own_namespace = meta.get("namespace")
    if own_namespace and own_namespace != namespace:
        raise ItemError(f"{where}: metadata.namespace {own_namespace!r} differs from the AppWrapper's namespace "
                        f"{namespace!r}; wrapped objects live in the AppWrapper's namespace")
    _check_labels(meta, f"{where}: metadata.labels")
    references = meta.get("ownerReferences")
    if references is not None and not (isinstance(references, list)
                                       and all(isinstance(ref, Mapping) for ref in references)):
        raise ItemError(f"{where}: metadata.ownerReferences must be a list of objects")
    for pod_set in pod_sets(template):
        at = f"{where}: {format_path(pod_set.path)}." if pod_set.path else f"{where}: "
        if pod_set.path:  # a bare Pod's metadata is the object's, checked above
            template_meta = pod_set.template.get("metadata")
            if template_meta is not None and not isinstance(template_meta, Mapping):
                raise ItemError(f"{at}metadata must be an object")
            _check_labels(template_meta or {}, f"{at}metadata.labels")
        spec = pod_set.template.get("spec")
        gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
        if gates is not None and not isinstance(gates, list):
            raise ItemError(f"{at}spec.schedulingGates must be a list")


def _check_labels(meta: Mapping[str, Any], where: str) -> None:
    labels = meta.get("labels")
    if labels is not None and not isinstance(labels, Mapping):
        raise ItemError(f"{where} must be a map of strings")


def manifest(aw: AppWrapperView, index: int, item: Mapping[str, Any], *, remote: bool = False,
             gate: bool = False, health: NodeHealth | None = None) -> dict[str, Any]:
    """The object GenericItems[``index``] (``item``, as read from the API server) makes for ``aw``."""
    check_item(aw.namespace, index, item)
    obj = copy.deepcopy(dict(item["generictemplate"]))
    meta = obj.setdefault("metadata", {})
    meta["namespace"] = aw.namespace
    labels = {APPWRAPPER_LABEL: aw.name, LEGACY_APPWRAPPER_LABEL: aw.name}
    if remote:
        # In a worker cluster the AppWrapper does not exist: no ownerReference can point at it (the garbage
        # collector would delete the object at once); its uid in a label says whose the object is.
        meta["labels"] = {**(meta.get("labels") or {}), **labels, APPWRAPPER_UID_LABEL: aw.uid}
        # The template's own references name hub objects too: in the worker they dangle, and a dangling owner
        # makes the garbage collector delete the object.
        meta.pop("ownerReferences", None)
        return _label_pod_templates(obj, labels, gate, health)
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["ownerReferences"] = [
        *[ref for ref in meta.get("ownerReferences") or [] if not ref.get("controller")],
        {"apiVersion": aw.api_version, "kind": KIND, "name": aw.name, "uid": aw.uid, "controller": True,
         "blockOwnerDeletion": True},
    ]
    return _label_pod_templates(obj, labels, gate, health)


def _label_pod_templates(obj: dict[str, Any], labels: Mapping[str, str], gate: bool,
                         health: NodeHealth | None = None) -> dict[str, Any]:
    # Pods find their AppWrapper by label, so every pod template inside the object carries it too.
    for pod_set in pod_sets(obj):
        target: Any = obj
        for step in pod_set.path:
            target = target[step]
        if pod_set.path:
            if target.get("metadata") is None:  # absent or null: check_item lets both through
                target["metadata"] = {}
            template_meta = target["metadata"]
            template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}
        if gate:
            spec = target.get("spec")
            if isinstance(spec, dict):
                gates = [g for g in spec.get("schedulingGates") or [] if not (
                    isinstance(g, Mapping) and g.get("name") == PLACEMENT_GATE)]
                spec["schedulingGates"] = [*gates, {"name": PLACEMENT_GATE}]
        if health is not None and health.rules:
            spec = target.get("spec")
            if isinstance(spec, dict):
                _keep_off_sick_nodes(spec, health)
    return obj


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _keep_off_sick_nodes(spec: dict[str, Any], health: NodeHealth) -> None:
    """Require of pods of ``spec`` that request a rule's resource every node-health label NotIn the values its
    NoSchedule and NoExecute rules name (a node without the label matches NotIn)."""
    keep_off = health.keep_off(pod_requests(spec, strict=False))
    if not keep_off:
        return
    expressions = [{"key": label, "operator": "NotIn", "values": list(values)} for label, values in keep_off]
    affinity = _child(spec, "affinity")
    node_affinity = _child(affinity, "nodeAffinity") if affinity is not None else None
    required = _child(node_affinity, _REQUIRED) if node_affinity is not None else None
    if required is None:
        return  # a field of another type: the API server refuses the object, as it would have anyway
    terms = required.get("nodeSelectorTerms")
    if not terms:
        required["nodeSelectorTerms"] = [{"matchExpressions": expressions}]
        return
    if not isinstance(terms, list):
        return
    for term in terms:
        # An empty term matches no node: adding requirements to it would widen it.
        if isinstance(term, dict) and term:
            existing = term.get("matchExpressions") or []
            if isinstance(existing, list):
                term["matchExpressions"] = [*existing, *expressions]


def _child(parent: dict[str, Any], key: str) -> dict[str, Any] | None:
    """``parent[key]``, made an empty object when absent or null; None when it is something else."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    return value if isinstance(value, dict) else None


def _refusal(where: str, err: ApiError) -> str:
    return f"{where}: {err.reason or 'refused'} ({err.status}): {err.message}"


def generic_items(raw: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The GenericItems of a raw AppWrapper (what ``dispatch`` needs; the controller's view keeps none of it)."""
    spec = raw.get("spec")
    resources = spec.get("resources") if isinstance(spec, Mapping) else None
    items = resources.get("GenericItems") if isinstance(resources, Mapping) else None
    return [item if isinstance(item, Mapping) else {} for item in items] if isinstance(items, list) else []


def dispatch(writer: ObjectWriter, aw: AppWrapperView, items: Sequence[Mapping[str, Any]], *,
             remote: bool = False) -> tuple[str, ...]:
    """``dispatch_steps`` run to the end."""
    return complete(dispatch_steps(writer, aw, items, remote=remote))


def dispatch_steps(writer: ObjectWriter, aw: AppWrapperView, items: Sequence[Mapping[str, Any]], *,
                   remote: bool = False, gate: bool = False,
                   health: NodeHealth | None = None) -> Steps[tuple[str, ...]]:
    """Create every one of ``items`` (``aw``'s GenericItems, read from the API server for this dispatch), one
    request per step, and return the uids of the objects, by item; on any failure undo the ones this dispatch
    created or kept (one delete per step, each conditioned on the object's uid) and raise DispatchFailed.
    ``remote``: into a worker cluster; ``gate``: pods wait for mcad to pin them; ``health``: pods kept off sick
    nodes (see ``manifest``)."""
    # Every item is checked before anything is applied. Each manifest is built again when its turn comes rather
    # than kept: a dispatch waiting for its turns holds the names of what it applied, not a copy of every template.
    for index, item in enumerate(items):
        try:
            check_item(aw.namespace, index, item)
        except ItemError as err:
            raise DispatchFailed(str(err), kind=FailureKind.PERMANENT) from err
    manager = field_manager(aw.uid)
    applied: list[_Applied] = []
    uids: list[str] = []
    for index, item in enumerate(items):
        if index:
            # Steps end between two requests, not after the last: an empty step would only send the dispatch to
            # the back of the write pool's queue before it could report.
            yield
        obj = manifest(aw, index, item, remote=remote, gate=gate, health=health)
        where = describe_item(index, item)
        discovered = False
        try:
            if not writer.is_namespaced(obj["apiVersion"], obj["kind"]):
                raise DispatchFailed(f"{where}: {obj['kind']} is cluster-scoped; an AppWrapper can only wrap "
                                     f"namespaced objects", kind=FailureKind.PERMANENT)
            discovered = True
            uid = yield from _create_or_keep_steps(writer, aw, obj, where, manager, remote)
        except ApiError as err:
            yield from _undo_steps(writer, applied)
            if err.status == 404 and not discovered:
                raise DispatchFailed(f"{where}: the API server does not serve {obj['apiVersion']} {obj['kind']} "
                                     f"(is its CRD installed?)", kind=FailureKind.PERMANENT) from err
            raise DispatchFailed(_refusal(where, err), kind=classify(err)) from err
        except DispatchFailed:
            yield from _undo_steps(writer, applied)
            raise
        meta = obj["metadata"]
        applied.append(_Applied(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"], uid))
        uids.append(uid)
    return tuple(uids)


def _create_or_keep_steps(writer: ObjectWriter, aw: AppWrapperView, obj: dict[str, Any], where: str, manager: str,
                          remote: bool) -> Steps[str]:
    """Create ``obj``; if its name is taken, keep (update) the object only if ``aw`` controls it. The uid of the
    object. Raises ``ApiError`` for a refused request, ``DispatchFailed`` for an object that is not ``aw``'s."""
    try:
        # A create, not an apply: it can never land on an object that exists, whoever created it meanwhile.
        created = writer.create(obj, field_manager=manager)
        return _uid(created)
    except ApiError as err:
        if err.status != 409 or err.reason != "AlreadyExists":
            raise
    yield
    try:
        existing = writer.read(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
    except ApiError as err:
        if err.status == 403:
            # The chart grants Secrets create and delete only, so that the controller reads none: whose this one
            # is cannot be told, and it is never taken over blindly.
            raise DispatchFailed(f"{where} exists, and the controller may not read it to tell whether it is this "
                                 f"AppWrapper's (no get on {obj['kind']} objects: {err.message}); it is left as it "
                                 f"is: delete it, or rename the item", kind=FailureKind.PERMANENT) from err
        if err.status != 404:
            raise
        # Deleted between the create and the read: the next attempt creates it.
        raise DispatchFailed(f"{where}: existed a moment ago and is gone now; trying again",
                             kind=FailureKind.TRANSIENT) from err
    control = _control(existing, aw, remote)
    if control is _Control.OTHER:
        raise DispatchFailed(f"{where} exists and is not controlled by this AppWrapper; it is left as it is",
                             kind=FailureKind.PERMANENT)
    if control is _Control.NAMESAKE:
        # An earlier AppWrapper of the same name left it, and what deletes it (the garbage collector here, the
        # hub's cleanup in a worker) has not yet: it is no one's to keep, and will be gone shortly.
        raise DispatchFailed(f"{where} is left by a deleted AppWrapper of the same name and not deleted yet; "
                             f"trying again", kind=FailureKind.TRANSIENT)
    if (existing.get("metadata") or {}).get("deletionTimestamp"):
        raise DispatchFailed(f"{where} is still being deleted; trying again", kind=FailureKind.TRANSIENT)
    # Ours, from an earlier attempt of this very dispatch (a restart before its status was written): brought up
    # to date, on that object only (the uid in the body is a precondition: a namesake created since is refused).
    uid = _uid(existing)
    obj["metadata"]["uid"] = uid
    yield
    try:
        writer.apply(obj, field_manager=manager, force=True)
    except ApiError as err:
        if err.status in (409, 422) and "uid" in err.message:
            raise DispatchFailed(f"{where} was replaced by another object while being checked; trying again",
                                 kind=FailureKind.TRANSIENT) from err
        raise
    return uid


class _Control(enum.Enum):
    OURS = "ours"
    NAMESAKE = "namesake"  # a deleted AppWrapper of the same name controls it
    OTHER = "other"


def _control(existing: Mapping[str, Any], aw: AppWrapperView, remote: bool) -> _Control:
    """Whose an existing object is: ``aw``'s, by its uid (the controller ownerReference, or in a worker cluster
    the uid label), a namesake AppWrapper's that is gone, or anyone else's."""
    meta = existing.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    if remote:
        owner_uid = labels.get(APPWRAPPER_UID_LABEL)
        if owner_uid == aw.uid:
            return _Control.OURS
        # The hub's cleanup of the earlier AppWrapper deletes, in the worker, what carries its uid.
        return _Control.NAMESAKE if owner_uid and labels.get(APPWRAPPER_LABEL) == aw.name else _Control.OTHER
    refs = meta.get("ownerReferences")
    controller = next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None) \
        if isinstance(refs, list) else None
    if controller is None:
        return _Control.OTHER
    if controller.get("uid") == aw.uid:
        return _Control.OURS
    # An owner of our kind and name but another uid no longer exists (the AppWrapper of that name is this one):
    # the garbage collector deletes what it controlled.
    same_owner = (controller.get("kind") == KIND and controller.get("name") == aw.name
                  and str(controller.get("apiVersion") or "").split("/")[0] == aw.api_version.split("/")[0])
    return _Control.NAMESAKE if same_owner else _Control.OTHER


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str((meta.get("uid") if isinstance(meta, Mapping) else "") or "")


def _undo_steps(writer: ObjectWriter, applied: list[_Applied]) -> Steps[None]:
    for obj in reversed(applied):
        yield
        try:
            # Only that very object: one created since under the same name by someone else stays.
            writer.delete(obj.api_version, obj.kind, obj.namespace, obj.name, uid=obj.uid)
        except ApiError:
            # The ownerReference still lets the garbage collector remove it when the AppWrapper goes.
            continue


def delete_wrapped(writer: ObjectWriter, aw: AppWrapperView, uids: tuple[str, ...] = ()) -> None:
    """``delete_wrapped_steps`` run to the end."""
    complete(delete_wrapped_steps(writer, aw, uids))


def delete_wrapped_steps(writer: ObjectWriter, aw: AppWrapperView, uids: tuple[str, ...] = (), *,
                         owner_gone: bool = False) -> Steps[None]:
    """Delete what a (deleted) AppWrapper wrapped, one request per step, best effort, touching only objects it
    controls: by the uids recorded when they were applied (one request each) or, unknown after a restart, by
    checking their owner.

    The garbage collector would do it too, through the ownerReference, but it learns of a newly installed CRD
    only at its next 30 s discovery resync and works through a backlog at its own pace: deleting directly
    frees the capacity for the next AppWrapper at once. That holds for what makes pods; ``owner_gone`` (the
    AppWrapper itself is deleted, so its ownerReference now marks its objects for the collector) leaves the kinds
    that never make pods (``mcad.api.workloads.POD_FREE_KINDS``: a ConfigMap, a Service) to the collector: deleting
    them here would cost a request per object and free nothing sooner (under churn: a write per workload).
    """
    first = True
    for index, item in enumerate(aw.items):
        if not (item.api_version and item.kind and item.name):
            continue  # refused at its dispatch: nothing of it was created
        if owner_gone and makes_no_pods(item.api_version, item.kind):
            continue
        if not first:
            yield
        first = False
        uid = uids[index] if index < len(uids) else ""
        try:
            writer.delete(item.api_version, item.kind, aw.namespace, item.name, owner_uid="" if uid else aw.uid,
                          uid=uid)
        except ApiError:
            continue  # the ownerReference still lets the garbage collector remove it


def delete_remote(writer: ObjectWriter, aw: AppWrapperView) -> None:
    """``delete_remote_steps`` run to the end."""
    complete(delete_remote_steps(writer, aw))


def delete_remote_steps(writer: ObjectWriter, aw: AppWrapperView) -> Steps[None]:
    """Delete what ``aw`` wrapped in a worker cluster, one request per step: every item, if it carries ``aw``'s uid
    label. Raises the first ``ApiError`` (except "gone"), since no garbage collector would finish the job: the
    caller retries."""
    first = True
    for item in aw.items:
        if not (item.api_version and item.kind and item.name):
            continue
        if not first:
            yield
        first = False
        writer.delete(item.api_version, item.kind, aw.namespace, item.name, label=(APPWRAPPER_UID_LABEL, aw.uid))
