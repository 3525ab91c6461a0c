"""QuotaSubtree status and quota metric rows from the quota ledger: what is written when usage changes, nothing when
it does not (or the object already shows it), and the rows metrics read. Writes run inline (a write pool with no
workers); the writer records the statuses applied, as the API server would store them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcad.api.resources import ResourceVector
from mcad.errors import ApiError
from mcad.k8s.writes import Writes
from mcad.loop.quotastatus import QuotaStatusWriter
from mcad.model.quota import QuotaLedger, SubtreeView, subtree_view


def subtree(name: str, tree: str, children: dict[str, str], parent: str | None = None,
            status: dict[str, Any] | None = None) -> SubtreeView:
    spec: dict[str, Any] = {"children": [{"name": child, "quotas": {"requests": {"cpu": cpu}}}
                                         for child, cpu in children.items()]}
    if parent:
        spec["parent"] = parent
    return subtree_view({"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
                         "metadata": {"name": name, "namespace": "q", "labels": {"tree": tree} if tree else {}},
                         "spec": spec, **({"status": status} if status is not None else {})})


class Subtrees:
    """A store of QuotaSubtree views (what the informer would hold)."""

    def __init__(self, views: Sequence[SubtreeView]) -> None:
        self.views = list(views)

    def get(self, key: str) -> SubtreeView | None:
        return next((v for v in self.views if v.key == key), None)

    def list(self) -> Sequence[SubtreeView]:
        return list(self.views)

    def __len__(self) -> int:
        return len(self.views)

    def has_synced(self) -> bool:
        return True

    def add_handler(self, handler: Any) -> None:
        pass


class Statuses:
    def __init__(self) -> None:
        self.applied: list[tuple[str, dict[str, Any]]] = []
        self.refuse: ApiError | None = None

    def apply_status(self, api_version: str, kind: str, namespace: str, name: str, new_status: Mapping[str, Any],
                     *, field_manager: str) -> Mapping[str, Any]:
        if self.refuse is not None:
            raise self.refuse
        self.applied.append((f"{namespace}/{name}", dict(new_status)))
        return new_status


class Keys:
    def add(self, key: Any) -> None:
        pass


ROOT = subtree("root", "t", {"root": "4"})
KIDS = subtree("kids", "t", {"gold": "2", "silver": "2"}, parent="root")


def writer_over(*views: SubtreeView) -> tuple[QuotaStatusWriter, QuotaLedger, Statuses, Subtrees]:
    quota, statuses, store = QuotaLedger(), Statuses(), Subtrees(views)
    writer = QuotaStatusWriter(quota, store, statuses, Writes(Keys(), workers=0))
    writer.read_forest()
    return writer, quota, statuses, store


def cpu(amount: str) -> ResourceVector:
    return ResourceVector.from_quantities({"cpu": amount})


def test_usage_is_written_per_node_with_the_total_when_it_changes() -> None:
    writer, quota, statuses, _ = writer_over(ROOT, KIDS)
    quota.charge("ns/a", {"t": "gold"}, cpu("1500m"))
    writer.write()
    assert dict(statuses.applied) == {
        "q/root": {"totalAllocation": {"requests": {"cpu": "1500m"}},
                   "children": [{"name": "root", "allocated": {"requests": {"cpu": "1500m"}}}]},
        "q/kids": {"totalAllocation": {"requests": {"cpu": "1500m"}},
                   "children": [{"name": "gold", "allocated": {"requests": {"cpu": "1500m"}}},
                                {"name": "silver", "allocated": {"requests": {"cpu": "0"}}}]},
    }
    statuses.applied.clear()
    quota.charge("ns/b", {"t": "silver"}, cpu("1"))
    writer.write()
    assert [name for name, _ in statuses.applied] == ["q/root", "q/kids"]
    assert statuses.applied[1][1]["children"][1] == {"name": "silver", "allocated": {"requests": {"cpu": "1"}}}


def test_nothing_is_written_when_usage_did_not_change_or_the_object_shows_it_already() -> None:
    writer, _, statuses, _ = writer_over(ROOT)
    writer.write()
    assert len(statuses.applied) == 1
    writer.write()
    assert len(statuses.applied) == 1
    shown = statuses.applied[0][1]
    fresh, _, fresh_statuses, _ = writer_over(subtree("root", "t", {"root": "4"}, status=shown))
    fresh.write()
    assert fresh_statuses.applied == []


def test_a_refused_write_is_not_retried_until_usage_changes() -> None:
    writer, quota, statuses, _ = writer_over(ROOT)
    statuses.refuse = ApiError(500, "InternalError", "etcd is away")
    writer.write()
    statuses.refuse = None
    writer.write()
    assert statuses.applied == []
    quota.charge("ns/a", {"t": "root"}, cpu("1"))
    writer.write()
    assert statuses.applied == [("q/root", {"totalAllocation": {"requests": {"cpu": "1"}},
                                            "children": [{"name": "root", "allocated": {"requests": {"cpu": "1"}}}]})]


def test_a_subtree_of_no_tree_gets_no_status() -> None:
    writer, _, statuses, _ = writer_over(subtree("lost", "", {"x": "1"}))
    writer.write()
    assert statuses.applied == []
    assert writer.samples == ()


def test_a_subtree_deleted_and_made_again_is_written_again() -> None:
    writer, _, statuses, store = writer_over(ROOT, KIDS)
    writer.write()
    store.views = [ROOT]
    writer.write()
    store.views = [ROOT, KIDS]
    writer.write()
    assert [name for name, _ in statuses.applied] == ["q/root", "q/kids", "q/kids"]


def test_rows_for_metrics_say_limit_used_and_borrowed_in_base_units() -> None:
    writer, quota, _, _ = writer_over(ROOT, KIDS)
    quota.charge("ns/a", {"t": "gold"}, cpu("3"))
    assert writer.samples == ()  # refreshed by write(), not by charges
    writer.write()
    assert writer.samples == (
        ("t", "root", "cpu", 4.0, 3.0, 0.0),
        ("t", "gold", "cpu", 2.0, 3.0, 1.0),
        ("t", "silver", "cpu", 2.0, 0.0, 0.0),
    )
