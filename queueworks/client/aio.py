"""``AsyncClient``: ``queueworks.Client`` on ``redis.asyncio``, name for name.

It shares everything but the I/O with the sync client: every operation is a plan
(``queueworks.transport.plans``: ``queueworks.task.submit``, ``queueworks.task.tasks``,
``queueworks.queue.queue_plans``, ``queueworks.client.client_plans``) that ``Client`` runs with
``queueworks.transport.runner.run`` and this client with ``queueworks.transport.aio_runner.arun``.
What
differs, and why: docs/asyncio.md.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar, Unpack

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from queueworks.client.aio_queue_handle import AsyncJob, AsyncQueue, open_queue
from queueworks.client.aio_results import ResultWatcher
from queueworks.client.aio_tasks import AsyncTask
from queueworks.client.client_plans import (
    plan_drain_worker,
    plan_task_count,
    plan_tasks,
    plan_workers,
)
from queueworks.client.sync import client_log, env_options, given_settings
from queueworks.protocol.keys import Keys, check_task_id
from queueworks.protocol.models import JobStatus, QueueStatus, TaskSpec, TaskStatus, WorkerRecord
from queueworks.queue.queue_plans import plan_job_status_of, plan_queues, plan_running_of
from queueworks.queue.queue_settings import DEFAULTS, QueueOptions
from queueworks.queue.queues import RUNNING_SHOWN, job_ref
from queueworks.scripts.bound import AsyncScripts
from queueworks.task.submit import check_replicated, plan_submit, submit_task_id
from queueworks.transport.aio_connection import AsyncConnection, connect_async
from queueworks.transport.aio_runner import arun
from queueworks.transport.aio_wire import AsyncLine
from queueworks.transport.eviction import CLIENT_OVERRIDE, judge, read_policies_async
from queueworks.transport.lost_workers import WINDOW, LostWorker, plan_lost_workers
from queueworks.transport.plans import Plan

T = TypeVar("T")


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
        self.line = AsyncLine.of(
            connection
        )  # the hot path of enqueue (``queueworks.transport.wire``)
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

    @classmethod
    def from_env(cls, **connect_options: Any) -> AsyncClient:
        """``Client.from_env``: ``QUEUEWORKS_REDIS_URL`` (default
        ``redis://localhost:6379/0``), ``QUEUEWORKS_PREFIX`` and the rest as the command
        reads them, at this call."""
        url, options = env_options(connect_options)
        return cls.from_url(url, **options)

    async def check_eviction(self) -> None:
        """``Client.check_eviction``: once per client, at its first write."""
        if not self._eviction_checked:
            policies = await read_policies_async(self.redis)
            judge(policies, allow=self.allow_eviction, override=CLIENT_OVERRIDE, log=client_log())
            self._eviction_checked = True

    async def close(self) -> None:
        if self.line is not None:
            await self.line.aclose()
        await self.redis.aclose()

    async def _run(self, plan: Plan[T]) -> T:
        return await arun(self.redis, self.scripts, plan)

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
        cluster = isinstance(self.redis, AsyncRedisCluster)
        plan = plan_submit(self.keys, spec, tid, wait_replicas, wait_timeout, cluster)
        acked = await self._run(plan)
        task = AsyncTask(self, tid)
        check_replicated(task, acked, wait_replicas, wait_timeout)
        return task

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

    def job(self, ref: str) -> AsyncJob:
        """A handle to the job ``"QUEUE/JOB_ID"``, as ``Client.job`` (no I/O)."""
        name, job_id = job_ref(ref)
        return AsyncQueue(self, name, DEFAULTS, revives=False).job(job_id)

    async def queues(self) -> list[QueueStatus]:
        """Every queue that still exists, by name."""
        return await self._run(plan_queues(self.keys))

    async def job_status(self, queue: str, job_id: str) -> JobStatus:
        """A job's status by its queue's name, without opening the queue; ``LookupError``
        if the queue has no such job."""
        return await self._run(plan_job_status_of(self.keys, queue, job_id))

    async def running_jobs(self, queue: str, limit: int = RUNNING_SHOWN) -> list[JobStatus]:
        """The status of up to ``limit`` jobs the members of ``queue`` run now (with their
        progress), without opening it: [] for a queue that has none, or is no queue."""
        return await self._run(plan_running_of(self.keys, queue, limit))

    async def tasks(
        self, *, limit: int | None = None, offset: int = 0, newest_first: bool = False
    ) -> list[TaskStatus]:
        """``Client.tasks``: a page of the task index, oldest first unless ``newest_first``."""
        return await self._run(plan_tasks(self.keys, limit, offset, newest_first))

    async def task_count(self) -> int:
        """How many tasks the index lists (finished ones until they expire)."""
        return await self._run(plan_task_count(self.keys))

    async def workers(self) -> list[WorkerRecord]:
        return await self._run(plan_workers(self.keys))

    async def lost_workers(self, within: float = WINDOW) -> list[LostWorker]:
        """Workers found dead (heartbeat gone) in the last ``within`` seconds, newest
        first (at most 50), each with what its task and queues reclaimed from it."""
        return await self._run(plan_lost_workers(self.keys, time.time(), within))

    async def drain_worker(self, worker_id: str) -> None:
        """Ask a worker to leave gracefully and exit (as SIGTERM would), within a tick."""
        await self.check_eviction()
        await self._run(plan_drain_worker(self.keys, worker_id))
