"""``queueworks job QUEUE/JOB_ID``: one job from its id, read by a person (``Client.job``):
its state, attempts, times, and its result or last error; ``--json``, ``--wait`` for it to
finish, ``--cancel`` it (a running one is stopped), ``--requeue`` it (a dead one)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

import click

from queueworks.cli.failures import EXIT_UNFINISHED, BadInput, CliError
from queueworks.cli.options import client_for, common, option, seconds, settings_from_flags
from queueworks.errors import last_line
from queueworks.protocol.models import JobDetail, JobState

RESULT_SHOWN = 2000  # characters of a result the text shows (--json: all of it)


def _at(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def render(ref: str, d: JobDetail) -> str:
    """A job as ``queueworks job`` prints it."""
    lines = [f"job {ref}  {d.state.value}  {d.handler}"]
    lines.append(f"  attempts  {d.attempts}" + (f"  (worker {d.worker})" if d.worker else ""))
    if d.priority:
        lines.append(f"  priority  {d.priority}")
    times = [("enqueued", d.enqueued_at), ("runs at", d.run_at), ("started", d.started_at)]
    times.append(("finished", d.finished_at))
    lines += [f"  {name:<9} {_at(ts)}" for name, ts in times if ts is not None]
    if d.progress is not None:
        lines.append(f"  progress  {100 * d.progress:.0f}% {d.progress_message or ''}".rstrip())
    if d.reason and not d.state.finished:
        lines.append(f"  waits     {d.reason}")
    if d.state == JobState.DONE:
        result = d.result or "null"
        cut = len(result) > RESULT_SHOWN
        lines.append(f"  result    {result[:RESULT_SHOWN]}" + (" ... (--json: all)" if cut else ""))
    error = d.error or d.last_error or (last_line(d.traceback) if d.traceback else "")
    if error:
        lines.append(f"  {'error' if d.state.finished else 'last error'}: {error}")
    return "\n".join(lines)


@click.command(short_help="One job from its id: state, attempts, result or error.")
@common
@click.argument("ref", metavar="QUEUE/JOB_ID")
@option("--json", "as_json", is_flag=True, help="print the job as JSON")
@option("--wait", is_flag=True, help="wait for it to finish first (exit 3 if it did not succeed)")
@option(
    "--timeout",
    type=seconds(0),
    default=None,
    help="with --wait: give up after this many seconds (exit 3)",
    show_default="wait for as long as it takes",
)
@option("--cancel", is_flag=True, help="cancel it (a running job is stopped, never run again)")
@option("--requeue", is_flag=True, help="run a dead job again (from its dead letter)")
def job(
    ref: str,
    as_json: bool,
    wait: bool,
    timeout: float | None,
    cancel: bool,
    requeue: bool,
    **flags: Any,
) -> None:
    """Show the job QUEUE/JOB_ID (the id `enqueue` printed): its state, attempts, times,
    and its result or last error. --cancel cancels it first: one not started never runs, a
    running one is stopped (an `async def` handler at once, a plain one at its next
    ctx.checkpoint()), and it is never run again (exit 1 if it had finished); --requeue
    runs a dead job again; --wait waits for it to finish."""
    from queueworks.cli.enqueue import wait_for_job
    from queueworks.client.admin import Admin
    from queueworks.queue.queues import job_ref

    if cancel and requeue:
        raise BadInput("--cancel and --requeue: give one of them")
    try:
        name, job_id = job_ref(ref)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    client = client_for(settings_from_flags(**flags))
    handle = client.job(ref)
    try:
        handle.status()
        if cancel:
            if not handle.cancel():
                raise CliError(f"job {ref} had finished: nothing to cancel")
            click.echo(f"job {ref} cancelled", err=True)
        if requeue:
            got = Admin(client).requeue_dead_job(name, job_id)
            click.echo(f"job {ref} requeued (entry {got.new_entry})", err=True)
        finished = None
        if wait:
            finished = wait_for_job(
                handle.queue, job_id, timeout, lambda s: click.echo(s, err=True)
            )
        detail = handle.detail()
    except LookupError as exc:
        raise CliError(str(exc)) from None
    click.echo(
        json.dumps(detail.model_dump(mode="json"), indent=2) if as_json else render(ref, detail)
    )
    if wait and (finished is None or not finished.ok):
        sys.exit(EXIT_UNFINISHED)
