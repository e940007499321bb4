"""queueworks: an elastic work-queue for Python on Redis Streams.

A target task is split into subtasks on Redis streams and processed by a node set of
workers that can grow, shrink, lose a node or give nodes away while the task runs.
"""

from queueworks.client import Client, SubmitError, Task, TaskNotFound
from queueworks.context import SubtaskContext, Suspended, on_rebalance
from queueworks.models import Role, TaskSpec, TaskState, TaskStatus

__all__ = [
    "Client",
    "Role",
    "SubmitError",
    "SubtaskContext",
    "Suspended",
    "Task",
    "TaskNotFound",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "on_rebalance",
]
__version__ = "0.1.0"
