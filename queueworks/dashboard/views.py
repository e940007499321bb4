"""What the dashboard shows and its JSON API returns: one pydantic model per kind of row."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from queueworks.protocol.models import (
    DeadLetter,
    JobStatus,
    NodeInfo,
    Schedule,
    TaskRecord,
    TaskState,
    WorkerRecord,
)


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskSummary(TaskRecord):
    """One row of the task list (no per-member reads: ``nodes`` is the member count)."""

    nodes: int


class HistoryEntry(_View):
    """One entry of a task's history stream: a membership change or a rebalance record."""

    id: str
    epoch: int
    cause: str
    ts: float
    size: int | None = None
    worker: str | None = None
    pause_ms: float | None = None
    reclaimed: int | None = None
    since_change_ms: float | None = None


class Rebalance(_View):
    """A membership change joined with the rebalance record the rank-0 member wrote."""

    epoch: int
    cause: str
    worker: str | None
    size: int | None
    ts: float
    pause_ms: float | None = None
    reclaimed: int | None = None
    since_change_ms: float | None = None


class StreamBacklog(_View):
    stream: str
    unread: int
    pending: int


class PendingEntry(_View):
    id: str
    stream: str
    consumer: str
    idle_ms: int
    deliveries: int


class ResultSample(_View):
    index: int
    result: Any


class RqJob(_View):
    id: str
    status: str | None = None


class TaskDetail(_View):
    task: TaskSummary
    handler: str
    max_attempts: int
    subtask_timeout: float
    node_selector: dict[str, str]
    nodes: list[NodeInfo]
    rebalances: list[Rebalance]
    backlog: list[StreamBacklog]
    pending: list[PendingEntry]
    pending_total: int
    pending_by_consumer: dict[str, int]
    dead_letters: list[DeadLetter]  # newest first, a page of them
    dead_letters_total: int
    dead_letters_next: str | None = None  # ``dead_before`` of the next (older) page
    # jobs counted dead beyond the letters kept (the stream keeps the newest ones: at least
    # this many dead jobs have no letter, and no requeue can reach them)
    dead_without_letter: int = 0
    results: list[ResultSample]
    results_total: int
    rq_job: RqJob | None = None

    @property
    def backlog_total(self) -> int:
        return sum(b.unread + b.pending for b in self.backlog)


class WorkerView(WorkerRecord):
    """A worker as the workers page shows it: its record, and what its keys say now."""

    alive: bool
    draining: bool

    @property
    def status(self) -> str:
        """What the page shows: lost / draining / idle / assigned."""
        if not self.alive:
            return "lost"
        if self.draining:
            return "draining"
        return self.state.value


class EventView(_View):
    id: str
    kind: str
    ts: float
    task: str | None = None
    task_name: str | None = None  # the task's name (a queue's is its id), if it is known
    worker: str | None = None
    fields: dict[str, str]


class Overview(_View):
    tasks_by_state: dict[str, int]
    workers_by_state: dict[str, int]
    tasks_total: int
    workers_total: int
    leader: str | None
    throughput: list[tuple[float, float]]
    events: list[EventView]
    queues: list[QueueSummary] = []


class QueueSummary(_View):
    """One row of the queue list (``nodes`` is the member count). A finished queue has no
    live backlog, scheduled, running or reason: what it had not run is ``left``."""

    name: str
    state: TaskState
    backlog: int  # not started: on the stream, set aside, or waiting for a group slot
    scheduled: int  # delayed, not due yet
    running: int  # held by a member
    deferred: int = 0  # waiting for their dependencies
    cancelled: int = 0  # cancelled before they ran (the newest kept: ``DONE_KEPT``)
    left: int = 0  # finished queue: the jobs it had not run (they never run)
    done: int
    dead: int
    rejected: int
    nodes: int
    epoch: int
    min_nodes: int
    max_nodes: int | None
    priority: int
    rates: dict[str, float]  # jobs finished per second over the last "1s", "10s", "60s"
    reason: str | None
    created_at: float
    problems: list[str] = []  # record fields that did not decode (shown as their default)
    paused: bool = False  # its members read no new job (``Queue.pause``)
    rate_limit: float | None = None  # jobs started per second at most (``queueworks.queue.flow``)
    group_limit: int | None = None  # jobs of one group running at once at most
    limited: bool = False  # held back by its rate_limit now
    groups_running: dict[str, int] = {}  # slots held, by group
    groups_waiting: dict[str, int] = {}  # jobs waiting for a slot, by group
    set_aside: dict[str, int] = {}  # jobs set aside (no member may run them), by handler
    warnings: list[str] = []  # what is wrong, in sentences (``dashboard.health``)

    @property
    def finished(self) -> bool:
        return self.state.finished


class JobDeadLetter(_View):
    """A dead letter of a queue: a job that died (or an entry that was no job: rejected)."""

    id: str
    job: str | None
    handler: str | None
    reason: str
    error: str
    attempts: int | None
    payload: str | None  # its first ``PAYLOAD_SHOWN`` characters: the job's page has it all
    worker: str | None
    ts: float | None
    payload_bytes: int | None = None  # the size of the whole payload, in bytes (UTF-8)
    payload_cut: bool = False  # ``payload`` is only its start


class LatencyBucket(_View):
    le: float | None  # upper bound in seconds; None = +Inf
    count: int  # cumulative: jobs that started within ``le`` of being enqueued


class QueueDetail(_View):
    queue: QueueSummary
    max_attempts: int
    job_timeout: float
    result_ttl: float
    node_selector: dict[str, str]
    wait_replicas: int = 0
    wait_timeout: float = 1.0
    retry_delay: float = 0.0
    retry_backoff: float = 2.0
    retry_max_delay: float = 600.0
    rate_limit: float | None = None
    group_limit: int | None = None
    handlers: list[str]
    nodes: list[NodeInfo]
    rebalances: list[Rebalance]
    latency: list[LatencyBucket]
    latency_sum: float
    latency_count: int
    dead_letters: list[JobDeadLetter]  # newest first, a page of them
    dead_letters_total: int
    dead_letters_next: str | None = None  # ``dead_before`` of the next (older) page
    # jobs counted dead beyond the letters kept (the stream keeps the newest ones: at least
    # this many dead jobs have no letter, and no requeue can reach them)
    dead_without_letter: int = 0
    schedules: list[Schedule] = Field(default_factory=list)  # its periodic jobs, by name
    running_jobs: list[JobStatus] = []  # up to 20 running, oldest first, with progress
    jobs_by_state: dict[str, int] = {}  # each state's list total (the page's tabs)

    def latency_quantile(self, q: float) -> float | None:
        """The upper bound of the bucket the ``q`` quantile falls in (None: no job yet, or
        beyond the last finite bound)."""
        if not self.latency_count:
            return None
        for b in self.latency:
            if b.count >= q * self.latency_count:
                return b.le
        return None
