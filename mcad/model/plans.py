"""Plans and pins: room on a node promised to a dispatched AppWrapper's pods that are not bound yet. Pure.

Contract (``--fit=nodes``; pins with ``--placement=binding``, ``mcad.loop.pinning``):
- A plan (``Plan``, entries ``(node, requests, count)``) says: so many pods of these requests go on that node.
  ``Plans`` holds each dispatched AppWrapper's plan and the room planned per node, and the index of pinned pods.
  The ``Accountant`` (``mcad.model.accounting``) owns the one ``Plans`` and tells it of pods (``pod_bound``,
  ``unpin`` for a pod gone) and of AppWrappers that stop holding room (``drop``); the loop's owners read and pin
  through ``Accountant.plans``. Nothing else keeps plans or pins.
- ``plan(key, plan)`` replaces its plan; ``drop(key)`` forgets it and its pins.
- A plan entry goes down by one when one of the AppWrapper's pods binds (or ends without binding): ``pod_bound``.
  A pinned pod that binds takes its own slot; a pod that binds unpinned takes a slot nobody is pinned to (of its
  shape on its node, else of its shape, else any: custompodresources may differ from the pods). So the room planned
  per node (``planned_by_node``) is kept up to date pod by pod and a snapshot costs O(nodes), not O(plans).
- Pins: ``pin`` gives a gated pod a slot of its AppWrapper's plan (an entry with pods planned and not yet pinned, of
  the pod's requests, or the smallest that holds them when the plan has none of that shape, on a node ``eligible``
  accepts); ``drop_open_slot`` takes a slot out for a pod that fits none; ``pin_extra`` adds a slot of one for a
  pod beyond the plan, placed by the caller (``Accountant.beyond_demand`` says whether the AppWrapper's demand
  leaves room for it); ``unpin`` hands a slot back (the pod went away unbound) or, with ``drop_slot``, takes it out
  of the plan (its node refused the pod). A slot made for one pod beyond the plan is never handed back: it goes
  with its pod, bound or gone, so room is never promised to a pod that does not exist.
- Reads: ``key in plans`` (it has a plan with a slot left), ``unbound(key)`` (its entries with pods not bound yet),
  ``planned_nodes(key)``, ``planned_on(nodes)`` (who holds planned room there), ``planned_by_node()``, ``pins()``,
  ``pinned_node(uid)``, ``pinned_by_node()``.
- Pure: no I/O, no threads; the dispatcher thread owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from mcad.api.resources import ZERO, ResourceVector

# What a plan says: so many pods of these requests go on that node.
PlanEntry = tuple[str, ResourceVector, int]
Plan = tuple[PlanEntry, ...]


@dataclass(slots=True)
class _Planned:
    """Pods of one shape planned on one node and not bound yet (``count`` goes down as they bind)."""

    node: str
    requests: ResourceVector
    count: int
    pinned: int = 0  # of ``count``: pods pinned to this node and not bound yet
    # A slot of one made for one pod beyond the plan (``pin_extra``): it goes with that pod, bound or gone.
    extra: bool = False

    @property
    def open(self) -> int:
        """Slots no pod is pinned to yet."""
        return self.count - self.pinned


class Plans:
    def __init__(self) -> None:
        # Where each dispatched AppWrapper's pods were planned to go, and their sum per node.
        self._plans: dict[str, list[_Planned]] = {}
        self._planned: dict[str, ResourceVector] = {}
        # --placement=binding: pod uid -> (its AppWrapper, the plan entry it is pinned to), until it binds or goes.
        self._pins: dict[str, tuple[str, _Planned]] = {}
        self._pins_by_appwrapper: dict[str, set[str]] = {}

    # -- plans ----------------------------------------------------------------------------------------------------

    def plan(self, key: str, plan: Iterable[PlanEntry]) -> None:
        """Its pods not bound yet go on these nodes (replacing any plan it had)."""
        self.drop(key)
        entries = [_Planned(node, requests, count) for node, requests, count in plan if count > 0]
        if not entries:
            return
        self._plans[key] = entries
        for entry in entries:
            self._planned[entry.node] = self._planned.get(entry.node, ZERO) + entry.requests.scale(entry.count)

    def drop(self, key: str) -> None:
        """It holds no planned room any more, and none of its pods a pin."""
        for entry in self._plans.pop(key, []):
            self._unplan(entry.node, entry.requests.scale(entry.count))
        for uid in self._pins_by_appwrapper.pop(key, ()):
            self._pins.pop(uid, None)

    def __contains__(self, key: object) -> bool:
        return key in self._plans

    def unbound(self, key: str) -> list[PlanEntry]:
        """(node, requests, pods not bound yet) of its plan."""
        return [(e.node, e.requests, e.count) for e in self._plans.get(key, ()) if e.count > 0]

    def planned_nodes(self, key: str) -> list[tuple[str, int]]:
        """(node, pods not bound yet) of its plan."""
        return [(e.node, e.count) for e in self._plans.get(key, []) if e.count > 0]

    def planned_on(self, nodes: Collection[str] | None) -> set[str]:
        """The AppWrappers with pods planned on these nodes (None: anywhere) and not bound yet."""
        return {key for key, plan in self._plans.items()
                if any(e.count > 0 and (nodes is None or e.node in nodes) for e in plan)}

    def planned_by_node(self) -> dict[str, ResourceVector]:
        """Room held per node for dispatched pods that are not bound yet."""
        return dict(self._planned)

    def pod_bound(self, key: str, uid: str, node: str, requests: ResourceVector) -> None:
        """One pod of ``key`` is bound to ``node`` (or done, unbound: ``node`` is ""): one planned pod fewer. A pinned
        pod takes its own slot; any other one of its shape on its node if the plan has one open there, else of its
        shape anywhere, else any (custompodresources may differ from the pods)."""
        pinned = self._pins.pop(uid, None)
        if pinned is not None:
            self._release_pin_index(key, uid)
            entry_pinned = pinned[1]
            entry_pinned.pinned -= 1
            if entry_pinned.count > 0:
                self._take_slot(key, entry_pinned)
            return
        live = [e for e in self._plans.get(key, []) if e.open > 0]
        entry = (next((e for e in live if e.node == node and e.requests == requests), None)
                 or next((e for e in live if e.requests == requests), None)
                 or (live[0] if live else None))
        if entry is None:
            return
        self._take_slot(key, entry)

    # -- pins (--placement=binding) -------------------------------------------------------------------------------

    def pin(self, key: str, uid: str, requests: ResourceVector, eligible: Callable[[str], bool]) -> str | None:
        """Pin a gated pod of ``key`` to an open slot of its plan on a node ``eligible`` accepts: one of exactly its
        requests; or, when the plan has no slot of its requests at all (custompodresources declared other amounts
        than the pods ask), the smallest that holds them. Returns the node, None when no slot fits (the pod is
        beyond the plan)."""
        if uid in self._pins:
            return self._pins[uid][1].node
        plan = self._plans.get(key, ())
        planned_shape = any(entry.requests == requests for entry in plan)
        roomy: _Planned | None = None
        for entry in plan:
            if entry.open <= 0 or not eligible(entry.node):
                continue
            if entry.requests == requests:
                roomy = entry
                break
            if not planned_shape and requests.fits_in(entry.requests) and (
                    roomy is None or _slot_size(entry.requests) < _slot_size(roomy.requests)):
                roomy = entry
        if roomy is None:
            return None
        self._hold_pin(key, uid, roomy)
        return roomy.node

    def pin_extra(self, key: str, uid: str, node: str, requests: ResourceVector) -> None:
        """A pod of ``key`` beyond its plan, placed on ``node`` by the caller: a slot of its own, so its room is
        promised until it binds or goes."""
        entry = _Planned(node, requests, 1, extra=True)
        self._plans.setdefault(key, []).append(entry)
        self._planned[node] = self._planned.get(node, ZERO) + requests
        self._hold_pin(key, uid, entry)

    def drop_open_slot(self, key: str, unusable: Callable[[str], bool]) -> str | None:
        """Take one open slot out of ``key``'s plan, for a pod of it that fits none (it is placed on its own): one
        on a node ``unusable`` rejects (gone or cordoned since the plan) if there is one, else the last (the plan
        lists the largest pods first). Each pod so accounts for one slot, so a plan whose pods ask other amounts
        than it planned (custompodresources) does not hold room for ever. Returns its node, None if none was
        open."""
        open_slots = [entry for entry in self._plans.get(key, ()) if entry.open > 0]
        if not open_slots:
            return None
        entry = next((e for e in open_slots if unusable(e.node)), open_slots[-1])
        self._take_slot(key, entry)
        return entry.node

    def unpin(self, uid: str, *, drop_slot: bool = False) -> str | None:
        """The pod holds its slot no more: handed back (it went away unbound), or with ``drop_slot`` taken out of
        the plan (its node refused it; a new pod is placed afresh). Returns the node it was pinned to."""
        found = self._pins.pop(uid, None)
        if found is None:
            return None
        key, entry = found
        self._release_pin_index(key, uid)
        entry.pinned -= 1
        if drop_slot or entry.extra:
            self._take_slot(key, entry)
        return entry.node

    def pinned_node(self, uid: str) -> str | None:
        found = self._pins.get(uid)
        return found[1].node if found is not None else None

    def pins(self) -> dict[str, tuple[str, str]]:
        """uid -> (AppWrapper, node) of every pod pinned and not bound yet."""
        return {uid: (key, entry.node) for uid, (key, entry) in self._pins.items()}

    def pinned_by_node(self) -> dict[str, int]:
        """Per node: pods pinned there and not bound yet."""
        counts: dict[str, int] = {}
        for _, entry in self._pins.values():
            counts[entry.node] = counts.get(entry.node, 0) + 1
        return counts

    # -- bookkeeping ----------------------------------------------------------------------------------------------

    def _hold_pin(self, key: str, uid: str, entry: _Planned) -> None:
        entry.pinned += 1
        self._pins[uid] = (key, entry)
        self._pins_by_appwrapper.setdefault(key, set()).add(uid)

    def _release_pin_index(self, key: str, uid: str) -> None:
        uids = self._pins_by_appwrapper.get(key)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._pins_by_appwrapper[key]

    def _take_slot(self, key: str, entry: _Planned) -> None:
        entry.count -= 1
        self._unplan(entry.node, entry.requests)
        plan = self._plans.get(key)
        if plan is not None and all(e.count <= 0 for e in plan):
            del self._plans[key]

    def _unplan(self, node: str, amount: ResourceVector) -> None:
        left = self._planned.get(node, ZERO) - amount
        if left:
            self._planned[node] = left
        else:
            self._planned.pop(node, None)


def _slot_size(requests: ResourceVector) -> tuple[int, int, int, int]:
    """Which of two slots is smaller, GPUs first (as ``mcad.model.placement`` orders pods)."""
    return requests["nvidia.com/gpu"], requests["cpu"], requests["memory"], sum(requests.values())
