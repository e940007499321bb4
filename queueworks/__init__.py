"""queueworks: an elastic work-queue for Python on Redis Streams.

A target task is split into subtasks on Redis streams and processed by a node set of
workers that can grow, shrink, lose a node or give nodes away while the task runs.
"""

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
