"""``ResultWatcher``: the ``await job.result()`` calls of one ``AsyncClient``, polled together.

``Job.result`` (sync) polls its job (``result_reads``: its record, and for a job to run now
whether its entry still waits): at once, then after 1 ms, the pause growing by half up to
50 ms. An asyncio service may have a thousand such calls at once; polled one by one, that
is 20,000 round trips a second and a whole core. Here every call keeps the sync schedule
(its first look, the job's record alone; then its entry and record),
but the jobs due for a look are read together, one pipeline per tick: a call's next look
is put on a grid of a quarter of its pause, so calls that started at different times share
their ticks (a lone call: looks within 25 % of the sync schedule).
What a call gets is what the sync one would: the result, ``JobFailed``, ``LookupError``, or
``TimeoutError`` after a look past its deadline. On a queue with ``wait_replicas``, an
outcome counts once it is on that many replicas (``queue_plans.plan_outcome_replicated``):
the calls that saw one in a tick share one more round trip, their barriers and a WAIT.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

from queueworks.errors import JobFailed
from queueworks.protocol.jobrecords import RESULT_FIELDS
from queueworks.protocol.keys import TaskKeys
from queueworks.queue.queues import FIRST_PAUSE, LAST_PAUSE, finished, not_finished, result_reads
from queueworks.queue.vanished import QUEUE_CHECK_SECONDS
from queueworks.transport.aio_connection import AsyncConnection
from queueworks.transport.replication import NO_WAIT, Replicas, barrier
from queueworks.transport.topology import queue_replication_wait

Outcome = tuple[Any, Exception | None]  # a call's result, or the error it raises
Held = list[tuple["_Wait", list[Any], Outcome]]  # outcomes read, to replicate first


@dataclass(eq=False)
class _Wait:
    queue: str
    keys: TaskKeys
    job_id: str
    deadline: float | None
    timeout: float | None
    done: asyncio.Future[Any]
    checked: float  # when its queue's record was last looked at (or the wait began)
    replicas: Replicas = NO_WAIT  # what its outcome waits for
    pause: float = FIRST_PAUSE
    check: bool = False  # this look reads whether the queue's record is there
    first: bool = True  # the first look reads the record alone (a settled job's: all)


class ResultWatcher:
    """Polls the records of the jobs that ``result()`` calls wait for, in shared pipelines.
    One task runs while some call waits; none otherwise."""

    def __init__(self, redis: AsyncConnection) -> None:
        self._redis = redis
        self._due: list[tuple[float, int, _Wait]] = []  # heap: next look, order, wait
        self._order = itertools.count()
        self._runner: asyncio.Task[None] | None = None
        self._alarm: asyncio.Future[None] | None = None

    async def result(
        self,
        queue: str,
        keys: TaskKeys,
        job_id: str,
        timeout: float | None,
        replicas: Replicas = NO_WAIT,
    ) -> Any:
        """The job's result (see ``Job.result``); its first look is at once. ``replicas``:
        the queue's ``wait_replicas`` and ``wait_timeout``."""
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        done = asyncio.get_running_loop().create_future()
        wait = _Wait(queue, keys, job_id, deadline, timeout, done, now, replicas)
        heapq.heappush(self._due, (now, next(self._order), wait))
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        elif self._alarm is not None and not self._alarm.done():
            self._alarm.set_result(None)  # a look due now: wake the runner
        return await wait.done

    async def _run(self) -> None:
        try:
            while self._due:
                now = time.monotonic()
                due = []
                while self._due and self._due[0][0] <= now:
                    wait = heapq.heappop(self._due)[2]
                    if not wait.done.done():  # a cancelled call is forgotten
                        due.append(wait)
                if due:
                    await self._look(due)
                elif self._due:
                    await self._sleep(self._due[0][0] - now)
        finally:
            self._runner = None
            for _, _, wait in self._due:  # only if this task itself was cancelled
                wait.done.cancel()
            self._due.clear()

    async def _look(self, due: list[_Wait]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        ends = []
        now = time.monotonic()
        for wait in due:
            if wait.first:  # the record alone: no entry, no check of the queue's record
                wait.check = False
                pipe.hmget(wait.keys.job(wait.job_id), RESULT_FIELDS)
            else:
                wait.check = now - wait.checked >= QUEUE_CHECK_SECONDS
                if wait.check:
                    wait.checked = now
                result_reads(pipe, wait.keys, wait.job_id, wait.check)
            ends.append(len(pipe))
        try:
            replies = await pipe.execute()
        except Exception as exc:  # as one call's reads failing: each call raises it
            for wait in due:
                _settle(wait.done, exc=exc)
            return
        now, start = time.monotonic(), 0
        held: Held = []
        for wait, end in zip(due, ends, strict=True):
            self._read(wait, replies[start:end], now, held)
            start = end
        if held:
            await self._replicate(held)

    async def _replicate(self, held: Held) -> None:
        """One round trip: each queue's barrier, then one WAIT for the most replicas any
        asks for; an outcome counts if enough acknowledged, else its call looks again."""
        wait_for = max((w.replicas for w, _, _ in held), key=lambda r: (r.replicas, r.timeout))
        pipe = self._redis.pipeline(transaction=False)
        synced = sorted({w.keys.synced: w.keys for w, _, _ in held}.items())
        for _, keys in synced:
            barrier(pipe, keys)
        start = len(pipe)
        queue_replication_wait(
            pipe, self._redis, [k for k, _ in synced], wait_for.replicas, wait_for.timeout_ms
        )
        try:
            replies = await pipe.execute()
            acked = min(int(a) for a in replies[start:])
        except Exception as exc:
            for wait, _, _ in held:
                _settle(wait.done, exc=exc)
            return
        now = time.monotonic()
        for wait, reply, (value, error) in held:
            if acked >= wait.replicas.replicas:
                _settle(wait.done, value=value, exc=error)
            else:
                self._again(wait, reply, now)

    def _read(
        self,
        wait: _Wait,
        reply: list[Any],
        now: float,
        held: Held,
    ) -> None:
        if wait.first:
            wait.first = False
            if reply[-1][0] is None:  # no outcome yet: look again at once, entry first
                heapq.heappush(self._due, (now, next(self._order), wait))
                return
        try:
            done = finished(wait.queue, wait.job_id, reply, wait.check)
        except JobFailed as exc:
            if wait.replicas.replicas:
                held.append((wait, reply, (None, exc)))
            else:
                _settle(wait.done, exc=exc)
            return
        except Exception as exc:  # LookupError, QueueGone, a result that is no JSON
            _settle(wait.done, exc=exc)
            return
        if done is not None:
            if wait.replicas.replicas:
                held.append((wait, reply, (done[0], None)))
            else:
                _settle(wait.done, value=done[0])
        else:
            self._again(wait, reply, now)

    def _again(self, wait: _Wait, reply: list[Any], now: float) -> None:
        """Not finished (or not replicated yet): a look later, or ``TimeoutError``."""
        if wait.deadline is not None and now >= wait.deadline:
            _settle(wait.done, exc=not_finished(wait.job_id, reply, wait.timeout))
        else:
            grid = wait.pause / 4
            at = math.ceil((now + wait.pause) / grid) * grid
            wait.pause = min(LAST_PAUSE, wait.pause * 1.5)
            heapq.heappush(self._due, (at, next(self._order), wait))

    async def _sleep(self, seconds: float) -> None:
        """Until ``seconds`` have passed or a call wants a look now."""
        loop = asyncio.get_running_loop()
        alarm = self._alarm = loop.create_future()
        timer = loop.call_later(max(0.0, seconds), _settle, alarm)
        try:
            await alarm
        finally:
            timer.cancel()
            self._alarm = None


def _settle(
    future: asyncio.Future[Any], value: Any = None, exc: BaseException | None = None
) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(value)
    else:
        future.set_exception(exc)
