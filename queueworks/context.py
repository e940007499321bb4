"""What a handler sees: ``SubtaskContext`` (a task's subtask), ``JobContext`` (a queue's job),
and the ``Suspended`` signal for long steps."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from queueworks.models import Role


class Suspended(Exception):
    """Raised by ``ctx.checkpoint()`` when the node set changed: the subtask goes back for
    redelivery without spending an attempt."""


class SafePoint:
    """What ``checkpoint()`` returns when the work may go on: nothing to do in a plain
    handler; awaited in an ``async def`` handler (``await ctx.checkpoint()``), it also lets
    the event loop run the other jobs in flight once."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield  # a bare yield: the event loop runs others, then resumes us (as sleep(0))


_GO_ON = SafePoint()


@dataclass
class SubtaskContext:
    """Passed to handlers that take a second parameter."""

    task_id: str
    index: int
    attempt: int
    role: Role
    worker_id: str
    log: Any
    key: str | None = None
    _suspend: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def suspended(self) -> bool:
        """True once the node set changed (or the worker is stopping): stop at a safe point."""
        return self._suspend.is_set()

    def checkpoint(self) -> SafePoint:
        """Raise ``Suspended`` if the step should stop now; call it between chunks of work
        (``await ctx.checkpoint()`` in an ``async def`` handler)."""
        if self._suspend.is_set():
            raise Suspended()
        return _GO_ON


def on_rebalance(hook: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for a handler that keeps state across subtasks:
    ``@on_rebalance(fn)`` makes the worker call ``fn(old_role, new_role)`` on every re-rank
    (``old_role`` is None on joining)."""

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        handler.on_rebalance = hook  # type: ignore[attr-defined]
        return handler

    return wrap


@dataclass
class JobContext:
    """Passed to a queue's job handlers that take a second parameter."""

    queue: str
    job_id: str
    attempt: int
    role: Role
    worker_id: str
    log: Any
    _suspend: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def suspended(self) -> bool:
        """True once the node set changed (or the worker is stopping): stop at a safe point."""
        return self._suspend.is_set()

    def checkpoint(self) -> SafePoint:
        """Raise ``Suspended`` if the job should stop now (it runs again, same attempt);
        ``await ctx.checkpoint()`` in an ``async def`` handler."""
        if self._suspend.is_set():
            raise Suspended()
        return _GO_ON
