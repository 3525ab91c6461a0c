"""`make bench-installed`: what the installation costs next to a local process, on this machine.

Figures (nothing is asserted about a timing; each is printed and written to ``--output``):

- ``pod_start_to_ready_s``: for each controller pod of the e2e cluster (hack/e2ecluster.py, brought up by
  `make e2e-up`), its creation to its Ready condition, from the API's own timestamps (1 s resolution).
- ``admission``: the latency of AppWrapper creates (dry runs: both webhooks review them, nothing is stored),
  ``--threads`` closed-loop clients for ``--seconds``, p50 and p99, against (1) the installation, whose webhooks
  the API server reaches through the Service (kube-proxy, TLS to a pod on the real node), and (2) mcad-controller
  as a local process on a fresh loopback cluster with the same chart configurations registered by URL
  (``test.perf.webhooks``), as `make test`, the demos and the benches run it. Same load, same machine, one after
  the other.

    python -m test.perf.installed                     # 20 s per side, 4 clients
    python -m test.perf.installed --seconds 60 --output installed.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from test.perf import harness
from test.perf import webhooks as webhooks_mod
from test.perf.client import Api, ApiError
from test.perf.harness import BenchError, say
from test.support import REPO, load_hack_module

e2ecluster = load_hack_module("e2ecluster")


def stamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def pod_starts(api: Api) -> list[float]:
    selector = "app.kubernetes.io/instance=mcad,app.kubernetes.io/component=controller"
    pods = api.request("GET", f"/api/v1/namespaces/{e2ecluster.CHART_NAMESPACE}/pods",
                       query={"labelSelector": selector})["items"]
    starts = []
    for pod in pods:
        ready = next((c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"
                      and c["status"] == "True"), None)
        if ready:
            starts.append((stamp(ready["lastTransitionTime"]) - stamp(pod["metadata"]["creationTimestamp"]))
                          .total_seconds())
    return starts


def dry_run_load(api: Api, namespace: str, seconds: float, threads: int) -> dict[str, Any]:
    """Closed-loop dry-run creates: latencies of those admitted (``harness.summary``, in ms); refusals counted."""
    body = harness.appwrapper("bench-dry-run", [harness.configmap_item("bench-dry-run", {"cpu": "10m"})])
    latencies: list[float] = []
    refused: list[str] = []
    deadline = time.monotonic() + seconds
    lock = threading.Lock()

    def client() -> None:
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                api.request("POST", harness.aw_path(namespace=namespace), body, query={"dryRun": "All"})
            except ApiError as err:
                with lock:
                    refused.append(str(err)[:200])
                continue
            with lock:
                latencies.append(time.perf_counter() - start)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {"requests": len(latencies), "refused": len(refused), "refusals": refused[:3],
            "per_second": round(len(latencies) / seconds, 1), "latency": harness.summary(latencies)}


def installed_side(seconds: float, threads: int) -> dict[str, Any]:
    layout = load_hack_module("localcluster").Layout(e2ecluster.DEFAULT_NAME)
    if not layout.kubeconfig.exists():
        raise BenchError("the e2e cluster is not up: run make e2e-up first (as root)")
    api = Api(str(layout.kubeconfig), pool_size=threads * 2)
    harness.create_namespace(api)
    starts = pod_starts(api)
    say(f"installation: {threads} clients for {seconds:g} s through the Service")
    return {"pod_start_to_ready_s": starts, "admission": dry_run_load(api, harness.NAMESPACE, seconds, threads)}


def local_side(seconds: float, threads: int) -> dict[str, Any]:
    cluster = harness.Cluster("bench-installed-local")
    ctl = None
    try:
        cluster.up()
        api = Api(cluster.kubeconfig, pool_size=threads * 2)
        harness.install_crd(api)
        harness.create_namespace(api)
        port, http_port = webhooks_mod.free_port(), webhooks_mod.free_port()
        args = webhooks_mod.register(api, port)
        ctl = harness.Controller(cluster.kubeconfig, "installed-local-process",
                                 args=(*args, "--http-bind-address", f"127.0.0.1:{http_port}"))
        ctl.start()
        webhooks_mod.wait_admitting(api, f"http://127.0.0.1:{http_port}/readyz", ctl.check_alive)
        say(f"local process: {threads} clients for {seconds:g} s, webhooks registered by URL")
        return {"admission": dry_run_load(api, harness.NAMESPACE, seconds, threads)}
    finally:
        if ctl is not None:
            ctl.stop()
        cluster.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m test.perf.installed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="seconds of load per side (default %(default)s)")
    parser.add_argument("--threads", type=int, default=4, help="closed-loop clients (default %(default)s)")
    parser.add_argument("--output", type=Path, default=REPO / "bench-installed.json")
    args = parser.parse_args(argv)
    try:
        result = {"installed": installed_side(args.seconds, args.threads),
                  "local_process": local_side(args.seconds, args.threads),
                  "seconds": args.seconds, "threads": args.threads}
    except BenchError as err:
        say(f"error: {err}")
        return 1
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    for side in ("installed", "local_process"):
        figures = result[side]["admission"]
        latency = figures["latency"]
        say(f"{side}: {figures['per_second']} creates/s, p50 {latency.get('p50_ms')} ms, "
            f"p99 {latency.get('p99_ms')} ms, "
            f"{figures['refused']} refused")
    say(f"controller pods, creation to Ready: {result['installed']['pod_start_to_ready_s']} s; {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
