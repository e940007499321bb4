"""One controller pass, in proportion to what changed.

A pass reads again only what its events named (``controller.feed``), the workers whose
heartbeat score in ``qw:workers`` is older than the heartbeat TTL (suspects: a dead worker
emits nothing), the tasks it must look at again, and one page of the backstop sweep; it
folds the reads into the mirror it keeps, allocates on the mirror's board, and writes only
the differences, fenced (``controller.writes``, ``controller.fence``). ``rebuild`` is the full
read a new leader starts from (and a gap in the events forces).

The backstop: every ``full_pass_interval`` seconds the sweep has read every active task and
every known worker again, a page per second (so its cost per pass is bounded:
ceil(ids x 1 s / interval)); what it finds different from the mirror is *drift* (an event
that was never seen), logged and corrected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from controller.allocator import Plan, allocate
from controller.feed import Dirty
from controller.fence import Fence
from controller.mirror import Mirror
from controller.reads import (
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
)
from controller.reasons import Reasons
from controller.rows import Broken, Finished, differs, finished_row, task_row, task_state
from controller.rows import worker_row as make_worker_row
from controller.writes import Writes
from queueworks.connection import Connection, text
from queueworks.keys import Keys
from queueworks.models import TaskState, describe_error

SUSPECTS = 1000  # workers checked for a lost heartbeat per look
EVERY = 1.0  # s between two looks for suspects, sweep pages, expired index entries
EXPIRED = 200  # expired index entries handled per look


@dataclass
class PassStats:
    events: int = 0
    tasks: int = 0
    workers: int = 0
    moves: int = 0
    ops: int = 0
    drift: int = 0
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
    ) -> None:
        self.r, self.keys, self.fence, self.log, self.me = r, keys, fence, log, me
        self.ttl, self.full_interval = heartbeat_ttl, full_pass_interval
        self.mirror = Mirror()
        self.reasons = Reasons()
        self.recheck: set[str] = set()
        self._looked = 0.0  # monotonic: last look for suspects / sweep page / expiries
        self._checked: dict[str, float] = {}  # suspect -> monotonic of its last check
        self._sweep: list[str] = []  # "t:<id>" / "w:<id>" still to read this round
        self._sweep_page = 0
        self.before_apply: Callable[[int], None] = lambda ops: None  # the process's hook

    def reset(self) -> None:
        """Forget what was read (no longer the leader)."""
        self.mirror, self.reasons, self.recheck = Mirror(), Reasons(), set()
        self._sweep = []

    def busy(self) -> bool:
        """More to do without waiting for events (rechecks, reasons to refresh)."""
        return bool(self.recheck) or self.reasons.pending()

    def due(self) -> bool:
        """Time to look for lost workers, a sweep page and expired index entries."""
        return time.monotonic() - self._looked >= EVERY

    # -- the full read --------------------------------------------------------------------

    def rebuild(self) -> PassStats:
        """Forget everything, seal the fence (a cluster), read the whole state again, pass."""
        self.fence.seal()
        self.reset()
        task_ids, worker_ids = all_ids(self.r, self.keys)
        workers = read_workers(self.r, self.keys, worker_ids)
        tasks = read_tasks(self.r, self.keys, task_ids, spec=task_ids, deep=task_ids)
        self.log.info("rebuilt", tasks=len(task_ids), workers=len(worker_ids))
        return self._pass(tasks, workers, Dirty(), index=True)

    # -- one pass -------------------------------------------------------------------------

    def step(self, dirty: Dirty) -> PassStats:
        """Read what ``dirty`` names (and what is due), allocate, write the differences."""
        m = self.mirror
        tasks = dirty.tasks | self.recheck
        self.recheck = set()
        workers = set(dirty.workers)
        deep = set(dirty.deep)
        due = self.due()
        swept: set[str] = set()
        if due:  # drift is what the sweep alone finds changed: not what events named
            named = {f"t:{t}" for t in tasks} | {f"w:{w}" for w in workers}
            swept = self._sweep_step(tasks, workers, deep) - named
        new = {t for t in tasks if t not in m.tasks}
        deep |= new
        task_ids, worker_ids = sorted(tasks), sorted(workers)
        pipe = self.r.pipeline(transaction=False)
        if due:
            pipe.zrangebyscore(self.keys.workers, "-inf", time.time() - self.ttl, 0, SUSPECTS)
            pipe.zrangebyscore(self.keys.tasks_expiry, "-inf", time.time(), 0, EXPIRED)
        small = len(task_ids) + len(worker_ids) <= PAGE
        if small:
            queue_tasks(pipe, self.keys, task_ids, new, deep)
            queue_workers(pipe, self.keys, worker_ids)
        replies = iter(pipe.execute())
        suspects: list[Any] = next(replies) if due else []
        expired: list[Any] = next(replies) if due else []
        if small:
            task_reads = parse_tasks(task_ids, replies, new, deep)
            worker_reads = parse_workers(worker_ids, replies)
        else:
            task_reads = read_tasks(self.r, self.keys, task_ids, spec=new, deep=deep)
            worker_reads = read_workers(self.r, self.keys, worker_ids)
        if due:
            self._looked = time.monotonic()
            worker_reads += self._suspects(suspects, workers)
        stats = self._pass(task_reads, worker_reads, dirty, swept=swept, expired=expired)
        stats.events = dirty.events
        return stats

    def _pass(
        self,
        tasks: Sequence[TaskRead],
        workers: Sequence[WorkerRead],
        dirty: Dirty,
        *,
        index: bool = False,
        swept: Collection[str] = (),
        expired: Sequence[Any] = (),
    ) -> PassStats:
        writes = Writes(self.keys, self.mirror, self.me)
        stats = PassStats(tasks=len(tasks), workers=len(workers))
        touched: set[str] = set()
        stats.drift += self._absorb_workers(workers, writes, touched, swept)
        stats.drift += self._absorb_tasks(tasks, writes, touched, swept)
        if index:
            for row in self.mirror.tasks.values():
                writes.index(row.id, row.created_at)
        started = time.perf_counter()
        plan = allocate(self.mirror.board)
        stats.allocate_ms = (time.perf_counter() - started) * 1000
        self._moves(plan, writes, touched)
        self._states(plan, writes, touched)
        self._explain(plan, writes, touched | set(self.reasons.due(self.mirror)))
        if expired:
            self._expired([text(t) for t in expired], writes)
        if len(writes):
            self.before_apply(len(writes))
            writes.commit(self.fence.apply(writes.batch))
        self.recheck |= writes.recheck
        stats.moves, stats.ops = writes.moved, len(writes)
        if stats.drift:
            self.log.warning("state_drift", found=stats.drift)
        return stats

    # -- folding reads into the mirror ----------------------------------------------------

    def _absorb_workers(
        self,
        reads: Sequence[WorkerRead],
        writes: Writes,
        touched: set[str],
        swept: Collection[str],
    ) -> int:
        m, drift = self.mirror, 0
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
                    writes.lost(read.id)
                if known is not None:
                    touched.add(known.assign)
                    m.drop_worker(read.id)
                    drift += f"w:{read.id}" in swept
                continue
            if known is None or known.assign != row.assign:
                touched.update((row.assign, known.assign if known else ""))
            drift += f"w:{read.id}" in swept and differs(known, row)
            m.put_worker(row)
        touched.discard("")
        return drift

    def _absorb_tasks(
        self, reads: Sequence[TaskRead], writes: Writes, touched: set[str], swept: Collection[str]
    ) -> int:
        m, drift = self.mirror, 0
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
            drift += f"t:{read.id}" in swept and differs(known, getattr(row, "row", row))
            if isinstance(row, Broken):
                writes.fail(read.id, row.error, "task_record_invalid", self.log)
            elif isinstance(row, Finished):
                self._forget(read.id)
                writes.release(row.row, row.state)
            else:
                m.put_task(row)
                touched.add(row.id)
                if read.queued is False:
                    writes.requeue(row)
        return drift

    def _forget(self, task_id: str) -> None:
        self.mirror.drop_task(task_id)
        self.reasons.forget(task_id)

    def _suspects(self, raw: Sequence[Any], reading: set[str]) -> list[WorkerRead]:
        """Read the workers whose last heartbeat is older than the TTL (not checked in the
        last second): the ones whose heartbeat key is gone are lost."""
        now = time.monotonic()
        ids = [w for w in map(text, raw) if w not in reading]
        ids = [w for w in ids if now - self._checked.get(w, -math.inf) >= EVERY]
        for wid in ids:
            self._checked[wid] = now
        if len(self._checked) > 4 * SUSPECTS:
            self._checked = {w: t for w, t in self._checked.items() if now - t < EVERY}
        return read_workers(self.r, self.keys, ids) if ids else []

    def _sweep_step(self, tasks: set[str], workers: set[str], deep: set[str]) -> set[str]:
        """Add the next page of the backstop sweep to what this pass reads."""
        if not self._sweep:
            task_ids, worker_ids = all_ids(self.r, self.keys)
            ids = {f"t:{t}" for t in {*task_ids, *self.mirror.tasks}}
            ids |= {f"w:{w}" for w in {*worker_ids, *self.mirror.workers}}
            self._sweep = sorted(ids, reverse=True)
            rounds = max(1.0, self.full_interval / EVERY)
            self._sweep_page = max(50, math.ceil(len(self._sweep) / rounds))
        page = set(self._sweep[-self._sweep_page :])
        del self._sweep[-self._sweep_page :]
        for item in page:
            kind, _, ident = item.partition(":")
            if kind == "t":
                tasks.add(ident)
                deep.add(ident)
            else:
                workers.add(ident)
        return page

    # -- what to write --------------------------------------------------------------------

    def _moves(self, plan: Plan, writes: Writes, touched: set[str]) -> None:
        workers = self.mirror.workers
        for wid, task in plan.assignment.items():
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
            size = len(plan.nodes_of(tid))
            if size >= row.min_nodes and size > 0:
                target = TaskState.RUNNING
            elif row.state == TaskState.RUNNING:
                target = TaskState.WAITING
            else:
                continue
            if target != row.state:
                writes.state(row, target, size, self.log)

    def _explain(self, plan: Plan, writes: Writes, tasks: set[str]) -> None:
        """Keep each task's ``reason`` true: why it has too few nodes (empty once it has
        them); fail it when no live worker can ever run it."""
        m = self.mirror
        for tid in sorted(tasks):
            row = m.tasks.get(tid)
            if row is None:
                continue
            reason, never = "", False
            if len(plan.nodes_of(tid)) < max(1, row.min_nodes):
                reason, never = self.reasons.explain(m, m.board.tasks[tid])
            if never:
                writes.fail(tid, f"no worker can run it: {reason}", "task_unrunnable", self.log)
            elif reason != row.reason:
                writes.reason(row, reason)

    def _expired(self, ids: list[str], writes: Writes) -> None:
        """Index entries whose keys should have expired by now: drop them, or look later."""
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.pttl(self.keys.task(tid).record)
        now = time.time()
        for tid, pttl in zip(ids, pipe.execute(), strict=True):
            if pttl == -2:  # gone
                writes.forget_expired(tid, True, None)
            elif pttl == -1:  # persistent again: reopened (a requeued dead letter)
                writes.forget_expired(tid, False, None)
            else:
                writes.forget_expired(tid, False, now + pttl / 1000)
