"""The thin shell around the allocator: read a snapshot from Redis, apply the plan.

One pass costs O(tasks + workers) commands, all pipelined: the active tasks (``qw:queue``),
their records, and per worker its pool heartbeat, assignment and labels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from controller.allocator import Plan, Snapshot, TaskView, WorkerView, allocate, why_waiting
from queueworks import events
from queueworks.connection import Connection, text
from queueworks.keys import Keys
from queueworks.models import (
    Refusal,
    StoredSpec,
    TaskRecord,
    TaskState,
    WorkerRecord,
    describe_error,
)
from queueworks.records import TASK_FIELDS, task_fields
from queueworks.scripts import Scripts


@dataclass
class World:
    """What one pass read: the allocator's snapshot plus what the shell needs to act."""

    snapshot: Snapshot
    states: dict[str, TaskState] = field(default_factory=dict)
    finished: dict[str, tuple[TaskState, float, int]] = field(default_factory=dict)
    assigned: dict[str, str] = field(default_factory=dict)  # worker -> task, as in Redis
    lost: list[str] = field(default_factory=list)  # workers whose pool heartbeat is gone
    refusals: dict[str, dict[str, Refusal]] = field(default_factory=dict)  # task -> worker ->
    reasons: dict[str, str] = field(default_factory=dict)  # task -> its record's `reason`


class Reconciler:
    def __init__(self, r: Connection, keys: Keys, scripts: Scripts, log: Any) -> None:
        self.r, self.keys, self.scripts, self.log = r, keys, scripts, log

    def read(self) -> World:
        k = self.keys
        task_ids = [text(t) for t in self.r.zrange(k.queue, 0, -1)]
        worker_ids = [text(w) for w in self.r.zrange(k.workers, 0, -1)]
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hmget(k.task(tid).record, [*TASK_FIELDS, "spec"])
            pipe.hgetall(k.task(tid).refused)
            pipe.smembers(k.task(tid).handlers)
        for wid in worker_ids:
            pipe.exists(k.worker_heartbeat(wid))
            pipe.get(k.assign(wid))
            pipe.hget(k.worker(wid), "record")
        replies = pipe.execute()
        world = World(Snapshot((), ()))
        tasks: dict[str, dict[str, Any]] = {}
        refused_raw: dict[str, dict[bytes, bytes]] = {}
        for i, tid in enumerate(task_ids):
            raw, refused_raw[tid], handlers = replies[3 * i : 3 * i + 3]
            *record_raw, spec_raw = raw
            try:
                state = TaskState(text(record_raw[1]))
            except ValueError:  # expired, never written, or broken: drop it from the queue
                self.r.zrem(k.queue, tid)
                if record_raw[1] is not None:
                    self.log.error("task_record_invalid", task_id=tid, error="bad state")
                continue
            try:
                record = TaskRecord(**task_fields(tid, record_raw))
                spec = StoredSpec.model_validate_json(spec_raw) if spec_raw else None
                if state.finished:
                    ttl = spec.result_ttl if spec else 86400.0
                    world.finished[tid] = (state, ttl, record.partitions)
                    continue
                row = {
                    "priority": record.priority,
                    "min_nodes": record.min_nodes,
                    "max_nodes": record.max_nodes,
                    "seq": record.created_at,
                    "selector": spec.node_selector if spec else {},
                    "handler": spec.handler if spec else "",
                    "handlers": tuple(sorted(text(h) for h in handlers)),
                    "want": record.want,
                }
            except ValueError as exc:  # another writer broke it: fail it, never crash on it
                if state.finished:
                    world.finished[tid] = (state, 86400.0, 0)
                else:
                    self._fail(tid, f"task record is invalid: {describe_error(exc)}")
                continue
            world.states[tid] = state
            world.reasons[tid] = record.reason or ""
            tasks[tid] = row
        workers: list[WorkerView] = []
        started: dict[str, float] = {}  # worker -> its process's start (refusals are per process)
        nodes: dict[str, set[str]] = {tid: set() for tid in tasks}
        rest = replies[3 * len(task_ids) :]
        for i, wid in enumerate(worker_ids):
            alive, assign, record = rest[3 * i], rest[3 * i + 1], rest[3 * i + 2]
            if not alive:
                world.lost.append(wid)
                continue
            try:
                rec = WorkerRecord.model_validate_json(record) if record else None
            except ValueError as exc:  # broken: drop it; a live worker registers again
                self.log.warning("worker_record_invalid", worker=wid, error=describe_error(exc))
                world.lost.append(wid)
                continue
            task = assign.decode() if assign else ""
            if task:
                world.assigned[wid] = task
                if task in nodes:
                    nodes[task].add(wid)
            if rec is None:
                workers.append(WorkerView(wid))
            else:
                started[wid] = rec.started_at
                workers.append(WorkerView(wid, rec.labels, tuple(rec.allow)))
        for tid in tasks:
            world.refusals[tid] = self._refusals(tid, refused_raw[tid], started)
        views = tuple(
            TaskView(
                id=tid,
                nodes=frozenset(nodes[tid]),
                running=world.states[tid] == TaskState.RUNNING,
                refused=frozenset(world.refusals[tid]),
                **t,
            )
            for tid, t in tasks.items()
        )
        world.snapshot = Snapshot(views, tuple(workers))
        return world

    def _refusals(
        self, task_id: str, raw: dict[bytes, bytes], started: dict[str, float]
    ) -> dict[str, Refusal]:
        """The refusals of a task by live worker processes (a restarted worker may try again)."""
        out: dict[str, Refusal] = {}
        for wid_raw, body in raw.items():
            wid = text(wid_raw)
            try:
                refusal = Refusal.model_validate_json(body)
            except ValueError as exc:
                self.log.warning("refusal_invalid", task_id=task_id, worker=wid, error=str(exc))
                continue
            if started.get(wid) == refusal.since:
                out[wid] = refusal
        return out

    def _fail(self, task_id: str, error: str, why: str = "task_record_invalid") -> None:
        if self.scripts.set_state(self.keys.task(task_id), TaskState.FAILED, time.time(), error):
            events.emit(self.r, self.keys, "failed", task=task_id, error=error)
        self.log.error(why, task_id=task_id, error=error)

    def apply(self, world: World) -> Plan:
        """Release finished tasks and lost workers, then move workers as the plan says."""
        k, now = self.keys, time.time()
        pipe = self.r.pipeline(transaction=False)
        for wid in world.lost:
            pipe.zrem(k.workers, wid)
            pipe.delete(k.assign(wid))  # one key per DEL: they may be on different nodes
            pipe.delete(k.worker(wid))
            events.emit(pipe, k, "worker_lost", worker=wid)
            world.assigned.pop(wid, None)
        for tid, (state, ttl, partitions) in world.finished.items():
            # Out of the queue first, then expire only if still finished: a requeued dead
            # letter may reopen the task at any moment, and then it goes back in.
            self.r.zrem(k.queue, tid)
            if self.scripts.expire_finished(k.task(tid).all(partitions), int(ttl * 1000)):
                events.emit(pipe, k, "released", task=tid, state=state.value)
            else:
                self.r.zadd(k.queue, {tid: time.time()}, nx=True)
        plan = allocate(world.snapshot)
        moves = plan.moves(world.snapshot)
        for wid, held in sorted(world.assigned.items()):
            if held in world.finished or held not in world.states:
                moves.setdefault(wid, None)
        for wid, task in sorted(moves.items()):
            pipe.set(k.assign(wid), task or "")
            events.emit(
                pipe,
                k,
                "assigned" if task else "unassigned",
                worker=wid,
                task=task or world.assigned.get(wid),
            )
        pipe.execute()
        for view in world.snapshot.tasks:
            size = len(plan.nodes_of(view.id))
            state = world.states[view.id]
            self._explain(world, view, size)
            if size >= view.min_nodes and size > 0:
                target = TaskState.RUNNING
            elif state == TaskState.RUNNING:
                target = TaskState.WAITING
            else:
                continue
            if self.scripts.set_state(k.task(view.id), target.value, now):
                self.log.info("task_state", task_id=view.id, state=target.value, nodes=size)
                events.emit(self.r, k, target.value, task=view.id, nodes=size)
        if moves:
            self.log.info("node_sets_changed", moves=len(moves))
        return plan

    def _explain(self, world: World, view: TaskView, size: int) -> None:
        """Keep the task record's ``reason`` true: why it has too few nodes (empty once it
        has them); fail it when no live worker can ever run it."""
        reason, never = "", False
        if size < max(1, view.min_nodes):
            reason, never = why_waiting(view, world.snapshot.workers, world.refusals[view.id])
        if never:
            self._fail(view.id, f"no worker can run it: {reason}", "task_unrunnable")
        elif reason != world.reasons.get(view.id, ""):
            self.r.hset(self.keys.task(view.id).record, "reason", reason)
