"""``mcad-controller``: the controller process.

Contract: parses flags, configures logging, connects to the API server (exit code 2 with a one-line reason
when it cannot), then runs until SIGTERM or SIGINT and exits 0. ``--connect-only`` exits right after a
successful connection, which is what a pre-flight check or a smoke test wants.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import click
import structlog

from mcad import __version__, kube
from mcad import log as mcad_log


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Kubeconfig file. Default: $KUBECONFIG, else the in-cluster service account, else ~/.kube/config.")
@click.option("--context", default=None, help="Kubeconfig context to use (default: its current-context).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
@click.option("--log-format", type=click.Choice(["json", "console"]), default="json",
              help="json for log collectors, console for people.")
@click.option("--connect-only", is_flag=True, help="Connect to the API server, log its version, and exit.")
@click.version_option(__version__, prog_name="mcad-controller")
def main(kubeconfig: str | None, context: str | None, log_level: str, log_format: str, connect_only: bool) -> None:
    """Run the mcad controller: queue AppWrappers and dispatch each one only when all of it fits."""
    mcad_log.configure(log_level, "json" if log_format == "json" else "console")
    logger = structlog.get_logger("mcad.controller")
    try:
        conn = kube.connect(kubeconfig, context)
        version = kube.server_version(conn)
    except kube.KubeConnectError as err:
        logger.error("cannot connect to the API server", reason=str(err))
        sys.exit(2)
    logger.info("connected", server=conn.server, server_version=version, config_source=conn.source,
                mcad_version=__version__)
    if connect_only:
        return

    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        logger.info("shutting down", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    logger.info("controller running")
    stop.wait()
