"""The error types that deciding code catches when talking to an API server, apart from the client that raises them.

Contract: ``mcad.k8s.kube`` (the only module that imports the Kubernetes client) raises these; everything else catches
them from here, so model and deciding code can name a failure without importing the client, its threads or its
connection pool. The module imports nothing beyond the standard library, and the ``kube`` names
(``kube.ApiError`` and the rest) stay valid as re-exports.
"""

from __future__ import annotations

from typing import Any

# The reason of an ApiError (status 0) whose request went out and got no answer within its timeout, as opposed to
# one that could not be sent (refused, reset, unreachable): mcad.model.retry gives up on a request that keeps timing
# out.
# The one-shot probes (kube.request_once, request_json_once) also give it to a connect that timed out; nothing
# retries those through mcad.model.retry.
TIMED_OUT = "Timeout"


class KubeConnectError(Exception):
    """The API server could not be configured or reached."""


class ApiError(Exception):
    """A request failed. ``status`` is the HTTP code, or 0 when no response came (connection, timeout)."""

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"no response: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body

    @property
    def transient(self) -> bool:
        """Worth retrying with backoff: throttled, server-side trouble, or no answer at all."""
        return self.status in (0, 429, 500, 502, 503, 504)


class GoneError(ApiError):
    """410 Gone: the resourceVersion asked for is too old; a watcher must relist."""


def error_from_status(status: dict[str, Any], http_status: int = 0, http_reason: str = "") -> ApiError:
    """Turn a ``Status`` object (an error response body, or the object of an in-stream watch ERROR event) into
    ``GoneError`` for 410 and ``ApiError`` otherwise."""
    raw_code = status.get("code")
    code = raw_code if isinstance(raw_code, int) and raw_code else http_status
    reason = str(status.get("reason") or http_reason or "")
    message = str(status.get("message") or http_reason or "no message")
    cls = GoneError if code == 410 else ApiError
    return cls(code, reason, message, status)
