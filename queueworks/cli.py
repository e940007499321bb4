"""The ``queueworks`` command: worker, controller, submit, enqueue (``cli_enqueue``), info,
dead, health, dashboard, demo, redis (``cli_redis``).

Settings come from flags and ``QUEUEWORKS_*`` environment variables (flags win); every
option's help names its default and its variable, both read from ``Settings``. Expected
failures are one line on stderr and a non-zero exit (``queueworks.cli_errors``); a
traceback only with ``queueworks --debug``.

Signal handlers live here and only here: the first SIGTERM/SIGINT is a warm stop (finish or
abort the step at a safe point, leave the node set, exit); a second one, or the grace
period running out, is a cold stop that interrupts the running handler.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from queueworks.cli_enqueue import enqueue
from queueworks.cli_errors import (
    EXIT_UNFINISHED,
    BadInput,
    OneLineErrors,
    explain,
    missing_extra,
)
from queueworks.cli_options import (
    ATTEMPTS,
    ENV,
    NODES,
    PRIORITY,
    allow_eviction,
    client_for,
    common,
    option,
    seconds,
    setting,
    settings_from_flags,
    task_id_param,
)
from queueworks.cli_redis import redis_command
from queueworks.signals import ColdStop, install_stop_signals
from queueworks.validate import MAX_PARTITIONS


@click.group(cls=OneLineErrors)
@click.version_option(package_name="queueworks")
@option(
    "--debug",
    is_flag=True,
    envvar=ENV + "DEBUG",
    show_envvar=True,
    help="show the traceback of an error instead of its one-line message",
)
def main(debug: bool) -> None:
    """queueworks: an elastic work-queue on Redis Streams.

    Every option can also be set by the environment variable its help names (a flag wins
    over its variable). An expected error is one line on stderr; `queueworks --debug
    COMMAND` shows its traceback. Exit codes: 0 success, 1 error (Redis unreachable,
    credentials refused, no such task, missing extra), 2 bad usage or input, 3 `submit
    --wait` whose task did not fully succeed, or `enqueue --wait` whose job died.
    """


main.add_command(enqueue)
main.add_command(redis_command)


def _labels(items: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"label {item!r} must be key=value", param_hint="--label")
        labels[key] = value
    return labels


@main.command(short_help="Join the pool and process subtasks.")
@common
@option(
    "--name",
    help="worker id, unique in the pool",
    show_default="<host>-<pid>-<random>, unique per process",
)
@option(
    "--allow",
    multiple=True,
    help="module prefix handlers may come from (repeat); none given: every handler refused",
)
@option("--label", multiple=True, help="k=v label, matched by a task's node_selector (repeat)")
@setting("--heartbeat-interval", "heartbeat_interval", "seconds between heartbeats", type=float)
@setting(
    "--heartbeat-ttl",
    "heartbeat_ttl",
    "seconds without a heartbeat before the others reclaim this worker's work",
    type=float,
)
@setting(
    "--batch-size", "batch_size", "most subtasks read at a time (fewer for slow handlers)", type=int
)
@setting(
    "--concurrency",
    "concurrency",
    "subtasks or jobs of the current task in flight at once (async def handlers on one "
    "event loop, plain ones on a pool of this many threads)",
    type=int,
)
@setting(
    "--grace-period",
    "grace_period",
    "seconds a warm stop (SIGTERM) may take before the handler is interrupted",
    type=float,
)
@option(
    "--id-file",
    type=click.Path(dir_okay=False),
    help="write the worker id to this file (for `queueworks health --id-file`)",
)
@allow_eviction
def worker(
    name: str | None,
    allow: tuple[str, ...],
    label: tuple[str, ...],
    id_file: str | None,
    **flags: Any,
) -> None:
    """Join the pool and process subtasks of the tasks this worker is given.

    Handlers are imported from the folder it starts in too (as rq and celery workers do),
    under the --allow prefixes only. SIGTERM or SIGINT: warm stop (finish or abort the
    step, leave the node set, exit 0); a second signal, or the grace period running out,
    interrupts the handler."""
    from queueworks.workers.worker import Worker

    settings = settings_from_flags(**flags)
    here = os.getcwd()
    if here not in sys.path:  # `python -m` puts it there; the `queueworks` script does not
        sys.path.insert(0, here)
    labels = _labels(label)
    if not allow:
        click.echo("warning: no --allow prefix given; every handler will be refused", err=True)
    try:
        w = Worker(settings, worker_id=name, allow=list(allow), labels=labels)
    except ValueError as exc:  # the URL or the worker id
        raise BadInput(str(exc)) from None
    if id_file:
        Path(id_file).write_text(w.id)
    install_stop_signals(w.stop, settings.grace_period)
    try:
        w.run()  # stopped before Redis answered: the connection error, as one line
    except ColdStop:
        sys.exit(1)
    if w.exit_code:  # hung (its event loop): a thread of it may never end, so at once
        sys.stderr.flush()
        os._exit(w.exit_code)


@main.command(short_help="Give tasks node sets and keep them sized.")
@common
@setting(
    "--lease-ttl",
    "lease_ttl",
    "seconds the leader lease lasts; a standby takes over within it",
    type=float,
)
@setting(
    "--reconcile-interval",
    "reconcile_interval",
    "seconds between periodic passes (events wake it at once anyway)",
    type=float,
)
@setting(
    "--full-pass-interval",
    "full_pass_interval",
    "seconds over which the backstop sweep re-reads every task and worker",
    type=float,
)
@allow_eviction
def controller(**flags: Any) -> None:
    """Give tasks their node sets and keep them sized.

    Run two or more: one holds the leader lease, the others stand by."""
    from queueworks.controller.main import Controller

    settings = settings_from_flags(**flags)
    try:
        c = Controller(settings)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    install_stop_signals(c.stop, 5.0)
    try:
        c.run()
    except ColdStop:
        sys.exit(1)


def _jsonl(lines: Any, source: str) -> Iterator[Any]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            message = f"--jsonl {source} line {number}: not JSON ({exc})"
            raise BadInput(message) from None


@main.command(short_help="Submit a target task; print its id.")
@common
@click.argument("handler")
@option("--name", help="task name", show_default="the handler")
@option("--count", type=click.IntRange(min=0), help='submit N subtasks {"x": 0} ... {"x": N-1}')
@option(
    "--jsonl",
    type=click.File("r"),
    help="submit one subtask per line of this JSON-lines file ('-' = stdin)",
)
@option("--min-nodes", type=NODES, default=1, show_default=True, help="fewest workers it runs on")
@option(
    "--max-nodes",
    type=NODES,
    help="most workers it runs on",
    show_default="no limit",
)
@option(
    "--priority",
    type=PRIORITY,
    default=0,
    show_default=True,
    help="higher runs first and may take nodes from lower",
)
@option(
    "--max-attempts",
    type=ATTEMPTS,
    default=3,
    show_default=True,
    help="runs of a failing subtask before it is dead-lettered",
)
@option(
    "--partitions",
    type=click.IntRange(0, MAX_PARTITIONS),
    default=0,
    show_default=True,
    help="ordered task: P partitions by each payload's 'key' (0 = unordered)",
)
@option(
    "--wait/--no-wait",
    default=False,
    show_default=True,
    help="wait for the task to finish (saying why while it waits for nodes); exit 3 if it "
    "did not fully succeed",
)
@option(
    "--timeout",
    type=seconds(0),
    default=None,
    help="with --wait: give up after this many seconds (exit 3)",
    show_default="wait for as long as it takes",
)
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
    timeout: float | None,
    **flags: Any,
) -> None:
    """Submit a target task of HANDLER ("package.module:function"); print its id.

    Give exactly one of --count and --jsonl. With --wait: print the outcome; exit 0 only
    when every subtask succeeded, else 3 with the first dead letters' reasons."""
    from queueworks.models import TaskSpec, parse_handler_path

    settings = settings_from_flags(**flags)
    if (count is None) == (jsonl is None):
        raise click.UsageError("give exactly one of --count or --jsonl")
    try:
        parse_handler_path(handler)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    subtasks: Any = (
        ({"x": i} for i in range(count)) if count is not None else _jsonl(jsonl, jsonl.name)
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
    client = client_for(settings)
    task = client.submit(spec)
    click.echo(task.id)
    if wait:
        from queueworks.dead import outcome, wait_saying_why

        status = wait_saying_why(task, timeout, lambda line: click.echo(line, err=True))
        if status is None:
            click.echo(f"error: task {task.id} did not finish within {timeout} s", err=True)
            sys.exit(EXIT_UNFINISHED)
        lines, ok = outcome(task, status)
        click.echo(lines[0])
        for line in lines[1:]:
            click.echo(line, err=True)
        if not ok:
            sys.exit(EXIT_UNFINISHED)


@main.command(short_help="Tasks, queues (backlog, node sets) and workers.")
@common
@option("--watch", is_flag=True, help="redraw every --interval seconds until Ctrl-C (or SIGTERM)")
@option(
    "--interval",
    type=seconds(0, 3600, above=True),
    default=1.0,
    show_default=True,
    help="seconds between redraws",
)
@option("--json", "as_json", is_flag=True, help="machine-readable output")
@option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="how many of the newest tasks to show",
)
@option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="skip this many of the newest tasks first",
)
def info(
    watch: bool, interval: float, as_json: bool, limit: int, offset: int, **flags: Any
) -> None:
    """Tasks (the newest, a page at a time: state, progress, node set with ranks), queues
    (backlog, rate, node set) and workers, like `rq info`."""
    from queueworks.info import render

    settings = settings_from_flags(**flags)
    client = client_for(settings)
    if not watch:
        click.echo(render(client, as_json=as_json, limit=limit, offset=offset))
        return
    _end_watch_on_signals()
    try:
        while True:
            text = render(client, as_json=as_json, limit=limit, offset=offset)
            click.clear()
            click.echo(text)
            time.sleep(interval)
    except KeyboardInterrupt:  # Ctrl-C, SIGINT or SIGTERM, wherever the redraw was
        return


def _end_watch_on_signals() -> None:
    """SIGINT and SIGTERM end ``info --watch`` (exit 0). Set here, not left to Python: a
    process started with SIGINT ignored (``cmd &`` in a script) keeps it ignored, and the
    watch would redraw forever."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


@main.command(short_help="List (or requeue) a task's dead letters.")
@common
@click.argument("task_id", metavar="TASK", callback=task_id_param)
@option("--json", "as_json", is_flag=True, help="machine-readable output")
@option(
    "--index",
    "indexes",
    type=click.IntRange(min=0),
    multiple=True,
    help="only the dead letters of this subtask index (repeat)",
    show_default="all",
)
@option(
    "--limit",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="read at most N dead letters",
)
@option(
    "--requeue",
    is_flag=True,
    help="put the listed dead letters back on the task's stream (reopens a completed task)",
)
def dead(
    task_id: str,
    as_json: bool,
    indexes: tuple[int, ...],
    limit: int,
    requeue: bool,
    **flags: Any,
) -> None:
    """List the dead letters of TASK: index, attempts, reason, last error line.

    With --requeue, each listed one goes back on the task's stream with its index and
    payload and the dead count goes down (a completed task becomes active again)."""
    from queueworks.dead import render, requeue_all

    settings = settings_from_flags(**flags)
    client = client_for(settings)
    task = client.task(task_id)
    status = task.status(with_nodes=False)  # TaskNotFound: one line
    letters = [d for d in task.dead_letters(count=limit) if not indexes or d.index in indexes]
    queue = bool(client.redis.sismember(client.keys.queues, task_id))
    click.echo(render(status, letters, as_json=as_json, queue=queue))
    if requeue:
        click.echo(requeue_all(client, task_id, letters), err=as_json)


@main.command(short_help="Web dashboard, JSON API and /metrics.")
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
def dashboard(
    host: str,
    port: int,
    token: str | None,
    refresh: float,
    allowed_hosts: tuple[str, ...],
    **flags: Any,
) -> None:
    """Web dashboard, JSON API and /metrics (default http://127.0.0.1:9181)."""
    try:
        import uvicorn

        from queueworks.dashboard import BindRefused, DashboardConfig, check_bind, create_app
    except ModuleNotFoundError as exc:
        raise missing_extra("dashboard", exc.name or "?") from None
    from queueworks.connection import redact_url

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
    from queueworks.connection import UNAVAILABLE, connect_settings
    from queueworks.eviction import warn_evicting
    from queueworks.logs import get_logger

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


@main.command(short_help="Exit non-zero when Redis or a process is unhealthy.")
@common
@option(
    "--id-file",
    type=click.Path(dir_okay=False),
    help="also check the heartbeat of the worker whose id is in this file",
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
    from queueworks.connection import connect
    from queueworks.keys import Keys

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
            if not r.exists(keys.worker_heartbeat(wid)):
                click.echo(f"unhealthy: worker {wid} has no heartbeat", err=True)
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


@main.command(short_help="Everything on one machine, with a progress bar.")
@option(
    "--workers",
    "n_workers",
    type=click.IntRange(1, 64),
    default=3,
    show_default=True,
    help="worker processes to start",
)
@option(
    "--subtasks",
    type=click.IntRange(min=0),
    default=5000,
    show_default=True,
    help="subtasks of the demo task",
)
@option(
    "--embedded",
    is_flag=True,
    help="always start an embedded Redis-compatible server, even if --redis answers",
)
@setting(
    "--redis",
    "redis_url",
    "Redis to use when it answers; else an embedded server is started",
)
def demo(n_workers: int, subtasks: int, embedded: bool, redis_url: str | None) -> None:
    """Run everything locally and show a task's progress.

    Redis (embedded if none answers), a controller, --workers workers and an example
    task of --subtasks subtasks with a progress bar; then a summary. Exit 0 when every
    result is right."""
    from queueworks.demo import run_demo

    sys.exit(
        run_demo(n_workers=n_workers, subtasks=subtasks, embedded=embedded, redis_url=redis_url)
    )


if __name__ == "__main__":  # pragma: no cover
    main()
