"""Topology-aware placement on the local cluster (kube-scheduler, kwok nodes labelled by block and rack), the
controller started with ``--topology-level`` for both levels and ``--preemption``:

- a gang that prefers a rack and fits none goes into one block rather than across blocks, though the roomiest rack
  is in the other block;
- a gang that requires a rack runs whole in the rack it fits best, each pod where mcad pinned it;
- one that no rack can hold waits, saying which racks have the most room for it;
- a high-priority gang that requires a rack evicts the one AppWrapper whose rack then holds it, not the two of the
  rack that evicting by rank alone would free;
- a gang reset by a failed pod is dispatched again into the rack it ran in, though a fresh placement would choose
  another.

Who sends the input: node labels are the cluster admin's (tenants get no write on nodes); the annotations are the
tenant's own and only ever narrow where its own pods go (admission checks their form).

Nodes: a0, a1 (rack-a) and b0, b1 (rack-b), 4 cpu each, in block-1; c0 (11 cpu, rack-c) and d0 (2 cpu, rack-d) in
block-2. Pods select the test's own row label, so nothing else on the cluster is used.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client as k8s

from mcad.api.faulttolerance import RETRY_LIMIT, RETRY_PAUSE
from test.e2e.conftest import LOGS, AppWrappers, appwrapper, condition, delete_fake_node, running_controller
from test.e2e.test_fault_tolerance import CONTROLLER_ARGS as FAULT_ARGS
from test.e2e.test_fault_tolerance import EXIT_CODE, FAIL_AFTER, annotated, resets
from test.e2e.test_node_health import backoff_message
from test.e2e.test_placement import pinned_node
from test.support import wait_until

ROW, BLOCK, RACK = "mcad.test/topology-row", "mcad.test/block", "mcad.test/rack"
LAYOUT = {"a0": ("block-1", "rack-a", "4"), "a1": ("block-1", "rack-a", "4"), "b0": ("block-1", "rack-b", "4"),
          "b1": ("block-1", "rack-b", "4"), "c0": ("block-2", "rack-c", "11"), "d0": ("block-2", "rack-d", "2")}


@contextlib.contextmanager
def racked_nodes(core: k8s.CoreV1Api) -> Iterator[tuple[dict[str, str], str]]:
    """The LAYOUT's nodes (names prefixed by a tag of their own); yields short name -> node name and the row."""
    tag = uuid.uuid4().hex[:6]
    names = {short: f"mcad-test-{tag}-{short}" for short in LAYOUT}
    try:
        for short, (block, rack, cpu) in LAYOUT.items():
            capacity = {"cpu": cpu, "memory": "32Gi", "pods": "110"}
            core.create_node({"metadata": {"name": names[short], "annotations": {"kwok.x-k8s.io/node": "fake"},
                                           "labels": {"mcad.test/owned": "true", ROW: tag, BLOCK: block,
                                                      RACK: rack}},
                              "status": {"capacity": capacity, "allocatable": capacity}})
        for name in names.values():
            wait_until(lambda name=name: any(c.type == "Ready" and c.status == "True"
                                             for c in core.read_node(name).status.conditions or []),
                       60, f"node {name} Ready")
        yield names, tag
    finally:
        for name in names.values():
            with contextlib.suppress(k8s.ApiException):
                delete_fake_node(core, name)


def gang(name: str, row: str, pods: int, cpu: int, *, rack: str = "", run: str = "1h") -> dict[str, Any]:
    """A Job of ``pods`` pods of ``cpu`` that run for ``run`` on the row's nodes (``rack``: on that rack only)."""
    requests = {"cpu": str(cpu), "memory": "16Mi"}
    selector = {ROW: row, **({RACK: rack} if rack else {})}
    return {"replicas": 1, "generictemplate": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": run}},
            "spec": {"restartPolicy": "Never", "nodeSelector": selector, "containers": [{
                "name": "main", "image": "trainer", "resources": {"requests": requests, "limits": requests}}]}}}}}


def asking(body: dict[str, Any], **asks: str) -> dict[str, Any]:
    body["metadata"]["annotations"] = {f"mcad.codeflare.dev/topology-{ask}": level for ask, level in asks.items()}
    return body


def placed(aws: AppWrappers, name: str, count: int, names: dict[str, str],
           pods: list[Any] | None = None) -> list[str]:
    """The short names of the nodes of ``count`` Running pods of ``name`` (or of ``pods``), each on the node mcad
    pinned it to."""
    short = {node: s for s, node in names.items()}
    pods = aws.wait_pods(name, count) if pods is None else pods
    for pod in pods:
        assert pinned_node(pod) == pod.spec.node_name, f"{pod.metadata.name} is not on the node of its pin"
    return sorted(short[pod.spec.node_name] for pod in pods)


def gone(aws: AppWrappers, name: str) -> None:
    aws.delete(name)
    wait_until(lambda: not aws.pods(name), 60, f"the pods of {name} gone")


def test_gangs_go_into_one_domain_and_preemption_frees_the_cheapest_rack(
        controller_kubeconfig: str, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    with racked_nodes(core) as (names, row), running_controller(
            controller_kubeconfig, LOGS / "test_topology.log", "--preemption",
            f"--topology-level={BLOCK}", f"--topology-level={RACK}"):
        # Preferred: 3 x 4 cpu fits no rack; rack-c has the most room (11 cpu, two pods), but block-2 holds two pods
        # at most, block-1 four: the gang goes into block-1 whole.
        aws.create(asking(appwrapper("prefers", gang("prefers", row, 3, 4)), preferred=RACK))
        aws.wait_state("prefers", "Running")
        assert {LAYOUT[node][0] for node in placed(aws, "prefers", 3, names)} == {"block-1"}
        gone(aws, "prefers")

        # Required: 2 x 3 cpu fits rack-a, rack-b (2 cpu left) and rack-c (5 left): the best fit, rack-a.
        aws.create(asking(appwrapper("tight", gang("tight", row, 2, 3)), required=RACK))
        aws.wait_state("tight", "Running")
        assert placed(aws, "tight", 2, names) == ["a0", "a1"]

        # No rack holds 3 x 4 cpu: it waits and says where the most room is.
        aws.create(asking(appwrapper("wide", gang("wide", row, 3, 4)), required=RACK))
        said = backoff_message(aws, "wide", f"in one {RACK}: rack-b has room for 2, rack-c for 2")
        assert "needs 3 pod(s) of cpu 4, memory 16Mi" in said, said
        assert not aws.pods("wide")
        gone(aws, "wide")
        gone(aws, "tight")

        # Preemption: rack-a runs work of higher priority than the preemptor's; rack-c one low-priority AppWrapper
        # (the oldest, 8 cpu), rack-b two (4 cpu each, younger). Evicting low-c alone would lose more work (8 cpu
        # for longer than either 4-cpu one has run) than both of rack-b's: the preemptor evicts those and runs in
        # rack-b. (With no work lost either way the domain needing the fewest victims wins:
        # test/component/test_topology_required.py.)
        aws.create(asking(appwrapper("keep", gang("keep", row, 2, 4), priority=10), required=RACK))
        assert placed(aws, "keep", 2, names) == ["a0", "a1"]
        for name, rack, cpu in (("low-c", "rack-c", 8), ("low-b1", "rack-b", 4), ("low-b2", "rack-b", 4)):
            aws.create(appwrapper(name, gang(name, row, 1, cpu, rack=rack)))
            aws.wait_state(name, "Running")
            aws.wait_pods(name, 1)
        aws.create(asking(appwrapper("urgent", gang("urgent", row, 2, 4), priority=5), required=RACK))
        aws.wait_state("urgent", "Running", timeout=90)
        assert placed(aws, "urgent", 2, names) == ["b0", "b1"]
        assert aws.status("low-c").get("state") == "Running"
        for name in ("low-b1", "low-b2"):
            assert aws.status(name).get("state") != "Running", name
            preempted = condition(aws.status(name), "PreemptCandidate")
            assert preempted is not None and "chosen for the least work lost: 2 AppWrapper(s)" in \
                preempted["message"], preempted


def test_a_gang_reserves_the_rack_that_frees_first_against_a_stream_of_small_appwrappers(
        controller_kubeconfig: str, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """rack-a and rack-c run hour-long AppWrappers; rack-b one that ends in a few seconds, on b0. A 2 x 4-cpu gang
    that requires a rack reserves rack-b (it lacks one pod's room there, two in rack-a and rack-c), and a stream of
    1-cpu AppWrappers that ask nothing of the topology keeps coming: none of them is bound in rack-b, though b1 is
    free all along, and the gang takes rack-b whole once b0 is free. The stream runs on d0 meanwhile."""
    with racked_nodes(core) as (names, row), running_controller(controller_kubeconfig, LOGS / "test_topology.log"):
        rack_b = {names["b0"], names["b1"]}
        aws.create(appwrapper("long", gang("long", row, 2, 4, rack="rack-a")))
        aws.create(appwrapper("big", gang("big", row, 1, 11, rack="rack-c")))
        aws.wait_pods("long", 2)
        aws.wait_pods("big", 1)
        aws.create(appwrapper("short", gang("short", row, 1, 4, rack="rack-b", run="8s")))
        aws.wait_pods("short", 1)
        aws.create(asking(appwrapper("gang", gang("gang", row, 2, 4)), required=RACK))
        landed: set[str] = set()
        n = 0

        def gang_runs() -> bool:
            nonlocal n
            name = f"stream-{n:02d}"  # the stream, one per poll, each running 3 s
            aws.create(appwrapper(name, gang(name, row, 1, 1, run="3s")))
            n += 1
            landed.update(p.metadata.name for p in core.list_namespaced_pod(aws.namespace).items
                          if p.spec.node_name in rack_b and p.metadata.name.startswith("stream-"))
            return aws.status("gang").get("state") == "Running"

        wait_until(gang_runs, 60, "the gang to start in rack-b")
        assert placed(aws, "gang", 2, names) == ["b0", "b1"]
        assert not landed, f"stream pods bound in the reserved rack: {sorted(landed)}"
        assert n >= 3, "the stream ran while the gang waited"


def test_a_reset_gang_goes_back_to_its_rack_though_a_fresh_placement_would_choose_another(
        controller_kubeconfig: str, aws: AppWrappers, core: k8s.CoreV1Api) -> None:
    """hold-a (4 cpu on a0) leaves rack-a room for one 3-cpu pod, so a 2 x 3-cpu gang that requires a rack starts
    in rack-b (2 cpu left; rack-c would leave 5). hold-a goes, then one of the gang's pods fails: its Job fails and
    the gang is reset. Dispatched again, rack-a and rack-b would each hold it with 2 cpu left, and a fresh placement
    takes the tie by value, rack-a: the gang goes back to rack-b, its home, whole."""
    with racked_nodes(core) as (names, row), running_controller(
            controller_kubeconfig, LOGS / "test_topology.log", *FAULT_ARGS):
        aws.create(appwrapper("hold-a", gang("hold-a", row, 1, 4, rack="rack-a")))
        aws.wait_pods("hold-a", 1)
        aws.create(annotated(asking(appwrapper("train", gang("train", row, 2, 3)), required=RACK),
                             {RETRY_PAUSE: "3s", RETRY_LIMIT: "3"}))
        first = aws.wait_pods("train", 2)
        assert placed(aws, "train", 2, names, first) == ["b0", "b1"]
        gone(aws, "hold-a")  # rack-a is empty again: as roomy as rack-b once the gang's pods go

        core.patch_namespaced_pod(first[0].metadata.name, aws.namespace,
                                  {"metadata": {"annotations": {EXIT_CODE: "1", FAIL_AFTER: "0s"}}})
        reset = wait_until(lambda: (s := aws.status("train")) and resets(s) and s, 45, "the gang's reset")
        assert resets(reset)[-1]["reason"] == "FailedComponent", resets(reset)
        old = {pod.metadata.uid for pod in first}

        def again() -> list[Any] | None:
            pods = [p for p in aws.pods("train", "Running") if p.metadata.uid not in old]
            return pods if len(pods) == 2 else None

        second = wait_until(again, 60, "the gang's two new pods Running")
        assert placed(aws, "train", 2, names, second) == ["b0", "b1"], "placed afresh, not in its home rack"
        assert aws.status("train").get("state") == "Running"
