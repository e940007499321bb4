"""``AsyncQueue`` and ``AsyncJob``: ``queueworks.queues.Queue`` and ``Job`` on
``redis.asyncio``, name for name, with the same checks, job ids and decoding (the functions
of ``queueworks.queues``).

``await q.enqueue(...)`` is one round trip, as the sync one. A call alone goes out at once
(one ``XADD``); calls made while one is in flight on the same handle go out together after
it, in one Lua call (``JobWriter``), so a thousand gathered enqueues cost a few round trips
and a connection or two, not a thousand. Each job is still written once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
)
from datetime import datetime
from typing import Any, TypeVar

import redis

from queueworks import events
from queueworks.aio.tasks import AsyncBackend, AsyncTask
from queueworks.models import JobStatus, QueueStatus
from queueworks.queue_settings import QueueSettings
from queueworks.queues import (
    CANCEL_TRIES,
    CANCELLED_LAST,
    ENQUEUE_BATCH,
    ENQUEUE_PIPELINE,
    HandlerPaths,
    cancelled,
    check_created,
    enqueued,
    new_job,
    new_queue,
    opened_settings,
    queue_created,
    queue_reads,
    queue_reopened,
    queue_status,
    read_status,
    reopen_keys,
    reopening,
    status_reads,
    tell_handlers,
    xadd_now,
)
from queueworks.records import job_status
from queueworks.scripts import NewJob
from queueworks.tasks import TaskNotFound
from queueworks.vanished import QueueGone, no_group, record_gone

T = TypeVar("T")
Jobs = (
    Iterable[tuple[str | Callable[..., Any], Any]]
    | AsyncIterable[tuple[str | Callable[..., Any], Any]]
)


class AsyncQueue:
    """A handle to one queue: ``q = await client.queue("emails")``; after its queue is gone
    from Redis, it makes it again with its settings, as ``Queue`` does."""

    def __init__(
        self, client: AsyncBackend, name: str, settings: QueueSettings, *, revives: bool = True
    ) -> None:
        self.client, self.name, self.settings = client, name, settings
        self.revives = revives
        self.keys = client.keys.task(name)
        self._known: set[str] = set()  # handlers this handle has told the queue about
        self._path = HandlerPaths()
        self._writer = JobWriter(self._send)

    def __repr__(self) -> str:
        return f"AsyncQueue({self.name!r})"

    @property
    def task(self) -> AsyncTask:
        """The queue as a task (``resize``, ``set_priority``, ``cancel`` stop it taking
        nodes for good)."""
        return AsyncTask(self.client, self.name)

    def job(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, job_id)

    # -- enqueueing -----------------------------------------------------------------------

    async def enqueue(
        self,
        handler: str | Callable[..., Any],
        payload: Any = None,
        *,
        delay: float | None = None,
        at: datetime | float | None = None,
    ) -> AsyncJob:
        """Add one job: ``handler`` (``"module:function"`` or the function) runs on
        ``payload`` (JSON). ``delay`` (s) or ``at`` (a datetime or Unix time): not before.
        One round trip (shared with the enqueues of this handle in flight with it)."""
        job = new_job(self._path(handler), payload, delay, at)
        return AsyncJob(self, await self._writer.write(job))

    async def enqueue_many(self, jobs: Jobs) -> list[AsyncJob]:
        """Add many ``(handler, payload)`` jobs (an iterable or an async iterable), in
        batches, pipelined."""
        ids: list[str] = []
        batches: list[list[NewJob]] = [[]]
        async for handler, payload in each(jobs):
            batches[-1].append(new_job(self._path(handler), payload, None, None))
            if len(batches[-1]) >= ENQUEUE_BATCH:
                if len(batches) >= ENQUEUE_PIPELINE:
                    ids += await self._send_many(batches)
                    batches = []
                batches.append([])
        ids += await self._send_many(batches)
        return [AsyncJob(self, job_id) for job_id in ids]

    async def _send(self, jobs: Sequence[NewJob]) -> list[str]:
        return await self._send_many([jobs])

    async def _send_many(self, batches: Sequence[Sequence[NewJob]]) -> list[str]:
        """One round trip (a batch that found the queue gone is sent again once the queue
        is made again); the jobs' ids."""
        batches = [b for b in batches if b]
        if not batches:
            return []
        replies = await self._write(batches)
        if any(reply is None for reply in replies):
            await self._revive()
            for i, reply in enumerate(replies):
                if reply is None:
                    replies[i] = await self.client.scripts.enqueue_jobs(
                        self.keys, batches[i], time.time()
                    )
        return [job_id for reply in replies for job_id in enqueued(self.name, reply)]

    async def _write(self, batches: Sequence[Sequence[NewJob]]) -> list[Any]:
        """One round trip: a Lua call per batch (a lone job to run now: its XADD), and the
        handlers the queue does not know from this handle yet; each batch's reply (nil: the
        queue's stream is gone, nothing written)."""
        r, scripts, now = self.client.redis, self.client.scripts, time.time()
        new = {job.handler for batch in batches for job in batch} - self._known
        if not new and len(batches) == 1:
            if len(batches[0]) == 1 and batches[0][0].at is None:  # a lone job to run now
                entry = await r.execute_command(*xadd_now(self.keys, batches[0][0], now))
                return [None if entry is None else [entry]]
            return [await scripts.enqueue_jobs(self.keys, batches[0], now)]
        pipe = r.pipeline(transaction=False)
        if new:
            tell_handlers(pipe, self.client.keys, self.keys, sorted(new))
        calls = [await scripts.enqueue_jobs(self.keys, b, now, client=pipe) for b in batches]
        replies = await pipe.execute()
        if calls[0] is pipe:  # queued on it (a cluster pipeline ran them at once: see ``Call``)
            calls = replies[len(replies) - len(batches) :]
        self._known |= new
        return list(calls)

    async def _revive(self) -> None:
        """``Queue._revive``: the queue made again with this handle's settings."""
        r = self.client.redis
        if record_gone(self.name, await r.hget(self.keys.record, "state"), self.revives):
            await open_queue(self.client, self.name, self.settings.given())
        pipe = r.pipeline(transaction=False)
        pipe.xgroup_create(self.keys.stream, self.keys.group, id="0", mkstream=True)
        if self._known:
            tell_handlers(pipe, self.client.keys, self.keys, sorted(self._known))
        check_created(await pipe.execute(raise_on_error=False))

    # -- reading --------------------------------------------------------------------------

    async def status(self) -> QueueStatus:
        try:
            task = await self.task.status()
        except TaskNotFound:
            await self._revive()
            task = await self.task.status()
        pipe = self.client.redis.pipeline(transaction=False)
        queue_reads(pipe, self.keys)
        return queue_status(task, await pipe.execute(raise_on_error=False), time.time())


async def each(items: Iterable[T] | AsyncIterable[T]) -> AsyncIterator[T]:
    """Iterate an iterable or an async iterable alike."""
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


class JobWriter:
    """Writes the jobs of concurrent ``enqueue`` calls together. A call that finds no round
    trip in flight sends its job at once, itself; calls that come while one is in flight
    wait, and go together in the next (up to ``ENQUEUE_BATCH`` jobs each), sent by a task
    of the writer's. One round trip is in flight at a time.

    A failed round trip fails every call whose job it carried, with its error (the jobs
    may have been written or not, as for any failed write). A call cancelled before its
    round trip left is not written; one cancelled after may be."""

    def __init__(self, send: Callable[[Sequence[NewJob]], Awaitable[list[str]]]) -> None:
        self._send = send
        self._busy = False  # a round trip is in flight
        self._waiting: list[tuple[NewJob, asyncio.Future[str]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, job: NewJob) -> str:
        """Write ``job``; its id."""
        if not self._busy:
            self._busy = True
            try:
                return (await self._send([job]))[0]
            finally:
                self._busy = False
                self._kick()
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.append((job, done))
        return await done

    def _kick(self) -> None:
        """Send what waits, from a task of the writer's (not from a caller: it may go)."""
        if self._waiting and self._flusher is None:
            self._busy = True
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._waiting:
                taken = self._waiting[:ENQUEUE_BATCH]
                del self._waiting[:ENQUEUE_BATCH]
                batch = [(job, done) for job, done in taken if not done.done()]
                if batch:
                    await self._round_trip(batch)
        finally:
            self._busy, self._flusher = False, None
            for _, done in self._waiting:  # only if this task itself was cancelled
                done.cancel()
            self._waiting.clear()

    async def _round_trip(self, batch: list[tuple[NewJob, asyncio.Future[str]]]) -> None:
        try:
            ids = await self._send([job for job, _ in batch])
        except Exception as exc:
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc)
        except BaseException:
            for _, done in batch:
                done.cancel()
            raise
        else:
            for (_, done), job_id in zip(batch, ids, strict=True):
                if not done.done():
                    done.set_result(job_id)


class AsyncJob:
    """A handle to one job of a queue: ``await job.result(timeout)``."""

    def __init__(self, queue: AsyncQueue, job_id: str) -> None:
        self.queue, self.id = queue, job_id
        self.key = queue.keys.job(job_id)

    def __repr__(self) -> str:
        return f"AsyncJob({self.queue.name!r}, {self.id!r})"

    async def status(self) -> JobStatus:
        replies = await self._status_reads()
        if any(no_group(reply) for reply in replies):  # the queue's stream or group is gone
            await self.queue._revive()
            replies = await self._status_reads()
        qk = self.queue.keys
        raw, pending, where = read_status(qk, self.id, replies)
        if where:
            stream, entry = where
            r = self.queue.client.redis
            pending = await r.xpending_range(stream, qk.group, entry, entry, 1)
        return job_status(self.queue.name, self.id, raw, pending, time.time())

    async def _status_reads(self) -> list[Any]:
        pipe = self.queue.client.redis.pipeline(transaction=False)
        status_reads(pipe, self.queue.keys, self.id)
        return list(await pipe.execute(raise_on_error=False))

    async def result(self, timeout: float | None = None) -> Any:
        """The job's result once it is done; ``JobFailed`` if it is dead or cancelled;
        ``TimeoutError`` after ``timeout`` s. Polled as ``Job.result`` polls, together with
        the client's other calls (``ResultWatcher``)."""
        watcher = self.queue.client.results
        deadline = None if timeout is None else time.monotonic() + timeout
        left = timeout
        while True:
            try:
                return await watcher.result(self.queue.name, self.queue.keys, self.id, left)
            except QueueGone:
                await self.queue._revive()  # its entry runs once its group is there again
            left = None if deadline is None else max(0.0, deadline - time.monotonic())

    async def cancel(self) -> bool:
        """Cancel the job if it has not started; False if it has started or finished."""
        q = self.queue
        now, ttl = time.time(), int(q.settings.result_ttl)
        try:
            found = await q.client.scripts.cancel_job(q.keys, self.id, now, ttl)
        except redis.ResponseError as exc:
            if not no_group(exc):
                raise
            await q._revive()
            found = await q.client.scripts.cancel_job(q.keys, self.id, now, ttl)
        for _ in range(CANCEL_TRIES):  # set aside: it waits on its handler's stream
            if not isinstance(found, str):
                break
            found = await q.client.scripts.cancel_job(q.keys, self.id, now, ttl, aside=found)
        if found == CANCELLED_LAST:
            await events.emit_async(q.client.redis, q.client.keys, "handlers", task=q.name)
        return cancelled(q.name, self.id, found)


async def open_queue(
    client: AsyncBackend, name: str, given: dict[str, Any], reopen: bool = False
) -> AsyncQueue:
    """Create the queue ``name`` with ``given`` settings (the rest default), or open it
    (``queueworks.queues.open_queue``: the same checks, and ``reopen``)."""
    r, tk = client.redis, client.keys.task(name)
    raw: Any = await r.hmget(tk.record, ["spec", "state"])
    if raw[0] is not None:
        settings = opened_settings(name, raw, given, reopen)
        if reopening(raw, reopen):
            aside = await r.smembers(tk.aside)
            created = await client.scripts.reopen_queue(tk, reopen_keys(tk, aside))
            if created is not None:
                pipe = r.pipeline(transaction=False)
                queue_reopened(pipe, client.keys, name, created)
                await pipe.execute()
        return AsyncQueue(client, name, settings)
    now = time.time()
    settings, record = new_queue(name, given, now)
    pipe = r.pipeline(transaction=False)
    pipe.xgroup_create(tk.stream, tk.group, id="0", mkstream=True)
    await client.scripts.record_task(tk, [tk.stream], record, client=pipe)
    queue_created(pipe, client.keys, name, now)
    check_created(await pipe.execute(raise_on_error=False))
    return AsyncQueue(client, name, settings)
