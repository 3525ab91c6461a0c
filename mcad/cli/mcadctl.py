"""``mcadctl``: the debug CLI for people operating mcad.

Contract: every subcommand prints its result on stdout and exits 0, or prints one line starting with
``error:`` on stderr and exits 1. Cluster access follows kubectl: ``--kubeconfig``, else $KUBECONFIG,
else in-cluster, else ~/.kube/config.
"""

from __future__ import annotations

import click

from mcad import __version__, kube


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.pass_context
def main(ctx: click.Context, kubeconfig: str | None, context: str | None) -> None:
    """Inspect a running mcad installation: its queue, its capacity ledger, and why an AppWrapper waits."""
    ctx.obj = {"kubeconfig": kubeconfig, "context": context}


@main.command()
@click.option("--client", "client_only", is_flag=True, help="Print only the mcadctl version; contact no server.")
@click.pass_obj
def version(obj: dict[str, str | None], client_only: bool) -> None:
    """Print the mcadctl version and the Kubernetes server version."""
    click.echo(f"mcadctl: {__version__}")
    if client_only:
        return
    try:
        conn = kube.connect(obj["kubeconfig"], obj["context"])
        click.echo(f"kubernetes server: {kube.server_version(conn)} ({conn.server})")
    except kube.KubeConnectError as err:
        raise click.ClickException(str(err)) from err
