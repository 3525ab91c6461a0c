"""Fair sharing over time (``--fair-sharing``): among AppWrappers of one priority, the tenant that used the least of
the cluster lately is dispatched first; without it, first in, first out. A tenant is the namespace here (no quota
trees). Stepped with the harness's clock: usage accrues only as the clock moves."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import patch

import pytest

from mcad.k8s.informer import Informer
from mcad.model.fairweight import WEIGHT_FIELD, WEIGHT_LABEL
from mcad.model.quota import subtree_view
from test.component.harness import gang_aw, gpu_node, last_status, node
from test.fakes import FakeListerWatcher


def team_aw(namespace: str, name: str, cpu: str = "1", created: str = "2026-01-01T00:00:00Z",
            priority: int = 0) -> dict[str, Any]:
    raw = gang_aw(name, 1, {"cpu": cpu}, priority=priority)
    raw["metadata"]["namespace"] = namespace
    raw["metadata"]["uid"] = f"uid-{namespace}-{name}"
    raw["metadata"]["creationTimestamp"] = created
    return raw


def dispatched(h: Any) -> set[str]:
    return set(h.dispatcher.owners.active.views)


def finish(h: Any, key: str) -> None:
    """It ran to the end and its owner deleted it: its room frees."""
    h.lw["aw"].delete(key)
    h.drain()


@pytest.mark.parametrize("fair", [True, False])
def test_the_tenant_that_used_less_goes_first_when_room_frees(harness_factory: Any, fair: bool) -> None:
    # team-a queues six 1-cpu AppWrappers on a 2-cpu cluster at 9:00 and two run; team-b queues two at 9:01.
    first = [team_aw("team-a", f"a{i}", created=f"2026-01-01T09:00:0{i}Z") for i in range(6)]
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=first, fit="aggregate", fair_sharing=fair)
    h.drain()
    assert dispatched(h) == {"team-a/a0", "team-a/a1"}
    h.clock.advance(60)
    for i in range(2):
        h.lw["aw"].add(team_aw("team-b", f"b{i}", created=f"2026-01-01T09:01:0{i}Z"))
    h.drain()
    finish(h, "team-a/a0")
    h.clock.advance(60)
    finish(h, "team-a/a1")
    if fair:
        assert dispatched(h) == {"team-b/b0", "team-b/b1"}, "team-b used nothing: its two go first"
    else:
        assert dispatched(h) == {"team-a/a2", "team-a/a3"}, "first in, first out"


@pytest.mark.parametrize("fair", [True, False])
def test_the_queue_shows_the_order_the_cycles_then_dispatch_in(harness_factory: Any, fair: bool) -> None:
    # As above: two of team-a's six run, team-b queues two a minute later. The dry run behind /debug/queue,
    # mcadctl and the expected start says who goes next; each room that frees then goes to the one it said.
    first = [team_aw("team-a", f"a{i}", created=f"2026-01-01T09:00:0{i}Z") for i in range(6)]
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=first, fit="aggregate", fair_sharing=fair)
    h.drain()
    h.clock.advance(60)
    for i in range(2):
        h.lw["aw"].add(team_aw("team-b", f"b{i}", created=f"2026-01-01T09:01:0{i}Z"))
    h.drain()
    assessed = h.dispatcher.owners.cycle.assess()
    said = list(assessed.dispatch_order())
    expected = (["team-b/b0", "team-b/b1", "team-a/a2", "team-a/a3", "team-a/a4", "team-a/a5"] if fair
                else ["team-a/a2", "team-a/a3", "team-a/a4", "team-a/a5", "team-b/b0", "team-b/b1"])
    assert said == expected
    assert [assessed.position(key) for key in said] == [1, 2, 3, 4, 5, 6]
    for done, key in zip(["team-a/a0", "team-a/a1"], said, strict=False):
        finish(h, done)
        assert key in dispatched(h)
        h.clock.advance(60)
    # The status message gives no position with fair sharing: the live queue's order is not the order of dispatch.
    assert last_status(h, "a5")["message"].endswith("in the queue") is not fair


def test_priority_comes_before_usage(harness_factory: Any) -> None:
    aws = [team_aw("team-a", "a0"), team_aw("team-a", "a1")]
    h = harness_factory(nodes=[node("n0", "1")], pods=[], aws=aws[:1], fit="aggregate", fair_sharing=True)
    h.drain()
    h.clock.advance(600)
    h.lw["aw"].add(team_aw("team-b", "b0"))
    h.lw["aw"].add(team_aw("team-a", "urgent", priority=5, created="2026-01-01T10:00:00Z"))
    h.drain()
    finish(h, "team-a/a0")
    assert dispatched(h) == {"team-a/urgent"}, "higher priority first, whatever its tenant used"


def test_one_pass_interleaves_tenants_with_equal_usage(harness_factory: Any) -> None:
    # Nothing ran yet: both tenants are at zero. Four slots free at once go two and two, not four to the first.
    aws = [team_aw("team-a", f"a{i}", created=f"2026-01-01T09:00:0{i}Z") for i in range(4)]
    aws += [team_aw("team-b", f"b{i}", created=f"2026-01-01T09:01:0{i}Z") for i in range(4)]
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=aws, fit="aggregate", fair_sharing=True)
    h.drain()
    assert dispatched(h) == {"team-a/a0", "team-a/a1", "team-b/b0", "team-b/b1"}


@pytest.mark.parametrize("seed", range(4))
def test_a_day_of_two_tenants_shares_the_cluster_by_usage(harness_factory: Any, seed: int) -> None:
    """team-a keeps 20 AppWrappers queued all day; team-b submits a few now and then. With fair sharing, each of
    team-b's runs within the first slot that frees after it arrives; the whole day's cpu-seconds go about half
    and half while both have work waiting."""
    rng = random.Random(seed)
    names = iter(range(10**6))
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[], fit="aggregate", fair_sharing=True)
    running: dict[str, float] = {}
    used = {"team-a": 0.0, "team-b": 0.0}
    waits: list[float] = []
    arrived: dict[str, float] = {}
    now = 0.0
    for _minute in range(240):
        queued_a = sum(1 for k in h.dispatcher.owners.queued.pending.ordered() if k.startswith("team-a/"))
        for _ in range(20 - queued_a):
            h.lw["aw"].add(team_aw("team-a", f"a{next(names)}", created="2026-01-01T09:00:00Z"))
        if rng.random() < 0.1:
            name = f"b{next(names)}"
            h.lw["aw"].add(team_aw("team-b", name, created="2026-01-01T09:00:00Z"))
            arrived[f"team-b/{name}"] = now
        h.drain()
        for key in sorted(dispatched(h) - set(running)):  # sorted: the same durations whatever the hash seed
            running[key] = now + rng.choice([5, 10, 15]) * 60
            if key in arrived:
                waits.append(now - arrived.pop(key))
        for key in [k for k, ends in running.items() if ends <= now]:
            del running[key]
            finish(h, key)
        for key in running:
            used[key.partition("/")[0]] += 60
        h.clock.advance(60)
        now += 60
    assert waits, "team-b ran something"
    assert max(waits) <= 15 * 60, f"team-b waited at most one job's length: {max(waits)} s"
    assert used["team-b"] > 0


class MemoryStore:
    """A FairShareStore kept in memory: what the controller saved, as the next one reads it."""

    namespace, name = "mcad-system", "mcad-fair-share"

    def __init__(self, saved: tuple[dict[str, float], Any] | None = None, fail: Exception | None = None) -> None:
        self.saved, self.fail = saved, fail

    def read(self) -> tuple[dict[str, float], Any] | None:
        if self.fail is not None:
            raise self.fail
        return self.saved

    def write(self, usage: dict[str, float], saved_at: Any) -> None:
        self.saved = (dict(usage), saved_at)


def test_usage_saved_by_one_controller_orders_the_next_ones_queue(harness_factory: Any) -> None:
    """team-a used the cluster for an hour; the controller stops. The next one (a restart, or another replica
    taking the lead) reads the saved usage, decayed by the time between, and team-b's AppWrapper goes first though
    team-a's was queued earlier."""
    from datetime import timedelta

    store = MemoryStore()
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=[team_aw("team-a", "a0", cpu="2")], fit="aggregate",
                        fair_sharing=True)
    h.drain()
    fair = h.dispatcher.owners.fair
    fair._store = store
    h.clock.advance(3600)
    fair.save()
    h.drain()
    assert store.saved is not None and store.saved[0]["namespace:team-a"] > 2000

    later = harness_factory(nodes=[node("n0", "2")], pods=[], fit="aggregate", fair_sharing=True,
                            aws=[team_aw("team-a", "a1", cpu="2", created="2026-01-01T09:00:00Z"),
                                 team_aw("team-b", "b0", cpu="2", created="2026-01-01T10:00:00Z")],
                            before_start=lambda lh: (setattr(lh.dispatcher.owners.fair, "_store", store),
                                                     lh.clock.advance(3600 + 1800)))
    later.drain()
    assert dispatched(later) == {"team-b/b0"}, "team-a's usage came back: team-b goes first"
    restored = later.dispatcher.owners.fair.usage()["namespace:team-a"]
    elapsed = (later.clock.now() - store.saved[1]) / timedelta(seconds=1)
    assert elapsed == pytest.approx(1800, abs=1), "saved half an hour before the next controller started"
    assert restored == pytest.approx(store.saved[0]["namespace:team-a"] * 0.5 ** 0.5, rel=1e-3)


def test_a_store_that_cannot_be_read_starts_everyone_from_zero(harness_factory: Any) -> None:
    from mcad.k8s.fairsharestore import StoredUsageError

    h = harness_factory(nodes=[node("n0", "2")], pods=[], fit="aggregate", fair_sharing=True,
                        aws=[team_aw("team-a", "a0", cpu="2")],
                        before_start=lambda h: setattr(h.dispatcher.owners.fair, "_store",
                                                       MemoryStore(fail=StoredUsageError("spoiled"))))
    h.drain()
    assert dispatched(h) == {"team-a/a0"}


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 1.0


class Day:
    """Eight simulated hours on a harness, a minute a step: what ``arrive(minute)`` queues, then a drain (the cycles
    dispatch), then each new dispatch is given a seeded run of 5 to 15 minutes, ``started(minute, keys)`` is told
    of them, those whose run is over finish (their room frees), ``running(keys)`` is told what still runs (after
    a two-hour warm-up), and the clock moves a minute."""

    def __init__(self, h: Any, rng: random.Random) -> None:
        self.h, self.rng = h, rng
        self.names = iter(range(10**6))
        self.ends: dict[str, int] = {}

    def queued(self, team: str) -> int:
        return sum(1 for k in self.h.dispatcher.owners.queued.pending.ordered() if k.startswith(f"{team}/"))

    def name(self, team: str) -> str:
        return f"{team[-1]}{next(self.names)}"

    def run(self, arrive: Callable[[int], None], *, started: Callable[[int, list[str]], None] | None = None,
            running: Callable[[list[str]], None]) -> None:
        for minute in range(8 * 60):
            arrive(minute)
            self.h.drain()
            new = sorted(dispatched(self.h) - set(self.ends))  # sorted: the same durations whatever the hash seed
            for key in new:
                self.ends[key] = minute + self.rng.randint(5, 15)
            if started is not None:
                started(minute, new)
            for key in [k for k, end in self.ends.items() if end <= minute]:
                del self.ends[key]
                finish(self.h, key)
            if minute >= 120:
                running(list(self.ends))
            self.h.clock.advance(60)


def count_by_team(used: dict[str, float]) -> Callable[[list[str]], None]:
    """A ``running`` that adds a minute to each running AppWrapper's team."""
    def running(keys: list[str]) -> None:
        for key in keys:
            used[key.partition("/")[0]] += 1
    return running


def busy_day(harness_factory: Any, seed: int, fair: bool) -> tuple[dict[str, float], float]:
    """Three tenants keep different amounts of work queued all day on a 4-cpu node (team-a six AppWrappers, team-b
    three, team-c one); jobs of 1 cpu run 5 to 15 minutes. Returns each tenant's cpu-minutes after a two-hour
    warm-up, and the longest any of team-c's waited."""
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[], fit="aggregate", fair_sharing=fair)
    day = Day(h, random.Random(seed))
    used = {"team-a": 0.0, "team-b": 0.0, "team-c": 0.0}
    backlog = {"team-a": 6, "team-b": 3, "team-c": 1}
    arrived: dict[str, int] = {}
    longest_c = 0
    created = "2026-01-01T09:00:00Z"  # one second for all: without fair sharing, the name breaks ties

    def arrive(minute: int) -> None:
        for team, depth in backlog.items():
            for _ in range(depth - day.queued(team)):
                name = day.name(team)
                h.lw["aw"].add(team_aw(team, name, created=created))
                arrived[f"{team}/{name}"] = minute

    def started(minute: int, keys: list[str]) -> None:
        nonlocal longest_c
        for key in keys:
            if key.startswith("team-c/"):
                longest_c = max(longest_c, minute - arrived[key])

    day.run(arrive, started=started, running=count_by_team(used))
    return used, longest_c * 60.0


@pytest.mark.parametrize("seed", range(2))
def test_a_busy_day_shares_the_cluster_evenly_with_fair_sharing(harness_factory: Any, seed: int) -> None:
    (fair, longest_fair), (fifo, _) = (busy_day(harness_factory, seed, fair=True),
                                       busy_day(harness_factory, seed, fair=False))
    total = sum(fair.values())
    for team, minutes in fair.items():
        assert abs(minutes / total - 1 / 3) <= 0.1, f"{team} had {minutes / total:.0%} of the cpu: {fair}"
    assert longest_fair <= 3600, "team-c, with one AppWrapper queued at a time, never waited a half-life"
    assert jain(list(fair.values())) > 0.99 > jain(list(fifo.values())), (fair, fifo)
    print(f"Jain's index, seed {seed}: fair sharing {jain(list(fair.values())):.3f} ({fair}), "
          f"first in first out {jain(list(fifo.values())):.3f} ({fifo})")


@dataclass
class MixedDay:
    """What ``mixed_day`` measured: cpu-minutes per tenant after the warm-up, the same in the minutes when every
    tenant had work (queued or running), and per tenant the longest stretch (seconds) during which it had something
    queued and nothing of it was dispatched."""

    used: dict[str, float]
    busy: dict[str, float]
    longest_wait: dict[str, float]
    bursts: list[int]


def mixed_day(harness_factory: Any, seed: int, fair: bool) -> MixedDay:
    """Steady and bursty tenants on a 4-cpu node for eight hours: team-a keeps six AppWrappers queued all day,
    team-b three; team-d queues nothing but, at two or three seeded minutes, 15 to 20 at once. Jobs of 1 cpu run 5
    to 15 minutes. Each AppWrapper is created at the minute it is queued (so that without fair sharing the queue is
    first in, first out between tenants too)."""
    rng = random.Random(seed)
    h = harness_factory(nodes=[node("n0", "4")], pods=[], aws=[], fit="aggregate", fair_sharing=fair)
    teams = ("team-a", "team-b", "team-d")
    backlog = {"team-a": 6, "team-b": 3}
    bursts = {minute: rng.randint(15, 20)
              for minute in sorted(rng.sample(range(150, 450, 30), rng.choice([2, 3])))}
    day = Day(h, rng)
    used, busy = dict.fromkeys(teams, 0.0), dict.fromkeys(teams, 0.0)
    waiting_since: dict[str, int | None] = dict.fromkeys(teams, None)
    longest = dict.fromkeys(teams, 0)
    start = datetime(2026, 1, 1, 9, tzinfo=UTC)

    def add(team: str, minute: int) -> None:
        created = (start + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%SZ")
        h.lw["aw"].add(team_aw(team, day.name(team), created=created))

    def arrive(minute: int) -> None:
        for team, depth in backlog.items():
            for _ in range(depth - day.queued(team)):
                add(team, minute)
        for _ in range(bursts.get(minute, 0)):
            add("team-d", minute)

    def started(minute: int, keys: list[str]) -> None:
        teams_started = {key.partition("/")[0] for key in keys}
        for team in teams:  # a stretch runs from the minute it had work queued and none dispatched
            since = waiting_since[team]
            if since is not None:
                longest[team] = max(longest[team], minute - since)
            if team in teams_started or not day.queued(team):
                waiting_since[team] = minute if team in teams_started and day.queued(team) else None
            elif since is None:
                waiting_since[team] = minute

    def running(keys: list[str]) -> None:
        holding = [key.partition("/")[0] for key in keys]
        everyone_busy = all(day.queued(team) or team in holding for team in teams)
        for team in holding:
            used[team] += 1
            if everyone_busy:
                busy[team] += 1

    day.run(arrive, started=started, running=running)
    return MixedDay(used, busy, {team: minutes * 60.0 for team, minutes in longest.items()}, sorted(bursts))


@pytest.mark.parametrize("seed", range(3))
def test_a_day_of_steady_and_bursty_tenants(harness_factory: Any, seed: int) -> None:
    """With fair sharing no tenant with work queued goes a half-life (1 h) without one of its AppWrappers being
    dispatched, and the two steady tenants' shares stay within 10 % of equal, over the day and in the minutes when
    all three had work. Jain's index is printed for those minutes (all three) and for the steady two over the day,
    with and without fair sharing."""
    fair, fifo = mixed_day(harness_factory, seed, fair=True), mixed_day(harness_factory, seed, fair=False)
    all_three, steady = ("team-a", "team-b", "team-d"), ("team-a", "team-b")

    def minutes(waits: dict[str, float]) -> dict[str, int]:
        return {team: round(seconds / 60) for team, seconds in waits.items()}

    print(f"mixed day, seed {seed}, bursts at minutes {fair.bursts}: Jain's index while all three had work: "
          f"fair sharing {jain([fair.busy[t] for t in all_three]):.3f}, "
          f"first in first out {jain([fifo.busy[t] for t in all_three]):.3f} "
          f"(cpu-minutes {fair.busy} and {fifo.busy}); steady two over the day: "
          f"{jain([fair.used[t] for t in steady]):.3f} and {jain([fifo.used[t] for t in steady]):.3f} "
          f"(team-a's part {fair.used['team-a'] / (fair.used['team-a'] + fair.used['team-b']):.1%} and "
          f"{fifo.used['team-a'] / (fifo.used['team-a'] + fifo.used['team-b']):.1%}); "
          f"longest wait with work queued and none dispatched (minutes): {minutes(fair.longest_wait)} and "
          f"{minutes(fifo.longest_wait)}")
    assert fair.busy["team-d"] > 0 and len(fair.bursts) >= 2, fair
    assert max(fair.longest_wait.values()) <= 3600, f"someone waited longer than the half-life: {fair.longest_wait}"
    for used in (fair.used, fair.busy):
        for team in steady:
            share_of = used[team] / (used["team-a"] + used["team-b"])
            assert abs(share_of - 1 / 2) <= 0.1 / 2, f"{team} had {share_of:.1%} of the steady two's: {used}"


# -- weights ---------------------------------------------------------------------------------------------------------


def namespace(name: str, weight: str | None = None) -> dict[str, Any]:
    labels = {} if weight is None else {WEIGHT_LABEL: weight}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "resourceVersion": "1",
                                                                  "labels": labels}}


@pytest.mark.parametrize("weight", ["none", "at start", "set while they run", "on the AppWrapper"])
def test_a_namespace_weight_set_by_the_admin_orders_equal_usage(harness_factory: Any, weight: str) -> None:
    """team-a and team-b each ran one 1-cpu AppWrapper for ten minutes; team-b's next one is older than team-a's.
    Weight 2 on team-a's Namespace halves its score: its AppWrapper takes the slot that frees first, from the next
    cycle on (set while they run, no restart). The same key on the AppWrapper is nobody's weight."""
    own = team_aw("team-a", "a1", created="2026-01-01T09:00:05Z")
    if weight == "on the AppWrapper":
        own["metadata"]["labels"] = {WEIGHT_LABEL: "100"}
        own["metadata"]["annotations"] = {WEIGHT_LABEL: "100"}
    aws = [team_aw("team-a", "a0"), team_aw("team-b", "b0"), team_aw("team-b", "b1", created="2026-01-01T09:00:01Z"),
           own]
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=aws, fit="aggregate", fair_sharing=True,
                        namespaces=[namespace("team-a", "2" if weight == "at start" else None), namespace("team-b")])
    h.drain()
    assert dispatched(h) == {"team-a/a0", "team-b/b0"}
    h.clock.advance(600)
    if weight == "set while they run":
        h.lw["ns"].modify(namespace("team-a", "2"))
        h.drain()
    finish(h, "team-a/a0")
    expected = "team-a/a1" if weight in ("at start", "set while they run") else "team-b/b1"
    assert dispatched(h) == {"team-b/b0", expected}
    fair = h.dispatcher.owners.fair
    assert fair.weight("namespace:team-a") == (2.0 if expected == "team-a/a1" else 1.0)


def tree(weights: dict[str, float]) -> list[dict[str, Any]]:
    """One soft tree whose nodes limit only cpu (far above what is asked): quota never holds anyone back here."""
    def subtree(name: str, children: list[dict[str, Any]], parent: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"children": children, **({"parent": parent} if parent else {})}
        return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree", "spec": spec,
                "metadata": {"name": name, "namespace": "q", "labels": {"tree": "t"}, "resourceVersion": "1"}}

    return [subtree("root", [{"name": "root", "quotas": {"requests": {"cpu": "1000"}}}]),
            subtree("teams", [{"name": team, WEIGHT_FIELD: weight, "quotas": {"requests": {"cpu": "1000"}}}
                              for team, weight in weights.items()], parent="root")]


def weighted_day(harness_factory: Any, seed: int, source: str) -> dict[str, float]:
    """team-a (weight 1) and team-b (weight 2), by their Namespaces' labels or by their quota nodes' fields, each
    keep eight 1-GPU AppWrappers queued all day on an 8-GPU node; jobs run 5 to 15 minutes. Returns each one's
    GPU-minutes after a two-hour warm-up."""
    rng = random.Random(seed)
    weights = {"team-a": 1.0, "team-b": 2.0}
    options: dict[str, Any] = {"namespaces": [namespace(team, f"{w:g}" if source == "namespace" else None)
                                              for team, w in weights.items()]}
    if source == "quota":
        lw = FakeListerWatcher()
        for obj in tree(weights):
            lw.add(obj)
        options["quota_subtrees"] = Informer("quotasubtrees", lw, transform=subtree_view)
    h = harness_factory(nodes=[gpu_node("n0", 8)], pods=[], aws=[], fit="aggregate", fair_sharing=True, **options)
    day = Day(h, rng)
    used = dict.fromkeys(weights, 0.0)

    def arrive(minute: int) -> None:
        for team in weights:
            for _ in range(8 - day.queued(team)):
                raw = gang_aw(day.name(team), 1, {"cpu": "100m", "nvidia.com/gpu": "1"})
                raw["metadata"].update(namespace=team, creationTimestamp="2026-01-01T09:00:00Z")
                raw["metadata"]["uid"] = f"uid-{team}-{raw['metadata']['name']}"
                if source == "quota":
                    raw["metadata"]["labels"] = {"t": team}
                h.lw["aw"].add(raw)

    day.run(arrive, running=count_by_team(used))
    return used


@pytest.mark.parametrize("source", ["namespace", "quota"])
@pytest.mark.parametrize("seed", range(2))
def test_a_busy_day_shares_the_gpus_by_weight(harness_factory: Any, seed: int, source: str) -> None:
    used = weighted_day(harness_factory, seed, source)
    total = sum(used.values())
    for team, expected in (("team-a", 1 / 3), ("team-b", 2 / 3)):
        share_of = used[team] / total
        assert abs(share_of - expected) <= 0.1 * expected, f"{team} had {share_of:.1%} of the GPU-hours: {used}"
    print(f"weights 1 and 2 by {source}, seed {seed}: GPU-hour shares "
          f"{used['team-a'] / total:.1%} and {used['team-b'] / total:.1%} ({used})")


def checks_per_cycle(h: Any, mocker: Any) -> int:
    """Fit checks one dispatch cycle makes (``mcad.model.fit.fits``, as reservations and the walk call it)."""
    from mcad.model import reservations
    spy = mocker.spy(reservations, "fits")
    h.dispatcher.owners.cycle.run()
    count = spy.call_count
    mocker.stop(spy)
    return count


@pytest.mark.parametrize("teams", [1, 10])
def test_tenants_whose_work_is_alike_cost_one_fit_check(harness_factory: Any, mocker: Any, teams: int) -> None:
    """A 2-cpu node runs one 2-cpu AppWrapper; 20 more of the same demand wait, spread over ``teams`` namespaces.
    With fair sharing each team's are a group of their own, yet a cycle judges the demand once, as it would one
    team's: a tenant orders the queue, it does not change what fits. Each team's head is still told, in its own
    words, what it lacks."""
    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=[team_aw("busy", "runs", cpu="2")],
                        fair_sharing=True, reservations=0)
    h.drain()
    assert dispatched(h) == {"busy/runs"}
    for i in range(20):
        h.lw["aw"].add(team_aw(f"team-{i % teams:02d}", f"w{i:02d}", cpu="2", created=f"2026-01-01T09:00:{i:02d}Z"))
    h.drain()
    assert checks_per_cycle(h, mocker) == 1
    for i in range(teams):
        message = last_status(h, f"w{i:02d}")["message"]
        assert "cpu" in message and "team-" not in message and "busy" not in message, message


def test_a_cycle_looks_at_one_of_alike_tenants_groups_and_tells_the_rest_when_the_reason_changes(
        harness_factory: Any, mocker: Any) -> None:
    """Ten teams' 2-cpu AppWrappers wait behind a 2-cpu node's running one. A cycle judges one team's head and drops
    the other nine groups unlooked at; when what they wait for changes (the node is tainted), every team's head is
    told the new reason."""
    from mcad.model import walk

    h = harness_factory(nodes=[node("n0", "2")], pods=[], aws=[team_aw("busy", "runs", cpu="2")],
                        fair_sharing=True, reservations=0)
    h.drain()
    for i in range(20):
        h.lw["aw"].add(team_aw(f"team-{i % 10:02d}", f"w{i:02d}", cpu="2", created=f"2026-01-01T09:00:{i:02d}Z"))
    h.drain()
    judged = mocker.spy(walk, "_judge")
    h.dispatcher.owners.cycle.run()
    assert judged.call_count == 1, "one head judged; the nine alike groups dropped"
    before = {i: last_status(h, f"w{i:02d}")["message"] for i in range(10)}
    tainted = node("n0", "2")
    tainted["metadata"]["resourceVersion"] = "2"
    tainted["spec"] = {"taints": [{"key": "maintenance", "value": "yes", "effect": "NoSchedule"}]}
    h.lw["node"].add(tainted)
    h.drain()
    for i in range(10):
        message = last_status(h, f"w{i:02d}")["message"]
        assert message != before[i] and "maintenance" in message and "team-" not in message, message


@pytest.mark.parametrize("preemption", [False, True])
def test_a_judgement_shared_between_tenants_is_the_judgement_each_would_get(harness_factory: Any, mocker: Any,
                                                                           preemption: bool) -> None:
    """Seeded churn of three tenants with reservations, rack-requiring gangs, priorities and (or not) priority
    preemption: just before every dispatch cycle, the dry run with tenants' alike groups judged once tells each
    queued AppWrapper what a dry run judging every group would."""
    from mcad.model import walk
    from test.component.test_one_pass import churn

    rng, limits = random.Random(11), random.Random(12)
    nodes = [node(f"n{i}", "4") for i in range(6)]
    for i, raw in enumerate(nodes):
        raw["metadata"]["labels"] = {"topology.example.com/rack": f"rack-{i // 3}"}
    h = harness_factory(nodes=nodes, pods=[], aws=[], fair_sharing=True, reservations=3, preemption=preemption,
                        preemption_backoff=0.0)
    cycle = h.dispatcher.owners.cycle
    run = cycle.run
    seen = {"cycles": 0, "told": 0, "evicting": 0}
    differed: list[tuple[int, dict[str, Any], dict[str, Any]]] = []  # an assert in a cycle would be retried
    shared_once = mocker.spy(walk, "_worded_for")  # a verdict judged alike to another tenant's, read

    def compare_then_run() -> None:
        shared = {a.key: (a.state, a.fits_now, a.why, a.evicts) for a in cycle.assess()}
        with patch.object(walk, "alike", lambda group: group):  # no group is alike to another
            each = {a.key: (a.state, a.fits_now, a.why, a.evicts) for a in cycle.assess()}
        if shared != each:
            differed.append((seen["cycles"], shared, each))
        seen["cycles"] += 1
        seen["told"] += len(shared)
        seen["evicting"] += sum(1 for told in shared.values() if told[3])
        run()

    cycle.run = compare_then_run
    live: dict[str, list[str]] = {}
    for round_ in range(60):
        churn(h, rng, limits, round_, live, racks=True, tenants=3)
        h.drain()
        h.clock.advance(30)
    assert not differed, differed[0]
    assert seen["told"] > 200 and shared_once.call_count > 20, (seen, shared_once.call_count)
    assert (seen["evicting"] > 0) is preemption, seen


@pytest.mark.parametrize("found", ["at the start", "after cycles ran"])
def test_appwrappers_found_running_count_in_their_tenants_usage(harness_factory: Any, found: str) -> None:
    """The controller finds team-a's AppWrapper running (adopted: at a restart, or its status restored while this
    controller runs; not dispatched here): what it holds counts in team-a's usage, so when its room frees team-b's
    AppWrapper goes before team-a's, though queued later."""
    running = team_aw("team-a", "a0", cpu="2")
    running["status"] = {"state": "Running"}
    early = found == "at the start"
    h = harness_factory(nodes=[node("n0", "3")], pods=[], fit="aggregate", fair_sharing=True,
                        aws=[team_aw("team-c", "c0", cpu="1"), *([running] if early else [])])
    h.drain()
    if not early:
        assert h.dispatcher.owners.cycle.count > 0 and dispatched(h) == {"team-c/c0"}
        h.lw["aw"].add(running)
        h.drain()
    assert dispatched(h) == {"team-c/c0", "team-a/a0"}
    # Queued when nobody has used anything yet; the cycle they bring counts a0 in from then on.
    h.lw["aw"].add(team_aw("team-a", "a1", cpu="2", created="2026-01-01T09:00:00Z"))
    h.lw["aw"].add(team_aw("team-b", "b0", cpu="2", created="2026-01-01T10:00:00Z"))
    h.drain()
    h.clock.advance(600)
    assert h.dispatcher.owners.fair.usage()["namespace:team-a"] > 300, "ten minutes of two thirds of the cluster"
    finish(h, "team-a/a0")
    h.drain()
    assert dispatched(h) == {"team-c/c0", "team-b/b0"}
