"""Queues: jobs enqueued one at a time, on an elastic node set.

A queue is a long-lived task (``TaskSpec(mode="queue")``) whose stream stays open: a job is
one stream entry naming its own handler, and its record (``qw:task:{Q}:job:<id>``) says how
it is doing. Enqueueing is one round trip (one Lua call: the entry and the record); the
queue's members are already blocked on the stream, so a job starts in about one more. The
controller sizes the node set like any task's; the queue's leader asks for more nodes while
jobs wait and for ``min_nodes`` after ``idle_after`` seconds without work. Reclaim,
attempts, timeouts (``job_timeout``), dead letters and once-only accounting are the ones of
subtasks. A settled job leaves the stream; its record (result or error) expires
``result_ttl`` after it finished.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from types import FunctionType
from typing import Any

from queueworks import events
from queueworks.connection import text
from queueworks.keys import Keys, TaskKeys
from queueworks.messages import NotJSON, from_json, to_json
from queueworks.models import (
    JobState,
    JobStatus,
    QueueStatus,
    StoredSpec,
    TaskSpec,
    TaskState,
    TaskStatus,
    parse_handler_path,
)
from queueworks.records import Hash, job_status, new_task, queue_counts
from queueworks.scripts import EnqueueBatch, NewJob
from queueworks.tasks import Backend, Task

ENQUEUE_BATCH = 500  # jobs per Lua call in enqueue_many
ENQUEUE_PIPELINE = 8  # Lua calls per round trip
PATHS_KEPT = 1024  # handlers whose checked path a queue handle remembers


class Unset(Enum):
    UNSET = 0


UNSET = Unset.UNSET  # "as the queue has it" (or the default, when it is created)


class JobFailed(Exception):
    """The job is dead (or was cancelled): ``reason`` says why, ``traceback`` how."""

    def __init__(self, job_id: str, reason: str, traceback: str = "") -> None:
        super().__init__(f"job {job_id}: {reason}")
        self.job_id, self.reason, self.traceback = job_id, reason, traceback


def handler_path(handler: str | Callable[..., Any]) -> str:
    """``"module:function"`` for a path or a module-level function object."""
    if isinstance(handler, str):
        path = handler
    else:
        module, name = getattr(handler, "__module__", ""), getattr(handler, "__qualname__", "")
        if not module or module == "__main__" or "." in name or "<" in name:
            raise ValueError(
                f"handler {handler!r}: a worker can only import a module-level function of an "
                "importable module; give it as 'package.module:function'"
            )
        path = f"{module}:{name}"
    parse_handler_path(path)
    return path


class HandlerPaths:
    """``handler_path(handler)``, checked once per handler (a path or a function) that a
    queue handle is given: enqueueing checks it for every job."""

    def __init__(self) -> None:
        self._paths: dict[Any, str] = {}

    def __call__(self, handler: str | Callable[..., Any]) -> str:
        cacheable = isinstance(handler, str | FunctionType)
        path = self._paths.get(handler) if cacheable else None
        if path is None:
            path = handler_path(handler)
            if cacheable:
                if len(self._paths) >= PATHS_KEPT:
                    self._paths.clear()
                self._paths[handler] = path
        return path


def payload_json(payload: Any) -> str:
    try:
        return to_json(payload, "payload")
    except NotJSON as exc:
        raise ValueError(str(exc)) from None


def new_job_id() -> str:
    return os.urandom(10).hex()


def new_job_ids() -> Iterator[str]:
    """``new_job_id()`` after ``new_job_id()``, drawn from the OS a batch at a time."""
    while True:
        drawn = os.urandom(10 * ENQUEUE_BATCH).hex()
        for k in range(0, len(drawn), 20):
            yield drawn[k : k + 20]


@dataclass(frozen=True)
class QueueSettings:
    min_nodes: int
    max_nodes: int | None
    priority: int
    max_attempts: int
    job_timeout: float
    result_ttl: float
    idle_after: float
    node_selector: dict[str, str]

    def spec(self, name: str) -> TaskSpec:
        return TaskSpec(
            name=name,
            mode="queue",
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            priority=self.priority,
            max_attempts=self.max_attempts,
            subtask_timeout=self.job_timeout,
            result_ttl=self.result_ttl,
            node_selector=self.node_selector,
            options={"queue": {"idle_after": self.idle_after}},
        )

    @classmethod
    def of(cls, spec: TaskSpec) -> QueueSettings:
        return cls(
            min_nodes=spec.min_nodes,
            max_nodes=spec.max_nodes,
            priority=spec.priority,
            max_attempts=spec.max_attempts,
            job_timeout=spec.subtask_timeout,
            result_ttl=spec.result_ttl,
            idle_after=float(spec.options.get("queue", {}).get("idle_after", IDLE_AFTER)),
            node_selector=dict(spec.node_selector),
        )


IDLE_AFTER = 30.0  # s without a job before a queue asks for min_nodes only
DEFAULTS = QueueSettings(1, None, 0, 3, 60.0, 24 * 3600.0, IDLE_AFTER, {})


class Queue:
    """A handle to one queue: ``client.queue("emails")``."""

    def __init__(self, client: Backend, name: str, settings: QueueSettings) -> None:
        self.client, self.name, self.settings = client, name, settings
        self.keys = client.keys.task(name)
        self._known: set[str] = set()  # handlers this handle has told the queue about
        self._path = HandlerPaths()

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    @property
    def task(self) -> Task:
        """The queue as a task (``resize``, ``set_priority``, ``cancel`` stop it taking
        nodes for good)."""
        return Task(self.client, self.name)

    def job(self, job_id: str) -> Job:
        return Job(self, job_id)

    # -- enqueueing -----------------------------------------------------------------------

    def enqueue(
        self,
        handler: str | Callable[..., Any],
        payload: Any = None,
        *,
        delay: float | None = None,
        at: datetime | float | None = None,
    ) -> Job:
        """Add one job: ``handler`` (``"module:function"`` or the function) runs on
        ``payload`` (JSON). ``delay`` (s) or ``at`` (a datetime or Unix time): not before.
        One round trip."""
        job = new_job(self._path(handler), payload, delay, at)
        now = time.time()
        if job.handler in self._known:
            self.client.scripts.enqueue_jobs(self.keys, [job], now)
        else:
            pipe = self.client.redis.pipeline(transaction=False)
            tell_handlers(pipe, self.client.keys, self.keys, [job.handler])
            self.client.scripts.enqueue_jobs(self.keys, [job], now, client=pipe)
            pipe.execute()
            self._known.add(job.handler)
        return Job(self, job.id)

    def enqueue_many(self, jobs: Iterable[tuple[str | Callable[..., Any], Any]]) -> list[Job]:
        """Add many ``(handler, payload)`` jobs, in batches, pipelined; the next batch is
        built while Redis runs the one before. A bad job raises ``ValueError`` there: the
        batches sent before it are enqueued, the rest are not."""
        out: list[Job] = []
        scripts, ids, sender = self.client.scripts, new_job_ids(), _Sender()
        pipe = self.client.redis.pipeline(transaction=False)
        batch, calls = EnqueueBatch(self.keys), 0
        told: set[str] = set()  # handlers the pipelines tell the queue about
        try:
            for handler, payload in jobs:
                path = self._path(handler)
                if path not in self._known and path not in told:
                    tell_handlers(pipe, self.client.keys, self.keys, [path])
                    told.add(path)
                job_id = next(ids)
                batch.add(job_id, path, payload_json(payload))
                out.append(Job(self, job_id))
                if len(batch) >= ENQUEUE_BATCH:
                    scripts.enqueue_batch(batch, time.time(), client=pipe)
                    batch, calls = EnqueueBatch(self.keys), calls + 1
                    if calls >= ENQUEUE_PIPELINE:
                        sender.send(pipe)
                        pipe, calls = self.client.redis.pipeline(transaction=False), 0
            if len(batch):
                scripts.enqueue_batch(batch, time.time(), client=pipe)
            sender.wait()
            pipe.execute()
            self._known |= told
        finally:
            sender.close()
        return out

    # -- reading --------------------------------------------------------------------------

    def status(self) -> QueueStatus:
        task = self.task.status()
        pipe = self.client.redis.pipeline(transaction=False)
        queue_reads(pipe, self.keys)
        return queue_status(task, pipe.execute(raise_on_error=False), time.time())


class _Sender:
    """``enqueue_many``'s pipelines, executed one at a time on a thread of its own (started
    at the first of them, so a call of one pipeline starts none): Redis runs one batch while
    the caller builds the next. A failed pipeline raises at the next ``send`` or ``wait``."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.inflight: Future[Any] | None = None

    def send(self, pipe: Any) -> None:
        self.wait()
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="qw-enqueue-many")
        self.inflight = self.pool.submit(pipe.execute)

    def wait(self) -> None:
        inflight, self.inflight = self.inflight, None
        if inflight is not None:
            inflight.result()

    def close(self) -> None:
        """Let the pipeline in flight finish (a job sent is enqueued), stop the thread, and
        raise what that pipeline raised, if nobody waited for it."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.wait()


class Job:
    """A handle to one job of a queue."""

    def __init__(self, queue: Queue, job_id: str) -> None:
        self.queue, self.id = queue, job_id

    @property
    def key(self) -> str:
        return self.queue.keys.job(self.id)

    def __repr__(self) -> str:
        return f"Job({self.queue.name!r}, {self.id!r})"

    def status(self) -> JobStatus:
        r, qk = self.queue.client.redis, self.queue.keys
        raw: Any = r.hgetall(self.key)
        if not raw:
            raise no_job(self.queue.name, self.id)
        pending: Any = None
        entry = running_entry(raw)
        if entry:
            pending = r.xpending_range(qk.stream, qk.group, entry, entry, 1)
        return job_status(self.queue.name, self.id, raw, pending, time.time())

    def result(self, timeout: float | None = None) -> Any:
        """The job's result once it is done; ``JobFailed`` if it is dead or cancelled;
        ``TimeoutError`` after ``timeout`` s."""
        r = self.queue.client.redis
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = FIRST_PAUSE
        while True:
            reply = r.hmget(self.key, RESULT_FIELDS)
            done = finished(self.queue.name, self.id, reply)
            if done is not None:
                return done[0]
            if deadline is not None and time.monotonic() >= deadline:
                raise not_finished(self.id, reply, timeout)
            time.sleep(pause)
            pause = min(LAST_PAUSE, pause * 1.5)

    def cancel(self) -> bool:
        """Cancel the job if it has not started; False if it has started or finished."""
        q = self.queue
        now, ttl = time.time(), int(q.settings.result_ttl)
        return cancelled(q.name, self.id, q.client.scripts.cancel_job(q.keys, self.id, now, ttl))


# -- what Queue/Job and AsyncQueue/AsyncJob share: no I/O, or commands queued on a pipeline --

RESULT_FIELDS = ["s", "r", "reason", "err"]  # what ``result`` polls of a job's record
FIRST_PAUSE, LAST_PAUSE = 0.001, 0.05  # s between polls: growing by half from the first


def new_job(path: str, payload: Any, delay: float | None, at: datetime | float | None) -> NewJob:
    """A job to enqueue: a new id, its handler path (checked: ``HandlerPaths``) and payload
    JSON, and when it runs; ``ValueError`` naming what is wrong."""
    body = payload_json(payload)
    if delay is not None and at is not None:
        raise ValueError("enqueue: give delay or at, not both")
    run_at: float | None = None
    if delay is not None:
        if delay < 0:
            raise ValueError(f"enqueue: delay must be >= 0, got {delay}")
        run_at = time.time() + delay
    elif at is not None:
        run_at = at.timestamp() if isinstance(at, datetime) else float(at)
    return NewJob(new_job_id(), path, body, run_at if run_at and run_at > time.time() else None)


def tell_handlers(pipe: Any, keys: Keys, qk: TaskKeys, handlers: Sequence[str]) -> None:
    """Queue on ``pipe``: the queue learns which handlers its jobs name (the controller
    gives it only to workers that may run them all)."""
    pipe.sadd(qk.handlers, *handlers)
    events.emit(pipe, keys, "handlers", task=qk.task_id)


def queue_reads(pipe: Any, qk: TaskKeys) -> None:
    """Queue on ``pipe`` what ``queue_status`` reads beside the queue's task status."""
    pipe.hget(qk.record, "want")
    pipe.xlen(qk.stream)
    pipe.xpending(qk.stream, qk.group)
    pipe.zcard(qk.scheduled)
    pipe.hgetall(qk.rate)


def queue_status(task: TaskStatus, replies: Sequence[Any], now: float) -> QueueStatus:
    """A queue's status from its task's and the replies of ``queue_reads`` (errors as
    exceptions in them: a key of the wrong type counts nothing)."""
    want, length, pending, scheduled, rate = replies
    running = int(pending["pending"]) if isinstance(pending, dict) else 0
    backlog, rates = queue_counts(length, running, rate, now)
    return QueueStatus(
        name=task.id,
        state=task.state,
        backlog=backlog,
        scheduled=int(scheduled or 0) if not isinstance(scheduled, Exception) else 0,
        running=running,
        done=task.done,
        dead=task.dead,
        rejected=task.rejected,
        nodes=task.nodes,
        epoch=task.epoch,
        min_nodes=task.min_nodes,
        max_nodes=task.max_nodes,
        want=int(want) if want not in (None, b"") and not isinstance(want, Exception) else None,
        priority=task.priority,
        rates=rates,
        reason=task.reason,
    )


def no_job(queue: str, job_id: str) -> LookupError:
    return LookupError(f"queue {queue!r} has no job {job_id!r} (or it expired)")


def running_entry(raw: Mapping[bytes, bytes]) -> bytes | None:
    """The stream entry of a queued job, whose pending-list row says whether a member has
    read it (it runs); None for a job in any other state."""
    entry = raw.get(b"e")
    return entry if raw.get(b"s") == JobState.QUEUED.value.encode() and entry else None


def finished(queue: str, job_id: str, reply: Sequence[Any]) -> tuple[Any] | None:
    """From the ``RESULT_FIELDS`` of a job's record: ``(result,)`` of a done job; raises
    ``JobFailed`` for a dead or cancelled one, ``LookupError`` for none; None while it is
    not finished."""
    state, value, reason, error = reply
    if state is None:
        raise no_job(queue, job_id)
    s = text(state)
    if s == JobState.DONE:
        return (from_json(text(value), f"result of job {job_id}") if value else None,)
    if s == JobState.DEAD:
        raise JobFailed(job_id, text(reason) or "dead", text(error))
    if s == JobState.CANCELLED:
        raise JobFailed(job_id, "cancelled")
    return None


def not_finished(job_id: str, reply: Sequence[Any], timeout: float | None) -> TimeoutError:
    return TimeoutError(f"job {job_id} not finished after {timeout} s ({text(reply[0])})")


def cancelled(queue: str, job_id: str, found: int) -> bool:
    """What ``cancel_job`` said: True cancelled, False it had started or finished."""
    if found < 0:
        raise no_job(queue, job_id)
    return found == 1


def opened_settings(name: str, raw: Sequence[Any], given: Mapping[str, Any]) -> QueueSettings:
    """An existing queue's settings, from the HMGET of its record's ``spec`` and ``state``;
    ``ValueError`` if it is no queue, differs from ``given``, or has finished."""
    stored = StoredSpec.model_validate_json(raw[0])
    if stored.mode != "queue":
        raise ValueError(f"queue {name!r}: a task with that id exists (not a queue)")
    settings = QueueSettings.of(stored)
    differs = {k: v for k, v in given.items() if getattr(settings, k) != v}
    if differs:
        have = ", ".join(f"{k}={getattr(settings, k)!r}" for k in differs)
        raise ValueError(
            f"queue {name!r} exists with {have}; open it without those settings (its "
            "node set can change: q.task.resize, q.task.set_priority)"
        )
    if TaskState(text(raw[1])).finished:
        raise ValueError(f"queue {name!r} was {text(raw[1])}; it takes no jobs")
    return settings


def new_queue(name: str, given: Mapping[str, Any], now: float) -> tuple[QueueSettings, Hash]:
    """A queue to create: its settings (``given``, the rest the defaults) and record."""
    settings = QueueSettings(**{**DEFAULTS.__dict__, **given})
    return settings, new_task(settings.spec(name), 0, now)


def queue_created(pipe: Any, keys: Keys, name: str, now: float) -> None:
    """Queue on ``pipe`` what follows a new queue's record: the queue among the tasks to
    size, in the set of queues, and its ``submitted`` event."""
    pipe.zadd(keys.queue, {name: now}, nx=True)
    pipe.sadd(keys.queues, name)
    events.emit(pipe, keys, "submitted", task=name, name=name, total=0)


def check_created(replies: Sequence[Any]) -> None:
    """Raise the first error of a creation pipeline but BUSYGROUP (it existed: opened by a
    racing creator, which is as good)."""
    for reply in replies:
        if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
            raise reply


def open_queue(client: Backend, name: str, given: dict[str, Any]) -> Queue:
    """Create the queue ``name`` with ``given`` settings (the rest default), or open it;
    ``ValueError`` if it exists with other settings than ``given``."""
    r, tk = client.redis, client.keys.task(name)
    raw: Any = r.hmget(tk.record, ["spec", "state"])
    if raw[0] is not None:
        return Queue(client, name, opened_settings(name, raw, given))
    now = time.time()
    settings, record = new_queue(name, given, now)
    pipe = r.pipeline(transaction=False)
    pipe.xgroup_create(tk.stream, tk.group, id="0", mkstream=True)
    client.scripts.record_task(tk, [tk.stream], record, client=pipe)
    queue_created(pipe, client.keys, name, now)
    check_created(pipe.execute(raise_on_error=False))
    return Queue(client, name, settings)
