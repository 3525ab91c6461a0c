"""Quota trees in the dispatcher, stepped key by key: quota is checked before capacity, an unknown node keeps an
AppWrapper waiting with its name, borrowers are preempted to give quota back, and nothing borrows the reclaimed
quota while the victims leave."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from mcad.k8s.informer import Informer
from mcad.model import status as statuses
from mcad.model.quota import subtree_view
from test.component.harness import Harness, RecordingWriter, aw, node, pod
from test.fakes import FakeListerWatcher, wait_informed


def subtree(name: str, tree: str, children: dict[str, str], parent: str | None = None,
            hard: tuple[str, ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"children": [{"name": child, "quotas": {"hardLimit": child in hard,
                                                                      "requests": {"cpu": cpu}}}
                                         for child, cpu in children.items()]}
    if parent:
        spec["parent"] = parent
    return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
            "metadata": {"name": name, "namespace": "q", "labels": {"tree": tree}, "resourceVersion": "1"},
            "spec": spec}


def labelled(name: str, cpu: str, **labels: str) -> dict[str, Any]:
    raw = aw(name, cpu)
    raw["metadata"]["labels"] = labels
    return raw


@pytest.fixture
def quota_harness() -> Iterator[Any]:
    made: list[tuple[Harness, Informer[Any]]] = []

    def make(subtrees: list[dict[str, Any]], aws: list[dict[str, Any]], cpu: str = "8",
             pods: list[dict[str, Any]] | None = None, **options: Any) -> Harness:
        lw = FakeListerWatcher()
        for obj in subtrees:
            lw.add(obj)
        informer: Informer[Any] = Informer("quotasubtrees", lw, transform=subtree_view)
        h = Harness(nodes=[node("n0", cpu)], pods=pods or [], aws=aws, fit="aggregate", quota_subtrees=informer,
                    **options)
        h.quota_lw = lw  # type: ignore[attr-defined]
        made.append((h, informer))
        return h

    yield make
    for h, _ in made:
        h.stop()


TREE = [subtree("root", "t", {"root": "4"}), subtree("kids", "t", {"gold": "2", "silver": "2"}, parent="root")]


def states(h: Harness) -> dict[str, str]:
    return {name: st.get("state", "") for name, st in h.writer.statuses}


def test_quota_is_checked_before_capacity(quota_harness: Any) -> None:
    h = quota_harness(TREE, [labelled("a", "3", t="gold"), labelled("b", "3", t="silver")])
    h.drain()
    assert states(h) == {"a": "Running", "b": "Pending"}
    message = [st for name, st in h.writer.statuses if name == "b"][-1]["message"]
    assert message.startswith("quota: node root of tree t is full: cpu needs 3, 1 of 4 left (charged at silver)")


def test_an_unknown_node_is_named_and_no_tree_means_capacity_alone(quota_harness: Any) -> None:
    h = quota_harness(TREE, [labelled("lost", "1", t="platinum"), labelled("free", "6", team="x")])
    h.drain()
    assert states(h) == {"lost": "Pending", "free": "Running"}, "no default node: 'free' is charged nowhere"
    message = [st for name, st in h.writer.statuses if name == "lost"][-1]["message"]
    assert "quota tree t has no node 'platinum'" in message


def test_borrowers_are_preempted_to_give_quota_back(quota_harness: Any) -> None:
    # silver borrows gold's unused 2 cpu; then gold wants its own 2 back.
    later = labelled("s2", "2", t="silver")
    later["metadata"]["creationTimestamp"] = "2026-01-01T00:00:01Z"  # same dispatch time: the newer goes first
    h = quota_harness(TREE, [labelled("s1", "2", t="silver"), later])
    h.drain()
    assert states(h) == {"s1": "Running", "s2": "Running"}
    h.clock.advance(1)
    h.lw["aw"].add(labelled("g", "2", t="gold"))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/g"), 5, "the AppWrapper informer to see g")
    h.drain()
    s2 = [st for name, st in h.writer.statuses if name == "s2"][-1]
    assert s2["state"] == "Pending"
    preempted = next(c for c in s2["conditions"] if c["type"] == "PreemptCandidate")
    assert preempted["reason"] == "PreemptedByQuotaReclaim" and "ns/g" in preempted["message"]
    assert states(h)["g"] == "Running" and states(h)["s1"] == "Running"
    quota = h.dispatcher.owners.accountant.quota
    assert quota is not None and quota.borrowed("t", "silver").get("cpu") == 0


def test_charges_are_rebuilt_from_dispatched_appwrappers_after_a_restart(quota_harness: Any) -> None:
    running = {"state": "Running", "canrun": True}
    h = quota_harness(TREE, [{**labelled("a", "2", t="gold"), "status": running},
                             {**labelled("b", "1", t="silver"), "status": running},
                             labelled("c", "2", t="silver")])
    h.drain()
    q = h.dispatcher.owners.accountant.quota
    assert q is not None and sorted(q.charged_keys()) == ["ns/a", "ns/b"]
    assert q.usage("t", "root").get("cpu") == 3000 and q.usage("t", "silver").get("cpu") == 1000
    assert states(h) == {"c": "Pending"}, "a (2) and b (1) leave 1 of the root's 4: c (2) waits on quota"


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def record(self, ref: Any, type_: str, reason: str, message: str) -> None:
        self.recorded.append((ref.name, type_, reason, message))


class LandingWriter(RecordingWriter):
    """Status writes land on the fake API server, as they do on a real one: the informer sees them come back, and
    the loop reads status from the informer again (mcad.loop.statussync)."""

    def replace_status(self, api_version: str, kind: str, namespace: str, name: str, uid: str,
                       new_status: Mapping[str, Any], *, field_manager: str) -> Mapping[str, Any]:
        super().replace_status(api_version, kind, namespace, name, uid, new_status, field_manager=field_manager)
        assert self.objects is not None
        return self.objects.modify({**self.objects.get(f"{namespace}/{name}"), "status": dict(new_status)})


HARD = [subtree("root", "t", {"root": "4"}), subtree("kids", "t", {"gold": "1", "silver": "3"}, parent="root",
                                                     hard=("gold",))]
FORGED = ("status.state Completed was not decided by mcad while 1 of its pods still run: its capacity and quota stay "
          "charged until they end or the AppWrapper is deleted (only the controller writes AppWrapper status)")


def test_a_final_state_the_controller_did_not_decide_releases_nothing_while_pods_run(quota_harness: Any) -> None:
    """A tenant writes Completed on its Running AppWrapper through the status subresource; were its charge
    released, the next one would run past gold's hard 1 cpu. The charge stays while its pod runs, and goes
    when the pod ends."""
    recorder = Events()
    h = quota_harness(HARD, [labelled("a", "1", t="gold")], recorder=recorder, writer=LandingWriter())
    h.drain()
    assert states(h) == {"a": "Running"}
    h.lw["pod"].add(pod("a-0", "1", appwrapper="a"))
    wait_informed(lambda: h.dispatcher.pods.get("uid-a-0"), 5, "the pod informer to see a-0")
    forged = h.lw["aw"].get("ns/a")
    h.lw["aw"].modify({**forged, "status": {**forged["status"], "state": "Completed"}})
    h.lw["aw"].add(labelled("b", "1", t="gold"))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/b"), 5, "the AppWrapper informer to see b")
    h.drain()
    decided = h.dispatcher.owners.decisions.status(h.dispatcher.appwrappers.get("ns/a"))
    assert decided.state == "Completed", "the forged state read"
    q = h.dispatcher.owners.accountant.quota
    assert q is not None and q.usage("t", "gold").get("cpu") == 1000, "a's charge stays"
    assert states(h)["b"] == "Pending"
    assert [(n, r, m) for n, _, r, m in recorder.recorded if r == "StatusNotDecided"] == [
        ("a", "StatusNotDecided", FORGED)]

    done = pod("a-0", "1", appwrapper="a")
    done["status"]["phase"] = "Succeeded"
    h.lw["pod"].modify(done)
    wait_informed(lambda: h.dispatcher.pods.get("uid-a-0").terminal, 5, "the pod informer to see a-0 end")
    h.drain()
    assert states(h)["b"] == "Running", "a's pod ended: its charge went, b runs"
    assert [r for _, _, r, _ in recorder.recorded].count("StatusNotDecided") == 1, "told once"


def test_a_final_state_the_controller_decided_releases_at_once_while_its_pods_end(quota_harness: Any) -> None:
    """Its own decision is not second-guessed: a failed AppWrapper's room goes at once, its pods still ending."""
    recorder = Events()
    h = quota_harness(HARD, [labelled("a", "1", t="gold")], recorder=recorder, writer=LandingWriter())
    h.drain()
    h.lw["pod"].add(pod("a-0", "1", appwrapper="a"))
    wait_informed(lambda: h.dispatcher.pods.get("uid-a-0"), 5, "the pod informer to see a-0")
    h.drain()
    view = h.dispatcher.appwrappers.get("ns/a")
    assert view is not None
    current = h.dispatcher.owners.decisions.status(view).raw()
    h.dispatcher.owners.active.finish(view, statuses.failed(current, h.clock.now(), priority=0, reason="Test",
                                                     message="failed by the controller"), stop=True)
    h.lw["aw"].add(labelled("b", "1", t="gold"))
    wait_informed(lambda: h.dispatcher.appwrappers.get("ns/b"), 5, "the AppWrapper informer to see b")
    h.drain()
    assert states(h)["a"] == "Failed" and states(h)["b"] == "Running"
    assert not [r for _, _, r, _ in recorder.recorded if r == "StatusNotDecided"]


def test_after_a_restart_a_final_state_with_running_pods_keeps_its_charge(quota_harness: Any) -> None:
    """The controller forgets who wrote what across a restart; the pods say what runs."""
    completed = {"state": "Completed", "canrun": True}
    finished = pod("done-0", "1", appwrapper="done")
    finished["status"]["phase"] = "Succeeded"
    h = quota_harness(HARD, [{**labelled("a", "1", t="gold"), "status": completed},
                             {**labelled("done", "1", t="silver"), "status": completed},
                             labelled("b", "1", t="gold")],
                      pods=[pod("a-0", "1", appwrapper="a"), finished])
    h.drain()
    q = h.dispatcher.owners.accountant.quota
    assert q is not None and sorted(q.charged_keys()) == ["ns/a"], "done's pods ended: it holds nothing"
    assert states(h).get("b") == "Pending"


def expected_usage(h: Harness) -> dict[tuple[str, str], int]:
    """Σ cpu of the AppWrappers the dispatcher holds capacity for, over every node on their charge paths."""
    q = h.dispatcher.owners.accountant.quota
    assert q is not None
    out: dict[tuple[str, str], int] = {}
    for key in h.dispatcher.owners.accountant.ledger.reserved_keys():
        view = h.dispatcher.appwrappers.get(key)
        assert view is not None
        charges, _ = q.forest.charges(view.labels)
        for tree, charged in charges:
            for name in q.forest.trees[tree].path(charged):
                out[(tree, name)] = out.get((tree, name), 0) + view.demand.get("cpu")
    return {k: v for k, v in out.items() if v}


def actual_usage(h: Harness) -> dict[tuple[str, str], int]:
    q = h.dispatcher.owners.accountant.quota
    assert q is not None
    return {(t, n): q.usage(t, n).get("cpu") for t, tree in q.forest.trees.items() for n in tree.nodes
            if q.usage(t, n).get("cpu")}


@pytest.mark.parametrize("seed", range(6))
def test_charged_quota_always_equals_the_dispatched_demand(quota_harness: Any, seed: int) -> None:
    """Random creates, completions, deletions, tree changes and restarts; after each step the quota charged is
    exactly the demand of what is dispatched, and a restarted dispatcher charges the same."""
    rng = random.Random(seed)
    default_node = subtree("dflt", "t", {"default": "1"}, parent="root")
    h = quota_harness([*TREE, default_node], [], cpu="6")
    seen = 0
    names: list[str] = []

    def raw_of(name: str, status: dict[str, Any]) -> dict[str, Any]:
        current = h.dispatcher.appwrappers.get(f"ns/{name}")
        assert current is not None
        raw = labelled(name, "1", **current.labels)
        stored = h.lw["aw"].get(f"ns/{name}")
        assert stored is not None
        raw["spec"] = {"resources": stored["spec"]["resources"]}
        if current.scheduling.dispatch_limit_seconds:
            raw["spec"]["schedulingSpec"] = {"dispatchDuration": {"limit": current.scheduling.dispatch_limit_seconds}}
        raw["status"] = status
        return raw

    for step in range(40):
        action = rng.random()
        if action < 0.45 or not names:
            name = f"w{step:02d}"
            labels = rng.choice([{"t": "gold"}, {"t": "silver"}, {}, {"other": "x"}])
            raw = labelled(name, str(rng.randint(1, 3)), **labels)
            if rng.random() < 0.5:  # ends (Failed, DispatchDeadlineExceeded) 1 s after its dispatch
                raw["spec"]["schedulingSpec"] = {"dispatchDuration": {"limit": 1}}
            h.lw["aw"].add(raw)
            names.append(name)
            wait_informed(lambda name=name: h.dispatcher.appwrappers.get(f"ns/{name}"), 5, "the informer")
        elif action < 0.65:
            h.clock.advance(1.5)  # time passes: those with a 1 s dispatch deadline end and give their quota back
        elif action < 0.85:
            name = names.pop(rng.randrange(len(names)))
            h.lw["aw"].delete(f"ns/{name}")
            wait_informed(lambda name=name: h.dispatcher.appwrappers.get(f"ns/{name}") is None, 5, "the informer")
        elif action < 0.93:
            subtrees = h.dispatcher.quota_subtrees
            assert subtrees is not None
            present = subtrees.get("q/dflt") is not None
            if present:
                h.quota_lw.delete("q/dflt")  # the default node goes: unlabelled ones are charged nowhere
            else:
                h.quota_lw.add(default_node)
            wait_informed(lambda s=subtrees, p=present: (s.get("q/dflt") is None) == p, 5, "the quota informer")
        else:  # restart: a new dispatcher over what the API server holds
            fresh = quota_harness([o for o in h.quota_lw.list()[0]], h.lw["aw"].list()[0], cpu="6")
            assert actual_usage(fresh) == actual_usage(h), (
                f"seed {seed} step {step}: restart changed charges",
                sorted(h.dispatcher.owners.accountant.quota.charged_keys()),
                sorted(fresh.dispatcher.owners.accountant.quota.charged_keys()),
                {o["metadata"]["name"]: (o.get("status") or {}).get("state") for o in h.lw["aw"].list()[0]})
        h.drain()
        # The API server's side: what the dispatcher wrote becomes what its informer sees.
        for name, status in h.writer.statuses[seen:]:
            if h.dispatcher.appwrappers.get(f"ns/{name}") is not None:
                h.lw["aw"].modify(raw_of(name, status))
        seen = len(h.writer.statuses)
        h.drain()
        assert actual_usage(h) == expected_usage(h), f"seed {seed} step {step}"
        stuck = [a.key for a in h.dispatcher.view.assess_queue() if a.fits_now]
        assert not stuck, (f"seed {seed} step {step}: {stuck} fit but were not dispatched",
                           [(a.key, a.state, a.fits_now, a.why) for a in h.dispatcher.view.assess_queue()],
                           h.dispatcher.owners.preemptors.waiters(), h.dispatcher.owners.preemptors.reclaiming,
                           {k: (v.labels, v.demand.format(), h.dispatcher.owners.decisions.status(v).state)
                            for k, v in ((a.key, h.dispatcher.appwrappers.get(a.key))
                                         for a in h.dispatcher.view.assess_queue()) if v})
