"""One controller pass, in proportion to what changed.

A pass reads again only what its events named (``controller.feed``), the tasks it must look
at again, and what the backstop says is due (``controller.backstop``: suspects of a lost
heartbeat, a page of the sweep, expired index entries); it folds the reads into the mirror
it keeps, allocates on the mirror's board, and writes only the differences, fenced
(``controller.writes``, ``controller.fence``). A task whose end an event announced is
released without a read (the release checks that it did end; a queue is read first, deep:
the wait lists of its groups, which no event announces, expire with it), and the leave of a
member of a task just released needs none. ``rebuild`` is the full read a new leader starts
from (and a gap in the events forces).

What the sweep finds different from the mirror is corrected and counted (``swept``): under
churn it often reads a change before the event that names it arrives; in a quiet system it
finds nothing, unless an event was lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.protocol.models import TaskState, describe_error
from queueworks.transport.connection import Connection

from .allocator import Plan, allocate
from .backstop import Backstop
from .feed import Dirty
from .fence import Fence
from .mirror import Mirror, TaskRow
from .reads import (
    PAGE,
    TaskRead,
    WorkerRead,
    all_ids,
    parse_tasks,
    parse_workers,
    queue_tasks,
    queue_workers,
    read_tasks,
    read_workers,
    unindexed,
)
from .reasons import Reasons
from .rows import Broken, Finished, differs, finished_row, task_row, task_state
from .rows import worker_row as make_worker_row
from .tally import Tally
from .writes import Writes

RELEASED_KEPT = 10_000  # released task ids remembered (their members' leaves need no read)


@dataclass
class PassStats:
    events: int = 0
    tasks: int = 0
    workers: int = 0
    moves: int = 0
    ops: int = 0
    swept: int = 0  # changes the sweep read before any event named them
    allocate_ms: float = 0.0


class Reconciler:
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        fence: Fence,
        log: Any,
        *,
        me: str,
        heartbeat_ttl: float,
        full_pass_interval: float,
        tally: Tally,
    ) -> None:
        self.r, self.keys, self.fence, self.log, self.me = r, keys, fence, log, me
        self.tally = tally
        self.ttl, self.full_interval = heartbeat_ttl, full_pass_interval
        self.mirror = Mirror()
        self.reasons = Reasons()
        self.recheck: set[str] = set()
        self.backstop = Backstop(
            r, keys, tally, heartbeat_ttl=heartbeat_ttl, interval=full_pass_interval
        )
        self.released: dict[str, None] = {}  # tasks this leader released lately, in order
        self._plan: tuple[int, Plan] | None = None  # the last plan and the board it left
        self.before_apply: Callable[[int], None] = lambda ops: None  # the process's hook

    def reset(self) -> None:
        """Forget what was read (no longer the leader)."""
        self.mirror, self.reasons, self.recheck = Mirror(), Reasons(), set()
        self.released, self._plan = {}, None
        self.backstop.reset()

    def busy(self) -> bool:
        """More to do without waiting for events (rechecks, reasons to refresh)."""
        return bool(self.recheck) or self.reasons.pending()

    def due(self) -> bool:
        """Time to look for lost workers, a sweep page and expired index entries."""
        return self.backstop.due()

    # -- the full read --------------------------------------------------------------------

    def rebuild(self) -> PassStats:
        """Forget everything, seal the fence (a cluster), read the whole state again, pass."""
        started = time.monotonic()
        self.fence.seal()
        self.reset()
        task_ids, worker_ids = all_ids(self.r, self.keys, tally=self.tally)
        workers = read_workers(self.r, self.keys, worker_ids, tally=self.tally)
        tasks = read_tasks(
            self.r, self.keys, task_ids, spec=task_ids, deep=task_ids, tally=self.tally
        )
        missing = unindexed(self.r, self.keys, task_ids, tally=self.tally)
        read = time.monotonic()
        stats = self._pass(tasks, workers, index=set(missing))
        self.log.info(
            "rebuilt",
            tasks=len(task_ids),
            workers=len(worker_ids),
            read_s=round(read - started, 3),
            pass_s=round(time.monotonic() - read, 3),
            moves=stats.moves,
        )
        return stats

    # -- one pass -------------------------------------------------------------------------

    def step(self, dirty: Dirty) -> PassStats:
        """Read what ``dirty`` names (and what is due), allocate, write the differences."""
        m = self.mirror
        tasks = dirty.tasks | self.recheck
        self.recheck = set()
        workers = set(dirty.workers)
        deep = set(dirty.deep)
        ended: dict[str, str] = {}  # tasks to release without a read
        for tid, kind in dirty.ended.items():
            # a queue is read whole first: its wait lists (which no event announces)
            # expire with it
            if tid in m.tasks and tid not in tasks and not m.tasks[tid].queue:
                ended[tid] = kind
            elif tid not in self.released:
                tasks.add(tid)
                deep.add(tid)
        for wid, tid in dirty.left.items():
            if (tid not in self.released and tid not in ended) or tid in tasks:
                tasks.add(tid)
                workers.add(wid)
        due = self.due()
        swept: set[str] = set()
        if due:  # count what the sweep alone finds changed, not what events named
            named = {f"t:{t}" for t in tasks} | {f"w:{w}" for w in workers}
            swept = self.backstop.sweep(self.mirror, tasks, workers, deep) - named
        new = {t for t in tasks if t not in m.tasks}
        deep |= new
        task_ids, worker_ids = sorted(tasks), sorted(workers)
        pipe = self.r.pipeline(transaction=False)
        if due:
            self.backstop.queue_looks(pipe)
        small = len(task_ids) + len(worker_ids) <= PAGE
        if small:
            queue_tasks(pipe, self.keys, task_ids, new, deep)
            queue_workers(pipe, self.keys, worker_ids)
        replies = iter(self.tally.run(pipe))
        suspects: list[Any] = next(replies) if due else []
        expired: list[Any] = next(replies) if due else []
        if small:
            task_reads = parse_tasks(task_ids, replies, new, deep)
            worker_reads = parse_workers(worker_ids, replies)
        else:
            task_reads = read_tasks(
                self.r, self.keys, task_ids, spec=new, deep=deep, tally=self.tally
            )
            worker_reads = read_workers(self.r, self.keys, worker_ids, tally=self.tally)
        if due:
            self.backstop.looked = time.monotonic()
            worker_reads += self.backstop.suspects(suspects, workers)
        stats = self._pass(task_reads, worker_reads, swept=swept, expired=expired, ended=ended)
        stats.events = dirty.events
        return stats

    def _pass(
        self,
        tasks: Sequence[TaskRead],
        workers: Sequence[WorkerRead],
        *,
        index: Collection[str] = (),
        swept: Collection[str] = (),
        expired: Sequence[Any] = (),
        ended: dict[str, str] | None = None,
    ) -> PassStats:
        writes = Writes(self.keys, self.mirror, self.me)
        stats = PassStats(tasks=len(tasks), workers=len(workers))
        touched: set[str] = set()
        for tid, kind in (ended or {}).items():  # the release checks that it did end
            self._release(self.mirror.tasks[tid], TaskState(kind), writes)
        stats.swept += self._absorb_workers(workers, writes, touched, swept)
        stats.swept += self._absorb_tasks(tasks, writes, touched, swept)
        for tid in index:  # active tasks the index does not list yet
            if (row := self.mirror.tasks.get(tid)) is not None:
                writes.index(row.id, row.created_at)
        board = self.mirror.board
        plan = self._plan[1] if self._plan and self._plan[0] == board.version else None
        if plan is None:  # the board changed since the last plan was carried out
            started = time.perf_counter()
            plan = allocate(board)
            stats.allocate_ms = (time.perf_counter() - started) * 1000
        self._moves(plan, writes, touched)
        self._states(plan, writes, touched)
        self._explain(plan, writes, touched | set(self.reasons.due(self.mirror)))
        if expired:
            self.backstop.expired([text(t) for t in expired], writes)
        if len(writes):
            self.before_apply(len(writes))
            writes.commit(self.fence.apply(writes.batch))
        # carried out as planned, the board is the plan's: allocating again would move nothing
        self._plan = (board.version, plan) if writes.as_planned else None
        self.recheck |= writes.recheck
        stats.moves, stats.ops = writes.moved, len(writes)
        t = self.tally
        t.passes += 1
        t.moves, t.ops, t.swept = t.moves + stats.moves, t.ops + stats.ops, t.swept + stats.swept
        t.tasks_read, t.workers_read = t.tasks_read + stats.tasks, t.workers_read + stats.workers
        return stats

    # -- folding reads into the mirror ----------------------------------------------------

    def _absorb_workers(
        self,
        reads: Sequence[WorkerRead],
        writes: Writes,
        touched: set[str],
        swept: Collection[str],
    ) -> int:
        m, swept_n = self.mirror, 0
        for read in reads:
            known = m.workers.get(read.id)
            row = None
            if read.alive and read.listed:
                try:
                    row = make_worker_row(read, known)
                except ValueError as exc:  # broken: drop it; a live worker registers again
                    self.log.warning("worker_record_invalid", worker=read.id, error=str(exc))
            if row is None:
                if read.listed:  # its heartbeat is gone (or its record broken): lost
                    writes.lost(read)
                if known is not None:
                    touched.add(known.assign)
                    touched.update(known.member_of)
                    m.drop_worker(read.id)
                    swept_n += f"w:{read.id}" in swept
                continue
            if known is None or known.assign != row.assign:
                touched.update((row.assign, known.assign if known else ""))
            touched.update(row.member_of ^ (known.member_of if known else frozenset()))
            swept_n += f"w:{read.id}" in swept and differs(known, row)
            m.put_worker(row)
        touched.discard("")
        return swept_n

    def _absorb_tasks(
        self, reads: Sequence[TaskRead], writes: Writes, touched: set[str], swept: Collection[str]
    ) -> int:
        m, swept_n = self.mirror, 0
        for read in reads:
            known = m.tasks.get(read.id)
            state = task_state(read)
            if state is None:  # expired, never written, or broken: out of the queue
                if read.fields[1] is not None:
                    self.log.error("task_record_invalid", task_id=read.id, error="bad state")
                writes.unqueue(read.id)
                self._forget(read.id)
                continue
            try:
                row: Any = task_row(read, known, state)
            except ValueError as exc:  # another writer broke it: fail it, never crash on it
                row = Broken(f"task record is invalid: {describe_error(exc)}")
                if state.finished:
                    row = finished_row(read, known, state)
            swept_n += f"t:{read.id}" in swept and differs(known, getattr(row, "row", row))
            if isinstance(row, Broken):
                writes.fail(read.id, row.error, "task_record_invalid", self.log)
            elif isinstance(row, Finished):
                if known is not None or read.queued is not False:  # else released already
                    self._release(row.row, row.state, writes)
            else:
                m.put_task(row)
                touched.add(row.id)
                if read.queued is False:
                    writes.requeue(row)
        return swept_n

    def _release(self, row: TaskRow, state: TaskState, writes: Writes) -> None:
        self._forget(row.id)
        writes.release(row, state)
        self.released[row.id] = None
        while len(self.released) > RELEASED_KEPT:
            del self.released[next(iter(self.released))]

    def _forget(self, task_id: str) -> None:
        self.mirror.drop_task(task_id)
        self.reasons.forget(task_id)

    # -- what to write --------------------------------------------------------------------

    def _moves(self, plan: Plan, writes: Writes, touched: set[str]) -> None:
        """Write the assignments that change: those the plan changes, and those that name a
        task the board does not hold (finished, unknown) or a queue (never assigned: its
        members join it on their own)."""
        m = self.mirror
        workers, tasks = m.workers, m.board.tasks
        strays = [w for t, ws in m.nodes.items() if t not in tasks or tasks[t].queue for w in ws]
        for wid in sorted({*plan.changed(), *strays}):
            task = plan.assignment.get(wid)
            if wid not in workers:
                continue
            was = workers[wid].assign
            if was != (task or ""):
                writes.assign(wid, task or "", was)
                touched.update((was, task or ""))
        touched.discard("")

    def _states(self, plan: Plan, writes: Writes, touched: set[str]) -> None:
        for tid in sorted(touched):
            row = self.mirror.tasks.get(tid)
            if row is None:
                continue
            nodes = self.mirror.board.tasks[tid].nodes if row.queue else plan.nodes_of(tid)
            size = len(nodes)
            target = next_state(row, size)
            if target is not None and target != row.state:
                writes.state(row, target, size, self.log)

    def _explain(self, plan: Plan, writes: Writes, tasks: set[str]) -> None:
        """Keep each task's ``reason`` true: why it has too few nodes (empty once it has
        them), a queue's why it has no member; fail a task (never a queue) when no live
        worker can ever run it."""
        m = self.mirror
        busy: set[str] | None = None  # the workers the plan gives a task, once needed
        for tid in sorted(tasks):
            row = m.tasks.get(tid)
            if row is None:
                continue
            reason, never = "", False
            view = m.board.tasks[tid]
            if row.queue:
                if not view.nodes:
                    if busy is None:
                        busy = {w for w, t in plan.assignment.items() if t is not None}
                    reason = self.reasons.explain_queue(m, view, busy)
            elif len(plan.nodes_of(tid)) < max(1, row.min_nodes):
                reason, never = self.reasons.explain(m, view)
            if never:
                writes.fail(tid, f"no worker can run it: {reason}", "task_unrunnable", self.log)
            elif reason != row.reason:
                writes.reason(row, reason)


def next_state(row: TaskRow, size: int) -> TaskState | None:
    """The state an active task moves to with ``size`` nodes (None: it stays as it is): a
    task runs once it has ``min_nodes`` and waits if it loses them; a queue (``size``: its
    live members) runs while it has one and waits while it has none."""
    if row.queue:
        return TaskState.RUNNING if size else TaskState.WAITING
    if size >= row.min_nodes and size > 0:
        return TaskState.RUNNING
    return TaskState.WAITING if row.state == TaskState.RUNNING else None
