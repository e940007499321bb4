"""``QueueworksBackend``: Django's Tasks framework on queueworks queues.

Each Django queue name (``QUEUES``) is a queueworks queue; a task enqueued is a job of
it whose handler is ``queueworks.contrib.django:run_task`` and whose payload names the
task (its module path) and its arguments. A worker started with ``--django SETTINGS``
runs it (``worker.run_task``); any process reads its result by id (``QUEUE/JOB_ID``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from typing import Any

from queueworks.client.queue_handle import Queue
from queueworks.client.sync import Client
from queueworks.errors import NotJSON
from queueworks.protocol.allow import allowed
from queueworks.protocol.keys import check_task_id
from queueworks.protocol.messages import to_json
from queueworks.protocol.models import JobDetail
from queueworks.protocol.priorities import HIGHEST, LOWEST
from queueworks.queue.job_lists import plan_job_detail
from queueworks.transport.runner import run

from .compat import TASKS
from .results import (
    HANDLER,
    CallUnread,
    parse_result_id,
    project_modules,
    result_id,
    task_result,
    when,
)

OPTIONS = {"redis_url", "prefix", "allow", "queue_settings"}
# reads of a job whose payload was not found while it was not finished: it was settling
# between the reads of its detail (``results.CallUnread``); the next read sees it settled
DETAIL_READS = 3
# whether this queueworks takes a job's own priority (``Queue.enqueue(priority=)``)
ENQUEUE_TAKES_PRIORITY = "priority" in inspect.signature(Queue.enqueue).parameters


class NotJSONArgument(TypeError, ValueError):
    """A task's argument is no JSON value: a ``TypeError`` as Django's own check raises,
    and a ``ValueError`` as every bad input to queueworks is."""


def job_priority(priority: int) -> int:
    """A Django task's priority (-100 to 100, higher runs first) as its job's priority in
    queueworks (-5 to 5, higher runs first too): every 20 of Django's make one, rounded
    toward 0 from the middle of each (-9 .. 9 -> 0, 10 .. 29 -> 1, ... 90 .. 100 -> 5; the
    same below 0). The order is kept, never inverted; tasks of Django priorities that map
    to one job priority run in the order they were enqueued."""
    band = (abs(priority) + 10) // 20
    return min(HIGHEST, band) if priority >= 0 else max(LOWEST, -band)


def json_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """``NotJSONArgument`` naming the first argument that is no JSON value."""
    named = [(f"args[{i}]", v) for i, v in enumerate(args)] + [
        (f"kwargs[{k!r}]", v) for k, v in kwargs.items()
    ]
    for name, value in named:
        try:
            to_json(TASKS.normalize_json(value), name)
        except (TypeError, ValueError, NotJSON) as exc:
            raise NotJSONArgument(
                f"task argument {name} is no JSON value ({type(value).__name__}): {exc}"
            ) from None


class QueueworksBackend(TASKS.BaseTaskBackend):  # type: ignore[misc]
    """Django's ``TASKS`` backend on queueworks. ``OPTIONS``: ``redis_url`` and ``prefix``
    (default: ``QUEUEWORKS_REDIS_URL`` and ``QUEUEWORKS_PREFIX``, as the ``queueworks``
    command reads them), ``allow`` (module prefixes a task must be under, as the workers'
    ``--allow``: checked when a task is defined), ``queue_settings`` (the settings its
    queues are created with, e.g. ``{"max_attempts": 1}``)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    # Django's priority is the job's (``job_priority``); a queueworks without job
    # priorities would say False here, and the framework refuse a task with a priority
    supports_priority = ENQUEUE_TAKES_PRIORITY

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - OPTIONS)
        if unknown:
            raise ValueError(
                f"TASKS[{alias!r}]['OPTIONS']: unknown {unknown}; known: {sorted(OPTIONS)}"
            )
        self.allow: list[str] = list(self.options.get("allow") or [])
        self.queue_settings: dict[str, Any] = dict(self.options.get("queue_settings") or {})
        self._client: Client | None = None  # made at the first enqueue or read
        self._queues: dict[str, Queue] = {}

    @property
    def client(self) -> Client:
        if self._client is None:
            given = {k: self.options[k] for k in ("prefix",) if self.options.get(k)}
            url = self.options.get("redis_url")
            self._client = Client.from_url(url, **given) if url else Client.from_env(**given)
        return self._client

    def queue(self, name: str) -> Queue:
        """The queueworks queue of Django's queue ``name`` (created at its first use)."""
        found = self._queues.get(name)
        if found is None:
            found = self._queues[name] = self.client.queue(name, **self.queue_settings)
        return found

    def validate_task(self, task: Any) -> None:
        """Django's checks, and what a worker needs: a task it can import (not one of
        ``__main__``), under ``allow`` when it is given, on a queue name queueworks takes."""
        super().validate_task(task)
        module = task.func.__module__
        if module == "__main__":
            raise TASKS.InvalidTask(
                f"task {task.name!r} is defined in __main__: a worker cannot import it"
            )
        if self.allow and not allowed(module, self.allow):
            raise TASKS.InvalidTask(
                f"task {task.module_path!r} is outside the allowed module prefixes "
                f"{self.allow} (OPTIONS 'allow'); a worker would refuse it"
            )
        try:
            check_task_id(task.queue_name, "queue name")
        except ValueError as exc:
            raise TASKS.InvalidTask(str(exc)) from None

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        json_arguments(args, kwargs)
        now = time.time()
        payload = {"task": task.module_path, "args": list(args), "kwargs": dict(kwargs)}
        payload = TASKS.normalize_json(payload)
        options: dict[str, Any] = {}
        if task.run_after is not None:
            options["at"] = task.run_after.timestamp()
        if ENQUEUE_TAKES_PRIORITY and task.priority:
            options["priority"] = job_priority(task.priority)
        job = self.queue(task.queue_name).enqueue(HANDLER, payload, **options)
        result = TASKS.TaskResult(
            task=task,
            id=result_id(task.queue_name, job.id),
            status=TASKS.TaskResultStatus.READY,
            enqueued_at=when(now),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        TASKS.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The result of task ``result_id`` (``QUEUE/JOB_ID``), as it is now, whoever
        enqueued it; ``TaskResultDoesNotExist`` if there is no such task's job."""
        try:
            queue, job_id = parse_result_id(result_id)
            reads = DETAIL_READS
            while True:
                detail = self._detail(queue, job_id)
                reads -= 1
                try:
                    return task_result(detail, self.alias, self.allow or project_modules())
                except CallUnread:
                    if detail.state.finished or not reads:
                        raise
        except LookupError as exc:
            raise TASKS.TaskResultDoesNotExist(result_id) from exc

    def _detail(self, queue: str, job_id: str) -> JobDetail:
        client = self.client
        return run(client.redis, client.scripts, plan_job_detail(client.keys, queue, job_id))
