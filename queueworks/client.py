"""The public client: submit target tasks, watch them, read their results."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from redis.cluster import RedisCluster

from queueworks import events
from queueworks.connection import Connection, connect, text
from queueworks.eviction import CLIENT_OVERRIDE, EvictingRedis, judge, read_policies
from queueworks.keys import Keys, TaskKeys, check_task_id
from queueworks.logs import get_logger
from queueworks.messages import NotJSON, partition_of, to_json
from queueworks.models import QueueStatus, TaskSpec, TaskStatus, WorkerRecord
from queueworks.queue_settings import DEFAULTS, QueueOptions, check_queue_settings
from queueworks.queues import UNSET, Queue, open_queue
from queueworks.records import BadRecord, new_task, worker_record
from queueworks.scripts import Scripts
from queueworks.tasks import Task, TaskNotFound, task_page, task_statuses
from queueworks.topology import queue_replication_wait

if TYPE_CHECKING:
    from queueworks.aio.tasks import AsyncTask

__all__ = [
    "BadRecord",
    "Client",
    "EvictingRedis",
    "NotReplicated",
    "SubmitError",
    "Task",
    "TaskNotFound",
]

SUBMIT_BATCH = 1000  # messages per Lua call
SUBMIT_PIPELINE = 8  # Lua calls per round trip
# A task's streams expire this long after the last write of a submit that has not finished
# (it died half-way): only the task record, written last, makes them permanent.
SUBMIT_LEASE_MS = 120_000


class SubmitError(ValueError):
    """A task that cannot be submitted; the message names the field or subtask."""


class NotReplicated(RuntimeError):
    """``submit(wait_replicas=n)``: the task was written to the primary, but fewer than ``n``
    replicas acknowledged it in time; a failover now could lose it. ``task`` is its handle."""

    def __init__(self, task: Task | AsyncTask, acked: int, wanted: int, timeout: float) -> None:
        super().__init__(
            f"task {task.id} is written but only {acked} of {wanted} replica(s) acknowledged "
            f"it within {timeout} s: a failover now could lose it"
        )
        self.task, self.acked, self.wanted = task, acked, wanted


class Client:
    """Entry point for users: ``Client.from_url("redis://localhost:6379/0")``.

    Its first write (``submit``, ``queue``, a task's ``cancel``...) raises ``EvictingRedis``
    if the server's ``maxmemory-policy`` is not ``noeviction`` (checked once per client),
    unless it was made with ``allow_eviction=True``."""

    def __init__(
        self, connection: Connection, *, prefix: str = "qw", allow_eviction: bool = False
    ) -> None:
        self.redis = connection
        self.keys = Keys(prefix)
        self.scripts = Scripts(connection)
        self.allow_eviction = allow_eviction
        self._eviction_checked = False

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "qw", allow_eviction: bool = False, **connect_options: Any
    ) -> Client:
        return cls(connect(url, **connect_options), prefix=prefix, allow_eviction=allow_eviction)

    def check_eviction(self) -> None:
        """Raise ``EvictingRedis`` if the server may evict keys (its ``maxmemory-policy``),
        unless ``allow_eviction``; read once per client, at its first write (one round trip
        per primary), then remembered."""
        if not self._eviction_checked:
            policies = read_policies(self.redis)
            judge(policies, allow=self.allow_eviction, override=CLIENT_OVERRIDE, log=client_log())
            self._eviction_checked = True

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
        tid = submit_task_id(spec, task_id, wait_replicas, wait_timeout)
        self.check_eviction()
        payloads = iter(sync_subtasks(spec))
        tk = self.keys.task(tid)
        streams = tk.streams(spec.partitions)
        first = itertools.islice(enumerate(payloads), SUBMIT_BATCH + 1)
        head = [subtask_message(spec.partitions, i, p) for i, p in first]
        if len(head) <= SUBMIT_BATCH:
            total, replies, waits = self._submit_small(
                spec, tk, streams, head, wait_replicas, wait_timeout
            )
        else:
            rest = (
                subtask_message(spec.partitions, i, p) for i, p in enumerate(payloads, len(head))
            )
            total, replies, waits = self._submit_large(
                spec, tk, streams, itertools.chain(head, rest), wait_replicas, wait_timeout
            )
        task = Task(self, tid)
        if total == 0:  # nothing to do: complete at once, through the one completion path
            self.scripts.settle(tk, streams[0], "client", time.time(), [])
            events.emit(self.redis, self.keys, "completed", task=tid)
        check_replicated(task, replies, waits, wait_replicas, wait_timeout)
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
        event = events.event("submitted", task=tk.task_id, name=spec.name, total=len(batch))
        cluster = isinstance(self.redis, RedisCluster)
        k = self.keys
        publish = None if cluster else (k.queue, k.tasks, k.events, event)
        pipe = self.redis.pipeline(transaction=False) if wait_replicas or cluster else None
        written = self.scripts.submit_small(
            tk, streams, record, batch, now, publish, client=None if cluster else pipe
        )
        if pipe is None:
            if not written:
                raise task_exists(tk.task_id)
            return len(batch), [], 0
        if cluster:
            if not written:
                raise task_exists(tk.task_id)
            publish_task(pipe, k, tk.task_id, now, event)
        waits = 0
        if wait_replicas:  # after the last write on each node: WAIT covers all before it
            waits = queue_replication_wait(
                pipe,
                self.redis,
                [tk.record, k.queue, k.tasks, k.events],
                wait_replicas,
                int(wait_timeout * 1000),
            )
        replies = pipe.execute()
        if not cluster and not replies[0]:
            raise task_exists(tk.task_id)
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
            raise task_exists(tk.task_id)
        pipe = self.redis.pipeline(transaction=False)
        open_streams(pipe, tk, streams)
        pipe.execute()
        try:
            total = self._write_subtasks(messages, streams)
        except BaseException:
            self.redis.delete(*streams)
            raise
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        # on a cluster this runs at once: the record exists before anything lists the task
        self.scripts.record_task(tk, streams, new_task(spec, total, now), client=pipe)
        record_steps(pipe, self.keys, spec, tk.task_id, total, now)
        waits = 0
        if wait_replicas:
            waits = queue_replication_wait(
                pipe,
                self.redis,
                [tk.record, self.keys.queue, self.keys.tasks, self.keys.events],
                wait_replicas,
                int(wait_timeout * 1000),
            )
        return total, pipe.execute(), waits

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
                    keep_lease(pipe, streams)
                    pipe.execute()
                    queued_calls = 0
        if batch:
            self.scripts.enqueue(streams, batch, client=pipe)
        pipe.execute()
        return total

    # -- reading --------------------------------------------------------------------------

    def task(self, task_id: str) -> Task:
        return Task(self, check_task_id(task_id))

    # -- queues ---------------------------------------------------------------------------

    def queue(self, name: str, *, reopen: bool = False, **settings: Unpack[QueueOptions]) -> Queue:
        """Create the queue ``name`` or open it (idempotent). Settings not given are the
        queue's own (or the defaults, when it is created: ``min_nodes=1``, no
        ``max_nodes``, ``priority=0``, ``max_attempts=3``, ``job_timeout=60`` s,
        ``result_ttl`` a day, ``idle_after=30`` s); given ones must match an existing
        queue's (``ValueError`` names the ones that do not). A queue that was cancelled
        (or failed) takes no jobs: opening it is a ``ValueError``, unless ``reopen=True``,
        which makes it open again (queued, then running), with its settings, counts and
        jobs as they were."""
        given = given_settings(**settings)
        name = check_task_id(name, "queue name")
        self.check_eviction()
        return open_queue(self, name, given, reopen)

    def queues(self) -> list[QueueStatus]:
        """Every queue that still exists, by name."""
        names = sorted(text(n) for n in self.redis.smembers(self.keys.queues))
        out = []
        for name in names:
            try:
                out.append(Queue(self, name, DEFAULTS, revives=False).status())
            except TaskNotFound:
                self.redis.srem(self.keys.queues, name)  # its record expired
        return out

    def tasks(
        self, *, limit: int | None = None, offset: int = 0, newest_first: bool = False
    ) -> list[TaskStatus]:
        """Tasks known to Redis (active ones and finished ones not yet expired), oldest
        first (``newest_first``: the other way), from the index ``qw:tasks``: ``limit``
        of them (None = all) after skipping ``offset``. Costs one round trip for the page
        plus one pipeline for its records."""
        page = task_page(limit, offset)
        if page is None:
            return []
        found: Any = self.redis.zrange(self.keys.tasks, *page, desc=newest_first)
        ids = [text(t) for t in found]
        pipe = self.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hgetall(self.keys.task(tid).record)
        return task_statuses(ids, pipe.execute() if ids else [])

    def task_count(self) -> int:
        """How many tasks the index lists (finished ones until they expire)."""
        return int(self.redis.zcard(self.keys.tasks))

    def workers(self) -> list[WorkerRecord]:
        ids = [text(w) for w in self.redis.zrange(self.keys.workers, 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for wid in ids:
            pipe.hgetall(self.keys.worker(wid))
        return worker_records(pipe.execute())

    def drain_worker(self, worker_id: str) -> None:
        """Ask a worker to leave gracefully and exit (as SIGTERM would), within a tick."""
        self.check_eviction()
        self.redis.hset(self.keys.worker(worker_id), "drain", "1")
        events.emit(self.redis, self.keys, "drain_requested", worker=worker_id)


# -- what Client and AsyncClient share: no I/O, or only commands queued on a pipeline -------


def client_log() -> Any:
    """The clients' logger (their one warning: a policy that cannot be read)."""
    return get_logger(component="client")


def submit_task_id(
    spec: TaskSpec, task_id: str | None, wait_replicas: int, wait_timeout: float
) -> str:
    """The id of a task to submit (a new one unless given); checks submit's arguments."""
    if wait_replicas < 0 or wait_timeout <= 0:
        raise ValueError("submit: need wait_replicas >= 0 and wait_timeout > 0")
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"submit: spec must be a TaskSpec, got {type(spec).__name__}")
    return check_task_id(task_id or uuid.uuid4().hex[:16])


def sync_subtasks(spec: TaskSpec) -> Iterable[Any]:
    """The subtasks of a spec for a sync submit: an async iterable is for AsyncClient."""
    if not isinstance(spec.subtasks, Iterable):
        raise SubmitError("subtasks: an async iterable needs AsyncClient.submit")
    return spec.subtasks


def task_exists(task_id: str) -> SubmitError:
    return SubmitError(f"task_id: a task {task_id!r} exists already")


def open_streams(pipe: Any, tk: TaskKeys, streams: Sequence[str]) -> None:
    """Queue on ``pipe`` the creation of a task's streams, under the submit lease."""
    for stream in streams:
        pipe.xgroup_create(stream, tk.group, id="0", mkstream=True)
        pipe.pexpire(stream, SUBMIT_LEASE_MS)


def keep_lease(pipe: Any, streams: Sequence[str]) -> None:
    """Still submitting: the streams' lease runs from now again."""
    for stream in streams:
        pipe.pexpire(stream, SUBMIT_LEASE_MS)


def subtask_message(partitions: int, index: int, payload: Any) -> tuple[int, int, str, str]:
    """Subtask ``index`` as ``(stream number, index, payload JSON, key)`` for
    ``scripts.enqueue``; ``SubmitError`` naming the subtask if it cannot be one."""
    try:
        body = to_json(payload, f"subtasks[{index}]")
    except NotJSON as exc:
        raise SubmitError(str(exc)) from None
    if not partitions:
        return 0, index, body, ""
    if not isinstance(payload, dict) or "key" not in payload:
        raise SubmitError(f"subtasks[{index}]: a partitioned task needs dict payloads with a 'key'")
    key = str(payload["key"])
    return partition_of(key, partitions), index, body, key


def record_steps(pipe: Any, keys: Keys, spec: TaskSpec, tid: str, total: int, now: float) -> None:
    """Queue on ``pipe`` what follows the record (``scripts.record_task``): the task in the
    queue of tasks and in the index, and its ``submitted`` event."""
    publish_task(
        pipe, keys, tid, now, events.event("submitted", task=tid, name=spec.name, total=total)
    )


def publish_task(pipe: Any, keys: Keys, task_id: str, now: float, event: dict[str, str]) -> None:
    """Queue, index and announce a task whose record is written."""
    pipe.zadd(keys.queue, {task_id: now})
    pipe.zadd(keys.tasks, {task_id: now})
    pipe.xadd(keys.events, event, maxlen=events.EVENTS_MAXLEN, approximate=True)


def check_replicated(
    task: Task | AsyncTask, replies: Sequence[Any], waits: int, wanted: int, timeout: float
) -> None:
    """``NotReplicated`` if the ``waits`` WAITs at the end of ``replies`` saw fewer than
    ``wanted`` replicas."""
    if waits:
        acked = min(int(n) for n in replies[-waits:])
        if acked < wanted:
            raise NotReplicated(task, acked, wanted, timeout)


def given_settings(**settings: Any) -> dict[str, Any]:
    """The queue settings a caller gave (the rest are ``UNSET``), checked: ``ValueError``
    naming the first that is no value in range."""
    return check_queue_settings({k: v for k, v in settings.items() if v is not UNSET})


def worker_records(raws: Sequence[Any]) -> list[WorkerRecord]:
    """Worker records from their hashes (HGETALL replies), skipping gone or broken ones."""
    out = []
    for raw in raws:
        if raw and b"record" in raw:
            try:
                out.append(worker_record(raw))
            except BadRecord:
                continue  # one broken hash must not hide every other worker
    return out
