"""Quota trees across namespaces (``QuotaSubtree``, ``quota.codeflare.dev``): who may use how much, with borrowing.

Contract:
- ``subtree_view(raw)`` parses one QuotaSubtree (never raises): its tree is the label ``tree``; each of its
  ``spec.children`` is a node whose parent is ``spec.parent`` (none: a root), with a limit (``quotas.requests``),
  ``hardLimit`` and ``disabled``, and its fair-share weight (``fairShareWeight``, ``mcad.model.fairweight``: one that
  is not a weight is an error of the tree and the node's weight is 1). ``Forest.build(views)`` assembles the trees;
  a node defined twice, a parent that does not exist, or a cycle is reported in ``Tree.errors`` and the offending
  node left out, never raised.
- Charges: an AppWrapper is charged in tree T at node N when it carries the label ``T: N`` (in a namespace the admin
  bound to a node of T, the dispatcher's view of it carries that node whatever the object says: ``mcad.model.tenancy``);
  a tree it does not name charges the tree's ``default`` node when there is one, and is ignored otherwise. Its
  labels are never changed. A label naming a node the tree does not have is an error the AppWrapper waits on
  (``Forest.charges``).
- Limits: per tree, the resources named anywhere in it are limited (0 on a node that does not name one); others are
  not. ``usage(node)`` is the demand of the AppWrappers charged to it or below it. Demand ``d`` fits at node N when
  ``usage + d <= limit`` at every hard node and at the root on the path from N up; soft nodes may exceed their own
  limit (borrow their siblings' unused quota through the parent) as long as those hold. A disabled node limits
  nothing. A node whose usage exceeds its limit is borrowing; every AppWrapper charged to it is a borrower.
- ``QuotaLedger`` keeps the charges of dispatched AppWrappers (by key, with their labels and demand) and the usage
  of every node, updated incrementally on ``charge``/``release``; ``set_forest`` re-derives every charge from the
  stored labels under new trees, so a tree added, changed or removed takes effect at once and nothing is charged
  twice or lost. Lowering a limit evicts nothing by itself: only reclaim does (``reclaim_victims``).
- ``never_fits``: a demand over the limit of a hard node or the root on its path could not be charged even with
  nothing else charged: it waits for ever, and nothing may be evicted for it.
- Reclaim: an AppWrapper that does not borrow at its own node, blocked by borrowers (in quota, or for cluster
  capacity), may take back what they borrowed: ``reclaim_victims`` picks borrowers off its path, lowest priority
  first, then most recently dispatched, only as many as needed.
- Pure: no I/O, no threads; the dispatcher thread owns the ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcad.api.raw import as_mapping
from mcad.api.resources import ResourceVector, format_amount, to_canonical
from mcad.model.fairweight import DEFAULT_WEIGHT, WEIGHT_FIELD, parse_weight

GROUP = "quota.codeflare.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "QuotaSubtree"
PLURAL = "quotasubtrees"
TREE_LABEL = "tree"
# A Namespace label binding the namespace to a node of tree <tree> (mcad.model.tenancy; the AppWrapper views the
# dispatcher reads carry the bound node as their label <tree>, so this module needs no other knowledge of it).
BINDING_PREFIX = "quota.codeflare.dev/"
DEFAULT_NODE = "default"
ZERO = ResourceVector()

Charges = tuple[tuple[str, str], ...]  # ((tree, node), ...), sorted by tree


@dataclass(frozen=True, slots=True)
class QuotaNode:
    tree: str
    name: str
    parent: str | None
    limit: ResourceVector
    hard: bool = False
    disabled: bool = False
    defined_by: str = ""  # namespace/name of the QuotaSubtree
    weight: float = DEFAULT_WEIGHT  # its fair-share weight, as a tenant (mcad.model.fairshare)


@dataclass(frozen=True, slots=True)
class SubtreeView:
    key: str
    namespace: str
    name: str
    tree: str
    parent: str | None
    nodes: tuple[QuotaNode, ...]
    errors: tuple[str, ...] = ()
    status: Mapping[str, Any] = field(default_factory=dict)
    api_version: str = API_VERSION


def subtree_view(raw: Mapping[str, Any]) -> SubtreeView:
    meta, spec = as_mapping(raw.get("metadata")), as_mapping(raw.get("spec"))
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    key = f"{namespace}/{name}"
    tree = str(as_mapping(meta.get("labels")).get(TREE_LABEL) or "")
    parent = spec.get("parent") if isinstance(spec.get("parent"), str) and spec.get("parent") else None
    errors: list[str] = []
    if not tree:
        errors.append(f"QuotaSubtree {key} has no '{TREE_LABEL}' label: it belongs to no tree")
    nodes = []
    children = spec.get("children")
    for child in children if isinstance(children, list) else []:
        child = as_mapping(child)
        child_name = child.get("name")
        if not isinstance(child_name, str) or not child_name:
            errors.append(f"QuotaSubtree {key}: a child has no name")
            continue
        quotas = as_mapping(child.get("quotas"))
        limits: dict[str, int] = {}
        for resource, quantity in as_mapping(quotas.get("requests")).items():
            try:
                limits[str(resource)] = to_canonical(str(resource), quantity)
            except ValueError as err:
                errors.append(f"QuotaSubtree {key}: node {child_name}: {resource}: {err}")
        weight, problem = parse_weight(child.get(WEIGHT_FIELD), f"QuotaSubtree {key}: node {child_name}: "
                                                                f"{WEIGHT_FIELD}")
        if problem:
            errors.append(problem)
        nodes.append(QuotaNode(tree=tree, name=child_name, parent=parent, limit=ResourceVector(limits),
                               hard=quotas.get("hardLimit") is True, disabled=quotas.get("disabled") is True,
                               defined_by=key, weight=weight))
    return SubtreeView(key=key, namespace=namespace, name=name, tree=tree, parent=parent, nodes=tuple(nodes),
                       errors=tuple(errors), status=as_mapping(raw.get("status")),
                       api_version=str(raw.get("apiVersion") or API_VERSION))


@dataclass
class Tree:
    name: str
    nodes: dict[str, QuotaNode] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    resources: frozenset[str] = frozenset()
    errors: list[str] = field(default_factory=list)

    def path(self, node: str) -> list[str]:
        """``node`` and its ancestors up to the root."""
        out = []
        current: str | None = node
        while current is not None:
            out.append(current)
            current = self.nodes[current].parent
        return out

    def ordered(self) -> list[str]:
        """Every node, parents before children (depth first, children in definition order)."""
        out: list[str] = []

        def visit(name: str) -> None:
            out.append(name)
            for child in self.children.get(name, []):
                visit(child)

        for root in [n for n, node in self.nodes.items() if node.parent is None]:
            visit(root)
        return out

    def depth(self, node: str) -> int:
        return len(self.path(node)) - 1

    def limit(self, node: str, resource: str) -> int | None:
        """The limit of ``node`` on ``resource``; None when it does not limit it."""
        quota = self.nodes[node]
        if quota.disabled or resource not in self.resources:
            return None
        return quota.limit.get(resource)


class Forest:
    def __init__(self, trees: Mapping[str, Tree] | None = None) -> None:
        self.trees: dict[str, Tree] = dict(trees or {})

    @classmethod
    def build(cls, subtrees: Iterable[SubtreeView]) -> Forest:
        definitions: dict[str, dict[str, list[QuotaNode]]] = {}
        errors: dict[str, list[str]] = {}
        for view in sorted(subtrees, key=lambda v: v.key):  # a stable order: the first valid definition wins
            if not view.tree:
                continue
            errors.setdefault(view.tree, []).extend(view.errors)
            for node in view.nodes:
                definitions.setdefault(view.tree, {}).setdefault(node.name, []).append(node)
        trees = {}
        for name in sorted(set(definitions) | set(errors)):
            tree = _assemble(name, definitions.get(name, {}))
            tree.errors[:0] = errors.get(name, [])
            trees[name] = tree
        return cls(trees)

    def charges(self, labels: Mapping[str, str]) -> tuple[Charges, str | None]:
        """Where an AppWrapper with ``labels`` is charged, and an error naming an unknown node (or None)."""
        out = []
        for name in sorted(self.trees):
            tree = self.trees[name]
            wanted = labels.get(name)
            if wanted is None:
                if DEFAULT_NODE in tree.nodes:
                    out.append((name, DEFAULT_NODE))
            elif wanted in tree.nodes:
                out.append((name, wanted))
            else:
                return (), (f"quota tree {name} has no node {wanted!r} (the AppWrapper's label {name}: {wanted}, "
                            f"or its namespace's label {BINDING_PREFIX}{name})")
        return tuple(out), None


def _assemble(name: str, definitions: Mapping[str, list[QuotaNode]]) -> Tree:
    """One tree from every definition of its nodes. A node is kept when its parent chain reaches a root; of several
    definitions of one name, the first (by QuotaSubtree namespace/name) that does is kept. The rest is reported."""
    reachable: set[str] = set()
    grown = True
    while grown:
        grown = False
        for node_name, options in definitions.items():
            if node_name not in reachable and any(o.parent is None or o.parent in reachable for o in options):
                reachable.add(node_name)
                grown = True
    tree = Tree(name)
    for node_name, options in definitions.items():
        if node_name not in reachable:
            parents = ", ".join(sorted({str(o.parent) for o in options}))
            tree.errors.append(f"node {node_name} ({options[0].defined_by}) has parent {parents}, which is not in "
                               f"tree {name} or is on a cycle; it is ignored")
            continue
        chosen = next(o for o in options if o.parent is None or o.parent in reachable)
        tree.nodes[node_name] = chosen
        for other in options:
            if other is not chosen:
                tree.errors.append(f"node {node_name} is defined by both {chosen.defined_by} and "
                                   f"{other.defined_by}; the second is ignored")
    for node_name in list(tree.nodes):  # parents before children, in definition order
        parent = tree.nodes[node_name].parent
        if parent is not None:
            tree.children.setdefault(parent, []).append(node_name)
    tree.resources = frozenset(r for node in tree.nodes.values() for r in node.limit)
    return tree


@dataclass(frozen=True, slots=True)
class Verdict:
    fits: bool
    about: frozenset[str] = frozenset()
    why: str = ""
    at: tuple[str, str] | None = None  # (tree, node) whose limit it does not fit under


@dataclass(frozen=True, slots=True)
class Consumer:
    key: str
    labels: Mapping[str, str]
    demand: ResourceVector
    charges: Charges


class QuotaLedger:
    def __init__(self, forest: Forest | None = None) -> None:
        self.forest = forest if forest is not None else Forest()
        self._consumers: dict[str, Consumer] = {}
        self._usage: dict[tuple[str, str], ResourceVector] = {}
        self._direct: dict[tuple[str, str], set[str]] = {}

    # -- state ---------------------------------------------------------------------------------------------------

    def copy(self) -> QuotaLedger:
        """A scratch copy to try decisions on (the forest is shared: it is never modified in place)."""
        other = QuotaLedger(self.forest)
        other._consumers = dict(self._consumers)
        other._usage = dict(self._usage)
        other._direct = {k: set(v) for k, v in self._direct.items()}
        return other

    def set_forest(self, forest: Forest) -> None:
        consumers = list(self._consumers.values())
        self.forest = forest
        self._consumers.clear()
        self._usage.clear()
        self._direct.clear()
        for consumer in consumers:
            self.charge(consumer.key, consumer.labels, consumer.demand)

    def charge(self, key: str, labels: Mapping[str, str], demand: ResourceVector) -> None:
        """Charge a dispatched AppWrapper (again: its previous charge is replaced). Unknown nodes charge nothing
        in their tree (a tree changed under a running AppWrapper must not lose the rest of its charges)."""
        self.release(key)
        charges = tuple((tree, labels.get(tree, DEFAULT_NODE)) for tree in sorted(self.forest.trees)
                        if labels.get(tree, DEFAULT_NODE) in self.forest.trees[tree].nodes)
        consumer = Consumer(key, dict(labels), demand, charges)
        self._consumers[key] = consumer
        self._apply(consumer, 1)

    def release(self, key: str) -> None:
        consumer = self._consumers.pop(key, None)
        if consumer is not None:
            self._apply(consumer, -1)

    def _apply(self, consumer: Consumer, sign: int) -> None:
        for tree_name, node in consumer.charges:
            tree = self.forest.trees[tree_name]
            direct = self._direct.setdefault((tree_name, node), set())
            if sign > 0:
                direct.add(consumer.key)
            else:
                direct.discard(consumer.key)
                if not direct:
                    del self._direct[(tree_name, node)]
            for name in tree.path(node):
                before = self._usage.get((tree_name, name), ZERO)
                after = before + consumer.demand if sign > 0 else before - consumer.demand
                if after:
                    self._usage[(tree_name, name)] = after
                else:
                    self._usage.pop((tree_name, name), None)

    def is_charged(self, key: str) -> bool:
        return key in self._consumers

    def charged_keys(self) -> list[str]:
        return list(self._consumers)

    def consumer(self, key: str) -> Consumer | None:
        return self._consumers.get(key)

    def usage(self, tree: str, node: str) -> ResourceVector:
        return self._usage.get((tree, node), ZERO)

    def direct(self, tree: str, node: str) -> list[str]:
        """Keys charged to exactly this node."""
        return sorted(self._direct.get((tree, node), ()))

    def borrowed(self, tree: str, node: str) -> ResourceVector:
        """max(0, usage - limit) per limited resource."""
        t = self.forest.trees[tree]
        used = self.usage(tree, node)
        out = {}
        for resource in t.resources:
            limit = t.limit(node, resource)
            if limit is not None and used.get(resource) > limit:
                out[resource] = used.get(resource) - limit
        return ResourceVector(out)

    # -- decisions -----------------------------------------------------------------------------------------------

    def check(self, charges: Charges, demand: ResourceVector) -> Verdict:
        """Whether ``demand`` may be charged at ``charges`` now (see the module docstring)."""
        for tree, node, name in self._limits(charges):
            short = self._short(tree, name, demand)
            if short:
                why = f"quota: node {name} of tree {tree.name} is full: {short} (charged at {node})"
                return Verdict(False, frozenset({f"quota {tree.name}/{name}"}), why, (tree.name, name))
        return Verdict(True)

    def never_fits(self, charges: Charges, demand: ResourceVector) -> str:
        """Why ``demand`` at ``charges`` would not fit even with nothing else charged anywhere ("" if it would):
        more than the limit of a hard node or the root on its path. No eviction can ever make room for it."""
        empty = QuotaLedger(self.forest)
        for tree, node, name in self._limits(charges):
            short = empty._short(tree, name, demand)
            if short:
                return (f"it asks more than quota node {name} of tree {tree.name} allows at all: {short} "
                        f"(charged at {node})")
        return ""

    def _limits(self, charges: Charges) -> Iterator[tuple[Tree, str, str]]:
        """(tree, charged node, node that limits it) for each hard node and root on the path of each charge, leaf
        first: the nodes whose limits a charge must stay within (charges at unknown nodes have none)."""
        for tree_name, node in charges:
            tree = self.forest.trees.get(tree_name)
            if tree is None or node not in tree.nodes:
                continue
            for name in tree.path(node):
                quota = tree.nodes[name]
                if quota.hard or quota.parent is None:
                    yield tree, node, name

    def _short(self, tree: Tree, node: str, demand: ResourceVector) -> str:
        used = self.usage(tree.name, node)
        parts = []
        for resource in sorted(demand.keys()):
            limit = tree.limit(node, resource)
            if limit is None or not demand.get(resource):
                continue
            if used.get(resource) + demand.get(resource) > limit:
                parts.append(f"{resource} needs {format_amount(resource, demand.get(resource))}, "
                             f"{format_amount(resource, max(limit - used.get(resource), 0))} of "
                             f"{format_amount(resource, limit)} left")
        return "; ".join(parts)

    def borrows_at_own_node(self, charges: Charges, demand: ResourceVector) -> bool:
        """Whether charging ``demand`` would take its own node in some tree over that node's limit."""
        for tree_name, node in charges:
            tree = self.forest.trees.get(tree_name)
            if tree is not None and node in tree.nodes and self._short(tree, node, demand):
                return True
        return False

    def borrowers(self, charges: Charges, exclude: Iterable[str] = ()) -> list[str]:
        """Dispatched AppWrappers charged, in a tree of ``charges``, to a node over its limit that is not on the
        path of the node charged there (what reclaim may take back)."""
        skip = set(exclude)
        out: set[str] = set()
        for tree_name, node in charges:
            tree = self.forest.trees.get(tree_name)
            if tree is None or node not in tree.nodes:
                continue
            mine = set(tree.path(node))
            borrowing: dict[str, bool] = {}  # node -> over its limit: each node judged once per call
            for (t, name), keys in self._direct.items():
                if t != tree_name or name in mine:
                    continue
                if any(self._over(tree, n, borrowing) for n in tree.path(name) if n not in mine):
                    out.update(k for k in keys if k not in skip)
        return sorted(out)

    def _over(self, tree: Tree, node: str, seen: dict[str, bool]) -> bool:
        """Whether ``node`` uses more than its limit of some resource (``borrowed`` is not empty), remembered in
        ``seen``: what ``borrowers`` asks of every node on every charged node's path."""
        over = seen.get(node)
        if over is None:
            used = self._usage.get((tree.name, node), ZERO)
            over = seen[node] = any((limit := tree.limit(node, resource)) is not None and used.get(resource) > limit
                                    for resource in tree.resources)
        return over

    def _still_borrows(self, key: str, charges: Charges) -> bool:
        """Whether ``key`` is still one of ``borrowers(charges)`` (a release can only take borrowers away)."""
        consumer = self._consumers.get(key)
        if consumer is None:
            return False
        for tree_name, node in charges:
            tree = self.forest.trees.get(tree_name)
            if tree is None or node not in tree.nodes:
                continue
            mine = set(tree.path(node))
            seen: dict[str, bool] = {}
            for t, name in consumer.charges:
                if t == tree_name and name not in mine and any(
                        self._over(tree, n, seen) for n in tree.path(name) if n not in mine):
                    return True
        return False

    def reclaim_victims(self, charges: Charges, demand: ResourceVector, *,
                        rank: Callable[[str], tuple[Any, ...]],
                        fits_after: Callable[[QuotaLedger, list[str]], bool],
                        exclude: Iterable[str] = ()) -> list[str] | None:
        """Borrowers to preempt so that ``demand`` at ``charges`` fits: by ``rank`` (lowest first: priority, then
        most recent), only as many as needed; ``fits_after(ledger_without_them, victims)`` judges the rest (quota
        here, cluster capacity by the caller). None when it does not fit even without every borrower, or when it
        would still borrow at its own node once they are gone: only what stays within its own quota reclaims. (A
        borrower charged at its node in another tree counts as gone there too: upstream's borrowing case.)"""
        if not charges:
            return None

        def enough(ledger: QuotaLedger, victims: list[str]) -> bool:
            return (ledger.check(charges, demand).fits and not ledger.borrows_at_own_node(charges, demand)
                    and fits_after(ledger, victims))

        trial = self.copy()
        chosen: list[str] = []
        # Lowest rank first among those that still borrow: releases only take borrowers away, so the first of the
        # ranked list that still borrows is the lowest-ranked borrower now (one listing, not one per victim).
        candidates = iter(sorted(trial.borrowers(charges, exclude=exclude), key=rank))
        while not enough(trial, chosen):
            victim = next((key for key in candidates if trial._still_borrows(key, charges)), None)
            if victim is None:
                return None
            chosen.append(victim)
            trial.release(victim)
        # Fewest: give back any victim not needed after all, the most valuable first; ``trial`` is the ledger without
        # ``chosen``, so one given back is charged again there (and released again if it is needed).
        for victim in sorted(chosen, key=rank, reverse=True):
            consumer = self._consumers[victim]
            trial._consumers[victim] = consumer
            trial._apply(consumer, 1)
            rest = [v for v in chosen if v != victim]
            if enough(trial, rest):
                chosen = rest
            else:
                trial.release(victim)
        return chosen

    # -- presentation --------------------------------------------------------------------------------------------

    def report(self, describe: Callable[[str], Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every tree for /debug/quota; ``describe(key)`` gives the namespace, name and demand of an AppWrapper."""
        trees = []
        for name in sorted(self.forest.trees):
            tree = self.forest.trees[name]
            nodes = []
            for node_name in tree.ordered():
                node = tree.nodes[node_name]
                nodes.append({
                    "name": node_name, "parent": node.parent, "hardLimit": node.hard, "disabled": node.disabled,
                    "fairShareWeight": node.weight,
                    "depth": tree.depth(node_name),
                    "limit": {r: format_amount(r, node.limit.get(r)) for r in sorted(tree.resources)},
                    "used": {r: format_amount(r, self.usage(name, node_name).get(r)) for r in sorted(tree.resources)},
                    "borrowed": {r: format_amount(r, a) for r, a in sorted(self.borrowed(name, node_name).items())},
                    "appwrappers": [dict(describe(key)) for key in self.direct(name, node_name)],
                    "definedBy": node.defined_by,
                })
            trees.append({"name": name, "resources": sorted(tree.resources), "errors": list(tree.errors),
                          "nodes": nodes})
        return trees
