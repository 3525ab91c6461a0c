"""``mcadctl``: the debug CLI for people operating mcad.

Contract: every subcommand prints its result on stdout and exits 0, or prints one line starting with ``error:`` on
stderr and exits 1; a bad argument or option is a usage error (exit 2). Cluster access follows kubectl:
``--kubeconfig``, else $KUBECONFIG, else in-cluster, else ~/.kube/config. The controller answers according to
the bearer token mcadctl shows it: ``--token``, else $MCAD_TOKEN, else the kubeconfig's (``mcad.cli.reach``).

``queue``, ``ledger``, ``explain``, ``quota`` and ``clusters`` show the controller's own view, from its ``/debug/*``
endpoints (see ``mcad.cli.reach`` for how it is found: ``--url``, else the leader's Service, the leader's pod named by
the Lease, the Service of every replica, all through the API server's proxy). With ``--offline`` they compute the same
documents here, from one list of AppWrappers, Nodes and Pods, with the controller's accounting code
(``mcad.cli.offline``); that view lacks what only the running controller knows (requeuing timers, plans not yet
bound), and the controller may run another policy than the ``--fit``/``--strict-fifo``/``--preemption`` given here.
``ledger --topology`` adds the ledger's nodes up per domain of each topology level (``mcad.cli.topologyroom``): the
controller's configured levels (a level it is not configured with is an error: it reports no other node label), or
with ``--offline`` the levels given with ``--level``, which offline stand for the controller's.
Tables by default; ``-o json``/``-o yaml`` print the document as the endpoint returns it (``ledger --topology``: the
grouping made of it). ``clusters`` (a hub's worker
clusters) has no ``--offline`` view: only the running controller holds the connections to the workers, so asking for one
is a usage error (exit 2).

``dashboard`` serves the controller's /ui pages on a local port through the API server until Ctrl-C
(``mcad.cli.dashboardproxy`` says how that port is guarded); it too needs the running controller.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import webbrowser
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

import click
import structlog

from mcad import __version__
from mcad.api.topologyasks import label_key_error
from mcad.cli import dashboardproxy, reach, render, topologyroom
from mcad.errors import ApiError, KubeConnectError
from mcad.k8s import kube
from mcad.model.reservations import DEFAULT_RESERVATIONS
from mcad.serve.queuereport import MAX_QUEUE_PAGE, QueueReport


class Failure(click.ClickException):
    """An error a person can act on: ``error: <message>`` on stderr, exit 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


@dataclass(frozen=True)
class Options:
    """The global options: where the controller is, and the policy --offline simulates."""

    where: reach.Where
    offline: bool
    fit: str
    strict_fifo: bool
    reservations: int
    preemption: bool


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("--controller-namespace", default="mcad-system", show_default=True,
              help="Namespace of the controller's Lease and Service.")
@click.option("--controller-name", default="mcad-controller", show_default=True,
              help="Name of the controller's Lease and Service.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True,
              help="The controller pods' --http-bind-address port (used to reach the leader's pod).")
@click.option("--url", default=None, metavar="URL",
              help="Talk to the controller at URL directly (e.g. http://localhost:8080 after "
                   "`kubectl port-forward`) instead of through the API server.")
@click.option("--offline", is_flag=True,
              help="Do not ask the controller: compute the answer from cluster state (AppWrappers, Nodes, Pods).")
@click.option("--fit", type=click.Choice(["nodes", "aggregate"]), default="nodes", show_default=True,
              help="With --offline: the fit mode to simulate (match the controller's --fit).")
@click.option("--strict-fifo", is_flag=True, help="With --offline: simulate the controller's --strict-fifo.")
@click.option("--preemption", is_flag=True, help="With --offline: simulate the controller's --preemption.")
@click.option("--reservations", type=click.IntRange(min=0, max=1000), default=DEFAULT_RESERVATIONS,
              show_default=True, help="With --offline: simulate the controller's --reservations.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=reach.DEFAULT_TIMEOUT, show_default=True,
              help="Seconds to wait for each request.")
@click.option("--token", envvar="MCAD_TOKEN", default=None, metavar="TOKEN",
              help="Bearer token to show the controller, which checks it with the API server (TokenReview) and "
                   "shows what its user may see. Default: $MCAD_TOKEN, else the kubeconfig's token (token, "
                   "tokenFile or exec plugin); needed with a kubeconfig that uses a client certificate.")
@click.pass_context
def main(ctx: click.Context, kubeconfig: str | None, context: str | None, controller_namespace: str,
         controller_name: str, port: int, url: str | None, offline: bool, fit: str, strict_fifo: bool,
         preemption: bool, reservations: int, timeout: float, token: str | None) -> None:
    """Inspect a running mcad installation: its queue, its capacity ledger, its quota trees, and why an
    AppWrapper waits.

    By default only a kubeconfig is needed: mcadctl asks the controller through the API server (the leader's pod
    named by the Lease CONTROLLER-NAMESPACE/CONTROLLER-NAME, else the Service of that name). --url talks to the
    controller directly; --offline computes the answer from cluster state when the controller is unreachable.
    The controller shows each user what it may see: its own namespaces' AppWrappers (where it may list them),
    and the ledger, quota and clusters to those granted them; mcadctl shows it your bearer token (--token).
    """
    if url and offline:
        raise click.UsageError("--url and --offline exclude each other: --url asks a controller, --offline none")
    ctx.obj = Options(
        where=reach.Where(namespace=controller_namespace, name=controller_name, port=port, url=url,
                          kubeconfig=kubeconfig, context=context, timeout=timeout, token=token or None),
        offline=offline, fit=fit, strict_fifo=strict_fifo, preemption=preemption, reservations=reservations)


# Queued rows `mcadctl queue` shows unless told: a screenful is the head of the queue, and at 100,000 queued the
# whole document is tens of MB.
DEFAULT_QUEUE_LIMIT = 1000

_output = click.option("-o", "--output", type=click.Choice(["json", "yaml", "wide"]), default=None,
                       help="json or yaml: the document as the controller serves it (queue: the page asked for); "
                            "wide: more columns.")


@main.command()
@click.option("-n", "--namespace", default=None, help="Only AppWrappers in this namespace (positions stay global).")
@click.option("--dispatched", is_flag=True, help="Also list the dispatched AppWrappers and their pods.")
@click.option("--limit", type=click.IntRange(0, MAX_QUEUE_PAGE), default=DEFAULT_QUEUE_LIMIT, show_default=True,
              help=f"At most this many queued rows (1 to {MAX_QUEUE_PAGE}); 0: the whole queue (tens of MB at "
                   "100,000 queued). Resetting and dispatched ones are all listed.")
@click.option("--offset", type=click.IntRange(min=0), default=0,
              help="Skip this many queued rows first: --offset 1000 shows the second page of 1000.")
@_output
@click.pass_obj
def queue(opts: Options, namespace: str | None, dispatched: bool, limit: int, offset: int,
          output: str | None) -> None:
    """The queue in dispatch order, and why each AppWrapper is not dispatched yet.

    Columns: POSITION (place in the whole queue), NAMESPACE, NAME, PRIORITY, AGE (since creation), STATE (Queued;
    Draining: requeued, waiting for its old pods to go; Preempting: waiting for its victims to leave), DEMAND (what
    the whole gang requests) and WHY (what is short). WHY is cut to the terminal width (not in a pipe); -o wide
    prints it in full, with PODS, REQUEUINGS, FITS-NOW and EXPECTED-START (an estimate, not a promise). From the
    controller's /debug/queue (or --offline). Shows the first --limit queued rows; json and yaml add `page`
    (offset, limit, queuedTotal).

    Above the table, where you stand: with rights in some namespaces only (or with -n), the position of your first
    queued AppWrapper of each namespace and how many are ahead of it, those of namespaces you may not list only as
    counts (never named); and fair sharing's usage (the controller's --fair-sharing): your tenants' share of all
    usage and rank (1: used least, goes first among equal priorities), the other tenants' as least, median and
    most. json and yaml carry them as `aheadOfYou` and `fairShare`.
    """
    # The controller formats only the page (and only that namespace's rows): the whole queue can be tens of MB.
    # Offline, or from a controller that does not page, the document comes whole and is cut here.
    query: list[tuple[str, str]] = [("namespace", namespace)] if namespace else []
    if limit:
        query += [("limit", str(limit))] + ([("offset", str(offset))] if offset else [])
    doc = _document(opts, "queue", lambda report: report.queue(), query)
    if namespace:
        doc = render.only_namespace(doc, namespace)
    if "page" not in doc:
        doc = QueueReport.of(doc).page_in(None, offset, limit or max(len(doc.get("queued") or []), 1))
    if output in ("json", "yaml"):
        click.echo(render.dump(doc, output))
        return
    _echo(render.queue_lines(doc, wide=output == "wide", width=_terminal_width(), dispatched=dispatched))


@main.command()
@click.option("--nodes", is_flag=True, help="Also print every node's allocatable, used, planned and free room.")
@click.option("--topology", is_flag=True,
              help="Instead: the room of each domain (nodes sharing one value of a node label) of each topology "
                   "level the controller is configured with (its --topology-level), and of the nodes in none.")
@click.option("--level", "levels", multiple=True, metavar="KEY",
              help="With --topology: only this level (a node label key; repeat for several). With --offline, where "
                   "the controller's levels are not known, the levels to group by (needed).")
@_output
@click.pass_obj
def ledger(opts: Options, nodes: bool, topology: bool, levels: tuple[str, ...], output: str | None) -> None:
    """Capacity, usage, reservations and free room per resource (and per node with --nodes or -o wide; per
    topology domain with --topology).

    CAPACITY: allocatable of Ready, schedulable nodes; USED: requests of the pods on them; RESERVED: dispatched
    AppWrappers' demand not yet covered by their own pods; FREE: what a new dispatch can use. Per node, PLANNED is
    room held for dispatched pods not bound yet (--fit=nodes). With --topology, per level a table DOMAIN NODES
    (schedulable/all) RESOURCE CAPACITY USED PLANNED FREE of cpu, memory and nvidia.com/gpu, added up over each
    domain's schedulable nodes, domains by value, the nodes in no domain last as (none); json and yaml print
    that grouping. From the controller's /debug/ledger (or --offline).
    """
    if levels and not topology:
        raise click.UsageError("--level goes with --topology")
    if topology and (nodes or output == "wide"):
        raise click.UsageError("--topology shows domains, --nodes and -o wide nodes: give one")
    if topology and opts.offline:
        if not levels:
            raise click.UsageError("--offline does not know the controller's --topology-level: name the levels to "
                                   "group by with --level KEY (largest first)")
        for level in levels:
            error = label_key_error(level)
            if error:
                raise click.UsageError(f"--level {level!r} is not a node label key: {error}")
    doc = _document(opts, "ledger", lambda report: report.ledger(),
                    topology_levels=tuple(dict.fromkeys(levels)) if topology else ())
    if topology:
        grouped = topologyroom.domains(doc, _levels_to_show(doc, levels, offline=opts.offline))
        if output in ("json", "yaml"):
            click.echo(render.dump(grouped, output))
            return
        _echo(topologyroom.lines(grouped))
        return
    if output in ("json", "yaml"):
        click.echo(render.dump(doc, output))
        return
    _echo(render.ledger_lines(doc, nodes=nodes or output == "wide"))


def _levels_to_show(doc: dict[str, Any], asked: tuple[str, ...], *, offline: bool) -> tuple[str, ...]:
    """The levels ``ledger --topology`` groups by: those asked for, else the controller's; a Failure names why
    there are none, or the levels the controller cannot group by (it reports its configured levels' labels only,
    so that a reader of the ledger sees no other label of the nodes)."""
    asked = tuple(dict.fromkeys(asked))
    if offline:
        return asked
    configured = doc.get("topologyLevels")
    if not isinstance(configured, list):
        raise Failure("this controller reports no topology levels in /debug/ledger (a version from before "
                      "--topology-level?); --offline --level KEY groups the nodes here")
    if not configured:
        raise Failure("the controller runs without --topology-level (chart value topology.levels): it has no "
                      "levels to group the nodes by; --offline --level KEY groups them here by any node label")
    unknown = [level for level in asked if level not in configured]
    if unknown:
        raise Failure(f"the controller reports the domains of its --topology-level levels only "
                      f"({', '.join(configured)}), not of {', '.join(unknown)}; --offline --level KEY groups the "
                      "nodes here by any node label")
    return asked or tuple(str(level) for level in configured)


@main.command()
@click.option("--tree", "trees", multiple=True, metavar="NAME",
              help="Only this quota tree (the QuotaSubtrees' `tree` label); repeat for several.")
@_output
@click.pass_obj
def quota(opts: Options, trees: tuple[str, ...], output: str | None) -> None:
    """Each quota tree: its nodes (indented under their parents), limits, use, borrowing, and the AppWrappers
    charged to each node.

    Columns: NODE, HARD (yes: never goes over its limit; no: may borrow its siblings' unused quota through its
    parent; root: a root's limit always holds), LIMIT (disabled: limits nothing), USED (demand of the dispatched
    AppWrappers charged to the node or below it), BORROWED (what USED exceeds LIMIT by), APPWRAPPERS (charged
    directly to the node; cut to the terminal width, not in a pipe). -o wide adds DEFINED-BY (the QuotaSubtree)
    and each AppWrapper's demand.
    From the controller's /debug/quota (or --offline).
    """
    doc = _document(opts, "quota", lambda report: report.quota())
    if trees:
        known = [str(tree.get("name")) for tree in doc.get("trees") or []]
        missing = [name for name in trees if name not in known]
        if missing:
            raise Failure(f"no quota tree named {', '.join(missing)} (the trees are: {', '.join(known) or 'none'}); "
                          "a tree is the `tree` label of its QuotaSubtree objects")
        doc = render.only_trees(doc, trees)
    if output in ("json", "yaml"):
        click.echo(render.dump(doc, output))
        return
    _echo(render.quota_lines(doc, wide=output == "wide", width=_terminal_width()))


@main.command()
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json", "yaml"]), default="table",
              show_default=True,
              help="table; wide: also labels, time in state, message; json or yaml: the whole document as the "
                   "controller serves it.")
@click.pass_obj
def clusters(opts: Options, output: str) -> None:
    """The worker clusters of a hub: their health, capacity, free room, and the AppWrappers placed in each.

    Columns: NAME, STATE (Healthy; Unreachable: no answer, so its capacity is unknown and nothing new is placed
    there; Unauthorized: the worker refuses mcad's credentials (401/403); Unknown: not probed yet; ",NotSynced"
    when its caches are still loading), CAPACITY and FREE (cpu and memory first), APPWRAPPERS (how many are
    placed there). -o wide adds LABELS (what clusterSelector matches), SINCE (how long in that state) and
    MESSAGE. A controller started without --clusters-config runs in single-cluster mode and has no workers.
    From the controller's /debug/clusters; there is no --offline view, because only the running controller holds
    the connections to the workers.
    """
    if opts.offline:
        raise click.UsageError("clusters has no --offline view: it needs the running controller, because only the "
                               "controller holds the connections to the worker clusters (drop --offline)")
    try:
        doc = reach.fetch(opts.where, "clusters")
    except reach.ControllerRefused as err:
        if err.status == 404:
            raise Failure(f"{err}; this controller does not serve /debug/clusters (a version from before hub "
                          "mode?)") from err
        raise Failure(str(err)) from err
    except reach.DebugUnavailable as err:
        raise Failure(str(err)) from err
    if output in ("json", "yaml"):
        click.echo(render.dump(doc, output))
        return
    _echo(render.clusters_lines(doc, wide=output == "wide"))


# What explain makes of "no such AppWrapper": offline, and from the controller's 404.
_UNKNOWN_OFFLINE = {"found": False, "summary": "no AppWrapper of that name in the cluster"}
_UNKNOWN_TO_CONTROLLER = {"found": False, "summary": "the controller does not know it"}


def _appwrapper_ref(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, str]:
    namespace, slash, name = value.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise click.BadParameter(f"{value!r} is not NAMESPACE/NAME (for example: default/my-job)")
    return namespace, name


@main.command()
@click.argument("appwrapper", metavar="NAMESPACE/NAME", callback=_appwrapper_ref)
@click.option("-o", "--output", type=click.Choice(["json", "yaml"]), default=None,
              help="Print the controller's whole answer as json or yaml.")
@click.pass_obj
def explain(opts: Options, appwrapper: tuple[str, str], output: str | None) -> None:
    """Say in plain words why the AppWrapper NAMESPACE/NAME is where it is: queued behind whom, short of what,
    dispatched and waiting for pods, in its retry pause after a reset, or finished; then its health (what the
    controller does next and when), its resets against retryLimit and its fault tolerance policy. From the
    controller's /debug/explain (or --offline, where the controller's fault tolerance flags are not known and the
    built-in defaults stand in)."""
    namespace, name = appwrapper
    doc = _document(opts, "explain", lambda report: report.explain(namespace, name) or _UNKNOWN_OFFLINE,
                    [("namespace", namespace), ("name", name)], not_found=_UNKNOWN_TO_CONTROLLER)
    if not doc.get("found", True):
        why = doc.get("summary") or "unknown"
        raise Failure(f"AppWrapper {namespace}/{name} not found ({why}); "
                      f"`kubectl get appwrappers -n {namespace}` lists the ones that exist")
    if output:
        click.echo(render.dump(doc, output))
        return
    _echo(render.explain_lines(doc))


@main.command()
@click.option("--port", "listen_port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Local port to listen on (0: a free one).")
@click.option("--address", type=click.Choice(dashboardproxy.LOOPBACK_ADDRESSES), default="127.0.0.1",
              show_default=True, help="Local address to listen on: loopback only, since your credentials stand "
                                      "behind it (from another machine, use ssh -L).")
@click.option("--open", "open_browser", is_flag=True, help="Also open the URL in a web browser (never by default).")
@click.option("--max-connections", type=click.IntRange(1, 1024), default=dashboardproxy.DEFAULT_MAX_CONNECTIONS,
              show_default=True, help="Connections served at once; more are answered 503 at once.")
@click.pass_obj
def dashboard(opts: Options, listen_port: int, address: str, open_browser: bool, max_connections: int) -> None:
    """Serve the controller's live dashboard (its /ui pages) on a local port, through the API server like
    `kubectl proxy`: prints the URL and runs until Ctrl-C.

    Who sees what: the API server lets the pages through only for a user with get on services/proxy for the
    controller's Services (CONTROLLER-NAME-leader, the leader alone, and CONTROLLER-NAME, in
    CONTROLLER-NAMESPACE, port http), which the chart's debug-client Role grants (an operator with pods/proxy
    there may also be sent to the leader's pod); a user without it gets the API server's refusal as a page that
    names the missing right. Then the controller shows what the user of your
    bearer token (--token, else the kubeconfig's) may see, as `mcadctl queue` does: the AppWrappers of the
    namespaces where it may list them; the nodes, quota trees and headline numbers to those who may get
    /debug/ledger, /debug/quota and /metrics (the chart's debug-viewer and metrics-reader ClusterRoles).

    Anyone who has the URL acts with your credentials: it holds a random secret, so keep it to yourself. The
    proxy answers only GET and HEAD of /ui pages, and only requests addressed to localhost (no DNS rebinding).
    """
    if opts.offline:
        raise click.UsageError("dashboard has no --offline view: the pages come from the running controller")
    where = opts.where
    if where.url:
        raise click.UsageError(f"with --url the controller is reachable directly: open {where.url.rstrip('/')}/ui/ "
                               "in a browser (it asks for a token), or drop --url to go through the API server")
    try:
        conn = kube.connect(where.kubeconfig, where.context)
    except KubeConnectError as err:
        raise Failure(str(err)) from err

    def token() -> str | None:
        return where.token or kube.bearer_token(conn)

    if not token():
        click.echo(f"warning: {reach.no_token_hint(conn.source)}; until then the page asks for a token itself",
                   err=True)
    forwarder = dashboardproxy.Forwarder(conn, where, token, notify=click.echo)
    try:
        forwarder.locate()
        proxy = dashboardproxy.DashboardProxy(forwarder, address=address, port=listen_port,
                                              max_connections=max_connections)
    except reach.DebugUnavailable as err:
        raise Failure(str(err)) from err
    except OSError as err:
        raise Failure(f"cannot listen on {address} port {listen_port}: {err.strerror or err}") from err
    click.echo(f"Dashboard: {proxy.url}")
    probe = forwarder.forward("/ui/", [], {})
    if isinstance(probe, dashboardproxy.Refusal):
        click.echo(f"warning: {forwarder.explain(probe)}", err=True)
    else:
        probe.close()
    click.echo(f"Forwarding /ui to {forwarder.route.what} through the API server {conn.server}; keep the URL to "
               "yourself; press Ctrl-C to stop")
    if open_browser and not webbrowser.open(proxy.url):
        click.echo("warning: no web browser found here: open the URL yourself", err=True)
    # Ctrl-C and SIGTERM stop it, even where SIGINT came ignored (a shell starts background jobs that way, and
    # Python then leaves it ignored).
    for stopping in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stopping, _interrupt)
    try:
        proxy.serve()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
    click.echo("stopped")


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@main.command()
@click.option("--client", "client_only", is_flag=True, help="Print only the mcadctl version; contact no server.")
@click.pass_obj
def version(opts: Options, client_only: bool) -> None:
    """Print the mcadctl version and the Kubernetes server version."""
    click.echo(f"mcadctl: {__version__}")
    if client_only:
        return
    try:
        conn = kube.connect(opts.where.kubeconfig, opts.where.context)
        click.echo(f"kubernetes server: {kube.server_version(conn)} ({conn.server})")
    except KubeConnectError as err:
        raise Failure(str(err)) from err


def _document(opts: Options, endpoint: str, offline: Callable[[Any], dict[str, Any]], query: reach.Query = (),
              *, not_found: dict[str, Any] | None = None, topology_levels: tuple[str, ...] = ()) -> dict[str, Any]:
    """The /debug document: from the controller (``not_found`` stands for its 404 answer when given), or with
    --offline computed from cluster state by ``offline`` applied to ``mcad.cli.offline``'s reports (configured
    with ``topology_levels``)."""
    if opts.offline:
        return _compute_offline(opts, offline, topology_levels)
    try:
        return reach.fetch(opts.where, endpoint, query)
    except reach.ControllerRefused as err:
        if err.status == 404 and not_found is not None:
            return not_found
        raise Failure(str(err)) from err
    except reach.DebugUnavailable as err:
        raise Failure(str(err)) from err


def _compute_offline(opts: Options, produce: Callable[[Any], dict[str, Any]],
                     topology_levels: tuple[str, ...] = ()) -> dict[str, Any]:
    # Imported here: the controller's accounting is only needed offline, and it is the heavier import.
    from mcad.cli import offline

    where = opts.where
    try:
        conn = kube.connect(where.kubeconfig, where.context)
    except KubeConnectError as err:
        raise Failure(str(err)) from err
    try:
        with _warnings_only_on_stderr():
            report = offline.reports(conn, fit=opts.fit, strict_fifo=opts.strict_fifo, preemption=opts.preemption,
                                     reservations=opts.reservations, topology_levels=topology_levels)
            return produce(report)
    except ApiError as err:
        if err.status == 0:
            raise Failure(f"cannot reach the API server {conn.server} (from {conn.source}): {err.message}") from err
        hint = " (is the AppWrapper CRD installed?)" if err.status == 404 else ""
        raise Failure(f"reading cluster state for --offline failed: {err}{hint}") from err


@contextlib.contextmanager
def _warnings_only_on_stderr() -> Iterator[None]:
    """The controller code that --offline runs logs its progress at info level; a person wants only warnings, and
    on stderr, since stdout may be piped into jq. The previous configuration comes back afterwards (tests run
    mcadctl inside their own process); nothing is cached, so no logger keeps this configuration."""
    saved = structlog.get_config()
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr), cache_logger_on_first_use=False)
    try:
        yield
    finally:
        structlog.configure(**saved)


def _terminal_width() -> int | None:
    """The columns the queue table must fit: the terminal's (or $COLUMNS). None when stdout is a pipe or a file
    and COLUMNS is unset: ``mcadctl queue | grep`` sees whole lines, as with kubectl."""
    if os.environ.get("COLUMNS") or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _echo(lines: Iterable[str]) -> None:
    click.echo("\n".join(lines))
