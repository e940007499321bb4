"""What the leading controller keeps of Redis between passes: the active tasks, the live
workers, their assignments and queue memberships, and the allocator's `Board` built from them.

Rows change only when a pass reads them again (the events named them, the backstop sweep
came by) or when the pass's own writes succeed. Views are derived: a task's ``nodes`` are the
live workers whose ``assign`` names it (a queue's: the live workers whose record says they
are its members), its ``refused`` the live workers whose refusal is by their current process
(a restarted worker may try again). A new leader builds a fresh mirror from a full read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from queueworks.protocol.models import Refusal, TaskState

from .allocator import TaskView, WorkerView
from .board import Board


@dataclass
class TaskRow:
    """An active task: its record's fields that matter here, and its refusals."""

    id: str
    state: TaskState
    priority: int
    min_nodes: int
    max_nodes: int | None
    created_at: float
    selector: dict[str, str]
    handler: str
    result_ttl: float
    partitions: int
    reason: str = ""
    refusals: dict[str, Refusal] = field(default_factory=dict)  # every one in its hash
    handlers: tuple[str, ...] = ()  # a queue's: the handlers its jobs name
    aside: tuple[str, ...] = ()  # a queue's: the handlers of its jobs set aside
    waits: tuple[str, ...] = ()  # a queue's: the groups with a wait list (as last read)
    queue: bool = False  # its spec's mode is "queue"


@dataclass
class WorkerRow:
    id: str
    labels: dict[str, str]
    allow: tuple[str, ...] | None
    started_at: float | None
    assign: str  # the task id in its assign key, as in Redis ("" = idle)
    record: bytes | None = None  # its record as read (decoded again only when it changes)
    queues: tuple[str, ...] | None = None  # its --queues filter (None: every queue)
    member_of: frozenset[str] = frozenset()  # the queues its record says it is a member of


class Mirror:
    def __init__(self) -> None:
        self.tasks: dict[str, TaskRow] = {}
        self.workers: dict[str, WorkerRow] = {}
        self.board = Board()
        self.nodes: dict[str, set[str]] = {}  # task id -> live workers whose assign names it
        self.members: dict[str, set[str]] = {}  # queue id -> live workers that are members
        self.refusers: dict[str, set[str]] = {}  # worker -> tasks it has a refusal of
        self.pool = 0  # bumped whenever the live workers or their views change
        # bumped whenever what ``controller.demand`` counts from changes: a task's or queue's
        # sizing fields, its nodes or members, a task added or dropped
        self.demand_version = 0

    # -- tasks ----------------------------------------------------------------------------

    def put_task(self, row: TaskRow) -> None:
        old = self.tasks.get(row.id)
        if old is None or _sizing(old) != _sizing(row):
            self.demand_version += 1
        if old is not None:
            for wid in old.refusals:
                self.refusers.get(wid, set()).discard(row.id)
        self.tasks[row.id] = row
        for wid in row.refusals:
            self.refusers.setdefault(wid, set()).add(row.id)
        self._refresh(row.id)

    def drop_task(self, task_id: str) -> TaskRow | None:
        row = self.tasks.pop(task_id, None)
        if row is None:
            return None
        self.demand_version += 1
        for wid in row.refusals:
            self.refusers.get(wid, set()).discard(task_id)
        self.board.drop_task(task_id)
        return row

    def refusals_of(self, task_id: str) -> dict[str, Refusal]:
        """The task's refusals by live worker processes."""
        row = self.tasks[task_id]
        out = {}
        for wid, refusal in row.refusals.items():
            worker = self.workers.get(wid)
            if worker is not None and worker.started_at == refusal.since:
                out[wid] = refusal
        return out

    def _refresh(self, task_id: str) -> None:
        row = self.tasks.get(task_id)
        if row is None:
            return
        nodes = (self.members if row.queue else self.nodes).get(task_id, ())
        self.board.put_task(
            TaskView(
                id=row.id,
                priority=row.priority,
                min_nodes=row.min_nodes,
                max_nodes=row.max_nodes,
                seq=row.created_at,
                selector=row.selector,
                nodes=frozenset(nodes),
                running=row.state == TaskState.RUNNING,
                handler=row.handler,
                handlers=row.handlers,
                refused=frozenset(self.refusals_of(task_id)),
                queue=row.queue,
            )
        )

    # -- workers --------------------------------------------------------------------------

    def put_worker(self, row: WorkerRow) -> None:
        old = self.workers.get(row.id)
        self.workers[row.id] = row
        view = WorkerView(row.id, row.labels, row.allow, row.queues)
        if old is None or (old.labels, old.allow, old.queues, old.started_at) != (
            row.labels,
            row.allow,
            row.queues,
            row.started_at,
        ):
            self.pool += 1
            self.board.put_worker(view)
            for tid in list(self.refusers.get(row.id, ())):
                self._refresh(tid)
        self._move(row.id, old.assign if old else "", row.assign)
        self._member(row.id, old.member_of if old else frozenset(), row.member_of)

    def drop_worker(self, worker_id: str) -> WorkerRow | None:
        row = self.workers.pop(worker_id, None)
        if row is None:
            return None
        self.pool += 1
        self.board.drop_worker(worker_id)
        self._move(worker_id, row.assign, "")
        self._member(worker_id, row.member_of, frozenset())
        for tid in list(self.refusers.get(worker_id, ())):
            self._refresh(tid)
        return row

    def set_assign(self, worker_id: str, task_id: str) -> None:
        """The worker's assign key now names ``task_id`` ("" = idle): our write succeeded."""
        row = self.workers.get(worker_id)
        if row is None:
            return
        old, row.assign = row.assign, task_id
        self._move(worker_id, old, task_id)

    def _move(self, worker_id: str, old: str, new: str) -> None:
        if old == new:
            return
        self.demand_version += 1
        if old:
            held = self.nodes.get(old, set())
            held.discard(worker_id)
            if not held:
                self.nodes.pop(old, None)
            self._refresh(old)
        if new:
            self.nodes.setdefault(new, set()).add(worker_id)
            self._refresh(new)

    def _member(self, worker_id: str, old: frozenset[str], new: frozenset[str]) -> None:
        if old != new:
            self.demand_version += 1
        for qid in old - new:
            held = self.members.get(qid, set())
            held.discard(worker_id)
            if not held:
                self.members.pop(qid, None)
            self._refresh(qid)
        for qid in new - old:
            self.members.setdefault(qid, set()).add(worker_id)
            self._refresh(qid)


def _sizing(row: TaskRow) -> tuple[object, ...]:
    """What the count of wanted workers reads of a row."""
    return (row.selector, row.queue, row.min_nodes, row.max_nodes, row.partitions, row.priority)
