"""The writes of one pass, as fenced ops (``controller.fence``), and what the mirror learns
when they succeed. Every event the controller writes carries ``by=<its id>``, so its own
events name nothing for its next pass.

Stages order the ops that touch different slots: a finished task leaves ``qw:queue`` before
its keys get their expiry (a requeued dead letter may reopen it meanwhile: then it goes
back), and an event follows the write it reports (it is written only if the write was).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from queueworks.protocol import events
from queueworks.protocol.events import EVENTS_MAXLEN
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import TaskState
from queueworks.transport.lost_workers import KEPT as LOST_KEPT
from queueworks.transport.lost_workers import lost_entry

from .fence import Batch
from .mirror import Mirror, TaskRow
from .reads import WorkerRead

Done = Callable[[int], None]


class Writes:
    def __init__(self, keys: Keys, mirror: Mirror, me: str) -> None:
        self.keys, self.mirror, self.me = keys, mirror, me
        self.batch = Batch()
        self._done: list[tuple[int, Done]] = []
        self.recheck: set[str] = set()  # tasks to read again next pass
        self.moved = 0
        self.as_planned = True  # every assignment written (none found its key gone)

    def __len__(self) -> int:
        return len(self.batch)

    def _event(self, kind: str, when: int, stage: int = 1, **fields: object) -> None:
        body = events.event(kind, by=self.me, **fields)
        self.batch.xadd(self.keys.events, EVENTS_MAXLEN, body, when=when, stage=stage)

    def _on(self, op: int, done: Done) -> None:
        self._done.append((op, done))

    def commit(self, replies: list[int]) -> None:
        """Tell the mirror what the writes did (``replies`` from ``Fence.apply``)."""
        for op, done in self._done:
            done(replies[op - 1])

    # -- workers --------------------------------------------------------------------------

    def assign(self, worker_id: str, task_id: str, was: str) -> None:
        op = self.batch.add("set_xx", [self.keys.assign(worker_id)], task_id)
        kind = "assigned" if task_id else "unassigned"
        self._event(kind, op, worker=worker_id, task=task_id or was or None)
        self.moved += 1

        def done(ok: int) -> None:
            if ok:
                self.mirror.set_assign(worker_id, task_id)
            else:  # its assign key is gone: it deregistered
                self.mirror.drop_worker(worker_id)
                self.as_planned = False

        self._on(op, done)

    def lost(self, read: WorkerRead) -> None:
        """Forget a worker whose pool heartbeat is gone (one key per DEL: a cluster), and
        keep what it was in ``qw:workers:lost`` (one entry a loss: only if the index
        still listed it). A worker that is alive with a broken record is only forgotten."""
        k, worker_id = self.keys, read.id
        op = self.batch.add("zrem", [k.workers], worker_id)
        self.batch.add("del", [k.assign(worker_id)])
        self.batch.add("del", [k.worker(worker_id)])
        self._event("worker_lost", op, worker=worker_id)
        if not read.alive:
            body = lost_entry(
                worker_id,
                time.time(),
                record=read.record,
                member_of=read.member_of,
                assign=read.assign,
                last_heartbeat=read.beat,
            )
            self.batch.xadd(k.workers_lost, LOST_KEPT, body, when=op, stage=1)

    # -- tasks ----------------------------------------------------------------------------

    def release(self, row: TaskRow, state: TaskState) -> None:
        """A finished task: out of the queue, its keys expire, the index forgets it then; a
        queue's unfinished jobs' keys are then given its expiry (``controller.leftovers``)."""
        k, tk = self.keys, self.keys.task(row.id)
        unit = self.batch.unit()
        self.batch.add("zrem", [k.queue], row.id, unit=unit)
        ttl_ms = int(row.result_ttl * 1000)
        expiring = [*tk.all(row.partitions), *(tk.aside_stream(h) for h in row.aside)]
        expiring += tk.group_waits(row.waits)
        op = self.batch.add("expire_finished", expiring, ttl_ms, stage=1, unit=unit)
        self.batch.add("zadd_nx", [k.queue], row.created_at, row.id, when=-op, stage=2)
        expires = time.time() + row.result_ttl
        self.batch.add("zadd", [k.tasks_expiry], expires, row.id, when=op, stage=2)
        if row.queue:  # its unfinished jobs' keys: the leader's walk (controller.leftovers)
            self.batch.add("zadd", [k.queues_expiring], expires, row.id, when=op, stage=2)
        self._event("released", op, stage=2, task=row.id, state=state.value)

        def done(ok: int) -> None:
            if ok:
                self.mirror.drop_task(row.id)
            else:  # reopened meanwhile (a requeued dead letter): read it again
                self.recheck.add(row.id)

        self._on(op, done)

    def unqueue(self, task_id: str) -> None:
        """A task whose record is gone (expired, deleted): out of the queue and the index."""
        self.batch.add("zrem", [self.keys.queue], task_id)
        self.batch.add("zrem", [self.keys.tasks], task_id)

    def requeue(self, row: TaskRow) -> None:
        """An active task the queue does not list (only the backstop finds one)."""
        self.batch.add("zadd_nx", [self.keys.queue], row.created_at, row.id)

    def index(self, task_id: str, created_at: float) -> None:
        """List a task in the index (tasks submitted before there was one)."""
        self.batch.add("zadd_nx", [self.keys.tasks], created_at, task_id)

    def state(self, row: TaskRow, target: TaskState, nodes: int, log: Any) -> None:
        tk = self.keys.task(row.id)
        op = self.batch.add(
            "state", [tk.record, tk.waiters, tk.released], target.value, repr(time.time()), ""
        )
        self._event(target.value, op, task=row.id, nodes=nodes)

        def done(ok: int) -> None:
            if ok:
                row.state = target
                log.info("task_state", task_id=row.id, state=target.value, nodes=nodes)

        self._on(op, done)

    def fail(self, task_id: str, error: str, why: str, log: Any) -> None:
        tk = self.keys.task(task_id)
        now = repr(time.time())
        op = self.batch.add(
            "state", [tk.record, tk.waiters, tk.released], TaskState.FAILED.value, now, error
        )
        self._event("failed", op, task=task_id, error=error)
        self.recheck.add(task_id)
        log.error(why, task_id=task_id, error=error)

    def reason(self, row: TaskRow, reason: str) -> None:
        op = self.batch.add("hset_x", [self.keys.task(row.id).record], "reason", reason)

        def done(ok: int) -> None:
            if ok:
                row.reason = reason

        self._on(op, done)

    def forget_expired(self, task_id: str, gone: bool, expires: float | None) -> None:
        """The index's side of expiry: drop a task whose keys are gone (and a queue's name
        from ``qw:queues``), or look again later."""
        k = self.keys
        if gone:
            self.batch.add("zrem", [k.tasks], task_id)
            self.batch.add("srem", [k.queues], task_id)
            self.batch.add("srem", [k.dep_tasks], task_id)  # nothing of it to release
        if expires is None:
            self.batch.add("zrem", [k.tasks_expiry], task_id)
        else:
            self.batch.add("zadd", [k.tasks_expiry], expires, task_id)
