"""What a handler sees: ``SubtaskContext`` (a task's subtask), ``JobContext`` (a queue's job),
the ``Suspended`` signal for long steps, and ``Stopped`` for a job its worker stopped."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

from queueworks.protocol.models import Role


class Suspended(Exception):
    """Raised by ``ctx.checkpoint()`` when the node set changed: the subtask goes back for
    redelivery without spending an attempt."""


class Stopped(BaseException):
    """Raised by ``ctx.checkpoint()`` in a job its worker has stopped while it ran: the job is
    no longer this worker's to finish, and nothing its handler returns or raises from now on
    is recorded. A ``BaseException``, so a handler's ``except Exception`` lets it through:
    let it end the handler (clean up in ``finally``)."""


class Fenced(Stopped):
    """The job's worker was fenced: it stopped answering for longer than its heartbeat's TTL
    (frozen, cut off), was pruned, and the job was given to another member, which runs it
    again (same group slot)."""


class Cancelled(Stopped):
    """The job was cancelled while it ran (``job.cancel()``): it is recorded cancelled and
    never runs again; let it end the handler."""


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


PROGRESS_SECONDS = 0.1  # a job's progress is written at most this often
PROGRESS_MESSAGE_MAX = 1000  # characters

Report = tuple[float, str | None]  # a progress report: fraction, message


def checked_progress(fraction: Any, message: Any) -> Report:
    """A progress report as written; ``ValueError`` naming what is wrong with it."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"progress fraction must be a number from 0 to 1, not {fraction!r}")
    value = float(fraction)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"progress fraction must be a number from 0 to 1, not {fraction!r}")
    if message is not None and not isinstance(message, str):
        raise ValueError(f"progress message must be a str or None, not {type(message).__name__}")
    if message is not None and len(message) > PROGRESS_MESSAGE_MAX:
        raise ValueError(
            f"progress message has {len(message)} characters; at most {PROGRESS_MESSAGE_MAX}"
        )
    return value, message


class ProgressSink(Protocol):
    """Where a job's progress goes: the worker's writer (``workers.progress``), which
    coalesces a job's reports (``PROGRESS_SECONDS``) and writes the last one within that
    time, and at the latest when the call ends (``end``)."""

    def start(self, job_id: str, named: bool) -> Any: ...  # a job's first report: its state
    def report(self, job: Any, report: Report) -> None: ...
    def end(self, job: Any) -> None: ...


@dataclass
class JobContext:
    """Passed to a queue's job handlers that take a second parameter."""

    queue: str
    job_id: str
    attempt: int
    role: Role
    worker_id: str
    log: Any
    allow: tuple[str, ...] = ()  # the worker's --allow prefixes (a handler that imports more)
    _suspend: threading.Event = field(default_factory=threading.Event, repr=False)
    _sink: ProgressSink | None = field(default=None, repr=False)
    _named: bool = field(default=False, repr=False)  # its entry names it ('j')
    _reports: Any = field(default=None, repr=False)  # the sink's state of it, once it reported
    _over: bool = field(default=False, repr=False)  # the call ended: reports go nowhere
    _stopped: Stopped | None = field(default=None, repr=False)  # why its worker stopped it

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the job is: ``fraction`` from 0 to 1 and an optional ``message``
        (at most 1,000 characters), seen in ``job.status().progress`` and
        ``.progress_message``, ``queueworks info`` and the dashboard. Each report replaces
        the last one, message included. A job's reports are written at most every 0.1 s
        (the last one always, within 0.1 s and before the job settles); ``ValueError`` for
        a fraction or message out of range."""
        report = checked_progress(fraction, message)
        sink = self._sink
        if sink is None or self._over:
            return
        if self._reports is None:
            self._reports = sink.start(self.job_id, self._named)
        sink.report(self._reports, report)

    @property
    def suspended(self) -> bool:
        """True once the job should stop at a safe point (``checkpoint`` raises then)."""
        return self._stopped is not None or self._suspend.is_set()

    def checkpoint(self) -> SafePoint:
        """Raise ``Stopped`` if the worker stopped the job (it is no longer this worker's),
        ``Suspended`` if it should stop now (it runs again, same attempt); ``await
        ctx.checkpoint()`` in an ``async def`` handler."""
        stopped = self._stopped
        if stopped is not None:
            raise stopped.with_traceback(None)
        if self._suspend.is_set():
            raise Suspended()
        return _GO_ON

    def stop(self, reason: Stopped) -> None:
        """The worker's word: the job is stopped for ``reason`` (raised by the next
        ``checkpoint``); its progress reports go nowhere from now on."""
        self._stopped = reason
        self._over = True


def call_ended(ctx: JobContext) -> None:
    """A job's handler call ended (the worker's word, before the job settles): its last
    progress report is written if it was not yet; a report after this (from a call
    abandoned at its timeout, whose job runs again) goes nowhere."""
    ctx._over = True
    if ctx._reports is not None and ctx._sink is not None:
        ctx._sink.end(ctx._reports)
