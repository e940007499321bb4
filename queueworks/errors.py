"""Every public exception of queueworks, in one place: each is a ``QueueworksError`` and
keeps the built-in base it always had (``ValueError`` for bad input, ``LookupError`` for
what is not there, ``TimeoutError``, ``RuntimeError``), so ``except ValueError`` still
catches what it caught. ``RedisUnavailable`` is a ``redis.ConnectionError`` too: every loop
that retries on those retries on it.

Not here, on purpose: the handler's contract in ``queueworks.context``. ``Stopped``,
``Fenced`` and ``Cancelled`` are ``BaseException``s (as ``asyncio.CancelledError`` is) so
that a handler's ``except Exception`` cannot swallow a stop, and ``Suspended`` is what a
handler raises to give its job back; they are signals between the worker and a handler,
not errors a caller handles. Nothing here imports the rest of queueworks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from pydantic import ValidationError

# as eviction.NOEVICTION (that module reads the servers' policies; this one does no I/O)
NOEVICTION = "noeviction"


class QueueworksError(Exception):
    """The base of every public queueworks exception."""


class JobFailed(QueueworksError):
    """The job is dead (or was cancelled): ``reason`` says why, ``traceback`` how. The
    message is the reason and the traceback's last line (the last error's type and
    message: ``job J: failed 3 times: KeyError: 'to'``), as ``queueworks`` prints it."""

    def __init__(self, job_id: str, reason: str, traceback: str = "") -> None:
        error = last_line(traceback)
        said = f"{reason}: {error}" if error and error != reason else reason
        super().__init__(f"job {job_id}: {said}")
        self.job_id, self.reason, self.traceback = job_id, reason, traceback
        self.summary = said  # the message without the job's id


class NotFinished(QueueworksError, TimeoutError):
    """A job's result was waited for ``timeout`` s: the message says the job's state (and
    why it waits, where its status says), as the last look read it."""


class SubmitError(QueueworksError, ValueError):
    """A task that cannot be submitted; the message names the field or subtask."""


class TaskNotFound(QueueworksError, LookupError):
    pass


class QueueNotFound(TaskNotFound):
    """The queue is gone and its handle cannot create it again (it was cancelled, or the
    handle does not know its settings); the message says which."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class RedisUnavailable(QueueworksError, redis.ConnectionError):
    """No connection to Redis could be made: one line naming the server (its URL, the
    password masked) and why. A ``redis.ConnectionError``: whatever catches those (every
    loop of the processes) catches it too."""


class BadUrl(QueueworksError, ValueError):
    """A URL we refuse; the message never contains the credentials."""


class EvictingRedis(QueueworksError, RuntimeError):
    """The Redis server (a node of it) may evict keys: queueworks would lose work silently.
    ``policy`` and ``node`` say which."""

    def __init__(self, node: str, policy: str, override: str) -> None:
        super().__init__(
            f"Redis at {node} has maxmemory-policy {policy}: it can evict queueworks' keys "
            f"(jobs, heartbeats, results) silently; set maxmemory-policy {NOEVICTION}, "
            f"or {override}"
        )
        self.node, self.policy = node, policy


class BadArguments(QueueworksError, ValueError):
    """Arguments that do not fit a job function's signature: the message names each
    parameter that is wrong (``errors``: pydantic's list), on one line."""

    def __init__(self, name: str, error: ValidationError) -> None:
        self.errors = error.errors(include_url=False)
        said = "; ".join(_said(e) for e in self.errors)
        super().__init__(f"{name}(): {said}")


class AdminError(QueueworksError, ValueError):
    """An operator action that cannot be done; the message says why."""


class NoServerBinary(QueueworksError, RuntimeError):
    """No Redis-compatible server program to start: none installed, nor the ``server``
    extra's (the message says how to get one)."""


class NotReplicated(QueueworksError, RuntimeError):
    """Written to the primary, but fewer than ``wanted`` replicas acknowledged it within
    ``timeout`` s: a failover now could lose it. For ``submit(wait_replicas=n)``: ``task``
    is the task's handle. For a queue's enqueue: ``jobs`` are the handles of the jobs
    written (queued on the primary), ``job_ids`` their ids; ``task`` is None."""

    def __init__(
        self,
        task: Any = None,
        acked: int = 0,
        wanted: int = 0,
        timeout: float = 0.0,
        *,
        jobs: Sequence[Any] = (),
        queue: str | None = None,
    ) -> None:
        self.task, self.acked, self.wanted, self.timeout = task, acked, wanted, timeout
        self.jobs = list(jobs)
        self.job_ids: list[str] = [job.id for job in self.jobs]
        self.queue = queue
        super().__init__(self._message())

    def _message(self) -> str:
        if self.task is not None or not self.jobs:
            what, it = f"task {getattr(self.task, 'id', None)}", "it"
        elif len(self.job_ids) == 1:
            what, it = f"job {self.job_ids[0]} of queue {self.queue}", "it"
        else:
            shown = ", ".join(self.job_ids[:5]) + (", ..." if len(self.job_ids) > 5 else "")
            what = f"{len(self.job_ids)} jobs of queue {self.queue} ({shown})"
            it = "them"
        verb = "is" if it == "it" else "are"
        return (
            f"{what} {verb} written but only {self.acked} of {self.wanted} replica(s) "
            f"acknowledged {it} within {self.timeout} s: a failover now could lose {it}"
        )


class TargetTaskFailed(QueueworksError, RuntimeError):
    """The target task ended ``failed``; the message is its dead-letter summary."""


class TargetTaskCancelled(QueueworksError, RuntimeError):
    """The target task was cancelled (through its RQ job, or from queueworks)."""


class StepAborted(QueueworksError):
    """The step, or forming the group, did not complete on this member: a peer vanished, a
    collective timed out, or the node set changed. No attempt of the shard is spent."""


class NotJSON(QueueworksError, ValueError):
    """A payload or result that JSON cannot carry."""


def last_line(error: str) -> str:
    """The last line of a traceback (its error's type and message), at most 300 characters."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _said(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    given = "" if error["type"] == "missing" else f" (given {error['input']!r:.80})"
    return f"{where}: {error['msg']}{given}"
