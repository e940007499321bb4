"""Every record that crosses Redis or the CLI, as a validated model.

Hot-path messages (subtask entries, results) are decoded by small hand-written functions in
``queueworks.protocol.messages`` for speed; everything else is a pydantic model with
``extra="forbid"``.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from queueworks.protocol.job_options import MAX_BACKOFF, MAX_RETRY_DELAY
from queueworks.protocol.retry_policy import (
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_DELAY,
    DEFAULT_RETRY_MAX_DELAY,
)
from queueworks.protocol.validate import (
    MAX_ATTEMPTS,
    MAX_COUNT,
    MAX_NODES,
    MAX_PARTITIONS,
    MAX_PRIORITY,
    MAX_TIMEOUT,
    MAX_TTL,
    check_finite_tree,
)

HANDLER_PATH = re.compile(
    r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):(?P<attr>[A-Za-z_][A-Za-z0-9_]*)$"
)


class NamedHandler(Protocol):
    """A handler that knows its ``"module:function"`` path: a typed job function
    (``queueworks.job_functions.JobFunctionBase``, made by ``@job``)."""

    @property
    def path(self) -> str: ...


def parse_handler_path(path: str) -> tuple[str, str]:
    """Split ``"package.module:function"``; refuse anything else, and every dunder part."""
    m = HANDLER_PATH.fullmatch(path)  # not .match: `$` also matches before a final "\n"
    if m is None:
        raise ValueError(f"handler {path!r} must look like 'package.module:function'")
    module, attr = m.group("module"), m.group("attr")
    for part in (*module.split("."), attr):
        if part.startswith("__"):
            raise ValueError(f"handler {path!r}: dunder name {part!r} is not allowed")
    return module, attr


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED)


ACTIVE_STATES = (TaskState.QUEUED, TaskState.RUNNING, TaskState.WAITING)


class WorkerState(StrEnum):
    IDLE = "idle"
    SERVING = "serving"  # a member of queues (``member_of``), no task
    ASSIGNED = "assigned"
    LEAVING = "leaving"


def describe_error(exc: ValueError) -> str:
    """A short, single-line reason (pydantic's text repeats the input, which may be big)."""
    if isinstance(exc, ValidationError):
        parts = []
        for e in exc.errors()[:3]:
            where = ".".join(str(x) for x in e["loc"]) or "input"
            parts.append(f"{where}: {e['msg']}")
        return f"{exc.error_count()} error(s): " + "; ".join(parts)
    return str(exc)[:300]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TaskSpec(_Model):
    """What a user submits: one target task, split into subtasks."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=200)
    handler: str = ""  # required except for mode "queue" (its jobs name their handlers)
    # an iterable; or an async iterable, for AsyncClient.submit
    subtasks: Iterable[Any] | AsyncIterable[Any] = Field(default=(), exclude=True, repr=False)
    min_nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    max_nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS)
    subtask_timeout: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT)
    partitions: int = Field(default=0, ge=0, le=MAX_PARTITIONS)
    node_selector: dict[str, str] = Field(default_factory=dict)
    result_ttl: float = Field(default=24 * 3600.0, gt=0, le=MAX_TTL)
    max_dead: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    mode: Literal["subtask", "step", "queue"] = "subtask"
    options: dict[str, Any] = Field(default_factory=dict)
    # the retry schedule of a failed subtask (a queue's: of its jobs):
    # queueworks.protocol.retry_policy
    retry_delay: float = Field(default=DEFAULT_RETRY_DELAY, ge=0, le=MAX_RETRY_DELAY)
    retry_backoff: float = Field(default=DEFAULT_RETRY_BACKOFF, ge=1, le=MAX_BACKOFF)
    retry_max_delay: float = Field(default=DEFAULT_RETRY_MAX_DELAY, ge=0, le=MAX_RETRY_DELAY)

    if TYPE_CHECKING:  # handler: a path, or a typed job function (@job); the rest as declared

        def __init__(self, *, handler: str | NamedHandler = "", **fields: Any) -> None: ...

    @field_validator("handler", mode="before")
    @classmethod
    def _handler_path(cls, v: Any) -> Any:
        if not isinstance(v, str) and hasattr(v, "signature"):  # a typed job function
            v = v.path  # subtasks: its calls (fn.call(...))
        if isinstance(v, str) and v:
            parse_handler_path(v)
        return v

    @field_validator("subtasks", mode="plain")
    @classmethod
    def _iterable(cls, v: Any) -> Iterable[Any] | AsyncIterable[Any]:
        if isinstance(v, AsyncIterable):
            return v
        if isinstance(v, str | bytes | dict) or not isinstance(v, Iterable):
            raise ValueError("subtasks must be a list or an iterable of JSON-able payloads")
        return v

    @model_validator(mode="after")
    def _mode(self) -> TaskSpec:
        if self.mode == "queue":
            if self.handler or self.partitions:
                raise ValueError("mode='queue' takes no handler and no partitions")
        elif not self.handler:
            parse_handler_path(self.handler)  # "handler '' must look like ..."
        if self.mode == "step" and self.partitions:
            raise ValueError("mode='step' takes no partitions")
        return self

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any]) -> dict[str, Any]:
        """No NaN or infinity in them (stored as JSON, they would read back as null)."""
        check_finite_tree("options", v)
        return v

    @model_validator(mode="after")
    def _bounds(self) -> TaskSpec:
        if self.max_nodes is not None and self.max_nodes < self.min_nodes:
            raise ValueError(
                f"max_nodes ({self.max_nodes}) must be >= min_nodes ({self.min_nodes})"
            )
        return self

    @model_serializer(mode="wrap")
    def _sparse(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The retry settings only when they are not the defaults: a spec that does not use
        them is stored as it was before they existed (an older worker reads it)."""
        out: dict[str, Any] = dump(self)
        for name, default in _SPARSE_FIELDS.items():
            if name in out and out[name] == default:
                del out[name]
        return out

    def spec_json(self) -> str:
        """The spec as stored in the task record (without the subtasks)."""
        return self.model_dump_json()


_SPARSE_FIELDS = {
    "retry_delay": DEFAULT_RETRY_DELAY,
    "retry_backoff": DEFAULT_RETRY_BACKOFF,
    "retry_max_delay": DEFAULT_RETRY_MAX_DELAY,
}


class StoredSpec(TaskSpec):
    """A spec read back from Redis: subtasks are not part of it. Its options are not
    refused (an older version stored NaN as null): their readers fall back to defaults. A
    NaN or infinity in them (written by hand: JSON's ``Infinity``) reads as the null that
    storing it would write, so a spec reads back as it is stored."""

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any]) -> dict[str, Any]:
        return {k: finite_or_none(item) for k, item in v.items()}


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinity in it (dicts and lists) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value


@dataclass(frozen=True)
class Role:
    """A member's role in one epoch: its index in the sorted member list."""

    rank: int
    world_size: int
    epoch: int

    @property
    def leader(self) -> bool:
        return self.rank == 0


class NodeInfo(_Model):
    worker: str
    rank: int
    epoch: int
    heartbeat_age: float | None = None
    current: str | None = None


class TaskRecord(_Model):
    """A task as its record in Redis says (``queueworks.protocol.records`` is its codec)."""

    id: str
    name: str
    state: TaskState
    total: int
    done: int
    dead: int
    rejected: int = 0  # stream entries that were no subtask of the task (not in done/dead)
    epoch: int
    priority: int
    min_nodes: int
    max_nodes: int | None
    partitions: int = 0
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    reason: str | None = None  # why it has no (or too few) nodes while it waits; why it failed
    rq_job: str | None = None  # the RQ job that submitted it (queueworks.rq), if any

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def settled(self) -> int:
        return self.done + self.dead

    @property
    def progress(self) -> float:
        return self.settled / self.total if self.total else 0.0


class TaskStatus(TaskRecord):
    """What ``Task.status()`` says: the record and the node set with ranks."""

    nodes: list[NodeInfo] = Field(default_factory=list)


class WorkerRecord(_Model):
    id: str
    host: str
    pid: int
    labels: dict[str, str] = Field(default_factory=dict)
    allow: list[str] = Field(default_factory=list)  # module prefixes it may run handlers from
    queues: list[str] | None = None  # its --queues: the only queues it serves (None: any)
    member_of: list[str] = Field(default_factory=list)  # the queues it is a member of now
    state: WorkerState = WorkerState.IDLE
    task: str | None = None
    rank: int | None = None
    epoch: int | None = None
    current: str | None = None
    jobs: list[str] = Field(default_factory=list)  # the queues' jobs it runs now: "QUEUE/JOB"
    processed: int = 0
    started_at: float
    last_heartbeat: float | None = None


NOT_ALLOWED = "not allowed"  # outside a worker's --allow prefixes: another worker may run it
UNUSABLE = "unusable"  # it cannot be imported or is no handler: on that worker's code


class Refusal(_Model):
    """A worker that cannot run a task's handler says so (``qw:task:{T}:refused``); the
    controller does not give it that task again while that worker process lives."""

    reason: str
    kind: str  # NOT_ALLOWED | UNUSABLE
    since: float  # the refusing worker's ``started_at``: a restarted worker may try again


class DeadLetter(_Model):
    id: str
    index: int | None
    reason: str
    error: str
    attempts: int
    payload: str | None
    worker: str | None
    job: str | None = None  # a queue's: the dead job's id


class JobState(StrEnum):
    SCHEDULED = "scheduled"  # delayed: waits for its time
    DEFERRED = "deferred"  # waits for its dependencies (``depends_on``)
    QUEUED = "queued"  # on the queue's stream, not started
    RUNNING = "running"  # a member has it (started, or about to)
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.DEAD, JobState.CANCELLED)


class JobStatus(_Model):
    """What ``Job.status()`` says."""

    id: str
    queue: str
    handler: str
    state: JobState
    attempts: int = 0
    worker: str | None = None
    enqueued_at: float
    run_at: float | None = None  # a delayed job's time
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None  # a dead job's reason and last error line
    reason: str | None = None  # why a queued job waits (no member may run its handler), or
    # what a deferred one waits for ("waits for 2 of 3 dependencies: ...")
    progress: float | None = None  # 0..1: its handler's last ctx.progress (None: no report)
    progress_message: str | None = None  # the message of that report
    last_error: str | None = None  # a job not dead that failed: its last error line
    waits_for: list[str] = Field(default_factory=list)  # a deferred job's dependencies left
    priority: int = 0  # its priority in its queue (``queueworks.protocol.priorities``)


class JobDetail(JobStatus):
    """A job as its page shows it (``Queue.job_detail``): its status, and what it holds."""

    payload: str | None = None  # its payload JSON, while kept (a done job's: up to a bound)
    result: str | None = None  # a done job's result JSON
    traceback: str | None = None  # a dead job's (or the last failed attempt's) traceback
    entry: str | None = None  # its stream entry, while it has one
    options: dict[str, Any] = Field(default_factory=dict)  # its own: retry schedule, unique key
    trace_id: str | None = None  # its trace's id, when it was enqueued or run while tracing


class JobPage(_Model):
    """A page of a queue's jobs in one state (``Queue.jobs``): how many there are, and the
    page."""

    state: JobState
    total: int
    offset: int
    limit: int
    jobs: list[JobStatus] = Field(default_factory=list)


class QueueStatus(_Model):
    """What ``Queue.status()`` and ``Client.queues()`` say."""

    name: str
    state: TaskState
    backlog: int  # jobs to run now not started: on the stream, set aside, waiting for a slot
    scheduled: int  # delayed jobs not due yet
    running: int  # jobs a member holds
    deferred: int = 0  # jobs waiting for their dependencies
    done: int
    dead: int
    rejected: int = 0
    nodes: list[NodeInfo] = Field(default_factory=list)
    epoch: int
    min_nodes: int
    max_nodes: int | None
    priority: int
    rates: dict[str, float] = Field(default_factory=dict)  # jobs finished per s: "1s", ...
    reason: str | None = None
    paused: bool = False  # its members read no new job (``Queue.pause``)
    rate_limit: float | None = None  # jobs started per second at most (``queueworks.queue.flow``)
    group_limit: int | None = None  # jobs of one group running at once at most
    limited: bool = False  # held back by its rate_limit now (a read found no token, < 1 s ago)
    groups_running: dict[str, int] = Field(default_factory=dict)  # slots held, by group
    groups_waiting: dict[str, int] = Field(default_factory=dict)  # jobs waiting for a slot
    # jobs set aside (no member that read them may run their handler), by handler: in backlog
    set_aside: dict[str, int] = Field(default_factory=dict)


class Event(_Model):
    id: str
    kind: str
    fields: dict[str, str]


class Schedule(_Model):
    """A queue's periodic job, as ``Queue.schedules()`` lists it (times in s since the epoch)."""

    name: str
    queue: str
    handler: str
    payload: Any = None
    every: float | None = None  # s between two runs; or
    cron: str | None = None  # a cron expression (UTC)
    next_run: float | None = None  # its next due time
    last_run: float | None = None  # the due time of the last job it enqueued
    last_job: str | None = None  # that job's id
