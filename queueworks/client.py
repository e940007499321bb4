"""The public client: submit target tasks, watch them, read their results."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

from redis.cluster import RedisCluster

from queueworks import events
from queueworks.connection import Connection, connect, text
from queueworks.keys import Keys, TaskKeys, check_task_id
from queueworks.messages import NotJSON, from_json, partition_of, to_json
from queueworks.models import DeadLetter, NodeInfo, TaskSpec, TaskState, TaskStatus, WorkerRecord
from queueworks.records import BadRecord, new_task, task_fields, worker_record
from queueworks.scripts import Scripts
from queueworks.topology import queue_replication_wait

SUBMIT_BATCH = 1000  # messages per Lua call
SUBMIT_PIPELINE = 8  # Lua calls per round trip
# A task's streams expire this long after the last write of a submit that has not finished
# (it died half-way): only the task record, written last, makes them permanent.
SUBMIT_LEASE_MS = 120_000


class SubmitError(ValueError):
    """A task that cannot be submitted; the message names the field or subtask."""


class TaskNotFound(LookupError):
    pass


class NotReplicated(RuntimeError):
    """``submit(wait_replicas=n)``: the task was written to the primary, but fewer than ``n``
    replicas acknowledged it in time; a failover now could lose it. ``task`` is its handle."""

    def __init__(self, task: Task, acked: int, wanted: int, timeout: float) -> None:
        super().__init__(
            f"task {task.id} is written but only {acked} of {wanted} replica(s) acknowledged "
            f"it within {timeout} s: a failover now could lose it"
        )
        self.task, self.acked, self.wanted = task, acked, wanted


class Client:
    """Entry point for users: ``Client.from_url("redis://localhost:6379/0")``."""

    def __init__(self, connection: Connection, *, prefix: str = "qw") -> None:
        self.redis = connection
        self.keys = Keys(prefix)
        self.scripts = Scripts(connection)

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "qw", **connect_options: Any) -> Client:
        return cls(connect(url, **connect_options), prefix=prefix)

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submitting -----------------------------------------------------------------------

    def submit(
        self,
        spec: TaskSpec,
        *,
        task_id: str | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> Task:
        """Split ``spec`` onto its stream(s) and queue it; returns a handle to the task.

        Subtasks are streamed in pipelined batches: a generator is never held in memory as
        a whole. Raises ``SubmitError`` naming the bad subtask; nothing is left behind.
        A task of at most ``SUBMIT_BATCH`` subtasks is written in one atomic step: one
        round trip on one server, two on a cluster.

        ``wait_replicas=n``: return only once ``n`` replicas of every primary that holds the
        task (its keys, the queue, the events) have it (``WAIT n``, up to ``wait_timeout``
        s); else raise ``NotReplicated`` (the task exists; a failover may still lose it).
        """
        if wait_replicas < 0 or wait_timeout <= 0:
            raise ValueError("submit: need wait_replicas >= 0 and wait_timeout > 0")
        tid = check_task_id(task_id or uuid.uuid4().hex[:16])
        tk = self.keys.task(tid)
        streams = tk.streams(spec.partitions)
        payloads = iter(spec.subtasks)
        first = itertools.islice(enumerate(payloads), SUBMIT_BATCH + 1)
        head = [self._message(spec, i, p) for i, p in first]
        if len(head) <= SUBMIT_BATCH:
            total, replies, waits = self._submit_small(
                spec, tk, streams, head, wait_replicas, wait_timeout
            )
        else:
            rest = (self._message(spec, i, p) for i, p in enumerate(payloads, len(head)))
            total, replies, waits = self._submit_large(
                spec, tk, streams, itertools.chain(head, rest), wait_replicas, wait_timeout
            )
        task = Task(self, tid)
        if total == 0:  # nothing to do: complete at once, through the one completion path
            self.scripts.settle(tk, streams[0], "client", time.time(), [])
            events.emit(self.redis, self.keys, "completed", task=tid)
        if waits:
            acked = min(int(n) for n in replies[-waits:])
            if acked < wait_replicas:
                raise NotReplicated(task, acked, wait_replicas, wait_timeout)
        return task

    def _submit_small(
        self,
        spec: TaskSpec,
        tk: TaskKeys,
        streams: list[str],
        batch: list[tuple[int, int, str, str]],
        wait_replicas: int,
        wait_timeout: float,
    ) -> tuple[int, list[Any], int]:
        """One script writes it all (``submit_small.lua``); on a cluster the queue, index and
        event follow in a pipeline (they live in other slots)."""
        now = time.time()
        record = new_task(spec, len(batch), now)
        event = events.body("submitted", task=tk.task_id, name=spec.name, total=len(batch))
        cluster = isinstance(self.redis, RedisCluster)
        k = self.keys
        publish = None if cluster else (k.queue, k.tasks, k.events, event)
        pipe = self.redis.pipeline(transaction=False) if wait_replicas or cluster else None
        written = self.scripts.submit_small(
            tk, streams, record, batch, now, publish, client=None if cluster else pipe
        )
        if pipe is None:
            if not written:
                raise SubmitError(f"task_id: a task {tk.task_id!r} exists already")
            return len(batch), [], 0
        if cluster:
            if not written:
                raise SubmitError(f"task_id: a task {tk.task_id!r} exists already")
            self._publish(pipe, tk.task_id, now, event)
        waits = 0
        if wait_replicas:  # after the last write on each node: WAIT covers all before it
            waits = queue_replication_wait(
                pipe,
                self.redis,
                [tk.record, k.queue, k.events],
                wait_replicas,
                int(wait_timeout * 1000),
            )
        replies = pipe.execute()
        if not cluster and not replies[0]:
            raise SubmitError(f"task_id: a task {tk.task_id!r} exists already")
        return len(batch), replies, waits

    def _submit_large(
        self,
        spec: TaskSpec,
        tk: TaskKeys,
        streams: list[str],
        messages: Iterator[tuple[int, int, str, str]],
        wait_replicas: int,
        wait_timeout: float,
    ) -> tuple[int, list[Any], int]:
        """Stream after stream of batches, the record last (it makes the streams permanent:
        a submit that dies half-way leaves streams that expire)."""
        if self.redis.exists(tk.record):
            raise SubmitError(f"task_id: a task {tk.task_id!r} exists already")
        pipe = self.redis.pipeline(transaction=False)
        for stream in streams:
            pipe.xgroup_create(stream, tk.group, id="0", mkstream=True)
            pipe.pexpire(stream, SUBMIT_LEASE_MS)
        pipe.execute()
        try:
            total = self._write_subtasks(messages, streams)
        except BaseException:
            self.redis.delete(*streams)
            raise
        now = time.time()
        record = new_task(spec, total, now)
        pipe = self.redis.pipeline(transaction=False)
        # on a cluster this runs at once: the record exists before anything lists the task
        self.scripts.record_task(tk, streams, record, client=pipe)
        event = events.body("submitted", task=tk.task_id, name=spec.name, total=total)
        self._publish(pipe, tk.task_id, now, event)
        waits = 0
        if wait_replicas:
            waits = queue_replication_wait(
                pipe,
                self.redis,
                [tk.record, self.keys.queue, self.keys.events],
                wait_replicas,
                int(wait_timeout * 1000),
            )
        return total, pipe.execute(), waits

    def _publish(self, pipe: Any, task_id: str, now: float, event: dict[str, str]) -> None:
        """Queue, index and announce a task whose record is written."""
        pipe.zadd(self.keys.queue, {task_id: now})
        pipe.zadd(self.keys.tasks, {task_id: now})
        pipe.xadd(self.keys.events, event, maxlen=events.EVENTS_MAXLEN, approximate=True)

    @staticmethod
    def _message(spec: TaskSpec, index: int, payload: Any) -> tuple[int, int, str, str]:
        """A subtask as the enqueue scripts take it: (stream number, index, JSON, key)."""
        try:
            body = to_json(payload, f"subtasks[{index}]")
        except NotJSON as exc:
            raise SubmitError(str(exc)) from None
        if not spec.partitions:
            return 0, index, body, ""
        if not isinstance(payload, dict) or "key" not in payload:
            raise SubmitError(
                f"subtasks[{index}]: a partitioned task needs dict payloads with a 'key'"
            )
        key = str(payload["key"])
        return partition_of(key, spec.partitions), index, body, key

    def _write_subtasks(
        self, messages: Iterator[tuple[int, int, str, str]], streams: list[str]
    ) -> int:
        batch: list[tuple[int, int, str, str]] = []
        pipe = self.redis.pipeline(transaction=False)
        queued_calls = 0
        total = 0
        for message in messages:
            batch.append(message)
            total += 1
            if len(batch) >= SUBMIT_BATCH:
                self.scripts.enqueue(streams, batch, client=pipe)
                batch = []
                queued_calls += 1
                if queued_calls >= SUBMIT_PIPELINE:
                    for stream in streams:  # still submitting: keep the lease
                        pipe.pexpire(stream, SUBMIT_LEASE_MS)
                    pipe.execute()
                    queued_calls = 0
        if batch:
            self.scripts.enqueue(streams, batch, client=pipe)
        pipe.execute()
        return total

    # -- reading --------------------------------------------------------------------------

    def task(self, task_id: str) -> Task:
        return Task(self, check_task_id(task_id))

    def tasks(
        self, *, limit: int | None = None, offset: int = 0, newest_first: bool = False
    ) -> list[TaskStatus]:
        """Tasks known to Redis (active ones and finished ones not yet expired), oldest
        first (``newest_first``: the other way), from the index ``qw:tasks``: ``limit``
        of them (None = all) after skipping ``offset``. Costs one round trip for the page
        plus one pipeline for its records."""
        if limit is not None and limit <= 0:
            return []
        end = -1 if limit is None else offset + limit - 1
        ids: Any = self.redis.zrange(self.keys.tasks, offset, end, desc=newest_first)
        pipe = self.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hgetall(self.keys.task(text(tid)).record)
        out = []
        for tid, raw in zip(ids, pipe.execute() if ids else [], strict=True):
            if not raw:
                continue  # expired: the controller drops it from the index soon
            try:
                out.append(TaskStatus(**task_fields(text(tid), raw), nodes=[]))
            except ValueError:
                continue  # one broken record must not hide every other task
        return out

    def task_count(self) -> int:
        """How many tasks the index lists (finished ones until they expire)."""
        return int(self.redis.zcard(self.keys.tasks))

    def workers(self) -> list[WorkerRecord]:
        ids = [text(w) for w in self.redis.zrange(self.keys.workers, 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for wid in ids:
            pipe.hgetall(self.keys.worker(wid))
        out = []
        for raw in pipe.execute():
            if raw and b"record" in raw:
                try:
                    out.append(worker_record(raw))
                except BadRecord:
                    continue  # one broken hash must not hide every other worker
        return out

    def drain_worker(self, worker_id: str) -> None:
        """Ask a worker to leave gracefully and exit (as SIGTERM would), within a tick."""
        self.redis.hset(self.keys.worker(worker_id), "drain", "1")
        events.emit(self.redis, self.keys, "drain_requested", worker=worker_id)


def _f(raw: Any, name: str) -> str | None:
    v = raw.get(name.encode())
    return v.decode() if v is not None else None


class Task:
    """A handle to one submitted task."""

    def __init__(self, client: Client, task_id: str) -> None:
        self.client = client
        self.id = task_id
        self.keys = client.keys.task(task_id)

    def __repr__(self) -> str:
        return f"Task({self.id!r})"

    def status(self, *, with_nodes: bool = True) -> TaskStatus:
        r = self.client.redis
        raw: Any = r.hgetall(self.keys.record)
        if not raw:
            raise TaskNotFound(self.id)
        nodes: list[NodeInfo] = []
        if with_nodes:
            nodes = self._nodes()
        return TaskStatus(**task_fields(self.id, raw), nodes=nodes)

    def _nodes(self) -> list[NodeInfo]:
        r = self.client.redis
        members: Any = r.zrange(self.keys.members, 0, -1, withscores=True)
        pipe = r.pipeline(transaction=False)
        for wid, _ in members:
            pipe.get(self.keys.heartbeat(wid.decode()))
            pipe.hget(self.client.keys.worker(wid.decode()), "current")
        replies = pipe.execute()
        now = time.time()
        nodes = []
        for rank, (wid, joined) in enumerate(members):
            beat, current = replies[2 * rank], replies[2 * rank + 1]
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

    def wait(self, timeout: float | None = None, poll: float = 0.1) -> TaskStatus:
        """Block until the task is finished; raise ``TimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(with_nodes=False)
            if status.finished:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"task {self.id} still {status.state} after {timeout} s "
                    f"({status.done + status.dead}/{status.total})"
                )
            time.sleep(poll)

    def results(self) -> Iterator[tuple[int, Any]]:
        """``(index, result)`` for every subtask that succeeded, in no particular order."""
        for index, value in self.client.redis.hscan_iter(self.keys.results, count=1000):
            yield int(text(index)), from_json(text(value), f"result {text(index)!r}")

    def dead_letters(self, count: int = 1000) -> list[DeadLetter]:
        out = []
        entries: Any = self.client.redis.xrange(self.keys.dead, count=count)
        for entry_id, raw in entries:
            index = _f(raw, "index")
            out.append(
                DeadLetter(
                    id=entry_id.decode(),
                    index=int(index) if index else None,
                    reason=_f(raw, "reason") or "",
                    error=_f(raw, "error") or "",
                    attempts=int(_f(raw, "attempts") or 0),
                    payload=_f(raw, "payload"),
                    worker=_f(raw, "worker"),
                )
            )
        return out

    def cancel(self) -> bool:
        """Cancel the task: its nodes are released at once. False if it had finished."""
        changed = self.client.scripts.set_state(self.keys, TaskState.CANCELLED, time.time())
        if changed:
            events.emit(self.client.redis, self.client.keys, "cancelled", task=self.id)
        return changed

    def set_priority(self, priority: int) -> None:
        self._change(priority=priority)

    def resize(self, min_nodes: int, max_nodes: int | None) -> None:
        if min_nodes < 1 or (max_nodes is not None and max_nodes < min_nodes):
            raise ValueError(
                f"resize: need 1 <= min_nodes <= max_nodes, got {min_nodes}, {max_nodes}"
            )
        self._change(min_nodes=min_nodes, max_nodes="" if max_nodes is None else max_nodes)

    def _change(self, **fields: object) -> None:
        if self.status(with_nodes=False).finished:
            raise ValueError(f"task {self.id} has finished; it cannot change")
        self.client.redis.hset(self.keys.record, mapping=fields)  # type: ignore[arg-type]
        events.emit(self.client.redis, self.client.keys, "changed", task=self.id, **fields)
