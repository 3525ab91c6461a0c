"""Who may read the controller's /metrics and /debug endpoints: bearer token -> TokenReview -> SubjectAccessReview.

Contract (the scheme of controller-runtime's secure metrics filter, plus a header that survives the API server's
proxy):
- ``bearer_token(headers)``: the token of ``X-Mcad-Authorization: Bearer <t>`` if present, else of
  ``Authorization: Bearer <t>``; None when neither carries one. The API server's pod and service proxy removes
  ``Authorization`` after authenticating the caller and forwards no identity, so ``mcadctl`` sends the user's own
  token in ``X-Mcad-Authorization``. Either header is only a claim: the token is always TokenReviewed.
- ``Gate.authenticate(token)``: the ``UserInfo`` the API server's TokenReview returns; ``Unauthenticated`` when it
  does not accept the token; ``ReviewUnavailable`` when the review could not be made (no answer in time, an
  error status, too many reviews under way): never an open door.
- ``Gate.allowed(user, attributes)``: the SubjectAccessReview's answer for ``attributes`` (a non-resource path
  and verb, or a resource, verb and namespace, "" for every namespace); ``ReviewUnavailable`` as above.
- Answers are cached in bounded TTL caches: TokenReviews by the SHA-256 of the token (the token itself is never
  kept, logged, nor sent anywhere but the TokenReview), accepted for ``token_ttl`` and refused for
  ``refused_ttl``; SubjectAccessReviews by user, groups, uid, extra and attributes, allowed for ``allow_ttl``
  and denied for ``deny_ttl``. Failed reviews are not cached. At most ``max_reviews`` reviews are under way at
  once; a request that cannot start one within ``timeout`` is ``ReviewUnavailable`` (a flood of random tokens
  costs the API server a bounded rate, and the handler threads a bounded wait).
- TokenReviews of unknown tokens (in neither cache, and not accepted within ``known_ttl``) are bounded by a global
  token bucket (``unknown_tokens``: ``UNKNOWN_TOKENS_PER_SECOND``, burst ``UNKNOWN_TOKENS_BURST``): over it,
  ``ReviewUnavailable`` "too many unknown tokens; retry" (503) without a TokenReview, counted in ``refusals``. A
  token the API server accepted before (a Prometheus scraper's, a user's) is re-reviewed outside that bound when
  its cache entry expires: a flood of random tokens delays only tokens never seen.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import cachetools
import structlog

from mcad.admission.callers import CallerRefusals, TokenBucket
from mcad.admission.request import UserInfo
from mcad.errors import ApiError
from mcad.k8s import kube

log = structlog.get_logger("mcad.serve.endpointauth")

PROXY_HEADER = "X-Mcad-Authorization"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# Long enough that a poller reviews its token about once a minute; short enough that a revoked token or a removed
# RoleBinding stops working soon. Refusals are kept shorter: a user who was just granted a right retries.
TOKEN_TTL_SECONDS = 60.0
REFUSED_TTL_SECONDS = 10.0
ALLOW_TTL_SECONDS = 60.0
DENY_TTL_SECONDS = 10.0
CACHE_SIZE = 4096
REVIEW_TIMEOUT_SECONDS = 5.0
MAX_REVIEWS = 8
# New tokens are rare (a scraper's token is reviewed about once a minute, a user's on their first request): a flood of
# random ones observed at 246 TokenReviews/s is held to this.
UNKNOWN_TOKENS_PER_SECOND = 5.0
UNKNOWN_TOKENS_BURST = 20
# How long a token once accepted skips the bound on unknown tokens (only its SHA-256 is kept).
KNOWN_TTL_SECONDS = 3600.0


class Unauthenticated(Exception):
    """The API server does not accept the token (or there is none)."""


class ReviewUnavailable(Exception):
    """A TokenReview or SubjectAccessReview could not be made now; the request must fail (503), not pass."""


@dataclass(frozen=True)
class Attributes:
    """What a request does, as a SubjectAccessReview names it: a non-resource ``path``, or a ``resource``."""

    verb: str
    path: str = ""
    group: str = ""
    resource: str = ""
    namespace: str = ""

    def as_json(self) -> dict[str, Any]:
        if self.path:
            return {"nonResourceAttributes": {"path": self.path, "verb": self.verb}}
        resource: dict[str, Any] = {"group": self.group, "resource": self.resource, "verb": self.verb}
        if self.namespace:
            resource["namespace"] = self.namespace
        return {"resourceAttributes": resource}

    def describe(self) -> str:
        if self.path:
            return f"{self.verb} {self.path}"
        where = f"in namespace {self.namespace}" if self.namespace else "in every namespace"
        return f"{self.verb} {self.resource}.{self.group} {where}" if self.group else \
            f"{self.verb} {self.resource} {where}"


def bearer_token(headers: Mapping[str, str] | Any) -> str | None:
    """The bearer token the request presents (see the module contract for which header wins)."""
    for name in (PROXY_HEADER, "Authorization"):
        value = headers.get(name)
        if value:
            scheme, _, token = str(value).strip().partition(" ")
            token = token.strip()
            if scheme.lower() == "bearer" and token:
                return token
            return None  # a header of another scheme is no token; never fall back to the other header
    return None


class Reviews(Protocol):
    """The two API calls the gate makes (a real API server in production; a fake in unit tests)."""

    def token_review(self, token: str, timeout: float) -> Mapping[str, Any]: ...

    def access_review(self, spec: Mapping[str, Any], timeout: float) -> Mapping[str, Any]: ...


class ApiReviews:
    """TokenReviews and SubjectAccessReviews sent with the controller's own credentials."""

    def __init__(self, conn: kube.Connection) -> None:
        self.conn = conn

    def token_review(self, token: str, timeout: float) -> Mapping[str, Any]:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        return kube.request_json(self.conn, "POST", TOKEN_REVIEWS, body=body, timeout=timeout)

    def access_review(self, spec: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": dict(spec)}
        return kube.request_json(self.conn, "POST", ACCESS_REVIEWS, body=body, timeout=timeout)


_Verdict = tuple[bool, Any]  # (accepted, UserInfo or the refusal's message)


class Gate:
    def __init__(self, reviews: Reviews, *, token_ttl: float = TOKEN_TTL_SECONDS,
                 refused_ttl: float = REFUSED_TTL_SECONDS, allow_ttl: float = ALLOW_TTL_SECONDS,
                 deny_ttl: float = DENY_TTL_SECONDS, maxsize: int = CACHE_SIZE,
                 timeout: float = REVIEW_TIMEOUT_SECONDS, max_reviews: int = MAX_REVIEWS,
                 unknown_tokens: TokenBucket | None = None, known_ttl: float = KNOWN_TTL_SECONDS,
                 refusals: CallerRefusals | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.reviews = reviews
        self._unknown = unknown_tokens if unknown_tokens is not None else TokenBucket(
            UNKNOWN_TOKENS_PER_SECOND, UNKNOWN_TOKENS_BURST, clock)
        self._known: cachetools.TTLCache[str, bool] = cachetools.TTLCache(maxsize, known_ttl, timer=clock)
        self.refusals = refusals
        self.timeout = timeout
        self._refused_ttl = refused_ttl
        self._deny_ttl = deny_ttl
        self._clock = clock
        # Entries carry their own expiry (accepted and refused answers live for different times); the TTL caches
        # bound size and drop entries past the longer of the two.
        self._tokens: cachetools.TTLCache[str, tuple[float, _Verdict]] = cachetools.TTLCache(
            maxsize, max(token_ttl, refused_ttl), timer=clock)
        self._access: cachetools.TTLCache[tuple[Any, ...], tuple[float, bool]] = cachetools.TTLCache(
            maxsize, max(allow_ttl, deny_ttl), timer=clock)
        self._token_ttl = token_ttl
        self._allow_ttl = allow_ttl
        self._lock = threading.Lock()  # TTLCache is not thread-safe
        self._slots = threading.BoundedSemaphore(max_reviews)
        self.reviews_made = 0  # for tests: how many reviews reached the API server

    # ------------------------------------------------------------------------------------------ authentication

    def authenticate(self, token: str | None) -> UserInfo:
        if not token:
            raise Unauthenticated("no bearer token")
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cached(self._tokens, key)
        if cached is None:
            with self._lock:
                bounded = key not in self._known
                over = bounded and not self._unknown.take()
            if over:
                if self.refusals is not None:
                    self.refusals.count("http", "unknown_tokens")
                raise ReviewUnavailable("too many unknown tokens; retry")
            answer = self._review(lambda timeout: self.reviews.token_review(token, timeout), "TokenReview")
            status = _status(answer)
            if status.get("authenticated") is True and isinstance(status.get("user"), Mapping):
                user = UserInfo.parse(status["user"])
                cached = (True, user) if user.username else (False, "the TokenReview names no user")
            else:
                cached = (False, str(status.get("error") or "the API server does not accept this token"))
            self._store(self._tokens, key, cached, self._token_ttl if cached[0] else self._refused_ttl)
            if cached[0]:
                with self._lock:
                    self._known[key] = True
        accepted, value = cached
        if not accepted:
            raise Unauthenticated(str(value))
        return value  # type: ignore[no-any-return]

    # ------------------------------------------------------------------------------------------ authorization

    def allowed(self, user: UserInfo, attributes: Attributes) -> bool:
        key = (user, attributes)
        cached = self._cached(self._access, key)
        if cached is None:
            spec = {**user.as_json(), **attributes.as_json()}
            answer = self._review(lambda timeout: self.reviews.access_review(spec, timeout), "SubjectAccessReview")
            status = _status(answer)
            # An evaluation error with allowed false is a denial; allowed true is trusted only alongside denied
            # not true (the API server never sends both, but a denial wins).
            cached = status.get("allowed") is True and status.get("denied") is not True
            self._store(self._access, key, cached, self._allow_ttl if cached else self._deny_ttl)
        return bool(cached)

    # ------------------------------------------------------------------------------------------ plumbing

    def _cached(self, cache: cachetools.TTLCache[Any, Any], key: Any) -> Any:
        with self._lock:
            entry = cache.get(key)
        if entry is None:
            return None
        expires, value = entry
        return value if self._clock() < expires else None

    def _store(self, cache: cachetools.TTLCache[Any, Any], key: Any, value: Any, ttl: float) -> None:
        with self._lock:
            cache[key] = (self._clock() + ttl, value)

    def _review(self, call: Callable[[float], Mapping[str, Any]], what: str) -> Mapping[str, Any]:
        started = time.monotonic()
        if not self._slots.acquire(timeout=self.timeout):
            raise ReviewUnavailable(f"too many {what}s under way; retry")
        try:
            remaining = max(0.1, self.timeout - (time.monotonic() - started))
            self.reviews_made += 1
            answer = call(remaining)
        except ApiError as err:
            log.warning("access review failed", review=what, reason=err.reason or "no answer", status=err.status)
            raise ReviewUnavailable(f"the {what} failed ({err.status or 'no answer'} {err.reason}); retry") from err
        finally:
            self._slots.release()
        if not isinstance(answer, Mapping):
            raise ReviewUnavailable(f"the {what} answer is not an object")
        return answer


def _status(answer: Mapping[str, Any]) -> Mapping[str, Any]:
    status = answer.get("status")
    return status if isinstance(status, Mapping) else {}
