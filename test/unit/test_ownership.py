"""Whose pod is it: the owner chain, uids checked, against informers' answers (mcad.model.ownership), and the
verdicts the loop keeps and revisits as owners arrive (mcad.loop.ownership)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mcad.api.appwrapper import appwrapper_view
from mcad.api.views import pod_view
from mcad.api.wrappedview import NOT_SYNCED, NotSynced, WrappedView, wrapped_view
from mcad.loop.ownership import Ownership
from mcad.model.ownership import MAX_LINKS, Verdict, judge
from test.unit.nodes_and_pods import raw_pod

AW_UID = "aw-uid"
JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"}, "spec": {"template": {"spec": {
    "containers": [{"name": "c"}]}}}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"template": {
    "spec": {"containers": [{"name": "c"}]}}}}
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-u1"}, "spec": {"containers": [{"name": "c"}]}}


def appwrapper(uid: str = AW_UID) -> Any:
    return appwrapper_view({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                            "metadata": {"name": "a", "namespace": "ns", "uid": uid},
                            "spec": {"resources": {"GenericItems": [{"generictemplate": i}
                                                                    for i in (JOB, DEPLOYMENT, POD)]}}})


def ref(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def pod(owner: dict[str, Any] | None = None, *, labels: dict[str, str] | None = None) -> Any:
    raw = raw_pod("u1", aw="a", node_name="n1", phase="Running")
    if owner is not None:
        raw["metadata"]["ownerReferences"] = [owner]
    raw["metadata"]["labels"].update(labels or {})
    return pod_view(raw)


def obj(api_version: str, kind: str, name: str, uid: str, owner: dict[str, Any] | None) -> WrappedView:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid,
                            "labels": {"workload.codeflare.dev/appwrapper": "a"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return wrapped_view({"apiVersion": api_version, "kind": kind, "metadata": meta})


class Objects:
    """Informers' answers: objects by (apiVersion, kind, name); kinds not synced yet; kinds not watchable."""

    def __init__(self, *objects: tuple[str, str, WrappedView], unsynced: tuple[str, ...] = (),
                 unwatchable: tuple[str, ...] = ()) -> None:
        self.objects = {(a, k, v.name): v for a, k, v in objects}
        self.unsynced, self.unwatchable = set(unsynced), set(unwatchable)
        self.waiters: list[tuple[str, str | None]] = []

    def ensure(self, api_version: str, kind: str, waiter: str | None = None) -> bool:
        if kind in self.unsynced:
            self.waiters.append((kind, waiter))
            return False
        return True

    def watches(self, api_version: str, kind: str, waiter: str | None = None, *, start: bool = True) -> bool:
        return kind not in self.unsynced and kind not in self.unwatchable

    def lookup(self, api_version: str, kind: str, namespace: str, name: str) -> WrappedView | NotSynced | None:
        if kind in self.unsynced:
            return NOT_SYNCED
        return self.objects.get((api_version, kind, name)) if namespace == "ns" else None


TO_AW = ref("workload.codeflare.dev/v1beta1", "AppWrapper", "a", AW_UID)
THE_JOB = ("batch/v1", "Job", obj("batch/v1", "Job", "train", "job-uid", TO_AW))
THE_DEPLOYMENT = ("apps/v1", "Deployment", obj("apps/v1", "Deployment", "web", "dep-uid", TO_AW))
THE_RS = ("apps/v1", "ReplicaSet", obj("apps/v1", "ReplicaSet", "web-7d9f", "rs-uid",
                                       ref("apps/v1", "Deployment", "web", "dep-uid")))


def test_a_pod_of_a_wrapped_job_is_owned_when_the_job_and_its_uid_are_the_appwrappers() -> None:
    objects = Objects(THE_JOB)
    assert judge(appwrapper(), pod(ref("batch/v1", "Job", "train", "job-uid")), objects).owned
    forged = judge(appwrapper(), pod(ref("batch/v1", "Job", "train", "someone-elses")), objects)
    assert forged.verdict is Verdict.NOT_OWNED and forged.settled and "not the Job of that name" in forged.why


def test_a_deployments_pod_is_owned_through_its_replicaset_and_a_lookalike_replicaset_is_not() -> None:
    objects = Objects(THE_DEPLOYMENT, THE_RS,
                      ("apps/v1", "ReplicaSet", obj("apps/v1", "ReplicaSet", "web-fake", "fake-uid",
                                                    ref("apps/v1", "Deployment", "web", "forged-dep-uid"))))
    assert judge(appwrapper(), pod(ref("apps/v1", "ReplicaSet", "web-7d9f", "rs-uid")), objects).owned
    lookalike = judge(appwrapper(), pod(ref("apps/v1", "ReplicaSet", "web-fake", "fake-uid")), objects)
    assert lookalike.verdict is Verdict.NOT_OWNED and "not the Deployment of that name" in lookalike.why


def test_a_wrapped_object_someone_else_made_under_the_items_name_owns_nothing_of_the_appwrapper() -> None:
    theirs = ("batch/v1", "Job", obj("batch/v1", "Job", "train", "job-uid",
                                     ref("workload.codeflare.dev/v1beta1", "AppWrapper", "a", "old-uid")))
    judged = judge(appwrapper(), pod(ref("batch/v1", "Job", "train", "job-uid")), Objects(theirs))
    assert judged.verdict is Verdict.NOT_OWNED and "is not AppWrapper a's" in judged.why


def test_an_owner_not_in_its_informer_is_not_counted_and_not_settled_it_may_arrive_later() -> None:
    judged = judge(appwrapper(), pod(ref("batch/v1", "Job", "train", "job-uid")), Objects())
    assert judged.verdict is Verdict.NOT_OWNED and not judged.settled


def test_an_informer_not_synced_gives_no_verdict_and_wakes_the_appwrapper_later() -> None:
    objects = Objects(unsynced=("Job",))
    judged = judge(appwrapper(), pod(ref("batch/v1", "Job", "train", "job-uid")), objects)
    assert judged.verdict is Verdict.UNKNOWN and objects.waiters == [("Job", "ns/a")]


def test_a_kind_the_controller_may_not_watch_is_checked_by_kind_and_name_alone() -> None:
    objects = Objects(unwatchable=("Job", "ReplicaSet"))
    assert judge(appwrapper(), pod(ref("batch/v1", "Job", "train", "any")), objects).owned
    assert judge(appwrapper(), pod(ref("apps/v1", "ReplicaSet", "web-1", "any")), objects).owned
    assert not judge(appwrapper(), pod(ref("batch/v1", "Job", "other", "any")), objects).owned


@pytest.mark.parametrize(("owner", "labels", "owned"), [
    (ref("workload.codeflare.dev/v1beta1", "AppWrapper", "a", AW_UID), {}, True),  # the wrapped Pod named pod-u1
    (ref("workload.codeflare.dev/v1beta1", "AppWrapper", "a", "forged"), {}, False),
    (None, {}, False),
    (None, {"workload.codeflare.dev/appwrapper-uid": AW_UID}, True),  # a worker's wrapped Pod (hub mode)
    (None, {"workload.codeflare.dev/appwrapper-uid": "forged"}, False),
])
def test_a_wrapped_bare_pod_is_owned_by_its_appwrappers_uid(owner: dict[str, Any] | None, labels: dict[str, str],
                                                            owned: bool) -> None:
    assert judge(appwrapper(), pod(owner, labels=labels), Objects()).owned is owned


def test_without_informers_the_controller_checks_kind_and_name() -> None:
    assert judge(appwrapper(), pod(ref("batch/v1", "Job", "train", "x")), None).owned
    assert judge(appwrapper(), pod(ref("apps/v1", "ReplicaSet", "web-7d9f", "x")), None).owned
    assert not judge(appwrapper(), pod(ref("apps/v1", "ReplicaSet", "webby", "x")), None).owned
    assert not judge(appwrapper(), pod(ref("batch/v1", "Job", "not-wrapped", "x")), None).owned


def test_a_chain_that_never_reaches_the_appwrapper_is_cut_after_max_links() -> None:
    chain = [("apps/v1", "ReplicaSet", obj("apps/v1", "ReplicaSet", f"rs{i}", f"uid{i}",
                                           ref("apps/v1", "ReplicaSet", f"rs{i + 1}", f"uid{i + 1}")))
             for i in range(MAX_LINKS + 2)]
    judged = judge(appwrapper(), pod(ref("apps/v1", "ReplicaSet", "rs0", "uid0")), Objects(*chain))
    assert judged.verdict is Verdict.NOT_OWNED and "longer than" in judged.why


# -- the loop's record of verdicts (mcad.loop.ownership) ----------------------------------------------------------


class Store:
    def __init__(self, *views: Any) -> None:
        self.views = {v.uid if hasattr(v, "phase") else v.key: v for v in views}

    def get(self, key: str) -> Any:
        return self.views.get(key)


def test_a_pod_not_owned_is_nobodys_for_the_accountant_and_counts_once_its_owner_arrives() -> None:
    objects = Objects()
    view = pod(ref("batch/v1", "Job", "train", "job-uid"))
    ownership = Ownership(appwrappers=Store(appwrapper()), pods=Store(view), objects_of=lambda _key: objects)
    claimed = ownership.claim(view)
    assert claimed.appwrapper is None and claimed.failure is None, "seen before its Job: nobody's for now"
    assert ownership.recheck("ns/a") == []
    objects.objects[("batch/v1", "Job", "train")] = THE_JOB[2]
    assert ownership.recheck("ns/a") == ["u1"], "the Job arrived: the pod's verdict changed"
    assert ownership.claim(view).appwrapper == "ns/a" and ownership.recheck("ns/a") == []


def test_a_pod_whose_chain_cannot_be_told_yet_counts_by_its_label_meanwhile() -> None:
    view = pod(ref("batch/v1", "Job", "train", "job-uid"))
    ownership = Ownership(appwrappers=Store(appwrapper()), pods=Store(view),
                          objects_of=lambda _key: Objects(unsynced=("Job",)))
    assert ownership.claim(view).appwrapper == "ns/a"
    assert ownership.judgement(view).verdict is Verdict.UNKNOWN


def test_an_appwrapper_created_again_under_its_name_judges_its_pods_again() -> None:
    view = pod(ref("batch/v1", "Job", "train", "job-uid"))
    appwrappers = Store(appwrapper())
    ownership = Ownership(appwrappers=appwrappers, pods=Store(view), objects_of=lambda _key: Objects(THE_JOB))
    assert ownership.claim(view).appwrapper == "ns/a"
    appwrappers.views["ns/a"] = appwrapper(uid="new-uid")
    assert ownership.recheck("ns/a") == ["u1"]
    assert ownership.claim(view).appwrapper is None
    assert ownership.forget("u1") == "ns/a" and ownership.forget("u1") is None


def test_the_pods_of_an_appwrapper_that_is_gone_stay_its_own_until_they_go() -> None:
    view = pod(ref("batch/v1", "Job", "train", "job-uid"))
    appwrappers = Store(appwrapper())
    ownership = Ownership(appwrappers=appwrappers, pods=Store(view), objects_of=lambda _key: Objects(THE_JOB))
    assert ownership.claim(view).appwrapper == "ns/a"
    del appwrappers.views["ns/a"]
    assert ownership.claim(view).appwrapper == "ns/a"
    stray = pod(ref("batch/v1", "Job", "train", "job-uid"))
    assert Ownership(appwrappers=appwrappers, pods=Store(stray),
                     objects_of=lambda _key: None).claim(stray).appwrapper is None


def test_a_pod_stays_its_appwrappers_while_it_terminates_after_its_owners_were_deleted() -> None:
    """A preempted AppWrapper's objects are deleted first; its pods terminate after, and its preemptor waits for
    exactly those pods: they must not turn into nobody's when their ReplicaSet and Deployment go."""
    objects = Objects(THE_DEPLOYMENT, THE_RS)
    view = pod(ref("apps/v1", "ReplicaSet", "web-7d9f", "rs-uid"))
    ownership = Ownership(appwrappers=Store(appwrapper()), pods=Store(view), objects_of=lambda _key: objects)
    assert ownership.claim(view).appwrapper == "ns/a"
    objects.objects.clear()
    terminating = dataclasses.replace(view, deleting=True)
    assert ownership.claim(terminating).appwrapper == "ns/a"
    # Seen for the first time while terminating, its owners gone (a restart meanwhile): by kind and name.
    fresh = Ownership(appwrappers=Store(appwrapper()), pods=Store(terminating), objects_of=lambda _key: objects)
    assert fresh.claim(terminating).appwrapper == "ns/a"
    assert fresh.claim(dataclasses.replace(terminating, uid="u2", controller=dataclasses.replace(
        terminating.controller, name="other-1"))).appwrapper is None
