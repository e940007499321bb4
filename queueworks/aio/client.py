"""``AsyncClient``: ``queueworks.Client`` on ``redis.asyncio``, name for name.

It shares everything but the I/O with the sync client: the keys, the codecs, the models, the
Lua scripts and what each is called with (``AsyncScripts`` runs the calls of
``queueworks.script_calls``), and the checks and decoding of ``Client``, ``Task``,
``Queue`` and ``Job`` (their modules' functions). What differs, and why: docs/asyncio.md.
"""

from __future__ import annotations

import time
from typing import Any, Unpack

from queueworks import events
from queueworks.aio.connection import AsyncConnection, connect_async
from queueworks.aio.queues import AsyncQueue, each, open_queue
from queueworks.aio.results import ResultWatcher
from queueworks.aio.tasks import AsyncTask
from queueworks.client import (
    SUBMIT_BATCH,
    SUBMIT_PIPELINE,
    check_replicated,
    client_log,
    given_settings,
    keep_lease,
    open_streams,
    record_steps,
    submit_task_id,
    subtask_message,
    task_exists,
    worker_records,
)
from queueworks.connection import text
from queueworks.eviction import CLIENT_OVERRIDE, judge, read_policies_async
from queueworks.keys import Keys, TaskKeys, check_task_id
from queueworks.models import QueueStatus, TaskSpec, TaskStatus, WorkerRecord
from queueworks.queue_settings import DEFAULTS, QueueOptions
from queueworks.records import new_task
from queueworks.scripts import AsyncScripts
from queueworks.tasks import TaskNotFound, task_page, task_statuses
from queueworks.topology import queue_replication_wait


class AsyncClient:
    """Entry point for asyncio code: ``AsyncClient.from_url("redis://localhost:6379/0")``,
    or ``async with AsyncClient.from_url(...) as client``. No I/O until the first call.
    Its first write raises ``EvictingRedis`` on an evicting Redis, as ``Client``'s."""

    def __init__(
        self, connection: AsyncConnection, *, prefix: str = "qw", allow_eviction: bool = False
    ) -> None:
        self.redis = connection
        self.keys = Keys(prefix)
        self.scripts = AsyncScripts(connection)
        self.results = ResultWatcher(connection)  # every job.result() call polls through it
        self.allow_eviction = allow_eviction
        self._eviction_checked = False

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "qw", allow_eviction: bool = False, **connect_options: Any
    ) -> AsyncClient:
        """The URLs and options of ``Client.from_url``; ``max_connections`` (default 50)
        bounds the pool, and a call waits for a free connection rather than failing."""
        return cls(
            connect_async(url, **connect_options), prefix=prefix, allow_eviction=allow_eviction
        )

    async def check_eviction(self) -> None:
        """``Client.check_eviction``: once per client, at its first write."""
        if not self._eviction_checked:
            policies = await read_policies_async(self.redis)
            judge(policies, allow=self.allow_eviction, override=CLIENT_OVERRIDE, log=client_log())
            self._eviction_checked = True

    async def close(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- submitting -----------------------------------------------------------------------

    async def submit(
        self,
        spec: TaskSpec,
        *,
        task_id: str | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> AsyncTask:
        """Split ``spec`` onto its stream(s) and queue it; returns a handle to the task.

        ``spec.subtasks`` may be an iterable or an async iterable; either is streamed in
        pipelined batches, never held whole. Raises ``SubmitError`` naming the bad subtask;
        nothing is left behind. ``wait_replicas``: as ``Client.submit``.
        """
        tid = submit_task_id(spec, task_id, wait_replicas, wait_timeout)
        await self.check_eviction()
        tk = self.keys.task(tid)
        if await self.redis.exists(tk.record):
            raise task_exists(tid)
        streams = tk.streams(spec.partitions)
        pipe = self.redis.pipeline(transaction=False)
        open_streams(pipe, tk, streams)
        await pipe.execute()
        try:
            total = await self._write_subtasks(tk, spec, streams)
        except BaseException:
            await self.redis.delete(*streams)
            raise
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        await self.scripts.record_task(tk, streams, new_task(spec, total, now), client=pipe)
        record_steps(pipe, self.keys, spec, tid, total, now)
        waits = 0
        if wait_replicas:  # after the last write on each node: WAIT covers all before it
            waits = queue_replication_wait(
                pipe,
                self.redis,
                [tk.record, self.keys.queue, self.keys.tasks, self.keys.events],
                wait_replicas,
                int(wait_timeout * 1000),
            )
        replies = await pipe.execute()
        task = AsyncTask(self, tid)
        if total == 0:  # nothing to do: complete at once, through the one completion path
            await self.scripts.settle(tk, streams[0], "client", now, [])
        check_replicated(task, replies, waits, wait_replicas, wait_timeout)
        return task

    async def _write_subtasks(self, tk: TaskKeys, spec: TaskSpec, streams: list[str]) -> int:
        batch: list[tuple[int, int, str, str]] = []
        pipe = self.redis.pipeline(transaction=False)
        queued_calls = 0
        index = -1
        async for payload in each(spec.subtasks):
            index += 1
            batch.append(subtask_message(spec.partitions, index, payload))
            if len(batch) >= SUBMIT_BATCH:
                await self.scripts.enqueue(streams, batch, client=pipe)
                batch = []
                queued_calls += 1
                if queued_calls >= SUBMIT_PIPELINE:
                    keep_lease(pipe, streams)
                    await pipe.execute()
                    queued_calls = 0
        if batch:
            await self.scripts.enqueue(streams, batch, client=pipe)
        await pipe.execute()
        return index + 1

    # -- reading --------------------------------------------------------------------------

    def task(self, task_id: str) -> AsyncTask:
        """A handle (no I/O: ``await task.status()`` raises ``TaskNotFound``)."""
        return AsyncTask(self, check_task_id(task_id))

    # -- queues ---------------------------------------------------------------------------

    async def queue(
        self, name: str, *, reopen: bool = False, **settings: Unpack[QueueOptions]
    ) -> AsyncQueue:
        """Create the queue ``name`` or open it (idempotent), as ``Client.queue``: a
        coroutine, since opening reads the queue (and creating writes it), so a settings
        conflict is a ``ValueError`` here, at once; ``reopen=True`` reopens a cancelled
        (or failed) queue."""
        given = given_settings(**settings)
        name = check_task_id(name, "queue name")
        await self.check_eviction()
        return await open_queue(self, name, given, reopen)

    async def queues(self) -> list[QueueStatus]:
        """Every queue that still exists, by name."""
        names = sorted(text(n) for n in await self.redis.smembers(self.keys.queues))
        out = []
        for name in names:
            try:
                out.append(await AsyncQueue(self, name, DEFAULTS, revives=False).status())
            except TaskNotFound:
                await self.redis.srem(self.keys.queues, name)  # its record expired
        return out

    async def tasks(
        self, *, limit: int | None = None, offset: int = 0, newest_first: bool = False
    ) -> list[TaskStatus]:
        """``Client.tasks``: a page of the task index, oldest first unless ``newest_first``."""
        page = task_page(limit, offset)
        if page is None:
            return []
        found: Any = await self.redis.zrange(self.keys.tasks, *page, desc=newest_first)
        ids = [text(t) for t in found]
        pipe = self.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hgetall(self.keys.task(tid).record)
        return task_statuses(ids, await pipe.execute() if ids else [])

    async def task_count(self) -> int:
        """How many tasks the index lists (finished ones until they expire)."""
        return int(await self.redis.zcard(self.keys.tasks))

    async def workers(self) -> list[WorkerRecord]:
        ids = [text(w) for w in await self.redis.zrange(self.keys.workers, 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for wid in ids:
            pipe.hgetall(self.keys.worker(wid))
        return worker_records(await pipe.execute())

    async def drain_worker(self, worker_id: str) -> None:
        """Ask a worker to leave gracefully and exit (as SIGTERM would), within a tick."""
        await self.check_eviction()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.worker(worker_id), "drain", "1")
        events.emit(pipe, self.keys, "drain_requested", worker=worker_id)
        await pipe.execute()
