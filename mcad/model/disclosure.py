"""What a message about one AppWrapper may say about others: nothing that names another namespace's. Pure.

Contract:
- An AppWrapper's status (message, conditions) and its Events are read by whoever may read the AppWrapper: its
  namespace's tenants. Messages written there name another AppWrapper (a reservation's holder, a preemptor, its
  victims, a reclaimer) only when it is in the reader's namespace. One in another namespace is "an AppWrapper in
  another namespace", and what it holds is not said either: not its nodes, its amount or its pods. Its priority
  may be said (a victim learns why it was chosen; priorities are a cluster policy, not a tenant's secret).
- Node names alone are not withheld: a tenant sees the nodes of its own pods (``spec.nodeName``, the scheduler's
  pendingpodconditions). Only nodes that another namespace's AppWrapper holds are left out.
- A queued AppWrapper judged as one ahead of it that asks for the same (a group of alike AppWrappers, judged once)
  is told that one's reason only when it is in the reader's namespace (the reason names its pods' objects); else
  ``judged_alike()``.
- The same words reach /debug/explain and /debug/queue's "why" (they are built by the same code), so a tenant
  reading its own explain learns no more than its status says. Cluster-wide views keep full names: /debug/queue's
  reservations list (shown per namespace the caller may list), /debug/ledger, mcadctl with cluster-wide rights,
  and the controller's log.
- Keys are ``namespace/name``; ``reader`` is the namespace of the AppWrapper the message is written to.
"""

from __future__ import annotations

from collections.abc import Iterable

ANOTHER = "an AppWrapper in another namespace"


def namespace_of(key: str) -> str:
    return key.partition("/")[0]


def same_namespace(key: str, reader: str) -> bool:
    return namespace_of(key) == reader


def named(key: str, reader: str) -> str:
    """``key`` when the reader's namespace holds it, else ``ANOTHER``."""
    return key if same_namespace(key, reader) else ANOTHER


def listed(keys: Iterable[str], reader: str, *, noun: str = "AppWrapper") -> str:
    """The reader's own keys by name, sorted, then how many others there are: "ns/a, ns/b and 2 AppWrappers in
    other namespaces", "an AppWrapper in another namespace". Never empty for a non-empty ``keys``."""
    own, others = [], 0
    for key in sorted(set(keys)):
        if same_namespace(key, reader):
            own.append(key)
        else:
            others += 1
    parts = list(own)
    if others == 1:
        parts.append(f"{'an' if noun[0] in 'AEIOUaeiou' else 'a'} {noun} in another namespace")
    elif others > 1:
        parts.append(f"{others} {noun}s in other namespaces")
    if len(parts) <= 1:
        return "".join(parts)
    return f"{', '.join(parts[:-1])} and {parts[-1]}" if others else ", ".join(parts)


def judged_alike() -> str:
    """What a queued AppWrapper is told when it is judged as one ahead of it in another namespace that asks for the
    same (whose own words name its wrapped objects)."""
    return f"it cannot be dispatched now: {ANOTHER} ahead of it, which asks for the same, does not fit"


def held_behind_preemptor(key: str, reader: str) -> str:
    """What those behind a preemptor that holds the queue are told."""
    return f"held behind {named(key, reader)}, which is preempting lower-priority AppWrappers to make room"
