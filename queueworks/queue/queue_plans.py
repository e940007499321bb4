"""A queue's operations, planned once (``queueworks.transport.plans``) for ``Queue``/``Job`` and
``AsyncQueue``/``AsyncJob``: open (create, open, reopen), status, enqueue, a job's status,
result and cancel, and the revive of a queue that vanished under its handle
(``queueworks.queue.vanished``). What they send and how they read it:
``queueworks.queue.queues``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import redis

from queueworks.errors import JobFailed, NotFinished, TaskNotFound
from queueworks.protocol import events
from queueworks.protocol.jobrecords import JOB_STATE, RESULT_FIELDS, job_status
from queueworks.protocol.keys import Keys, check_task_id
from queueworks.protocol.messages import text
from queueworks.protocol.models import JobState, JobStatus, QueueStatus, StoredSpec
from queueworks.protocol.priorities import DEFAULT, bands_of, priority_of_id
from queueworks.protocol.records import QUEUE_BANDS
from queueworks.queue.aside_jobs import plan_aside_counts
from queueworks.queue.flow import plan_pump
from queueworks.queue.job_keys import plan_job_keys
from queueworks.queue.job_stops import ask_stop
from queueworks.queue.queue_settings import DEFAULTS, QueueSettings
from queueworks.queue.queues import (
    CANCEL_TRIES,
    CANCELLED_LAST,
    FIRST_PAUSE,
    LAST_PAUSE,
    OUTAGE_FIRST_PAUSE,
    OUTAGE_LAST_PAUSE,
    band_counts,
    band_reads,
    cancelled,
    check_created,
    enqueued,
    finished,
    new_job_id,
    new_queue,
    not_finished,
    opened_settings,
    outage_pause,
    queue_created,
    queue_reads,
    queue_reopened,
    queue_status,
    read_status,
    reopen_keys,
    reopening,
    result_reads,
    running_entries,
    running_record,
    running_rows,
    status_reads,
    tell_handlers,
    timed_out,
    xadd_now,
)
from queueworks.queue.vanished import QUEUE_CHECK_SECONDS, QueueGone, no_group, record_gone
from queueworks.scripts import calls
from queueworks.scripts.calls import EnqueueBatch, NewJob
from queueworks.task.dependencies import Dependency, plan_drain, plan_register
from queueworks.task.tasks import plan_status
from queueworks.tracing import hooks
from queueworks.transport.connection import UNAVAILABLE
from queueworks.transport.plans import Plan, Sleep, Trip, alone
from queueworks.transport.replication import NO_WAIT, Replicas, acknowledged, barrier


class QueueRef:
    """What a queue's handle (sync or asyncio) knows of its queue: its name and keys, the
    settings it creates it again with (unless not ``revives``), and the handlers it has
    told the queue about (``known``: the plans add to it)."""

    def __init__(self, keys: Keys, name: str, settings: QueueSettings, revives: bool) -> None:
        self.keys, self.name, self.settings, self.revives = keys, name, settings, revives
        self.qk = keys.task(name)
        self.known: set[str] = set()

    def bare(self, job: NewJob, telling: Iterable[str] = ()) -> bool:
        """Whether ``job`` is written by its ``XADD`` alone (``xadd_now``): it runs now, has
        no id of its own, and its handler is one this handle told the queue about (or
        tells it about first, on the same round trip: ``telling``)."""
        return (
            job.at is None and not job.id and (job.handler in self.known or job.handler in telling)
        )


class Opened(NamedTuple):
    """A queue opened: its settings, and the handlers it has been told about (a handle's
    ``known`` from the start: its first job of one of them is a bare ``XADD``)."""

    settings: QueueSettings
    handlers: frozenset[str]


def plan_open(
    keys: Keys, name: str, given: Mapping[str, Any], reopen: bool = False
) -> Plan[Opened]:
    """Create the queue ``name`` with ``given`` settings (the rest default), or open it;
    its settings and handlers. ``ValueError`` if it exists with other settings than
    ``given``, or has finished and is not to be reopened (``reopen``)."""
    tk = keys.task(name)
    trip = Trip()
    trip.hmget(tk.record, ["spec", "state"])
    trip.smembers(tk.handlers)
    raw, handlers = yield trip
    if raw[0] is not None:
        settings = opened_settings(name, raw, given, reopen)
        if reopening(raw, reopen):
            trip = Trip()
            trip.smembers(tk.aside)
            trip.hkeys(tk.groups_waiting)
            aside, waiting = yield trip
            created = (yield alone(calls.reopen_queue(tk, reopen_keys(tk, aside, waiting))))[0]
            if created is not None:
                yield from plan_job_keys(tk, keep=True)  # its unfinished jobs' keys too
                trip = Trip()
                queue_reopened(trip, keys, name, created)
                yield trip
        return Opened(settings, frozenset(map(text, handlers)))
    now = time.time()
    settings, record = new_queue(name, given, now)
    trip = Trip(errors=True)
    trip.xgroup_create(tk.stream, tk.group, id="0", mkstream=True)
    trip.call(calls.record_task(tk, [tk.stream], record))
    queue_created(trip, keys, name, now)
    check_created((yield trip))
    return Opened(settings, frozenset())


def plan_revive(ref: QueueRef, also: Iterable[str] = ()) -> Plan[None]:
    """The queue is gone (or its stream): make it again with the handle's settings, and
    tell it the handlers the handle knows (and ``also``); ``QueueNotFound`` if it was
    cancelled (or the handle may not: not ``revives``)."""
    trip = Trip()
    trip.hget(ref.qk.record, "state")
    if record_gone(ref.name, (yield trip)[0], ref.revives):
        yield from plan_open(ref.keys, ref.name, ref.settings.given())  # (it knows its own)
    trip = Trip(errors=True)
    trip.xgroup_create(ref.qk.stream, ref.qk.group, id="0", mkstream=True)
    if ref.known or also:
        tell_handlers(trip, ref.keys, ref.qk, sorted({*ref.known, *also}))
    check_created((yield trip))


def plan_queue_status(ref: QueueRef) -> Plan[QueueStatus]:
    try:
        task = yield from plan_status(ref.keys, ref.qk)
    except TaskNotFound:
        yield from plan_revive(ref)
        task = yield from plan_status(ref.keys, ref.qk)
    trip = Trip(errors=True)
    queue_reads(trip, ref.qk)
    replies = yield trip
    aside = yield from plan_aside_counts(ref.qk, replies[-1])
    bands = bands_of(replies[-2]) if not isinstance(replies[-2], Exception) else []
    counts = (0, 0)
    if bands:
        trip = Trip(errors=True)
        band_reads(trip, ref.qk, bands)
        counts = band_counts((yield trip))
    return queue_status(task, replies, time.time(), aside, counts)


def plan_queues(keys: Keys) -> Plan[list[QueueStatus]]:
    """Every queue that still exists, by name (one whose record expired leaves the set)."""
    trip = Trip()
    trip.smembers(keys.queues)
    names = sorted(n.decode() if isinstance(n, bytes) else n for n in (yield trip)[0])
    out = []
    for name in names:
        try:
            out.append((yield from plan_queue_status(QueueRef(keys, name, DEFAULTS, False))))
        except TaskNotFound:
            trip = Trip()
            trip.srem(keys.queues, name)  # its record expired
            yield trip
    return out


def plan_send(ref: QueueRef, batches: Sequence[Sequence[NewJob]]) -> Plan[list[str]]:
    """``plan_write`` without waiting for replicas: the jobs' ids."""
    ids, _ = yield from plan_write(ref, batches, NO_WAIT)
    return ids


def plan_write(
    ref: QueueRef, batches: Sequence[Sequence[NewJob]], wait: Replicas
) -> Plan[tuple[list[str], int | None]]:
    """One round trip: a Lua call per batch (a lone job to run now: its ``XADD``), and the
    handlers the queue does not know from this handle yet, then ``wait``'s WAIT (none for
    0 replicas); a batch that found the queue gone is sent again once the queue is made
    again (with a WAIT of its own). The jobs' ids, and how many replicas acknowledged
    them (None: not asked)."""
    batches = [b for b in batches if b]
    if not batches:
        return [], None
    now = time.time()
    new = {job.handler for batch in batches for job in batch} - ref.known
    trip = Trip()
    if new:
        tell_handlers(trip, ref.keys, ref.qk, sorted(new))
    first = len(trip)
    lone = len(batches) == 1 and len(batches[0]) == 1 and ref.bare(batches[0][0], new)
    if lone:  # the entry is all of it: its id is the job's, or nil if the stream is gone
        trip.execute_command(*xadd_now(ref.qk, batches[0][0], now))
    else:
        for batch in batches:
            trip.call(calls.enqueue_jobs(ref.qk, batch, now))
    waited = wait.add(trip, [ref.qk.stream])
    sent = list((yield trip))
    acked = acknowledged(sent, waited)
    replies = sent[first : len(sent) if waited is None else waited]
    if lone:
        replies = [None if replies[0] is None else [replies[0]]]
    ref.known |= new
    if any(reply is None for reply in replies):
        yield from plan_revive(ref)
        gone = [i for i, reply in enumerate(replies) if reply is None]
        trip = Trip()
        for i in gone:
            trip.call(calls.enqueue_jobs(ref.qk, batches[i], time.time()))
        waited = wait.add(trip, [ref.qk.stream])
        sent = list((yield trip))
        for i, reply in zip(gone, sent, strict=False):
            replies[i] = reply
        if waited is not None:
            again = int(sent[waited])
            acked = again if acked is None else min(acked, again)
    return [job_id for reply in replies for job_id in enqueued(ref.name, reply)], acked


def linked(options: str) -> str:
    """A deferred job's options: while tracing, its consumer links to its producer's span
    (it runs once its dependencies are done, not as a child of the enqueue)."""
    producer = hooks.producer
    return options if producer is None else producer.as_link(options)


def plan_band(ref: QueueRef, job_id: str) -> Plan[None]:
    """Make the band of a prioritised job (``queueworks.protocol.priorities``; none for another):
    its stream with the consumer group, and its priority in the queue's bands set (the
    scripts that write it without ``enqueue_jobs``, which makes it itself, need it there);
    a priority new there bumps the queue record's bands version, as ``enqueue_jobs`` does
    (the queue's members read the set again only then)."""
    priority = priority_of_id(job_id)
    if priority == DEFAULT:
        return
    trip = Trip(errors=True)
    trip.xgroup_create(ref.qk.band(priority), ref.qk.group, id="0", mkstream=True)
    trip.sadd(ref.qk.bands, priority)
    replies = yield trip
    check_created(replies)
    if replies[1] == 1:
        bump = Trip()
        bump.hincrby(ref.qk.record, QUEUE_BANDS, 1)
        yield bump


def plan_defer(ref: QueueRef, job: NewJob, deps: Sequence[Dependency]) -> Plan[str]:
    """Enqueue ``job`` (to run now) deferred until ``deps`` are done
    (``queueworks.task.dependencies``): its record and dependency set first (``defer_job``),
    then its registration at each dependency; its id. ``ValueError`` (and nothing of the
    job left) for an unknown dependency or a cycle."""
    job = job._replace(id=job.id or new_job_id(), at=None, options=linked(job.options))
    refs = [dep.ref for dep in deps]
    new = [job.handler] if job.handler not in ref.known else []
    yield from plan_band(ref, job.id)
    trip = Trip()
    if new:
        tell_handlers(trip, ref.keys, ref.qk, new)
    at = trip.call(calls.defer_job(ref.qk, job, time.time(), refs))
    if not (yield trip)[at]:  # the queue is gone: made again, then written
        yield from plan_revive(ref, new)
        yield alone(calls.defer_job(ref.qk, job, time.time(), refs))
    ref.known.update(new)
    yield from plan_register(ref.keys, ref.qk, job.id, deps)
    return job.id


def plan_resend(
    ref: QueueRef, batch: EnqueueBatch, told: Iterable[str], wait: Replicas = NO_WAIT
) -> Plan[tuple[Any, int | None]]:
    """A batch of ``enqueue_many`` that found the queue gone, once it is made again (and
    told ``told``, the handlers that batch's pipelines told it), with ``wait``'s WAIT; the
    batch's reply, and how many replicas acknowledged it (None: not asked)."""
    yield from plan_revive(ref, told)
    trip = Trip()
    trip.call(calls.enqueue_batch(batch, time.time()))
    waited = wait.add(trip, [ref.qk.stream])
    replies = yield trip
    return replies[0], acknowledged(replies, waited)


FINISHED = frozenset(s.value.encode() for s in JobState if s.finished)
# what a status read once a result's timeout passed may meet: the timeout is said without it
UNREADABLE: tuple[type[Exception], ...] = (
    *UNAVAILABLE,
    redis.ResponseError,
    LookupError,
    ValueError,
)


def plan_job_status(ref: QueueRef, job_id: str) -> Plan[JobStatus]:
    """A job's status. A finished job's record says it all: read alone first (one command,
    one round trip); a live job's status is read with its entry and pending-list row
    (``status_reads``), and more where its record says where it waits."""
    trip = Trip()
    trip.hgetall(ref.qk.job(job_id))
    raw = (yield trip)[0]
    if raw and raw.get(JOB_STATE.encode()) in FINISHED:
        return job_status(ref.name, job_id, raw, None, time.time(), [])
    trip = Trip(errors=True)
    status_reads(trip, ref.qk, job_id)
    replies = yield trip
    if any(no_group(reply) for reply in replies):  # the queue's stream or group is gone
        yield from plan_revive(ref)
        trip = Trip(errors=True)
        status_reads(trip, ref.qk, job_id)
        replies = yield trip
    raw, pending, where = read_status(ref.qk, job_id, replies)
    waits: list[str] = []
    if where:
        stream, entry = where
        trip = Trip()
        trip.xpending_range(stream, ref.qk.group, entry, entry, 1)
        pending = (yield trip)[0]
    elif raw.get(JOB_STATE.encode()) == JobState.DEFERRED.value.encode():
        trip = Trip()
        trip.smembers(ref.qk.deps(job_id))
        waits = sorted(text(m) for m in (yield trip)[0])
    return job_status(ref.name, job_id, raw, pending, time.time(), waits)


def plan_job_status_of(keys: Keys, name: str, job_id: str) -> Plan[JobStatus]:
    """``plan_job_status`` of a queue by name, without opening it (``Client.job_status``)."""
    ref = QueueRef(keys, check_task_id(name, "queue name"), DEFAULTS, False)
    return plan_job_status(ref, job_id)


def plan_running_of(keys: Keys, name: str, limit: int) -> Plan[list[JobStatus]]:
    """``plan_running`` of a queue by name, without opening it (``Client.running_jobs``)."""
    return plan_running(QueueRef(keys, check_task_id(name, "queue name"), DEFAULTS, False), limit)


def plan_running(ref: QueueRef, limit: int) -> Plan[list[JobStatus]]:
    """The status of up to ``limit`` jobs a member runs now, oldest read first: the queue's
    pending list (XPENDING, ``limit`` rows), then the rows' entries, then their records:
    three round trips, whatever the queue's size. Jobs running off an aside stream are not
    among them."""
    if not 1 <= limit <= 1000:
        raise ValueError(f"limit must be from 1 to 1000, not {limit!r}")
    qk = ref.qk
    trip = Trip(errors=True)
    trip.xpending_range(qk.stream, qk.group, "-", "+", limit)
    reply = (yield trip)[0]
    rows = [] if isinstance(reply, Exception) else running_rows(reply)
    if not rows:
        return []
    trip = Trip(errors=True)
    for row in rows:
        trip.xrange(qk.stream, row["message_id"], row["message_id"], count=1)
    held = running_entries(rows, (yield trip))
    trip = Trip(errors=True)
    for _, entry, _ in held:
        trip.hgetall(qk.job(entry.job_id))
    records = yield trip
    now = time.time()
    return [
        job_status(ref.name, entry.job_id, running_record(fields, raw), [row], now)
        for (row, entry, fields), raw in zip(held, records, strict=True)
    ]


def plan_job_result(ref: QueueRef, job_id: str, timeout: float | None) -> Plan[Any]:
    """The job's result once it is done, looked at at once, then after a pause growing by
    half from ``FIRST_PAUSE`` to ``LAST_PAUSE``; ``JobFailed`` if it is dead or cancelled;
    ``TimeoutError`` after ``timeout`` s. On a queue with ``wait_replicas``, an outcome
    counts once its settle is on that many replicas (``plan_outcome_replicated``). The
    first look reads the job's record alone (a settled job's result: one command, one
    round trip); the next ones read its entry before its record (``result_reads``).
    While Redis cannot be reached it looks again, from ``OUTAGE_FIRST_PAUSE`` to
    ``OUTAGE_LAST_PAUSE`` apart, until ``timeout``, then raises what the last look met."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause, checked, first = FIRST_PAUSE, time.monotonic(), True
    outage = OUTAGE_FIRST_PAUSE
    while True:
        check = not first and time.monotonic() - checked >= QUEUE_CHECK_SECONDS
        trip = Trip()
        if first:
            trip.hmget(ref.qk.job(job_id), RESULT_FIELDS)
        else:
            result_reads(trip, ref.qk, job_id, check)
        failed: JobFailed | None = None
        try:
            replies = yield trip
            if first and replies[0][0] is None:  # no outcome yet: look again, entry first
                first = False
                continue
            first = False
            try:
                done = finished(ref.name, job_id, replies, check)
            except QueueGone:
                yield from plan_revive(ref)  # its entry runs once its group is there again
                done = None
            except JobFailed as exc:
                failed, done = exc, None
            settled = done is not None or failed is not None
            if settled and (yield from plan_outcome_replicated(ref)):
                if failed is not None:
                    raise failed
                return done[0] if done is not None else None
        except UNAVAILABLE as exc:  # Redis is away: look again until the timeout, as workers do
            yield Sleep(outage_pause(exc, deadline, outage))
            outage = min(OUTAGE_LAST_PAUSE, outage * 2)
            continue
        outage = OUTAGE_FIRST_PAUSE
        if deadline is not None and time.monotonic() >= deadline:
            said = not_finished(job_id, replies, timeout)
            raise (yield from plan_unfinished(ref, job_id, timeout, said))
        if check:
            checked = time.monotonic()
        yield Sleep(pause)
        pause = min(LAST_PAUSE, pause * 1.5)


def plan_unfinished(
    ref: QueueRef, job_id: str, timeout: float | None, fallback: NotFinished
) -> Plan[NotFinished]:
    """The ``TimeoutError`` of a result not there after ``timeout`` s: the job's status
    read once more (its state, ``running`` for a job a member holds, and why it waits);
    ``fallback`` (what the last look said) where the status cannot be read. Reads only:
    a queue that is gone is not made again here."""
    trip = Trip(errors=True)
    status_reads(trip, ref.qk, job_id)
    try:
        raw, pending, where = read_status(ref.qk, job_id, (yield trip))
        if where:
            stream, entry = where
            trip = Trip()
            trip.xpending_range(stream, ref.qk.group, entry, entry, 1)
            pending = (yield trip)[0]
        status = job_status(ref.name, job_id, raw, pending, time.time())
    except UNREADABLE:
        return fallback
    return timed_out(status, timeout)


def plan_outcome_replicated(ref: QueueRef) -> Plan[bool]:
    """Whether an outcome just read is on the queue's ``wait_replicas`` replicas (True at
    once, and nothing sent, for 0). WAIT covers only its connection's writes: a write of
    its own (``synced``, 1 s) goes first; it follows the settle read in the primary's
    replication stream, so replicas that acknowledged it hold the settle too."""
    wait = Replicas(ref.settings.wait_replicas, ref.settings.wait_timeout)
    if not wait.replicas:
        return True
    trip = Trip()
    barrier(trip, ref.qk)
    at = wait.add(trip, [ref.qk.synced])
    return int((yield trip)[at or 0]) >= wait.replicas


def plan_job_cancel(ref: QueueRef, job_id: str) -> Plan[bool]:
    """Cancel the job, stopping it if it runs (its worker is told: ``job_stops``); False
    if it had finished."""
    settings = ref.settings
    if not ref.revives:  # a handle from a name alone: the queue's own settings
        settings = yield from plan_settings_of(ref)
    now, ttl = time.time(), int(settings.result_ttl)
    call = calls.cancel_job(ref.qk, job_id, now, ttl, running=True)
    try:
        found, options, member = (yield alone(call))[0]
    except redis.ResponseError as exc:
        if not no_group(exc):
            raise
        yield from plan_revive(ref)
        found, options, member = (yield alone(call))[0]
    for _ in range(CANCEL_TRIES):  # set aside: it waits on its handler's stream
        if not isinstance(found, str):
            break
        call = calls.cancel_job(ref.qk, job_id, now, ttl, aside=found, running=True)
        found, options, member = (yield alone(call))[0]
    trip = Trip()
    if found == CANCELLED_LAST:
        events.emit(trip, ref.keys, "handlers", task=ref.name)
    if member is not None:  # it ran: its worker stops it (``workers.stopping``)
        ask_stop(trip, ref.keys, member, ref.name, job_id)
    if options is not None and options.key is not None:  # it held a unique key: free it
        trip.call(calls.release_unique(ref.qk, options.key, job_id, options.unique_for))
    if len(trip):
        yield trip
    if (
        options is not None
        and options.group is not None
        and found in (1, CANCELLED_LAST, calls.STOPPED_RUNNING)
    ):
        limit = settings.group_limit or 0  # a slot it held on the stream goes on
        yield from plan_pump(ref.qk, limit, {options.group: 1}, back=[job_id])
    if found in (
        1,
        CANCELLED_LAST,
        calls.STOPPED_RUNNING,
    ):  # its dependents die with it: release them now
        yield from plan_drain(ref.keys, [ref.name])
    return cancelled(ref.name, job_id, found)


def plan_settings_of(ref: QueueRef) -> Plan[QueueSettings]:
    """The queue's settings as stored (the defaults if it has no record, or none that
    reads as a queue's)."""
    trip = Trip()
    trip.hget(ref.qk.record, "spec")
    raw = (yield trip)[0]
    try:
        stored = StoredSpec.model_validate_json(raw or b"")
    except ValueError:
        return DEFAULTS
    return QueueSettings.of(stored) if stored.mode == "queue" else DEFAULTS


UNIQUE_TRIES = 10  # enqueue_unique calls: each but the last found a holder that had moved on


def plan_unique(
    ref: QueueRef, job: NewJob, key: str, wait: Replicas, deps: Sequence[Dependency] = ()
) -> Plan[tuple[str, bool, int | None]]:
    """Enqueue ``job`` holding unique ``key`` (``enqueue_unique.lua``), unless a job that
    holds it is live: the job holding it, whether this call made it, and how many replicas
    acknowledged (None: not asked). One round trip; another when the holder's record must
    be read (a delayed, retried or deferred job: its record is the job), or when the queue is
    gone (made again, as ``plan_write`` does). With ``deps``, the job made is deferred until
    they are done, and registered at each (as ``plan_defer``)."""
    holder = ""
    refs = [dep.ref for dep in deps]
    if deps:
        job = job._replace(id=job.id or new_job_id(), at=None, options=linked(job.options))
    yield from plan_band(ref, job.id)
    for _ in range(UNIQUE_TRIES):
        trip = Trip()
        told = job.handler not in ref.known
        if told:
            tell_handlers(trip, ref.keys, ref.qk, [job.handler])
        at = trip.call(calls.enqueue_unique(ref.qk, job, key, time.time(), holder, refs))
        waited = wait.add(trip, [ref.qk.stream])
        replies = yield trip
        if told:
            ref.known.add(job.handler)
        reply = replies[at]
        if reply is None:  # the queue is gone: made again, then this job goes again
            yield from plan_revive(ref)
        elif reply.look:
            holder = reply.job_id
        else:
            if reply.made and deps:
                yield from plan_register(ref.keys, ref.qk, reply.job_id, deps)
            return reply.job_id, reply.made, acknowledged(replies, waited)
    raise RuntimeError(f"queue {ref.name!r}: key {key!r} changed hands {UNIQUE_TRIES} times")
