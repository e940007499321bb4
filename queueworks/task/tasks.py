"""A handle to one submitted task (``Client.task``, ``Client.submit``): its status with the
node set, results, dead letters, and the operator's changes (cancel, priority, resize)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from queueworks.errors import TaskNotFound
from queueworks.protocol import events
from queueworks.protocol.jobrecords import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_INDEX,
    DEAD_JOB,
    DEAD_PAYLOAD,
    DEAD_REASON,
    DEAD_WORKER,
    decode_dead_letter,
)
from queueworks.protocol.keys import Keys, TaskKeys
from queueworks.protocol.messages import from_json, text
from queueworks.protocol.models import DeadLetter, NodeInfo, TaskState, TaskStatus
from queueworks.protocol.records import task_fields
from queueworks.protocol.validate import check_priority, check_resize
from queueworks.scripts import calls
from queueworks.scripts.bound import Scripts
from queueworks.task.dependencies import plan_bury
from queueworks.transport.connection import Connection
from queueworks.transport.plans import Plan, Sleep, Trip, alone
from queueworks.transport.runner import run

T = TypeVar("T")


class Line(Protocol):
    """Where a client sends a command of pre-built bytes (``queueworks.transport.wire.Line``)."""

    def call(self, packed: bytes) -> Any:
        """The command's raw reply."""


class Backend(Protocol):
    """What task and queue handles use of their client."""

    redis: Connection
    keys: Keys
    scripts: Scripts

    @property
    def line(self) -> Line | None:
        """For commands of pre-built bytes (None: a cluster's client)."""

    def check_eviction(self) -> None:
        """Before a write: ``EvictingRedis`` if the server may evict (once per client)."""


class Task:
    """A handle to one submitted task."""

    def __init__(self, client: Backend, task_id: str) -> None:
        self.client = client
        self.id = task_id
        self.keys = client.keys.task(task_id)

    def __repr__(self) -> str:
        return f"Task({self.id!r})"

    def _run(self, plan: Plan[T]) -> T:
        return run(self.client.redis, self.client.scripts, plan)

    def status(self, *, with_nodes: bool = True) -> TaskStatus:
        return self._run(plan_status(self.client.keys, self.keys, with_nodes))

    def nodes(self) -> list[NodeInfo]:
        """The node set now: each member with its rank, the epoch it joined at, its heartbeat
        age and its current subtask (or job)."""
        return self._run(plan_nodes(self.client.keys, self.keys))

    def wait(self, timeout: float | None = None, poll: float = 0.1) -> TaskStatus:
        """Block until the task is finished; raise ``TimeoutError`` after ``timeout`` s."""
        return self._run(plan_wait(self.client.keys, self.keys, timeout, poll))

    def results(self) -> Iterator[tuple[int, Any]]:
        """``(index, result)`` for every subtask that succeeded, in no particular order;
        ``TaskNotFound`` if there are none because the task is gone (it expired, or Redis
        lost it)."""
        none = True
        for index, value in self.client.redis.hscan_iter(self.keys.results, count=1000):
            none = False
            yield int(text(index)), from_json(text(value), f"result {text(index)!r}")
        if none and not self.client.redis.exists(self.keys.record):
            raise TaskNotFound(self.id)

    def dead_letters(self, count: int = 1000) -> list[DeadLetter]:
        return self._run(plan_dead_letters(self.keys, count))

    def cancel(self) -> bool:
        """Cancel the task: its nodes are released at once. False if it had finished."""
        self.client.check_eviction()
        return self._run(plan_cancel(self.client.keys, self.keys))

    def set_priority(self, priority: int) -> None:
        self._change(priority=check_priority(priority))

    def resize(self, min_nodes: int, max_nodes: int | None) -> None:
        self._change(**resize_fields(min_nodes, max_nodes))

    def _change(self, **fields: object) -> None:
        self.client.check_eviction()
        self._run(plan_change(self.client.keys, self.keys, fields))


# -- what Task and AsyncTask run: plans (``queueworks.transport.plans``)
# ------------------------------


def plan_status(keys: Keys, tk: TaskKeys, with_nodes: bool = True) -> Plan[TaskStatus]:
    """The task's status (with its node set unless not ``with_nodes``); ``TaskNotFound``."""
    trip = Trip()
    trip.hgetall(tk.record)
    raw = (yield trip)[0]
    if not raw:
        raise TaskNotFound(tk.task_id)
    nodes = (yield from plan_nodes(keys, tk)) if with_nodes else []
    return TaskStatus(**task_fields(tk.task_id, raw), nodes=nodes)


def plan_nodes(keys: Keys, tk: TaskKeys) -> Plan[list[NodeInfo]]:
    """The node set: the members, then what ``node_infos`` reads of each."""
    trip = Trip()
    trip.zrange(tk.members, 0, -1, withscores=True)
    members = (yield trip)[0]
    if not members:
        return []
    trip = Trip()
    node_reads(trip, keys, tk, members)
    return node_infos(members, (yield trip), time.time(), tk.task_id)


def plan_wait(keys: Keys, tk: TaskKeys, timeout: float | None, poll: float) -> Plan[TaskStatus]:
    """The status once the task is finished, looked at every ``poll`` s; ``TimeoutError``
    after ``timeout`` s."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = yield from plan_status(keys, tk, with_nodes=False)
        if status.finished:
            return status
        if deadline is not None and time.monotonic() >= deadline:
            raise still_running(status, timeout)
        yield Sleep(poll)


def plan_dead_letters(tk: TaskKeys, count: int) -> Plan[list[DeadLetter]]:
    trip = Trip()
    trip.xrange(tk.dead, count=count)
    return [dead_letter(entry_id, raw) for entry_id, raw in (yield trip)[0]]


def plan_cancel(keys: Keys, tk: TaskKeys) -> Plan[bool]:
    """Cancel the task, and say so on the events stream; False if it had finished."""
    changed: bool = (yield alone(calls.set_state(tk, TaskState.CANCELLED, time.time())))[0]
    if changed:
        trip = Trip()
        events.emit(trip, keys, "cancelled", task=tk.task_id)
        yield trip
        yield from plan_bury(keys, [tk.task_id])  # the jobs waiting for it (or its jobs) die
    return changed


def plan_change(keys: Keys, tk: TaskKeys, fields: dict[str, object]) -> Plan[None]:
    """Write ``fields`` to the record of a task that has not finished, and a ``changed``
    event; ``ValueError`` if it has finished."""
    status = yield from plan_status(keys, tk, with_nodes=False)
    if status.finished:
        raise finished_task(tk.task_id)
    trip = Trip()
    trip.hset(tk.record, mapping=fields)
    events.emit(trip, keys, "changed", task=tk.task_id, **fields)
    yield trip


# -- what the plans read and decode: no I/O ---------------------------------------------------


def node_reads(pipe: Any, keys: Keys, tk: TaskKeys, members: Sequence[Any]) -> None:
    """Queue on ``pipe`` what ``node_infos`` reads of each member (``members``: the
    ZRANGE WITHSCORES of the task's members); a sync or an asyncio pipeline."""
    for wid, _ in members:  # the pool heartbeat: a queue's members keep no other
        pipe.get(keys.worker_heartbeat(wid.decode()))
        pipe.hmget(keys.worker(wid.decode()), "current", "jobs")


def node_infos(
    members: Sequence[Any], replies: Sequence[Any], now: float, node_set: str
) -> list[NodeInfo]:
    """The node set ``node_set`` (a task's or a queue's id), by rank, from the members and
    the replies of ``node_reads``. A member's ``current`` is what it runs in this node set:
    of the queues' jobs it runs (its ``jobs``), the first of this one's, never another
    queue's; else its current subtask."""
    nodes = []
    mine = f"{node_set}/"
    for rank, (wid, joined) in enumerate(members):
        beat, (current, jobs) = replies[2 * rank], replies[2 * rank + 1]
        if jobs:  # it runs queues' jobs: this one's, if any
            here = [j for j in jobs.decode().split() if j.startswith(mine)]
            current = here[0][len(mine) :].encode() if here else None
        nodes.append(
            NodeInfo(
                worker=wid.decode(),
                rank=rank,
                epoch=int(joined),
                heartbeat_age=round(now - float(beat), 3) if beat else None,
                current=current.decode() if current else None,
            )
        )
    return nodes


def still_running(status: TaskStatus, timeout: float | None) -> TimeoutError:
    return TimeoutError(
        f"task {status.id} still {status.state} after {timeout} s "
        f"({status.done + status.dead}/{status.total})"
    )


def dead_letter(entry_id: bytes, raw: Mapping[bytes, bytes]) -> DeadLetter:
    """One entry of a task's dead-letter stream."""
    f = decode_dead_letter(raw)
    index = f[DEAD_INDEX]
    return DeadLetter(
        id=entry_id.decode(),
        index=int(index) if index else None,
        reason=f[DEAD_REASON] or "",
        error=f[DEAD_ERROR] or "",
        attempts=int(f[DEAD_ATTEMPTS] or 0),
        payload=f[DEAD_PAYLOAD],
        worker=f[DEAD_WORKER],
        job=f[DEAD_JOB],
    )


def resize_fields(min_nodes: int, max_nodes: int | None) -> dict[str, object]:
    """The record fields ``resize`` writes; ``ValueError`` for bounds that cannot be."""
    low, high = check_resize(min_nodes, max_nodes)
    return {"min_nodes": low, "max_nodes": "" if high is None else high}


def finished_task(task_id: str) -> ValueError:
    return ValueError(f"task {task_id} has finished; it cannot change")


def task_statuses(ids: Sequence[str], raws: Sequence[Any]) -> list[TaskStatus]:
    """``Client.tasks()``: the statuses (without nodes) of the tasks whose records are
    ``raws`` (HGETALL replies), in the order of ``ids``; a task whose record is gone (it
    expired: the controller drops it from the index soon) or broken is left out, so that one
    broken record does not hide every other task."""
    out = []
    for tid, raw in zip(ids, raws, strict=True):
        if not raw:
            continue
        try:
            out.append(TaskStatus(**task_fields(tid, raw), nodes=[]))
        except ValueError:
            continue
    return out


def task_page(limit: int | None, offset: int) -> tuple[int, int] | None:
    """The ZRANGE bounds of ``tasks(limit=, offset=)`` (None: an empty page)."""
    if limit is not None and limit <= 0:
        return None
    return offset, -1 if limit is None else offset + limit - 1
