"""Quota trees end to end, without --preemption: upstream's kuttl quota suites re-calibrated to a fake node of known
size, plus what upstream got wrong: every tree had to be named
(https://github.com/project-codeflare/multi-cluster-app-dispatcher/issues/407) and there was no reclaim in a full
cluster (https://github.com/project-codeflare/multi-cluster-app-dispatcher/issues/556).

Each test makes its own trees (unique tree names) in its own namespace and its AppWrappers' pods can only run on
the module's fake node (4 cpu, 16Gi, 16 GPUs), so quota binds where a test wants it to and the node fills where a
test wants the cluster full, whatever else the cluster has. Reclaim is exercised here on purpose: borrowed quota
is on loan, so taking it back must not need --preemption (test_quota_preemption.py covers priorities).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s
import pytest

from mcad.api.resources import to_canonical
from test.e2e import quota
from test.e2e.conftest import (
    AppWrappers,
    Controller,
    appwrapper,
    blocked_on,
    condition,
    fake_node,
    job_item,
    pinned,
    running_controller,
)
from test.e2e.quota import QuotaTrees, aw, labelled, node, subtree
from test.support import wait_until

RECLAIMED = "PreemptedByQuotaReclaim"


@pytest.fixture(scope="module")
def controller(kubeconfig: str, controller_kubeconfig: str, crd: None, quota_crd: None) -> Iterator[Controller]:
    """The module's controller, started once the QuotaSubtree CRD exists (it watches QuotaSubtrees)."""
    with running_controller(controller_kubeconfig, quota.controller_log("test_quota", kubeconfig)) as ctl:
        yield ctl


@pytest.fixture(scope="module")
def on_node(core: k8s.CoreV1Api) -> Iterator[dict[str, str]]:
    with fake_node(core, cpu="4", memory="16Gi", gpu="16") as selector:
        yield selector


trees = quota.trees


def job(name: str, labels: dict[str, str], where: dict[str, str], cpu: str, duration: str) -> dict[str, Any]:
    return labelled(appwrapper(name, pinned(job_item(name, 1, cpu, duration=duration, completionstatus="Complete"),
                                            where)), labels)


def runs(aws: AppWrappers, name: str, timeout: float = 60) -> dict[str, Any]:
    """Wait until ``name`` is Running; on timeout, say why it was not (its message and last conditions)."""
    try:
        return aws.wait_state(name, "Running", timeout)
    except AssertionError as err:
        status = aws.status(name)
        conditions = [(c.get("type"), c.get("reason"), c.get("message")) for c in status.get("conditions") or []]
        raise AssertionError(f"{err}; state {status.get('state')!r}, message {status.get('message')!r}, "
                             f"conditions {conditions[-3:]}") from None


def waits_on_quota(aws: AppWrappers, name: str, tree: str, node_name: str) -> dict[str, Any]:
    """Wait until ``name`` is queued with a Backoff message naming the quota node (of ``tree``) that blocks it."""
    status = aws.wait_state(name, "Pending")
    try:
        message = wait_until(lambda: (m := aws.status(name).get("message") or "") and tree in m and node_name in m
                             and m, 30, f"{name}'s message to name node {node_name} of tree {tree}")
    except AssertionError as err:
        raise AssertionError(f"{err}; its message: {aws.status(name).get('message')!r}") from None
    assert not aws.exists("apps/v1", "Deployment", name) and not aws.exists("batch/v1", "Job", name)
    return {**status, "message": message}


def reclaimed_by(aws: AppWrappers, victim: str, by: str) -> None:
    status = aws.wait_state(victim, "Pending")
    preempted = condition(status, "PreemptCandidate")
    assert preempted is not None and preempted["reason"] == RECLAIMED, status.get("conditions")
    assert f"{aws.namespace}/{by}" in preempted["message"], preempted
    wait_until(lambda: not aws.exists("apps/v1", "Deployment", victim) and not aws.exists("batch/v1", "Job", victim),
               60, f"the wrapped objects of {victim} to go")


def untouched(aws: AppWrappers, *names: str) -> None:
    for name in names:
        status = aws.status(name)
        assert status["state"] == "Running" and condition(status, "PreemptCandidate") is None, (name, status)


def cpu_of(values: dict[str, Any] | None) -> int:
    """Millicores of a quantity map (0 when absent), whatever form the quantity is written in."""
    return to_canonical("cpu", (values or {}).get("cpu", "0"))


# -- upstream's kuttl suites -----------------------------------------------------------------------------------------


def test_upstream_quota_forest(controller: Controller, on_node: dict[str, str], trees: QuotaTrees,
                               aws: AppWrappers) -> None:
    """test/e2e-kuttl/quota-forest steps 00-08 (the priority step is in test_quota_preemption.py)."""
    context, service = quota.upstream_trees(trees)
    quota.wait_tree(controller, context, 5)
    quota.wait_tree(controller, service, 3)

    aws.create(aw("job-gold-lo-pri", {context: "gold", service: "gold"}, on_node, "600m", memory="95Mi"))
    runs(aws, "job-gold-lo-pri")
    # Unknown quota ids: queued, saying which node of which tree does not exist.
    aws.create(aw("job-unknown", {context: "context-root2", service: "service-root2"}, on_node, "100m",
                  replicas=10))
    message = aws.wait_state("job-unknown", "Pending")["message"]
    assert (context in message and "context-root2" in message) or (service in message and "service-root2" in message)
    assert not aws.exists("apps/v1", "Deployment", "job-unknown")

    aws.create(aw("job-1-bronze", {context: "bronze", service: "gold"}, on_node, "400m", memory="95Mi"))
    runs(aws, "job-1-bronze")
    # 600m + 400m + 400m is more than the root's 1075m.
    aws.create(aw("job-2-bronze", {context: "bronze", service: "gold"}, on_node, "400m", memory="95Mi"))
    waits_on_quota(aws, "job-2-bronze", context, "context-root")
    aws.delete("job-gold-lo-pri")
    runs(aws, "job-2-bronze")
    # Bronze holds 800m of its hard 900m; the root would have room (1000m of 1075m), the hard limit does not.
    aws.create(aw("job-3-bronze", {context: "bronze", service: "gold"}, on_node, "200m", memory="95Mi"))
    waits_on_quota(aws, "job-3-bronze", context, "bronze")
    aws.create(aw("job-silver", {context: "silver", service: "gold"}, on_node, "200m", memory="95Mi"))
    runs(aws, "job-silver")
    assert aws.status("job-3-bronze")["state"] == "Pending"

    bronze = quota.node_doc(controller, context, "bronze")
    assert bronze is not None and cpu_of(bronze["used"]) == 800 and cpu_of(bronze["limit"]) == 900
    root = quota.node_doc(controller, context, "context-root")
    assert root is not None and cpu_of(root["used"]) == 1000
    assert aws.status("job-unknown")["state"] == "Pending"


def test_upstream_hard_limit_serialises_jobs_and_unlabelled_ones_use_default(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    """test/e2e-kuttl/quota-forest steps 09-11: two 900m bronze jobs run one after the other (bronze is hard
    900m); a job without quota labels is charged to each tree's default node (0, soft: it borrows) and completes;
    so does one with only an unrelated label. Labels are never added (upstream MCAD patched them in:
    https://github.com/project-codeflare/multi-cluster-app-dispatcher/issues/407)."""
    context, service = quota.upstream_trees(trees)
    quota.wait_tree(controller, context, 5)
    quota.wait_tree(controller, service, 3)

    # Long enough that my-job-2 is seen waiting while my-job-1 runs, even on a busy machine.
    aws.create(job("my-job-1", {context: "bronze", service: "gold"}, on_node, "900m", "6s"))
    runs(aws, "my-job-1")
    aws.create(job("my-job-2", {context: "bronze", service: "gold"}, on_node, "900m", "1s"))
    waits_on_quota(aws, "my-job-2", context, "bronze")
    aws.wait_state("my-job-1", "Completed", timeout=60)
    aws.wait_state("my-job-2", "Completed", timeout=60)

    aws.create(job("job-without-labels", {}, on_node, "900m", "10s"))  # read while it runs
    runs(aws, "job-without-labels")
    for tree in (context, service):
        default = quota.node_doc(controller, tree, "default")
        assert default is not None
        assert [a["name"] for a in default["appwrappers"]] == ["job-without-labels"], default
        assert cpu_of(default["borrowed"]) == 900, default
    aws.wait_state("job-without-labels", "Completed", timeout=60)
    aws.create(job("job-with-labels-no-quota", {"my-label-key": "my-label-value"}, on_node, "900m", "1s"))
    aws.wait_state("job-with-labels-no-quota", "Completed", timeout=60)

    assert aws.get("job-without-labels")["metadata"].get("labels") in (None, {})
    assert aws.get("job-with-labels-no-quota")["metadata"]["labels"] == {"my-label-key": "my-label-value"}


def test_upstream_borrowing_gold_takes_back_what_silver_borrowed(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    """test/e2e-kuttl-borrowing: silver runs 2 x (500m, 8 GPUs, 300Mi), over its own 400Mi and 8 GPUs (it
    borrows); gold then asks for 1 x (500m, 8 GPUs, 300Mi), within gold's quota, which the context root (1075m) cannot
    hold besides silver's 1000m: silver must yield and gold runs. Without --preemption: borrowed quota is on loan."""
    context, service = quota.upstream_trees(trees, gpu=True)
    quota.wait_tree(controller, context, 5)
    quota.wait_tree(controller, service, 3)

    def gpu_job(name: str, labels: dict[str, str], replicas: int) -> dict[str, Any]:
        requests = {"cpu": "500m", "nvidia.com/gpu": "8", "memory": "300Mi"}
        item = pinned(job_item(name, replicas, "500m", duration="1h", completionstatus="Complete",
                               custompodresources=[{"replicas": replicas, "requests": requests,
                                                    "limits": requests}]), on_node)
        item["generictemplate"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
            "requests": requests, "limits": requests}
        return labelled(appwrapper(name, item, scheduling={"minAvailable": replicas}), labels)

    aws.create(gpu_job("my-job-1", {context: "silver", service: "gold"}, 2))
    runs(aws, "my-job-1")
    aws.wait_pods("my-job-1", 2)
    silver = quota.node_doc(controller, context, "silver")
    assert silver is not None and silver["borrowed"].get("nvidia.com/gpu") == "8", silver

    aws.create(gpu_job("my-job-2", {context: "gold", service: "gold"}, 1))
    runs(aws, "my-job-2")
    reclaimed_by(aws, "my-job-1", "my-job-2")
    aws.wait_pods("my-job-2", 1)


def test_upstream_tree_added_at_runtime(controller: Controller, on_node: dict[str, str], trees: QuotaTrees,
                                        aws: AppWrappers) -> None:
    """test/e2e-kuttl-deployment-03: a tree ``quota_actinides`` (plutonium soft, lawrencium hard) created while
    AppWrappers run takes effect at once, and what already runs keeps running even where it is now over a limit.
    Re-calibrated: lawrencium is 500m (upstream 1075m) so its hard limit is seen to bind."""
    context, service = quota.upstream_trees(trees)
    quota.wait_tree(controller, context, 5)
    actinides = f"quota_actinides_{quota.suffix()}"
    # Before the tree exists its label is just a label: it runs, charged to the other trees' default nodes.
    aws.create(aw("before", {actinides: "lawrencium"}, on_node, "600m"))
    runs(aws, "before")

    trees.create(
        subtree("actinides-root", actinides, node("actinides-root", cpu="1075m", memory="1045Mi")),
        subtree("actinides-children", actinides, node("plutonium", cpu="1075m", memory="1045Mi"),
                node("lawrencium", hard=True, cpu="500m", memory="1045Mi"), parent="actinides-root"))
    quota.wait_tree(controller, actinides, 3)
    lawrencium = wait_until(lambda: (n := quota.node_doc(controller, actinides, "lawrencium")) and n["appwrappers"]
                            and n, 30, "before to be charged to lawrencium")
    assert cpu_of(lawrencium["used"]) == 600 and cpu_of(lawrencium["borrowed"]) == 100
    untouched(aws, "before")

    aws.create(aw("lawrencium-job", {actinides: "lawrencium"}, on_node, "100m"))
    waits_on_quota(aws, "lawrencium-job", actinides, "lawrencium")
    aws.create(aw("gold-plutonium", {context: "gold", service: "gold", actinides: "plutonium"}, on_node, "300m"))
    runs(aws, "gold-plutonium")
    untouched(aws, "before")
    aws.delete("before")
    runs(aws, "lawrencium-job")


def test_upstream_restart_rebuilds_charges_exactly(controller: Controller, on_node: dict[str, str],
                                                   trees: QuotaTrees, aws: AppWrappers) -> None:
    """test/e2e-kuttl-deployment-02: a bronze job and a no-quota deployment run, the controller dies (SIGKILL),
    and after the restart gold still dispatches. Plus the exact check: bronze (hard 900m) holds 600m, so after the
    restart 400m more must wait (no charge lost) and 300m must run (none doubled)."""
    context, service = quota.upstream_trees(trees)
    quota.wait_tree(controller, context, 5)
    aws.create(aw("bronze-job", {context: "bronze", service: "gold"}, on_node, "600m"))
    aws.create(aw("no-quota", {}, on_node, "50m"))
    for name in ("bronze-job", "no-quota"):
        runs(aws, name)
    stamp = aws.status("bronze-job")["controllerfirstdispatchtimestamp"]

    controller.stop(signal.SIGKILL)
    # A fresh log, so start() waits for this run's "dispatcher started" (the old log stays beside it).
    controller.log.replace(controller.log.with_suffix(".before-restart.log"))
    controller.start()
    quota.wait_tree(controller, context, 5)

    aws.create(aw("gold-job", {context: "gold", service: "gold"}, on_node, "100m"))
    runs(aws, "gold-job")
    aws.create(aw("bronze-400", {context: "bronze", service: "gold"}, on_node, "400m"))
    waits_on_quota(aws, "bronze-400", context, "bronze")
    aws.create(aw("bronze-300", {context: "bronze", service: "gold"}, on_node, "300m"))
    runs(aws, "bronze-300")
    assert aws.status("bronze-400")["state"] == "Pending"
    assert aws.status("bronze-job")["controllerfirstdispatchtimestamp"] == stamp, "dispatched twice"
    bronze = quota.node_doc(controller, context, "bronze")
    assert bronze is not None and cpu_of(bronze["used"]) == 900
    root = quota.node_doc(controller, context, "context-root")
    assert root is not None and cpu_of(root["used"]) == 600 + 50 + 100 + 300  # no-quota is charged to default


# -- beyond upstream -------------------------------------------------------------------------------------------------


def test_a_hard_node_is_refused_beyond_its_limit_while_a_soft_sibling_borrows(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    tree = f"hard_soft_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="3")),
                 subtree("teams", tree, node("soft", cpu="500m"), node("hard", hard=True, cpu="500m"),
                         parent="root"))
    quota.wait_tree(controller, tree, 3)
    for i in range(3):
        aws.create(aw(f"soft-{i}", {tree: "soft"}, on_node, "500m"))
        runs(aws, f"soft-{i}")
    aws.create(aw("hard-0", {tree: "hard"}, on_node, "500m"))
    runs(aws, "hard-0")
    # The root has 1000m left; the hard node none.
    aws.create(aw("hard-1", {tree: "hard"}, on_node, "100m"))
    waits_on_quota(aws, "hard-1", tree, "hard")
    aws.create(aw("soft-3", {tree: "soft"}, on_node, "500m"))
    runs(aws, "soft-3")
    assert aws.status("hard-1")["state"] == "Pending"

    soft, hard = quota.node_doc(controller, tree, "soft"), quota.node_doc(controller, tree, "hard")
    assert soft is not None and cpu_of(soft["used"]) == 2000 and cpu_of(soft["borrowed"]) == 1500
    assert hard is not None and cpu_of(hard["used"]) == 500 and cpu_of(hard["borrowed"]) == 0


def test_reclaim_takes_back_borrowed_quota_lowest_priority_then_most_recent_first(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    """The borrower holds the whole root (2000m, 1000m of it borrowed); the lender asks for its own 1000m: the two
    priority-0 borrowers go, the most recent first, and nobody else."""
    tree = f"reclaim_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="2")),
                 subtree("teams", tree, node("lender", cpu="1"), node("borrower", cpu="1"), parent="root"))
    quota.wait_tree(controller, tree, 3)
    for name, priority in (("b-0", 0), ("b-1", 5), ("b-2", 0), ("b-3", 5)):
        aws.create(aw(name, {tree: "borrower"}, on_node, "500m", priority=priority))
        runs(aws, name)

    aws.create(aw("a", {tree: "lender"}, on_node, "1"))
    runs(aws, "a")
    for victim in ("b-2", "b-0"):
        reclaimed_by(aws, victim, "a")
    untouched(aws, "b-1", "b-3")
    # The victims wait: with them the root would be over again, and they would only borrow.
    for victim in ("b-0", "b-2"):
        waits_on_quota(aws, victim, tree, "root")
    borrower = quota.node_doc(controller, tree, "borrower")
    assert borrower is not None and cpu_of(borrower["used"]) == 1000 and cpu_of(borrower["borrowed"]) == 0


def test_reclaim_in_a_full_cluster(controller: Controller, on_node: dict[str, str], trees: QuotaTrees,
                                   aws: AppWrappers) -> None:
    """Upstream MCAD got this wrong (https://github.com/project-codeflare/multi-cluster-app-dispatcher/issues/556):
    the borrower's pods fill the node (4 x 1000m on 4 cpu) while the root has room to spare; the lender's 1000m is
    within its quota but the cluster is full: one borrower goes, the most recent."""
    tree = f"full_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="8")),
                 subtree("teams", tree, node("lender", cpu="5"), node("borrower", cpu="1"), parent="root"))
    quota.wait_tree(controller, tree, 3)
    borrowers = [f"b-{i}" for i in range(4)]
    for name in borrowers:
        aws.create(aw(name, {tree: "borrower"}, on_node, "1"))
        runs(aws, name)
    for name in borrowers:
        aws.wait_pods(name, 1)

    aws.create(aw("a", {tree: "lender"}, on_node, "1"))
    runs(aws, "a")
    reclaimed_by(aws, "b-3", "a")
    untouched(aws, *borrowers[:3])
    aws.wait_pods("a", 1)
    # b-3 would borrow again: it waits for the cluster, without taking anything back.
    wait_until(lambda: blocked_on(aws.status("b-3").get("message") or "", "cpu"), 30, "b-3 to wait for cpu")
    untouched(aws, "a", *borrowers[:3])


def test_an_appwrapper_naming_no_tree_runs_on_capacity_alone(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    """Trees without a ``default`` node ignore AppWrappers that do not name them (upstream MCAD required a label for
    every tree: https://github.com/project-codeflare/multi-cluster-app-dispatcher/issues/407)."""
    tree = f"nodefault_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="100m")),
                 subtree("teams", tree, node("team", hard=True, cpu="100m"), parent="root"))
    quota.wait_tree(controller, tree, 2)
    aws.create(aw("labelled", {tree: "team"}, on_node, "200m"))
    waits_on_quota(aws, "labelled", tree, "team")  # the tree is in force

    aws.create(aw("unlabelled", {}, on_node, "2"))
    aws.create(aw("other-label", {"team": "x"}, on_node, "1"))
    for name in ("unlabelled", "other-label"):
        runs(aws, name)
    assert aws.get("unlabelled")["metadata"].get("labels") in (None, {})
    assert aws.get("other-label")["metadata"]["labels"] == {"team": "x"}
    root = quota.node_doc(controller, tree, "root")
    assert root is not None and cpu_of(root["used"]) == 0 and root["appwrappers"] == []


def test_an_unknown_node_waits_with_a_message_until_the_node_exists(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    tree = f"unknown_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="1")),
                 subtree("teams", tree, node("team", cpu="1"), parent="root"))
    quota.wait_tree(controller, tree, 2)
    aws.create(aw("typo", {tree: "taem"}, on_node, "100m"))
    waits_on_quota(aws, "typo", tree, "taem")
    assert aws.get("typo")["metadata"]["labels"] == {tree: "taem"}

    trees.replace_children("teams", node("team", cpu="1"), node("taem", cpu="500m"))
    runs(aws, "typo")
    taem = quota.node_doc(controller, tree, "taem")
    assert taem is not None and [a["name"] for a in taem["appwrappers"]] == ["typo"]


def test_lowering_a_limit_evicts_nothing_and_deleting_the_tree_frees_the_queue(
        controller: Controller, on_node: dict[str, str], trees: QuotaTrees, aws: AppWrappers) -> None:
    tree = f"lowered_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="2")),
                 subtree("teams", tree, node("team", cpu="2"), parent="root"))
    quota.wait_tree(controller, tree, 2)
    for name in ("r-0", "r-1"):
        aws.create(aw(name, {tree: "team"}, on_node, "500m"))
        runs(aws, name)
    deployments = k8s.AppsV1Api(aws.custom.api_client)
    uids = {name: deployments.read_namespaced_deployment(name, aws.namespace).metadata.uid for name in ("r-0", "r-1")}

    trees.replace_children("teams", node("team", hard=True, cpu="500m"))
    wait_until(lambda: (n := quota.node_doc(controller, tree, "team")) and cpu_of(n["limit"]) == 500, 30,
               "the lowered limit to take effect")
    aws.create(aw("n-0", {tree: "team"}, on_node, "100m"))
    waits_on_quota(aws, "n-0", tree, "team")
    untouched(aws, "r-0", "r-1")
    for name, uid in uids.items():
        assert deployments.read_namespaced_deployment(name, aws.namespace).metadata.uid == uid, f"{name} redone"

    aws.delete("r-0")
    wait_until(lambda: (n := quota.node_doc(controller, tree, "team")) and cpu_of(n["used"]) == 500, 30,
               "r-0's charge to be released")
    assert aws.status("n-0")["state"] == "Pending"  # 500m + 100m is still over the new 500m
    trees.delete_all()
    runs(aws, "n-0")


def test_quota_subtree_status_shows_what_each_node_uses(controller: Controller, on_node: dict[str, str],
                                                        trees: QuotaTrees, aws: AppWrappers) -> None:
    tree = f"status_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="4", memory="1Gi")),
                 subtree("teams", tree, node("a", cpu="1", memory="512Mi"), node("b", cpu="1", memory="512Mi"),
                         parent="root"))
    quota.wait_tree(controller, tree, 3)
    aws.create(aw("x", {tree: "a"}, on_node, "300m", memory="64Mi"))
    aws.create(aw("y", {tree: "b"}, on_node, "200m", replicas=2, memory="64Mi"))
    for name in ("x", "y"):
        runs(aws, name)

    def allocation(name: str) -> dict[str, Any]:
        status = trees.get(name).get("status") or {}
        children = {c.get("name"): {r: to_canonical(r, q) for r, q in
                                    ((c.get("allocated") or {}).get("requests") or {}).items()}
                    for c in status.get("children") or []}
        total = {r: to_canonical(r, q) for r, q in ((status.get("totalAllocation") or {}).get("requests") or
                                                     {}).items()}
        return {"children": children, "total": total}

    mi = 1024 * 1024
    expected = {"children": {"a": {"cpu": 300, "memory": 64 * mi}, "b": {"cpu": 400, "memory": 128 * mi}},
                "total": {"cpu": 700, "memory": 192 * mi}}
    wait_until(lambda: allocation("teams") == expected, 30, f"the status of teams to be {expected}")
    wait_until(lambda: allocation("root") == {"children": {"root": {"cpu": 700, "memory": 192 * mi}},
                                              "total": {"cpu": 700, "memory": 192 * mi}}, 30,
               "the status of root to show the whole tree's use")

    aws.delete("y")

    def b_freed() -> bool:
        now = allocation("teams")
        return (now["children"].get("b", {}).get("cpu", 0) == 0 and now["total"].get("cpu") == 300
                and now["children"]["a"] == expected["children"]["a"])

    wait_until(b_freed, 30, "the status of teams to show b's use gone")


def test_debug_quota_document_and_metrics(controller: Controller, on_node: dict[str, str], trees: QuotaTrees,
                                          aws: AppWrappers) -> None:
    tree = f"debug_{quota.suffix()}"
    trees.create(subtree("root", tree, node("root", cpu="2")),
                 subtree("teams", tree, node("team", cpu="500m"), node("idle", hard=True, cpu="1"),
                         node("off", disabled=True, cpu="1"), parent="root"),
                 subtree("sub", tree, node("squad", cpu="200m"), parent="team"),
                 subtree("stray", tree, node("lost", cpu="1"), parent="nowhere"))
    quota.wait_tree(controller, tree, 5)
    # The stray subtree may reach the controller last: wait for its error rather than read the tree once.
    doc = wait_until(lambda: (t := quota.tree_doc(controller, tree)) and any("nowhere" in e for e in t["errors"])
                     and t, 30, "the tree's error about parent nowhere")
    assert len(doc["errors"]) == 1 and "lost" in doc["errors"][0], doc["errors"]
    assert "lost" not in [n["name"] for n in doc["nodes"]]
    aws.create(aw("s", {tree: "squad"}, on_node, "300m"))
    aws.create(aw("t", {tree: "team"}, on_node, "400m"))
    for name in ("s", "t"):
        runs(aws, name)

    full = quota.debug_quota(controller)
    assert set(full) >= {"controller", "generatedAt", "trees"}
    doc = next(t for t in full["trees"] if t["name"] == tree)
    assert doc["resources"] == ["cpu"]
    names = [n["name"] for n in doc["nodes"]]
    assert sorted(names) == ["idle", "off", "root", "squad", "team"]
    for n in doc["nodes"]:  # parents first
        assert n["parent"] is None or names.index(n["parent"]) < names.index(n["name"]), names
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert by_name["root"]["parent"] is None and by_name["squad"]["parent"] == "team"
    assert by_name["idle"]["hardLimit"] is True and by_name["team"]["hardLimit"] is False
    assert by_name["off"]["disabled"] is True
    assert by_name["squad"]["definedBy"] == f"{aws.namespace}/sub"
    assert by_name["team"]["definedBy"] == f"{aws.namespace}/teams"
    assert [(a["namespace"], a["name"], cpu_of(a["demand"])) for a in by_name["squad"]["appwrappers"]] == [
        (aws.namespace, "s", 300)]
    assert [a["name"] for a in by_name["team"]["appwrappers"]] == ["t"]  # charged directly: not s
    assert (cpu_of(by_name["team"]["used"]), cpu_of(by_name["team"]["limit"])) == (700, 500)
    assert cpu_of(by_name["team"]["borrowed"]) == 200
    assert cpu_of(by_name["squad"]["borrowed"]) == 100
    assert cpu_of(by_name["root"]["used"]) == 700 and cpu_of(by_name["root"]["borrowed"]) == 0
    assert cpu_of(by_name["idle"]["used"]) == 0 and cpu_of(by_name["idle"]["borrowed"]) == 0

    def scraped() -> str | None:
        code, text = controller.get("/metrics")
        assert code == 200
        used = quota.sample(text, "mcad_quota_used", tree=tree, node="team", resource="cpu")
        return text if used == pytest.approx(0.7) else None

    # The quota samples are refreshed with the QuotaSubtree status, which is written coalesced (every few seconds).
    metrics = wait_until(scraped, 30, "the quota metrics to show team's use")
    for name, limit, used, borrowed in (("team", 0.5, 0.7, 0.2), ("squad", 0.2, 0.3, 0.1), ("root", 2, 0.7, 0)):
        labels = {"tree": tree, "node": name, "resource": "cpu"}
        assert quota.sample(metrics, "mcad_quota_limit", **labels) == pytest.approx(limit), (name, labels)
        assert quota.sample(metrics, "mcad_quota_used", **labels) == pytest.approx(used), name
        assert (quota.sample(metrics, "mcad_quota_borrowed", **labels) or 0) == pytest.approx(borrowed), name
