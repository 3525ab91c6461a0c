"""The kube-backed ``Facts`` of admission: discovery, SubjectAccessReview, Namespaces, PriorityClasses.

Contract (``KubeFacts(conn)``; see ``mcad.admission.facts`` for what each method answers):
- Every request is one attempt bounded by ``timeout`` seconds in total (``kube.request_json_once``: no retry by the
  client's pool, whose retries would multiply the bound). The API server waits for the webhook at most its
  ``timeoutSeconds`` (10 s by default, fewer in the chart): an AppWrapper of many items must be judged well within
  that, or the create fails with the webhook's timeout instead of the reason.
- Any failure (no answer, an error status other than "not found", an answer of the wrong shape) raises
  ``FactUnavailable`` saying what could not be checked and why; the reviewers then refuse. Nothing is admitted
  unchecked.
- Answers are cached in bounded ``cachetools.TTLCache``s behind one lock (the webhook server may judge several
  requests at once), with short lives, because each stands for an admin's decision that may change:
  * SubjectAccessReview answers, ``SAR_TTL`` (10 s), keyed by the whole user (name, uid, groups, extra), the verb,
    the resource and the namespace: a right revoked (or granted) counts within seconds, while the items of one
    AppWrapper and a burst of similar AppWrappers by one user cost one review per resource. Denials are cached too:
    a user retrying a refused create in a loop must not turn each retry into N reviews.
  * discovery per group-version, ``DISCOVERY_TTL`` (5 min): kinds change when CRDs come and go, rarely. A kind
    missing from a cached answer refetches its group-version, at most once per ``DISCOVERY_RETRY`` (5 s): a CRD
    installed a moment ago is found at once, and AppWrappers naming kinds that do not exist cannot make every
    request a discovery call.
  * Namespaces and PriorityClasses, ``OBJECT_TTL`` (10 s): the admin's labels and values.
- SubjectAccessReviews actually sent (cache misses) are bounded by ``access_reviews`` (a
  ``callers.SourceBuckets``: per source, the webhook's peer as ``facts.current_source()`` names it, and in all,
  with a total of their own for the API server's addresses when the admin gave them): one over the bound is not
  sent; ``FactUnavailable`` "too many access reviews from <source>; retry" (or "... from all sources at once", or
  "... from the API server's addresses at once") refuses the request instead (never admits it), and ``refusals``
  counts it. Without ``access_reviews``, no bound (tests).
- Inside ``facts.at_hand_only()`` nothing is sent: a question not answered by the caches raises ``WouldAsk``
  before any request or access review is counted.
- Names taken from the request (API versions, namespaces, PriorityClass names) are checked against the Kubernetes
  name syntax before they go into a URL path: a name that does not match is answered "does not exist" without a
  request.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, TypeVar

import cachetools

from mcad.admission.callers import CallerRefusals, SourceBuckets
from mcad.admission.facts import Decision, FactUnavailable, Resource, WouldAsk, current_source, only_at_hand
from mcad.admission.request import UserInfo
from mcad.api.names import is_dns_label
from mcad.errors import ApiError
from mcad.k8s import kube

SAR_TTL: Final = 10.0
SAR_CACHE_SIZE: Final = 4096
DISCOVERY_TTL: Final = 300.0
DISCOVERY_RETRY: Final = 5.0
DISCOVERY_CACHE_SIZE: Final = 512
OBJECT_TTL: Final = 10.0
OBJECT_CACHE_SIZE: Final = 1024
# The bound of one request; several may be needed for one AppWrapper (discovery, then one review per resource).
REQUEST_TIMEOUT: Final = 2.0

_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VERSION = re.compile(r"^[a-z0-9]{1,63}$")

_T = TypeVar("_T")
_MISSING: Final = object()


def split_api_version(api_version: str) -> tuple[str, str] | None:
    """(group, version) of an apiVersion ("" for the core group), or None if it cannot be one."""
    group, slash, version = api_version.rpartition("/")
    if slash and not _DNS_SUBDOMAIN.match(group):
        return None
    if not _VERSION.match(version):
        return None
    return group, version


class KubeFacts:
    """``Facts`` answered by the API server of ``conn`` (with the controller's credentials), cached briefly."""

    def __init__(self, conn: kube.Connection, *, timeout: float = REQUEST_TIMEOUT, sar_ttl: float = SAR_TTL,
                 object_ttl: float = OBJECT_TTL, discovery_ttl: float = DISCOVERY_TTL,
                 discovery_retry: float = DISCOVERY_RETRY, clock: Callable[[], float] = time.monotonic,
                 access_reviews: SourceBuckets | None = None, refusals: CallerRefusals | None = None) -> None:
        self._conn = conn
        self._access_reviews = access_reviews
        self._refusals = refusals
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._sar: cachetools.TTLCache[Hashable, Decision] = cachetools.TTLCache(
            SAR_CACHE_SIZE, sar_ttl, timer=clock)
        self._discovery: cachetools.TTLCache[str, dict[str, Resource]] = cachetools.TTLCache(
            DISCOVERY_CACHE_SIZE, discovery_ttl, timer=clock)
        # When each group-version was last fetched, to refetch on a miss at most once per discovery_retry.
        self._fetched: cachetools.TTLCache[str, float] = cachetools.TTLCache(
            DISCOVERY_CACHE_SIZE, max(discovery_retry, 0.001), timer=clock)
        self._objects: cachetools.TTLCache[Hashable, Any] = cachetools.TTLCache(
            OBJECT_CACHE_SIZE, object_ttl, timer=clock)
        self.requests = 0
        """Requests sent so far (for tests and the bench: what the caches save)."""

    # -- plumbing -------------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, what: str, body: Any = None,
                 query: kube.Query | None = None) -> dict[str, Any] | None:
        """The answer, None for 404; ``FactUnavailable`` naming ``what`` for anything else."""
        if only_at_hand():
            raise WouldAsk(what)
        with self._lock:
            self.requests += 1
        try:
            return kube.request_json_once(self._conn, method, path, query=query, body=body, timeout=self._timeout)
        except ApiError as err:
            if err.status == 404:
                return None
            raise FactUnavailable(f"could not check {what}: {_cause(err)}") from err

    def _cached(self, cache: cachetools.TTLCache[Hashable, Any], key: Hashable, load: Callable[[], _T]) -> _T:
        with self._lock:
            found = cache.get(key, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[no-any-return]
        value = load()  # outside the lock: one slow answer must not hold up every other request
        with self._lock:
            cache[key] = value
        return value

    # -- discovery ------------------------------------------------------------------------------------------------

    def resource_for(self, api_version: str, kind: str) -> Resource | None:
        parsed = split_api_version(api_version)
        if parsed is None or not kind:
            return None
        with self._lock:
            kinds = self._discovery.get(api_version)
            recent = api_version in self._fetched
        if kinds is not None and (kind in kinds or recent):
            return kinds.get(kind)
        if kinds is None or not recent:
            kinds = self._fetch_group_version(api_version, *parsed)
        return kinds.get(kind)

    def _fetch_group_version(self, api_version: str, group: str, version: str) -> dict[str, Resource]:
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        body = self._request("GET", path, f"which kinds {api_version} serves")
        kinds: dict[str, Resource] = {}
        for entry in (body or {}).get("resources") or []:
            if not isinstance(entry, Mapping):
                continue
            name, entry_kind = entry.get("name"), entry.get("kind")
            if isinstance(name, str) and isinstance(entry_kind, str) and "/" not in name:  # not a subresource
                kinds[entry_kind] = Resource(group, version, name, entry_kind, bool(entry.get("namespaced")))
        with self._lock:
            self._discovery[api_version] = kinds
            self._fetched[api_version] = self._clock()
        return kinds

    # -- authorization --------------------------------------------------------------------------------------------

    def may(self, user: UserInfo, verb: str, resource: Resource, namespace: str, name: str = "") -> Decision:
        key = (user, verb, resource.group, resource.resource, namespace, name)
        return self._cached(self._sar, key, lambda: self._review(user, verb, resource, namespace, name))

    def _review(self, user: UserInfo, verb: str, resource: Resource, namespace: str, name: str) -> Decision:
        attributes = {"verb": verb, "group": resource.group, "version": resource.version,
                      "resource": resource.resource, "namespace": namespace}
        if name:
            attributes["name"] = name
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {**user.as_json(), "resourceAttributes": attributes}}
        what = f"whether {user.username!r} may {verb} {_plural(resource)}"
        if only_at_hand():
            raise WouldAsk(what)  # before a token of the access review bound is taken for it
        if self._access_reviews is not None:
            source = current_source() or "an unknown source"
            refused = self._access_reviews.take(source)
            if refused is not None:
                if self._refusals is not None:
                    self._refusals.count("webhook", f"access_reviews_{refused}")
                if refused == "source":
                    raise FactUnavailable(f"could not check {what}: too many access reviews from {source}; retry")
                if refused == "api_server_total":
                    raise FactUnavailable(f"could not check {what}: too many access reviews from the API server's "
                                          f"addresses at once (this one from {source}); retry")
                raise FactUnavailable(f"could not check {what}: too many access reviews from all sources at once "
                                      f"(this one from {source}); retry")
        answer = self._request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", what, body)
        status = (answer or {}).get("status")
        if not isinstance(status, Mapping) or not isinstance(status.get("allowed"), bool):
            raise FactUnavailable(f"could not check {what}: the SubjectAccessReview came back without a status")
        if status["allowed"]:
            return Decision(True)
        reason = str(status.get("reason") or "")
        error = str(status.get("evaluationError") or "")
        if error and not status.get("denied"):
            # No authorizer said yes, and one of them failed: that is "could not tell", not "no".
            reason = f"{reason}; {error}" if reason else error
        return Decision(False, reason[:300])

    # -- objects --------------------------------------------------------------------------------------------------

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        if not is_dns_label(name):
            return None
        return self._cached(self._objects, ("namespace", name),
                            lambda: self._request("GET", f"/api/v1/namespaces/{name}", f"namespace {name}"))

    def priority_class(self, name: str) -> int | None:
        if not _DNS_SUBDOMAIN.match(name):
            return None

        def load() -> int | None:
            found = self._request("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}",
                                  f"PriorityClass {name}")
            if found is None:
                return None
            value = found.get("value")
            if isinstance(value, bool) or not isinstance(value, int):
                raise FactUnavailable(f"could not check PriorityClass {name}: it has no integer value")
            return value

        return self._cached(self._objects, ("priorityclass", name), load)

def _plural(resource: Resource) -> str:
    return f"{resource.resource}.{resource.group}" if resource.group else resource.resource


def _cause(err: ApiError) -> str:
    if err.status == 0:
        return f"the API server did not answer ({err.message})"
    return f"the API server answered {err.status} {err.reason}: {err.message[:300]}"


def own_username(conn: kube.Connection, timeout: float = 10.0) -> str:
    """The username the API server knows this connection's credentials by (a SelfSubjectReview, which every
    authenticated user may create): the identity whose AppWrapper status writes admission lets through.
    ``FactUnavailable`` when it cannot be had."""
    try:
        review = kube.request_json(conn, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                   body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                                   timeout=timeout)
    except ApiError as err:
        raise FactUnavailable(f"could not learn the controller's own identity (SelfSubjectReview): {_cause(err)}") \
            from None
    username = ((review.get("status") or {}).get("userInfo") or {}).get("username")
    if not isinstance(username, str) or not username:
        raise FactUnavailable("could not learn the controller's own identity: the SelfSubjectReview names no user")
    return username
