"""``queueworks dead`` and ``submit --wait``: a task's dead letters, read by a person.

A dead letter is a subtask that will not run again by itself: it failed ``max_attempts``
times, its handler was refused or could not be imported, or its entry could not be decoded.
Its record keeps the index, the attempts spent, a short reason and the error (a traceback);
here the error is cut to its last line, the one that says what went wrong.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click

from queueworks.cli.failures import BadInput
from queueworks.cli.info import ControllerWatch
from queueworks.cli.options import (
    client_for,
    common,
    option,
    settings_from_flags,
    task_id_param,
)
from queueworks.client.admin import Admin
from queueworks.client.sync import Client, Task
from queueworks.errors import last_line
from queueworks.protocol.models import DeadLetter, TaskState, TaskStatus

ALL = "*"  # --requeue without a job id: every listed dead letter
FIRST_REASONS = 3  # distinct reasons that `submit --wait` prints
SAMPLE = 200  # dead letters read to find them


def render(
    status: TaskStatus, letters: list[DeadLetter], *, as_json: bool = False, queue: bool = False
) -> str:
    """A task's dead letters (a queue's: its jobs count as they finish, so ``total`` is
    the jobs that finished, done or dead)."""
    total = status.done + status.dead if queue else status.total
    if as_json:
        return json.dumps(
            {
                "task": status.id,
                "queue": queue,
                "state": status.state.value,
                "total": total,
                "done": status.done,
                "dead": status.dead,
                "dead_letters": [
                    {**d.model_dump(mode="json"), "last_error": last_line(d.error)} for d in letters
                ],
            },
            indent=2,
        )
    if queue:
        head = f"queue {status.id} {status.state.value}: {status.dead} dead of {total} finished"
    else:
        head = f"task {status.id} ({status.name}) {status.state.value}: {status.dead} dead of "
        head += f"{total}"
    head += f", {len(letters)} dead letter(s) shown"
    if not letters:
        return head
    rows = [("job" if queue else "index", "attempts", "reason", "last error line")]
    for d in letters:
        index = "-" if d.index is None else str(d.index)
        rows.append(
            (d.job or "-" if queue else index, str(d.attempts), d.reason, last_line(d.error))
        )
    widths = [max(len(row[c]) for row in rows) for c in range(3)]
    lines = [head]
    for row in rows:
        cells = [row[c].ljust(widths[c]) for c in range(3)]
        lines.append("  " + "  ".join(cells) + "  " + row[3])
    return "\n".join(lines)


def wait_saying_why(
    task: Task, timeout: float | None, say: Callable[[str], None]
) -> TaskStatus | None:
    """Wait for ``task`` to finish, saying each new reason it waits for nodes (a handler
    no live worker may run, say); None if ``timeout`` s passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    said: str | None = None
    controller = ControllerWatch(task.client, say)
    while True:
        status = task.status(with_nodes=False)
        if status.finished:
            return status
        controller.look()
        if status.reason and status.reason != said:
            say(f"waiting: {status.reason}")
            said = status.reason
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def outcome(task: Task, status: TaskStatus) -> tuple[list[str], bool]:
    """What ``submit --wait`` prints: the count line, and when anything died, the first
    distinct reasons. True only if every subtask succeeded."""
    ok = status.state == TaskState.COMPLETED and status.dead == 0 and status.done == status.total
    lines = [f"{status.state.value}: {status.done} done, {status.dead} dead of {status.total}"]
    if ok:
        return lines, True
    if status.error:
        lines.append(f"task {status.state.value}: {status.error}")
    groups: dict[tuple[str, str], list[DeadLetter]] = {}
    for d in task.dead_letters(count=SAMPLE) if status.dead else []:
        groups.setdefault((d.reason, last_line(d.error)), []).append(d)
    for (reason, error), same in list(groups.items())[:FIRST_REASONS]:
        first = same[0]
        why = f"{reason}: {error}" if error and error != reason else reason
        lines.append(
            f"dead: {len(same)} subtask(s) like index {first.index} "
            f"({first.attempts} attempt(s)): {why}"
        )
    if status.dead:
        lines.append(f"(queueworks dead {status.id} lists every dead letter)")
    return lines, False


def requeue_all(client: Client, task_id: str, letters: list[DeadLetter]) -> str:
    """Requeue every one of ``letters`` (a task's subtasks, or a queue's jobs); one line
    saying what happened."""
    admin = Admin(client)
    if client.redis.sismember(client.keys.queues, task_id):
        for d in letters:
            admin.requeue_job(task_id, d.id)
        return f"requeued {len(letters)} dead job(s) of queue {task_id}"
    reopened = False
    for d in letters:
        reopened = admin.requeue_dead(task_id, d.id).reopened or reopened
    tail = "; the task is active again" if reopened else ""
    return f"requeued {len(letters)} dead letter(s) of task {task_id}{tail}"


@click.command(short_help="List (or requeue) a task's or a queue's dead letters.")
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
    is_flag=False,
    flag_value=ALL,
    default=None,
    metavar="[JOB_ID]",
    help="put the listed dead letters back on the task's stream (reopens a completed task); "
    "with a queue's JOB_ID, that dead job only",
    show_default="none",
)
def dead(
    task_id: str,
    as_json: bool,
    indexes: tuple[int, ...],
    limit: int,
    requeue: str | None,
    **flags: Any,
) -> None:
    """List the dead letters of TASK (a task, or a queue): index, attempts, reason, last
    error line.

    A queue's dead letters show each dead job's id (for `queueworks job QUEUE/JOB_ID`).

    With --requeue, each listed one goes back on the task's stream with its index and
    payload (a queue's job runs again) and the dead count goes down (a completed task
    becomes active again); --requeue JOB_ID requeues that dead job of a queue only."""
    settings = settings_from_flags(**flags)
    client = client_for(settings)
    if requeue not in (None, ALL):
        assert requeue is not None
        if not client.redis.sismember(client.keys.queues, task_id):
            raise BadInput(f"--requeue {requeue}: {task_id} is no queue (give --requeue alone)")
        got = Admin(client).requeue_dead_job(task_id, requeue)
        click.echo(f"requeued dead job {got.job} of queue {task_id}")
        return
    task = client.task(task_id)
    status = task.status(with_nodes=False)  # TaskNotFound: one line
    letters = [d for d in task.dead_letters(count=limit) if not indexes or d.index in indexes]
    queue = bool(client.redis.sismember(client.keys.queues, task_id))
    click.echo(render(status, letters, as_json=as_json, queue=queue))
    if requeue == ALL:
        click.echo(requeue_all(client, task_id, letters), err=as_json)
