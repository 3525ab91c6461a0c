"""Leader election against a real API server: one leader at a time, takeover bounds, conflicts, lost leadership.

Electors run in threads of this process on one Lease in the test's namespace, with short timings. Takeover times
are measured with the monotonic clock from the moment the leader stopped (or was cut off) to the moment the
standby's ``on_started_leading`` ran.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

from mcad.k8s import kube
from mcad.k8s.leader import LEASE_API, LeaderElector
from test.support import token_kubeconfig, wait_until

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 2.0, 1.5, 0.25
# Request latency and thread wake-ups on a busy 2-core machine, allowed on top of the protocol's bounds.
SLACK = 0.5


@dataclass
class Candidate:
    elector: LeaderElector
    admin: kube.Connection  # reads the Lease for the test, whatever the elector's own rights
    stop: threading.Event = field(default_factory=threading.Event)
    started_at: float | None = None
    stopped_at: float | None = None
    holder_when_stopped: str | None = None  # who the Lease named while on_stopped_leading ran
    thread: threading.Thread | None = None

    def start(self) -> Candidate:
        self.thread = threading.Thread(target=self.elector.run, args=(self.stop, self._started, self._stopped),
                                       name=f"elector-{self.elector.identity}", daemon=True)
        self.thread.start()
        return self

    def halt(self) -> float:
        """Set stop and wait for run() to return; the monotonic time stop was set."""
        at = time.monotonic()
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()
        return at

    def _started(self) -> None:
        self.started_at = time.monotonic()

    def _stopped(self) -> None:
        self.stopped_at = time.monotonic()
        self.holder_when_stopped = self.holder()

    def holder(self) -> str:
        """The holder the Lease names now, read as admin."""
        path = f"{LEASE_API}/namespaces/{self.elector.namespace}/leases/{self.elector.name}"
        return str(kube.request_json(self.admin, "GET", path)["spec"].get("holderIdentity") or "")


class MakeCandidate(Protocol):
    def __call__(self, identity: str, *, lease: str = ..., connection: kube.Connection | None = ...,
                 release_on_stop: bool = ...) -> Candidate: ...


@pytest.fixture
def conn(kubeconfig: str) -> kube.Connection:
    return kube.connect(kubeconfig)


@pytest.fixture
def make(conn: kube.Connection, namespace: str) -> Iterator[MakeCandidate]:
    """``make(identity, lease=..., conn=..., release_on_stop=...)``: a Candidate (not started), halted at the end."""
    made: list[Candidate] = []

    def factory(identity: str, *, lease: str = "lease", connection: kube.Connection | None = None,
                release_on_stop: bool = True) -> Candidate:
        candidate = Candidate(LeaderElector(connection or conn, namespace=namespace, name=lease, identity=identity,
                                            lease_duration=LEASE_DURATION, renew_deadline=RENEW_DEADLINE,
                                            retry_period=RETRY_PERIOD, release_on_stop=release_on_stop), conn)
        made.append(candidate)
        return candidate

    yield factory
    for candidate in made:
        if candidate.thread is not None and candidate.thread.is_alive():
            candidate.halt()


def leader_of(*candidates: Candidate) -> Candidate:
    """Wait until exactly one candidate leads and return it."""
    def one() -> Candidate | None:
        leading = [c for c in candidates if c.elector.is_leader]
        assert len(leading) <= 1, [c.elector.identity for c in leading]
        return leading[0] if leading else None

    return wait_until(one, 10, "a leader")


def test_exactly_one_of_two_leads_and_both_know_who(make: MakeCandidate) -> None:
    a, b = make("a").start(), make("b").start()
    first = leader_of(a, b)
    other = b if first is a else a
    wait_until(lambda: other.elector.settled, 5, "the standby to settle")
    # Several renewal periods later still the same single leader, and the standby never started leading.
    deadline = time.monotonic() + 4 * RETRY_PERIOD
    while time.monotonic() < deadline:
        assert first.elector.is_leader and not other.elector.is_leader
        time.sleep(RETRY_PERIOD / 2)
    assert other.started_at is None
    assert first.elector.leader == other.elector.leader == first.elector.identity == first.holder()
    assert first.elector.settled and other.elector.settled


def test_a_crashed_leader_is_replaced_within_lease_duration_plus_retry_period(make: MakeCandidate) -> None:
    a = make("a", release_on_stop=False).start()
    leader_of(a)
    b = make("b").start()
    wait_until(lambda: b.elector.settled, 5, "the standby to see the leader")
    transitions = b.elector.transitions
    crashed_at = a.halt()  # stops renewing, leaves the Lease as it was
    assert a.holder() == "a"
    wait_until(lambda: b.started_at, LEASE_DURATION + RETRY_PERIOD + 5, "the standby to take over")
    assert b.started_at is not None
    took = b.started_at - crashed_at
    # Not before the claim lapsed: a full duration after a renewal at most one retry period before the crash.
    assert LEASE_DURATION - RETRY_PERIOD <= took <= LEASE_DURATION + RETRY_PERIOD + SLACK, took
    assert b.elector.is_leader and b.holder() == "b"
    assert b.elector.transitions == transitions + 1
    print(f"takeover after a crash: {took:.2f} s (lease {LEASE_DURATION} s, retry {RETRY_PERIOD} s)")


def test_a_graceful_stop_quiets_the_leader_then_releases_for_a_fast_handover(make: MakeCandidate) -> None:
    a = make("a").start()
    leader_of(a)
    b = make("b").start()
    wait_until(lambda: b.elector.settled, 5, "the standby to see the leader")
    stopped_at = a.halt()
    # on_stopped_leading ran while the Lease still named a: its writers were quiet before anyone could take over.
    assert a.holder_when_stopped == "a"
    assert not a.elector.is_leader
    wait_until(lambda: b.started_at, 5, "the standby to take over")
    assert b.started_at is not None
    took = b.started_at - stopped_at
    assert took <= RETRY_PERIOD + SLACK, took
    print(f"handover after a graceful stop: {took:.2f} s (retry {RETRY_PERIOD} s)")


def test_a_leader_that_finds_another_holder_steps_down_at_once(make: MakeCandidate, conn: kube.Connection,
                                                               namespace: str) -> None:
    a = make("a").start()
    leader_of(a)
    path = f"{LEASE_API}/namespaces/{namespace}/leases/lease"
    lease = kube.request_json(conn, "GET", path)
    lease["spec"]["holderIdentity"] = "intruder"
    kube.request_json(conn, "PUT", path, body=lease)
    intruded_at = time.monotonic()
    assert a.thread is not None
    a.thread.join(timeout=RETRY_PERIOD + SLACK + 5)
    assert not a.thread.is_alive(), "run() kept going after the Lease named another holder"
    assert a.stopped_at is not None and a.stopped_at - intruded_at <= RETRY_PERIOD + SLACK
    assert not a.elector.is_leader and a.elector.leader == "intruder"
    assert a.elector.conflicts >= 1  # its renewal carried the old resourceVersion: 409
    assert a.holder() == "intruder"  # lost leadership is not a release


def race(candidates: list[Candidate]) -> list[bool]:
    """Every candidate runs one read-decide-write round, all released at once; who ended up holding the Lease."""
    barrier = threading.Barrier(len(candidates))
    won = [False] * len(candidates)

    def attempt(i: int) -> None:
        barrier.wait()
        won[i] = candidates[i].elector.try_acquire_or_renew()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(len(candidates))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    return won


def test_racing_candidates_yield_one_winner_and_conflicts_are_handled(make: MakeCandidate) -> None:
    """Four candidates read-decide-write at the same moment, first for a Lease nobody has created (POST race),
    then for one just released (PUT race). Exactly one wins each race; rounds repeat until 409s were seen."""
    rounds = 0
    conflicts = 0
    while conflicts == 0 or rounds < 2:
        rounds += 1
        assert rounds <= 20, "no two candidates ever raced: the test proves nothing"
        lease = f"race-{uuid.uuid4().hex[:6]}"
        candidates = [make(f"c{i}", lease=lease) for i in range(4)]
        for _race in ("create", "take over a released lease"):
            won = race(candidates)
            assert won.count(True) == 1, won
            winner = candidates[won.index(True)].elector
            assert candidates[won.index(True)].holder() == winner.identity
            assert winner.release()
        conflicts = sum(c.elector.conflicts for c in candidates)
    print(f"{conflicts} conflicts in {rounds} rounds")


def _service_account_kubeconfig(conn: kube.Connection, kubeconfig: str, namespace: str, account: str,
                                 path: Path) -> str:
    """A kubeconfig carrying only a token of ``account`` (TokenRequest)."""
    token = kube.request_json(conn, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                              body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": {"expirationSeconds": 3600}})["status"]["token"]
    return token_kubeconfig(kubeconfig, token, path)


def test_a_leader_that_cannot_renew_gives_up_at_the_renew_deadline(make: MakeCandidate, conn: kube.Connection,
                                                                   kubeconfig: str, namespace: str,
                                                                   tmp_path: Path) -> None:
    """The leader's right to renew is revoked (its RoleBinding deleted): every renewal is refused, and it
    steps down when the renew deadline of its last successful renewal passes, before the lease lapses."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kube.request_json(conn, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                      body={"metadata": {"name": "elector"}})
    kube.request_json(conn, "POST", f"{rbac}/roles", body={
        "metadata": {"name": "elector"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                   "verbs": ["get", "create", "update"]}]})
    kube.request_json(conn, "POST", f"{rbac}/rolebindings", body={
        "metadata": {"name": "elector"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "elector"},
        "subjects": [{"kind": "ServiceAccount", "name": "elector", "namespace": namespace}]})
    as_account = kube.connect(_service_account_kubeconfig(conn, kubeconfig, namespace, "elector",
                                                          tmp_path / "sa.kubeconfig"))
    a = make("a", connection=as_account).start()
    wait_until(lambda: a.elector.is_leader, 10, "the service account to lead")
    kube.request_json(conn, "DELETE", f"{rbac}/rolebindings/elector")
    revoked_at = time.monotonic()
    assert a.thread is not None
    a.thread.join(timeout=RENEW_DEADLINE + SLACK + 5)
    assert not a.thread.is_alive()
    assert a.stopped_at is not None
    took = a.stopped_at - revoked_at
    # Its last good renewal came at most a retry period before the revocation (plus the time RBAC takes to apply).
    assert RENEW_DEADLINE - RETRY_PERIOD <= took <= RENEW_DEADLINE + SLACK, took
    assert took < LEASE_DURATION  # gone before any standby could have taken over
    assert a.holder() == "a"  # it could not write, so the lease simply lapses
