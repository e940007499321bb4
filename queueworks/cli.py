"""The ``queueworks`` command: worker, controller, submit, info, health, demo, dashboard.

Settings come from flags and ``QUEUEWORKS_*`` environment variables (flags win). Signal
handlers live here and only here: the first SIGTERM/SIGINT is a warm stop (finish or
abort the step at a safe point, leave the node set, exit); a second one, or the grace
period running out, is a cold stop that interrupts the running handler.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from queueworks.logs import configure
from queueworks.settings import Settings
from queueworks.signals import ColdStop, install_stop_signals


def _settings(**flags: Any) -> Settings:
    cluster = flags.pop("cluster", False)
    settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    if cluster:
        from queueworks.connection import as_cluster_url

        settings.redis_url = as_cluster_url(settings.redis_url)
    return settings


def _common(f: Any) -> Any:
    f = click.option("--redis", "redis_url", help="Redis URL [env QUEUEWORKS_REDIS_URL]")(f)
    f = click.option(
        "--cluster",
        is_flag=True,
        help="the URL's host(s) are Redis Cluster seed nodes (= redis+cluster://...)",
    )(f)
    f = click.option("--prefix", help="key prefix [qw]")(f)
    f = click.option("--ssl-ca-certs", help="CA file for rediss:// URLs")(f)
    f = click.option("--log-level", help="debug|info|warning [info]")(f)
    f = click.option("--log-format", type=click.Choice(["json", "console"]))(f)
    return f


@click.group()
@click.version_option(package_name="queueworks")
def main() -> None:
    """queueworks: an elastic work-queue on Redis Streams."""


@main.command()
@_common
@click.option("--name", help="worker id (default: host-pid-random, unique per process)")
@click.option("--allow", multiple=True, help="module prefix handlers may come from (repeat)")
@click.option("--label", multiple=True, help="k=v label, matched by node_selector (repeat)")
@click.option("--heartbeat-interval", type=float)
@click.option("--heartbeat-ttl", type=float)
@click.option("--batch-size", type=int)
@click.option("--grace-period", type=float, help="seconds a warm stop may take [10]")
@click.option("--id-file", type=click.Path(dir_okay=False), help="write the worker id here")
def worker(
    name: str | None,
    allow: tuple[str, ...],
    label: tuple[str, ...],
    id_file: str | None,
    **flags: Any,
) -> None:
    """Join the pool and process subtasks of the tasks this worker is given."""
    from workers.worker import Worker

    settings = _settings(**flags)
    configure(settings.log_level, settings.log_format)
    labels = {}
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"label {item!r} must be key=value", param_hint="--label")
        labels[key] = value
    if not allow:
        click.echo("warning: no --allow prefix given; every handler will be refused", err=True)
    w = Worker(settings, worker_id=name, allow=list(allow), labels=labels)
    if id_file:
        Path(id_file).write_text(w.id)
    install_stop_signals(w.stop, settings.grace_period)
    try:
        w.run()
    except ColdStop:
        sys.exit(1)


@main.command()
@_common
@click.option("--lease-ttl", type=float)
@click.option("--reconcile-interval", type=float)
@click.option("--full-pass-interval", type=float, help="s to re-read everything (backstop)")
def controller(**flags: Any) -> None:
    """Give tasks their node sets and keep them sized (run several: one leads)."""
    from controller.main import Controller

    settings = _settings(**flags)
    configure(settings.log_level, settings.log_format)
    c = Controller(settings)
    install_stop_signals(c.stop, 5.0)
    try:
        c.run()
    except ColdStop:
        sys.exit(1)


@main.command()
@_common
@click.argument("handler")
@click.option("--name", default=None, help="task name [the handler]")
@click.option("--count", type=int, help='submit N subtasks {"x": i}')
@click.option("--jsonl", type=click.File("r"), help="one JSON payload per line ('-' = stdin)")
@click.option("--min-nodes", type=int, default=1)
@click.option("--max-nodes", type=int, default=None)
@click.option("--priority", type=int, default=0)
@click.option("--max-attempts", type=int, default=3)
@click.option("--partitions", type=int, default=0)
@click.option("--wait/--no-wait", default=False, help="wait for the task to finish")
def submit(
    handler: str,
    name: str | None,
    count: int | None,
    jsonl: Any,
    min_nodes: int,
    max_nodes: int | None,
    priority: int,
    max_attempts: int,
    partitions: int,
    wait: bool,
    **flags: Any,
) -> None:
    """Submit a target task; prints its id."""
    from queueworks.client import Client
    from queueworks.models import TaskSpec

    settings = _settings(**flags)
    if (count is None) == (jsonl is None):
        raise click.UsageError("give exactly one of --count or --jsonl")
    subtasks: Any = (
        ({"x": i} for i in range(count))
        if count is not None
        else (json.loads(line) for line in jsonl if line.strip())
    )
    spec = TaskSpec(
        name=name or handler,
        handler=handler,
        subtasks=subtasks,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        priority=priority,
        max_attempts=max_attempts,
        partitions=partitions,
    )
    client = Client.from_url(
        settings.redis_url, prefix=settings.prefix, ssl_ca_certs=settings.ssl_ca_certs
    )
    task = client.submit(spec)
    click.echo(task.id)
    if wait:
        status = task.wait()
        click.echo(f"{status.state}: {status.done} done, {status.dead} dead of {status.total}")


@main.command()
@_common
@click.option("--watch", is_flag=True, help="refresh every --interval seconds")
@click.option("--interval", type=float, default=1.0)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--limit", type=int, default=100, show_default=True, help="newest tasks shown")
@click.option("--offset", type=int, default=0, help="skip this many of the newest first")
def info(
    watch: bool, interval: float, as_json: bool, limit: int, offset: int, **flags: Any
) -> None:
    """Tasks (state, progress, node set) and workers, like `rq info`."""
    from queueworks.client import Client
    from queueworks.info import render

    settings = _settings(**flags)
    client = Client.from_url(
        settings.redis_url, prefix=settings.prefix, ssl_ca_certs=settings.ssl_ca_certs
    )
    while True:
        text = render(client, as_json=as_json, limit=limit, offset=offset)
        if watch:
            click.clear()
        click.echo(text)
        if not watch:
            return
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return


@main.command()
@_common
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", type=int, default=9181, show_default=True)
@click.option(
    "--token",
    envvar="QUEUEWORKS_DASHBOARD_TOKEN",
    help="access token; required beyond loopback [env QUEUEWORKS_DASHBOARD_TOKEN]",
)
@click.option("--refresh", type=float, default=1.0, show_default=True, help="live update, s")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="QUEUEWORKS_DASHBOARD_ALLOWED_HOSTS",
    help="a Host name to serve besides the loopback ones (repeat; bound beyond loopback: "
    "the only names served) [env QUEUEWORKS_DASHBOARD_ALLOWED_HOSTS, space-separated]",
)
def dashboard(
    host: str,
    port: int,
    token: str | None,
    refresh: float,
    allowed_hosts: tuple[str, ...],
    **flags: Any,
) -> None:
    """Web dashboard, JSON API and /metrics (default http://127.0.0.1:9181)."""
    import uvicorn

    from queueworks.connection import redact_url
    from queueworks.dashboard import BindRefused, DashboardConfig, check_bind, create_app

    settings = _settings(**flags)
    configure(settings.log_level, settings.log_format)
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
        )
    except (BindRefused, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"dashboard on http://{host}:{port} for {redact_url(settings.redis_url)}", err=True)
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        access_log=settings.log_level.lower() == "debug",
    )


@main.command()
@_common
@click.option("--id-file", type=click.Path(dir_okay=False), help="check this worker's heartbeat")
@click.option("--controller", "is_controller", is_flag=True, help="check that a leader exists")
def health(id_file: str | None, is_controller: bool, **flags: Any) -> None:
    """Exit 0 when Redis answers (and the worker's heartbeat is alive); else non-zero."""
    from queueworks.connection import connect
    from queueworks.keys import Keys

    settings = _settings(**flags)
    keys = Keys(settings.prefix)
    try:
        r = connect(settings.redis_url, ssl_ca_certs=settings.ssl_ca_certs, socket_timeout=3)
        r.ping()
        if id_file:
            wid = Path(id_file).read_text().strip()
            if not r.exists(keys.worker_heartbeat(wid)):
                click.echo(f"unhealthy: worker {wid} has no heartbeat", err=True)
                sys.exit(2)
        if is_controller and not r.exists(keys.leader):
            click.echo("unhealthy: no controller holds the leader lease", err=True)
            sys.exit(2)
    except (OSError, Exception) as exc:
        if isinstance(exc, SystemExit):
            raise
        click.echo(f"unhealthy: {type(exc).__name__}", err=True)
        sys.exit(1)
    click.echo("ok")


@main.command()
@click.option("--workers", "n_workers", type=int, default=3, show_default=True)
@click.option("--subtasks", type=int, default=5000, show_default=True)
@click.option("--embedded", is_flag=True, help="always start an embedded Redis")
@click.option("--redis", "redis_url", help="Redis URL [env QUEUEWORKS_REDIS_URL]")
def demo(n_workers: int, subtasks: int, embedded: bool, redis_url: str | None) -> None:
    """Run everything locally: Redis (embedded if none is reachable), a controller, workers,
    and an example task with a progress bar."""
    from queueworks.demo import run_demo

    sys.exit(
        run_demo(n_workers=n_workers, subtasks=subtasks, embedded=embedded, redis_url=redis_url)
    )


if __name__ == "__main__":  # pragma: no cover
    main()
