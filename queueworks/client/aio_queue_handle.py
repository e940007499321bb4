"""``AsyncQueue`` and ``AsyncJob``: ``queueworks.client.queue_handle.Queue`` and ``Job`` on
``redis.asyncio``, name for name: they run the plans ``Queue`` and ``Job`` run
(``queueworks.queue.queue_plans``) with the asyncio runner.

``await q.enqueue(...)`` is one round trip, as the sync one. A call alone goes out at once
(one ``XADD``); calls made while one is in flight on the same handle go out together after
it, in one Lua call (``JobWriter``), so a thousand gathered enqueues cost a few round trips
and a connection or two, not a thousand. Each job is still written once. A job with a
unique key or dependencies goes by the enqueue plan both clients run
(``queueworks.queue.enqueue``).
"""

from __future__ import annotations

import asyncio
import json
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
from typing import Any, Generic, TypeAlias, Unpack

from typing_extensions import TypeVar

from queueworks.client.aio_tasks import AsyncBackend, AsyncTask
from queueworks.errors import NotFinished, NotReplicated
from queueworks.job_functions import Call
from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.messages import text
from queueworks.protocol.models import JobDetail, JobPage, JobStatus, QueueStatus, Schedule
from queueworks.protocol.priorities import DEFAULT, check_priority, prioritised_id
from queueworks.queue.configure import plan_configure
from queueworks.queue.enqueue import enqueue_of, many_of, plan_enqueue
from queueworks.queue.job_lists import plan_job_detail, plan_jobs
from queueworks.queue.queue_admin import (
    plan_delete_dead,
    plan_empty,
    plan_pause,
    plan_requeue_dead,
    plan_run_now,
)
from queueworks.queue.queue_plans import (
    QueueRef,
    plan_job_cancel,
    plan_job_status,
    plan_open,
    plan_queue_status,
    plan_revive,
    plan_running,
    plan_send,
    plan_unfinished,
    plan_write,
)
from queueworks.queue.queue_settings import LiveOptions, QueueSettings
from queueworks.queue.queues import (
    ENQUEUE_BATCH,
    ENQUEUE_PIPELINE,
    OUTAGE_FIRST_PAUSE,
    OUTAGE_LAST_PAUSE,
    RUNNING_SHOWN,
    HandlerPaths,
    checked_call,
    outage_pause,
    payload_json,
)
from queueworks.queue.schedule_plans import plan_schedule, plan_schedules, plan_unschedule
from queueworks.queue.vanished import QueueGone
from queueworks.scripts.calls import NewJob
from queueworks.transport.aio_runner import arun
from queueworks.transport.connection import UNAVAILABLE
from queueworks.transport.plans import Plan
from queueworks.transport.replication import (
    NO_WAIT,
    Replicas,
    jobs_not_replicated,
    replicated,
)
from queueworks.transport.wire import XaddBytes

T = TypeVar("T")
R = TypeVar("R", default=Any)
Jobs = (
    Iterable[tuple[str | Callable[..., Any], Any]]
    | AsyncIterable[tuple[str | Callable[..., Any], Any]]
)


class AsyncQueue:
    """A handle to one queue: ``q = await client.queue("emails")``; after its queue is gone
    from Redis, it makes it again with its settings, as ``Queue`` does."""

    def __init__(
        self,
        client: AsyncBackend,
        name: str,
        settings: QueueSettings,
        *,
        revives: bool = True,
        known: Iterable[str] = (),
    ) -> None:
        self.client, self.name, self.settings = client, name, settings
        self.revives = revives
        self.ref = QueueRef(client.keys, name, settings, revives)
        self.ref.known.update(known)  # (the handlers the queue was told about, when opened)
        self.keys = self.ref.qk
        self._path = HandlerPaths()
        self._writer = JobWriter(self._write)
        self._xadd_bytes = XaddBytes(self.keys)  # a lone job's XADD (``queueworks.transport.wire``)

    def __repr__(self) -> str:
        return f"AsyncQueue({self.name!r})"

    async def _run(self, plan: Plan[T]) -> T:
        return await arun(self.client.redis, self.client.scripts, plan)

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
        handler: str | Callable[..., Any] | Call[R],
        payload: Any = None,
        *,
        delay: float | None = None,
        at: datetime | float | None = None,
        wait_replicas: int | None = None,
        wait_timeout: float | None = None,
        retry_delay: float | None = None,
        retry_backoff: float | None = None,
        retry_max_delay: float | None = None,
        key: str | None = None,
        unique_for: float | None = None,
        group: str | None = None,
        depends_on: Iterable[Any] | None = None,
        priority: int | None = None,
    ) -> AsyncJob[R]:
        """Add one job: ``handler`` (``"module:function"`` or the function) runs on
        ``payload`` (JSON); or a typed job function's call (``fn.call(...)``), no payload:
        its ``AsyncJob[R]``'s ``result()`` is of the function's return type.
        ``delay`` (s) or ``at`` (a datetime or Unix time): not before.
        ``retry_delay``, ``retry_backoff``, ``retry_max_delay``: this job's own retry
        schedule, instead of the queue's settings of the same names. ``key``: a unique
        key; while a job holding it is live (or finished less than ``unique_for`` s ago),
        this returns that job (``created`` False: this call's handler and payload are not
        used) instead of making one. ``group``: the job's group; with the queue's
        ``group_limit``, at most that many jobs of one group run at once.
        ``depends_on``: jobs (``Job``, or ``"QUEUE/JOB_ID"``) and tasks (``Task``, or
        ``"task:TASK_ID"``) of any queue: the job waits, deferred, until every one is done
        (a task: completed), and dies, never run, if one dies, fails or is cancelled.
        ``priority``: from -5 to 5 (default 0), higher first, in order of enqueue within
        one priority (``queueworks.protocol.priorities``). One round
        trip (shared with the enqueues of this handle in flight with it).
        ``wait_replicas`` as for ``Queue.enqueue``: the enqueues gathered in one round
        trip share one WAIT (the most replicas and the longest timeout any asks for)."""
        options = JobOptions.given(
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            retry_max_delay=retry_max_delay,
            key=key,
            unique_for=unique_for,
            group=group,
        )
        if isinstance(handler, Call):
            path, body, typed = handler.path, checked_call(handler, payload), handler
        else:
            path, body, typed = self._path(handler), None, None
        band = DEFAULT if priority is None else check_priority(priority)
        job, deps, key, wait = enqueue_of(
            self.settings,
            path,
            payload,
            body,
            options,
            band,
            delay=delay,
            at=at,
            depends_on=depends_on,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
        )
        if key is None and not deps:  # with the enqueues in flight on this handle (``JobWriter``)
            return AsyncJob(self, await self._writer.write(job, wait), typed=typed)
        job_id, made, acked = await self._run(plan_enqueue(self.ref, job, deps, key, wait))
        return replicated(self.name, [AsyncJob(self, job_id, made, typed)], acked, wait)[0]

    async def enqueue_many(
        self,
        jobs: Jobs | Iterable[Call[R]] | AsyncIterable[Call[R]],
        *,
        group: str | None = None,
        priority: int | None = None,
        wait_replicas: int | None = None,
        wait_timeout: float | None = None,
    ) -> list[AsyncJob[R]]:
        """Add many ``(handler, payload)`` jobs, or typed calls (``fn.call(...)``; their
        handles typed), from an iterable or an async iterable, in batches, pipelined.
        ``group``, ``priority`` and ``wait_replicas`` as for ``Queue.enqueue_many``:
        every job's group and priority; one WAIT, after the last batch."""
        options, band, wait = many_of(self.settings, group, priority, wait_replicas, wait_timeout)
        ids: list[str] = []
        batches: list[list[NewJob]] = [[]]
        typed: list[Call[R] | None] = []  # each job's call, if typed (decodes its result)
        one: Any
        async for one in each(jobs):
            if len(batches[-1]) >= ENQUEUE_BATCH:
                if len(batches) >= ENQUEUE_PIPELINE:  # sent once more follows
                    ids += await self._run(plan_send(self.ref, batches))
                    batches = []
                batches.append([])
            if isinstance(one, Call):
                path, body = one.path, one.body
                typed.append(one)
            else:
                handler, payload = one
                path, body = self._path(handler), payload_json(payload)
                typed.append(None)
            job_id = prioritised_id(band) if band else ""
            batches[-1].append(NewJob(job_id, path, body, None, options))
        last, acked = await self._run(plan_write(self.ref, batches, wait))
        handles = [
            AsyncJob(self, job_id, typed=call)
            for job_id, call in zip(ids + last, typed, strict=True)
        ]
        return replicated(self.name, handles, acked, wait)

    async def _write(
        self, jobs: Sequence[NewJob], waits: Sequence[Replicas]
    ) -> list[str | NotReplicated]:
        """``JobWriter``'s round trip: one WAIT for them all (the strongest asked for);
        each job's id, or the error that names it if too few replicas acknowledged it."""
        wait = strongest(waits)
        if not wait.replicas:
            line = self.client.line
            if line is not None and len(jobs) == 1 and self.ref.bare(jobs[0]):
                reply = await line.call(self._xadd_bytes(jobs[0], time.time()))
                if reply is not None:  # nil: the queue's stream is gone (the plan revives it)
                    return [text(reply)]
            return list(await self._run(plan_send(self.ref, [jobs])))
        ids, acked = await self._run(plan_write(self.ref, [jobs], wait))
        out: list[str | NotReplicated] = []
        for job_id, asked in zip(ids, waits, strict=True):
            error = jobs_not_replicated(self.name, [AsyncJob(self, job_id)], acked, asked)
            out.append(job_id if error is None else error)
        return out

    async def _revive(self) -> None:
        """``Queue._revive``: the queue made again with this handle's settings."""
        await self._run(plan_revive(self.ref))

    # -- reading --------------------------------------------------------------------------

    async def status(self) -> QueueStatus:
        return await self._run(plan_queue_status(self.ref))

    # -- periodic jobs ----------------------------------------------------------------------

    async def schedule(
        self,
        name: str,
        handler: str | Callable[..., Any] | Call[Any],
        payload: Any = None,
        *,
        every: float | None = None,
        cron: str | None = None,
    ) -> Schedule:
        """Enqueue ``handler(payload)`` on this queue every ``every`` s (the first run
        ``every`` s from now) or at each time of the cron expression ``cron`` (5 fields,
        UTC): one job per due time, enqueued by the controller that leads. A schedule of
        the same name is replaced. ``ValueError`` naming what is wrong. ``handler`` may be a
        typed call (``fn.call(...)``, no payload): each job is that call."""
        if isinstance(handler, Call):
            path, payload = handler.path, json.loads(checked_call(handler, payload))
        else:
            path = self._path(handler)
        plan = plan_schedule(self.ref, name, path, payload, every, cron)
        return await self._run(plan)

    async def schedules(self) -> list[Schedule]:
        """This queue's schedules, by name, with their next and last runs."""
        return await self._run(plan_schedules(self.client.keys, self.name))

    async def unschedule(self, name: str) -> bool:
        """Remove the schedule ``name``: True if it existed. Jobs it enqueued stay."""
        return await self._run(plan_unschedule(self.ref, name))

    async def running(self, limit: int = RUNNING_SHOWN) -> list[JobStatus]:
        """The status of up to ``limit`` jobs its members run now (with their progress)."""
        return await self._run(plan_running(self.ref, limit))

    # -- jobs by state, and the whole queue's actions ---------------------------------------

    async def jobs(self, state: str = "queued", limit: int = 20, offset: int = 0) -> JobPage:
        """A page of its jobs in ``state`` (queued, scheduled, deferred, running, done or
        dead): ``limit`` (at most 1,000) after ``offset``, and how many there are
        (``queueworks.queue.job_lists``). ``ValueError`` naming a bad state, limit or offset."""
        return await self._run(plan_jobs(self.client.keys, self.name, state, limit, offset))

    async def configure(self, **settings: Unpack[LiveOptions]) -> QueueSettings:
        """As ``Queue.configure``: change the queue's live settings; its settings now."""
        self.settings = await self._run(plan_configure(self.client.keys, self.name, settings))
        self.ref.settings = self.settings
        return self.settings

    async def pause(self) -> bool:
        """Its members stop reading new jobs (jobs keep arriving); False if it was paused."""
        return await self._run(plan_pause(self.client.keys, self.name, True))

    async def resume(self) -> bool:
        """Its members read again; False if it was not paused."""
        return await self._run(plan_pause(self.client.keys, self.name, False))

    async def empty(self) -> int:
        """Cancel every job of its backlog (not started: on its stream, set aside, or
        waiting for a group slot): how many."""
        return await self._run(plan_empty(self.client.keys, self.name))

    async def requeue_dead(self) -> int:
        """Run every dead job of its dead letters again: how many."""
        return await self._run(plan_requeue_dead(self.client.keys, self.name))

    async def delete_dead(self) -> int:
        """Drop every dead letter (the jobs stay counted as dead): how many."""
        return await self._run(plan_delete_dead(self.client.keys, self.name))

    async def run_now(self, job_id: str) -> bool:
        """Run scheduled job ``job_id`` now; False if it is not scheduled."""
        return await self._run(plan_run_now(self.client.keys, self.name, job_id))


async def each(items: Iterable[T] | AsyncIterable[T]) -> AsyncIterator[T]:
    """Iterate an iterable or an async iterable alike."""
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


def strongest(waits: Sequence[Replicas]) -> Replicas:
    """One WAIT for enqueues gathered together: the most replicas, the longest timeout."""
    if len(waits) == 1:  # a call alone, the commonest
        return waits[0]
    asking = [w for w in waits if w.replicas]
    if not asking:
        return NO_WAIT
    return Replicas(max(w.replicas for w in asking), max(w.timeout for w in asking))


Outcome: TypeAlias = "str | Exception"  # a job's id, or the error its call raises


class JobWriter:
    """Writes the jobs of concurrent ``enqueue`` calls together. A call that finds no round
    trip in flight sends its job at once, itself; calls that come while one is in flight
    wait, and go together in the next (up to ``ENQUEUE_BATCH`` jobs each), sent by a task
    of the writer's. One round trip is in flight at a time. ``send`` is given the jobs and
    the replicas each waits for, and gives each job's id or the error its call raises.

    A failed round trip fails every call whose job it carried, with its error (the jobs
    may have been written or not, as for any failed write). A call cancelled before its
    round trip left is not written; one cancelled after may be."""

    def __init__(
        self,
        send: Callable[[Sequence[NewJob], Sequence[Replicas]], Awaitable[Sequence[Outcome]]],
    ) -> None:
        self._send = send
        self._busy = False  # a round trip is in flight
        self._waiting: list[tuple[NewJob, Replicas, asyncio.Future[str]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, job: NewJob, wait: Replicas = NO_WAIT) -> str:
        """Write ``job`` (``wait``: the replicas it waits for); its id."""
        if not self._busy:
            self._busy = True
            try:
                outcome = (await self._send([job], [wait]))[0]
            finally:
                self._busy = False
                self._kick()
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.append((job, wait, done))
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
                batch = [(job, wait, done) for job, wait, done in taken if not done.done()]
                if batch:
                    await self._round_trip(batch)
        finally:
            self._busy, self._flusher = False, None
            for _, _, done in self._waiting:  # only if this task itself was cancelled
                done.cancel()
            self._waiting.clear()

    async def _round_trip(self, batch: list[tuple[NewJob, Replicas, asyncio.Future[str]]]) -> None:
        try:
            outcomes = await self._send([job for job, _, _ in batch], [w for _, w, _ in batch])
        except Exception as exc:
            for _, _, done in batch:
                if not done.done():
                    done.set_exception(exc)
        except BaseException:
            for _, _, done in batch:
                done.cancel()
            raise
        else:
            for (_, _, done), outcome in zip(batch, outcomes, strict=True):
                if done.done():
                    continue
                if isinstance(outcome, Exception):
                    done.set_exception(outcome)
                else:
                    done.set_result(outcome)


class AsyncJob(Generic[R]):
    """A handle to one job of a queue: ``await job.result(timeout)``. ``created``: whether
    the enqueue that returned it made it (False: it found it holding its unique key).
    ``AsyncJob[R]``: a typed job function's (``typed``: its call), whose result is an ``R``."""

    def __init__(
        self, queue: AsyncQueue, job_id: str, created: bool = True, typed: Call[R] | None = None
    ) -> None:
        self.queue, self.id, self.typed = queue, job_id, typed
        self.created = created  # False: an enqueue with a unique key found it, live
        self.key = queue.keys.job(job_id)

    def __repr__(self) -> str:
        return f"AsyncJob({self.queue.name!r}, {self.id!r})"

    async def _run(self, plan: Plan[T]) -> T:
        return await arun(self.queue.client.redis, self.queue.client.scripts, plan)

    async def status(self) -> JobStatus:
        return await self._run(plan_job_status(self.queue.ref, self.id))

    async def detail(self) -> JobDetail:
        """Its status with its payload (while kept), result and traceback."""
        keys = self.queue.client.keys
        return await self._run(plan_job_detail(keys, self.queue.name, self.id))

    async def result(self, timeout: float | None = None) -> R:
        """The job's result once it is done (a typed job's as its function's return
        annotation says); ``JobFailed`` if it is dead or cancelled;
        ``TimeoutError`` after ``timeout`` s. Polled as ``Job.result`` polls, together with
        the client's other calls (``ResultWatcher``)."""
        watcher = self.queue.client.results
        settings = self.queue.settings
        wait = Replicas(settings.wait_replicas, settings.wait_timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        left, outage = timeout, OUTAGE_FIRST_PAUSE
        while True:
            try:
                value = await watcher.result(self.queue.name, self.queue.keys, self.id, left, wait)
                return value if self.typed is None else self.typed.decode(value)
            except QueueGone:
                await self._run(
                    plan_revive(self.queue.ref)
                )  # its entry runs once its group is there again
            except NotFinished as exc:  # said again from its status (running, why it waits)
                plan = plan_unfinished(self.queue.ref, self.id, timeout, exc)
                raise await self._run(plan) from None
            except UNAVAILABLE as exc:  # Redis is away: look again until the timeout
                await asyncio.sleep(outage_pause(exc, deadline, outage))
                outage = min(OUTAGE_LAST_PAUSE, outage * 2)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())

    async def cancel(self) -> bool:
        """Cancel the job: one not started never runs; a running one is stopped (an ``async
        def`` handler at once, a plain one at its next ``ctx.checkpoint()``; one that never
        checks finishes, its outcome dropped) and never run again. Whether the job will not
        run (again): False if it had finished."""
        return await self._run(plan_job_cancel(self.queue.ref, self.id))


async def open_queue(
    client: AsyncBackend, name: str, given: dict[str, Any], reopen: bool = False
) -> AsyncQueue:
    """Create the queue ``name`` with ``given`` settings (the rest default), or open it
    (``queue_plans.plan_open``)."""
    plan = plan_open(client.keys, name, given, reopen)
    opened = await arun(client.redis, client.scripts, plan)
    return AsyncQueue(client, name, opened.settings, known=opened.handlers)
