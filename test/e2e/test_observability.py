"""The controller's HTTP endpoint against a real cluster: health, readiness, Prometheus metrics, and the /debug
documents mcadctl prints. The controller runs as the chart's ServiceAccount, like every e2e controller."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes.client as k8s

from test.e2e.conftest import AppWrappers, Controller, appwrapper, blocked_on, deployment_item, free_cpu_millis
from test.support import wait_until


def sample(metrics: str, name: str, **labels: str) -> float | None:
    """One sample's value from the Prometheus text format."""
    rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name + (f"{{{rendered}}}" if labels else "")) + r" ([0-9.e+-]+)$"
    found = re.search(pattern, metrics, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_health_and_readiness_answer_once_the_informers_have_synced(controller: Controller) -> None:
    assert controller.get("/healthz") == (200, "ok\n")
    assert controller.get("/readyz") == (200, "ok\n")
    assert controller.get("/nope")[0] == 404


def test_metrics_and_debug_documents_describe_the_queue(controller: Controller, aws: AppWrappers,
                                                         core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("fits", deployment_item("fits", 1, "100m")))
    too_big = f"{free // 1000 + 64}"
    aws.create(appwrapper("too-big", deployment_item("too-big", 1, too_big)))
    aws.wait_state("fits", "Running")
    aws.wait_state("too-big", "Pending")

    def scraped() -> str | None:
        code, text = controller.get("/metrics")
        assert code == 200
        # The loop's own state (its queue, its ledger) is what it published last: at most PUBLISH_INTERVAL_SECONDS
        # behind its decisions; AppWrappers by state come from the informer's store at scrape time.
        published = (sample(text, "mcad_queue_length", state="queued") or 0) >= 1
        return text if published and (sample(text, "mcad_appwrappers", state="Pending") or 0) >= 1 else None

    text = wait_until(scraped, 10, "a scrape showing the published state")
    assert sample(text, "mcad_build_info", version=__import__("mcad").__version__) == 1
    assert sample(text, "mcad_leader") == 1
    assert (sample(text, "mcad_dispatch_decisions_total", decision="dispatched") or 0) >= 1
    assert (sample(text, "mcad_dispatch_decisions_total", decision="queued") or 0) >= 1
    assert (sample(text, "mcad_dispatch_latency_seconds_count") or 0) >= 1
    assert (sample(text, "mcad_dispatch_cycle_duration_seconds_count") or 0) >= 1
    assert (sample(text, "mcad_appwrappers", state="Pending") or 0) >= 1
    assert (sample(text, "mcad_queue_length", state="queued") or 0) >= 1
    assert (sample(text, "mcad_capacity", resource="cpu") or 0) >= free / 1000
    assert sample(text, "mcad_informer_synced", informer="appwrappers") == 1
    assert sample(text, "mcad_capacity_free", resource="cpu") is not None

    code, body = controller.get("/debug/queue")
    assert code == 200
    queue: dict[str, Any] = json.loads(body)
    mine = [q for q in queue["queued"] if q["namespace"] == aws.namespace]
    assert [q["name"] for q in mine] == ["too-big"]
    assert mine[0]["fitsNow"] is False and blocked_on(mine[0]["why"], "cpu"), mine[0]["why"]
    assert mine[0]["demand"]["cpu"] == too_big
    running = [d for d in queue["dispatched"] if d["namespace"] == aws.namespace]
    assert [(d["name"], d["state"]) for d in running] == [("fits", "Running")]

    code, body = controller.get(f"/debug/explain?namespace={aws.namespace}&name=too-big")
    assert code == 200
    explained = json.loads(body)
    assert explained["summary"].startswith("It is queued and cannot be dispatched yet: ")
    code, body = controller.get(f"/debug/explain?namespace={aws.namespace}&name=absent")
    assert code == 404 and "not found" in json.loads(body)["error"]

    code, body = controller.get("/debug/ledger")
    assert code == 200
    ledger = json.loads(body)
    assert any(r["name"] == "cpu" for r in ledger["resources"])
    assert ledger["nodes"], "the per-node table lists the cluster's nodes"


def test_decisions_show_as_events_on_the_appwrapper(controller: Controller, aws: AppWrappers,
                                                     core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("runs", deployment_item("runs", 1, "100m")))
    aws.create(appwrapper("waits", deployment_item("waits", 1, f"{free // 1000 + 64}")))

    def reasons(name: str) -> dict[str, Any] | None:
        found = core.list_namespaced_event(aws.namespace, field_selector=f"involvedObject.name={name}").items
        by_reason = {e.reason: e for e in found if e.involved_object.kind == "AppWrapper"}
        return by_reason or None

    runs = wait_until(lambda: (r := reasons("runs")) and "Dispatched" in r and r, 30, "a Dispatched event")
    assert runs["Dispatched"].type == "Normal" and runs["Dispatched"].reporting_component == "mcad-controller"
    waits = wait_until(lambda: (r := reasons("waits")) and "Queued" in r and r, 30, "a Queued event")
    assert waits["Queued"].message.startswith("Waiting: ") and "position" not in waits["Queued"].message
    assert "Dispatched" not in waits


def test_single_cluster_mode_runs_nothing_of_hub_mode(controller: Controller) -> None:
    """Without --clusters-config: no worker informers (no extra watches), no hub thread, no cluster metrics."""
    status, body = controller.get("/debug/clusters")
    assert status == 200 and json.loads(body)["mode"] == "single" and json.loads(body)["clusters"] == []
    metrics = controller.get("/metrics")[1]
    assert "mcad_cluster_" not in metrics
    informers = set(re.findall(r'^mcad_informer_synced\{informer="([^"]+)"\}', metrics, re.MULTILINE))
    assert {"appwrappers", "nodes", "pods"} <= informers
    assert not {i for i in informers if i.endswith(("-nodes", "-pods"))}, informers
    log = controller.log.read_text()
    assert "hub mode" not in log and "worker cluster" not in log
