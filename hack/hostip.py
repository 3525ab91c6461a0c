#!/usr/bin/env python3
"""Print an IPv4 address of this machine that is not loopback or link-local, or nothing when there is none.

The API server's proxy (through which mcadctl and the dashboard tests reach a controller running on this machine)
refuses loopback and link-local addresses, so the demo's controller and the e2e dashboard controllers listen on this
one. Found by the route to a documentation address: connect() on a UDP socket sends nothing. Used by
hack/demo-endpoint.sh and test/e2e/dashboard.py.
"""

from __future__ import annotations

import contextlib
import socket


def host_ip() -> str:
    """The address, or "" when this machine has only loopback and link-local ones."""
    candidates = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("198.51.100.1", 9))
        candidates.append(str(probe.getsockname()[0]))
    with contextlib.suppress(OSError):
        candidates.append(socket.gethostbyname(socket.gethostname()))
    return next((a for a in candidates if not a.startswith(("127.", "169.254.", "0."))), "")


if __name__ == "__main__":
    print(host_ip())
