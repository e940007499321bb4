"""What a Django task's job says, in the framework's words: a queueworks job
(``JobDetail``) as a ``TaskResult``, and the errors of a failed attempt. No I/O."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import import_module
from typing import Any

from django.conf import settings
from django.utils import timezone

from queueworks.protocol.allow import allowed
from queueworks.protocol.models import JobDetail, JobState

from .compat import TASKS

# the handler every Django task's job names (``worker.run_task``)
HANDLER = "queueworks.contrib.django:run_task"

READY_STATES = {JobState.SCHEDULED, JobState.DEFERRED, JobState.QUEUED}
FAILED_STATES = {JobState.DEAD, JobState.CANCELLED}
CAUSE = "\nThe above exception was the direct cause of the following exception:\n"
# the last line of a failed attempt's traceback, as ``worker.TaskFailed`` words it
_FAILED_LINE = re.compile(r"^[\w.]*\bTaskFailed: ([A-Za-z_][\w.]*)(?::|$)")
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def result_id(queue: str, job_id: str) -> str:
    """A task result's id: its job's, with the queue's name (``QUEUE/JOB_ID``)."""
    return f"{queue}/{job_id}"


def parse_result_id(value: str) -> tuple[str, str]:
    """``(queue, job_id)`` of a result id; ``LookupError`` if it is no such id."""
    queue, sep, job_id = value.partition("/")
    if not (sep and queue and job_id):
        raise LookupError(f"{value!r} is no queueworks task result id (QUEUE/JOB_ID)")
    return queue, job_id


def when(timestamp: float | None) -> datetime | None:
    """A Unix time as Django reads times: aware (UTC) with ``USE_TZ``, else naive local."""
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, UTC)
    if settings.USE_TZ:
        return moment
    naive: datetime = timezone.make_naive(moment, timezone.get_default_timezone())
    return naive


def status_of(state: JobState) -> Any:
    """A job's state as a ``TaskResultStatus``."""
    status = TASKS.TaskResultStatus
    if state in READY_STATES:
        return status.READY
    if state == JobState.RUNNING:
        return status.RUNNING
    if state == JobState.DONE:
        return status.SUCCESSFUL
    return status.FAILED


def task_error(traceback: str) -> Any:
    """The ``TaskError`` of a failed attempt's traceback: the task's own exception (the
    part before ``TaskFailed``, which names its class), or the last error the traceback
    shows (an attempt stopped by its worker: a timeout)."""
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    found = _FAILED_LINE.match(last)
    if found is not None and CAUSE in traceback:
        own = traceback[: traceback.rindex(CAUSE)].strip("\n") + "\n"
        return TASKS.TaskError(exception_class_path=found.group(1), traceback=own)
    plain = _ERROR_LINE.match(last)
    name = plain.group(1) if plain is not None else "Exception"
    path = name if "." in name else f"builtins.{name}"
    return TASKS.TaskError(exception_class_path=path, traceback=traceback)


class CallUnread(LookupError):
    """The job's payload (its task and arguments) was not read: gone with its dead letter,
    or moving between the reads of a job that was settling (``job_lists.plan_job_detail``
    reads its status, then its record and entry)."""


def import_task(path: str, allow: Sequence[str]) -> Any:
    """The ``Task`` at ``path`` (``module.function``, its ``module_path``), imported only
    from a module under the ``allow`` prefixes (a path read from Redis names it):
    ``PermissionError`` outside them, ``ValueError`` if there is no task there."""
    module, _, name = path.rpartition(".")
    if not module or not allowed(module, allow):
        raise PermissionError(
            f"Django task {path!r} is outside the allowed module prefixes {list(allow)}"
        )
    found = getattr(import_module(module), name, None)
    if not isinstance(found, TASKS.Task):
        raise ValueError(f"{path!r} is no Django task (a function decorated with @task)")
    return found


def project_modules() -> list[str]:
    """The module prefixes of the project's installed apps: where a process that reads a
    result (``get_result``) may import a task from when the backend names no ``allow``."""
    from django.apps import apps

    return [config.name for config in apps.get_app_configs()]


def task_result(detail: JobDetail, backend: str, allow: Sequence[str]) -> Any:
    """The ``TaskResult`` of a Django task's job; ``LookupError`` if the job is no Django
    task's, or its task is no longer known (a dead job whose dead letter is gone)."""
    rid = result_id(detail.queue, detail.id)
    if detail.handler != HANDLER:
        raise LookupError(f"job {rid} is no Django task's (its handler is {detail.handler})")
    done = json.loads(detail.result) if detail.state == JobState.DONE and detail.result else None
    call = done if done is not None else json.loads(detail.payload or "null")
    if not isinstance(call, dict) or "task" not in call:
        raise CallUnread(f"job {rid} ({detail.state}): its task is no longer known")
    try:
        task = import_task(call["task"], allow)
    except PermissionError as exc:
        raise LookupError(str(exc)) from None
    if task.queue_name != detail.queue or task.backend != backend:
        task = task.using(queue_name=detail.queue, backend=backend)
    errors = []
    if detail.traceback:  # a dead job's, or the last failed attempt's
        errors.append(task_error(detail.traceback))
    started = when(detail.started_at)
    result = TASKS.TaskResult(
        task=task,
        id=rid,
        status=status_of(detail.state),
        enqueued_at=when(detail.enqueued_at),
        started_at=started,
        last_attempted_at=started,
        finished_at=when(detail.finished_at),
        args=call.get("args", []),
        kwargs=call.get("kwargs", {}),
        backend=backend,
        errors=errors,
        # the worker of its last attempt, once per attempt (``attempts`` counts them)
        worker_ids=[detail.worker] * detail.attempts if detail.worker else [],
    )
    if done is not None:
        object.__setattr__(result, "_return_value", done.get("value"))
    return result
