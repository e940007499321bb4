"""The worker's side of Django tasks: ``run_task``, the one handler of every Django task's
job, and ``setup_django`` (``queueworks worker --django SETTINGS``).

``run_task`` imports the task its payload names only from a module the worker's ``--allow``
covers (the handler is allowed as ``queueworks.contrib.django``; the task is checked on
its own), closes stale database connections before and after it as Django's request
cycle does, and sends the framework's ``task_started`` and ``task_finished`` signals. An
exception of the task fails the attempt as ``TaskFailed`` raised from it: its traceback
is the task's, and its last line names the task exception's class (``results.task_error``
reads it back).
"""

from __future__ import annotations

import os
import traceback
from datetime import datetime
from typing import Any

from queueworks.context import JobContext
from queueworks.protocol.allow import allowed

from .compat import TASKS
from .results import import_task, result_id, when

PACKAGE = "queueworks.contrib.django"  # the prefix a Django worker allows for ``run_task``


class TaskFailed(Exception):
    """A Django task raised (the exception is its ``__cause__``); the message is the
    exception's class path and the first line of its message."""


def run_task(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Run the Django task ``payload`` names (``{"task": module_path, "args", "kwargs"}``)
    and return its call and its value (the job's result: ``results.task_result`` reads
    it)."""
    path, args, kwargs = call_of(payload)
    module = path.rpartition(".")[0]
    if not allowed(module, ctx.allow) or module.startswith(PACKAGE + "."):
        raise PermissionError(
            f"Django task {path!r} is outside this worker's allowed module prefixes "
            f"{list(ctx.allow)}"
        )
    task = import_task(path, ctx.allow)
    if not allowed(task.func.__module__, ctx.allow):
        raise PermissionError(
            f"Django task {path!r} is defined in {task.func.__module__!r}, outside this "
            f"worker's allowed module prefixes {list(ctx.allow)}"
        )
    started = now()
    result = TASKS.TaskResult(
        task=task,
        id=result_id(ctx.queue, ctx.job_id),
        status=TASKS.TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=started,
        last_attempted_at=started,
        finished_at=None,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[ctx.worker_id] * ctx.attempt,
    )
    sender = TASKS.task_backends[task.backend].__class__
    close_old_connections()
    try:
        TASKS.task_started.send(sender=sender, task_result=result)
        try:
            if task.takes_context:
                value = task.call(TASKS.TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = TASKS.normalize_json(value)
        except Exception as exc:
            error = TASKS.TaskError(
                exception_class_path=class_path(type(exc)),
                traceback="".join(traceback.format_exception(exc)),
            )
            result.errors.append(error)
            finish(result, TASKS.TaskResultStatus.FAILED, sender)
            first = (str(exc).splitlines() or [""])[0]
            raise TaskFailed(f"{error.exception_class_path}: {first}".rstrip(": ")) from exc
        object.__setattr__(result, "_return_value", value)
        finish(result, TASKS.TaskResultStatus.SUCCESSFUL, sender)
    finally:
        close_old_connections()
    return {"task": path, "args": result.args, "kwargs": result.kwargs, "value": value}


def call_of(payload: Any) -> tuple[str, list[Any], dict[str, Any]]:
    """The task path, args and kwargs of a Django task's payload; ``ValueError`` if it
    is none."""
    if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
        raise ValueError("payload is no Django task's call (no 'task')")
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("payload of a Django task: 'args' must be a list, 'kwargs' an object")
    return payload["task"], args, kwargs


def finish(result: Any, status: Any, sender: type) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", now())
    TASKS.task_finished.send(sender=sender, task_result=result)


def now() -> datetime | None:
    return when(datetime.now().timestamp())


def class_path(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def close_old_connections() -> None:
    from django.db import close_old_connections as close

    close()


def setup_django(settings_module: str, allow: tuple[str, ...]) -> tuple[str, ...]:
    """``queueworks worker --django SETTINGS``: Django set up with ``settings_module``
    (before any handler is imported), and the ``--allow`` prefixes with this package's
    (``run_task``) added. ``ValueError`` if the settings cannot be loaded."""
    import django
    from django.core.exceptions import ImproperlyConfigured

    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    try:
        django.setup()
    except (ImportError, ImproperlyConfigured) as exc:
        raise ValueError(f"--django {settings_module}: {type(exc).__name__}: {exc}") from None
    return allow if PACKAGE in allow else (*allow, PACKAGE)
