"""Which pods count for an AppWrapper: the judgement of ``mcad.model.ownership`` for each pod carrying an AppWrapper
label, kept and revisited as the objects above the pods appear. Dispatcher thread only.

Contract:
- ``claim(pod)`` is the pod as the accountant (capacity, held room, counts, resets, force-deletes) must see it: a
  pod whose owner chain does not reach its AppWrapper's objects (``NOT_OWNED``) is nobody's, as a pod without the
  label is: its room is used, but by no AppWrapper. A pod whose chain cannot be told yet (``UNKNOWN``: an informer
  over a kind in its chain has not synced, as after a restart) counts by its label meanwhile, so a restarted
  controller never sees an AppWrapper's running pods vanish; pinning (``mcad.loop.pinning``) never places such a
  pod before its verdict is in.
- ``judgement(pod)`` is the verdict ``claim`` made last for it (judging it now when none was made).
- A verdict ``OWNED`` sticks while the pod and its AppWrapper (by uid) last: the objects above a pod are deleted
  before it when its AppWrapper is requeued, preempted or deleted, and the pod must still count as its own while
  it terminates (a preemptor waits for exactly those pods, a requeued AppWrapper drains them).
- ``recheck(key)`` judges again the AppWrapper's pods whose verdict was not ``OWNED`` (an object above them arrived
  after them, or an informer synced: each wakes the AppWrapper), and every one of its pods when the AppWrapper's uid
  changed (deleted and created again under its name), and returns the uids whose verdict changed: the caller
  observes those pods again. Pods judged ``OWNED`` keep that verdict while the AppWrapper lasts (an owner's uid
  never changes).
- A pod of an AppWrapper that is gone keeps an ``OWNED`` verdict (it goes with its AppWrapper, through the garbage
  collector); any other verdict for it is ``NOT_OWNED``.
- A pod first seen while it terminates, its owner already gone (the controller restarted meanwhile), is judged by
  kind and name (``mcad.model.ownership``): its owner's absence is what deletion looks like.
- Memory: one entry per pod carrying an AppWrapper label, dropped by ``forget`` when the pod is gone (which says
  the AppWrapper its label named).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from mcad.api.appwrapper import AppWrapperView
from mcad.api.views import PodView
from mcad.k8s.informer import Store
from mcad.model.ownership import Judgement, Objects, Verdict, judge


@dataclass(frozen=True, slots=True)
class _Judged:
    appwrapper: str
    appwrapper_uid: str  # the uid of the AppWrapper it was judged against ("" when there was none)
    judgement: Judgement


class Ownership:
    def __init__(self, *, appwrappers: Store[AppWrapperView], pods: Store[PodView],
                 objects_of: Callable[[str], Objects | None]) -> None:
        self._appwrappers = appwrappers
        self._pods = pods
        self._objects_of = objects_of  # AppWrapper key -> the informers over the kinds where its objects are
        self._judged: dict[str, _Judged] = {}  # pod uid -> its last verdict
        self._by_appwrapper: dict[str, set[str]] = {}  # AppWrapper key -> uids of the pods carrying its label
        self._appwrapper_uid: dict[str, str] = {}  # AppWrapper key -> the uid its pods were last judged against

    def claim(self, pod: PodView) -> PodView:
        if pod.appwrapper is None:
            self.forget(pod.uid)
            return pod
        judged = self._judge(pod)
        if judged.judgement.verdict is Verdict.NOT_OWNED:
            return dataclasses.replace(pod, appwrapper=None, pin=None, failure=None, controller=None,
                                       appwrapper_uid="")
        return pod

    def judgement(self, pod: PodView) -> Judgement:
        judged = self._judged.get(pod.uid)
        if judged is None or judged.appwrapper != pod.appwrapper:
            judged = self._judge(pod)
        return judged.judgement

    def recheck(self, key: str) -> list[str]:
        uids = self._by_appwrapper.get(key)
        if not uids:
            return []
        aw = self._appwrappers.get(key)
        uid_changed = aw is not None and self._appwrapper_uid.get(key) != aw.uid
        changed = []
        for uid in list(uids):
            before = self._judged.get(uid)
            pod = self._pods.get(uid)
            if before is None or pod is None or pod.appwrapper != key:
                continue
            if before.judgement.owned and not uid_changed:
                continue
            if self._judge(pod).judgement.verdict is not before.judgement.verdict:
                changed.append(uid)
        return changed

    def forget(self, uid: str) -> str | None:
        """A pod is gone, or carries no AppWrapper label now: the AppWrapper its label named, if it was judged."""
        judged = self._judged.pop(uid, None)
        if judged is None:
            return None
        uids = self._by_appwrapper.get(judged.appwrapper)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._by_appwrapper[judged.appwrapper]
                self._appwrapper_uid.pop(judged.appwrapper, None)
        return judged.appwrapper

    def _judge(self, pod: PodView) -> _Judged:
        key = pod.appwrapper
        assert key is not None
        before = self._judged.get(pod.uid)
        if before is not None and before.appwrapper != key:
            self.forget(pod.uid)  # re-labelled for another AppWrapper: judged afresh, for that one
            before = None
        aw = self._appwrappers.get(key)
        if before is not None and before.judgement.owned and (aw is None or aw.uid == before.appwrapper_uid):
            # Once its, always its: a pod outlives its owners (a requeued or preempted AppWrapper's objects are
            # deleted first, its pods terminate after), and its AppWrapper waits for exactly those pods to go.
            return before
        if aw is None:
            judged = _Judged(key, "", Judgement(Verdict.NOT_OWNED,
                                                f"no AppWrapper {key.split('/', 1)[-1]} exists in its namespace"))
        else:
            judged = _Judged(key, aw.uid, judge(aw, pod, self._objects_of(key)))
            self._appwrapper_uid[key] = aw.uid
        self._judged[pod.uid] = judged
        self._by_appwrapper.setdefault(key, set()).add(pod.uid)
        return judged
