"""``queueworks enqueue``: one job on a queue from the command line, and ``--wait`` for it.

The queue is opened as ``Client.queue`` opens it: created with the settings given (the rest
default) when it does not exist, else the given settings must be the queue's own; a
cancelled queue takes the job only with ``--reopen``. While ``--wait`` waits, each new reason
the queue waits for nodes, or the job waits alone (no member may run its handler), is said
once, as ``submit --wait`` does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import pydantic

from queueworks.cli.failures import EXIT_UNFINISHED, BadInput, validation_text
from queueworks.cli.options import (
    client_for,
    common,
    option,
    queue_setting_options,
    seconds,
    settings_from_flags,
    task_id_param,
)
from queueworks.protocol.priorities import DEFAULT, HIGHEST, LOWEST
from queueworks.protocol.validate import MAX_TTL
from queueworks.queue.queue_settings import SETTINGS

if TYPE_CHECKING:
    from queueworks.client.queue_handle import Queue

POLL = 0.5  # s between looks at the queue's reason while the job is not finished


@dataclass(frozen=True)
class Outcome:
    """A finished job: ``ok`` with its ``result``, or dead / cancelled with ``reason``."""

    ok: bool
    result: Any = None
    reason: str = ""


def wait_for_job(
    queue: Queue, job_id: str, timeout: float | None, say: Callable[[str], None]
) -> Outcome | None:
    """Wait for job ``job_id`` of ``queue`` to finish; None if ``timeout`` s passed first."""
    from queueworks.cli.info import ControllerWatch
    from queueworks.errors import JobFailed

    job = queue.job(job_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    said: str | None = None
    controller = ControllerWatch(queue.client, say)
    while True:
        left = POLL if deadline is None else max(0.0, min(POLL, deadline - time.monotonic()))
        try:
            return Outcome(True, job.result(timeout=left))
        except TimeoutError:
            pass
        except JobFailed as exc:
            return Outcome(False, reason=exc.summary)
        controller.look()
        reason = queue.task.status(with_nodes=False).reason or job.status().reason
        if reason and reason != said:
            say(f"waiting: {reason}")
            said = reason
        if deadline is not None and time.monotonic() >= deadline:
            return None


@click.command(short_help="Enqueue one job on a queue; print its id.")
@common
@click.argument("queue", metavar="QUEUE", callback=task_id_param)
@click.argument("handler")
@option(
    "--json",
    "payload",
    default="null",
    show_default=True,
    help="the job's payload, as JSON (given to the handler)",
)
@option(
    "--args",
    "args",
    default=None,
    metavar="JSON",
    help="a typed job function's (@job) arguments by position, as a JSON array",
    show_default="none",
)
@option(
    "--kwargs",
    "kwargs",
    default=None,
    metavar="JSON",
    help="a typed job function's (@job) arguments by name, as a JSON object",
    show_default="none",
)
@option(
    "--delay",
    type=seconds(0, MAX_TTL),
    help="run it this many seconds from now, not before",
    show_default="now",
)
@option(
    "--key",
    default=None,
    help="a unique key: while a job with it is scheduled, queued or running (or finished "
    "less than --unique-for ago), print that job's id instead of enqueueing another",
    show_default="none",
)
@option(
    "--unique-for",
    type=seconds(0, MAX_TTL, above=True),
    default=None,
    help="with --key: the key stays held this many seconds after its job finished",
    show_default="only while the job is not finished",
)
@option(
    "--group",
    default=None,
    help="the job's group: with the queue's --group-limit, at most that many jobs of one "
    "group run at once",
    show_default="none",
)
@option(
    "--priority",
    "job_priority",
    type=click.IntRange(LOWEST, HIGHEST),
    default=DEFAULT,
    show_default=True,
    help=f"the job's priority in its queue, from {LOWEST} to {HIGHEST}: higher runs first, "
    "in order of enqueue within one priority",
)
@option(
    "--depends-on",
    "depends_on",
    multiple=True,
    metavar="QUEUE/JOB_ID|task:TASK_ID",
    help="run it once this job (of any queue) or task is done; dead if it is not "
    "(repeatable: once all are done)",
)
@option(
    "--wait/--no-wait",
    default=False,
    show_default=True,
    help="wait for the job to finish; print its result as JSON, or exit 3 if it died",
)
@option(
    "--timeout",
    type=seconds(0),
    default=None,
    help="with --wait: give up after this many seconds (exit 3)",
    show_default="wait for as long as it takes",
)
@option(
    "--reopen/--no-reopen",
    default=False,
    show_default=True,
    help="open the queue again if it was cancelled (else such a queue takes no job)",
)
@queue_setting_options
def enqueue(
    queue: str,
    handler: str,
    payload: str,
    args: str | None,
    kwargs: str | None,
    delay: float | None,
    key: str | None,
    unique_for: float | None,
    group: str | None,
    job_priority: int,
    depends_on: tuple[str, ...],
    wait: bool,
    timeout: float | None,
    reopen: bool,
    **flags: Any,
) -> None:
    """Enqueue a job of HANDLER ("package.module:function") on QUEUE; print the job's id.

    QUEUE is created with the settings given when it does not exist; given settings must
    match an existing queue's; a cancelled QUEUE takes jobs again with --reopen. With
    --depends-on the job waits (deferred) until each job or task named is done. With
    --wait: print the job's result as JSON and exit 0, or say why it died (or was
    cancelled) on stderr and exit 3. With --key, a job holding that key that is not finished
    (or finished less than --unique-for ago) is not enqueued again: its id is printed (and
    --wait waits for it), and stderr says so. --group: see --group-limit. --priority: a
    higher one runs first (docs/queues.md, Priorities). A typed job
    function (@job) takes --args and --kwargs instead of --json: its worker checks them
    against the function's signature."""
    from queueworks.errors import NotJSON
    from queueworks.protocol.messages import from_json
    from queueworks.protocol.models import parse_handler_path

    given = {k: v for k in SETTINGS if (v := flags.pop(k)) is not None}
    settings = settings_from_flags(**flags)
    if unique_for is not None and key is None:
        raise BadInput("--unique-for needs --key")
    try:
        parse_handler_path(handler)
        value = from_json(payload, "--json")
        if args is not None or kwargs is not None:
            value = typed_payload(value, args, kwargs)
    except (ValueError, NotJSON) as exc:
        raise BadInput(str(exc)) from None
    client = client_for(settings)
    try:
        q = client.queue(queue, reopen=reopen, **given)
    except pydantic.ValidationError as exc:
        raise BadInput(f"invalid queue setting: {validation_text(exc)}") from None
    except ValueError as exc:  # a setting the queue has otherwise, a task of that name...
        raise BadInput(str(exc)) from None
    own: dict[str, Any] = {"key": key, "unique_for": unique_for, "group": group}
    if job_priority != DEFAULT:
        own["priority"] = job_priority
    try:
        job = q.enqueue(handler, value, delay=delay, depends_on=depends_on or None, **own)
    except ValueError as exc:  # a payload too deep, a bad --key or --group, a dependency...
        raise BadInput(str(exc)) from None
    click.echo(job.id)
    if not job.created:
        click.echo(f"job {job.id} holds key {key!r}: no job enqueued", err=True)
    if wait:
        _wait(q, job.id, timeout)


def typed_payload(payload: Any, args: str | None, kwargs: str | None) -> dict[str, Any]:
    """The payload of a typed job function's call: ``{"args": [...], "kwargs": {...}}``
    (``queueworks.job_functions``); ``ValueError`` naming a wrong option."""
    from queueworks.protocol.messages import from_json

    if payload is not None:
        raise ValueError("--json: give either --json or --args/--kwargs (a typed call)")
    by_position = [] if args is None else from_json(args, "--args")
    by_name = {} if kwargs is None else from_json(kwargs, "--kwargs")
    if not isinstance(by_position, list):
        raise ValueError(f"--args must be a JSON array, not {args}")
    if not isinstance(by_name, dict):
        raise ValueError(f"--kwargs must be a JSON object, not {kwargs}")
    return {"args": by_position, "kwargs": by_name}


def _wait(q: Any, job_id: str, timeout: float | None) -> None:
    """``--wait``: print the job's result as JSON, or say why it died and exit 3."""
    from queueworks.protocol.messages import to_json

    done = wait_for_job(q, job_id, timeout, lambda line: click.echo(line, err=True))
    if done is None:
        click.echo(f"error: job {job_id} did not finish within {timeout} s", err=True)
        sys.exit(EXIT_UNFINISHED)
    if not done.ok:
        click.echo(f"job {job_id}: {done.reason}", err=True)
        sys.exit(EXIT_UNFINISHED)
    click.echo(to_json(done.result, "result"))
