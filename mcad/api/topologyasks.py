"""What an AppWrapper asks of the network topology: the annotations that name node label keys (levels).

Contract:
- ``TOPOLOGY_REQUIRED`` on the AppWrapper: every one of its pods on nodes sharing one value of that node label (one
  domain: a rack, a block, a zone). ``TOPOLOGY_PREFERRED``: as few domains as possible, starting at that level
  (``mcad.model.topology`` falls back to larger levels, then to the whole cluster).
- ``PODSET_REQUIRED`` / ``PODSET_PREFERRED`` (Kueue's Topology Aware Scheduling annotations) on a pod template's
  metadata ask the same of that pod set alone, so manifests written for Kueue keep their meaning.
- ``level(value)`` is what the controller reads of such an annotation: the value stripped, or "" (no ask) when it
  is not a string or is blank; one longer than a label key can be is kept, cut just past that length, so it names
  a level no node has. The controller reads it whole, never the bounded
  annotations shown to people. A value that is not a valid label key is refused at admission
  (``label_key_error``); one that got past admission names a label no node can carry, so the gang waits, saying
  so: it never makes the controller place pods against the ask.
- ``label_key_error(value)``: why ``value`` is not a valid Kubernetes label key ("" when it is): an optional DNS
  subdomain prefix (at most 253 characters) and a slash, then a name of at most 63 characters, alphanumerics with
  '-', '_' or '.' inside.
- Pure and dependency-free: read by the API views and by admission.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Final

TOPOLOGY_REQUIRED: Final = "mcad.codeflare.dev/topology-required"
TOPOLOGY_PREFERRED: Final = "mcad.codeflare.dev/topology-preferred"
PODSET_REQUIRED: Final = "kueue.x-k8s.io/podset-required-topology"
PODSET_PREFERRED: Final = "kueue.x-k8s.io/podset-preferred-topology"
ANNOTATIONS: Final = (TOPOLOGY_REQUIRED, TOPOLOGY_PREFERRED)
PODSET_ANNOTATIONS: Final = (PODSET_REQUIRED, PODSET_PREFERRED)

_PREFIX_CHARS: Final = 253
_NAME_CHARS: Final = 63
_LONGEST: Final = _PREFIX_CHARS + 1 + _NAME_CHARS
_NAME: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def level(value: Any) -> str:
    """The level an annotation value names ("" for none; see the module docstring)."""
    if not isinstance(value, str):
        return ""
    key = value.strip()
    if len(key) > _LONGEST:
        # No node label key is this long: kept (cut just past the longest) so that the gang waits for a level no
        # node has, rather than being placed as if it asked nothing.
        return key[: _LONGEST + 1]
    return sys.intern(key) if key else ""


def label_key_error(value: str) -> str:
    """Why ``value`` is not a valid node label key, or "" when it is."""
    prefix, slash, name = value.rpartition("/")
    if not name:
        return "the name part after the last '/' is empty" if slash else "it is empty"
    if len(name) > _NAME_CHARS:
        return f"its name part is {len(name)} characters long (at most {_NAME_CHARS})"
    if not _NAME.fullmatch(name):
        return ("its name part must be letters, digits, '-', '_' or '.', beginning and ending with a letter or "
                "digit")
    if slash:
        if not prefix or len(prefix) > _PREFIX_CHARS:
            return f"its prefix must be a DNS subdomain of 1 to {_PREFIX_CHARS} characters"
        if not all(_DNS_LABEL.fullmatch(part) and len(part) <= 63 for part in prefix.split(".")):
            return "its prefix must be a DNS subdomain (lowercase letters, digits and '-', in parts joined by '.')"
    return ""
