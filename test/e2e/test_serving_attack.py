"""Serving that cannot be starved: against the real controller process and the real webhooks
the API server calls, an unauthenticated client holds 500 idle TLS connections to the webhook port, 64 slow-byte
connections to each port (one byte every 5 s) and 16 oversized forged AdmissionReviews (~5 MB, valid JSON, sent
again as soon as answered), for 30 s, while tenants create AppWrappers. Every legitimate create succeeds, every
refusal still refuses, /healthz answers every probe within 1 s, and the controller's RSS stays under 300 MiB and
comes back near its baseline. The numbers go to the test log and to .dev/serving-attack.json."""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from mcad.k8s import kube
from test import chart
from test.e2e import attack as load
from test.e2e.conftest import AppWrappers, Controller
from test.e2e.test_admission import Tenants, kubectl, wrapper
from test.escalations import deployment
from test.support import REPO, wait_until

# Three of the server's 10 s header timeouts: the slow connections are cut off and come back more than once, and the
# forged reviews go round dozens of times. Holding it for a minute is the benchmark's (test.perf's admission_attack).
ATTACK_SECONDS = 30
QUIET_CREATES = 20
MIB = 1024 * 1024
RSS_CEILING = 300 * MIB
# "Near its baseline" after the attack: what is left once the connections are gone and memory is handed back.
RSS_SLACK = 60 * MIB
HEALTH_BOUND_SECONDS = 1.0
REPORT = REPO / ".dev" / "serving-attack.json"


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def probe_health(host: str, port: int) -> float:
    """Seconds for one GET /healthz answered 200 (a failed probe is infinitely long)."""
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.settimeout(5)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    except OSError:
        return float("inf")
    return time.monotonic() - started if answer.startswith(b"HTTP/1.1 200") else float("inf")


def waiting_appwrapper(namespace: str, name: str) -> dict[str, Any]:
    """An AppWrapper that stays queued (it asks more cpu than any node has): admission is all it costs."""
    item = deployment()
    item["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1000"
    return wrapper(namespace, name, item)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_an_anonymous_flood_does_not_stall_admission_health_or_memory(
        controller: Controller, aws: AppWrappers, kubeconfig: str, tmp_path: Path, webhook_port: int) -> None:
    assert controller.proc is not None
    pid = controller.proc.pid
    tenants = Tenants(kubeconfig, aws.namespace, tmp_path)
    wait_until(lambda: kubectl(tenants.bob, "auth", None, "can-i", "create", "deployments.apps").stdout.strip()
               == "yes", 30, "bob's Role to count")
    bob = kube.connect(tenants.bob)
    path = f"/apis/workload.codeflare.dev/v1beta1/namespaces/{aws.namespace}/appwrappers"
    kube.request_json(bob, "POST", path, body=waiting_appwrapper(aws.namespace, "warm-up"))
    baseline = rss(pid)
    # The same creates, quiet: what the attack's latencies compare with.
    quiet: list[float] = []
    for n in range(QUIET_CREATES):
        started = time.monotonic()
        kube.request_json(bob, "POST", path, body=waiting_appwrapper(aws.namespace, f"quiet-{n:04d}"))
        quiet.append(time.monotonic() - started)
        time.sleep(max(0.0, started + 0.5 - time.monotonic()))

    with load.launched(["--webhook", f"{chart.webhook_host()}:{webhook_port}",
                        "--http", f"{controller.host.strip('[]')}:{controller.port}", "--seconds", str(ATTACK_SECONDS)],
                       cwd=REPO) as attack:
        assert load.ready(attack), "the attack could not open its idle connections"
        attack_started = time.monotonic()
        end = attack_started + ATTACK_SECONDS
        health: list[float] = []
        peak = [rss(pid)]
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                health.append(probe_health(controller.host.strip("[]"), controller.port))
                peak.append(rss(pid))
                stop.wait(0.5)
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        latencies: list[float] = []
        failures: list[str] = []
        refusals: list[str] = []
        n = 0
        while time.monotonic() < end:
            n += 1
            started = time.monotonic()
            try:
                kube.request_json(bob, "POST", path, body=waiting_appwrapper(aws.namespace, f"legit-{n:04d}"))
                latencies.append(time.monotonic() - started)
            except kube.ApiError as err:
                failures.append(f"legit-{n:04d}: {err}")
            if n % 10 == 0:
                # A tenant with AppWrapper rights only is still refused, with the reason, not an internal error.
                proc = kubectl(tenants.alice, "create", wrapper(aws.namespace, f"escalate-{n}", deployment()))
                refusals.append(proc.stderr.strip())
            time.sleep(max(0.0, started + 0.5 - time.monotonic()))
        stop.set()
        prober.join(10)
        counts = load.counts(attack)

    # After: the connections close, memory goes back near the baseline.
    def settled() -> int | None:
        now = rss(pid)
        return now if now < baseline + RSS_SLACK else None
    try:
        after = wait_until(settled, 60, "the controller's RSS to come back near its baseline")
    except AssertionError:
        after = rss(pid)
    scraped = controller.get("/metrics")[1]
    report = {
        "quiet_p50_ms": round(1000 * statistics.median(quiet), 1),
        "quiet_p99_ms": round(1000 * percentile(quiet, 0.99), 1),
        "creates": len(latencies), "create_failures": failures[:5], "create_failed": len(failures),
        "admission_p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "admission_p99_ms": round(1000 * percentile(latencies, 0.99), 1) if latencies else None,
        "admission_max_ms": round(1000 * max(latencies), 1) if latencies else None,
        "health_probes": len(health), "health_max_ms": round(1000 * max(health), 1) if health else None,
        "health_p50_ms": round(1000 * statistics.median(health), 1) if health else None,
        "rss_baseline_mib": round(baseline / MIB, 1), "rss_peak_mib": round(max(peak) / MIB, 1),
        "rss_after_mib": round(after / MIB, 1), "attack": counts,
        "http_metrics": [line for line in scraped.splitlines() if line.startswith("mcad_http_")],
    }
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2))
    print("\nserving under attack:", json.dumps(report, indent=2))

    assert counts.get("big_200", 0) + counts.get("big_503", 0) > 0, "the forged reviews never got through"
    assert not failures, failures[:5]
    assert len(latencies) >= ATTACK_SECONDS, "too few creates to say anything"
    assert refusals and all(f'user "{tenants.user("alice")}" may not create deployments' in r for r in refusals), \
        refusals
    assert len(health) >= ATTACK_SECONDS, "too few health probes"
    assert max(health) < HEALTH_BOUND_SECONDS, sorted(health)[-5:]
    assert max(peak) < RSS_CEILING, f"peak RSS {max(peak) / MIB:.0f} MiB"
    assert after < baseline + RSS_SLACK, f"RSS {after / MIB:.0f} MiB after, baseline {baseline / MIB:.0f} MiB"
