"""What the dashboard shows and its JSON API returns: one pydantic model per kind of row."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from queueworks.models import DeadLetter, NodeInfo, TaskState, WorkerState


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskSummary(_View):
    """One row of the task list (no per-member reads: ``nodes`` is the member count)."""

    id: str
    name: str
    state: TaskState
    total: int
    done: int
    dead: int
    epoch: int
    priority: int
    min_nodes: int
    max_nodes: int | None
    nodes: int
    partitions: int = 0
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    rq_job: str | None = None
    rejected: int = 0
    reason: str | None = None

    @property
    def settled(self) -> int:
        return self.done + self.dead

    @property
    def progress(self) -> float:
        return self.settled / self.total if self.total else 0.0

    @property
    def finished(self) -> bool:
        return self.state.finished


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
    dead_letters: list[DeadLetter]
    dead_letters_total: int
    results: list[ResultSample]
    results_total: int
    rq_job: RqJob | None = None

    @property
    def backlog_total(self) -> int:
        return sum(b.unread + b.pending for b in self.backlog)


class WorkerView(_View):
    id: str
    host: str
    pid: int
    labels: dict[str, str]
    allow: list[str] = []
    state: WorkerState
    alive: bool
    draining: bool
    task: str | None = None
    rank: int | None = None
    epoch: int | None = None
    current: str | None = None
    processed: int = 0
    started_at: float
    last_heartbeat: float | None = None

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
