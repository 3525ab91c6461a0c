"""Strict FIFO per quota node (``--strict-fifo``): which queued AppWrappers an earlier one that cannot dispatch holds.

The rule (one ``StrictFifo`` per dispatch cycle, or per dry run in ``mcad.model.assess``; the candidates are shown to
it in
dispatch order):
- An AppWrapper's FIFO domain is where it is charged: its quota node in each quota tree that charges it (its
  leaf, normally: ``quota.Forest.charges``), or, where no tree charges it, its namespace.
- A candidate that cannot dispatch, and that could run at all (``fit.could_ever_fit``: one whose quota labels name
  no node, that asks more than its quota or the cluster could ever give, or that is held, holds nothing, else it
  would hold its domain for ever), holds back every later AppWrapper of its own domain: order within a quota node
  is strict. What else it holds depends on what blocks it:
  * its quota, at node N of tree T (``fit.Fit.quota_at``): also every later AppWrapper charged at N or below N in
    T. When N is its own leaf that is just its domain: a tenant over its own quota holds nobody else. When N is a
    parent (a hard node, or the root, shared with sibling tenants), they would take exactly what it waits for,
    so they wait too; other trees' and other subtrees' work goes on.
  * a quota reclaim under way that it would borrow from: its domain only (the reclaimer holds the rest).
  * anything else, cluster capacity above all (or --fit=nodes placement, or a hub worker's room): the whole
    cluster, as without domains: the pass stops. Capacity is shared by every domain; a head that waits for it
    while later AppWrappers of other domains take it could wait for ever, and strict FIFO would mean nothing.
- Kueue, for comparison: StrictFIFO orders each ClusterQueue alone, its head blocks only that ClusterQueue, and
  other ClusterQueues of its cohort go on borrowing the cohort's unused quota. A quota leaf here plays the part
  of a ClusterQueue; Kueue has no cluster capacity apart from quota, which is why capacity holds everything here,
  and a shared parent node is held for the head where Kueue would let the cohort go on (hard limits here have no
  preemption to get the room back, so the head could starve).
Pure: no I/O; the caller walks the queue.
"""

from __future__ import annotations

from mcad.api.appwrapper import AppWrapperView
from mcad.model.fit import Fit
from mcad.model.quota import Forest

# What the AppWrappers behind a blocked head say: those held by the whole cluster, and those held back by their quota
# node (or namespace). Neither names the head, so a new head does not mean rewriting the status of every AppWrapper
# behind it.
BEHIND_STRICT_FIFO = "waiting behind earlier AppWrappers (strict FIFO)"
BEHIND_IN_DOMAIN = "waiting behind earlier AppWrappers of its quota node or namespace (strict FIFO)"


class StrictFifo:
    def __init__(self, forest: Forest | None) -> None:
        self._forest = forest
        self._held_nodes: set[tuple[str, str]] = set()  # (tree, node): it and everything below it
        self._held_namespaces: set[str] = set()

    def _charges(self, aw: AppWrapperView) -> tuple[tuple[str, str], ...]:
        if self._forest is None:
            return ()
        return self._forest.charges(aw.labels)[0]

    def held(self, aw: AppWrapperView) -> bool:
        """Whether an earlier AppWrapper that cannot dispatch holds ``aw`` back."""
        charges = self._charges(aw)
        if not charges:
            return aw.namespace in self._held_namespaces
        assert self._forest is not None
        for tree_name, node in charges:
            if any((tree_name, name) in self._held_nodes for name in self._forest.trees[tree_name].path(node)):
                return True
        return False

    def by_quota(self, aw: AppWrapperView) -> bool:
        """Whether its domain is its quota nodes (then its pending group, which shares its quota nodes, is its
        domain too; else the domain is its namespace, which a group may cross)."""
        return bool(self._charges(aw))

    def hold(self, aw: AppWrapperView, fit: Fit) -> bool:
        """``aw`` cannot dispatch (and could run at all): hold what it waits for. True when that is the whole
        cluster (the pass stops)."""
        if fit.quota_at is None and "reclaim" not in fit.about:
            return True
        charges = self._charges(aw)
        if charges:
            self._held_nodes.update(charges)
        else:
            self._held_namespaces.add(aw.namespace)
        if fit.quota_at is not None:
            self._held_nodes.add(fit.quota_at)
        return False
