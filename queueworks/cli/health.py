"""``queueworks health``: a health check for a container or a supervisor.

Exit 0 when Redis answers (and, if asked, the worker's heartbeat is alive — for a pool
(``worker --processes``): its supervisor's record is fresh and a member's heartbeat is
alive — or some controller holds the leader lease); else non-zero, the reason on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from queueworks.cli.failures import BadInput, explain
from queueworks.cli.options import common, option, settings_from_flags


@click.command(short_help="Exit non-zero when Redis or a process is unhealthy.")
@common
@option(
    "--id-file",
    type=click.Path(dir_okay=False),
    help="also check the heartbeat of the worker (or the pool: a member's) whose id is in "
    "this file",
)
@option(
    "--controller",
    "is_controller",
    is_flag=True,
    help="also check that some controller holds the leader lease",
)
def health(id_file: str | None, is_controller: bool, **flags: Any) -> None:
    """Exit 0 when Redis answers (and the worker's heartbeat is alive); else non-zero.

    Prints `ok`; else `unhealthy: ...` on stderr and exit 1 (Redis) or 2 (the worker's
    heartbeat or the leader lease). A bad URL or flag is an `error:` line, exit 2."""
    from queueworks.protocol.keys import Keys
    from queueworks.transport.connection import connect

    settings = settings_from_flags(**flags)
    keys = Keys(settings.prefix)
    try:
        r = connect(settings.redis_url, ssl_ca_certs=settings.ssl_ca_certs, socket_timeout=3)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    try:
        r.ping()
        if id_file:
            wid = Path(id_file).read_text().strip()
            if not r.exists(keys.worker_heartbeat(wid)) and (why := _no_heartbeat(r, keys, wid)):
                click.echo(f"unhealthy: {why}", err=True)
                sys.exit(2)
        if is_controller and not r.exists(keys.leader):
            click.echo("unhealthy: no controller holds the leader lease", err=True)
            sys.exit(2)
    except (OSError, Exception) as exc:
        if isinstance(exc, SystemExit):
            raise
        error = explain(exc, click.get_current_context().meta)
        click.echo(f"unhealthy: {error.message if error else type(exc).__name__}", err=True)
        sys.exit(1)
    click.echo("ok")


def _no_heartbeat(r: Any, keys: Any, wid: str) -> str | None:
    """Why ``wid`` (no worker with a heartbeat) is unhealthy; None if it is a pool that
    is alive: its supervisor's record is there and one of its members has a heartbeat."""
    from queueworks.transport.pools import read_pool

    pool = read_pool(r, keys, wid)
    if pool is None:
        return f"worker {wid} has no heartbeat"
    if any(r.exists(keys.worker_heartbeat(m)) for m in pool.members):
        return None
    return f"pool {wid} has no member with a heartbeat ({len(pool.members)} started)"
