"""The API server's own CPU per AppWrapper create and per status write, with each of the chart's in-process admission
pieces registered alone: where the admission's cost on the API server goes, apart from the call itself.

The pieces, as ``test.perf.webhooks`` renders them from the chart with ``webhook.creator=policy``:

- ``creator-policy``: the MutatingAdmissionPolicy and its binding that record each AppWrapper's creator; every create
  is mutated by it (the API server evaluates its CEL and applies its JSON patch).
- ``status-rule``: the ValidatingWebhookConfiguration reduced to its ``status.`` webhook. The writer here is the
  cluster admin, whom the rendered ``matchConditions`` leave out as the chart leaves out the controller, so nothing
  is called: what is measured is the API server deciding not to call, on every status write of the controller.

- ``validating-call``: the ValidatingWebhookConfiguration reduced to its ``validate.`` webhook, pointed at mcad's own
  webhook server (``mcad.admission.server.WebhookServer``, TLS, keep-alive) run in this process with a reviewer that
  allows everything: what calling the webhook on every create costs the API server (the AdmissionReview built and
  sent, the answer read), whatever the review decides. The server's own CPU is this process's, not counted.

``make bench`` scenario ``throughput_webhooks`` measures the whole; this, the parts that cost the API server.

Method: a fresh local cluster (``hack/localcluster.py``, no nodes), ``--requests`` AppWrappers created (or status
writes) from ``--threads`` threads per measurement. A measurement's figure is (the API server's CPU during the
requests, utime+stime from /proc, less its idle rate measured just before times their duration) / requests. Each
round measures every variant once, in an order rotated from round to round (the cost of a request drifts up as
objects accumulate), and a variant's figure is the median over the rounds. Nothing is asserted about a timing;
four checks keep a figure from meaning something else: before each measurement a dry run shows that the API
server applies the pieces just registered (or has let go of the ones just removed: its informers take a moment),
the policy's creates carry the creator annotation, every create of the validating variant reached the webhook
server, and the writer's status writes go through the status rule without a call (its URL is a closed port: a
call would fail the write)::

    python -m test.perf.admission_cost                                   # 2,000 requests, 3 rounds
    python -m test.perf.admission_cost --requests 50 --rounds 1 --output admission-cost.json
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcad.admission import certs
from mcad.admission.request import AdmissionRequest, Outcome
from mcad.admission.server import WebhookServer, max_body_bytes
from mcad.api.validation import DEFAULT_MAX_BYTES
from test.perf import webhooks
from test.perf.client import Api, ApiError, Obj
from test.perf.harness import (
    BenchError,
    Cluster,
    aw_path,
    create_namespace,
    install_crd,
    run_parallel,
    say,
    wait_for,
)
from test.perf.scenarios import throughput_body

CLUSTER = "bench-admission-cost"
CLOSED_PORT = 9  # the discard port: nothing listens there, so a webhook call fails the request
IDLE_SAMPLE_S = 4.0
EFFECT_TIMEOUT_S = 60.0  # for the API server to apply a piece registered or removed (its informers see it)
PROBE_USER = ("admission-cost-probe", "system:masters")  # not the writer the status rule leaves out


@dataclass(frozen=True)
class Measurement:
    name: str  # "<request>/<variant>"
    pieces: tuple[Obj, ...]  # registered for this measurement only
    request: str  # "create" or "status"


def _allow(_request: AdmissionRequest) -> Outcome:
    return Outcome.allow()


class AllowingWebhook:
    """mcad's webhook server on a free port of ``webhooks.HOST``, allowing every request; counts what it served."""

    def __init__(self) -> None:
        material = certs.issue([webhooks.HOST], datetime.datetime.now(datetime.UTC))
        context = certs.server_context(material.cert, material.key)
        self.ca_bundle = material.ca_bundle
        self.server = WebhookServer(f"{webhooks.HOST}:0", tls=lambda: context, mutate=_allow, validate=_allow,
                                    max_body_bytes=max_body_bytes(DEFAULT_MAX_BYTES))

    def __enter__(self) -> AllowingWebhook:
        self.server.start()
        if not self.server.listening.wait(10):
            raise BenchError("the webhook server did not start listening within 10 s")
        return self

    def __exit__(self, *_: object) -> None:
        self.server.stop()

    @property
    def served(self) -> int:
        return self.server.stats.requests


def pieces(api: Api, webhook: AllowingWebhook) -> dict[str, tuple[Obj, ...]]:
    """The chart's creator policy (with its binding), its status rule and its validating webhook (pointed at
    ``webhook``), rendered for the cluster admin."""
    rendered = webhooks.rendered(CLOSED_PORT, webhooks.username(api), "policy")
    policy = tuple(obj for obj in rendered if obj["kind"] in webhooks.POLICIES)
    configuration = next(obj for obj in rendered if obj["kind"] == "ValidatingWebhookConfiguration")

    def only(prefix: str) -> list[Obj]:
        return [hook for hook in configuration["webhooks"] if hook["name"].startswith(prefix)]
    status_only = {**configuration, "webhooks": only("status.")}
    validate = [{**hook, "clientConfig": {"url": f"https://{webhooks.HOST}:{webhook.server.port}/validate",
                                          "caBundle": base64.b64encode(webhook.ca_bundle).decode()}}
                for hook in only("validate.")]
    validate_only = {**configuration, "webhooks": validate}
    if len(policy) != 2 or len(status_only["webhooks"]) != 1 or len(validate) != 1:
        raise BenchError("the chart no longer renders one creator policy with its binding, one status webhook and "
                         "one validating webhook for AppWrappers")
    return {"creator-policy": policy, "status-rule": (status_only,), "validating-call": (validate_only,)}


class Run:
    def __init__(self, cluster: Cluster, api: Api, requests: int, threads: int, webhook: AllowingWebhook) -> None:
        self.cluster, self.api, self.requests, self.threads = cluster, api, requests, threads
        self.webhook = webhook
        self.user = webhooks.username(api)
        self.created = 0
        self.status_targets: list[str] = []
        self.probe = Api(cluster.kubeconfig, pool_size=2, impersonate=PROBE_USER)

    def apiserver_cpu(self) -> float:
        return self.cluster.cpu_seconds()["kube-apiserver"]

    def timed(self, action: Callable[[str], None], names: list[str]) -> dict[str, float]:
        before = self.apiserver_cpu()
        time.sleep(IDLE_SAMPLE_S)
        idle_rate = (self.apiserver_cpu() - before) / IDLE_SAMPLE_S
        before = self.apiserver_cpu()
        started = time.monotonic()
        run_parallel(action, names, self.threads)
        duration = time.monotonic() - started
        used = self.apiserver_cpu() - before
        return {"ms_per_request": round((used - idle_rate * duration) / len(names) * 1000, 3),
                "apiserver_cpu_s": round(used, 2), "duration_s": round(duration, 2),
                "idle_cpu_per_s": round(idle_rate, 4)}

    def create(self, name: str) -> None:
        self.api.create(aw_path(), throughput_body(name))

    def write_status(self, name: str) -> None:
        # A new message each time: a write that changes nothing would be cheaper than the controller's.
        self.api.request("PATCH", aw_path(name) + "/status",
                         {"status": {"state": "Running", "message": f"admission cost {time.time_ns()}"}},
                         content_type="application/merge-patch+json")

    def names(self, count: int) -> list[str]:
        first, self.created = self.created, self.created + count
        return [f"ac-{i:06d}" for i in range(first, self.created)]

    def measure(self, measurement: Measurement) -> dict[str, float]:
        for obj in measurement.pieces:
            self.api.apply(webhooks.admission_path(obj), obj, "mcad-bench")
        try:
            policy, called = _has_policy(measurement.pieces), _calls_webhook(measurement.pieces)
            if measurement.request == "create":
                self.wait_create_effective(policy, called)
                names = self.names(self.requests)
                served = self.webhook.served
                figures = self.timed(self.create, names)
                if policy:
                    self.check_creator(names[-1])
                if called and self.webhook.served - served < len(names):
                    raise BenchError(f"{measurement.name}: the webhook served {self.webhook.served - served} of "
                                     f"{len(names)} creates")
            else:
                self.wait_status_rule_effective(bool(measurement.pieces))
                figures = self.timed(self.write_status, self.status_targets)
        finally:
            for obj in measurement.pieces:
                self.api.delete(webhooks.admission_path(obj))
        return figures

    def wait_create_effective(self, policy: bool, called: bool) -> None:
        """Until a dry-run create shows the creator policy applied (``policy``) or gone, and the validating webhook
        called (``called``) or not: no figure mixes creates from before and after a piece came or went."""
        def effective() -> bool:
            served = self.webhook.served
            made = self.api.request("POST", aw_path(), throughput_body("ac-probe"), query={"dryRun": "All"})
            annotations = made.get("metadata", {}).get("annotations") or {}
            return ((annotations.get(webhooks.CREATOR_ANNOTATION) == self.user) == policy
                    and (self.webhook.served > served) == called)
        wait_for(effective, EFFECT_TIMEOUT_S, f"the creator policy {'applied' if policy else 'gone'} and the "
                 f"validating webhook {'called' if called else 'not called'}")

    def wait_status_rule_effective(self, registered: bool) -> None:
        """Until the API server applies the status rule just registered (``registered``), or has let go of the one
        just removed, as a dry run shows: no figure mixes requests from before and after."""
        def called() -> bool:
            # Another user's status write goes to the webhook, whose URL is a closed port: refused once the rule
            # is in force, admitted (a dry run: nothing is written) once it is gone.
            try:
                self.probe.request("PATCH", aw_path(self.status_targets[0]) + "/status",
                                   {"status": {"message": "admission cost probe"}}, query={"dryRun": "All"},
                                   content_type="application/merge-patch+json")
            except ApiError as err:
                if err.status < 500:
                    raise
                return registered
            return not registered
        wait_for(called, EFFECT_TIMEOUT_S, f"the status rule to be {'in force' if registered else 'gone'}")

    def check_creator(self, name: str) -> None:
        annotations = self.api.get(aw_path(name))["metadata"].get("annotations") or {}
        if annotations.get(webhooks.CREATOR_ANNOTATION) != self.user:
            raise BenchError(f"the creator policy did not record the creator of {name}: {annotations}")


def _has_policy(objs: tuple[Obj, ...]) -> bool:
    return any(obj["kind"] in webhooks.POLICIES for obj in objs)


def _calls_webhook(objs: tuple[Obj, ...]) -> bool:
    return any(hook["name"].startswith("validate.") for obj in objs for hook in obj.get("webhooks") or [])


def measurements(found: dict[str, tuple[Obj, ...]]) -> list[Measurement]:
    return [Measurement("create/none", (), "create"),
            Measurement("create/creator-policy", found["creator-policy"], "create"),
            Measurement("create/validating-call", found["validating-call"], "create"),
            Measurement("status/none", (), "status"),
            Measurement("status/status-rule", found["status-rule"], "status")]


def summarize(rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    medians = {name: statistics.median(r["ms_per_request"] for r in runs) for name, runs in rounds.items()}
    return {"ms_per_request": {name: round(value, 3) for name, value in medians.items()},
            "added_ms_per_request": {
                "creator-policy": round(medians["create/creator-policy"] - medians["create/none"], 3),
                "validating-call": round(medians["create/validating-call"] - medians["create/none"], 3),
                "status-rule": round(medians["status/status-rule"] - medians["status/none"], 3)},
            "rounds": rounds}


def table(summary: dict[str, Any]) -> str:
    lines = ["API server CPU per request (ms, median over rounds)", ""]
    for name, value in summary["ms_per_request"].items():
        lines.append(f"  {name:24s} {value:7.3f}")
    lines.append("")
    for piece, value in summary["added_ms_per_request"].items():
        lines.append(f"  {piece} adds {value:+.3f} ms per request")
    return "\n".join(lines)


def run(requests: int, rounds: int, threads: int) -> dict[str, Any]:
    cluster = Cluster(CLUSTER)
    say(f"admission cost: bringing up cluster {CLUSTER}")
    cluster.up()
    try:
        api = Api(cluster.kubeconfig, pool_size=max(32, threads * 2))
        install_crd(api)
        create_namespace(api)
        create_namespace(api, webhooks.NAMESPACE)
        with AllowingWebhook() as webhook:
            measuring = Run(cluster, api, requests, threads, webhook)
            measuring.status_targets = measuring.names(requests)
            run_parallel(measuring.create, measuring.status_targets, threads)
            order = measurements(pieces(api, webhook))
            results: dict[str, list[dict[str, float]]] = {m.name: [] for m in order}
            for index in range(rounds):
                rotated = order[index % len(order):] + order[:index % len(order)]
                for measurement in rotated:
                    figures = measuring.measure(measurement)
                    results[measurement.name].append(figures)
                    say(f"round {index + 1}/{rounds} {measurement.name}: {figures['ms_per_request']:.3f} ms per "
                        "request")
        summary = summarize(results)
        summary["params"] = {"requests": requests, "rounds": rounds, "threads": threads}
        return summary
    finally:
        cluster.down()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m test.perf.admission_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, metavar="N",
                        help="creates (or status writes) per measurement (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, metavar="R",
                        help="rounds of every measurement, in a rotated order; the median is reported (default 3)")
    parser.add_argument("--threads", type=int, default=16, metavar="T", help="client threads (default 16)")
    parser.add_argument("--output", type=Path, metavar="FILE", help="also write the figures there as JSON")
    args = parser.parse_args(argv)
    for name in ("requests", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary = run(args.requests, args.rounds, args.threads)
    except (BenchError, ApiError) as err:
        print(f"admission cost: {err}", file=sys.stderr)
        return 1
    print(table(summary))
    if args.output is not None:
        args.output.write_text(json.dumps(summary, indent=2) + "\n")
        say(f"figures in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
