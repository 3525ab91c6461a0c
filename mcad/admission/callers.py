"""Who may call the webhooks, and what an unauthenticated caller can cost.

Contract:
- ``CallerCheck`` is the webhook server's ``caller_check(headers, peer_certificate_der, peer_ip)``: None allows the
  request, a reason refuses it (the server answers 401 before reading the body, so a refused caller costs neither
  a parse nor a review). It authenticates the API server as the webhook's client in the two ways the API server's
  admission configuration (``AdmissionConfiguration`` -> ``WebhookAdmission.kubeConfigFile``, the user entry named
  after the webhook's host) can send credentials:
  * a client certificate: the TLS context requests one (``client_tls_context``: CERT_OPTIONAL with the CA bundle),
    so OpenSSL has verified any certificate presented against that bundle by the time the request is read; the
    check requires one and, when ``names`` is not empty, that its subject CN or one of its DNS/URI SANs is among
    them (a CA that signs other clients too, such as a cluster CA, then admits only the API server's name);
  * a bearer token (``Authorization: Bearer``) equal to the one in a ``WatchedFile`` (constant-time comparison).
  With both configured, either one suffices (an admin may move from one to the other without an outage).
  Refusals are counted (``CallerRefusals``) and logged at most once per source per ``LOG_INTERVAL`` and at most
  ``LOG_LINES`` lines per interval in all (a flood cannot flood the log).
- ``WatchedFile`` reads the shared token (or the client CA bundle) from a file (a mounted Secret) and re-reads it
  when the file changes (inode, size or mtime; checked at most once per ``recheck`` seconds), as the serving
  certificate reloads. An empty or unreadable token file holds no token: every bearer is refused until it holds
  one.
- ``TokenBucket`` and ``SourceBuckets`` bound a rate: a bucket of ``burst`` tokens refilled at ``rate`` per second
  by the clock it is handed. ``SourceBuckets`` keeps one bucket per source (the peer's IP), at most
  ``max_sources`` (least recently used forgotten), and a shared bucket over all sources: a request takes from
  both or from neither. Sources in ``api_servers`` (the admin's ``--api-server-cidrs``) take instead from a total
  bucket of their own, of the same size, which no other source can spend: forged reviews from anywhere else
  cannot use up what the API server's own reviews need. Admission's SubjectAccessReviews
  (``mcad.admission.kubefacts``) and the metrics endpoint's TokenReviews of unknown tokens
  (``mcad.serve.endpointauth``) are bounded with them.
- ``SourceNetworks`` holds those CIDRs; ``in`` tells whether a peer address (IPv4, IPv6, IPv4-mapped IPv6) is in
  one of them (an address that does not parse is not).
- ``RefusalSummary`` bounds the log lines of refused reviews from callers not known to be the API server (anyone
  can send a forged review that is refused; each refusal must not be a line): per source and per ``interval`` of
  the clock it is handed, the first refusal is logged in full and the rest are counted, then logged as one line
  ("refused N reviews from A in the last S s: <first reason among them>") once the interval is over (at the next
  ``note`` or ``flush``, whichever comes first; the webhook server flushes every fraction of a second). A source
  that keeps being refused gets one counted line per interval. At most ``max_sources`` sources are tracked at
  once; refusals from others are counted together and logged as one line per interval.
- ``CallerRefusals`` counts refusals by (endpoint, reason) for ``/metrics`` (``mcad_caller_refusals_total``).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import ssl
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog
from cryptography import x509
from cryptography.x509.oid import NameOID

log = structlog.get_logger("mcad.admission.callers")

# Refusal logging: once per source per interval, and at most this many lines per interval in all.
LOG_INTERVAL = 60.0
LOG_LINES = 20
LOG_SOURCES = 1024
# Refused reviews: sources summarized at once (beyond them, refusals are counted under one line), and the interval.
SUMMARY_SOURCES = 64
SUMMARY_INTERVAL = 60.0
# How often the token file is checked for a change (a stat, not a read).
TOKEN_RECHECK_SECONDS = 1.0
# Admission's SubjectAccessReviews. The API server is one source for every legitimate review, and admission caches
# each answer (user, verb, resource, namespace) for 10 s: 20 a second sustained is 200 distinct (user, kind,
# namespace) triples every 10 s, the burst covers a cold start of that many. The total bounds many sources at once.
ACCESS_REVIEWS_PER_SOURCE = 20.0
ACCESS_REVIEWS_BURST = 200
ACCESS_REVIEWS_TOTAL = 50.0
MAX_SOURCES = 1024

CallerCheckFn = Callable[[Mapping[str, str], bytes | None, str], str | None]


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` a second by ``clock``; not thread-safe (its owner locks)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        if rate < 0 or burst < 1:
            raise ValueError("a token bucket needs rate >= 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def available(self) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = now
        return self._tokens

    def take(self) -> bool:
        if self.available() < 1:
            return False
        self._tokens -= 1
        return True


class SourceNetworks:
    """CIDRs (the API server's addresses as its traffic reaches the controller); ``address in networks``."""

    def __init__(self, cidrs: Iterable[str] = ()) -> None:
        """``ValueError`` naming the first entry that is not an address or a CIDR."""
        networks = []
        for cidr in cidrs:
            try:
                networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
            except ValueError:
                raise ValueError(f"{cidr!r} is not an IP address or CIDR (e.g. 10.0.0.10/32)") from None
        self.networks = tuple(networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, address: object) -> bool:
        if not self.networks or not isinstance(address, str):
            return False
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # a dual-stack socket names an IPv4 peer so
        return any(ip in network for network in self.networks)

    def __str__(self) -> str:
        return ",".join(str(n) for n in self.networks)


class SourceBuckets:
    """A bucket per source (bounded, LRU) and a shared one for all sources, or the API server's own for sources in
    ``api_servers``; ``take(source)`` says which refused, if any."""

    def __init__(self, *, per_source: float, burst: int, total: float, total_burst: int | None = None,
                 max_sources: int = MAX_SOURCES, api_servers: SourceNetworks | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_source = per_source
        self.burst = burst
        self.max_sources = max_sources
        self.api_servers = api_servers or SourceNetworks()
        self._clock = clock
        self._lock = threading.Lock()
        self._sources: OrderedDict[str, TokenBucket] = OrderedDict()
        shared_burst = max(total_burst if total_burst is not None else 2 * burst, 1)
        self.total = TokenBucket(total, shared_burst, clock)
        self.api_server_total = TokenBucket(total, shared_burst, clock)

    def take(self, source: str) -> str | None:
        """None when both buckets had a token (both are taken); else "source", "total" or "api_server_total" (none
        is taken)."""
        api_server = source in self.api_servers
        with self._lock:
            bucket = self._sources.get(source)
            if bucket is None:
                bucket = TokenBucket(self.per_source, self.burst, self._clock)
                self._sources[source] = bucket
                while len(self._sources) > self.max_sources:
                    self._sources.popitem(last=False)
            else:
                self._sources.move_to_end(source)
            if bucket.available() < 1:
                return "source"
            if api_server:
                if not self.api_server_total.take():
                    return "api_server_total"
            elif not self.total.take():
                return "total"
            bucket.take()
            return None

    def tracked(self) -> int:
        with self._lock:
            return len(self._sources)


class CallerRefusals:
    """Refusals by (endpoint, reason), read by ``/metrics``; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def count(self, endpoint: str, reason: str) -> None:
        with self._lock:
            self._counts[(endpoint, reason)] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


class RefusalLog:
    """One log line per source per ``interval``, at most ``lines`` per interval in all; the rest are counted and
    reported with the next line logged."""

    def __init__(self, *, interval: float = LOG_INTERVAL, lines: int = LOG_LINES, max_sources: int = LOG_SOURCES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last: OrderedDict[str, float] = OrderedDict()
        self._max_sources = max_sources
        self._budget = TokenBucket(lines / interval, lines, clock)
        self.suppressed = 0

    def should_log(self, source: str) -> tuple[bool, int]:
        """Whether to log a refusal from ``source`` now, and how many went unlogged before it."""
        with self._lock:
            now = self._clock()
            last = self._last.get(source)
            if (last is not None and now - last < self._interval) or not self._budget.take():
                self.suppressed += 1
                return False, 0
            self._last[source] = now
            self._last.move_to_end(source)
            while len(self._last) > self._max_sources:
                self._last.popitem(last=False)
            skipped, self.suppressed = self.suppressed, 0
            return True, skipped


@dataclass
class _Window:
    opened: float
    count: int = 0  # refusals after the first, which was logged in full
    reason: str = ""  # the first reason among them
    sources: int = 0  # for the overflow window: how many sources were over the bound


class RefusalSummary:
    """Refused reviews from one source logged once per interval with a count (see the module contract)."""

    OVERFLOW = "other sources"

    def __init__(self, *, interval: float = SUMMARY_INTERVAL, max_sources: int = SUMMARY_SOURCES,
                 clock: Callable[[], float] = time.monotonic,
                 emit: Callable[..., None] | None = None) -> None:
        self.interval = interval
        self.max_sources = max_sources
        self._clock = clock
        self._emit = emit or log.info
        self._lock = threading.Lock()
        # Every window lasts ``interval`` and is added when opened: the first one is always the first to end.
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._overflow: _Window | None = None
        self._overflow_sources: set[str] = set()

    def note(self, source: str, reason: str, **details: object) -> None:
        """A refusal of a review from ``source``: logged in full (``details``) if it is the first of its window."""
        lines: list[tuple[str, dict[str, object]]] = []
        with self._lock:
            now = self._clock()
            self._close_due(now, lines)
            window = self._windows.get(source)
            if window is not None:
                if window.count == 0:
                    window.reason = reason
                window.count += 1
            elif len(self._windows) < self.max_sources:
                self._windows[source] = _Window(now)
                lines.append(("admission refused", {**details, "source": source, "reason": reason}))
            else:
                if self._overflow is None:
                    self._overflow = _Window(now)
                    self._overflow_sources = set()
                if self._overflow.count == 0:
                    self._overflow.reason = reason
                self._overflow.count += 1
                if len(self._overflow_sources) < self.max_sources:  # a count, not a list: bounded too
                    self._overflow_sources.add(source)
                self._overflow.sources = max(self._overflow.sources, len(self._overflow_sources))
        for event, fields in lines:  # outside the lock: a slow log sink must not hold every reviewer
            self._emit(event, **fields)

    def flush(self) -> None:
        """Log the windows that have ended (the webhook server calls it periodically)."""
        lines: list[tuple[str, dict[str, object]]] = []
        with self._lock:
            self._close_due(self._clock(), lines)
        for event, fields in lines:
            self._emit(event, **fields)

    def tracked(self) -> int:
        with self._lock:
            return len(self._windows)

    def _close_due(self, now: float, lines: list[tuple[str, dict[str, object]]]) -> None:
        seconds = f"{self.interval:g}"
        while self._windows:
            source, window = next(iter(self._windows.items()))
            if now - window.opened < self.interval:
                break
            del self._windows[source]
            if window.count:
                lines.append((f"refused {window.count} reviews from {source} in the last {seconds} s: "
                              f"{window.reason}", {"source": source, "refused": window.count}))
                # Still refused: the next window's first refusal is counted too, not logged in full again. It opens
                # now (not where the last one ended), so the windows stay in the order they end.
                self._windows[source] = _Window(now)
        overflow = self._overflow
        if overflow is not None and now - overflow.opened >= self.interval:
            self._overflow = None
            lines.append((f"refused {overflow.count} reviews from {overflow.sources}"
                          f"{'+' if overflow.sources >= self.max_sources else ''} {self.OVERFLOW} in the last "
                          f"{seconds} s (over the {self.max_sources} sources tracked at once): {overflow.reason}",
                          {"source": self.OVERFLOW, "refused": overflow.count}))


class WatchedFile:
    """The content of ``path`` (stripped), re-read when the file changes (see the module contract): the shared
    token, or the client CA bundle."""

    def __init__(self, path: str, *, what: str = "webhook client token", recheck: float = TOKEN_RECHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.what = what
        self._recheck = recheck
        self._clock = clock
        self._lock = threading.Lock()
        self._checked: float | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._content: bytes | None = None
        self._failing = False

    def current(self) -> bytes | None:
        with self._lock:
            now = self._clock()
            if self._checked is not None and now - self._checked < self._recheck:
                return self._content
            self._checked = now
            try:
                st = os.stat(self.path)  # follows the symlinks a mounted Secret swaps on update
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
                if stamp != self._stamp:
                    content = self.path.read_bytes().strip()
                    self._content = content or None
                    self._stamp = stamp
                    self._failing = False
                    log.info(f"{self.what} loaded" if content else f"{self.what} file is empty", path=str(self.path))
            except OSError as err:
                if not self._failing:  # said once per failure, not at every check
                    log.warning(f"{self.what} unreadable", path=str(self.path), reason=type(err).__name__)
                self._failing = True
                self._content, self._stamp = None, None
            return self._content


def client_tls_context(context: ssl.SSLContext, ca_bundle: bytes) -> ssl.SSLContext:
    """``context`` made to request a client certificate, verified against ``ca_bundle`` when presented (a handshake
    with an unverifiable one fails); a client without one still connects, and ``CallerCheck`` refuses it."""
    context.verify_mode = ssl.CERT_OPTIONAL
    context.load_verify_locations(cadata=ca_bundle.decode("ascii"))
    return context


def certificate_names(der: bytes) -> set[str]:
    """The subject CNs and DNS/URI SANs of a DER certificate (empty when it does not parse)."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return set()
    names = {str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return names
    names.update(sans.get_values_for_type(x509.DNSName))
    names.update(sans.get_values_for_type(x509.UniformResourceIdentifier))
    return names


class CallerCheck:
    """The webhook's ``caller_check`` (see the module contract)."""

    def __init__(self, *, client_certificate: bool = False, names: Collection[str] = (),
                 token: WatchedFile | None = None, refusals: CallerRefusals | None = None,
                 refusal_log: RefusalLog | None = None) -> None:
        if not client_certificate and token is None:
            raise ValueError("a CallerCheck needs a client certificate, a token, or both")
        self.client_certificate = client_certificate
        self.names = frozenset(names)
        self.token = token
        self.refusals = refusals or CallerRefusals()
        self._log = refusal_log or RefusalLog()

    def __call__(self, headers: Mapping[str, str], peer_certificate: bytes | None, peer: str) -> str | None:
        reasons: list[str] = []
        if self.client_certificate:
            reason = self._certificate_problem(peer_certificate)
            if reason is None:
                return None
            reasons.append(reason)
        if self.token is not None:
            reason = self._token_problem(headers)
            if reason is None:
                return None
            reasons.append(reason)
        reason = "; ".join(reasons)
        self.refusals.count("webhook", "unauthenticated")
        logged, skipped = self._log.should_log(peer)
        if logged:
            log.warning("webhook caller refused", source=peer, reason=reason, unlogged_before=skipped)
        return reason

    def _certificate_problem(self, der: bytes | None) -> str | None:
        if not der:
            return "no verified client certificate"
        if not self.names:
            return None
        found = certificate_names(der)
        if found & self.names:
            return None
        shown = ", ".join(sorted(found)[:3]) or "none"
        return f"the client certificate names {shown}, not an allowed webhook client"

    def _token_problem(self, headers: Mapping[str, str]) -> str | None:
        value = headers.get("Authorization") or ""
        scheme, _, presented = str(value).strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return "no bearer token"
        expected = self.token.current() if self.token is not None else None
        if expected is None:
            return "no webhook client token is configured (the token file is empty or unreadable)"
        if hmac.compare_digest(presented.strip().encode(), expected):
            return None
        return "the bearer token is not the webhook client token"
