"""The access gate of /metrics and /debug: which header carries the token, what is cached and for how long, and
that a review that fails is never an open door. The API calls are a stand-in that counts them; the real TokenReview
and SubjectAccessReview are exercised against an API server in test/e2e/test_endpoint_access.py."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from mcad.admission.request import UserInfo
from mcad.k8s import kube
from mcad.serve.endpointauth import Attributes, Gate, ReviewUnavailable, Unauthenticated, bearer_token
from test.support import wait_until

ALICE = UserInfo("system:serviceaccount:team-a:alice", uid="u-1", groups=("system:serviceaccounts",))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reviews:
    """Tokens it knows map to users; ``grants`` are the (user, attributes-json) pairs allowed."""

    def __init__(self) -> None:
        self.tokens: dict[str, dict[str, Any]] = {"good": {"username": ALICE.username, "uid": "u-1",
                                                           "groups": ["system:serviceaccounts"]}}
        self.grants: list[dict[str, Any]] = []
        self.token_reviews = 0
        self.access_reviews: list[Mapping[str, Any]] = []
        self.fail: kube.ApiError | None = None
        self.block: threading.Event | None = None

    def token_review(self, token: str, timeout: float) -> Mapping[str, Any]:
        self.token_reviews += 1
        if self.block is not None:
            self.block.wait(5)
        if self.fail is not None:
            raise self.fail
        user = self.tokens.get(token)
        return {"status": {"authenticated": True, "user": user}} if user else {"status": {"error": "invalid"}}

    def access_review(self, spec: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
        self.access_reviews.append(spec)
        if self.fail is not None:
            raise self.fail
        return {"status": {"allowed": dict(spec) in self.grants}}


def spec(user: UserInfo, attributes: Attributes) -> dict[str, Any]:
    return {**user.as_json(), **attributes.as_json()}


METRICS = Attributes(verb="get", path="/metrics")


def test_the_proxy_header_wins_and_only_bearer_tokens_count() -> None:
    assert bearer_token({"Authorization": "Bearer abc"}) == "abc"
    assert bearer_token({"X-Mcad-Authorization": "Bearer xyz", "Authorization": "Bearer abc"}) == "xyz"
    assert bearer_token({"Authorization": "bearer  abc "}) == "abc"
    assert bearer_token({"Authorization": "Basic dXNlcjpwYXNz"}) is None
    # A header of another scheme is not a reason to look at the other one.
    assert bearer_token({"X-Mcad-Authorization": "Basic x", "Authorization": "Bearer abc"}) is None
    assert bearer_token({"Authorization": "Bearer"}) is None
    assert bearer_token({}) is None


def test_token_reviews_are_cached_by_hash_accepted_longer_than_refused() -> None:
    reviews, clock = Reviews(), Clock()
    gate = Gate(reviews, token_ttl=60, refused_ttl=10, clock=clock)
    assert gate.authenticate("good") == ALICE
    assert gate.authenticate("good") == ALICE
    assert reviews.token_reviews == 1
    assert all("good" not in str(key) for key in gate._tokens)  # only a hash is kept
    with pytest.raises(Unauthenticated):
        gate.authenticate("bad")
    with pytest.raises(Unauthenticated):
        gate.authenticate("bad")
    assert reviews.token_reviews == 2
    clock.now += 11  # the refusal expired, the acceptance did not
    reviews.tokens["bad"] = reviews.tokens["good"]
    assert gate.authenticate("bad") == ALICE
    assert gate.authenticate("good") == ALICE
    assert reviews.token_reviews == 3
    clock.now += 60
    gate.authenticate("good")
    assert reviews.token_reviews == 4
    with pytest.raises(Unauthenticated):
        gate.authenticate(None)
    with pytest.raises(Unauthenticated):
        gate.authenticate("")


def test_access_reviews_carry_the_user_and_are_cached_per_user_and_attributes() -> None:
    reviews, clock = Reviews(), Clock()
    gate = Gate(reviews, allow_ttl=60, deny_ttl=10, clock=clock)
    reviews.grants.append(spec(ALICE, METRICS))
    assert gate.allowed(ALICE, METRICS)
    assert gate.allowed(ALICE, METRICS)
    assert reviews.access_reviews == [{"user": ALICE.username, "uid": "u-1", "groups": ["system:serviceaccounts"],
                                       "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}]
    team_a = Attributes(verb="list", group="workload.codeflare.dev", resource="appwrappers", namespace="team-a")
    assert not gate.allowed(ALICE, team_a)
    assert reviews.access_reviews[-1]["resourceAttributes"] == {
        "group": "workload.codeflare.dev", "resource": "appwrappers", "verb": "list", "namespace": "team-a"}
    # Another user with the same name but other groups is another cache entry.
    bob = UserInfo(ALICE.username, uid="u-1", groups=("system:masters",))
    assert not gate.allowed(bob, METRICS)
    assert len(reviews.access_reviews) == 3
    reviews.grants.append(spec(ALICE, team_a))
    assert not gate.allowed(ALICE, team_a)  # the denial is still cached
    clock.now += 11
    assert gate.allowed(ALICE, team_a)
    assert len(reviews.access_reviews) == 4


def test_failed_reviews_are_refusals_and_are_not_cached() -> None:
    reviews = Reviews()
    gate = Gate(reviews, clock=Clock())
    reviews.fail = kube.ApiError(0, "Timeout", "no answer")
    with pytest.raises(ReviewUnavailable):
        gate.authenticate("good")
    with pytest.raises(ReviewUnavailable):
        gate.allowed(ALICE, METRICS)
    reviews.fail = None
    reviews.grants.append(spec(ALICE, METRICS))
    assert gate.authenticate("good") == ALICE
    assert gate.allowed(ALICE, METRICS)


def test_answers_that_say_nothing_are_refusals() -> None:
    class Odd(Reviews):
        def token_review(self, token: str, timeout: float) -> Mapping[str, Any]:
            return {"status": {"authenticated": True, "user": {"username": ""}}} if token == "nameless" else {}

        def access_review(self, spec: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
            return {"status": {"allowed": True, "denied": True}}

    gate = Gate(Odd(), clock=Clock())
    for token in ("nameless", "other"):
        with pytest.raises(Unauthenticated):
            gate.authenticate(token)
    assert not gate.allowed(ALICE, METRICS)


def test_reviews_under_way_are_bounded() -> None:
    reviews = Reviews()
    reviews.block = threading.Event()
    gate = Gate(reviews, max_reviews=2, timeout=0.2, clock=Clock())
    started = [threading.Thread(target=lambda t=t: _ignore(gate.authenticate, t)) for t in ("a", "b")]
    for thread in started:
        thread.start()
    try:
        wait_until(lambda: reviews.token_reviews == 2, 5, "two reviews under way")
        with pytest.raises(ReviewUnavailable, match="too many"):
            gate.authenticate("c")
        assert reviews.token_reviews == 2
    finally:
        reviews.block.set()
        for thread in started:
            thread.join(5)


def _ignore(fn: Any, *args: Any) -> None:
    with contextlib.suppress(Unauthenticated, ReviewUnavailable):
        fn(*args)
