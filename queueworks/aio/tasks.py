"""``AsyncTask``: ``queueworks.tasks.Task`` on ``redis.asyncio``, name for name; what it
reads is decoded by the functions ``Task`` uses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from queueworks import events
from queueworks.aio.connection import AsyncConnection
from queueworks.aio.results import ResultWatcher
from queueworks.connection import text
from queueworks.keys import Keys
from queueworks.messages import from_json
from queueworks.models import DeadLetter, NodeInfo, TaskState, TaskStatus
from queueworks.records import task_fields
from queueworks.scripts import AsyncScripts
from queueworks.tasks import (
    TaskNotFound,
    dead_letter,
    finished_task,
    node_infos,
    node_reads,
    resize_fields,
    still_running,
)
from queueworks.validate import check_priority


class AsyncBackend(Protocol):
    """What async task and queue handles use of their client."""

    redis: AsyncConnection
    keys: Keys
    scripts: AsyncScripts
    results: ResultWatcher

    async def check_eviction(self) -> None:
        """Before a write: ``EvictingRedis`` if the server may evict (once per client)."""


class AsyncTask:
    """A handle to one submitted task: ``await task.status()``, ``await task.wait()``,
    ``async for index, value in task.results()``."""

    def __init__(self, client: AsyncBackend, task_id: str) -> None:
        self.client = client
        self.id = task_id
        self.keys = client.keys.task(task_id)

    def __repr__(self) -> str:
        return f"AsyncTask({self.id!r})"

    async def status(self, *, with_nodes: bool = True) -> TaskStatus:
        raw: Any = await self.client.redis.hgetall(self.keys.record)
        if not raw:
            raise TaskNotFound(self.id)
        nodes = await self._nodes() if with_nodes else []
        return TaskStatus(**task_fields(self.id, raw), nodes=nodes)

    async def _nodes(self) -> list[NodeInfo]:
        r = self.client.redis
        members: Any = await r.zrange(self.keys.members, 0, -1, withscores=True)
        if not members:
            return []
        pipe = r.pipeline(transaction=False)
        node_reads(pipe, self.client.keys, self.keys, members)
        return node_infos(members, await pipe.execute(), time.time())

    async def wait(self, timeout: float | None = None, poll: float = 0.1) -> TaskStatus:
        """Wait until the task is finished; ``TimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = await self.status(with_nodes=False)
            if status.finished:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise still_running(status, timeout)
            await asyncio.sleep(poll)

    async def results(self) -> AsyncIterator[tuple[int, Any]]:
        """``(index, result)`` for every subtask that succeeded, in no particular order."""
        async for index, value in self.client.redis.hscan_iter(self.keys.results, count=1000):
            yield int(text(index)), from_json(text(value), f"result {text(index)!r}")

    async def dead_letters(self, count: int = 1000) -> list[DeadLetter]:
        entries: Any = await self.client.redis.xrange(self.keys.dead, count=count)
        return [dead_letter(entry_id, raw) for entry_id, raw in entries]

    async def cancel(self) -> bool:
        """Cancel the task: its nodes are released at once. False if it had finished."""
        await self.client.check_eviction()
        scripts = self.client.scripts
        changed = await scripts.set_state(self.keys, TaskState.CANCELLED, time.time())
        if changed:
            await events.emit_async(self.client.redis, self.client.keys, "cancelled", task=self.id)
        return changed

    async def set_priority(self, priority: int) -> None:
        await self._change(priority=check_priority(priority))

    async def resize(self, min_nodes: int, max_nodes: int | None) -> None:
        await self._change(**resize_fields(min_nodes, max_nodes))

    async def _change(self, **fields: object) -> None:
        if (await self.status(with_nodes=False)).finished:
            raise finished_task(self.id)
        await self.client.check_eviction()
        pipe = self.client.redis.pipeline(transaction=False)
        pipe.hset(self.keys.record, mapping=fields)  # type: ignore[arg-type]
        events.emit(pipe, self.client.keys, "changed", task=self.id, **fields)
        await pipe.execute()
