"""``queueworks queue QUEUE ACTION``: a queue's jobs by state and its whole-queue actions
from the command line (``Queue.jobs``, ``pause``, ``resume``, ``empty``, ``requeue_dead``,
``delete_dead``, ``run_now``). An unknown queue exits 1; a bad state, page or job id 2."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from queueworks.cli.failures import BadInput, CliError
from queueworks.cli.options import (
    CLEARED,
    client_for,
    common,
    live_setting_options,
    option,
    settings_from_flags,
    task_id_param,
)
from queueworks.queue.queue_settings import LIVE

ACTIONS = ("jobs", "pause", "resume", "empty", "requeue-dead", "delete-dead", "run", "set")


def _line(job: Any, now: float) -> str:
    extra = job.error or job.last_error or job.reason or ""
    if job.progress is not None:
        extra = f"{100 * job.progress:.0f}% {job.progress_message or ''}".strip()
    return f"{job.id}  {job.state.value}  {job.handler}  attempts={job.attempts}  {extra}".rstrip()


def _set(q: Any, given: dict[str, Any]) -> str:
    """``set``: the live settings given (``none``: no limit), and the queue's after."""
    changes = {k: None if v is CLEARED else v for k, v in given.items() if v is not None}
    if not changes:
        raise BadInput("set needs a setting to change: " + ", ".join(_flag(k) for k in LIVE))
    now = q.configure(**changes)
    shown = ", ".join(f"{k}={getattr(now, k)!r}" for k in changes)
    return f"queue {q.name}: {shown} (its workers start their next jobs with them)"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _do(q: Any, action: str, job_id: str | None, page: tuple[str, int, int], as_json: bool) -> str:
    if action == "jobs":
        found = q.jobs(*page)
        if as_json:
            return json.dumps(found.model_dump(mode="json"), indent=2)
        head = f"{len(found.jobs)} of {found.total} {found.state.value} job(s) of queue {q.name}"
        now = time.time()
        return "\n".join([head, *(f"  {_line(j, now)}" for j in found.jobs)])
    if action == "run":
        if not job_id:
            raise BadInput("run needs the JOB_ID of a scheduled job")
        if not q.run_now(job_id):
            raise CliError(f"job {job_id} of queue {q.name} is not scheduled")
        return f"job {job_id} runs now"
    if action in ("pause", "resume"):
        changed = q.pause() if action == "pause" else q.resume()
        return f"queue {q.name} {action}d" if changed else f"queue {q.name} was {action}d already"
    if action == "empty":
        return f"{q.empty()} job(s) of the backlog cancelled"
    if action == "requeue-dead":
        said = f"{q.requeue_dead()} dead job(s) requeued"
        gone = q.status().dead - int(q.client.redis.xlen(q.client.keys.task(q.name).dead))
        if gone > 0:  # their letters were trimmed (the newest are kept) or deleted
            said += f"; {gone} job(s) counted dead have no dead letter kept: none can be requeued"
        return said
    return f"{q.delete_dead()} dead letter(s) deleted"


@click.command(short_help="A queue's jobs by state; pause, resume, empty it, and more.")
@common
@click.argument("queue", metavar="QUEUE", callback=task_id_param)
@click.argument("action", type=click.Choice(ACTIONS))
@click.argument("job_id", required=False)
@option("--state", default="queued", show_default=True, help="jobs: the state to list")
@option("--limit", type=int, default=20, show_default=True, help="jobs: how many (at most 1000)")
@option("--offset", type=int, default=0, show_default=True, help="jobs: how many to skip")
@option("--json", "as_json", is_flag=True, default=False, help="jobs: print the page as JSON")
@live_setting_options
def queue(
    queue: str,
    action: str,
    job_id: str | None,
    state: str,
    limit: int,
    offset: int,
    as_json: bool,
    **flags: Any,
) -> None:
    """Act on QUEUE. ACTION: `jobs` lists its jobs in --state (queued, scheduled, deferred,
    running, done, dead), --limit after --offset; `pause` (its workers stop reading new
    jobs; jobs keep arriving) and `resume`; `empty` cancels its backlog (the jobs not
    started: on its stream, set aside, waiting for a group slot); `requeue-dead` runs every
    dead job again; `delete-dead` drops every dead letter (the jobs stay counted as dead);
    `run JOB_ID` runs a scheduled job now; `set --OPTION VALUE ...` changes its live
    settings (its workers start their next jobs with them within a second; running jobs
    keep theirs)."""
    from queueworks.client.queue_handle import Queue
    from queueworks.errors import TaskNotFound
    from queueworks.queue.queue_settings import DEFAULTS

    given = {name: flags.pop(name) for name in LIVE}
    if action != "set" and any(v is not None for v in given.values()):
        raise BadInput("a setting option is for `set` only")
    client = client_for(settings_from_flags(**flags))
    q = Queue(client, queue, DEFAULTS, revives=False)
    try:
        if action == "set":
            click.echo(_set(q, given))
        else:
            click.echo(_do(q, action, job_id, (state, limit, offset), as_json))
    except TaskNotFound:
        raise CliError(f"no queue {queue}") from None
    except ValueError as exc:
        if "cannot" in str(exc):  # a finished queue: no usage error
            raise CliError(str(exc)) from None
        raise BadInput(str(exc)) from None
