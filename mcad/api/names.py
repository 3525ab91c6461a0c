"""Kubernetes name syntax that several inputs are checked against before a name goes into a request or a URL.

Contract: ``is_dns_label(name)`` is true when ``name`` is an RFC 1123 label as Kubernetes names a Namespace (and a
worker cluster in the hub's config): lower-case alphanumerics and '-', starting and ending alphanumeric, at most
63 characters. The whole string must match (a trailing newline does not pass). Pure.
"""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def is_dns_label(name: str) -> bool:
    return _DNS_LABEL.fullmatch(name) is not None
