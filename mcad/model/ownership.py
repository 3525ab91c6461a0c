"""Whose pod is it: a pod belongs to an AppWrapper when its owner chain reaches an object that AppWrapper created,
every link checked by uid. Pure.

Contract:
- A label is a claim, not a proof: anyone who may create pods in a namespace can put the AppWrapper label on one, and
  name any controller in its ownerReference (the API server checks neither kind, name nor uid of an owner). So
  ``judge(aw, pod, objects)`` walks the pod's controller ownerReferences upwards and says ``OWNED`` only when each
  link exists with the uid the link below names, and the chain ends at one of ``aw``'s wrapped items (by kind and
  name) whose own controller is ``aw`` (its uid; in a worker cluster, hub mode, the AppWrapper uid label mcad stamps
  instead). At most ``MAX_LINKS`` objects are looked up (a Deployment's pods need two: the ReplicaSet, then the
  Deployment).
- A pod whose controller is ``aw`` itself must be one of ``aw``'s wrapped bare Pods (by name) and name ``aw``'s uid;
  a pod with no controller is ``aw``'s only in a worker cluster, by ``aw``'s uid label and a wrapped Pod of its name.
- The links are read from ``objects`` (``mcad.k8s.wrapped.WrappedObjects``: informers over the wrapped kinds that
  select objects carrying the AppWrapper label, which a Deployment's ReplicaSet has from its pod template). Asking
  about a kind starts its informer (``ensure``, with ``aw``'s key as the waiter to wake), and until it has synced
  the answer is ``UNKNOWN``: the caller neither counts nor refuses on that, and asks again when woken.
- A kind the controller may not watch (its RBAC) cannot be read, and an owner of a terminating pod may be gone
  already (deleted before its pods): such a link is checked by kind and name alone (one of ``aw``'s items, or a
  ReplicaSet named after one of its Deployments), as the only proof there is.
- Without ``objects`` at all (a controller built without informers over wrapped kinds) the same kind-and-name rule
  applies to the pod's controller.
- ``NOT_OWNED`` comes with why, in words for the pod's Event and the log, and whether it is ``settled``: a link
  missing from its informer may be one that has not arrived yet (a pod is often seen before its ReplicaSet).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol

from mcad.api.appwrapper import AppWrapperView
from mcad.api.views import Owner, PodView
from mcad.api.wrappedview import NotSynced, WrappedView

# Objects looked up above a pod: its controller, that one's, ... A Deployment's pod needs two (ReplicaSet,
# Deployment); no kind mcad knows makes pods through more than that, and a longer chain is refused, not walked.
MAX_LINKS: Final = 4


class Verdict(Enum):
    OWNED = "owned"
    NOT_OWNED = "not owned"
    UNKNOWN = "unknown"  # a link's informer has not synced yet: ask again when woken


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    why: str = ""
    # False when the verdict may change without the pod changing: a link not (yet) in its informer, which a pod
    # seen before its owner is for a moment. Such a pod is not counted, and not told it is refused either.
    settled: bool = True

    @property
    def owned(self) -> bool:
        return self.verdict is Verdict.OWNED


OWNED: Final = Judgement(Verdict.OWNED)


class Objects(Protocol):
    """What ``mcad.k8s.wrapped.WrappedObjects`` answers about wrapped kinds."""

    def ensure(self, api_version: str, kind: str, waiter: str | None = None) -> bool: ...

    def watches(self, api_version: str, kind: str, waiter: str | None = None, *, start: bool = True) -> bool: ...

    def lookup(self, api_version: str, kind: str, namespace: str, name: str) -> WrappedView | NotSynced | None: ...


def judge(aw: AppWrapperView, pod: PodView, objects: Objects | None) -> Judgement:
    """Whether ``pod`` is one of ``aw``'s objects' pods (``aw`` is the AppWrapper its label names)."""
    link = pod.controller
    if link is None:
        if pod.appwrapper_uid and pod.appwrapper_uid == aw.uid and _wraps(aw, "Pod", pod.name):
            return OWNED
        return _not(f"pod {pod.name} has no controller, so no AppWrapper made it")
    if link.kind == "AppWrapper":
        if link.uid == aw.uid and _wraps(aw, "Pod", pod.name):
            return OWNED
        return _not(f"pod {pod.name} names AppWrapper {link.name} (uid {link.uid or 'none'}) as its controller, "
                    f"but AppWrapper {aw.name} (uid {aw.uid}) wraps no Pod of that name")
    if objects is None:
        return OWNED if _by_name(aw, link) else _not(_foreign(pod, link, aw))
    for _ in range(MAX_LINKS):
        wrapped = _wraps(aw, link.kind, link.name)
        if not objects.ensure(link.api_version, link.kind, waiter=aw.key):
            return Judgement(Verdict.UNKNOWN, f"the {link.kind} informer has not synced yet")
        if not objects.watches(link.api_version, link.kind, start=False):
            # Not watchable (the controller's RBAC): kind and name are all there is to check.
            return OWNED if _by_name(aw, link) else _not(_foreign(pod, link, aw))
        found = objects.lookup(link.api_version, link.kind, aw.namespace, link.name)
        if isinstance(found, NotSynced):
            return Judgement(Verdict.UNKNOWN, f"the {link.kind} informer has not synced yet")
        if found is None and pod.deleting:
            # Terminating after its owners were deleted (a requeued AppWrapper's objects go first): the names are
            # all that is left to check.
            return OWNED if _by_name(aw, link) else _not(_foreign(pod, link, aw))
        if found is None:
            return Judgement(Verdict.NOT_OWNED, f"pod {pod.name}'s owner {link.kind} {link.name} does not exist (or "
                                                f"does not carry AppWrapper {aw.name}'s label)", settled=False)
        if found.uid != link.uid:
            return _not(f"pod {pod.name} names {link.kind} {link.name} with uid {link.uid or 'none'}, which is not "
                        f"the {link.kind} of that name (uid {found.uid})")
        if wrapped:
            if found.owner_uid == aw.uid:
                return OWNED
            return _not(f"{link.kind} {link.name} is not AppWrapper {aw.name}'s (its controller's uid is "
                        f"{found.owner_uid or 'none'}, the AppWrapper's {aw.uid})")
        if not (found.owner_kind and found.owner_name):
            return _not(_foreign(pod, link, aw))
        link = Owner(found.owner_kind, found.owner_name, found.owner_uid, found.owner_api_version)
    return _not(f"pod {pod.name}'s owner chain is longer than {MAX_LINKS} objects before it reaches "
                f"AppWrapper {aw.name}'s")


def _not(why: str) -> Judgement:
    return Judgement(Verdict.NOT_OWNED, why)


def _wraps(aw: AppWrapperView, kind: str, name: str) -> bool:
    return any(item.kind == kind and item.name == name for item in aw.items)


def _by_name(aw: AppWrapperView, link: Owner) -> bool:
    """The rule where nothing can be read: one of ``aw``'s items by kind and name, or a ReplicaSet named after one
    of its Deployments (the Deployment controller names them ``<deployment>-<hash>``)."""
    if _wraps(aw, link.kind, link.name):
        return True
    return link.kind == "ReplicaSet" and any(
        item.kind == "Deployment" and link.name.startswith(f"{item.name}-") for item in aw.items)


def _foreign(pod: PodView, link: Owner, aw: AppWrapperView) -> str:
    return (f"pod {pod.name} is controlled by {link.kind} {link.name}, which AppWrapper {aw.name}'s objects did not "
            f"make")
