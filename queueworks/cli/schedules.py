"""``queueworks schedule``, ``schedules`` and ``unschedule``: a queue's periodic jobs from the
command line (``Queue.schedule``, ``Queue.schedules``, ``Queue.unschedule``). Bad input (a
name, a handler path, the payload, ``--every``/``--cron``) exits 2 naming it."""

from __future__ import annotations

import json
import time
from typing import Any

import click
import pydantic

from queueworks.cli.failures import BadInput, CliError, validation_text
from queueworks.cli.options import (
    client_for,
    common,
    option,
    settings_from_flags,
    task_id_param,
)
from queueworks.protocol.models import Schedule


def _handle(flags: dict[str, Any], queue: str) -> Any:
    """A handle to ``queue`` that neither creates nor opens it (``revives`` off)."""
    from queueworks.client.queue_handle import Queue
    from queueworks.queue.queue_settings import DEFAULTS

    return Queue(client_for(settings_from_flags(**flags)), queue, DEFAULTS, revives=False)


def describe(s: Schedule, now: float) -> str:
    """One line of a schedule, as ``schedules`` and ``info`` show it."""
    when = f"every {s.every:g}s" if s.every is not None else f"cron '{s.cron}'"
    nxt = "-" if s.next_run is None else f"in {max(0.0, s.next_run - now):.1f}s"
    last = s.last_job or "-"
    return f"{s.name}  {s.handler}  {when}  next {nxt}  last job {last}"


@click.command(short_help="Enqueue a job on a queue every S seconds or on a cron schedule.")
@common
@click.argument("queue", metavar="QUEUE", callback=task_id_param)
@click.argument("name")
@click.argument("handler")
@option("--json", "payload", default="null", show_default=True, help="each job's payload, JSON")
@option("--every", type=float, default=None, help="seconds between two runs (the first then)")
@option("--cron", default=None, help="a 5-field cron expression, UTC ('*/5 * * * *')")
def schedule(
    queue: str,
    name: str,
    handler: str,
    payload: str,
    every: float | None,
    cron: str | None,
    **flags: Any,
) -> None:
    """Schedule NAME on QUEUE: a job of HANDLER ("package.module:function") with the --json
    payload, every --every seconds or at each time of --cron (UTC), enqueued by the leading
    controller, one per due time. A schedule of the same NAME is replaced. QUEUE is created
    (default settings) when it does not exist. Prints the schedule as JSON."""
    from queueworks.errors import NotJSON
    from queueworks.protocol.messages import from_json

    try:
        value = from_json(payload, "--json")
    except (ValueError, NotJSON) as exc:
        raise BadInput(str(exc)) from None
    client = client_for(settings_from_flags(**flags))
    try:
        made = client.queue(queue).schedule(name, handler, value, every=every, cron=cron)
    except pydantic.ValidationError as exc:
        raise BadInput(validation_text(exc)) from None
    except ValueError as exc:
        raise BadInput(str(exc).replace("every=seconds or cron=", "--every or --cron ")) from None
    click.echo(made.model_dump_json())


@click.command(short_help="A queue's schedules: handler, every/cron, next run, last job.")
@common
@click.argument("queue", metavar="QUEUE", callback=task_id_param)
@option("--json", "as_json", is_flag=True, default=False, help="print them as a JSON list")
def schedules(queue: str, as_json: bool, **flags: Any) -> None:
    """List the schedules of QUEUE, by name. Exit 1 if there is no queue QUEUE."""
    q = _handle(flags, queue)
    found = q.schedules()
    if not found and not q.client.redis.sismember(q.client.keys.queues, queue):
        raise CliError(f"no queue {queue}")
    if as_json:
        click.echo(json.dumps([s.model_dump(mode="json") for s in found], indent=2))
        return
    click.echo(f"{len(found)} schedule(s) of queue {queue}")
    now = time.time()
    for s in found:
        click.echo(f"  {describe(s, now)}")


@click.command(short_help="Remove a queue's schedule.")
@common
@click.argument("queue", metavar="QUEUE", callback=task_id_param)
@click.argument("name")
def unschedule(queue: str, name: str, **flags: Any) -> None:
    """Remove the schedule NAME of QUEUE (jobs it enqueued stay). Exit 1 if it had none."""
    try:
        removed = _handle(flags, queue).unschedule(name)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if not removed:
        raise CliError(f"queue {queue} has no schedule {name!r}")
    click.echo(f"unscheduled {name}")
