"""Queues: jobs enqueued one at a time, served by every worker that may serve them.

A queue is a long-lived task (``TaskSpec(mode="queue")``) whose stream stays open: a job is
one stream entry naming its own handler. A job to run now is its entry alone until it
settles (its id is the entry's), so enqueueing it is one ``XADD``; its record
(``qw:task:{Q}:job:<id>``) is written when it settles (a delayed job has one from the start:
it holds the payload until the job is due). The queue's members are already blocked on the
stream, so a job starts in about one more round trip. Its members are the workers that
may serve it, which join it themselves (up to ``max_nodes``); the controller gives it no
workers, and its ``min_nodes`` guards that many members against tasks. Reclaim,
attempts, timeouts (``job_timeout``), dead letters and once-only accounting are the ones of
subtasks. A settled job leaves the stream; its record (result or error) expires
``result_ttl`` after it finished.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from enum import Enum
from types import FunctionType
from typing import Any

from queueworks.errors import JobFailed, NotFinished, NotJSON
from queueworks.job_functions import Call, JobFunctionBase, function_path
from queueworks.protocol import events
from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.jobrecords import (
    RESULT_FIELDS,
    entry_fields,
    entry_job,
    has_state,
    queued_entry,
    waiting_record,
)
from queueworks.protocol.keys import PARKED, Keys, TaskKeys
from queueworks.protocol.messages import from_json, text, to_json
from queueworks.protocol.models import (
    JobState,
    JobStatus,
    QueueStatus,
    StoredSpec,
    TaskState,
    TaskStatus,
    parse_handler_path,
)
from queueworks.protocol.priorities import DEFAULT, prioritised_id
from queueworks.protocol.records import QUEUE_PAUSED, Hash, new_task, queue_counts
from queueworks.protocol.validate import run_at
from queueworks.queue.aside_jobs import NONE as NO_ASIDE
from queueworks.queue.aside_jobs import Aside, with_aside
from queueworks.queue.flow import flow_reads, flow_status
from queueworks.queue.queue_settings import DEFAULTS, QueueSettings
from queueworks.queue.vanished import (
    QueueGone,
    lost,
)
from queueworks.scripts.bound import NewJob, job_ids
from queueworks.task.dependencies import Dependency, dependencies
from queueworks.tracing import hooks

ENQUEUE_BATCH = 500  # jobs per Lua call in enqueue_many
ENQUEUE_PIPELINE = 8  # Lua calls per round trip
PATHS_KEPT = 1024  # handlers whose checked path a queue handle remembers
ENTRY_ID = re.compile(r"^\d{1,19}-\d{1,19}$")  # a stream entry's id: a job to run now's


class Unset(Enum):
    UNSET = 0


UNSET = Unset.UNSET  # "as the queue has it" (or the default, when it is created)


# as jobrecords.JOB_ID (a prioritised job's ends with its band)
JOB_REF_ID = re.compile(r"^(?:[0-9a-f]{1,64}(?:\.p-?\d)?|\d{1,19}-\d{1,19})$")


def job_ref(ref: str) -> tuple[str, str]:
    """``"QUEUE/JOB_ID"`` as (queue name, job id), each checked: ``ValueError`` naming what
    is wrong."""
    if not isinstance(ref, str):
        raise ValueError(f"job: {ref!r} is no 'QUEUE/JOB_ID'")
    name, slash, job_id = ref.rpartition("/")
    if not slash:
        raise ValueError(f"job: {ref!r} is no 'QUEUE/JOB_ID' (the queue's name, a slash, the id)")
    from queueworks.protocol.keys import check_task_id

    check_task_id(name, "queue name")
    if not JOB_REF_ID.match(job_id):
        raise ValueError(f"job: {job_id!r} is no job id a queue gives (hex, or a stream entry id)")
    return name, job_id


def handler_path(handler: str | Callable[..., Any]) -> str:
    """``"module:function"`` for a path or a module-level function object."""
    if isinstance(handler, str):
        path = handler
    elif isinstance(handler, JobFunctionBase):
        name = handler.signature.name
        raise ValueError(
            f"{name} is a typed job function: enqueue {name}.call(...) (its arguments, "
            "checked), not the function and a payload"
        )
    else:
        return function_path(handler)
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


def checked_call(call: Call[Any], payload: Any) -> str:
    """A typed call's payload JSON; ``ValueError`` if a payload is given beside it."""
    if payload is not None:
        raise ValueError(
            f"payload: a call of {call.signature.name} carries its arguments; give no payload"
        )
    return call.body


def payload_json(payload: Any) -> str:
    try:
        return to_json(payload, "payload")
    except NotJSON as exc:
        raise ValueError(str(exc)) from None


def new_job_id() -> str:
    """A delayed job's id (a job to run now has its stream entry's)."""
    return os.urandom(10).hex()


# -- what Queue/Job and AsyncQueue/AsyncJob share: no I/O, or commands queued on a pipeline --

CANCEL_TRIES = 2  # cancel_job calls after the first: a job moves at most once (set aside)
CANCELLED_LAST = 2  # cancel_job: cancelled, the last job set aside of its handler
FIRST_PAUSE, LAST_PAUSE = 0.001, 0.05  # s between polls: growing by half from the first


def batch_options(group: Any) -> str:
    """The options JSON of every job of an ``enqueue_many`` (checked: ``ValueError``
    naming a bad group; '' for none)."""
    options = JobOptions.given(group=group)
    given = "" if options is None else options.json()
    producer = hooks.producer
    return given if producer is None else producer.carry(given)


def new_job(
    path: str,
    payload: Any,
    delay: float | None,
    at: datetime | float | None,
    options: JobOptions | None = None,
    body: str | None = None,
    priority: int = DEFAULT,
) -> NewJob:
    """A job to enqueue: its handler path (checked: ``HandlerPaths``), payload JSON (``body``
    if made already: a typed call's), own options (checked: ``JobOptions.given``), and when
    it runs, with a new id if that is later or its ``priority`` (checked:
    ``check_priority``) is not 0 (``queueworks.protocol.priorities``); ``ValueError`` naming what is
    wrong."""
    if body is None:
        body = payload_json(payload)
    given = "" if options is None else options.json()
    producer = hooks.producer
    if producer is not None:  # tracing: the job carries the current span's context
        given = producer.carry(given)
    named = "" if priority == DEFAULT else prioritised_id(priority)
    if delay is None and at is None:
        return NewJob(named, path, body, None, given)  # 0: its id will be its entry's
    now = time.time()
    when = run_at(delay, at, now)
    if when <= now:
        return NewJob(named, path, body, None, given)
    return NewJob(named or new_job_id(), path, body, when, given)


def deferred_on(
    depends_on: Iterable[Any],
    delay: float | None,
    at: datetime | float | None,
) -> list[Dependency]:
    """``depends_on`` checked (``queueworks.task.dependencies.dependencies``); ``ValueError``
    with ``delay`` or ``at`` too (a deferred job runs when its dependencies are done)."""
    if delay is not None or at is not None:
        raise ValueError(
            "depends_on: a job with dependencies runs when they are done; give it no delay or at"
        )
    return dependencies(depends_on)


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
    pipe.xlen(qk.stream)
    pipe.xpending(qk.stream, qk.group)
    pipe.zcard(qk.scheduled)
    pipe.hgetall(qk.rate)
    pipe.zcard(qk.deferred)
    pipe.hget(qk.record, QUEUE_PAUSED)
    flow_reads(pipe, qk, "spec")
    pipe.smembers(qk.bands)  # the priority bands in use, whose jobs to count
    pipe.smembers(qk.aside)  # last: the handlers whose set-aside jobs to count


def band_reads(pipe: Any, qk: TaskKeys, bands: Sequence[int]) -> None:
    """Queue on ``pipe`` what counts the jobs of priority ``bands`` (``band_counts``)."""
    for band in bands:
        pipe.xlen(qk.band(band))
        pipe.xpending(qk.band(band), qk.group)


def band_counts(replies: Sequence[Any]) -> tuple[int, int]:
    """The jobs waiting and running on a queue's bands, from ``band_reads``' replies."""
    waiting = running = 0
    for i in range(0, len(replies), 2):
        pending = replies[i + 1]
        held = int(pending["pending"]) if isinstance(pending, dict) else 0
        waiting += queue_counts(replies[i], held, None, 0.0)[0]
        running += held
    return waiting, running


def queue_status(
    task: TaskStatus,
    replies: Sequence[Any],
    now: float,
    aside: Aside = NO_ASIDE,
    bands: tuple[int, int] = (0, 0),
) -> QueueStatus:
    """A queue's status from its task's, the replies of ``queue_reads`` (errors as
    exceptions in them: a key of the wrong type counts nothing), its jobs set aside
    (``queueworks.queue.aside_jobs``: backlog and running, and the reason they wait) and those
    of its priority bands (``band_counts``: waiting and running)."""
    length, pending, scheduled, rate, deferred, paused = replies[:6]
    running = int(pending["pending"]) if isinstance(pending, dict) else 0
    backlog, rates = queue_counts(length, running, rate, now)
    backlog, running = backlog + bands[0], running + bands[1]
    flow = flow_status(replies[6:10], now)
    return QueueStatus(
        name=task.id,
        state=task.state,
        backlog=backlog + sum(flow["groups_waiting"].values()) + sum(aside.waiting.values()),
        scheduled=int(scheduled or 0) if not isinstance(scheduled, Exception) else 0,
        running=running + aside.running,
        deferred=int(deferred or 0) if not isinstance(deferred, Exception) else 0,
        done=task.done,
        dead=task.dead,
        rejected=task.rejected,
        nodes=task.nodes,
        epoch=task.epoch,
        min_nodes=task.min_nodes,
        max_nodes=task.max_nodes,
        priority=task.priority,
        rates=rates,
        reason=with_aside(task.reason, aside.waiting),
        paused=paused == b"1",
        set_aside=aside.waiting,
        **flow,
    )


def no_job(queue: str, job_id: str) -> LookupError:
    return LookupError(f"queue {queue!r} has no job {job_id!r} (or it expired)")


def xadd_now(qk: TaskKeys, job: NewJob, now: float) -> tuple[str, ...]:
    """The ``XADD`` of a job to run now: its entry is all of it until it settles (the
    entry's id is the job's). Nothing is written, and the reply is nil, if the queue's
    stream is gone."""
    return (
        "XADD",
        qk.stream,
        "NOMKSTREAM",
        "*",
        *entry_fields(job.handler, job.payload, repr(now), job.options),
    )


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
    """From the replies of ``status_reads``: the job's record (or, on the stream with none
    or a partial one, what its entry says, with the partial record's progress), the
    pending-list row read with it, and the stream and entry whose row is still to read (a
    queued job with a record: delayed, requeued or set aside); ``LookupError`` if there is
    no such job."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    *entry, raw = replies
    if raw and has_state(raw):
        return raw, None, running_entry(qk, raw, job_id)
    if entry and entry[0]:  # no record yet, or a partial one: its progress (a report)
        return waiting_record(entry[0][0][1], raw), entry[1], None
    raise no_job(qk.task_id, job_id)


RUNNING_SHOWN = 20  # running jobs read at most, by default (``running``)


def running_rows(reply: Any) -> list[Any]:
    """The rows of a queue's pending list (an XPENDING range reply) of jobs a member runs:
    not those parked (handed back by a leave, to be taken over)."""
    return [row for row in reply or () if text(row["consumer"]) != PARKED]


def running_entries(rows: Sequence[Any], replies: Sequence[Any]) -> list[Any]:
    """From the rows and the XRANGE of each row's entry (one reply each): ``(row, entry,
    fields)`` of each entry that holds a job (``JobEntry``, and the entry's fields as
    read; one deleted or settled meanwhile is left out)."""
    out = []
    for row, reply in zip(rows, replies, strict=True):
        if reply and not isinstance(reply, Exception):
            entry = entry_job(text(reply[0][0]), reply[0][1])
            if entry is not None:
                out.append((row, entry, reply[0][1]))
    return out


def running_record(fields: Mapping[bytes, bytes], raw: Any) -> Mapping[bytes, bytes]:
    """A running job's record (an HGETALL reply) as ``job_status`` reads it: its own, or for
    one with none or a partial one, what its entry's ``fields`` say (with its progress)."""
    raw = raw if isinstance(raw, dict) else {}
    return raw if has_state(raw) else waiting_record(fields, raw)


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


def running_entry(
    qk: TaskKeys, raw: Mapping[bytes, bytes], job_id: str = ""
) -> tuple[str, bytes] | None:
    """The stream and entry of a queued job with a record (delayed, requeued, or set aside
    on its handler's stream), whose pending-list row says whether a member has read it (it
    runs); None for a job in any other state."""
    queued = queued_entry(raw)
    if queued is None:
        return None
    entry, aside = queued
    return (qk.aside_stream(aside) if aside else qk.stream_of(job_id)), entry


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


def not_finished(job_id: str, replies: Sequence[Any], timeout: float | None) -> NotFinished:
    """From the last look's replies (``result_reads``): its record's state alone, which
    says ``queued`` for a job to run now until it settles (``timed_out`` says more)."""
    state = text(replies[-1][0]) or JobState.QUEUED.value
    return NotFinished(f"job {job_id} not finished after {timeout} s ({state})")


def timed_out(status: JobStatus, timeout: float | None) -> NotFinished:
    """``NotFinished`` from the job's status, read once the timeout passed: its state
    (``running`` for a job a member holds) and the reason it waits, if it has one."""
    why = f"{status.state.value}: {status.reason}" if status.reason else status.state.value
    return NotFinished(f"job {status.id} not finished after {timeout} s ({why})")


OUTAGE_FIRST_PAUSE, OUTAGE_LAST_PAUSE = 0.05, 1.0  # s between looks while Redis is away


def outage_pause(error: Exception, deadline: float | None, pause: float) -> float:
    """A look at a job's result met Redis away (``error``, one of ``UNAVAILABLE``): the
    seconds to wait before the next (``pause``, not past ``deadline``, a monotonic time);
    ``error`` raised once the deadline has passed."""
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise error
    return pause if left is None else min(pause, left)


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
            f"queue {name!r} exists with {have}; open it without those settings and "
            "change them with q.configure(...) (its node set: q.task.resize, "
            "q.task.set_priority)"
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


def reopen_keys(qk: TaskKeys, aside: Iterable[Any], waiting: Iterable[Any] = ()) -> list[str]:
    """The keys of a queue to keep (``reopen_queue``) besides its record and refusals:
    every key ``TaskKeys.all`` names, the streams of the handlers in its aside set and the
    wait lists of the groups in its ``groups_waiting`` hash. Its unfinished jobs' keys are
    kept after them, in batches (``job_keys.plan_job_keys``)."""
    keep = [k for k in qk.all(0) if k not in (qk.record, qk.refused)]
    keep += qk.group_waits(text(g) for g in waiting)
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
