"""Queues: jobs enqueued one at a time, on an elastic node set.

A queue is a long-lived task (``TaskSpec(mode="queue")``) whose stream stays open: a job is
one stream entry naming its own handler. A job to run now is its entry alone until it
settles (its id is the entry's), so enqueueing it is one ``XADD``; its record
(``qw:task:{Q}:job:<id>``) is written when it settles (a delayed job has one from the start:
it holds the payload until the job is due). The queue's members are already blocked on the
stream, so a job starts in about one more round trip. The
controller sizes the node set like any task's; the queue's leader asks for more nodes while
jobs wait and for ``min_nodes`` after ``idle_after`` seconds without work. Reclaim,
attempts, timeouts (``job_timeout``), dead letters and once-only accounting are the ones of
subtasks. A settled job leaves the stream; its record (result or error) expires
``result_ttl`` after it finished.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from enum import Enum
from types import FunctionType
from typing import Any

import redis

from queueworks import events
from queueworks.connection import one_command, text
from queueworks.keys import Keys, TaskKeys
from queueworks.messages import NotJSON, from_json, to_json
from queueworks.models import (
    JobState,
    JobStatus,
    QueueStatus,
    StoredSpec,
    TaskState,
    TaskStatus,
    parse_handler_path,
)
from queueworks.queue_settings import QueueSettings
from queueworks.records import Hash, job_status, new_task, queue_counts
from queueworks.scripts import EnqueueBatch, NewJob, job_ids
from queueworks.tasks import Backend, Task, TaskNotFound
from queueworks.validate import run_at
from queueworks.vanished import (
    QUEUE_CHECK_SECONDS,
    QueueGone,
    lost,
    no_group,
    record_gone,
)

ENQUEUE_BATCH = 500  # jobs per Lua call in enqueue_many
ENQUEUE_PIPELINE = 8  # Lua calls per round trip
PATHS_KEPT = 1024  # handlers whose checked path a queue handle remembers
ENTRY_ID = re.compile(r"^\d{1,19}-\d{1,19}$")  # a stream entry's id: a job to run now's


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
    """A delayed job's id (a job to run now has its stream entry's)."""
    return os.urandom(10).hex()


class Queue:
    """A handle to one queue: ``client.queue("emails")``. It carries the queue's settings:
    if the queue is gone from Redis it creates it again with them (``queueworks.vanished``)
    — unless ``revives`` is false (a listing's handle, which does not know them)."""

    def __init__(
        self, client: Backend, name: str, settings: QueueSettings, *, revives: bool = True
    ) -> None:
        self.client, self.name, self.settings = client, name, settings
        self.revives = revives
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
        if job.at is None and job.handler in self._known:  # nothing written if it is gone
            reply = one_command(self.client.redis, *xadd_now(self.keys, job, time.time()))
            if reply is not None:
                return Job(self, text(reply))
            self._revive()
        reply = self._write(job)
        if reply is None:  # the queue is gone: made again, and the job written there
            self._revive()
            reply = self._write(job)
        return Job(self, enqueued(self.name, reply)[0])

    def _write(self, job: NewJob) -> Any:
        """One job by ``enqueue_jobs`` (with its handler, if the handle has not told the
        queue yet); the script's reply (nil: the queue's stream is gone)."""
        scripts, now = self.client.scripts, time.time()
        if job.handler in self._known:
            return scripts.enqueue_jobs(self.keys, [job], now)
        pipe = self.client.redis.pipeline(transaction=False)
        tell_handlers(pipe, self.client.keys, self.keys, [job.handler])
        called = scripts.enqueue_jobs(self.keys, [job], now, client=pipe)
        replies = pipe.execute()
        self._known.add(job.handler)
        return replies[-1] if called is pipe else called

    def _revive(self, also: Iterable[str] = ()) -> None:
        """The queue is gone (or its stream): make it again with this handle's settings, and
        tell it the handlers this handle knows (and ``also``); ``QueueNotFound`` if it was
        cancelled."""
        r = self.client.redis
        if record_gone(self.name, r.hget(self.keys.record, "state"), self.revives):
            open_queue(self.client, self.name, self.settings.given())
        pipe = r.pipeline(transaction=False)
        pipe.xgroup_create(self.keys.stream, self.keys.group, id="0", mkstream=True)
        if self._known or also:
            tell_handlers(pipe, self.client.keys, self.keys, sorted({*self._known, *also}))
        check_created(pipe.execute(raise_on_error=False))

    def _resend(self, batch: EnqueueBatch, told: set[str]) -> Any:
        """A batch of ``enqueue_many`` that found the queue gone, once it is made again."""
        self._revive(told)
        return self.client.scripts.enqueue_batch(batch, time.time())

    def enqueue_many(self, jobs: Iterable[tuple[str | Callable[..., Any], Any]]) -> list[Job]:
        """Add many ``(handler, payload)`` jobs, in batches, pipelined; the next batch is
        built while Redis runs the one before. A bad job raises ``ValueError`` there: the
        batches sent before it are enqueued, the rest are not."""
        scripts, sender = self.client.scripts, _Sender()
        pipe = self.client.redis.pipeline(transaction=False)
        batch, calls = EnqueueBatch(self.keys), 0
        told: set[str] = set()  # handlers the pipelines tell the queue about
        ids = Replies(self.name, lambda gone: self._resend(gone, told))
        try:
            for handler, payload in jobs:
                path = self._path(handler)
                if path not in self._known and path not in told:
                    tell_handlers(pipe, self.client.keys, self.keys, [path])
                    told.add(path)
                batch.add(path, payload_json(payload))
                if len(batch) >= ENQUEUE_BATCH:
                    ids.add(pipe, scripts.enqueue_batch(batch, time.time(), client=pipe), batch)
                    batch, calls = EnqueueBatch(self.keys), calls + 1
                    if calls >= ENQUEUE_PIPELINE:
                        ids.read(sender.wait())
                        sender.send(pipe)
                        ids.sent()
                        pipe, calls = self.client.redis.pipeline(transaction=False), 0
            if len(batch):
                ids.add(pipe, scripts.enqueue_batch(batch, time.time(), client=pipe), batch)
            ids.read(sender.wait())
            ids.sent()
            ids.read(pipe.execute())
            self._known |= told
        finally:
            sender.close()
        return [Job(self, job_id) for job_id in ids.ids]

    # -- reading --------------------------------------------------------------------------

    def status(self) -> QueueStatus:
        try:
            task = self.task.status()
        except TaskNotFound:
            self._revive()
            task = self.task.status()
        pipe = self.client.redis.pipeline(transaction=False)
        queue_reads(pipe, self.keys)
        return queue_status(task, pipe.execute(raise_on_error=False), time.time())


class _Sender:
    """``enqueue_many``'s pipelines, executed one at a time on a thread of its own (started
    at the first of them, so a call of one pipeline starts none): Redis runs one batch while
    the caller builds the next. ``wait`` returns the replies of the one sent (None if none
    was), or raises what it raised."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.inflight: Future[Any] | None = None

    def send(self, pipe: Any) -> None:
        """Execute ``pipe`` (after a ``wait`` for the one before it)."""
        assert self.inflight is None
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="qw-enqueue-many")
        self.inflight = self.pool.submit(pipe.execute)

    def wait(self) -> list[Any] | None:
        inflight, self.inflight = self.inflight, None
        return None if inflight is None else list(inflight.result())

    def close(self) -> None:
        """Let the pipeline in flight finish (a job sent is enqueued), stop the thread, and
        raise what that pipeline raised, if nobody waited for it."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.wait()


class Replies:
    """The job ids of ``enqueue_many``'s Lua calls, in order. A call queued on a pipeline
    is read once its pipeline ran (its batch kept until then: two pipelines' worth at most);
    a call that found the queue gone (nil) is sent again by ``resend``, which makes the
    queue again first, before the next pipeline goes."""

    def __init__(self, queue: str, resend: Callable[[EnqueueBatch], Any]) -> None:
        self.queue, self.resend = queue, resend
        self.ids: list[str] = []
        self.building: list[tuple[int, EnqueueBatch]] = []  # on the pipeline being built
        self.sending: list[tuple[int, EnqueueBatch]] = []  # on the pipeline sent

    def add(self, pipe: Any, reply: Any, batch: EnqueueBatch) -> None:
        if reply is pipe:  # queued on it: its reply comes with the pipeline's
            self.building.append((len(pipe) - 1, batch))
        else:  # run at once (a cluster pipeline)
            self.take(reply, batch)

    def sent(self) -> None:
        self.sending, self.building = self.building, []

    def read(self, replies: Sequence[Any] | None) -> None:
        """The replies of the pipeline sent (None: there was none)."""
        if replies is not None:
            for position, batch in self.sending:
                self.take(replies[position], batch)
            self.sending = []

    def take(self, reply: Any, batch: EnqueueBatch) -> None:
        if reply is None:
            reply = self.resend(batch)
        self.ids += enqueued(self.queue, reply)


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
        replies = self._status_reads()
        if any(no_group(reply) for reply in replies):  # the queue's stream or group is gone
            self.queue._revive()
            replies = self._status_reads()
        qk = self.queue.keys
        raw, pending, where = read_status(qk, self.id, replies)
        if where:
            stream, entry = where
            pending = self.queue.client.redis.xpending_range(stream, qk.group, entry, entry, 1)
        return job_status(self.queue.name, self.id, raw, pending, time.time())

    def _status_reads(self) -> list[Any]:
        pipe = self.queue.client.redis.pipeline(transaction=False)
        status_reads(pipe, self.queue.keys, self.id)
        return list(pipe.execute(raise_on_error=False))

    def result(self, timeout: float | None = None) -> Any:
        """The job's result once it is done; ``JobFailed`` if it is dead or cancelled;
        ``TimeoutError`` after ``timeout`` s."""
        r, qk = self.queue.client.redis, self.queue.keys
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, checked = FIRST_PAUSE, time.monotonic()
        while True:
            check = time.monotonic() - checked >= QUEUE_CHECK_SECONDS
            pipe = r.pipeline(transaction=False)
            result_reads(pipe, qk, self.id, check)
            replies = pipe.execute()
            try:
                done = finished(self.queue.name, self.id, replies, check)
            except QueueGone:
                self.queue._revive()  # its entry runs once its group is there again
                done = None
            if done is not None:
                return done[0]
            if deadline is not None and time.monotonic() >= deadline:
                raise not_finished(self.id, replies, timeout)
            if check:
                checked = time.monotonic()
            time.sleep(pause)
            pause = min(LAST_PAUSE, pause * 1.5)

    def cancel(self) -> bool:
        """Cancel the job if it has not started; False if it has started or finished."""
        q = self.queue
        now, ttl = time.time(), int(q.settings.result_ttl)
        try:
            found = q.client.scripts.cancel_job(q.keys, self.id, now, ttl)
        except redis.ResponseError as exc:
            if not no_group(exc):
                raise
            q._revive()
            found = q.client.scripts.cancel_job(q.keys, self.id, now, ttl)
        for _ in range(CANCEL_TRIES):  # set aside: it waits on its handler's stream
            if not isinstance(found, str):
                break
            found = q.client.scripts.cancel_job(q.keys, self.id, now, ttl, aside=found)
        if found == CANCELLED_LAST:
            events.emit(q.client.redis, q.client.keys, "handlers", task=q.name)
        return cancelled(q.name, self.id, found)


# -- what Queue/Job and AsyncQueue/AsyncJob share: no I/O, or commands queued on a pipeline --

RESULT_FIELDS = ["s", "r", "reason", "err"]  # what ``result`` polls of a job's record
CANCEL_TRIES = 2  # cancel_job calls after the first: a job moves at most once (set aside)
CANCELLED_LAST = 2  # cancel_job: cancelled, the last job set aside of its handler
FIRST_PAUSE, LAST_PAUSE = 0.001, 0.05  # s between polls: growing by half from the first


def new_job(path: str, payload: Any, delay: float | None, at: datetime | float | None) -> NewJob:
    """A job to enqueue: its handler path (checked: ``HandlerPaths``) and payload JSON, and
    when it runs, with a new id if that is later; ``ValueError`` naming what is wrong."""
    body = payload_json(payload)
    if delay is None and at is None:
        return NewJob("", path, body)  # to run now: its id will be its entry's
    now = time.time()
    when = run_at(delay, at, now)
    if when <= now:
        return NewJob("", path, body)
    return NewJob(new_job_id(), path, body, when)


def enqueued(queue: str, reply: Any) -> list[str]:
    """The ids ``enqueue_jobs`` replied; ``QueueNotFound`` if it found no stream (nil)."""
    if reply is None:
        raise lost(queue)
    return job_ids(reply)


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


def xadd_now(qk: TaskKeys, job: NewJob, now: float) -> tuple[str, ...]:
    """The ``XADD`` of a job to run now: its entry is all of it until it settles (the
    entry's id is the job's). Nothing is written, and the reply is nil, if the queue's
    stream is gone."""
    return (
        "XADD", qk.stream, "NOMKSTREAM", "*", "h", job.handler, "p", job.payload, "t", repr(now)
    )  # fmt: skip


def status_reads(pipe: Any, qk: TaskKeys, job_id: str) -> None:
    """Queue on ``pipe`` what a job's status reads (``read_status``): for a job enqueued to
    run now, its entry and its pending-list row (it has no record while it waits), then
    its record — last, so a job settled between the reads is seen settled."""
    if ENTRY_ID.match(job_id):
        pipe.xrange(qk.stream, job_id, job_id, count=1)
        pipe.xpending_range(qk.stream, qk.group, job_id, job_id, 1)
    pipe.hgetall(qk.job(job_id))


def read_status(
    qk: TaskKeys, job_id: str, replies: Sequence[Any]
) -> tuple[Any, Any, tuple[str, bytes] | None]:
    """From the replies of ``status_reads``: the job's record (or, waiting on the stream
    with none, what its entry says), the pending-list row read with it, and the stream and
    entry whose row is still to read (a queued job with a record: delayed, requeued or set
    aside); ``LookupError`` if there is no such job."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    *entry, raw = replies
    if raw:
        return raw, None, running_entry(qk, raw)
    if entry and entry[0]:
        fields = entry[0][0][1]
        waiting = {b"s": JobState.QUEUED.value.encode(), b"h": fields.get(b"h", b"")}
        waiting[b"t"] = fields.get(b"t", b"")
        return waiting, entry[1], None
    raise no_job(qk.task_id, job_id)


def result_reads(pipe: Any, qk: TaskKeys, job_id: str, check: bool = False) -> None:
    """Queue on ``pipe`` what one look at a job's result reads (``finished``): for a job
    enqueued to run now, whether its entry waits (before the record: see
    ``status_reads``); with ``check`` (every ``QUEUE_CHECK_SECONDS``), whether its queue's
    record is there; then its record's ``RESULT_FIELDS``."""
    if ENTRY_ID.match(job_id):
        pipe.xrange(qk.stream, job_id, job_id, count=1)
    if check:
        pipe.exists(qk.record)
    pipe.hmget(qk.job(job_id), RESULT_FIELDS)


def running_entry(qk: TaskKeys, raw: Mapping[bytes, bytes]) -> tuple[str, bytes] | None:
    """The stream and entry of a queued job with a record (delayed, requeued, or set aside
    on its handler's stream), whose pending-list row says whether a member has read it (it
    runs); None for a job in any other state."""
    entry = raw.get(b"e")
    if raw.get(b"s") != JobState.QUEUED.value.encode() or not entry:
        return None
    aside = raw.get(b"aside")
    return (qk.aside_stream(aside.decode()) if aside else qk.stream), entry


def finished(
    queue: str, job_id: str, replies: Sequence[Any], check: bool = False
) -> tuple[Any] | None:
    """From the replies of ``result_reads`` (``check`` as given there): ``(result,)`` of a
    done job; raises ``JobFailed`` for a dead or cancelled one, ``LookupError`` for none,
    ``QueueGone`` for one on the stream of a queue whose record is gone; None while it is
    not finished."""
    *entry, (state, value, reason, error) = replies
    queue_there = entry.pop() if check else True
    if state is None:
        if entry and entry[0]:
            if not queue_there:
                raise QueueGone(queue)
            return None  # on the stream, with no record yet
        raise no_job(queue, job_id)
    s = text(state)
    if s == JobState.DONE:
        return (from_json(text(value), f"result of job {job_id}") if value else None,)
    if s == JobState.DEAD:
        raise JobFailed(job_id, text(reason) or "dead", text(error))
    if s == JobState.CANCELLED:
        raise JobFailed(job_id, "cancelled")
    return None


def not_finished(job_id: str, replies: Sequence[Any], timeout: float | None) -> TimeoutError:
    state = text(replies[-1][0]) or JobState.QUEUED.value
    return TimeoutError(f"job {job_id} not finished after {timeout} s ({state})")


def cancelled(queue: str, job_id: str, found: int | str) -> bool:
    """What ``cancel_job`` said (after its calls again, ``CANCEL_TRIES``): True cancelled,
    False it had started or finished."""
    if isinstance(found, str):  # it moved again and again: no job waits like that
        return False
    if found < 0:
        raise no_job(queue, job_id)
    return found >= 1


def opened_settings(
    name: str, raw: Sequence[Any], given: Mapping[str, Any], reopen: bool = False
) -> QueueSettings:
    """An existing queue's settings, from the HMGET of its record's ``spec`` and ``state``;
    ``ValueError`` if it is no queue, differs from ``given``, or has finished (unless it
    is to be reopened: ``reopen``)."""
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
    if TaskState(text(raw[1])).finished and not reopen:
        raise ValueError(
            f"queue {name!r} was {text(raw[1])}; it takes no jobs until it is reopened "
            f"(client.queue({name!r}, reopen=True), or queueworks enqueue --reopen)"
        )
    return settings


def reopening(raw: Sequence[Any], reopen: bool) -> bool:
    """Whether opening a queue (the HMGET of ``opened_settings``) reopens it."""
    return reopen and TaskState(text(raw[1])).finished


def reopen_keys(qk: TaskKeys, aside: Iterable[Any]) -> list[str]:
    """The keys of a queue to keep (``reopen_queue``) besides its record and refusals:
    every key ``TaskKeys.all`` names and the streams of the handlers in its aside set."""
    keep = [k for k in qk.all(0) if k not in (qk.record, qk.refused)]
    return keep + [qk.aside_stream(text(h)) for h in aside]


def queue_reopened(pipe: Any, keys: Keys, name: str, created_at: float) -> None:
    """Queue on ``pipe`` what follows a reopened queue's record: among the tasks to size
    again, listed, no longer expiring, and its ``reopened`` event for the controller."""
    pipe.zadd(keys.queue, {name: created_at}, nx=True)
    pipe.zadd(keys.tasks, {name: created_at}, nx=True)
    pipe.zrem(keys.tasks_expiry, name)
    events.emit(pipe, keys, "reopened", task=name)


def new_queue(name: str, given: Mapping[str, Any], now: float) -> tuple[QueueSettings, Hash]:
    """A queue to create: its settings (``given``, the rest the defaults) and record."""
    settings = QueueSettings(**given)
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


def open_queue(client: Backend, name: str, given: dict[str, Any], reopen: bool = False) -> Queue:
    """Create the queue ``name`` with ``given`` settings (the rest default), or open it;
    ``ValueError`` if it exists with other settings than ``given``, or has finished and is
    not to be reopened (``reopen``)."""
    r, tk = client.redis, client.keys.task(name)
    raw: Any = r.hmget(tk.record, ["spec", "state"])
    if raw[0] is not None:
        settings = opened_settings(name, raw, given, reopen)
        if reopening(raw, reopen):
            created = client.scripts.reopen_queue(tk, reopen_keys(tk, r.smembers(tk.aside)))
            if created is not None:
                pipe = r.pipeline(transaction=False)
                queue_reopened(pipe, client.keys, name, created)
                pipe.execute()
        return Queue(client, name, settings)
    now = time.time()
    settings, record = new_queue(name, given, now)
    pipe = r.pipeline(transaction=False)
    pipe.xgroup_create(tk.stream, tk.group, id="0", mkstream=True)
    client.scripts.record_task(tk, [tk.stream], record, client=pipe)
    queue_created(pipe, client.keys, name, now)
    check_created(pipe.execute(raise_on_error=False))
    return Queue(client, name, settings)
