"""queueworks: an elastic work-queue for Python on Redis Streams.

A target task is split into subtasks on Redis streams and processed by a node set of
workers that can grow, shrink, lose a node or give nodes away while the task runs.

The names below are imported when first used (``queueworks.Client`` imports the client
then): a process that needs one part of the package, such as ``queueworks health`` (a
container's health check, run every few seconds), does not pay for the rest.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queueworks.client.aio import AsyncClient
    from queueworks.client.aio_queue_handle import AsyncJob, AsyncQueue
    from queueworks.client.aio_tasks import AsyncTask
    from queueworks.client.queue_handle import Job, Queue
    from queueworks.client.sync import Client, Task
    from queueworks.context import (
        Cancelled,
        Fenced,
        JobContext,
        Stopped,
        SubtaskContext,
        Suspended,
        on_rebalance,
    )
    from queueworks.errors import (
        EvictingRedis,
        JobFailed,
        QueueNotFound,
        QueueworksError,
        RedisUnavailable,
        SubmitError,
        TaskNotFound,
    )
    from queueworks.job_functions import AsyncJobFunction, Call, JobFunction, job
    from queueworks.protocol.models import (
        JobState,
        JobStatus,
        QueueStatus,
        Role,
        Schedule,
        TaskSpec,
        TaskState,
        TaskStatus,
    )

__all__ = [
    "AsyncClient",
    "AsyncJob",
    "AsyncJobFunction",
    "AsyncQueue",
    "AsyncTask",
    "Call",
    "Cancelled",
    "Client",
    "EvictingRedis",
    "Fenced",
    "Job",
    "JobContext",
    "JobFailed",
    "JobFunction",
    "JobState",
    "JobStatus",
    "Queue",
    "QueueNotFound",
    "QueueStatus",
    "QueueworksError",
    "RedisUnavailable",
    "Role",
    "Schedule",
    "Stopped",
    "SubmitError",
    "SubtaskContext",
    "Suspended",
    "Task",
    "TaskNotFound",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "job",
    "on_rebalance",
]
__version__ = "0.1.0"

# where each name lives: imported on first use (``__getattr__``)
_HOMES = {
    "queueworks.client.aio": ("AsyncClient",),
    "queueworks.client.aio_queue_handle": ("AsyncJob", "AsyncQueue"),
    "queueworks.client.aio_tasks": ("AsyncTask",),
    "queueworks.client.queue_handle": ("Job", "Queue"),
    "queueworks.client.sync": ("Client", "Task"),
    "queueworks.context": (
        "Cancelled",
        "Fenced",
        "JobContext",
        "Stopped",
        "SubtaskContext",
        "Suspended",
        "on_rebalance",
    ),
    "queueworks.errors": (
        "EvictingRedis",
        "JobFailed",
        "QueueNotFound",
        "QueueworksError",
        "RedisUnavailable",
        "SubmitError",
        "TaskNotFound",
    ),
    "queueworks.job_functions": ("AsyncJobFunction", "Call", "JobFunction", "job"),
    "queueworks.protocol.models": (
        "JobState",
        "JobStatus",
        "QueueStatus",
        "Role",
        "Schedule",
        "TaskSpec",
        "TaskState",
        "TaskStatus",
    ),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'queueworks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # (the next use finds it at once)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
