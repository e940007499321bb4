"""The test project's tasks (Django's ``@task``, from ``django.tasks`` or the backport)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import django

if django.VERSION >= (6, 0):
    from django.tasks import task
    from django.tasks.signals import task_finished, task_started
else:
    from django_tasks import task
    from django_tasks.signals import task_finished, task_started


class Boom(Exception):
    """The error ``boom`` raises."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def boom(message: str) -> None:
    raise Boom(message)


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task(queue_name="emails")
def send(to: str) -> str:
    return f"sent to {to}"


@task(takes_context=True)
def with_context(context: Any, x: int) -> dict[str, Any]:
    result = context.task_result
    return {"attempt": context.attempt, "id": result.id, "x": x, "workers": result.worker_ids}


@task
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


@task
def connection_was_open() -> bool:
    """Whether the database connection was open when the task began (it opens it): a
    worker closes it after each job (``CONN_MAX_AGE`` 0), as a request does."""
    from django.db import connection

    was_open = connection.connection is not None
    connection.ensure_connection()
    return was_open


@task
def when_ran() -> float:
    return time.time()


def _record(name: str, task_result: Any, **_: Any) -> None:
    """The framework's signals, as the worker sends them, appended to ``DJANGO_SIGNALS``."""
    path = os.environ.get("DJANGO_SIGNALS")
    if path:
        line = {"signal": name, "id": task_result.id, "status": str(task_result.status)}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


task_started.connect(lambda sender, task_result, **kw: _record("started", task_result), weak=False)
task_finished.connect(
    lambda sender, task_result, **kw: _record("finished", task_result), weak=False
)
