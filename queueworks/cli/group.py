"""The ``queueworks`` command: the group, and the commands that start processes (worker,
controller, demo); the others come from ``queueworks.cli`` (enqueue, submit, info, dead,
health, dashboard, autoscale, redis), each imported when named (``COMMANDS``).

Settings come from flags and ``QUEUEWORKS_*`` environment variables (flags win); every
option's help names its default and its variable, both read from ``Settings``. Expected
failures are one line on stderr and a non-zero exit (``queueworks.cli.failures``); a
traceback only with ``queueworks --debug``.

Signal handlers of the worker and controller live here and only here: the first
SIGTERM/SIGINT is a warm stop (finish or abort the step at a safe point, leave the node set,
exit); a second one, or the grace period running out, is a cold stop that interrupts the
running handler.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import click

from queueworks.cli.failures import BadInput, CliError, OneLineErrors
from queueworks.cli.options import (
    ENV,
    PROCESSES,
    allow_eviction,
    common,
    given_options,
    key_values,
    option,
    queue_names,
    setting,
    settings_from_flags,
)
from queueworks.process import ColdStop, install_pass_on_signals, install_stop_signals

# the commands of modules of their own, by name, imported when named (or listed, by
# --help): `queueworks health`, a container's health check run every few seconds, imports
# what it uses and not every command's client
COMMANDS = {
    "submit": "queueworks.cli.submit:submit",
    "enqueue": "queueworks.cli.enqueue:enqueue",
    "schedule": "queueworks.cli.schedules:schedule",
    "schedules": "queueworks.cli.schedules:schedules",
    "unschedule": "queueworks.cli.schedules:unschedule",
    "queue": "queueworks.cli.queue_actions:queue",
    "job": "queueworks.cli.job:job",
    "info": "queueworks.cli.info:info",
    "dead": "queueworks.cli.dead:dead",
    "health": "queueworks.cli.health:health",
    "dashboard": "queueworks.cli.dashboard_server:dashboard",
    "autoscale": "queueworks.cli.autoscale:autoscale",
    "redis": "queueworks.cli.devserver:redis_command",
}


class Commands(OneLineErrors):
    """The group: its own commands (``worker``, ``controller``, ``demo``) and those of
    ``COMMANDS``, each imported when first named."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, name = COMMANDS[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=Commands)
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


def otel_flag(f: Any) -> Any:
    return option(
        "--otel",
        is_flag=True,
        help="trace with OpenTelemetry (the otel extra), set up from the OTEL_* variables",
    )(f)


def start_tracing(service: str) -> None:
    """--otel: the OpenTelemetry SDK set up from the ``OTEL_*`` variables, and this
    process instrumented (``queueworks.otel.setup``)."""
    try:
        from queueworks.otel import setup
    except ImportError as exc:
        raise BadInput(
            f"--otel needs the otel extra: pip install 'queueworks[otel]' ({exc})"
        ) from None
    try:
        setup(service)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


@main.command(short_help="Join the pool and process subtasks and jobs.")
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
@option(
    "--django",
    "django_settings",
    metavar="SETTINGS",
    help="a Django project's settings module: Django is set up before handlers are "
    "imported, and the project's tasks (Django's Tasks framework) run here",
)
@option(
    "--queues",
    envvar=ENV + "QUEUES",
    show_envvar=True,
    metavar="A,B",
    callback=queue_names,
    help="serve only these queues (comma-separated); NAME:WEIGHT weighs them against each "
    "other (high:3,default:1: about 3 jobs of high for 1 of default while both have jobs)",
    show_default="every queue this worker may serve",
)
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
    help="write the worker id (with --processes: the pool's id) to this file (for "
    "`queueworks health --id-file`)",
)
@option(
    "--processes",
    type=PROCESSES,
    default="1",
    envvar=ENV + "PROCESSES",
    show_envvar=True,
    show_default=True,
    help="worker processes to run, each a worker of its own, kept running by a small "
    "supervisor (a member that exits or is killed is started again); `auto`: one per CPU "
    "this process may use",
)
@option(
    "--max-jobs-per-child",
    type=click.IntRange(min=1),
    envvar=ENV + "MAX_JOBS_PER_CHILD",
    show_envvar=True,
    show_default="no limit",
    help="a pool's member leaves gracefully after this many jobs (or subtasks) and a fresh "
    "one starts (runs a pool even with --processes 1)",
)
@option(
    "--max-memory-per-child",
    type=click.IntRange(min=1),
    metavar="MB",
    envvar=ENV + "MAX_MEMORY_PER_CHILD",
    show_envvar=True,
    show_default="no limit",
    help="a pool's member whose resident memory passes this many MB after a job leaves "
    "gracefully and a fresh one starts (runs a pool even with --processes 1)",
)
@allow_eviction
@otel_flag
def worker(
    otel: bool,
    name: str | None,
    allow: tuple[str, ...],
    label: tuple[str, ...],
    queues: dict[str, int] | None,
    id_file: str | None,
    processes: int,
    max_jobs_per_child: int | None,
    max_memory_per_child: int | None,
    django_settings: str | None,
    **flags: Any,
) -> None:
    """Join the pool and process subtasks of the tasks this worker is given, and the jobs
    of the queues it serves (every queue its --allow prefixes cover, or --queues).

    Handlers are imported from the folder it starts in too (as rq and celery workers do),
    under the --allow prefixes only. SIGTERM or SIGINT: warm stop (finish or abort the
    step, leave the node set, exit 0); a second signal, or the grace period running out,
    interrupts the handler. With --processes N (or a per-child limit) the same goes for
    every member: the supervisor passes the signal on and exits 0 once each has left."""
    labels = key_values(label, "--label", "label")
    limits = max_jobs_per_child is not None or max_memory_per_child is not None
    from queueworks.workers.pool import POOL_MEMBER

    pool_member = os.environ.get(POOL_MEMBER)  # set by a pool's supervisor on its members
    if not pool_member and (processes > 1 or limits):
        run_pool(name, processes, id_file, flags)
        return
    from queueworks.workers.worker import Worker

    if otel:
        start_tracing("queueworks-worker")
    settings = settings_from_flags(**flags)
    here = os.getcwd()
    if here not in sys.path:  # `python -m` puts it there; the `queueworks` script does not
        sys.path.insert(0, here)
    if django_settings:
        try:
            from queueworks.contrib.django.worker import setup_django
        except ImportError as exc:  # no Django (or, on Django 5.2, no django-tasks)
            raise CliError(str(exc)) from None
        try:
            allow = setup_django(django_settings, allow)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    if not allow:
        click.echo("warning: no --allow prefix given; every handler will be refused", err=True)
    try:
        names = None if queues is None else list(queues)
        w = Worker(
            settings, worker_id=name, allow=list(allow), labels=labels, queues=names, weights=queues
        )
    except ValueError as exc:  # the URL or the worker id
        raise BadInput(str(exc)) from None
    if pool_member:  # a cancelled handler that does not stop ends its process: its pool
        w.parts.running.cancel_ends_process = True  # starts a fresh one at once
    if id_file:
        Path(id_file).write_text(w.id)
    install_stop_signals(w.stop, settings.grace_period)
    if limits:
        from queueworks.workers.retire import Retirement

        retire = Retirement(
            w.state,
            w.watchdog,
            w.retire,
            w.log,
            max_jobs=max_jobs_per_child,
            max_memory_mb=max_memory_per_child,
        )
        retire.start()
    try:
        w.run()  # stopped before Redis answered: the connection error, as one line
    except ColdStop:
        sys.exit(1)
    if w.exit_code:  # hung (its event loop): a thread of it may never end, so at once
        sys.stderr.flush()
        os._exit(w.exit_code)


def run_pool(name: str | None, processes: int, id_file: str | None, flags: dict[str, Any]) -> None:
    """``worker --processes N``: the supervisor (``workers.pool``). It imports no handler:
    each member is a fresh ``queueworks worker`` with the options given here."""
    from queueworks.protocol.keys import Keys, check_worker_id
    from queueworks.transport.connection import connect_settings
    from queueworks.workers.pool import Pool
    from queueworks.workers.worker import default_worker_id

    ctx = click.get_current_context()
    settings = settings_from_flags(**flags)
    try:
        pool_id = check_worker_id(name or default_worker_id())
        check_worker_id(f"{pool_id}-{10**9}")  # its members' ids: <pool>-<n>
        r = connect_settings(settings)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    command = ["--debug"] if ctx.find_root().params.get("debug") else []
    command += ["worker", *given_options(ctx, skip={"name", "id_file", "processes"})]
    pool = Pool(pool_id, processes, command, r=r, keys=Keys(settings.prefix))
    if id_file:
        Path(id_file).write_text(pool.id)
    install_pass_on_signals(lambda cold: pool.stop(cold=cold))
    sys.exit(pool.run())


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
    "longest round of the backstop sweep, which re-reads every task and worker 50 a "
    "second (0: no bound, a level cost; a bound reads more a second past 50 x it)",
    type=float,
)
@setting(
    "--drain-target",
    "drain_target",
    "seconds a backlog should take to drain: the wanted workers (autoscale) are counted for it",
    type=float,
)
@allow_eviction
@otel_flag
def controller(otel: bool, **flags: Any) -> None:
    """Give tasks their node sets and keep them sized.

    Run two or more: one holds the leader lease, the others stand by."""
    from queueworks.controller.main import Controller

    if otel:
        start_tracing("queueworks-controller")
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
    result is right. In a Redis that answers, its keys have a prefix of their own
    (demo-...) and are deleted when it ends."""
    from queueworks.contrib.demo import run_demo

    sys.exit(
        run_demo(n_workers=n_workers, subtasks=subtasks, embedded=embedded, redis_url=redis_url)
    )


if __name__ == "__main__":  # pragma: no cover
    main()
