"""``AsyncTask``: ``queueworks.task.tasks.Task`` on ``redis.asyncio``, name for name: it runs
the plans ``Task`` runs (``queueworks.task.tasks``) with the asyncio runner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeVar

from queueworks.client.aio_results import ResultWatcher
from queueworks.errors import TaskNotFound
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import from_json, text
from queueworks.protocol.models import DeadLetter, NodeInfo, TaskStatus
from queueworks.protocol.validate import check_priority
from queueworks.scripts.bound import AsyncScripts
from queueworks.task.tasks import (
    plan_cancel,
    plan_change,
    plan_dead_letters,
    plan_nodes,
    plan_status,
    plan_wait,
    resize_fields,
)
from queueworks.transport.aio_connection import AsyncConnection
from queueworks.transport.aio_runner import arun
from queueworks.transport.plans import Plan

T = TypeVar("T")


class AsyncLine(Protocol):
    """Where a client sends a command of pre-built bytes (``queueworks.transport.aio_wire``)."""

    async def call(self, packed: bytes) -> Any:
        """The command's raw reply."""


class AsyncBackend(Protocol):
    """What async task and queue handles use of their client."""

    redis: AsyncConnection
    keys: Keys
    scripts: AsyncScripts
    results: ResultWatcher

    @property
    def line(self) -> AsyncLine | None:
        """For commands of pre-built bytes (None: a cluster's client)."""

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

    async def _run(self, plan: Plan[T]) -> T:
        return await arun(self.client.redis, self.client.scripts, plan)

    async def status(self, *, with_nodes: bool = True) -> TaskStatus:
        return await self._run(plan_status(self.client.keys, self.keys, with_nodes))

    async def nodes(self) -> list[NodeInfo]:
        """``Task.nodes``: the node set now."""
        return await self._run(plan_nodes(self.client.keys, self.keys))

    async def wait(self, timeout: float | None = None, poll: float = 0.1) -> TaskStatus:
        """Wait until the task is finished; ``TimeoutError`` after ``timeout`` s."""
        return await self._run(plan_wait(self.client.keys, self.keys, timeout, poll))

    async def results(self) -> AsyncIterator[tuple[int, Any]]:
        """``(index, result)`` for every subtask that succeeded, in no particular order;
        ``TaskNotFound`` if there are none because the task is gone (it expired, or Redis
        lost it)."""
        none = True
        async for index, value in self.client.redis.hscan_iter(self.keys.results, count=1000):
            none = False
            yield int(text(index)), from_json(text(value), f"result {text(index)!r}")
        if none and not await self.client.redis.exists(self.keys.record):
            raise TaskNotFound(self.id)

    async def dead_letters(self, count: int = 1000) -> list[DeadLetter]:
        return await self._run(plan_dead_letters(self.keys, count))

    async def cancel(self) -> bool:
        """Cancel the task: its nodes are released at once. False if it had finished."""
        await self.client.check_eviction()
        return await self._run(plan_cancel(self.client.keys, self.keys))

    async def set_priority(self, priority: int) -> None:
        await self._change(priority=check_priority(priority))

    async def resize(self, min_nodes: int, max_nodes: int | None) -> None:
        await self._change(**resize_fields(min_nodes, max_nodes))

    async def _change(self, **fields: object) -> None:
        await self.client.check_eviction()
        await self._run(plan_change(self.client.keys, self.keys, fields))
