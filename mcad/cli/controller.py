"""``mcad-controller``: the controller process.
Over 600 lines because it declares every flag with its help text (about 300 lines of click options) and runs the
process (webhooks, HTTP, leader election, shutdown); ``main`` itself is a short story: parse the flags into settings
groups (``mcad.settings``), connect, build, run. ``run`` is one too, each step a function of at most 60 lines: settle
the API settings, build the hub and the dispatcher, serve admission and metrics, install the signal handlers, start,
run (alone or elected), shut down in order.

Contract: parses flags into typed, frozen settings groups (``mcad.settings``; one parser per group in
``mcad.cli.settingsflags``, each refusing what does not hold together as a usage error), configures logging,
connects to the API server and checks that the AppWrapper CRD is served (exit code 2 with a one-line reason when
either fails), then runs the informers and the dispatcher until SIGTERM or SIGINT and exits 0. ``--connect-only``
exits right after the checks, which is what a pre-flight check or a smoke test wants. Fault tolerance flags that do
not hold together (``mcad.cli.faultflags``) are a usage error (exit code 2) before anything else; they reach the
dispatcher and admission alike.

Every replica, leader or standby, serves the AppWrapper admission webhooks over HTTPS (``--webhook*``; see
``mcad.admission.server`` and ``mcad.admission.certs``), from before leader election until it exits; /readyz waits
for their certificate. Before serving, it learns its own username (SelfSubjectReview; exit code 2 when it cannot):
with ``--status-writer``'s, the only users whose writes of AppWrapper status admission lets through.
Who may call them (``--webhook-client-ca``, ``--webhook-token-file``: off by default), which addresses are the
API server's (``--api-server-cidrs``: its own SubjectAccessReview total, and refusals logged one by one) and what
any caller may cost (``--webhook-access-reviews-*``, ``--unknown-tokens-*``: always bounded) are
``mcad.admission.callers``'s; refusals are counted in ``mcad_caller_refusals_total``.

With ``--leader-elect`` several replicas may run: every replica starts its informers at once (a standby keeps
warm caches, so it takes over fast), but only the holder of the Lease runs the dispatcher (``mcad.k8s.leader``).
A replica that loses leadership exits with code 1 at once, before it could write anything more (it may already
have been replaced). SIGTERM while leading stops the dispatcher, releases the Lease so a standby takes over at
its next poll, and exits 0.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

import click
import structlog

from mcad import __version__
from mcad import log as mcad_log
from mcad.admission import callers
from mcad.admission import certs as webhook_certs
from mcad.admission import review as admission_review
from mcad.admission import server as webhook_server
from mcad.admission.facts import FactUnavailable
from mcad.admission.kubefacts import KubeFacts, own_username
from mcad.api import minruntime
from mcad.api.appwrapper import GROUP, KIND, LEGACY_GROUP, VERSION
from mcad.api.faulttolerance import DEFAULTS as FAULT_DEFAULTS
from mcad.api.faulttolerance import FaultDefaults, format_duration
from mcad.api.validation import DEFAULT_MAX_BYTES, DEFAULT_MAX_ITEMS, MAX_ITEMS_CEILING, Limits
from mcad.cli import faultflags
from mcad.cli.heap import StartupHeap
from mcad.cli.settingsflags import (
    admission_settings,
    api_server_networks,
    api_settings,
    hub_settings,
    leader_election_settings,
    scheduling_settings,
    serving_settings,
)
from mcad.clock import Clock, RealClock
from mcad.errors import ApiError, KubeConnectError
from mcad.hub.clusters import WorkerConnector
from mcad.hub.connections import DEFAULT_PROBE_PERIOD_SECONDS, Hub
from mcad.hub.placement import Policy
from mcad.k8s import events, kube
from mcad.k8s.informer import Informer
from mcad.k8s.leader import LeaderElector, default_identity, default_namespace
from mcad.k8s.leaderpod import LeaderPodLabel
from mcad.k8s.nodelabels import NodeLabelKeys
from mcad.k8s.recentevents import RecentEvents
from mcad.loop.dispatcher import Dispatcher
from mcad.loop.evictions import (
    DEFAULT_MAX_EVICTIONS_PER_MINUTE,
    DEFAULT_PREEMPTION_BACKOFF_SECONDS,
    DEFAULT_PREEMPTION_COOLDOWN_SECONDS,
)
from mcad.loop.pinning import PLACEMENT_MODES
from mcad.model import tenancy
from mcad.model.reservations import DEFAULT_RESERVATIONS
from mcad.serve import endpointauth, server
from mcad.serve.debug import Reports
from mcad.serve.endpointauth import ApiReviews, Gate
from mcad.serve.history import SAMPLE_INTERVAL_SECONDS, MetricsHistory
from mcad.settings import (
    DEFAULT_BACKOFF_STATUS_RATE,
    DEFAULT_CYCLE_INTERVAL_SECONDS,
    DEFAULT_VICTIM_TIMEOUT_SECONDS,
    AdmissionSettings,
    ApiSettings,
    HubSettings,
    LeaderElectionSettings,
    SchedulingSettings,
    ServingSettings,
)
from mcad.wiring import BACKOFF_STATUS_BURST, FIT_MODES, build, quota_served

# glibc gives each thread that allocates its own malloc arena (up to 8 per core), and memory freed in one arena
# serves only that arena: with 32 writers and the informers' threads parsing events, the controller's RSS grew
# 2,653 bytes per queued AppWrapper, against 2,254 with two arenas (make bench, memory scenario, 10,000 queued).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


# Long enough for an endpoint change to reach kube-proxy and the API server on a busy cluster (kube-proxy syncs at
# most once a second by default), short against the chart's 30 s termination grace period.
DEFAULT_WEBHOOK_DRAIN_SECONDS = 5.0


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas, as MALLOC_ARENA_MAX would (which, set in the environment, wins). Call before
    threads start. False where there is no glibc (musl, macOS): nothing to do there."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


# The namespace config/rbac/worker.yaml gives a worker's ServiceAccount and its token.
WORKER_NAMESPACE = "mcad-system"


def protected_namespaces(own: str, allowed: tuple[str, ...] = (), *, hub: bool = False) -> frozenset[str]:
    """Where the controller creates nothing: the cluster's own namespaces (``SYSTEM_NAMESPACES``), its own
    namespace (its credentials, its Lease) and, in hub mode, the workers' (their credentials), except those the
    admin ``allowed``."""
    protected = {*admission_review.SYSTEM_NAMESPACES, own} | ({WORKER_NAMESPACE} if hub else set())
    return frozenset(protected - set(allowed))


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Kubeconfig file. Default: $KUBECONFIG, else the in-cluster service account, else ~/.kube/config.")
@click.option("--context", default=None, help="Kubeconfig context to use (default: its current-context).")
@click.option("--strict-fifo", is_flag=True,
              help="Dispatch strictly in order per quota node: an AppWrapper its quota node cannot take holds "
                   "back the later ones charged at that node (or below it); one waiting for the cluster's room "
                   "holds back every one behind it; one that could never run holds nobody. Default: best-effort "
                   "FIFO, where later AppWrappers that fit go ahead of a blocked one.")
@click.option("--reservations", type=click.IntRange(min=0, max=1000), default=DEFAULT_RESERVATIONS,
              help="How many blocked AppWrappers (the first in dispatch order that wait for room) hold a "
                   "reservation at once: the nodes their pods would pack onto once running work ends (with "
                   "--fit=aggregate, an amount). Later AppWrappers may not use reserved room, unless their "
                   "schedulingSpec.dispatchDuration.limit proves they end before the reserved one could start "
                   "(backfill). This keeps small AppWrappers from starving a big gang. 0: best-effort FIFO, any "
                   "later AppWrapper that fits goes ahead.")
@click.option("--preemption", is_flag=True,
              help="Let a queued AppWrapper that does not fit evict running AppWrappers of strictly lower "
                   "priority when that makes it fit: the lowest priorities first, then the choice that loses the "
                   "least work (run time so far times GPUs, else cpu), then the fewest. Victims go back to the "
                   "queue.")
@click.option("--preemption-victim-timeout", "victim_timeout", type=click.FloatRange(min=1),
              default=DEFAULT_VICTIM_TIMEOUT_SECONDS,
              help="Seconds an AppWrapper that preempted others (priority preemption or quota reclaim) waits for "
                   "their pods to go while holding the queue. Then it force-deletes those whose grace period is "
                   "over, stops holding the queue and says so: a pod finalizer or a process ignoring SIGTERM must "
                   "not hold everything behind it for ever.")
@click.option("--preemption-backoff", "preemption_backoff", type=click.FloatRange(min=0),
              default=DEFAULT_PREEMPTION_BACKOFF_SECONDS,
              help="Seconds an AppWrapper whose preemption victims went (or were given up on) and that still did "
                   "not run must wait before it evicts anyone again (priority preemption or quota reclaim); "
                   "doubles each round up to 16 times this, and resets once it runs. Its status says so. 0: none.")
@click.option("--preemption-max-evictions-per-minute", "max_evictions_per_minute", type=click.IntRange(min=0),
              default=DEFAULT_MAX_EVICTIONS_PER_MINUTE,
              help="At most this many AppWrappers are evicted in any minute, by all preemptors and quota "
                   "reclaims together; a preemptor held back by it says so in its status. One round larger than "
                   "this goes only after a minute with no eviction. 0: no bound.")
@click.option("--preemption-min-runtime", "min_runtime", type=faultflags.DURATION,
              default=format_duration(minruntime.DEFAULT.default),
              help="How long after its dispatch an AppWrapper is no priority preemption victim, when it sets no "
                   f"{minruntime.MIN_RUNTIME} annotation (quota reclaim does not wait for it). A Go duration "
                   "(90s, 5m, 1h30m); 0s: no minimum.")
@click.option("--preemption-min-runtime-ceiling", "min_runtime_ceiling", type=faultflags.DURATION,
              default=format_duration(minruntime.DEFAULT_CEILING),
              help=f"The longest minimum run time an AppWrapper may ask for ({minruntime.MIN_RUNTIME}): a longer "
                   "annotation is refused at admission, and one stored before is cut to this. At least "
                   "--preemption-min-runtime. A Go duration.")
@click.option("--preemption-cooldown", "preemption_cooldown", type=faultflags.DURATION,
              default=format_duration(DEFAULT_PREEMPTION_COOLDOWN_SECONDS),
              help="An AppWrapper evicted by preemption or quota reclaim is no priority preemption victim for this "
                   "long after it is dispatched again, so that it is not bounced back and forth. A Go duration; "
                   "0s: off.")
@click.option("--fit", type=click.Choice(FIT_MODES), default="nodes",
              help="nodes: dispatch only if every pod of the AppWrapper can be placed on some node's free room "
                   "(first-fit decreasing, honouring cordons, NoSchedule/NoExecute taints, node-health labels, "
                   "nodeSelector and required node affinity), so a gang never starts half-placed. aggregate: "
                   "compare the total demand with the cluster's total free capacity, as upstream MCAD did (8 GPUs "
                   "free as 8 x 1 admit one 8-GPU pod that then stays Pending).")
@click.option("--placement", type=click.Choice(PLACEMENT_MODES), default="binding",
              help="binding: the pods of a dispatched AppWrapper are created behind a scheduling gate, and mcad "
                   "ungates each one pinned (required node affinity on the node's name) to the node its plan chose, "
                   "so the kube-scheduler cannot spread a gang into a half-placed one or put it on room reserved for "
                   "a blocked AppWrapper (in hub mode, in each worker). Needs --fit=nodes (else advisory), "
                   "Kubernetes 1.30+ and patch on pods. advisory: the scheduler places pods as it likes; a pod "
                   "that carries mcad's gate all the same is ungated without a pin.")
@click.option("--node-health-rule", "node_health_rules", multiple=True, metavar="RESOURCE:LABEL=VALUE:EFFECT",
              help="A node labelled LABEL=VALUE is sick for pods that request RESOURCE; EFFECT is PreferNoSchedule "
                   "(used only when nothing else fits), NoSchedule (never planned or pinned there) or NoExecute (as "
                   "NoSchedule, and an AppWrapper with such pods running there is reset onto other nodes). "
                   "Repeatable; when given, replaces the defaults, Autopilot's: "
                   "nvidia.com/gpu:autopilot.ibm.com/gpuhealth=WARN:PreferNoSchedule, =TESTING:NoSchedule, "
                   "=EVICT:NoExecute.")
@click.option("--no-node-health-rules", is_flag=True,
              help="No node-health rules at all: node labels keep no pod off a node (taints and cordons still do).")
@click.option("--write-workers", type=click.IntRange(1, 128), default=32,
              help="Threads that send dispatch and status writes to the API server in parallel (decisions stay "
                   "on one thread; one AppWrapper's writes are never reordered).")
@click.option("--backoff-status-rate", type=click.FloatRange(min=0), default=DEFAULT_BACKOFF_STATUS_RATE,
              show_default=True,
              help="Backoff status writes a second (what a waiting AppWrapper is told: why it waits), after a "
                   f"burst of {BACKOFF_STATUS_BURST}, as its Events are limited. Beyond it they wait their turn, "
                   "and an AppWrapper dispatched before its turn gets only its dispatched status: under a flood "
                   "of arrivals the API server's writes go to dispatches. mcadctl, /debug/queue and the dashboard "
                   "show the reason at once either way. 0: every Backoff is written at once.")
@click.option("--cycle-interval", type=click.FloatRange(min=0, max=10), default=DEFAULT_CYCLE_INTERVAL_SECONDS,
              show_default=True,
              help="Seconds after a dispatch cycle's start before room that frees (pods ending, AppWrappers "
                   "finishing) brings the next cycle: the asks within it are folded into one cycle at its end, so "
                   "under churn the queue is judged once per interval instead of once per freed pod, and freed room "
                   "idles at most this long. A new AppWrapper is judged at once. 0: a cycle at every ask.")
@click.option("--topology-level", "topology_levels", multiple=True, metavar="LABEL_KEY",
              help="A node label key of the cluster's network topology, repeated from the largest level to the "
                   "smallest (e.g. a block label, then a rack label, then kubernetes.io/hostname). An AppWrapper "
                   "that prefers a level (mcad.codeflare.dev/topology-preferred) goes into one domain of it if it "
                   "fits, else into one domain of the next larger level, and so on. Required levels "
                   "(mcad.codeflare.dev/topology-required) need none of this.")
@click.option("--fair-sharing/--no-fair-sharing", default=False, show_default=True,
              help="Among queued AppWrappers of the same priority, dispatch first from the tenant (the quota node "
                   "an AppWrapper is charged to, else its namespace) that used the least of the cluster lately: "
                   "usage is the share of the cluster held (GPUs when asked for, else the larger of cpu and memory), "
                   "over time, decayed with --fair-sharing-half-life. Off: first in, first out within a priority.")
@click.option("--fair-sharing-half-life", type=faultflags.DURATION, default="1h", show_default=True,
              help="How fast usage is forgotten for --fair-sharing: an hour of the whole cluster this long ago "
                   "counts half as much as one now (a Go duration: 30m, 1h, 24h).")
@click.option("--fair-sharing-configmap", default="mcad-fair-share", show_default=True,
              help="With --fair-sharing: the ConfigMap in the controller's own namespace where usage is saved every "
                   "minute and read back when the controller starts or a replica becomes the leader, so a restart "
                   "does not reset it ('': usage is kept in memory only). The controller needs create on "
                   "ConfigMaps there and get and patch on this one (the chart's Role).")
@click.option("--leader-elect/--no-leader-elect", default=False,
              help="Run as one of several replicas: compete for a coordination.k8s.io Lease and dispatch only "
                   "while holding it (standbys keep warm caches and take over when the leader goes). Off, one "
                   "process dispatches with no Lease.")
@click.option("--leader-elect-lease-name", default="mcad-controller", help="Name of the Lease.")
@click.option("--leader-elect-namespace", default=None,
              help="Namespace of the Lease. Default: $POD_NAMESPACE, else the in-cluster service account's "
                   "namespace, else mcad-system.")
@click.option("--leader-elect-lease-duration", type=click.FloatRange(min=0, min_open=True), default=15.0,
              help="Seconds a standby waits, from when it last saw the Lease change, before taking it over: how "
                   "long dispatching may pause when the leader dies without releasing the Lease.")
@click.option("--leader-elect-renew-deadline", type=click.FloatRange(min=0, min_open=True), default=10.0,
              help="Seconds the leader keeps trying to renew before it gives up leadership and exits; shorter "
                   "than the lease duration, so it stops before a standby may take over.")
@click.option("--leader-elect-retry-period", type=click.FloatRange(min=0, min_open=True), default=2.0,
              help="Seconds between the leader's renewals and between a standby's checks of the Lease; a "
                   "released Lease is taken over within this.")
@click.option("--leader-elect-label-pod", is_flag=True,
              help="With --leader-elect, in a pod ($POD_NAME, $POD_NAMESPACE): the leader labels its own pod "
                   "mcad.codeflare.dev/leader=true (and removes it when it stops leading), so a Service selecting "
                   "that label reaches the leader alone: the chart's <name>-leader, for mcadctl and the dashboard "
                   "through the API server's service proxy. Needs patch on pods in the pod's namespace.")
@click.option("--http-bind-address", default=":8080",
              help="Where to serve /metrics (Prometheus), /healthz, /readyz and /debug/{queue,ledger,explain} "
                   "(what mcadctl reads): host:port; ':8080' is every interface, port 0 picks a free one (logged); "
                   "'0' turns the endpoint off.")
@click.option("--insecure-debug-endpoints", is_flag=True,
              help="Serve /metrics and /debug/* to anyone who reaches the port, with no token and no access check. "
                   "For local debugging only: by default every request but /healthz and /readyz needs a bearer "
                   "token the API server accepts (TokenReview) and the right to read what it asks for "
                   "(SubjectAccessReview).")
@click.option("--legacy-api", is_flag=True,
              help="Also serve AppWrappers of the pre-1.34 group mcad.ibm.com/v1beta1 (its CRD must be installed: "
                   "config/crd/legacy/), with identical behaviour, so old YAML moves over without edits.")
@click.option("--quota/--no-quota", "quota_trees", default=True,
              help="Quota trees: charge AppWrappers to QuotaSubtree nodes (quota.codeflare.dev) named by their "
                   "labels, with borrowing and reclaim. Off by itself when that CRD is not installed.")
@click.option("--clusters-config", type=click.Path(dir_okay=False), default=None,
              help="Hub mode: a YAML file naming worker clusters (kubeconfig files or Secrets in the controller's "
                   "namespace, labels, unreachableTimeoutSeconds, policy). AppWrappers are queued here and each "
                   "one's objects are created in exactly one worker where the whole gang fits. Without it, mcad "
                   "dispatches into its own cluster and starts nothing for workers.")
@click.option("--cluster-policy", type=click.Choice([p.value for p in Policy]), default=None,
              help="Hub mode: which worker a gang that fits in several goes to. best: the tightest fit, leaving "
                   "the largest holes elsewhere; spread: the most room left; first: the first in the config. "
                   "Default: the config file's policy, else best.")
@click.option("--cluster-probe-period", type=click.FloatRange(min=0.1), default=DEFAULT_PROBE_PERIOD_SECONDS,
              help="Hub mode: seconds between health probes of each worker's API server (two failures in a row "
                   "take it out of placement).")
@click.option("--default-max-priority", type=click.IntRange(-(2**31), 2**31 - 1),
              default=tenancy.DEFAULT_MAX_PRIORITY,
              help="The highest priority an AppWrapper may have (spec.priority, or the value of its "
                   "spec.priorityClassName) in a namespace without the annotation mcad.codeflare.dev/max-priority; "
                   "higher ones are refused at admission and capped by the controller. The default is above the "
                   "priorities batch users give each other and below the PriorityClasses platforms preempt with.")
@click.option("--max-items", type=click.IntRange(1, MAX_ITEMS_CEILING), default=DEFAULT_MAX_ITEMS,
              help=f"An AppWrapper with more GenericItems fails at once (InvalidSpec). The CRD refuses more than "
                   f"{MAX_ITEMS_CEILING} at create; this can only lower that.")
@click.option("--max-appwrapper-bytes", type=click.IntRange(min=1024), default=DEFAULT_MAX_BYTES,
              help="An AppWrapper whose spec is larger, as compact JSON, fails at once (InvalidSpec). The default "
                   "admits 1 MiB; etcd refuses objects of about 1.5 MiB anyway.")
@click.option("--allowed-scheduler-names", "allowed_scheduler_names", multiple=True, metavar="NAME[,NAME...]",
              help="Schedulers besides default-scheduler that pod templates in AppWrappers may name in "
                   "spec.schedulerName (repeatable, or comma-separated). Another name is refused at admission, and an "
                   "AppWrapper that names one fails at once (InvalidSpec) when admission was bypassed: mcad reserves "
                   "room (and preempts) as the default scheduler places pods, so pods no scheduler it counts on "
                   "places could hold room, and what was evicted for it, without ever starting. Allow only "
                   "schedulers that place pods on the nodes mcad counts.")
@click.option("--allow-protected-namespace", "allowed_protected", multiple=True, metavar="NAMESPACE",
              help="Dispatch AppWrappers in this protected namespace after all (repeatable). Protected: kube-system, "
                   "kube-public, kube-node-lease, the controller's own namespace and, in hub mode, mcad-system "
                   "(where config/rbac/worker.yaml keeps a worker's credentials). An AppWrapper there fails "
                   "(ProtectedNamespace) and nothing of it is created.")
@click.option("--webhook/--no-webhook", "webhook_enabled", default=True,
              help="Serve the AppWrapper admission webhooks (/mutate, /validate) over HTTPS on every replica, "
                   "leader or standby. The API server calls them on every create and update of an AppWrapper "
                   "once they are registered (the chart does): turn this off only where they are not.")
@click.option("--webhook-bind-address", default=webhook_server.DEFAULT_BIND_ADDRESS,
              help="Where to serve the webhooks: host:port (':9443' is every interface, port 0 picks a free one, "
                   "logged). The chart's Service maps its port 443 here.")
@click.option("--webhook-share-port", is_flag=True,
              help="Let several controller processes on one host serve the webhooks on the same port "
                   "(SO_REUSEPORT: the kernel spreads connections over them, as a Service spreads them over pods). "
                   "For replicas run outside the cluster, e.g. tests; in a pod there is nothing to share with.")
@click.option("--webhook-cert-dir", type=click.Path(file_okay=False), default=None,
              help="Serve tls.crt and tls.key of this directory (e.g. cert-manager's Secret mounted), reloaded "
                   "when they change. The controller then neither issues certificates nor patches caBundle "
                   "(cert-manager's CA injector does). Default: the controller manages its own CA and serving "
                   "certificate in --webhook-cert-secret.")
@click.option("--webhook-cert-secret", default="mcad-webhook-cert",
              help="Secret in the controller's namespace holding the self-managed CA and serving certificate "
                   "(ca.crt, ca.key, tls.crt, tls.key). Every replica reads it on start and every "
                   "--webhook-cert-poll-seconds; one issues a new certificate when it is missing, within 30 days "
                   "of its 90-day expiry, or lacks a host. Needs get/update on it (create when it is missing).")
@click.option("--webhook-cert-namespace", default=None,
              help="Namespace of --webhook-cert-secret and of --webhook-service-name. Default: the controller's "
                   "(--leader-elect-namespace, else $POD_NAMESPACE, else the in-cluster service account's, else "
                   "mcad-system).")
@click.option("--webhook-service-name", default="mcad-controller",
              help="The Service in front of the webhooks: the certificate names <service>.<namespace>.svc and "
                   "<service>.<namespace>.svc.cluster.local.")
@click.option("--webhook-cert-hosts", default="",
              help="More names or IP addresses for the serving certificate, comma-separated, e.g. 127.0.0.1 for a "
                   "controller outside the cluster registered by URL (chart value webhook.url).")
@click.option("--webhook-configuration-name", default="mcad",
              help="Name of the ValidatingWebhookConfiguration and of the MutatingWebhookConfiguration whose "
                   "webhooks get the CA bundle (caBundle), again whenever someone resets it.")
@click.option("--webhook-creator", type=click.Choice(["webhook", "policy"]), default="webhook", show_default=True,
              help="Who records the creator annotations: webhook, this controller's mutating webhook (/mutate); "
                   "policy, a MutatingAdmissionPolicy the API server runs (chart value webhook.creator). With "
                   "policy only the ValidatingWebhookConfiguration gets the CA bundle.")
@click.option("--webhook-cert-poll-seconds", type=click.FloatRange(min=1, max=300),
              default=webhook_certs.DEFAULT_POLL_SECONDS,
              help="Seconds between reads of the certificate (Secret or directory): the bound on how long a "
                   "replica serves a replaced certificate, and on how long a reset caBundle stays wrong.")
@click.option("--webhook-drain-seconds", type=click.FloatRange(min=0, max=120), default=DEFAULT_WEBHOOK_DRAIN_SECONDS,
              show_default=True,
              help="On SIGTERM, after leadership is released, keep answering the webhooks this long (readiness "
                   "failing, every answer closing its connection) before the server stops: the Service still sends "
                   "new connections here until the endpoint change reaches kube-proxy and the API server, and a "
                   "review sent to a pod that has gone is refused (failurePolicy Fail). Keep it under the pod's "
                   "terminationGracePeriodSeconds. 0: stop at once.")
@click.option("--webhook-client-ca", type=click.Path(dir_okay=False), default=None,
              help="Authenticate the API server as the webhooks' client by its TLS client certificate: request one "
                   "and verify it against this PEM bundle (re-read when it changes); a request without a verified "
                   "certificate is refused 401 unread. The API server sends one when its --admission-control-config-"
                   "file names a kubeconfig whose user entry for the webhook's host (e.g. "
                   "mcad-controller.mcad-system.svc:443) has client-certificate and client-key. Off by default: the "
                   "chart cannot configure the API server.")
@click.option("--webhook-client-name", "webhook_client_names", multiple=True, metavar="NAME",
              help="With --webhook-client-ca: the client certificate's subject CN or a DNS/URI SAN must be one of "
                   "these (repeatable). Needed when that CA signs other clients too (a cluster CA does).")
@click.option("--webhook-token-file", type=click.Path(dir_okay=False), default=None,
              help="Authenticate the API server as the webhooks' client by a shared bearer token: the first line of "
                   "this file (a mounted Secret; re-read when it changes), compared in constant time; a request "
                   "without it is refused 401 unread. The API server sends it when the kubeconfig of its admission "
                   "configuration has token (or tokenFile) in the webhook host's user entry. With "
                   "--webhook-client-ca too, either one suffices. Off by default.")
@click.option("--webhook-access-reviews-per-second", type=click.FloatRange(min=0.1),
              default=callers.ACCESS_REVIEWS_PER_SOURCE,
              help="SubjectAccessReviews admission may send per second for the reviews of one caller (peer "
                   "address; the API server is one), cache misses only: admission caches each answer 10 s. A review "
                   "needing one over the bound is refused \"too many access reviews from <address>; retry\", never "
                   "admitted. Bounds what a forged review can cost the API server while webhook client "
                   "authentication is off.")
@click.option("--webhook-access-reviews-burst", type=click.IntRange(min=1), default=callers.ACCESS_REVIEWS_BURST,
              help="How many SubjectAccessReviews one caller may cause at once beyond the rate (a cold cache).")
@click.option("--webhook-access-reviews-total", type=click.FloatRange(min=0.1), default=callers.ACCESS_REVIEWS_TOTAL,
              help="SubjectAccessReviews per second for all callers together (burst: twice the per-caller burst).")
@click.option("--api-server-cidrs", default="", metavar="CIDR[,CIDR...]",
              help="The API server's addresses as its traffic reaches this controller (comma-separated CIDRs or "
                   "addresses; the chart passes networkPolicy.apiServerCIDRs). Reviews from them get a total of "
                   "SubjectAccessReviews of their own (--webhook-access-reviews-total) that callers elsewhere "
                   "cannot use up, and their refusals are logged one line each; refused reviews from anywhere else "
                   "are logged once per source per minute with a count. Empty: no address is known to be the API "
                   "server's (with webhook client authentication on, every caller that passes it is).")
@click.option("--unknown-tokens-per-second", type=click.FloatRange(min=0.1),
              default=endpointauth.UNKNOWN_TOKENS_PER_SECOND,
              help="TokenReviews per second for bearer tokens /metrics and /debug have not seen accepted before "
                   "(the answers are cached, refusals too); over it, 503 \"too many unknown tokens; retry\" "
                   "without a review. Tokens accepted within the last hour are reviewed outside this bound.")
@click.option("--unknown-tokens-burst", type=click.IntRange(min=1), default=endpointauth.UNKNOWN_TOKENS_BURST,
              help="How many unknown tokens may be reviewed at once beyond that rate.")
@click.option("--admission-allowed-kinds", default="",
              help="Kinds AppWrappers may wrap, as comma-separated resource.group (core kinds without a group), "
                   "e.g. pods,services,deployments.apps,jobs.batch. Empty: any kind the requesting user may create "
                   "(the built-in denylist applies either way).")
@click.option("--status-writer", "status_writers", multiple=True,
              help="A username, besides the controller's own (learned at startup by a SelfSubjectReview), whose "
                   "writes of AppWrapper status the webhook lets through; repeatable. Everyone else's are refused: "
                   "status is the controller's record of what it decided.")
@faultflags.options
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
@click.option("--log-format", type=click.Choice(["json", "console"]), default="json",
              help="json for log collectors, console for people.")
@click.option("--connect-only", is_flag=True, help="Connect, check that the AppWrapper CRD is served, and exit.")
@click.version_option(__version__, prog_name="mcad-controller")
def main(**options: Any) -> None:
    """Run the mcad controller: queue AppWrappers and dispatch each one only when all of it fits."""
    # In the order the flags have always been checked in, so that of several wrong ones the same is reported.
    fault_defaults = faultflags.fault_defaults(options)  # a usage error when they do not hold together
    api = api_settings(options)
    leader = leader_election_settings(options)
    serving = serving_settings(options)
    admission = admission_settings(options)
    scheduling = scheduling_settings(options, fault_defaults)
    hub_mode = hub_settings(options, scheduling)
    mcad_log.configure(options["log_level"], "json" if options["log_format"] == "json" else "console")
    limit_malloc_arenas()  # before any thread starts
    conn = connect(options["kubeconfig"], options["context"], scheduling.write_workers, api.legacy_api)
    if options["connect_only"]:
        return
    run(conn, scheduling, api, serving, admission, hub_mode, leader)


def connect(kubeconfig: str | None, context: str | None, write_workers: int, legacy_api: bool) -> kube.Connection:
    """Connect and check that the AppWrapper CRD (and with ``legacy_api`` the old one) is served; exit code 2 with a
    one-line reason when either fails."""
    logger = structlog.get_logger("mcad.controller")
    try:
        conn = kube.connect(kubeconfig, context, pool_size=write_workers + 16)
        version = kube.server_version(conn)
    except KubeConnectError as err:
        logger.error("cannot connect to the API server", reason=str(err))
        sys.exit(2)
    client = kube.Client(conn)
    required = [(GROUP, "config/crd/")] + ([(LEGACY_GROUP, "config/crd/legacy/")] if legacy_api else [])
    for group, crds in required:
        try:
            client.resource(f"{group}/{VERSION}", KIND)
        except ApiError as err:
            hint = (f"install it first: kubectl apply --server-side -f {crds}" if err.status == 404
                    else "check the controller's permissions")
            logger.error("the AppWrapper API is not available", group=group, reason=err.message, hint=hint)
            sys.exit(2)
    logger.info("connected", server=conn.server, server_version=version, config_source=conn.source,
                mcad_version=__version__)
    return conn


def run(conn: kube.Connection, scheduling: SchedulingSettings, api: ApiSettings, serving: ServingSettings,
        admission: AdmissionSettings, hub_mode: HubSettings, leader: LeaderElectionSettings) -> None:
    """Build the controller over ``conn`` and run it until SIGTERM or SIGINT (see the module docstring)."""
    client = kube.Client(conn)
    identity = default_identity()
    recorder = events.EventRecorder(conn, component="mcad-controller", instance=identity, recent=RecentEvents())
    api = _settle_api(client, api)
    hub = _build_hub(conn, hub_mode, leader)
    scheduling = _protect(scheduling, api, hub)
    process = _build_process(conn, scheduling, api, leader, identity=identity, recorder=recorder, hub=hub)
    if admission.enabled:
        process.webhook = _serve_admission(process, admission, api, scheduling, leader)
    if serving.served:
        process.http = _serve_metrics_and_health(process, serving)
    recorder.start()
    _install_signal_handlers(process)
    _start_informers_and_hub(process)
    if process.elector is None:
        _run_alone(process, scheduling, api)
    else:
        _run_elected(process, process.elector, scheduling, api)
    _shut_down(process, admission.drain_seconds)


@dataclasses.dataclass
class Process:
    """What ``run`` builds for this replica, handed from step to step: started and stopped in ``run``'s order."""

    conn: kube.Connection
    identity: str
    recorder: events.EventRecorder
    hub: Hub | None
    dispatcher: Dispatcher
    informers: list[Informer[Any]]
    elector: LeaderElector | None
    stop: threading.Event
    worker: threading.Thread
    leader_pod: LeaderPodLabel | None
    # Counted by the webhooks and by /metrics' gate, shown on /metrics.
    refusals: callers.CallerRefusals
    # Set by a second signal: it cuts the webhooks' drain short.
    drain_cut: threading.Event = dataclasses.field(default_factory=threading.Event)
    webhook: Webhook | None = None
    http: server.Server | None = None


def _settle_api(client: kube.Client, api: ApiSettings) -> ApiSettings:
    """``api`` with quota trees off when the QuotaSubtree CRD is not served, so that a cluster without it runs."""
    if api.quota_trees and not quota_served(client):
        structlog.get_logger("mcad.controller").info(
            "QuotaSubtree is not served (install config/crd/quota.codeflare.dev_quotasubtrees.yaml); quota trees are "
            "off")
        return dataclasses.replace(api, quota_trees=False)
    return api


def _build_hub(conn: kube.Connection, hub_mode: HubSettings, leader: LeaderElectionSettings) -> Hub | None:
    """The hub over the workers of ``--clusters-config``, or None when this controller dispatches into its own."""
    hub_config = hub_mode.config
    if hub_config is None:
        return None
    hub = Hub(hub_config, WorkerConnector(conn, namespace=leader.namespace or default_namespace()),
              probe_period=hub_mode.probe_period)
    structlog.get_logger("mcad.controller").info(
        "hub mode", workers=hub.names, policy=hub_config.policy.value,
        unreachable_timeout_seconds=hub_config.unreachable_timeout_seconds)
    return hub


def _protect(scheduling: SchedulingSettings, api: ApiSettings, hub: Hub | None) -> SchedulingSettings:
    """``scheduling`` with the protected namespaces, known only now that the controller knows its own namespace."""
    logger = structlog.get_logger("mcad.controller")
    protected = protected_namespaces(default_namespace(), api.allowed_protected, hub=hub is not None)
    scheduling = dataclasses.replace(scheduling, protected_namespaces=protected, own_namespace=default_namespace())
    logger.info("protected namespaces", namespaces=sorted(protected))
    logger.info("fault tolerance defaults", **faultflags.described(scheduling.fault_defaults))
    return scheduling


def _build_process(conn: kube.Connection, scheduling: SchedulingSettings, api: ApiSettings,
                   leader: LeaderElectionSettings, *, identity: str, recorder: events.EventRecorder,
                   hub: Hub | None) -> Process:
    """The dispatcher, its informers and thread, and with ``--leader-elect`` the elector: built, nothing started."""
    dispatcher, informers = build(conn, scheduling, api, recorder=recorder, hub=hub)
    elector = LeaderElector(conn, namespace=leader.namespace or default_namespace(),
                            name=leader.lease_name, identity=identity,
                            lease_duration=leader.lease_duration, renew_deadline=leader.renew_deadline,
                            retry_period=leader.retry_period) if leader.enabled else None
    stop = threading.Event()
    worker = threading.Thread(target=dispatcher.run, args=(stop,), name="dispatcher", daemon=True)
    leader_pod = LeaderPodLabel(conn, namespace=default_namespace(), pod=os.environ.get("POD_NAME", ""),
                                stop=stop) if leader.label_pod else None
    refusals = callers.CallerRefusals()
    dispatcher.metrics.sources.caller_refusals = refusals.snapshot
    return Process(conn=conn, identity=identity, recorder=recorder, hub=hub, dispatcher=dispatcher,
                   informers=informers, elector=elector, stop=stop, worker=worker, leader_pod=leader_pod,
                   refusals=refusals)


def _serve_admission(process: Process, admission: AdmissionSettings, api: ApiSettings,
                     scheduling: SchedulingSettings, leader: LeaderElectionSettings) -> Webhook:
    """Start the admission webhooks; exit code 2 when the controller cannot learn its own username or bind."""
    # Before leader election: every replica answers admission, or a standby behind the Service would refuse.
    logger = structlog.get_logger("mcad.controller")
    conn = process.conn
    namespace = admission.cert_namespace or leader.namespace or default_namespace()
    try:
        own = own_username(conn)
    except FactUnavailable as err:
        logger.error("cannot serve the admission webhooks", reason=str(err))
        sys.exit(2)
    logger.info("AppWrapper status writers", users=sorted({own, *admission.status_writers}))
    node_labels = _node_labels(process)
    try:
        webhook = _webhook(conn, admission.bind_address, namespace=namespace,
                           cert_dir=admission.cert_dir, secret=admission.cert_secret,
                           service=admission.service_name, hosts=list(admission.cert_hosts),
                           configuration=admission.configuration_name, poll_seconds=admission.cert_poll_seconds,
                           creator=admission.creator,
                           max_items=api.limits.max_items, max_appwrapper_bytes=api.limits.max_bytes,
                           scheduler_names=api.limits.scheduler_names, share_port=admission.share_port,
                           admission=admission_config(admission.allowed_kinds, scheduling.protected_namespaces,
                                                      api.allowed_protected,
                                                      status_writers=frozenset({own, *admission.status_writers}),
                                                      fault_defaults=scheduling.fault_defaults,
                                                      min_runtime_ceiling=scheduling.min_runtime.ceiling,
                                                      default_max_priority=api.default_max_priority),
                           clients=WebhookClients(admission.client_ca, admission.client_names,
                                                  admission.token_file, admission.access_reviews_per_second,
                                                  admission.access_reviews_burst, admission.access_reviews_total,
                                                  process.refusals, api_server_networks(admission)),
                           node_labels=node_labels)
    except OSError as err:
        logger.error("cannot serve the admission webhooks", address=admission.bind_address, reason=str(err))
        sys.exit(2)
    webhook.start(process.stop)
    logger.info("admission webhooks served", address=admission.bind_address, port=webhook.server.port,
                certificates=admission.cert_dir or f"{namespace}/{admission.cert_secret}",
                configuration=None if admission.cert_dir else admission.configuration_name)
    return webhook


def _node_labels(process: Process) -> NodeLabelKeys | None:
    """The node label keys admission warns with, counted from this replica's node informer (every replica, leader
    or standby, runs it), before it starts. None in hub mode: the nodes are the workers', and a worker not yet
    connected would make a level look absent."""
    if process.hub is not None:
        return None
    keys = NodeLabelKeys()
    keys.watch(process.dispatcher.nodes)
    return keys


def _serve_metrics_and_health(process: Process, serving: ServingSettings) -> server.Server:
    """Start /metrics, /healthz, /readyz and /debug; exit code 2 when the address cannot be bound."""
    try:
        http = _http_server(serving.bind_address, process.dispatcher, process.informers, process.conn,
                            process.recorder, process.elector, process.worker, process.stop, process.identity,
                            process.webhook, insecure=serving.insecure, hub=process.hub,
                            unknown_tokens=(serving.unknown_tokens_per_second, serving.unknown_tokens_burst),
                            refusals=process.refusals)
    except OSError as err:
        structlog.get_logger("mcad.controller").error("cannot serve metrics and health",
                                                      address=serving.bind_address, reason=str(err))
        sys.exit(2)
    http.start()
    return http


def _install_signal_handlers(process: Process) -> None:
    """SIGTERM and SIGINT stop the controller; a second one cuts the webhooks' drain short."""
    logger = structlog.get_logger("mcad.controller")

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        if process.stop.is_set():  # whoever signals twice will not wait out the webhooks' drain
            process.drain_cut.set()
            return
        logger.info("shutting down", signal=signal.Signals(signum).name)
        process.stop.set()
        process.dispatcher.queue.shutdown()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def _start_informers_and_hub(process: Process) -> None:
    """Start the informers and the hub's threads: every replica, leader or standby, so a standby's caches are warm."""
    informers = process.informers
    # The first lists make the objects the process keeps: not scanned while made, frozen once made (mcad.cli.heap).
    StartupHeap(lambda: all(informer.has_synced() for informer in informers), process.stop).pause()
    for informer in informers:
        informer.start()
    if process.hub is not None:
        process.hub.start()


def _run_alone(process: Process, scheduling: SchedulingSettings, api: ApiSettings) -> None:
    """Without leader election: dispatch at once, until a signal stops the controller."""
    process.worker.start()
    structlog.get_logger("mcad.controller").info(
        "controller running", strict_fifo=scheduling.strict_fifo, reservations=scheduling.reservations,
        preemption=scheduling.preemption, fit=scheduling.fit, placement=process.dispatcher.settings.placement_mode,
        quota=api.quota_trees, max_items=api.limits.max_items, max_appwrapper_bytes=api.limits.max_bytes)
    process.stop.wait()


def _run_elected(process: Process, elector: LeaderElector, scheduling: SchedulingSettings,
                 api: ApiSettings) -> None:
    """With ``--leader-elect``: dispatch only while holding the Lease; returns once a signal stopped the controller
    and the Lease is released, and exits 1 at once when leadership is lost."""
    stop, worker, leader_pod = process.stop, process.worker, process.leader_pod
    structlog.get_logger("mcad.controller").info(
        "controller running", strict_fifo=scheduling.strict_fifo, reservations=scheduling.reservations,
        preemption=scheduling.preemption, fit=scheduling.fit, placement=process.dispatcher.settings.placement_mode,
        leader_elect=True, identity=elector.identity, lease=elector.lease,
        max_items=api.limits.max_items, max_appwrapper_bytes=api.limits.max_bytes)
    if leader_pod is not None:
        leader_pod.unmark()  # a restarted container keeps its pod's labels: not the leader until elected

    def started_leading() -> None:
        if leader_pod is not None:  # in its own thread: dispatching does not wait for the label
            threading.Thread(target=leader_pod.mark, name="leader-pod-label", daemon=True).start()
        worker.start()

    def stopped_leading() -> None:
        if leader_pod is not None and stop.is_set():  # a lost Lease exits at once (see _stop_leading)
            leader_pod.unmark()
        _stop_leading(stop, process.dispatcher, worker)

    elector.run(stop, on_started_leading=started_leading, on_stopped_leading=stopped_leading)
    if not stop.is_set():
        _exit_now(1)  # unreachable by contract (run returns early only on lost leadership); never linger


def _shut_down(process: Process, drain_seconds: float) -> None:
    """Stop what ``run`` started: the webhooks drain first and stop last, since admission needs the informers."""
    webhook = process.webhook
    if webhook is not None:
        # Leadership is released already (a standby dispatches); admission still needs the informers.
        webhook.drain(drain_seconds, process.drain_cut)
    for informer in process.informers:
        informer.stop()
    if process.hub is not None:
        process.hub.stop()
    if process.dispatcher.wrapped is not None:
        process.dispatcher.wrapped.stop()
    if process.worker.ident is not None:  # a standby never started it
        process.worker.join(timeout=10)
    process.recorder.stop(timeout=2.0)
    if process.http is not None:
        process.http.stop()
    if webhook is not None:
        webhook.stop()


class Webhook:
    """The admission webhooks of this replica: the HTTPS server and the certificate it serves."""

    def __init__(self, server_: webhook_server.WebhookServer,
                 certificates: webhook_certs.SecretCertificates | webhook_certs.DirectoryCertificates) -> None:
        self.server = server_
        self.certificates = certificates
        self._thread: threading.Thread | None = None
        self._draining = False

    def start(self, stop: threading.Event) -> None:
        self.server.start()
        self._thread = threading.Thread(target=self.certificates.run, args=(stop,), name="webhook-certs",
                                        daemon=True)
        self._thread.start()

    @property
    def draining(self) -> bool:
        return self._draining

    def ready(self) -> tuple[bool, str]:
        if self._draining:
            return False, "shutting down: the webhooks answer until the endpoint change has spread"
        if not self.certificates.loaded.is_set():
            return False, "the webhook certificate is not loaded yet"
        if not self.server.listening.is_set():
            return False, "the webhook server is not listening"
        return True, ""

    def drain(self, seconds: float, cut: threading.Event) -> None:
        """Keep answering for ``seconds`` (or until ``cut``), each answer closing its connection, so the API server
        sends its next reviews over new connections, which by then go to the other replicas."""
        if seconds <= 0 or not self.server.listening.is_set():
            return
        self._draining = True
        self.server.drain()
        structlog.get_logger("mcad.controller").info("draining the webhooks", seconds=seconds)
        cut.wait(seconds)

    def stop(self) -> None:
        self.server.stop()


def _names(value: str) -> frozenset[str]:
    return frozenset(part.strip() for part in value.split(",") if part.strip())


def admission_config(allowed_kinds: str, protected: frozenset[str],
                     allowed_protected: tuple[str, ...] = (), *,
                     status_writers: frozenset[str] = frozenset(),
                     fault_defaults: FaultDefaults = FAULT_DEFAULTS,
                     default_max_priority: int = tenancy.DEFAULT_MAX_PRIORITY,
                     min_runtime_ceiling: float = minruntime.DEFAULT_CEILING) -> admission_review.AdmissionConfig:
    """The admin's admission choices from the flags: ``resource.group`` names become (group, resource); the
    protected namespaces are the dispatcher's (``protected_namespaces``), so admission and dispatch refuse the
    same ones and ``--allow-protected-namespace`` lifts both; ``status_writers``: the controller's own identity and
    ``--status-writer``'s; ``fault_defaults``: the fault tolerance flags, whose ceilings admission judges the
    annotations by (as the controller does); ``default_max_priority``: ``--default-max-priority``, the ceiling where a
    namespace sets none, which admission refuses above as the dispatcher caps at it; ``min_runtime_ceiling``:
    ``--preemption-min-runtime-ceiling``, above which admission refuses the min-runtime annotation."""
    kinds = frozenset((group, resource) for resource, _, group in (k.partition(".") for k in _names(allowed_kinds)))
    return admission_review.AdmissionConfig(allowed_kinds=kinds, protected_namespaces=protected,
                                            allowed_namespaces=frozenset(allowed_protected),
                                            status_writers=status_writers, fault_defaults=fault_defaults,
                                            default_priority_ceiling=default_max_priority,
                                            min_runtime_ceiling=min_runtime_ceiling)


@dataclasses.dataclass(frozen=True)
class WebhookClients:
    """Who may call the webhooks (``mcad.admission.callers``) and what any caller may cost."""

    client_ca: str | None = None
    client_names: tuple[str, ...] = ()
    token_file: str | None = None
    access_reviews_per_second: float = callers.ACCESS_REVIEWS_PER_SOURCE
    access_reviews_burst: int = callers.ACCESS_REVIEWS_BURST
    access_reviews_total: float = callers.ACCESS_REVIEWS_TOTAL
    refusals: callers.CallerRefusals = dataclasses.field(default_factory=callers.CallerRefusals)
    api_servers: callers.SourceNetworks = dataclasses.field(default_factory=callers.SourceNetworks)

    def check(self) -> callers.CallerCheck | None:
        if self.client_ca is None and self.token_file is None:
            return None
        token = callers.WatchedFile(self.token_file) if self.token_file is not None else None
        return callers.CallerCheck(client_certificate=self.client_ca is not None, names=self.client_names,
                                   token=token, refusals=self.refusals)


def _webhook(conn: kube.Connection, address: str, *, namespace: str, cert_dir: str | None, secret: str,
             service: str, hosts: list[str], configuration: str, poll_seconds: float,
             max_items: int, max_appwrapper_bytes: int, share_port: bool, creator: str = "webhook",
             scheduler_names: frozenset[str] = frozenset(),
             admission: admission_review.AdmissionConfig | None = None,
             clients: WebhookClients | None = None, node_labels: NodeLabelKeys | None = None) -> Webhook:
    clients = clients or WebhookClients()
    client_ca = callers.WatchedFile(clients.client_ca, what="webhook client CA").current \
        if clients.client_ca is not None else None
    certificates: webhook_certs.SecretCertificates | webhook_certs.DirectoryCertificates
    if cert_dir is not None:
        certificates = webhook_certs.DirectoryCertificates(cert_dir, poll_seconds=poll_seconds, client_ca=client_ca)
    else:
        certificates = webhook_certs.SecretCertificates(
            conn, namespace=namespace, secret=secret, hosts=webhook_certs.service_hosts(service, namespace, hosts),
            configuration=configuration, poll_seconds=poll_seconds, client_ca=client_ca,
            kinds=webhook_certs.CONFIGURATION_KINDS[:1] if creator == "policy" else webhook_certs.CONFIGURATION_KINDS)
    # The controller's own namespace is protected; admission judges with the bounds dispatch uses.
    config = dataclasses.replace(admission or admission_review.AdmissionConfig(), controller_namespace=namespace,
                                 limits=Limits(max_items=max_items, max_bytes=max_appwrapper_bytes,
                                               scheduler_names=scheduler_names))
    access_reviews = callers.SourceBuckets(per_source=clients.access_reviews_per_second,
                                           burst=clients.access_reviews_burst, total=clients.access_reviews_total,
                                           api_servers=clients.api_servers)
    mutate, validate = admission_review.build(KubeFacts(conn, access_reviews=access_reviews,
                                                        refusals=clients.refusals), config,
                                              node_labels=node_labels)
    httpd = webhook_server.WebhookServer(address, tls=certificates.context, mutate=mutate, validate=validate,
                                         max_body_bytes=webhook_server.max_body_bytes(max_appwrapper_bytes),
                                         share_port=share_port, caller_check=clients.check(),
                                         api_servers=clients.api_servers)
    return Webhook(httpd, certificates)


def _http_server(address: str, dispatcher: Dispatcher, informers: list[Informer[object]], conn: kube.Connection,
                 recorder: events.EventRecorder, elector: LeaderElector | None, worker: threading.Thread,
                 stop: threading.Event, identity: str, webhook: Webhook | None = None, *,
                 insecure: bool = False, hub: Hub | None = None,
                 unknown_tokens: tuple[float, int] = (endpointauth.UNKNOWN_TOKENS_PER_SECOND,
                                                      endpointauth.UNKNOWN_TOKENS_BURST),
                 refusals: callers.CallerRefusals | None = None) -> server.Server:
    """/metrics, /healthz, /readyz and /debug over this process's dispatcher, informers and elector."""
    def leading() -> bool:
        return elector is None or elector.is_leader

    server.observe(dispatcher, informers, api_errors=conn.errors.snapshot, api_writes=conn.writes.snapshot,
                   leading=leading, events=recorder.counters, hub=hub)
    if webhook is not None:
        dispatcher.metrics.serve(webhook.server.stats)

    def live() -> tuple[bool, str]:
        # Only a dead dispatcher thread is worth a restart; an unreachable API server is not.
        if worker.ident is not None and not worker.is_alive() and not stop.is_set():
            return False, "the dispatcher thread has stopped"
        return True, ""

    def ready() -> tuple[bool, str]:
        if webhook is not None and webhook.draining:
            return webhook.ready()
        waiting = [i.name for i in informers if not i.has_synced()]
        if waiting:
            return False, f"informers not synced yet: {', '.join(waiting)}"
        if elector is not None and not elector.settled:
            return False, "leader election has not settled"
        if webhook is not None:
            return webhook.ready()
        return True, ""

    reports = Reports(dispatcher.view, lambda: {"version": __version__, "identity": identity, "leader": leading()}, hub)
    debug = server.debug_endpoints(dispatcher, reports, leading=leading,
                                   leader=lambda: elector.leader if elector is not None else identity)
    if insecure:
        structlog.get_logger("mcad.controller").warning(
            "--insecure-debug-endpoints: /metrics and /debug answer anyone who reaches the port, every tenant's "
            "queue included; use it for local debugging only", address=address)
    gate = None if insecure else Gate(
        ApiReviews(conn), unknown_tokens=callers.TokenBucket(*unknown_tokens, time.monotonic), refusals=refusals)
    # The dashboard's headline numbers: the metrics sampled every 10 s for an hour (it starts with the server,
    # so a standby has its own hour ready when it takes over; its counters start at zero, as after a restart).
    history = MetricsHistory(dispatcher.metrics)
    ticks = RealClock()
    start_history_sampling(history, SAMPLE_INTERVAL_SECONDS, stop, clock=ticks)
    return server.Server(address, metrics=dispatcher.metrics, live=live, ready=ready, debug=debug, gate=gate,
                         insecure=insecure, recent_events=recorder.recent,
                         summary=lambda: history.summary(ticks.monotonic()))


def start_history_sampling(history: MetricsHistory, interval: float, stop: threading.Event, *,
                           clock: Clock | None = None) -> threading.Thread:
    """Sample ``history`` at once and then every ``interval`` seconds until ``stop`` is set, on a daemon thread
    (the dashboard's headline numbers, ``mcad.serve.history``). A failing sample is logged and the next one tried: the
    numbers go stale, the controller goes on."""
    ticks = clock if clock is not None else RealClock()
    logger = structlog.get_logger("mcad.controller")

    def run() -> None:
        while True:
            try:
                history.sample(ticks.monotonic())
            except Exception as err:  # the page shows older numbers; nothing else depends on them
                logger.warning("metrics history sample failed", reason=type(err).__name__, error=str(err))
            if stop.wait(interval):
                return

    thread = threading.Thread(target=run, name="metrics-history", daemon=True)
    thread.start()
    return thread


def _stop_leading(stop: threading.Event, dispatcher: Dispatcher, worker: threading.Thread) -> None:
    """Leadership ends. Lost (``stop`` not set): exit at once, since another replica may already dispatch.
    Stopping: wait for the dispatcher to finish its writes, so the Lease is released only once they are done."""
    if not stop.is_set():
        _exit_now(1)
    dispatcher.queue.shutdown()
    worker.join(timeout=10)
    if worker.is_alive():
        structlog.get_logger("mcad.controller").warning("dispatcher still busy after 10 s; releasing the lease anyway")


def _exit_now(code: int) -> None:
    """Exit without running cleanup that could let a thread write once more (client-go exits the same way)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
