"""``queueworks dashboard``: serve the web dashboard (``queueworks.dashboard``), its JSON API
and ``/metrics`` with uvicorn, in the foreground, until SIGTERM or SIGINT (exit 0).

Bound beyond loopback it needs a ``--token``; the dashboard extra must be installed
(``pip install 'queueworks[dashboard]'``), else one line says so.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import click

from queueworks.cli.failures import missing_extra
from queueworks.cli.options import ENV, common, option, seconds, settings_from_flags


@click.command(short_help="Web dashboard, JSON API and /metrics.")
@common
@option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="address to bind; beyond loopback a --token is required",
)
@option(
    "--port", type=click.IntRange(1, 65535), default=9181, show_default=True, help="port to bind"
)
@option(
    "--token",
    envvar=ENV + "DASHBOARD_TOKEN",
    show_envvar=True,
    help="access token for every page and API call",
    show_default="none: loopback only, no login",
)
@option(
    "--refresh",
    type=seconds(0, 3600, above=True),
    default=1.0,
    show_default=True,
    help="seconds between live updates of a page",
)
@option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar=ENV + "DASHBOARD_ALLOWED_HOSTS",
    show_envvar=True,
    help="a Host name to serve besides the loopback ones (repeat; space-separated in the "
    "variable); bound beyond loopback, the only names served",
    show_default="loopback names only when bound to loopback, else any",
)
@option(
    "--trace-url",
    envvar=ENV + "DASHBOARD_TRACE_URL",
    show_envvar=True,
    metavar="URL",
    help="a job's trace in your tracing UI, {trace_id} replaced: a job page links its trace "
    "there (e.g. 'https://tracing.example/trace/{trace_id}')",
    show_default="none: the trace id alone",
)
@option(
    "--allow",
    multiple=True,
    metavar="PREFIX",
    help="a module prefix (repeat) whose handlers the dashboard may import, to name a typed "
    "job's arguments sent by position; as a worker's --allow",
    show_default="none: such arguments shown by position",
)
def dashboard(
    host: str,
    port: int,
    token: str | None,
    refresh: float,
    allowed_hosts: tuple[str, ...],
    trace_url: str | None,
    allow: tuple[str, ...],
    **flags: Any,
) -> None:
    """Web dashboard, JSON API and /metrics (default http://127.0.0.1:9181)."""
    try:
        import uvicorn

        from queueworks.dashboard import BindRefused, DashboardConfig, check_bind, create_app
    except ModuleNotFoundError as exc:
        raise missing_extra("dashboard", exc.name or "?") from None
    from queueworks.transport.connection import redact_url

    settings = settings_from_flags(**flags)
    try:
        check_bind(host, token)
        config = DashboardConfig(
            redis_url=settings.redis_url,
            prefix=settings.prefix,
            token=token or None,
            refresh=refresh,
            ssl_ca_certs=settings.ssl_ca_certs,
            host=host,
            allowed_hosts=allowed_hosts,
            trace_url=trace_url or None,
            allow=allow,
        )
    except (BindRefused, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"dashboard on http://{host}:{port} for {redact_url(settings.redis_url)}", err=True)
    _warn_evicting(settings)
    # uvicorn stops gracefully on SIGTERM/SIGINT, then raises the signal again for the
    # handler that was there before it: let that be a clean exit (0), not a death by signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: sys.exit(0))
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        access_log=settings.log_level.lower() == "debug",
    )


def _warn_evicting(settings: Any) -> None:
    """The dashboard starts on an evicting Redis (it shows what is left; its actions run),
    with a warning that says so."""
    from queueworks.logs import get_logger
    from queueworks.transport.connection import UNAVAILABLE, connect_settings
    from queueworks.transport.eviction import warn_evicting

    try:  # (a URL it cannot use, a Redis not up yet: the app says so itself)
        r = connect_settings(settings)
    except ValueError:
        return
    except UNAVAILABLE:
        return
    try:
        warn_evicting(r, get_logger(component="dashboard"))
    finally:
        r.close()
